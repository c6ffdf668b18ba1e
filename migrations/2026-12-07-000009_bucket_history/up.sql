-- compatibility: additive (a table, a column with a default on lease.shards; binaries of the previous release keep working, but the tenures their claims and releases end are not recorded: see below)
--
-- A bucket's history (rules T1-T5; docs/postgres.md, "A bucket's history on Postgres"):
-- the last 8 tenures of each bucket of a group's current generation, who held it, from when,
-- with which token, and how each holding ended. The open tenure is the bucket row itself
-- (owner_node, token, and updated_at: the time of the claim that took it, which nothing else
-- writes while the bucket is owned); lease.tenures keeps the ended ones, written by the
-- statements that end them (releases, lease.leave, claims of a dead session's buckets) under
-- the bucket row locks they already take. A claim of a free bucket writes no history.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. Until the last binary of the previous release stops, the tenures its workers' claims
-- and releases end are not recorded (their leaves are: lease.leave is replaced below), so a
-- bucket's history may miss those. Open tenures need nothing: every bucket owned at the
-- migration, or claimed by a previous release's worker, shows its owner's tenure from its
-- row, so `leasectl status --why` explains the buckets held from the start.

-- How many tenures of the bucket have ended in this generation: the number (seq) of its last
-- ended one, whose row in lease.tenures is slot seq % 8. The statement that ends a tenure
-- raises it by one in the UPDATE that frees or takes the row; a claim of a free bucket leaves
-- it; a resize opens rows at 0. Not a token: tokens do not rise by exactly one after a
-- failover (claims raise them to the timeline's floor), so token % 8 would not keep exactly
-- the last 8 tenures. A constant default: no table rewrite.
ALTER TABLE lease.shards ADD COLUMN tenures bigint NOT NULL DEFAULT 0 CHECK (tenures >= 0);

-- T1-T3: a bucket's ended tenures as a ring of 8 rows: ended tenure `seq` lives in slot
-- seq % 8, so the statement that ends one writes its slot (an insert for the first 8, then an
-- update of the ended tenure 8 before it, which drops it: T3). With the open tenure on the
-- bucket row, the last 8 tenures are at most 8 ended ones (or 7 and the open one). Only a
-- statement that holds the bucket row's lock writes a bucket's rows (claims taking a dead
-- session's buckets, releases, lease.leave), from the row's values as it locked them, and a
-- resize deletes the group's rows (T4) once it has moved the bucket rows; the updates change
-- no indexed column (HOT).
--
-- No foreign key: one to lease.groups would make a claim's insert share-lock the group's row
-- after it has locked bucket rows, while a resize locks the group's row first and then waits
-- for bucket rows (a deadlock); one to lease.shards would make a resize delete the rows bucket
-- by bucket (a trigger per bucket row it moves) rather than in one statement. The engine
-- deletes no group; whoever deletes one by hand deletes its rows here too.
CREATE TABLE lease.tenures (
    group_name text        NOT NULL,
    bucket     integer     NOT NULL CHECK (bucket >= 0),
    slot       smallint    NOT NULL,
    seq        bigint      NOT NULL CHECK (seq > 0),
    token      bigint      NOT NULL,
    owner_node uuid        NOT NULL,
    began_at   timestamptz NOT NULL,
    ended_at   timestamptz NOT NULL,
    reason     text        NOT NULL CHECK (reason IN ('released', 'drained', 'quarantined',
                                                      'left', 'evicted', 'expired')),
    PRIMARY KEY (group_name, bucket, slot),
    CHECK (slot = seq % 8)
);

-- T2: the mode of node p_node in group p_group (K1: active without a control row), decided on
-- the latest committed state (VOLATILE plpgsql: a fresh snapshot), never on the caller's
-- statement snapshot: a release calls it once it holds its member row, which lease.control
-- share-locks, so a drain committed while the release waited for the row is seen (as
-- lease.may_claim does for claims).
CREATE FUNCTION lease.mode_of(p_group text, p_node uuid) RETURNS text
    LANGUAGE plpgsql VOLATILE
    AS $$
DECLARE
    v_mode text;
BEGIN
    SELECT k.mode INTO v_mode FROM lease.member_controls k
     WHERE k.group_name = p_group AND k.node_id = p_node;
    RETURN COALESCE(v_mode, 'active');
END
$$;

-- As migration 7 made it, and T2: each bucket the leave releases ends its tenure, at the
-- leave's time, as left, or evicted when the leave names no session (an operator's): the
-- ended tenure (the row's owner, token and updated_at as the leave locked it) goes into the
-- ring slot of the row's raised count. The ends ride the bucket rows the leave updates (a row
-- another transaction holds is skipped, its tenure left open: it ends as expired when a claim
-- takes the bucket). CREATE OR REPLACE keeps the grants.
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
               SET owner_node = NULL, owner_session = NULL, updated_at = v_now,
                   tenures = s.tenures + 1
              FROM (SELECT x.bucket, x.owner_node, x.token, x.updated_at FROM lease.shards x
                     WHERE x.group_name = p_group AND x.owner_session = v_session
                       FOR UPDATE OF x SKIP LOCKED) AS h
             WHERE s.group_name = p_group AND s.bucket = h.bucket
            RETURNING s.bucket, s.tenures, h.owner_node AS was_node, h.token AS was_token,
                      h.updated_at AS was_since
        ), ended AS (
            INSERT INTO lease.tenures AS t
                   (group_name, bucket, slot, seq, token, owner_node, began_at, ended_at, reason)
            SELECT p_group, f.bucket, f.tenures % 8, f.tenures, f.was_token, f.was_node,
                   f.was_since, v_now, CASE WHEN p_session IS NULL THEN 'evicted' ELSE 'left' END
              FROM freed f
            ON CONFLICT (group_name, bucket, slot) DO UPDATE
               SET seq = excluded.seq, token = excluded.token, owner_node = excluded.owner_node,
                   began_at = excluded.began_at, ended_at = excluded.ended_at,
                   reason = excluded.reason
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
-- write the tenures their claims, releases and leaves end (lease.leave, which they
-- call, writes them too, and releases judge the mode with lease.mode_of); roles that could read
-- lease.shards (monitors: `leasectl status --why`) read them. The roles `leasectl grant` set
-- up keep working (lease_diesel::privileges lists the same).
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
            EXECUTE format('GRANT SELECT, INSERT, UPDATE ON lease.tenures TO %s', r.role_name);
            EXECUTE format('GRANT EXECUTE ON FUNCTION lease.mode_of(text, uuid) TO %s',
                           r.role_name);
        ELSE
            EXECUTE format('GRANT SELECT ON lease.tenures TO %s', r.role_name);
        END IF;
    END LOOP;
END
$$;
