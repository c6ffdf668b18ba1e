-- compatibility: breaking (lease.heartbeat and lease.group_view return new columns, so they are dropped and created again; claims skip quarantined buckets, take nothing for a cordoned or draining member and take the buckets the claimer last held first, which the claims of a binary that does not know this migration would not)
--
-- Operators' controls (rules K1-K3, Q1-Q4, C9-C11; docs/postgres.md, "Operators' controls
-- on Postgres"): a weight and a mode per (group, node), kept whatever the node's session;
-- quarantines of buckets; sticky claims; hand-over of a node's session to its next process
-- (HO1-HO3).
--
-- Upgrade: as for every breaking migration, a binary of the previous release refuses to start
-- on a schema carrying it. Stop the previous release's workers, run `leasectl migrate` of this
-- release, start the new release's workers. Every row is kept: no session ends, no bucket
-- moves, no token changes; every member starts with weight 1, active, and no bucket is under
-- quarantine. A bucket's last owner (sticky claims) is its recorded owner where there is one,
-- unknown for buckets released before the migration.

-- HO1-HO3: the node's live session was handed over (lease.hand_over) and waits for the next
-- process with the node id, whose first heartbeat takes it over (lease.heartbeat) and clears
-- the mark; every new session starts without it. A constant default: no table rewrite, and
-- every session the previous release left is not handed over. Not indexed: a renewal stays a
-- HOT update.
ALTER TABLE lease.nodes ADD COLUMN handed_over boolean NOT NULL DEFAULT false;

-- K1: an operator's control of a node in a group: its weight and its mode. No foreign key to
-- the node or its membership: a control outlives the node's session, its leaves and the
-- removal of its rows (H3, H9), and applies again when the node joins. A row is written by
-- the first control that changes the node's value (never for the defaults) and stays, even
-- set back to them (K2: an uncordoned node that left may still be controlled).
CREATE TABLE lease.member_controls (
    group_name text    NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    node_id    uuid    NOT NULL,
    weight     integer NOT NULL DEFAULT 1 CHECK (weight BETWEEN 0 AND 1000000),
    mode       text    NOT NULL DEFAULT 'active'
               CHECK (mode IN ('active', 'cordoned', 'draining')),
    PRIMARY KEY (group_name, node_id)
);

-- Q1: a bucket of the current generation under quarantine until `until` (the store's clock).
-- A heartbeat building a group's view reads the group's rows (a range of the primary key):
-- the buckets under quarantine, and the earliest end (a stamp's `until`, Q3). A row is deleted
-- only by a lift of a running quarantine and by a resize (both move the group's change
-- counter), replaced only by a new quarantine of the bucket (which moves it too); an ended
-- one's row stays until then (see lease.quarantine). At most one row per bucket.
CREATE TABLE lease.quarantines (
    group_name text        NOT NULL REFERENCES lease.groups (name) ON DELETE CASCADE,
    bucket     integer     NOT NULL CHECK (bucket >= 0),
    until      timestamptz NOT NULL,
    PRIMARY KEY (group_name, bucket)
);

-- `quarantined_until`: the bucket's quarantine as claims see it, the `until` of its row in
-- lease.quarantines (written with it by lease.quarantine, in one transaction; NULL when the
-- bucket has no row, and on the new rows of a resize, which deletes the group's quarantines).
-- On the bucket row because a claim must see a quarantine committed after its snapshot: the
-- quarantine writes the row, so a claim reaching it afterwards re-checks its new version
-- (Postgres does, for a row a locking walk finds changed), and a claim meanwhile skips the
-- row the quarantine holds; a check of lease.quarantines would use the claim's snapshot.
--
-- `last_node`: the node of the last session that held the bucket (C9), set by the claims that
-- take it and kept when it is released, left or taken over; NULL for a bucket never held since
-- it was opened. A claim takes the buckets its node last held first.
ALTER TABLE lease.shards ADD COLUMN last_node uuid;
ALTER TABLE lease.shards ADD COLUMN quarantined_until timestamptz;
UPDATE lease.shards SET last_node = owner_node WHERE owner_node IS NOT NULL;

-- The unowned buckets a node last held, in order: a claim's sticky walk (its buckets of dead
-- sessions come through shards_owner_idx, as every dead session's do).
CREATE INDEX shards_sticky_idx ON lease.shards (group_name, last_node, bucket)
    WHERE owner_session IS NULL;

-- C11: whether node p_node may claim in group p_group: not when an operator cordoned or
-- drained it. Decided on the latest committed state (VOLATILE: a fresh snapshot), never on
-- the claim's snapshot: a claim calls it once it holds its member row, and lease.control
-- share-locks that row, so a control committed while the claim waited for the row is seen.
CREATE FUNCTION lease.may_claim(p_group text, p_node uuid) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM 1 FROM lease.member_controls k
     WHERE k.group_name = p_group AND k.node_id = p_node AND k.mode <> 'active';
    RETURN NOT FOUND;
END
$$;

-- K1-K3: set node p_node's weight (p_weight, when not NULL) or mode (p_mode, when not NULL)
-- in group p_group. NULL: no such group; 0: the node is no member of the group and has no
-- control stored there (K2, nothing written); 1: the value is the one stored (nothing
-- written); 2: set, the group's counter moved and its members heard 'C' (Controlled).
--
-- Locks: the member row (FOR KEY SHARE), then the control row, then the change counter. A
-- claim holds its member row (FOR UPDATE) from its start to its commit and judges its mode
-- once it holds it (lease.may_claim), so a claim and a control of its member serialize: the
-- claim commits before the control begins or sees the control. (KEY SHARE rather than SHARE:
-- a resize's update of the members' counts, which holds the group's row that this control's
-- insert may wait for, does not conflict with it.) The stored value is read under the control
-- row's lock, the latest committed one, and only the value asked for changes: two controls of
-- one member, one setting the weight and one the mode, both take effect. A first control
-- inserts the row; one that finds it inserted meanwhile (ON CONFLICT DO NOTHING, after
-- waiting for the inserter) changes it as it is.
CREATE FUNCTION lease.control(p_group text, p_node uuid, p_weight integer, p_mode text)
    RETURNS integer
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_member boolean;
    v_weight integer;
    v_mode   text;
BEGIN
    PERFORM 1 FROM lease.groups g WHERE g.name = p_group;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    PERFORM 1 FROM lease.members m
     WHERE m.group_name = p_group AND m.node_id = p_node
       FOR KEY SHARE;
    v_member := FOUND;
    LOOP
        SELECT k.weight, k.mode INTO v_weight, v_mode
          FROM lease.member_controls k
         WHERE k.group_name = p_group AND k.node_id = p_node
           FOR UPDATE;
        IF FOUND THEN
            IF COALESCE(p_weight, v_weight) = v_weight AND COALESCE(p_mode, v_mode) = v_mode THEN
                RETURN 1;
            END IF;
            -- K2: the row stays, even at the defaults (an uncordoned node that left can
            -- still be controlled).
            UPDATE lease.member_controls k
               SET weight = COALESCE(p_weight, v_weight), mode = COALESCE(p_mode, v_mode)
             WHERE k.group_name = p_group AND k.node_id = p_node;
            EXIT;
        END IF;
        IF NOT v_member THEN
            RETURN 0;
        END IF;
        v_weight := COALESCE(p_weight, 1);
        v_mode := COALESCE(p_mode, 'active');
        IF v_weight = 1 AND v_mode = 'active' THEN
            RETURN 1;
        END IF;
        INSERT INTO lease.member_controls AS k (group_name, node_id, weight, mode)
        VALUES (p_group, p_node, v_weight, v_mode)
        ON CONFLICT (group_name, node_id) DO NOTHING;
        EXIT WHEN FOUND;
    END LOOP;
    UPDATE lease.group_changes c SET version = c.version + 1 WHERE c.group_name = p_group;
    PERFORM pg_notify(lease.channel(p_group), 'C' || p_node::text);
    RETURN 2;
END
$$;

-- Q1-Q4: put bucket p_bucket of group p_group under quarantine for p_for from the store's
-- time (p_at, or the server's clock), replacing a quarantine it is under, or lift it (p_for
-- NULL). No row: no such group. Otherwise the group's count and whether anything changed:
-- a bucket out of range (p_bucket >= shard_count) writes nothing, nor does lifting a bucket
-- not under quarantine (Q3). A change moves the group's counter and its members hear 'C'.
--
-- Locks: the quarantine row, then the bucket row (its quarantined_until: see lease.shards),
-- then the change counter. A resize deletes the group's quarantines before it moves the bucket
-- rows, in the same order, so the two never wait for each other in a cycle: a quarantine
-- holding its row finishes first (and the resize then lifts it), or the resize does and the
-- quarantine, whose foreign-key check waits for the resize's lock on the group's row, applies
-- to that bucket number of the new generation, or finds it out of the new count (no bucket
-- row to write: it undoes its row). A claim holding the bucket row commits first: it took the
-- bucket, whose owner keeps it (Q2).
--
-- Lifting a quarantine that has ended leaves its row: deleting it without moving the counter
-- could hide its end from a heartbeat's re-check of a stamp whose view counted it (the
-- re-check finds the ended rows at or after the stamp's `until`; see lease.heartbeat).
CREATE FUNCTION lease.quarantine(
    p_group text, p_bucket bigint, p_for interval, p_at timestamptz
) RETURNS TABLE (shard_count integer, changed boolean)
    LANGUAGE plpgsql VOLATILE
    AS $$
#variable_conflict use_column
DECLARE
    v_count integer;
    v_t     timestamptz;
    v_until timestamptz;
BEGIN
    SELECT g.shard_count INTO v_count FROM lease.groups g WHERE g.name = p_group;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF p_bucket < 0 OR p_bucket >= v_count THEN
        RETURN QUERY SELECT v_count, false;
        RETURN;
    END IF;
    v_t := COALESCE(p_at, clock_timestamp());
    IF p_for IS NULL THEN
        DELETE FROM lease.quarantines q
         WHERE q.group_name = p_group AND q.bucket = p_bucket AND q.until > v_t;
        IF NOT FOUND THEN
            RETURN QUERY SELECT v_count, false;
            RETURN;
        END IF;
        UPDATE lease.shards s SET quarantined_until = NULL
         WHERE s.group_name = p_group AND s.bucket = p_bucket;
    ELSE
        v_until := v_t + p_for;
        INSERT INTO lease.quarantines AS q (group_name, bucket, until)
        VALUES (p_group, p_bucket, v_until)
        ON CONFLICT (group_name, bucket) DO UPDATE SET until = EXCLUDED.until;
        UPDATE lease.shards s SET quarantined_until = v_until
         WHERE s.group_name = p_group AND s.bucket = p_bucket;
        IF NOT FOUND THEN
            -- A resize committed since the count was read, and the bucket is out of its new
            -- count: nothing to quarantine.
            DELETE FROM lease.quarantines q
             WHERE q.group_name = p_group AND q.bucket = p_bucket;
            RETURN QUERY SELECT g.shard_count, false FROM lease.groups g WHERE g.name = p_group;
            RETURN;
        END IF;
    END IF;
    UPDATE lease.group_changes c SET version = c.version + 1 WHERE c.group_name = p_group;
    PERFORM pg_notify(lease.channel(p_group), 'C' || p_bucket::text);
    RETURN QUERY SELECT v_count, true;
END
$$;

-- The heartbeat and its view of a group return the controls and quarantines (H4) and stamp
-- views until the earliest end of a quarantine they counted (Q3); their result rows change,
-- so they are dropped and created again (the roles that run workers get them back below).
DROP FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[],
                              timestamptz[]);
DROP FUNCTION lease.group_view(text, uuid, uuid, timestamptz);

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
-- view's snapshot, which left it out). Each member comes with its weight and mode (K1: 1 and
-- active without a row in lease.member_controls), the node's own too; the group's quarantines
-- active at p_now (Q1), with how many of them a live member still holds (Q2), and the stamp's
-- `until` is the earliest of the other live members' expiries and of those quarantines' ends
-- (Q3: past either, the view may have changed without the counter moving).
CREATE FUNCTION lease.group_view(
    p_group text, p_node uuid, p_session uuid, p_now timestamptz
) RETURNS TABLE (
    stamp_version bigint, until timestamptz, shard_count integer,
    generation bigint, previous_count integer, draining bigint, workers uuid[],
    loads integer[], buckets integer[], tokens bigint[], old_buckets integer[],
    old_tokens bigint[], weights integer[], modes text[], my_weight integer, my_mode text,
    quarantined integer[], quarantined_held bigint
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
           o.weights AS weights, o.modes AS modes, COALESCE(k.weight, 1) AS my_weight,
           COALESCE(k.mode, 'active') AS my_mode, least(o.until, q.until) AS until,
           o.suspects AS suspects, b.buckets AS buckets, b.tokens AS tokens,
           ob.buckets AS old_buckets, ob.tokens AS old_tokens, od.draining AS draining,
           q.buckets AS quarantined, q.held AS quarantined_held
      INTO v_row
      FROM lease.groups gr
      JOIN lease.group_changes c ON c.group_name = gr.name
      LEFT JOIN lease.member_controls k ON k.group_name = gr.name AND k.node_id = p_node,
           LATERAL (SELECT array_agg(x.node_id) FILTER (WHERE l.live) AS workers,
                           array_agg(x.owned) FILTER (WHERE l.live) AS loads,
                           array_agg(COALESCE(xk.weight, 1)) FILTER (WHERE l.live) AS weights,
                           array_agg(COALESCE(xk.mode, 'active')) FILTER (WHERE l.live)
                             AS modes,
                           min(n.expires_at) FILTER (WHERE l.live) AS until,
                           array_agg(x.node_id) FILTER (WHERE NOT l.live) AS suspects
                      FROM lease.members x
                      LEFT JOIN LATERAL (SELECT y.expires_at FROM lease.nodes y
                                          WHERE y.node_id = x.node_id) AS n ON true
                      LEFT JOIN lease.member_controls xk
                        ON xk.group_name = x.group_name AND xk.node_id = x.node_id,
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
                     WHERE x.group_name = gr.name) AS od,
           -- Q1: the quarantines running at p_now (a handful at most), and how many of those
           -- buckets a live member holds (its owner keeps it until it releases it, Q2), so
           -- that `claimable` counts neither.
           LATERAL (SELECT array_agg(qq.bucket ORDER BY qq.bucket) AS buckets,
                           min(qq.until) AS until, count(h.held) AS held
                      FROM lease.quarantines qq
                      LEFT JOIN LATERAL (
                          SELECT 1 AS held
                            FROM lease.shards s
                            JOIN lease.nodes y
                              ON y.node_id = s.owner_node AND y.session_id = s.owner_session
                            JOIN lease.members x
                              ON x.group_name = s.group_name AND x.node_id = s.owner_node
                           WHERE s.group_name = qq.group_name AND s.bucket = qq.bucket
                             AND y.expires_at > p_now) AS h ON true
                     WHERE qq.group_name = gr.name AND qq.until > p_now) AS q
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
    weights := COALESCE(v_row.weights, '{}');
    modes := COALESCE(v_row.modes, '{}');
    my_weight := v_row.my_weight;
    my_mode := v_row.my_mode;
    quarantined := COALESCE(v_row.quarantined, '{}');
    quarantined_held := v_row.quarantined_held;
    RETURN NEXT;
END
$$;

-- A node's heartbeat (rules H1-H8, V1): extend its live session or start one, and for every
-- group it is a member of, say "unchanged" or give the view. One call, one round trip.
--
-- Its renewal is one plain UPDATE of the node's row (HOT: the only row written) returning
-- its member rows' groups (an index-only scan) and their counters: a group whose counter is
-- the one the node handed in, with the stamp's `until` (the earliest of the other members'
-- expiries and of the ends of the group's quarantines when the view was given) still ahead,
-- is unchanged without reading anything else (H8). The other groups are looked at again or get lease.group_view. `p_seen_groups` must be
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
-- Otherwise (no row, expired, another timeline, another incarnation, a session handed over),
-- the slow path locks the row, reads the clock under the lock, and starts a new session (its
-- member rows go, each group's counter moves and it hears Left; the timeline is recorded if it
-- is new, rule V2), takes over a live session handed over (HO3: whatever the incarnation, the
-- same session, now the caller's, no longer handed over, `started` false) or refuses (another
-- incarnation's live session not handed over, H7: nothing written, `mine` false and that
-- session's expiry). A new session is a member of no group: no group row is returned then.
--
-- The renewal never extends a session handed over (`NOT n.handed_over`, which Postgres
-- checks again on the row's new version when the renewal waited for lease.hand_over's lock):
-- its counters and groups were read before that wait, and the take-over must clear the mark.
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
    buckets integer[], tokens bigint[], old_buckets integer[], old_tokens bigint[],
    weights integer[], modes text[], my_weight integer, my_mode text, quarantined integer[],
    quarantined_held bigint
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
    v_rc_seen  timestamptz[] := '{}';
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
       AND n.expires_at > v_t AND n.timeline = v_timeline AND NOT n.handed_over
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
                IF v_node.incarnation <> p_incarnation AND NOT v_node.handed_over THEN
                    -- H7: another process's live session; nothing written.
                    RETURN QUERY SELECT v_node.session_id, v_node.heartbeat_at,
                                        v_node.expires_at, false, false, v_timeline, false,
                                        NULL::text[], NULL::bigint[], NULL::timestamptz[],
                                        NULL::text, NULL::bigint, NULL::timestamptz,
                                        NULL::integer, NULL::bigint, NULL::integer, NULL::bigint,
                                        NULL::uuid[], NULL::integer[], NULL::integer[],
                                        NULL::bigint[], NULL::integer[], NULL::bigint[],
                                        NULL::integer[], NULL::text[], NULL::integer,
                                        NULL::text, NULL::integer[], NULL::bigint;
                    RETURN;
                END IF;
                -- Live and ours (the renewal above missed it only because the row changed
                -- under it), or handed over (HO3: taken over by this process, whichever it
                -- is; read under the lock, so a hand-over this waited for is seen): extend it.
                UPDATE lease.nodes n
                   SET heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata,
                       incarnation = p_incarnation, handed_over = false
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
                       timeline = v_timeline, prior_expires_at = NULL, handed_over = false
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
                                NULL::bigint[], NULL::integer[], NULL::text[], NULL::integer,
                                NULL::text, NULL::integer[], NULL::bigint;
            RETURN;
        END IF;
    END IF;
    -- Some group changed (or a stamp's until passed, or the node joined or left one): walk the
    -- node's groups beside the stamps handed in. A group unchanged by its stamp is answered so.
    -- A group at the counter the node saw whose stamp's `until` passed is unchanged if no
    -- member died since (the counter says the member rows are the stamp's: a removal moves
    -- it) and no quarantine the view counted ended (Q3), with a new `until`: every such group
    -- is looked at in one statement, since with many groups one call each costs many times the
    -- reads. The others get lease.group_view.
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
            v_rc_seen := v_rc_seen || p_seen_until[v_j];
        END IF;
    END LOOP;
    IF cardinality(v_recheck) > 0 THEN
        SELECT COALESCE(array_agg(r.group_name ORDER BY r.group_name COLLATE "C"), '{}'),
               array_agg(r.version ORDER BY r.group_name COLLATE "C"),
               array_agg(r.dead ORDER BY r.group_name COLLATE "C"),
               array_agg(r.until ORDER BY r.group_name COLLATE "C")
          INTO v_rc_names, v_rc_vers, v_rc_dead, v_rc_until
          FROM (SELECT c.group_name, c.version, o.dead + q.ended AS dead,
                       least(o.until, q.until) AS until
                  -- Group by group, index scans each (a plan over all of them at once, made
                  -- without knowing how many, may read every member row of the schema).
                  FROM unnest(v_recheck, v_rc_seen) AS g (name, seen_until)
                  JOIN lease.group_changes c ON c.group_name = g.name,
                       LATERAL (SELECT count(*) FILTER (WHERE NOT COALESCE(n.expires_at > v_t,
                                                                           false)) AS dead,
                                       min(n.expires_at) AS until
                                  FROM lease.members x
                                  LEFT JOIN LATERAL (SELECT y.expires_at FROM lease.nodes y
                                                      WHERE y.node_id = x.node_id) AS n ON true
                                 WHERE x.group_name = c.group_name
                                   AND x.node_id <> p_node) AS o,
                       -- Q3: the quarantines the stamp's view counted. At the counter it saw,
                       -- the group's quarantine rows are the view's (setting, replacing or
                       -- lifting one moves the counter, and a row is never deleted without
                       -- moving it: lease.quarantine leaves an ended one), and every one active
                       -- then ends at or after the stamp's `until` (the earliest end among
                       -- them, or earlier). One ended since: the view changed. The others run
                       -- on, and the new `until` is at most the earliest of their ends.
                       LATERAL (SELECT count(*) FILTER (WHERE qq.until <= v_t) AS ended,
                                       min(qq.until) FILTER (WHERE qq.until > v_t) AS until
                                  FROM lease.quarantines qq
                                 WHERE qq.group_name = c.group_name
                                   AND qq.until >= g.seen_until) AS q) AS r;
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
        weights := v_view.weights;
        modes := v_view.modes;
        my_weight := v_view.my_weight;
        my_mode := v_view.my_mode;
        quarantined := v_view.quarantined;
        quarantined_held := v_view.quarantined_held;
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
    weights := NULL;
    modes := NULL;
    my_weight := NULL;
    my_mode := NULL;
    quarantined := NULL;
    quarantined_held := NULL;
    RETURN NEXT;
END
$$;

-- HO1, HO2: hand node p_node's live session, started by incarnation p_incarnation, over to the
-- node id's next process: its expiry becomes the store's time (p_at, or the server's clock)
-- plus p_keep and it is marked handed over; the new expiry is returned. NULL (nothing
-- written): no row, no live session on this timeline (V1: one of an earlier timeline is never
-- extended), or another incarnation's.
--
-- Locks: the node row (FOR UPDATE), then the change counters of the node's groups in the
-- order every heartbeat takes them (by bytes), as a new session does. Liveness is judged on a
-- clock read once the row is locked: a claimer that judged the session dead holds the row
-- share-locked until it commits (lease.owner_is_dead), and a hand-over that waited for it
-- past the expiry must not revive a session whose buckets were taken. While this holds the
-- row, claimers skip it (not dead) and the node's joins, claims and leaves wait. The groups
-- are read after the lock, with a fresh snapshot: a join that committed while this waited is
-- counted. Each counter moves because the other members' stamps carry the session's old
-- expiry in their `until` (H8); no NOTIFY (nothing in a view changes but that expiry).
CREATE FUNCTION lease.hand_over(
    p_node uuid, p_incarnation uuid, p_keep interval, p_at timestamptz
) RETURNS timestamptz
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_node  lease.nodes%ROWTYPE;
    v_t     timestamptz;
    v_until timestamptz;
BEGIN
    SELECT * INTO v_node FROM lease.nodes n WHERE n.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    v_t := COALESCE(p_at, clock_timestamp());
    IF v_node.expires_at <= v_t OR v_node.incarnation <> p_incarnation
       OR v_node.timeline <> lease.timeline() THEN
        RETURN NULL;
    END IF;
    v_until := v_t + p_keep;
    UPDATE lease.nodes n SET expires_at = v_until, handed_over = true
     WHERE n.node_id = p_node;
    PERFORM 1 FROM lease.group_changes c
     WHERE c.group_name IN (SELECT m.group_name FROM lease.members m WHERE m.node_id = p_node)
     ORDER BY c.group_name COLLATE "C" FOR UPDATE;
    UPDATE lease.group_changes c SET version = c.version + 1
     WHERE c.group_name IN (SELECT m.group_name FROM lease.members m WHERE m.node_id = p_node);
    RETURN v_until;
END
$$;

-- Roles that ran workers under the previous release (those that could update lease.shards)
-- get what this release's workers use, and roles that could read lease.shards (monitors) may
-- read the controls a snapshot shows: the roles `leasectl grant` set up keep working once the
-- new release runs (lease_diesel::privileges lists the same).
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
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON lease.member_controls TO %s',
                           r.role_name);
            EXECUTE format('GRANT SELECT, INSERT, UPDATE, DELETE ON lease.quarantines TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.may_claim(text, uuid) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.control(text, uuid, integer, text) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.quarantine(text, bigint, interval, timestamptz) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.hand_over(uuid, uuid, interval, timestamptz) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[], timestamptz[]) TO %s',
                           r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.group_view(text, uuid, uuid, timestamptz) TO %s',
                           r.role_name);
        ELSE
            EXECUTE format('GRANT SELECT ON lease.member_controls TO %s', r.role_name);
        END IF;
    END LOOP;
END
$$;
