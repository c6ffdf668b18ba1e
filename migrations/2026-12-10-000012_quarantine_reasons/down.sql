-- Back to migration 11: the four-argument quarantine gets migration 8's body back (CREATE OR
-- REPLACE keeps its grants), then the quarantine with a reason goes, with its column.
CREATE OR REPLACE FUNCTION lease.quarantine(
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

DROP FUNCTION lease.quarantine(text, bigint, interval, timestamptz, text);
ALTER TABLE lease.shards DROP COLUMN quarantine_reason;
