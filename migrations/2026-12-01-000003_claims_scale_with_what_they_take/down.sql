CREATE INDEX shards_owner_session_idx ON lease.shards (owner_session)
    WHERE owner_session IS NOT NULL;
DROP INDEX lease.shards_owner_idx;
DROP INDEX lease.shards_unowned_idx;
