ALTER TABLE lease.members DROP COLUMN timeline;
DROP TABLE lease.server_epochs;
DROP FUNCTION lease.timeline();
