-- compatibility: additive (a table, a function and a nullable column earlier binaries never name)
--
-- Fencing across a failover (docs/postgres.md, "Failover"). A promoted standby runs on a
-- new timeline; with asynchronous replication it may lack claims and session starts the old
-- primary acknowledged. The engine notices the new timeline on the heartbeat's round trip,
-- records when it was first seen, lets no session of an earlier timeline be renewed, claims
-- nothing for one maximum ttl after that (every worker of the old primary has fenced itself
-- by then), and raises every token issued on a later timeline above every token issued on an
-- earlier one.

-- The server's current timeline: the first 8 hex digits of the current WAL file's name, any
-- role may read it. It changes the moment a standby is promoted (pg_control_checkpoint()'s
-- only after the next checkpoint). Fails during recovery (a standby), where nothing of the
-- engine's can write anyway.
CREATE FUNCTION lease.timeline() RETURNS bigint
    LANGUAGE sql STABLE
    AS $$
        SELECT ('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))
               ::bit(32)::bigint
    $$;

-- Each timeline the engine has run on, with when a heartbeat first saw it. The row of the
-- timeline the schema was installed (or upgraded) on is the base: first seen at -infinity, so
-- it starts no quiet period, and tokens on timeline T are at least ((T - base) << 32) + 1.
CREATE TABLE lease.server_epochs (
    timeline   bigint      PRIMARY KEY,
    first_seen timestamptz NOT NULL
);
INSERT INTO lease.server_epochs (timeline, first_seen) VALUES (lease.timeline(), '-infinity');


-- The timeline a member row's session was started or last renewed on: a session does not
-- survive a change of timeline (its next heartbeat starts a new one), since the new server
-- may lack what the worker released or claimed under it. NULL: written by a binary that
-- predates this migration, taken as the current timeline.
ALTER TABLE lease.members ADD COLUMN timeline bigint;

-- Roles that run workers under the previous release (those that may UPDATE lease.members, on
-- the table or a column, directly or through PUBLIC) get what the heartbeat and claims now use,
-- so the documented rollout (migrate first, while old workers run, then deploy) breaks no
-- worker role that `leasectl grant` set up before.
DO $$
DECLARE
    role_name text;
BEGIN
    FOR role_name IN
        SELECT DISTINCT CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                             ELSE quote_ident(pg_get_userbyid(a.grantee)) END
          FROM (SELECT c.relacl AS acl FROM pg_class c WHERE c.oid = 'lease.members'::regclass
                UNION ALL
                SELECT t.attacl FROM pg_attribute t
                 WHERE t.attrelid = 'lease.members'::regclass AND t.attacl IS NOT NULL) AS x,
               aclexplode(x.acl) AS a
         WHERE a.privilege_type = 'UPDATE'
    LOOP
        EXECUTE format('GRANT SELECT, INSERT ON TABLE lease.server_epochs TO %s', role_name);
        EXECUTE format('GRANT EXECUTE ON FUNCTION lease.timeline() TO %s', role_name);
    END LOOP;
END
$$;
