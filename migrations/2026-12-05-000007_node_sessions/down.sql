-- Back to sessions per (group, worker): the node sessions and memberships go (every session
-- ends, as on the way up), bucket owners are workers again, the functions of migration 6.
DROP FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[],
                              timestamptz[]);
DROP FUNCTION lease.group_view(text, uuid, uuid, timestamptz);
DROP FUNCTION lease.leave(text, uuid, uuid, timestamptz);
DROP FUNCTION lease.renewal_too_late();
-- As migration 5 made it.
CREATE OR REPLACE FUNCTION lease.timeline() RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))
               ::bit(32)::bigint
    $$;
DROP TABLE lease.group_changes;
ALTER TABLE lease.draining_shards RENAME COLUMN owner_node TO owner_worker;
ALTER TABLE lease.shards RENAME COLUMN owner_node TO owner_worker;
DROP TABLE lease.members;
DROP TABLE lease.nodes;
CREATE TABLE lease.members (
    group_name   text        NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    worker_id    uuid        NOT NULL,
    session_id   uuid        NOT NULL,
    expires_at   timestamptz NOT NULL,
    joined_at    timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    owned        integer     NOT NULL DEFAULT 0 CHECK (owned >= 0),
    metadata     text        NOT NULL DEFAULT '',
    incarnation  uuid,
    timeline     bigint,
    PRIMARY KEY (group_name, worker_id)
) WITH (fillfactor = 50);
DROP FUNCTION lease.owner_is_dead(text, uuid, uuid, timestamptz);
CREATE FUNCTION lease.owner_is_dead(
    p_group text, p_worker uuid, p_session uuid, p_at timestamptz
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM 1 FROM lease.members m
     WHERE m.group_name = p_group AND m.worker_id = p_worker AND m.session_id = p_session
       AND m.expires_at <= COALESCE(p_at, clock_timestamp())
       FOR SHARE SKIP LOCKED;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM lease.members m
     WHERE m.group_name = p_group AND m.worker_id = p_worker AND m.session_id = p_session;
    RETURN NOT FOUND;
END
$$;
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
