-- Removes what the engine created, and only that. A `lease` schema that also holds something
-- else (a table or view someone added later) keeps it, and the schema stays. No CASCADE: an
-- object of someone else's that depends on the engine's tables (a view in another schema)
-- makes this fail, rather than disappear with them.
DROP FUNCTION lease.is_current(text, bigint, uuid, bigint, timestamptz);
DROP FUNCTION lease.owner_is_dead(text, uuid, uuid, timestamptz);
DROP FUNCTION lease.channel(text);
DROP TABLE lease.shards;
DROP TABLE lease.members;
DROP TABLE lease.groups;
-- The runner's version table, created with the schema before this migration ran.
DROP TABLE IF EXISTS lease.engine_migrations;
DO $$
BEGIN
    DROP SCHEMA lease; -- RESTRICT: only if nothing is left in it
EXCEPTION WHEN dependent_objects_still_exist THEN
    RAISE NOTICE 'schema lease kept: it holds objects the lease engine did not create';
END
$$;
