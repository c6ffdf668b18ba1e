-- compatibility: breaking (lease.members is keyed (group, node) and no longer holds sessions, which move to lease.nodes; bucket owners are nodes; every statement and function of the engine changes meaning)
--
-- Node sessions (docs/rules.md, "Data model and session rules"): one session
-- per process (a node), renewed by one row per heartbeat whatever the number of groups it is
-- in; membership per (group, node), written only on join, leave, claim and release; bucket
-- rows owned by (node, session) as before. A member is live iff its node's session is live.
--
-- Upgrade: stop every worker of the previous release (their statements name columns this
-- migration drops: they would fail, and a binary of the previous release refuses a schema
-- carrying this migration at start-up), run `leasectl migrate` of this release, then start
-- the new release's workers.
--
-- What happens to the rows there are: groups, bucket rows with their owners and tokens, the
-- draining generation of a resize and the server's epochs are kept. The previous release's
-- member rows (one session per group and worker) are dropped: every session ends, so a
-- bucket still recorded under one is expired, claimable by a takeover (a new worker takes it
-- once it has watched the store's clock for a ttl, rule C7), with a token above its last one.
-- Nothing is released and no token changes.

-- One row per node: its session. The only row a steady heartbeat writes (HOT: no indexed
-- column changes on a renewal). `timeline`: the server's timeline when the session was started
-- or last renewed (a session does not survive a failover, rule V1). `prior_expires_at`: the
-- expiry the last renewal extended, which that renewal reads back once it holds the row's lock
-- (see lease.heartbeat); NULL for a session never renewed.
CREATE TABLE lease.nodes (
    node_id      uuid        PRIMARY KEY,
    session_id   uuid        NOT NULL,
    incarnation  uuid        NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    metadata     text        NOT NULL DEFAULT '',
    timeline     bigint      NOT NULL,
    prior_expires_at timestamptz
) WITH (fillfactor = 50); -- room on the page for HOT renewals

-- A node's membership of a group. It exists only under the node's current session: a new
-- session removes the node's member rows (lease.heartbeat, under the node row's lock, so a join
-- under the old session has committed or fails), so a member is live iff its node's session
-- is. `owned` counts the group's buckets of the current generation held under that session:
-- exact while the session is live (a bucket leaves a live session only by a release, which
-- updates it, or a leave, which deletes the row; a resize zeroes it), so a view reads W member
-- rows instead of counting N buckets. Renewals never write here.
DROP TABLE lease.members;
CREATE TABLE lease.members (
    group_name text        NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    node_id    uuid        NOT NULL REFERENCES lease.nodes (node_id) ON DELETE CASCADE,
    joined_at  timestamptz NOT NULL,
    owned      integer     NOT NULL DEFAULT 0 CHECK (owned >= 0),
    PRIMARY KEY (group_name, node_id)
);

-- A heartbeat reads the node's groups on every tick: an index-only scan.
CREATE INDEX members_node_idx ON lease.members (node_id, group_name);

-- Bucket owners are nodes (the session column is unchanged). The indexes follow the rename.
ALTER TABLE lease.shards RENAME COLUMN owner_worker TO owner_node;
ALTER TABLE lease.draining_shards RENAME COLUMN owner_worker TO owner_node;

-- Each group's change counter (rule H8). It moves with every change a view of the group could
-- show except a member's session ending (a stamp carries the earliest expiry among the other
-- members for that): joins, leaves, claims that took a bucket, releases that released one,
-- resizes, dead members removed, a node's memberships ended by its new session. A heartbeat
-- that finds the counter where the node last saw it answers "unchanged" without building the
-- view. A row of its own rather than a column of lease.groups: every writer takes this row's
-- lock as its last (a claim holds its bucket rows by then), while a resize holds the group's
-- row from its start and waits for bucket rows, so the two never wait for each other.
CREATE TABLE lease.group_changes (
    group_name text   PRIMARY KEY REFERENCES lease.groups (name) ON DELETE CASCADE,
    version    bigint NOT NULL DEFAULT 0 CHECK (version >= 0)
) WITH (fillfactor = 50); -- HOT updates
INSERT INTO lease.group_changes (group_name) SELECT name FROM lease.groups;

-- VOLATILE, as it is (it changes when a standby is promoted): a VOLATILE SQL function is
-- inlined into the statement that calls it, a STABLE one wrapping volatile calls is not, and
-- an SQL function that is not inlined is planned again on every call (measured: half the cost
-- of a renewal).
CREATE OR REPLACE FUNCTION lease.timeline() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$
        SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))
               ::bit(32)::bigint
    $$;

-- Whether session p_session of node p_node owns nothing in group p_group any more, decided on
-- the latest committed state, never on a statement snapshot (VOLATILE: each query here takes a
-- fresh snapshot; a claim's bucket row may have been claimed after the claim's snapshot).
--
-- Dead: the node is no member of the group (it left, was evicted or removed as dead), holds
-- another session, or has no row. Otherwise an expired session's node row is locked FOR SHARE
-- until the caller commits: a renewal racing the caller waits, then finds (its clock read once
-- it holds the lock) the session expired and starts a new one. A row another transaction holds
-- (a renewal in flight) is skipped: not dead. (Dropped and created again: a parameter is
-- renamed; the roles that run workers get it back below.)
DROP FUNCTION lease.owner_is_dead(text, uuid, uuid, timestamptz);
CREATE FUNCTION lease.owner_is_dead(
    p_group text, p_node uuid, p_session uuid, p_at timestamptz
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM 1 FROM lease.members m JOIN lease.nodes n ON n.node_id = m.node_id
     WHERE m.group_name = p_group AND m.node_id = p_node AND n.session_id = p_session;
    IF NOT FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1 FROM lease.nodes n
     WHERE n.node_id = p_node AND n.session_id = p_session
       AND n.expires_at <= COALESCE(p_at, clock_timestamp())
       FOR SHARE SKIP LOCKED;
    RETURN FOUND;
END
$$;

-- The fencing check: owned by p_worker (a node) under its live session, the node a member of
-- the group, with exactly p_token, in either generation (a session never holds one bucket
-- number in both). The row it answers for stays share-locked until the caller's transaction
-- ends. CREATE OR REPLACE keeps the grants.
CREATE OR REPLACE FUNCTION lease.is_current(
    p_group text, p_bucket bigint, p_worker uuid, p_token bigint, p_at timestamptz DEFAULT NULL
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
    AS $$
BEGIN
    PERFORM 1
       FROM lease.shards s
       JOIN lease.nodes n ON n.node_id = s.owner_node AND n.session_id = s.owner_session
       JOIN lease.members m ON m.group_name = s.group_name AND m.node_id = s.owner_node
      WHERE s.group_name = p_group AND s.bucket = p_bucket
        AND s.owner_node = p_worker AND s.token = p_token
        AND n.expires_at > COALESCE(p_at, pg_catalog.clock_timestamp())
        FOR SHARE OF s;
    IF FOUND THEN
        RETURN true;
    END IF;
    PERFORM 1
       FROM lease.draining_shards d
       JOIN lease.nodes n ON n.node_id = d.owner_node AND n.session_id = d.owner_session
       JOIN lease.members m ON m.group_name = d.group_name AND m.node_id = d.owner_node
      WHERE d.group_name = p_group AND d.bucket = p_bucket
        AND d.owner_node = p_worker AND d.token = p_token
        AND n.expires_at > COALESCE(p_at, pg_catalog.clock_timestamp())
        FOR SHARE OF d;
    RETURN FOUND;
END
$$;

-- The view of group p_group for node p_node's live session p_session at p_now (its renewal),
-- for lease.heartbeat, when the node's stamp of the group does not say "unchanged" (rule H4).
-- One row: the view, in one statement (one snapshot), and the members found dead removed (rule H3), each judged again on the latest committed
-- state under its node row's lock (FOR UPDATE SKIP LOCKED: a renewal in flight, a claimer
-- judging it, another heartbeat removing it: left for later; a renewal that waits for this
-- lock then finds the session expired, as for a claim); the node row goes too once the node
-- is dead and a member of no group (while this holds the lock, no one else removes its
-- memberships, so the check sees every removal before it). The stamp: the counter the view was read at, or, when this removed
-- members, the counter it moved to, if nothing else moved it meanwhile; NULL (never
-- "unchanged" next time) if a member found dead was not removed (it may have renewed after the
-- view's snapshot, which left it out).
CREATE FUNCTION lease.group_view(
    p_group text, p_node uuid, p_session uuid, p_now timestamptz
) RETURNS TABLE (
    stamp_version bigint, until timestamptz, shard_count integer,
    generation bigint, previous_count integer, draining bigint, workers uuid[],
    loads integer[], buckets integer[], tokens bigint[], old_buckets integer[],
    old_tokens bigint[]
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_version  bigint;
    v_node     uuid;
    v_gone     integer := 0;
    v_row      record;
    v_bumped   bigint;
BEGIN
    SELECT c.version AS version, gr.shard_count AS shard_count, gr.generation AS generation,
           gr.previous_count AS previous_count, o.workers AS workers, o.loads AS loads,
           o.until AS until, o.suspects AS suspects, b.buckets AS buckets, b.tokens AS tokens,
           ob.buckets AS old_buckets, ob.tokens AS old_tokens, od.draining AS draining
      INTO v_row
      FROM lease.groups gr
      JOIN lease.group_changes c ON c.group_name = gr.name,
           LATERAL (SELECT array_agg(x.node_id) FILTER (WHERE l.live) AS workers,
                           array_agg(x.owned) FILTER (WHERE l.live) AS loads,
                           min(n.expires_at) FILTER (WHERE l.live) AS until,
                           array_agg(x.node_id) FILTER (WHERE NOT l.live) AS suspects
                      FROM lease.members x
                      LEFT JOIN LATERAL (SELECT y.expires_at FROM lease.nodes y
                                          WHERE y.node_id = x.node_id) AS n ON true,
                           LATERAL (SELECT COALESCE(n.expires_at > p_now, false) AS live) AS l
                     WHERE x.group_name = gr.name AND x.node_id <> p_node) AS o,
           LATERAL (SELECT array_agg(s.bucket) AS buckets, array_agg(s.token) AS tokens
                      FROM lease.shards s
                     WHERE s.group_name = gr.name AND s.owner_session = p_session) AS b,
           LATERAL (SELECT array_agg(d.bucket) AS buckets, array_agg(d.token) AS tokens
                      FROM lease.draining_shards d
                     WHERE d.group_name = gr.name AND d.owner_session = p_session) AS ob,
           LATERAL (SELECT count(*) AS draining
                      FROM lease.members x
                      JOIN LATERAL (SELECT y.session_id FROM lease.nodes y
                                     WHERE y.node_id = x.node_id
                                       AND y.expires_at > p_now) AS n ON true
                      JOIN lease.draining_shards d
                        ON d.group_name = x.group_name AND d.owner_node = x.node_id
                       AND d.owner_session = n.session_id
                     WHERE x.group_name = gr.name) AS od
     WHERE gr.name = p_group;
    v_version := v_row.version;
    FOREACH v_node IN ARRAY COALESCE(v_row.suspects, '{}') LOOP
        PERFORM 1 FROM lease.nodes y
         WHERE y.node_id = v_node AND y.expires_at <= p_now
           FOR UPDATE SKIP LOCKED;
        IF FOUND THEN
            DELETE FROM lease.members x WHERE x.group_name = p_group AND x.node_id = v_node;
            IF FOUND THEN
                v_gone := v_gone + 1;
            END IF;
            DELETE FROM lease.nodes y
             WHERE y.node_id = v_node
               AND NOT EXISTS (SELECT 1 FROM lease.members x WHERE x.node_id = v_node);
        END IF;
    END LOOP;
    IF v_gone > 0 THEN
        UPDATE lease.group_changes c SET version = c.version + 1
         WHERE c.group_name = p_group
        RETURNING c.version INTO v_bumped;
    END IF;
    stamp_version := CASE WHEN v_row.suspects IS NULL THEN v_version
                          WHEN v_gone = cardinality(v_row.suspects) AND v_bumped = v_version + 1
                          THEN v_bumped END;
    until := v_row.until;
    shard_count := v_row.shard_count;
    generation := v_row.generation;
    previous_count := v_row.previous_count;
    draining := v_row.draining;
    workers := COALESCE(v_row.workers, '{}');
    loads := COALESCE(v_row.loads, '{}');
    buckets := COALESCE(v_row.buckets, '{}');
    tokens := COALESCE(v_row.tokens, '{}');
    old_buckets := COALESCE(v_row.old_buckets, '{}');
    old_tokens := COALESCE(v_row.old_tokens, '{}');
    RETURN NEXT;
END
$$;

-- The steady renewal's refusal (lease-diesel's STEADY_RENEWAL): it renews in one plain UPDATE
-- whose clock reading precedes the row's lock, and reads the clock again once the row is its
-- own; a session that expired meanwhile must not be extended (its death may have been acted
-- on), so the statement fails here, which undoes it, and the caller takes lease.heartbeat's
-- path. Called only then (behind a CASE).
CREATE FUNCTION lease.renewal_too_late() RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    RAISE EXCEPTION 'lease.renewal_too_late: the session expired while its renewal waited';
END
$$;

-- A node's heartbeat (rules H1-H8, V1): extend its live session or start one, and for every
-- group it is a member of, say "unchanged" or give the view. One call, one round trip.
--
-- Its renewal is one plain UPDATE of the node's row (HOT: the only row written) returning
-- its member rows' groups (an index-only scan) and their counters: a group whose counter is
-- the one the node handed in, with the stamp's `until` (the earliest expiry among the other
-- members when the view was given) still ahead, is unchanged without reading anything else
-- (H8). The other groups are looked at again or get lease.group_view. `p_seen_groups` must be
-- sorted by bytes. (Outside a transaction, lease-diesel answers a steady tick with a plain
-- statement of its own, STEADY_RENEWAL, and calls this only when that finds a change.)
--
-- Rows: one with the session and the groups answered unchanged (`group_name` NULL), and one
-- per group whose view is given.
--
-- The UPDATE reads the clock before it locks the row (its WHERE and SET are computed before
-- it waits for a lock another transaction holds, and not again if that transaction did not
-- change the row), so liveness is judged a second time, on a clock read once the UPDATE holds
-- the lock, against the expiry it found (`prior_expires_at`, which the SET stashes from the
-- row it locked): a renewal that waited for the row past the session's expiry, for a claimer
-- or a heartbeat that judged the session dead under that lock, starts a new session instead.
-- Otherwise (no row, expired, another timeline, another incarnation), the slow path locks the
-- row, reads the clock under the lock, and starts a new session (its member rows go, each
-- group's counter moves and it hears Left; the timeline is recorded if it is new, rule V2) or
-- refuses (another incarnation's live session, H7: nothing written, `mine` false and that
-- session's expiry). A new session is a member of no group: no group row is returned then.
CREATE FUNCTION lease.heartbeat(
    p_node uuid, p_session uuid, p_ttl interval, p_metadata text, p_at timestamptz,
    p_incarnation uuid, p_seen_groups text[], p_seen_versions bigint[],
    p_seen_until timestamptz[]
) RETURNS TABLE (
    session_id uuid, heartbeat_at timestamptz, expires_at timestamptz, started boolean,
    mine boolean, timeline bigint, recorded boolean, unchanged_groups text[],
    unchanged_versions bigint[], unchanged_until timestamptz[], group_name text,
    stamp_version bigint, until timestamptz, shard_count integer, generation bigint,
    previous_count integer, draining bigint, workers uuid[], loads integer[],
    buckets integer[], tokens bigint[], old_buckets integer[], old_tokens bigint[]
)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_timeline bigint := lease.timeline();
    v_t        timestamptz := COALESCE(p_at, clock_timestamp());
    v_session  uuid;
    v_prior    timestamptz;
    v_late     boolean := false;
    v_started  boolean := false;
    v_node     lease.nodes%ROWTYPE;
    v_left     text[];
    v_names    text[];
    v_versions bigint[];
    v_i        integer;
    v_j        integer := 1;
    v_seen     integer;
    v_same     boolean;
    v_view     record;
    v_u_groups text[];
    v_u_vers   bigint[];
    v_u_until  timestamptz[];
    v_state    integer[];
    v_kept     timestamptz[];
    v_recheck  text[] := '{}';
    v_rc_names text[] := '{}';
    v_rc_vers  bigint[];
    v_rc_dead  bigint[];
    v_rc_until timestamptz[];
    v_k        integer := 1;
BEGIN
    -- The node's groups and their counters come with the renewal, ordered as the caller orders
    -- `p_seen_groups` (by bytes: COLLATE "C"), so that the steady case compares two arrays.
    UPDATE lease.nodes n
       SET heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata,
           prior_expires_at = n.expires_at
     WHERE n.node_id = p_node AND n.incarnation = p_incarnation
       AND n.expires_at > v_t AND n.timeline = v_timeline
    RETURNING n.session_id, n.prior_expires_at,
              ARRAY(SELECT m.group_name FROM lease.members m WHERE m.node_id = p_node
                     ORDER BY m.group_name COLLATE "C"),
              ARRAY(SELECT c.version
                      FROM lease.members m JOIN lease.group_changes c
                        ON c.group_name = m.group_name
                     WHERE m.node_id = p_node
                     ORDER BY m.group_name COLLATE "C")
         INTO v_session, v_prior, v_names, v_versions;
    -- The clock again, now that the row is locked: if the session expired while this waited
    -- for the lock, it is over (its death may have been acted on), whatever was read before.
    v_late := FOUND AND COALESCE(p_at, clock_timestamp()) >= v_prior;
    IF FOUND AND NOT v_late THEN
        IF v_names = p_seen_groups AND v_versions = p_seen_versions
           AND (v_t >= ANY (p_seen_until)) IS NOT TRUE THEN
            -- The steady tick: every group unchanged (H8), with the stamps handed in.
            session_id := v_session;
            heartbeat_at := v_t;
            expires_at := v_t + p_ttl;
            started := false;
            mine := true;
            timeline := v_timeline;
            recorded := false;
            unchanged_groups := v_names;
            unchanged_versions := v_versions;
            unchanged_until := p_seen_until;
            RETURN NEXT;
            RETURN;
        END IF;
    ELSE
        LOOP
            SELECT * INTO v_node FROM lease.nodes n WHERE n.node_id = p_node FOR UPDATE;
            v_t := COALESCE(p_at, clock_timestamp());
            IF v_late THEN
                -- Renewed above, too late: the session ended while the renewal waited.
                v_node.expires_at := v_prior;
            END IF;
            IF NOT FOUND THEN
                INSERT INTO lease.nodes AS n
                       (node_id, session_id, incarnation, started_at, heartbeat_at, expires_at,
                        metadata, timeline)
                VALUES (p_node, p_session, p_incarnation, v_t, v_t, v_t + p_ttl, p_metadata,
                        v_timeline)
                ON CONFLICT (node_id) DO NOTHING;
                -- Not inserted: another process with this node id did, meanwhile; judge it.
                CONTINUE WHEN NOT FOUND;
                v_started := true;
            ELSIF v_node.expires_at > v_t AND v_node.timeline = v_timeline THEN
                IF v_node.incarnation <> p_incarnation THEN
                    -- H7: another process's live session; nothing written.
                    RETURN QUERY SELECT v_node.session_id, v_node.heartbeat_at,
                                        v_node.expires_at, false, false, v_timeline, false,
                                        NULL::text[], NULL::bigint[], NULL::timestamptz[],
                                        NULL::text, NULL::bigint, NULL::timestamptz,
                                        NULL::integer, NULL::bigint, NULL::integer, NULL::bigint,
                                        NULL::uuid[], NULL::integer[], NULL::integer[],
                                        NULL::bigint[], NULL::integer[], NULL::bigint[];
                    RETURN;
                END IF;
                -- Live and ours: the renewal above missed it only because the row changed
                -- under it; extend it now.
                UPDATE lease.nodes n
                   SET heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata
                 WHERE n.node_id = p_node;
                v_session := v_node.session_id;
                SELECT ARRAY(SELECT m.group_name FROM lease.members m WHERE m.node_id = p_node
                              ORDER BY m.group_name COLLATE "C"),
                       ARRAY(SELECT c.version
                               FROM lease.members m JOIN lease.group_changes c
                                 ON c.group_name = m.group_name
                              WHERE m.node_id = p_node
                              ORDER BY m.group_name COLLATE "C")
                  INTO v_names, v_versions;
            ELSE
                -- H2, V1: a new session. (Its clock read under the lock.)
                UPDATE lease.nodes n
                   SET session_id = p_session, incarnation = p_incarnation, started_at = v_t,
                       heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata,
                       timeline = v_timeline, prior_expires_at = NULL
                 WHERE n.node_id = p_node;
                -- Under the node row's lock, with this statement's fresh snapshot: a join under
                -- the old session committed before, or waits and then fails.
                WITH gone AS (
                    DELETE FROM lease.members m WHERE m.node_id = p_node RETURNING m.group_name
                )
                SELECT array_agg(gone.group_name ORDER BY gone.group_name) INTO v_left FROM gone;
                -- The counters in the order every heartbeat takes them (by bytes, as it walks
                -- its groups): another node's heartbeat moving two of them, as it removes dead
                -- members, would otherwise deadlock with this.
                PERFORM 1 FROM lease.group_changes c WHERE c.group_name = ANY (v_left)
                  ORDER BY c.group_name COLLATE "C" FOR UPDATE;
                UPDATE lease.group_changes c SET version = c.version + 1
                 WHERE c.group_name = ANY (v_left);
                PERFORM pg_notify(lease.channel(g), 'L' || p_node::text)
                   FROM unnest(v_left) AS g;
                v_started := true;
            END IF;
            EXIT;
        END LOOP;
        IF v_started THEN
            -- H9: other nodes whose sessions are dead and that are members of no group
            -- (they died before joining, or after leaving). Rare (session starts only),
            -- and the table holds a row per process. A row another transaction holds (its
            -- own new session starting) is left; deleting one makes the node's next
            -- heartbeat start afresh, as its expiry already had. Nothing references node
            -- rows but member rows (none here) and bucket owners (a dead owner either way).
            DELETE FROM lease.nodes y
             WHERE y.node_id IN (SELECT z.node_id FROM lease.nodes z
                                  WHERE z.expires_at <= v_t AND z.node_id <> p_node
                                    AND NOT EXISTS (SELECT 1 FROM lease.members x
                                                     WHERE x.node_id = z.node_id)
                                    FOR UPDATE SKIP LOCKED);
            -- The first heartbeat on a timeline records when it was first seen (V2). A session
            -- of an earlier timeline is never extended, so every first heartbeat on a new one
            -- starts a session and comes here.
            INSERT INTO lease.server_epochs AS e (timeline, first_seen) VALUES (v_timeline, v_t)
            ON CONFLICT (timeline) DO NOTHING;
            RETURN QUERY SELECT p_session, v_t, v_t + p_ttl, true, true, v_timeline, FOUND,
                                '{}'::text[], '{}'::bigint[], '{}'::timestamptz[], NULL::text,
                                NULL::bigint, NULL::timestamptz, NULL::integer, NULL::bigint,
                                NULL::integer, NULL::bigint, NULL::uuid[], NULL::integer[],
                                NULL::integer[], NULL::bigint[], NULL::integer[],
                                NULL::bigint[];
            RETURN;
        END IF;
    END IF;
    -- Some group changed (or a stamp's until passed, or the node joined or left one): walk the
    -- node's groups beside the stamps handed in. A group unchanged by its stamp is answered so.
    -- A group at the counter the node saw whose stamp's `until` passed is unchanged if no
    -- member died since (the counter says the member rows are the stamp's: a removal moves
    -- it), with a new `until`: every such group is looked at in one statement, since with many
    -- groups one call each costs many times the reads. The others get lease.group_view.
    session_id := v_session;
    heartbeat_at := v_t;
    expires_at := v_t + p_ttl;
    started := false;
    mine := true;
    timeline := v_timeline;
    recorded := false;
    v_seen := COALESCE(array_length(p_seen_groups, 1), 0);
    v_u_groups := '{}';
    v_u_vers := '{}';
    v_u_until := '{}';
    -- v_state: 0 the view, 1 unchanged by its stamp (until v_kept), 2 to look at again.
    v_state := array_fill(0, ARRAY[COALESCE(array_length(v_names, 1), 0)]);
    v_kept := array_fill(NULL::timestamptz, ARRAY[COALESCE(array_length(v_names, 1), 0)]);
    FOR v_i IN 1 .. COALESCE(array_length(v_names, 1), 0) LOOP
        WHILE v_j <= v_seen AND p_seen_groups[v_j] COLLATE "C" < v_names[v_i] COLLATE "C" LOOP
            v_j := v_j + 1;
        END LOOP;
        v_same := v_j <= v_seen AND p_seen_groups[v_j] = v_names[v_i]
                  AND p_seen_versions[v_j] = v_versions[v_i];
        IF v_same AND (p_seen_until[v_j] IS NULL OR p_seen_until[v_j] > v_t) THEN
            v_state[v_i] := 1;
            v_kept[v_i] := p_seen_until[v_j];
        ELSIF v_same THEN
            v_state[v_i] := 2;
            v_recheck := v_recheck || v_names[v_i];
        END IF;
    END LOOP;
    IF cardinality(v_recheck) > 0 THEN
        SELECT COALESCE(array_agg(r.group_name ORDER BY r.group_name COLLATE "C"), '{}'),
               array_agg(r.version ORDER BY r.group_name COLLATE "C"),
               array_agg(r.dead ORDER BY r.group_name COLLATE "C"),
               array_agg(r.until ORDER BY r.group_name COLLATE "C")
          INTO v_rc_names, v_rc_vers, v_rc_dead, v_rc_until
          FROM (SELECT c.group_name, c.version, o.dead, o.until
                  -- Group by group, index scans each (a plan over all of them at once, made
                  -- without knowing how many, may read every member row of the schema).
                  FROM unnest(v_recheck) AS g (name)
                  JOIN lease.group_changes c ON c.group_name = g.name,
                       LATERAL (SELECT count(*) FILTER (WHERE NOT COALESCE(n.expires_at > v_t,
                                                                           false)) AS dead,
                                       min(n.expires_at) AS until
                                  FROM lease.members x
                                  LEFT JOIN LATERAL (SELECT y.expires_at FROM lease.nodes y
                                                      WHERE y.node_id = x.node_id) AS n ON true
                                 WHERE x.group_name = c.group_name
                                   AND x.node_id <> p_node) AS o) AS r;
    END IF;
    FOR v_i IN 1 .. COALESCE(array_length(v_names, 1), 0) LOOP
        IF v_state[v_i] = 1 THEN
            v_u_groups := v_u_groups || v_names[v_i];
            v_u_vers := v_u_vers || v_versions[v_i];
            v_u_until := v_u_until || v_kept[v_i];
            CONTINUE;
        END IF;
        IF v_state[v_i] = 2 THEN
            WHILE v_k <= cardinality(v_rc_names)
                  AND v_rc_names[v_k] COLLATE "C" < v_names[v_i] COLLATE "C" LOOP
                v_k := v_k + 1;
            END LOOP;
            IF v_k <= cardinality(v_rc_names) AND v_rc_names[v_k] = v_names[v_i]
               AND v_rc_vers[v_k] = v_versions[v_i] AND v_rc_dead[v_k] = 0 THEN
                v_u_groups := v_u_groups || v_names[v_i];
                v_u_vers := v_u_vers || v_rc_vers[v_k];
                v_u_until := v_u_until || v_rc_until[v_k];
                CONTINUE;
            END IF;
        END IF;
        SELECT * INTO v_view
          FROM lease.group_view(v_names[v_i], p_node, v_session, v_t);
        group_name := v_names[v_i];
        stamp_version := v_view.stamp_version;
        until := v_view.until;
        shard_count := v_view.shard_count;
        generation := v_view.generation;
        previous_count := v_view.previous_count;
        draining := v_view.draining;
        workers := v_view.workers;
        loads := v_view.loads;
        buckets := v_view.buckets;
        tokens := v_view.tokens;
        old_buckets := v_view.old_buckets;
        old_tokens := v_view.old_tokens;
        RETURN NEXT;
    END LOOP;
    -- The session, and the groups answered unchanged.
    unchanged_groups := v_u_groups;
    unchanged_versions := v_u_vers;
    unchanged_until := v_u_until;
    group_name := NULL;
    stamp_version := NULL;
    until := NULL;
    shard_count := NULL;
    generation := NULL;
    previous_count := NULL;
    draining := NULL;
    workers := NULL;
    loads := NULL;
    buckets := NULL;
    tokens := NULL;
    old_buckets := NULL;
    old_tokens := NULL;
    RETURN NEXT;
END
$$;

-- Leave group p_group: the node's member row goes (if p_session is its node's session, or
-- p_session is NULL: an operator's eviction), with it every bucket of the group its live
-- session holds (rows another transaction holds are skipped: claimable once it ends, the node
-- being no member any more), and the node's row once it is a member of no group (rule L3: its
-- session ends). NULL: no such group; otherwise the buckets released, sorted.
--
-- A function, for the order of its steps: the node's row is locked first, as every statement
-- of the engine locks (node, member, buckets, change counter), so leaves of one node serialize
-- there and the check that no membership is left, a statement of its own with a fresh
-- snapshot, sees the other leaves committed before.
CREATE FUNCTION lease.leave(p_group text, p_node uuid, p_session uuid, p_at timestamptz)
    RETURNS integer[]
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_session uuid;
    v_expires timestamptz;
    v_now     timestamptz;
    v_freed   integer[] := '{}';
BEGIN
    PERFORM 1 FROM lease.groups g WHERE g.name = p_group;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    SELECT n.session_id, n.expires_at INTO v_session, v_expires
      FROM lease.nodes n WHERE n.node_id = p_node
       FOR UPDATE;
    IF NOT FOUND OR v_session <> COALESCE(p_session, v_session) THEN
        RETURN v_freed;
    END IF;
    DELETE FROM lease.members m WHERE m.group_name = p_group AND m.node_id = p_node;
    IF NOT FOUND THEN
        RETURN v_freed;
    END IF;
    v_now := COALESCE(p_at, clock_timestamp());
    IF v_expires > v_now THEN
        WITH freed AS (
            UPDATE lease.shards s
               SET owner_node = NULL, owner_session = NULL, updated_at = v_now
             WHERE s.group_name = p_group
               AND s.bucket IN (SELECT x.bucket FROM lease.shards x
                                 WHERE x.group_name = p_group AND x.owner_session = v_session
                                   FOR UPDATE OF x SKIP LOCKED)
            RETURNING s.bucket
        ), freed_old AS (
            UPDATE lease.draining_shards d
               SET owner_node = NULL, owner_session = NULL
             WHERE d.group_name = p_group
               AND d.bucket IN (SELECT x.bucket FROM lease.draining_shards x
                                 WHERE x.group_name = p_group AND x.owner_session = v_session
                                   FOR UPDATE OF x SKIP LOCKED)
            RETURNING d.bucket
        )
        SELECT ARRAY(SELECT bucket FROM freed UNION ALL SELECT bucket FROM freed_old
                     ORDER BY bucket)
          INTO v_freed;
    END IF;
    UPDATE lease.group_changes c SET version = c.version + 1 WHERE c.group_name = p_group;
    PERFORM pg_notify(lease.channel(p_group), 'L' || p_node::text);
    DELETE FROM lease.nodes n
     WHERE n.node_id = p_node
       AND NOT EXISTS (SELECT 1 FROM lease.members m WHERE m.node_id = p_node);
    RETURN v_freed;
END
$$;

-- Roles that ran workers under the previous release (those that could update lease.shards)
-- get what this release's workers use, and roles that could read lease.shards (monitors) may
-- read the new tables: the roles `leasectl grant` set up keep working once the new release
-- runs (lease_diesel::privileges lists the same). The old lease.members went with its grants.
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
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON lease.nodes TO %s', r.role_name);
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON lease.members TO %s', r.role_name);
            EXECUTE format('GRANT SELECT, INSERT, UPDATE ON lease.group_changes TO %s', r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.owner_is_dead(text, uuid, uuid, timestamptz) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[], timestamptz[]) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.group_view(text, uuid, uuid, timestamptz) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.renewal_too_late() TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.leave(text, uuid, uuid, timestamptz) TO %s',
                           r.role_name);
        ELSE
            EXECUTE format('GRANT SELECT ON lease.nodes TO %s', r.role_name);
            EXECUTE format('GRANT SELECT ON lease.members TO %s', r.role_name);
        END IF;
    END LOOP;
END
$$;
