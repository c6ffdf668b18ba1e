-- compatibility: breaking (the first migration: no binary runs without it)
--
-- The lease engine's tables: one row per group, one per (group, worker) session, one per
-- (group, bucket). See docs/rules.md, "Data model and session rules".
--
-- Schema `lease` itself is created by the runner (PgLeaseStore::migrate) before this runs,
-- together with its version table; the runner refuses a `lease` schema it did not create.
-- (Earlier releases created it here with IF NOT EXISTS; deployments that applied that text
-- are adopted with this migration recorded as applied, so it never runs there again.)

-- One row per group, written before any bucket row, so a shard-count mismatch is detected
-- before anything is written.
CREATE TABLE lease.groups (
    name        text        PRIMARY KEY CHECK (octet_length(name) BETWEEN 1 AND 200),
    shard_count integer     NOT NULL CHECK (shard_count BETWEEN 1 AND 65536),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A worker's session in a group. A heartbeat rewrites only this row; `owned` counts the
-- buckets held under `session_id` (exact while the session is live: buckets leave a live
-- session only by release or leave, which update it), so a heartbeat reads W rows instead of
-- counting N buckets.
CREATE TABLE lease.members (
    group_name   text        NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    worker_id    uuid        NOT NULL,
    session_id   uuid        NOT NULL,
    expires_at   timestamptz NOT NULL,
    joined_at    timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    owned        integer     NOT NULL DEFAULT 0 CHECK (owned >= 0),
    metadata     text        NOT NULL DEFAULT '',
    PRIMARY KEY (group_name, worker_id)
) WITH (fillfactor = 50); -- room on the page for HOT renewals (no indexed column changes)

-- One row per bucket: its owner, the session it was claimed under and its fencing token.
-- Owned iff (owner_worker, owner_session) names a member row holding that session, live.
CREATE TABLE lease.shards (
    group_name    text        NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    bucket        integer     NOT NULL CHECK (bucket >= 0),
    owner_worker  uuid,
    owner_session uuid,
    token         bigint      NOT NULL DEFAULT 0 CHECK (token >= 0),
    updated_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_name, bucket),
    CHECK ((owner_worker IS NULL) = (owner_session IS NULL))
);

-- A heartbeat reads the worker's own leases by session.
CREATE INDEX shards_owner_session_idx ON lease.shards (owner_session)
    WHERE owner_session IS NOT NULL;

-- The NOTIFY channel of a group: a fixed-length identifier whatever the name holds.
CREATE FUNCTION lease.channel(p_group text) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT 'lease_' || md5(p_group) $$;

-- Whether session p_session of p_worker is dead for good, decided on the latest committed
-- state, never on a statement snapshot: a claim's bucket row may have been claimed and
-- committed after the claim's snapshot was taken (Postgres re-checks the row, but a
-- snapshot-based test would call the new, live owner dead). VOLATILE, so each query here takes
-- a fresh snapshot.
--
-- A member row still holding the session and expired is locked FOR SHARE until the claim
-- commits: a renewal racing the claim waits, then finds the session expired and starts a new
-- one. A row locked by someone else (a renewal in flight) is skipped: not dead. A session no
-- member row holds any more (the worker left or started a new session) can never be live
-- again.
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

-- The fencing check, for an application's own transaction: true iff p_worker owns p_bucket
-- under a live session with exactly p_token. When true, the bucket row stays share-locked
-- until the caller's transaction ends, so no claim can take the bucket before the caller's
-- writes commit. p_at overrides the server clock (tests); leave it NULL.
CREATE FUNCTION lease.is_current(
    p_group text, p_bucket bigint, p_worker uuid, p_token bigint, p_at timestamptz DEFAULT NULL
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
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
        AND m.expires_at > COALESCE(p_at, clock_timestamp())
        FOR SHARE OF s;
    RETURN FOUND;
END
$$;
