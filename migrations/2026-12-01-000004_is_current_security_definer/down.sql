-- Back to the function of the first migration: the caller's rights, EXECUTE for everyone.
CREATE OR REPLACE FUNCTION lease.is_current(
    p_group text, p_bucket bigint, p_worker uuid, p_token bigint, p_at timestamptz DEFAULT NULL
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE
    AS $$
BEGIN
    PERFORM 1
       FROM lease.shards s
       JOIN lease.members m
         ON m.group_name = s.group_name
        AND m.worker_id = s.owner_worker
        AND m.session_id = s.owner_session
      WHERE s.group_name = p_group AND s.bucket = p_bucket
        AND s.owner_worker = p_worker AND s.token = p_token
        AND m.expires_at > COALESCE(p_at, clock_timestamp())
        FOR SHARE OF s;
    RETURN FOUND;
END
$$;
GRANT EXECUTE ON FUNCTION lease.is_current(text, bigint, uuid, bigint, timestamptz) TO PUBLIC;
