-- compatibility: additive (two columns with defaults on lease.members, and lease.group_view replaced with the same signature and result; binaries of the previous release keep working, see below)
--
-- A heartbeat's cost does not grow with the draining generation of a resize. The view of a
-- group (lease.group_view) says how many old buckets live members still hold (`draining`);
-- it counted them, one index entry per old bucket of every live member, on every heartbeat
-- that was given a view: 40-60 ms per heartbeat with 65,536 old buckets held, where a
-- heartbeat costs about a millisecond. Each member row now carries the count of the old
-- buckets its session holds, as it carries `owned` for the current generation, written by
-- the statements that change it: a resize sets it to the member's `owned` (the buckets it
-- moves into the draining generation), a release of old buckets lowers it, a join counts
-- the old buckets its session already holds (those an eviction left behind). A leave and a
-- new session delete the member row. A claim changes no old bucket's owner.
--
-- `old_generation`: the generation whose draining generation `old_owned` counts; the view
-- uses a member's count only when it is the group's generation, and counts the member's old
-- buckets otherwise. So a count nothing set (rows of the previous release, a join by one of
-- its binaries) or one a resize by a binary of the previous release left behind (which does
-- not set it) is never used; and a group with no old row counts nothing.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. Until the last binary of the previous release stops, a view's `draining` may
-- count an old bucket that binary released during a resize begun by this release (it does
-- not lower the count), until the drain ends; nothing a worker decides depends on that count
-- (`leasectl status` counts the old rows themselves).

-- The old buckets held under the member's session (the node's current one), as of
-- `old_generation`. Not indexed: a renewal never writes member rows, and a release writes the
-- row anyway (`owned`). Constant defaults: no table rewrite.
ALTER TABLE lease.members ADD COLUMN old_owned integer NOT NULL DEFAULT 0
    CHECK (old_owned >= 0);
ALTER TABLE lease.members ADD COLUMN old_generation bigint;

-- Every member's count as of now: its session's old buckets (none outside a resize).
UPDATE lease.members m
   SET old_owned = (SELECT count(*)
                      FROM lease.draining_shards d
                      JOIN lease.nodes y
                        ON y.node_id = m.node_id AND y.session_id = d.owner_session
                     WHERE d.group_name = m.group_name AND d.owner_node = m.node_id),
       old_generation = (SELECT g.generation FROM lease.groups g WHERE g.name = m.group_name);

-- The view of group p_group for node p_node's live session p_session at p_now (its renewal),
-- for lease.heartbeat: as migration 8 defined it, but for `draining`, read from the member
-- rows' counts (above). CREATE OR REPLACE keeps the grants.
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

