DROP TABLE lease.server_epochs;
DROP FUNCTION lease.timeline();
