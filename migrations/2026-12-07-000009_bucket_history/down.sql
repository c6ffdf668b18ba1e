-- Back to migration 8: the history goes (every bucket keeps its owner, session and token).
DROP TABLE lease.tenures;
ALTER TABLE lease.shards DROP COLUMN tenures;
