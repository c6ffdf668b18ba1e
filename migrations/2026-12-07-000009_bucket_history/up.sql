-- compatibility: additive (a table, a column with a default on lease.shards; binaries of the previous release keep working, but their claims and releases record no tenures: see below)
--
-- A bucket's history (rules T1-T5; docs/ARCHITECTURE.md, "A bucket's history on Postgres"):
-- the last 8 tenures of each bucket of a group's current generation, who held it, from when,
-- with which token, and how each holding ended. Written by the statements that change
-- ownership, under the bucket row locks they already take; read by lease_diesel's history.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. Until the last binary of the previous release stops, the buckets its workers claim
-- and release get no tenure (their claims do not count one), so a bucket's history may miss
-- those and leave the tenure before them open. Every bucket owned at the migration gets its
-- current tenure (below), so `leasectl status --why` explains the buckets held from the start.

-- How many tenures the bucket has begun in this generation: the number (seq) of its last
-- one, whose row in lease.tenures is slot seq % 8. A claim that wins the bucket raises it by
-- one in the UPDATE that takes the row; a resize opens rows at 0. Not a token: tokens do not
-- rise by exactly one after a failover (claims raise them to the timeline's floor), so
-- token % 8 would not keep exactly the last 8 tenures. A constant default: no table rewrite.
ALTER TABLE lease.shards ADD COLUMN tenures bigint NOT NULL DEFAULT 0 CHECK (tenures >= 0);

-- T1-T3: a bucket's tenures as a ring of 8 rows: tenure `seq` lives in slot seq % 8, so a
-- claim begins one by writing its slot (an insert for the first 8, then an update of the
-- tenure 8 before it, which drops it: T3) and the history is at most 8 rows whatever the
-- bucket's past. `ended_at`/`reason` NULL: not ended (the owner holds it, or its session ended
-- and no claim has taken the bucket since). Only a statement that holds the bucket row's lock
-- writes a bucket's rows (claims, releases, lease.leave), and a resize deletes the group's
-- rows (T4) once it has moved the bucket rows; updates change no indexed column (HOT).
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
    ended_at   timestamptz,
    reason     text        CHECK (reason IN ('released', 'drained', 'quarantined', 'left',
                                             'evicted', 'expired')),
    PRIMARY KEY (group_name, bucket, slot),
    CHECK (slot = seq % 8),
    CHECK ((ended_at IS NULL) = (reason IS NULL))
);

-- The tenure each owned bucket is in: its owner's, with its token, from the claim that took
-- it (the bucket row's updated_at, which that claim wrote: a row keeps it while owned).
INSERT INTO lease.tenures (group_name, bucket, slot, seq, token, owner_node, began_at)
SELECT s.group_name, s.bucket, 1, 1, s.token, s.owner_node, s.updated_at
  FROM lease.shards s
 WHERE s.owner_node IS NOT NULL;
UPDATE lease.shards s SET tenures = 1 WHERE s.owner_node IS NOT NULL;

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
-- leave's time, as left, or evicted when the leave names no session (an operator's). The
-- tenures ride the bucket rows the leave updates (a row another transaction holds is skipped,
-- its tenure left open: it ends as expired when a claim takes the bucket). CREATE OR REPLACE
-- keeps the grants.
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
            RETURNING s.bucket, s.tenures
        ), ended AS (
            UPDATE lease.tenures t
               SET ended_at = v_now,
                   reason = CASE WHEN p_session IS NULL THEN 'evicted' ELSE 'left' END
              FROM freed f
             WHERE t.group_name = p_group AND t.bucket = f.bucket AND t.slot = f.tenures % 8
               AND t.seq = f.tenures AND t.ended_at IS NULL
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
-- write the tenures their claims, releases and leaves begin and end (lease.leave, which they
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
