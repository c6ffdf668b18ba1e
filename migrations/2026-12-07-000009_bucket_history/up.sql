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

-- Roles that ran workers under the previous release (those that could update lease.shards)
-- write the tenures their claims, releases and leaves end and begin; roles that could read
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
        ELSE
            EXECUTE format('GRANT SELECT ON lease.tenures TO %s', r.role_name);
        END IF;
    END LOOP;
END
$$;
