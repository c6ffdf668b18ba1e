-- compatibility: additive (two nullable columns, three functions, lease.group_view replaced with the same signature and result, and a second lease.heartbeat with more arguments; binaries of the previous release call the one they know, which keeps no session across a failover)
--
-- Sessions kept across a failover that lost nothing (rule V4; docs/postgres.md, "Failover").
-- Until now every change of timeline ended every session (V1): after a switchover or a
-- synchronous failover, where nothing was lost, every bucket stood unowned for about a ttl.
-- Now the first heartbeat on a new timeline records where the new server's history leaves
-- the old one's (its switch point), and a session whose worker hands in a bound of its
-- writes' commit positions at or before that point is kept: every write it made is on the
-- new server, so what it holds there is what it believes it holds.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. A binary of the previous release starts a new session on a new timeline as
-- before; if its heartbeat is the first there it records the timeline without a switch
-- point, and no session is kept across that failover (safe: as before).

-- Where the history of a timeline leaves its parent's: the end of the WAL the promoted server
-- replayed (pg_last_wal_replay_lsn() right after promotion, any role may read it), as a byte
-- offset. NULL: unknown (the base timeline, a timeline recorded by a binary of the previous
-- release, or a server that may have restarted since its promotion, after which the function
-- answers something else).
ALTER TABLE lease.server_epochs ADD COLUMN switch_offset bigint;

-- How the node's session fared on its first heartbeat after the last failover: 'kept', or
-- 'ended: ' and why (for `leasectl status` and `doctor`). NULL: no failover since it started.
ALTER TABLE lease.nodes ADD COLUMN crossed text;

-- Where the server's WAL stands now, as a byte offset: at or after the end of the commit of
-- every transaction that committed before this was called (its commit record was inserted
-- before the commit returned).
CREATE FUNCTION lease.wal_offset() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$
        SELECT (pg_catalog.pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint
    $$;

-- Record timeline p_timeline as first seen at p_at, with its switch point, unless it is
-- recorded already; true when this call recorded it. The switch point is trusted only if the
-- server has run since before the old primary's last heartbeat it replayed (one second's
-- margin for the two servers' clocks): a server restarted after its promotion answers
-- pg_last_wal_replay_lsn() with the end of its crash recovery (or NULL), not the switch point.
CREATE FUNCTION lease.record_timeline(p_timeline bigint, p_at timestamptz) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lease.server_epochs e WHERE e.timeline = p_timeline) THEN
        RETURN false;
    END IF;
    INSERT INTO lease.server_epochs AS e (timeline, first_seen, switch_offset)
    SELECT p_timeline, p_at,
           CASE WHEN pg_catalog.pg_postmaster_start_time()
                     < (SELECT max(y.heartbeat_at) FROM lease.nodes y
                         WHERE y.timeline < p_timeline) - interval '1 second'
                THEN (pg_catalog.pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::bigint END
    ON CONFLICT (timeline) DO NOTHING;
    RETURN FOUND;
END
$$;

-- Whether a node row of timeline p_timeline, renewed at p_heartbeat until p_expires, may still
-- be kept at p_now though expired (V4): a session of an earlier timeline, within its ttl of
-- the current timeline's first heartbeat (before which no claim takes anything, V2; before
-- the first heartbeat, always). Its holder, if it hands in its bound while it trusts its
-- session, outlived the old primary, so nobody took its buckets there.
CREATE FUNCTION lease.revivable(
    p_timeline bigint, p_heartbeat timestamptz, p_expires timestamptz, p_now timestamptz
) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
        SELECT p_timeline < lease.timeline()
               AND p_now < COALESCE((SELECT e.first_seen FROM lease.server_epochs e
                                      WHERE e.timeline = lease.timeline()), p_now)
                           + (p_expires - p_heartbeat)
    $$;

-- The view of group p_group for node p_node's live session p_session at p_now (its renewal),
-- for lease.heartbeat: as migration 10 defined it, but a member whose session may still be
-- kept (lease.revivable) is not removed as dead (H3): its node's first heartbeat after the
-- failover may keep it, memberships included. Left, it makes the stamp match no counter, as
-- a member whose row another transaction holds does. CREATE OR REPLACE keeps the grants.
CREATE OR REPLACE FUNCTION lease.group_view(
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
           -- The old buckets live members hold: each member's count where it is of this
           -- generation (old_generation), its rows counted otherwise. None when the group has
           -- no old row: a count left behind is never read.
           LATERAL (SELECT COALESCE(sum(CASE WHEN x.old_generation = gr.generation
                                             THEN x.old_owned
                                             ELSE (SELECT count(*)
                                                     FROM lease.draining_shards d
                                                    WHERE d.group_name = x.group_name
                                                      AND d.owner_session = n.session_id
                                                      AND d.owner_node = x.node_id) END),
                                    0)::bigint AS draining
                      FROM lease.members x
                      JOIN LATERAL (SELECT y.session_id FROM lease.nodes y
                                     WHERE y.node_id = x.node_id
                                       AND y.expires_at > p_now) AS n ON true
                     WHERE x.group_name = gr.name
                       AND EXISTS (SELECT 1 FROM lease.draining_shards d
                                    WHERE d.group_name = gr.name)) AS od,
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
           AND NOT lease.revivable(y.timeline, y.heartbeat_at, y.expires_at, p_now)
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

-- A node's heartbeat (rules H1-H10, V1, V4): as the heartbeat of migration 8, handing in the
-- bound of the session's writes (`p_bound_session`, and a position: `p_bound_timeline`,
-- `p_bound_offset`; NULLs for none) and answering where the WAL stands (`position_offset`)
-- and, on the session's first heartbeat on a new timeline, how it fared (`crossed`).
--
-- On a new timeline (the node row's is older) the slow path records the timeline and its
-- switch point, and keeps the session (V4) when the bound names it, it is live, the caller's
-- incarnation's and not handed over, and the bound is on the parent timeline (the one
-- before: a promotion takes the next number) at or before the switch point. Otherwise a new
-- session starts, as before (V1).
CREATE FUNCTION lease.heartbeat(
    p_node uuid, p_session uuid, p_ttl interval, p_metadata text, p_at timestamptz,
    p_incarnation uuid, p_seen_groups text[], p_seen_versions bigint[],
    p_seen_until timestamptz[], p_bound_session uuid, p_bound_timeline bigint,
    p_bound_offset bigint
) RETURNS TABLE (
    session_id uuid, heartbeat_at timestamptz, expires_at timestamptz, started boolean,
    mine boolean, timeline bigint, recorded boolean, unchanged_groups text[],
    unchanged_versions bigint[], unchanged_until timestamptz[], group_name text,
    stamp_version bigint, until timestamptz, shard_count integer, generation bigint,
    previous_count integer, draining bigint, workers uuid[], loads integer[],
    buckets integer[], tokens bigint[], old_buckets integer[], old_tokens bigint[],
    weights integer[], modes text[], my_weight integer, my_mode text, quarantined integer[],
    quarantined_held bigint, position_offset bigint, crossed text
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
    v_crossed  text;
    v_recorded boolean := false;
    v_switch   bigint;
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
            position_offset := lease.wal_offset();
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
                                        NULL::text, NULL::integer[], NULL::bigint,
                                        NULL::bigint, NULL::text;
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
                IF v_node.timeline <> v_timeline THEN
                    -- The session's first heartbeat on a new timeline (a failover): the
                    -- timeline is recorded if it is new, with its switch point (V2, V4), and
                    -- the session is kept if everything it wrote is on this server (V4).
                    v_recorded := lease.record_timeline(v_timeline, v_t);
                    SELECT e.switch_offset INTO v_switch
                      FROM lease.server_epochs e WHERE e.timeline = v_timeline;
                    v_crossed := CASE
                        WHEN p_bound_session IS NULL
                            THEN 'ended: its writes had no bound'
                        WHEN p_bound_session <> v_node.session_id
                            THEN 'ended: the bound was of another session'
                        WHEN v_node.incarnation <> p_incarnation OR v_node.handed_over
                            THEN 'ended: another process'
                        WHEN v_node.expires_at <= v_t
                             AND NOT lease.revivable(v_node.timeline, v_node.heartbeat_at,
                                                     v_node.expires_at, v_t)
                            THEN 'ended: expired'
                        WHEN v_switch IS NULL THEN 'ended: switch point unknown'
                        WHEN p_bound_timeline + 1 <> v_timeline
                            THEN 'ended: its writes were on timeline ' || p_bound_timeline
                        WHEN p_bound_offset > v_switch
                            THEN 'ended: writes after the switch point'
                        ELSE 'kept' END;
                END IF;
                IF v_crossed = 'kept' THEN
                    -- V4: every write of the session is at or before the switch point, so on
                    -- this server; extended as H1, its memberships and buckets unchanged.
                    UPDATE lease.nodes n
                       SET heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata,
                           timeline = v_timeline, prior_expires_at = NULL, crossed = v_crossed
                     WHERE n.node_id = p_node;
                    v_session := v_node.session_id;
                    SELECT ARRAY(SELECT m.group_name FROM lease.members m
                                  WHERE m.node_id = p_node ORDER BY m.group_name COLLATE "C"),
                           ARRAY(SELECT c.version
                                   FROM lease.members m JOIN lease.group_changes c
                                     ON c.group_name = m.group_name
                                  WHERE m.node_id = p_node
                                  ORDER BY m.group_name COLLATE "C")
                      INTO v_names, v_versions;
                    EXIT;
                END IF;
                -- H2, V1: a new session. (Its clock read under the lock.)
                UPDATE lease.nodes n
                   SET session_id = p_session, incarnation = p_incarnation, started_at = v_t,
                       heartbeat_at = v_t, expires_at = v_t + p_ttl, metadata = p_metadata,
                       timeline = v_timeline, prior_expires_at = NULL, handed_over = false,
                       crossed = v_crossed
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
                                    AND NOT lease.revivable(z.timeline, z.heartbeat_at,
                                                            z.expires_at, v_t)
                                    AND NOT EXISTS (SELECT 1 FROM lease.members x
                                                     WHERE x.node_id = z.node_id)
                                    FOR UPDATE SKIP LOCKED);
            -- The first heartbeat on a timeline records when it was first seen (V2) and its
            -- switch point (V4). A session of an earlier timeline is extended only if kept
            -- (above, where the timeline was recorded), so every other first heartbeat on a
            -- new one starts a session and comes here.
            v_recorded := lease.record_timeline(v_timeline, v_t) OR v_recorded;
            RETURN QUERY SELECT p_session, v_t, v_t + p_ttl, true, true, v_timeline, v_recorded,
                                '{}'::text[], '{}'::bigint[], '{}'::timestamptz[], NULL::text,
                                NULL::bigint, NULL::timestamptz, NULL::integer, NULL::bigint,
                                NULL::integer, NULL::bigint, NULL::uuid[], NULL::integer[],
                                NULL::integer[], NULL::bigint[], NULL::integer[],
                                NULL::bigint[], NULL::integer[], NULL::text[], NULL::integer,
                                NULL::text, NULL::integer[], NULL::bigint,
                                lease.wal_offset(), v_crossed;
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
    recorded := v_recorded;
    crossed := v_crossed;
    -- At or after the commit of every write answered before the heartbeat was sent (H10).
    position_offset := lease.wal_offset();
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


-- Roles that run workers (those that may UPDATE lease.shards) get the new heartbeat and what
-- it calls, so the documented rollout (migrate first, while old workers run) breaks no worker
-- role that `leasectl grant` set up before.
DO $$
DECLARE
    r record;
BEGIN
    FOR r IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END AS role_name
          FROM (SELECT c.relacl AS acl FROM pg_class c WHERE c.oid = 'lease.shards'::regclass) AS x,
               aclexplode(x.acl) AS a
         WHERE a.privilege_type = 'UPDATE'
           AND a.grantee <> (SELECT c.relowner FROM pg_class c
                              WHERE c.oid = 'lease.shards'::regclass)
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.wal_offset() TO %s', r.role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.revivable(bigint, timestamptz, timestamptz, timestamptz) TO %s',
                       r.role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.record_timeline(bigint, timestamptz) TO %s',
                       r.role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[], timestamptz[], uuid, bigint, bigint) TO %s',
                       r.role_name);
    END LOOP;
END
$$;
