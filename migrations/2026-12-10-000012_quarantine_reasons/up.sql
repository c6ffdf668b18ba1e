-- compatibility: additive (a nullable column, and a second lease.quarantine with a reason; the previous release's lease.quarantine keeps its signature and now clears a reason it replaces)
--
-- Quarantines keep their reason (rule Q5): who set one says why (`leasectl quarantine
-- --reason`, or `leasectl run` after a child's crash loop: the exit and its last stderr
-- line), and a snapshot (`leasectl status`, `status --why`) shows it while the quarantine
-- runs.
--
-- The reason lives on the bucket row, beside `quarantined_until`, written with it in the same
-- statement: a snapshot reads both in one row (the monitoring role reads lease.shards, not
-- lease.quarantines), a lift or a replacement changes both at once, and a resize's new rows
-- start with neither.
--
-- Upgrade: additive. `leasectl migrate` while the previous release runs, then roll the
-- binaries. A binary of the previous release calls the four-argument lease.quarantine, which
-- sets or lifts a quarantine with no reason.

ALTER TABLE lease.shards ADD COLUMN quarantine_reason text;

-- Q1-Q5: lease.quarantine of migration 8 with the quarantine's reason (p_reason, NULL for
-- none), written on the bucket row with its end; a lift clears both. Locks and results as
-- there.
CREATE FUNCTION lease.quarantine(
    p_group text, p_bucket bigint, p_for interval, p_at timestamptz, p_reason text
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
        UPDATE lease.shards s SET quarantined_until = NULL, quarantine_reason = NULL
         WHERE s.group_name = p_group AND s.bucket = p_bucket;
    ELSE
        v_until := v_t + p_for;
        INSERT INTO lease.quarantines AS q (group_name, bucket, until)
        VALUES (p_group, p_bucket, v_until)
        ON CONFLICT (group_name, bucket) DO UPDATE SET until = EXCLUDED.until;
        UPDATE lease.shards s SET quarantined_until = v_until, quarantine_reason = p_reason
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

-- The previous release's quarantine: the same, with no reason (CREATE OR REPLACE keeps its
-- grants), so a quarantine it sets over one with a reason does not keep the old reason.
CREATE OR REPLACE FUNCTION lease.quarantine(
    p_group text, p_bucket bigint, p_for interval, p_at timestamptz
) RETURNS TABLE (shard_count integer, changed boolean)
    LANGUAGE sql VOLATILE
    AS $$
    SELECT q.shard_count, q.changed FROM lease.quarantine(p_group, p_bucket, p_for, p_at, NULL) AS q
$$;

-- Roles that run workers (those that may UPDATE lease.shards) get the new function, so the
-- documented rollout (migrate first, while old workers run) breaks no worker role that
-- `leasectl grant` set up before.
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
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.quarantine(text, bigint, interval, timestamptz, text) TO %s',
                       r.role_name);
    END LOOP;
END
$$;
