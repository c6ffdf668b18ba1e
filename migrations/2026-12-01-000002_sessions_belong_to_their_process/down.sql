ALTER TABLE lease.members DROP COLUMN incarnation;
