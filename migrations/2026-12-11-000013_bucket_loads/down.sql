-- Back to migration 12: the loads go.
ALTER TABLE lease.members DROP COLUMN hottest, DROP COLUMN load;
ALTER TABLE lease.shards DROP COLUMN load;
