-- compatibility: additive (two columns with defaults, a table, an index and the same fencing function answering for the draining generation too; nothing an older binary names changes while no group is resized)
--
-- Online shard-count changes (docs/postgres.md, "Changing the shard count on Postgres"). A
-- group has a generation; `resize` moves the current generation's bucket rows out of
-- lease.shards into lease.draining_shards, where they keep their owners and tokens until
-- released, and opens the new generation's rows in lease.shards. Older binaries keep working
-- while no group is resized; a resize needs every worker of the group on a release that knows
-- this migration (an older claim does not wait for the draining generation).

-- The group's generation (0 from ensure_group, +1 per resize) and the count its current
-- generation was resized from (NULL: never resized).
ALTER TABLE lease.groups ADD COLUMN generation bigint NOT NULL DEFAULT 0 CHECK (generation >= 0);
ALTER TABLE lease.groups
    ADD COLUMN previous_count integer CHECK (previous_count BETWEEN 1 AND 65536);

-- The draining generation of a group: every bucket of the count it was resized from, with its
-- owner and token as of the resize. An owner releases (or leaves) an old bucket by clearing
-- its owner; an old bucket is retired once its owner is NULL or its session is not live. The
-- rows go once every one is retired (a claim or the next resize deletes them). Tokens never
-- change here: nothing claims an old bucket.
CREATE TABLE lease.draining_shards (
    group_name    text    NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    bucket        integer NOT NULL CHECK (bucket >= 0),
    owner_worker  uuid,
    owner_session uuid,
    token         bigint  NOT NULL DEFAULT 0 CHECK (token >= 0),
    PRIMARY KEY (group_name, bucket),
    CHECK ((owner_worker IS NULL) = (owner_session IS NULL))
);

-- A heartbeat reads a worker's old buckets by session; the barrier finds owned old buckets.
CREATE INDEX draining_shards_owner_idx ON lease.draining_shards (group_name, owner_session, bucket)
    WHERE owner_session IS NOT NULL;

-- The fencing check answers for either generation: a session never holds one bucket number in
-- both (a new bucket waits for the old bucket of its number), so at most one row matches, and
-- that row stays share-locked until the caller's transaction ends (a claim judging the old
-- bucket's owner dead skips a locked old row: its children stay waiting). CREATE OR REPLACE
-- keeps the grants.
CREATE OR REPLACE FUNCTION lease.is_current(
    p_group text, p_bucket bigint, p_worker uuid, p_token bigint, p_at timestamptz DEFAULT NULL
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM 1
       FROM lease.shards s
       JOIN lease.members m
         ON m.group_name = s.group_name
        AND m.worker_id = s.owner_worker
        AND m.session_id = s.owner_session
      WHERE s.group_name = p_group AND s.bucket = p_bucket
        AND s.owner_worker = p_worker AND s.token = p_token
        AND m.expires_at > COALESCE(p_at, pg_catalog.clock_timestamp())
        FOR SHARE OF s;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1
       FROM lease.draining_shards d
       JOIN lease.members m
         ON m.group_name = d.group_name
        AND m.worker_id = d.owner_worker
        AND m.session_id = d.owner_session
      WHERE d.group_name = p_group AND d.bucket = p_bucket
        AND d.owner_worker = p_worker AND d.token = p_token
        AND m.expires_at > COALESCE(p_at, pg_catalog.clock_timestamp())
        FOR SHARE OF d;
    RETURN FOUND;
END
$$;

-- Roles that run workers (UPDATE on lease.shards) get what their statements now use on the
-- new table, and roles that read lease.shards may read it: an upgrade stops no worker and no
-- monitor (lease_diesel::privileges lists the same).
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS role_name,
                        a.privilege_type
          FROM (SELECT c.relacl AS acl FROM pg_class c WHERE c.oid = 'lease.shards'::regclass) AS x,
               aclexplode(x.acl) AS a
         WHERE a.privilege_type IN ('SELECT', 'UPDATE')
           AND a.grantee <> (SELECT c.relowner FROM pg_class c
                              WHERE c.oid = 'lease.shards'::regclass)
    LOOP
        IF r.privilege_type = 'UPDATE' THEN
            EXECUTE format('GRANT SELECT, UPDATE, DELETE ON lease.draining_shards TO %s',
                           r.role_name);
        ELSE
            EXECUTE format('GRANT SELECT ON lease.draining_shards TO %s', r.role_name);
        END IF;
    END LOOP;
END
$$;
