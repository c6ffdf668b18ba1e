-- compatibility: additive (the same function; every role that could call it still may)
--
-- lease.is_current becomes callable with EXECUTE alone. Its row lock (FOR SHARE) needs UPDATE
-- on lease.shards when the caller takes it; as SECURITY DEFINER it runs with the owner's
-- rights, so an application's role needs USAGE on schema lease and EXECUTE on this function,
-- and no table privilege. The search_path is fixed and every name inside is qualified, so no
-- object of the caller's can stand in for the engine's. CREATE OR REPLACE keeps the grants.
CREATE OR REPLACE FUNCTION lease.is_current(
    p_group text, p_bucket bigint, p_worker uuid, p_token bigint, p_at timestamptz DEFAULT NULL
) RETURNS boolean
    LANGUAGE plpgsql VOLATILE SECURITY DEFINER
    SET search_path = pg_catalog, pg_temp
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
        AND m.expires_at > COALESCE(p_at, pg_catalog.clock_timestamp())
        FOR SHARE OF s;
    RETURN FOUND;
END
$$;

-- A definer's function lends the owner's rights: only roles granted EXECUTE may call it, not
-- PUBLIC (which PostgreSQL grants EXECUTE by default). The roles that could call it usefully
-- before, those with UPDATE on lease.shards (on the table or a column, directly or through
-- PUBLIC), keep EXECUTE, so an upgrade breaks no fencing application.
REVOKE EXECUTE ON FUNCTION lease.is_current(text, bigint, uuid, bigint, timestamptz) FROM PUBLIC;
DO $$
DECLARE
    role_name text;
BEGIN
    FOR role_name IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END
          FROM (SELECT c.relacl AS acl FROM pg_class c WHERE c.oid = 'lease.shards'::regclass
                UNION ALL
                SELECT t.attacl FROM pg_attribute t
                 WHERE t.attrelid = 'lease.shards'::regclass AND t.attacl IS NOT NULL) AS x,
               aclexplode(x.acl) AS a
         WHERE a.privilege_type = 'UPDATE'
    LOOP
        EXECUTE format(
            'GRANT EXECUTE ON FUNCTION lease.is_current(text, bigint, uuid, bigint, timestamptz) TO %s',
            role_name);
    END LOOP;
END
$$;
