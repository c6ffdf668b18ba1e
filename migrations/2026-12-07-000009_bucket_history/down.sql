-- Back to migration 8: the history goes (every bucket keeps its owner, session and token),
-- and lease.leave is migration 7's again (CREATE OR REPLACE keeps its grants).
CREATE OR REPLACE FUNCTION lease.leave(p_group text, p_node uuid, p_session uuid, p_at timestamptz)
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

DROP FUNCTION lease.mode_of(text, uuid);
DROP TABLE lease.tenures;
ALTER TABLE lease.shards DROP COLUMN tenures;
