-- compatibility: additive (indexes only)
--
-- Claims cost what they take and the owners they inspect, not the shard count.
--
-- Unowned buckets, lowest first: a claim walks this index, skipping rows other claimers hold.
CREATE INDEX shards_unowned_idx ON lease.shards (group_name, bucket)
    WHERE owner_session IS NULL;

-- The owners of a group's buckets, and each owner's buckets in order: a claim steps through the
-- distinct owner sessions of the group (one index descent each) to find the dead ones, then
-- takes a dead session's buckets lowest first; a heartbeat reads the caller's own buckets; a
-- release or leave finds the buckets of one session. It replaces the index on the session alone.
CREATE INDEX shards_owner_idx ON lease.shards (group_name, owner_session, bucket)
    INCLUDE (owner_worker)
    WHERE owner_session IS NOT NULL;
DROP INDEX lease.shards_owner_session_idx;
