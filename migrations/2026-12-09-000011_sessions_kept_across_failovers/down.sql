-- Back to migration 10: the heartbeat that keeps sessions and its helpers go, with the
-- columns they wrote.
DROP FUNCTION lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[],
                              timestamptz[], uuid, bigint, bigint);
DROP FUNCTION lease.record_timeline(bigint, timestamptz);
-- lease.group_view as migration 10 defined it (CREATE OR REPLACE keeps its grants), before
-- lease.revivable goes.
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
DROP FUNCTION lease.revivable(bigint, timestamptz, timestamptz, timestamptz);
DROP FUNCTION lease.wal_offset();
ALTER TABLE lease.nodes DROP COLUMN crossed;
ALTER TABLE lease.server_epochs DROP COLUMN switch_offset;
