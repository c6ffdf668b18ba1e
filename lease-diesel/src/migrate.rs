//! The migration runner and the start-up check of the `lease` schema.
//!
//! The engine owns one schema, always named `lease` (the name is fixed: the SQL of every
//! migration and statement names it). The runner creates it, and refuses a `lease` schema it
//! did not create. It records the versions it applied in that schema's own table,
//! `lease.engine_migrations`, never in the application's `__diesel_schema_migrations`: the
//! engine's versions there would be dated in the future of the application's own and block
//! its `revert_last_migration`. A deployment made by an earlier release (which did record them
//! there) is recognised and adopted: its rows move into `lease.engine_migrations`.
//!
//! Both entry points are synchronous (diesel's `Migration::run` is) and run on a blocking
//! thread over diesel-async's connection wrapper; see `PgLeaseStore::{migrate, check_schema}`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel::sql_types::{Array, BigInt, Bool, Nullable, Text};
use diesel::{Connection, QueryableByName, RunQueryDsl};
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, embed_migrations};

use crate::error::PgSetupError;

/// The engine's migrations, embedded at build time from the workspace's `migrations/`.
///
/// Embedded with `embed_migrations!` rather than one `include_str!` per file: it takes every
/// directory under `migrations/` in name order, so a migration added there needs no code here
/// (the crate's build script rebuilds it when the directory changes); it checks the names at
/// compile time, and it honours a migration's `metadata.toml` (`run_in_transaction = false`).
/// Apply them with [`PgLeaseStore::migrate`](crate::PgLeaseStore::migrate), not with diesel's
/// own harness, which would record them in the application's `__diesel_schema_migrations`
/// and expect the `lease` schema to exist already.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations");

/// Serializes concurrent `migrate` calls from many processes (an arbitrary, fixed key).
const LOCK_KEY: i64 = 0x6c65_6173_655f_6d69; // "lease_mi"

/// How long a runner waits for another one's migration before giving up (transient).
const LOCK_WAIT: Duration = Duration::from_secs(60);

/// The longest pause between two attempts at the lock.
const LOCK_POLL_MAX: Duration = Duration::from_millis(250);

/// The first version of the earlier releases, which recorded it in the application's
/// `__diesel_schema_migrations`; a `lease` schema without a version table is adopted only if
/// that record is there.
const LEGACY_FIRST_VERSION: &str = "20261130000001";

/// The tables of the first migration, by which a deployment of an earlier release is known.
const LEGACY_TABLES: [&str; 3] = ["groups", "members", "shards"];

/// The connection the runner drives synchronously.
pub(crate) type SyncConn = AsyncConnectionWrapper<AsyncPgConnection>;

/// The runner's version table. `SELECT` for everyone (the versions are no secret): the
/// start-up check of any role with `USAGE` on the schema reads it.
const CREATE_VERSION_TABLE: &str = r#"
CREATE TABLE lease.engine_migrations (
    version    text        PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
COMMENT ON TABLE lease.engine_migrations IS
    'Migrations of the lease engine applied here, written by its migrate (leasectl migrate)';
GRANT SELECT ON lease.engine_migrations TO PUBLIC;
"#;

const CREATE_SCHEMA: &str = r#"
CREATE SCHEMA lease;
COMMENT ON SCHEMA lease IS 'The lease engine''s schema, created by its migrate (leasectl migrate)';
"#;

/// What the catalogs say about schema `lease` and the current role; readable by any role, on
/// a standby too.
const INSPECT: &str = r#"
SELECT pg_get_userbyid(n.nspowner)::text AS owner,
       COALESCE(has_schema_privilege(n.oid, 'USAGE'), false) AS usage,
       COALESCE(pg_has_role(n.nspowner, 'MEMBER'), false) AS owned,
       v.oid IS NOT NULL AS has_versions,
       COALESCE(has_table_privilege(v.oid, 'SELECT'), false) AS versions_readable,
       ARRAY(SELECT o.name FROM (
                 SELECT c.relname::text AS name FROM pg_class c
                  WHERE c.relnamespace = n.oid AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S', 'c')
                 UNION ALL
                 SELECT p.proname::text || '()' FROM pg_proc p WHERE p.pronamespace = n.oid
                 UNION ALL
                 SELECT t.typname::text FROM pg_type t
                  WHERE t.typnamespace = n.oid AND t.typtype IN ('d', 'e', 'r')
             ) AS o ORDER BY o.name) AS objects,
       current_setting('transaction_read_only') = 'on' AS read_only,
       has_database_privilege(current_database(), 'CREATE') AS may_create,
       current_user::text AS role,
       current_database()::text AS database
  FROM (SELECT 1) AS one
  LEFT JOIN pg_namespace n ON n.nspname = 'lease'
  LEFT JOIN pg_class v ON v.relnamespace = n.oid AND v.relname = 'engine_migrations'
                      AND v.relkind = 'r'
"#;

#[derive(QueryableByName, Debug)]
struct State {
    /// The schema's owner; `None`: there is no schema `lease`.
    #[diesel(sql_type = Nullable<Text>)]
    owner: Option<String>,
    #[diesel(sql_type = Bool)]
    usage: bool,
    /// The current role is the owner or a member of it (may alter the engine's objects).
    #[diesel(sql_type = Bool)]
    owned: bool,
    #[diesel(sql_type = Bool)]
    has_versions: bool,
    #[diesel(sql_type = Bool)]
    versions_readable: bool,
    /// Relations, functions and types in the schema, by name (functions end in `()`).
    #[diesel(sql_type = Array<Text>)]
    objects: Vec<String>,
    #[diesel(sql_type = Bool)]
    read_only: bool,
    #[diesel(sql_type = Bool)]
    may_create: bool,
    #[diesel(sql_type = Text)]
    role: String,
    #[diesel(sql_type = Text)]
    database: String,
}

impl State {
    /// Tables named as the first migration names them, and no version table.
    fn looks_legacy(&self) -> bool {
        !self.has_versions
            && LEGACY_TABLES
                .iter()
                .all(|t| self.objects.iter().any(|o| o == t))
    }

    /// A [`PgSetupError::ForeignSchema`] describing what the schema holds.
    fn foreign(&self) -> PgSetupError {
        const SHOWN: usize = 8;
        let found = if self.objects.is_empty() {
            "it is empty".to_owned()
        } else if self.looks_legacy() {
            format!(
                "it holds tables named like the engine's ({}) but no record of the engine's \
                 migrations: neither lease.engine_migrations nor version {LEGACY_FIRST_VERSION} \
                 in a __diesel_schema_migrations table on the search path",
                LEGACY_TABLES.join(", ")
            )
        } else {
            let mut names: Vec<String> = self
                .objects
                .iter()
                .take(SHOWN)
                .map(|o| format!("lease.{o}"))
                .collect();
            if self.objects.len() > SHOWN {
                names.push(format!("and {} more", self.objects.len() - SHOWN));
            }
            format!("it holds {}", names.join(", "))
        };
        PgSetupError::ForeignSchema { found }
    }

    /// Whether this connection may write what a migration writes: create the schema
    /// (`creating`) or alter the engine's objects in it.
    fn may_write(&self, creating: bool) -> Result<(), PgSetupError> {
        if self.read_only {
            return Err(PgSetupError::ReadOnly);
        }
        if creating && !self.may_create {
            return Err(PgSetupError::PermissionDenied {
                message: format!(
                    "role {:?} may not create schemas in database {:?}; run migrate as a role \
                     that may, or grant it: GRANT CREATE ON DATABASE {:?} TO {:?}",
                    self.role, self.database, self.database, self.role
                ),
            });
        }
        if !creating && !self.owned {
            return Err(PgSetupError::PermissionDenied {
                message: format!(
                    "schema lease belongs to role {:?}, and migrating alters its objects; run \
                     migrate as that role (or a member of it), not as {:?}",
                    self.owner.as_deref().unwrap_or("?"),
                    self.role
                ),
            });
        }
        Ok(())
    }
}

#[derive(QueryableByName)]
struct VersionRow {
    #[diesel(sql_type = Text)]
    version: String,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

/// One embedded migration, with its version.
struct Embedded {
    version: String,
    name: String,
    migration: Box<dyn Migration<Pg>>,
}

/// The embedded migrations in version order.
fn embedded() -> Result<Vec<Embedded>, PgSetupError> {
    let migrations =
        MigrationSource::<Pg>::migrations(&MIGRATIONS).map_err(|e| PgSetupError::Migration {
            message: format!("reading the embedded migrations: {e}"),
        })?;
    let mut list: Vec<Embedded> = migrations
        .into_iter()
        .map(|m| Embedded {
            version: m.name().version().to_string(),
            name: m.name().to_string(),
            migration: m,
        })
        .collect();
    list.sort_by(|a, b| a.version.cmp(&b.version));
    Ok(list)
}

/// The connection broke: the server is gone or the network failed.
fn lost(e: &DieselError) -> bool {
    matches!(
        e,
        DieselError::DatabaseError(
            DatabaseErrorKind::UnableToSendCommand | DatabaseErrorKind::ClosedConnection,
            _
        ) | DieselError::BrokenTransactionManager
    )
}

/// A failure inside the runner, classified once the runner is done.
enum Fail {
    /// A query of the runner's own failed; doing what.
    Db(&'static str, DieselError),
    /// A migration's SQL failed.
    Sql(String),
    /// A decision: refuse, or report.
    Setup(PgSetupError),
}

impl From<DieselError> for Fail {
    /// Only diesel's own transaction handling (BEGIN, COMMIT, ROLLBACK) lands here.
    fn from(e: DieselError) -> Self {
        Fail::Db("committing", e)
    }
}

impl From<PgSetupError> for Fail {
    fn from(e: PgSetupError) -> Self {
        Fail::Setup(e)
    }
}

impl Fail {
    fn into_setup(self, conn: &mut SyncConn) -> PgSetupError {
        match self {
            Fail::Setup(e) => e,
            Fail::Db(what, e) if lost(&e) => PgSetupError::Unreachable {
                message: format!("the connection was lost {what}: {e}"),
            },
            Fail::Db(_, DieselError::DatabaseError(DatabaseErrorKind::ReadOnlyTransaction, _)) => {
                PgSetupError::ReadOnly
            }
            Fail::Db(what, e) => PgSetupError::Migration {
                message: format!("{what}: {e}"),
            },
            // diesel's migration error keeps the query error to itself: whether the
            // connection broke is asked of the connection.
            Fail::Sql(message) if conn.batch_execute("SELECT 1").is_err() => {
                PgSetupError::Unreachable {
                    message: format!("the connection was lost: {message}"),
                }
            }
            Fail::Sql(message) => PgSetupError::Migration { message },
        }
    }
}

fn inspect(conn: &mut SyncConn) -> Result<State, DieselError> {
    diesel::sql_query(INSPECT).get_result(conn)
}

fn read_versions(conn: &mut SyncConn) -> Result<BTreeSet<String>, DieselError> {
    let rows: Vec<VersionRow> =
        diesel::sql_query("SELECT version FROM lease.engine_migrations").load(conn)?;
    Ok(rows.into_iter().map(|r| r.version).collect())
}

/// Apply every embedded migration not applied yet, in version order; returns the versions
/// applied. Takes the advisory lock before it reads anything, so that concurrent runners see
/// each other's work, never a half-made schema.
pub(crate) fn migrate(conn: &mut SyncConn) -> Result<Vec<String>, PgSetupError> {
    let embedded = embedded()?;
    lock(conn)?;
    let result = migrate_locked(conn, &embedded);
    // The lock also ends with the session; the connection is dropped right after.
    conn.batch_execute(&format!("SELECT pg_advisory_unlock({LOCK_KEY})"))
        .ok();
    result.map_err(|f| f.into_setup(conn))
}

/// Take the migration lock, polling with `pg_try_advisory_lock` rather than waiting in
/// `pg_advisory_lock`: a session blocked in a statement holds a snapshot, and a migration
/// that runs outside a transaction to `CREATE INDEX CONCURRENTLY` waits for every older
/// snapshot to go, while the blocked runner waits for the lock its session holds: a deadlock
/// Postgres breaks by failing one of them. Between two attempts a runner holds nothing.
fn lock(conn: &mut SyncConn) -> Result<(), PgSetupError> {
    let started = Instant::now();
    let mut pause = Duration::from_millis(10);
    loop {
        let got: Flag = diesel::sql_query("SELECT pg_try_advisory_lock($1) AS yes")
            .bind::<BigInt, _>(LOCK_KEY)
            .get_result(conn)
            .map_err(|e| {
                if lost(&e) {
                    PgSetupError::Unreachable {
                        message: format!("the connection was lost taking the migration lock: {e}"),
                    }
                } else {
                    PgSetupError::Migration {
                        message: format!("taking the migration lock: {e}"),
                    }
                }
            })?;
        if got.yes {
            return Ok(());
        }
        if started.elapsed() >= LOCK_WAIT {
            return Err(PgSetupError::MigrationBusy {
                message: format!(
                    "another process has held the lease migration lock for over {}s",
                    LOCK_WAIT.as_secs()
                ),
            });
        }
        // A blocking thread of its own: sleeping here holds up no async task.
        std::thread::sleep(pause);
        pause = (pause * 2).min(LOCK_POLL_MAX);
    }
}

fn migrate_locked(conn: &mut SyncConn, embedded: &[Embedded]) -> Result<Vec<String>, Fail> {
    let pending = conn.transaction(|c| prepare(c, embedded))?;
    let mut applied = Vec::new();
    for m in pending {
        let apply = |c: &mut SyncConn| -> Result<(), Fail> {
            m.migration
                .run(c)
                .map_err(|e| Fail::Sql(format!("migration {}: {e}", m.name)))?;
            diesel::sql_query(
                "INSERT INTO lease.engine_migrations (version, name) VALUES ($1, $2)",
            )
            .bind::<Text, _>(&m.version)
            .bind::<Text, _>(&m.name)
            .execute(c)
            .map_err(|e| Fail::Db("recording a migration", e))?;
            Ok(())
        };
        if m.migration.metadata().run_in_transaction() {
            conn.transaction(apply)?;
        } else {
            apply(conn)?;
        }
        tracing::info!(version = %m.version, name = %m.name, "applied a lease migration");
        applied.push(m.version.clone());
    }
    Ok(applied)
}

/// In one transaction: find the version table, create it with the schema on a fresh
/// database, or adopt an earlier release's deployment; refuse a schema someone else made.
/// Returns the migrations still to apply. Writes nothing when it refuses.
fn prepare<'a>(c: &mut SyncConn, embedded: &'a [Embedded]) -> Result<Vec<&'a Embedded>, Fail> {
    let state = inspect(c).map_err(|e| Fail::Db("inspecting the database", e))?;
    let applied = match (&state.owner, state.has_versions) {
        (None, _) => {
            state.may_write(true)?;
            c.batch_execute(&format!("{CREATE_SCHEMA}{CREATE_VERSION_TABLE}"))
                .map_err(|e| Fail::Db("creating schema lease", e))?;
            BTreeSet::new()
        }
        (Some(_), true) => {
            if !state.usage || !state.versions_readable {
                return Err(no_usage(&state).into());
            }
            read_versions(c).map_err(|e| Fail::Db("reading lease.engine_migrations", e))?
        }
        (Some(_), false) => {
            if !state.looks_legacy() || !diesel_records_legacy(c)? {
                return Err(state.foreign().into());
            }
            state.may_write(false)?;
            adopt(c, embedded)?
        }
    };
    let unknown: Vec<String> = applied
        .iter()
        .filter(|v| !embedded.iter().any(|m| &m.version == *v))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(PgSetupError::SchemaNewer { unknown }.into());
    }
    let pending: Vec<&Embedded> = embedded
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .collect();
    if !pending.is_empty() && state.owner.is_some() {
        state.may_write(false)?;
    }
    Ok(pending)
}

/// Whether the application's diesel table (the one on the search path, as diesel found it)
/// records the first migration of an earlier release.
fn diesel_records_legacy(c: &mut SyncConn) -> Result<bool, Fail> {
    let what = "reading __diesel_schema_migrations";
    let table: Flag =
        diesel::sql_query("SELECT to_regclass('__diesel_schema_migrations') IS NOT NULL AS yes")
            .get_result(c)
            .map_err(|e| Fail::Db(what, e))?;
    if !table.yes {
        return Ok(false);
    }
    let row: Flag = diesel::sql_query(
        "SELECT EXISTS (SELECT 1 FROM __diesel_schema_migrations WHERE version = $1) AS yes",
    )
    .bind::<Text, _>(LEGACY_FIRST_VERSION)
    .get_result(c)
    .map_err(|e| Fail::Db(what, e))?;
    Ok(row.yes)
}

/// Adopt an earlier release's deployment: create the version table and move the engine's
/// versions into it from the application's diesel table (only the engine's rows; nothing of
/// the application's is dropped). Returns the versions adopted.
fn adopt(c: &mut SyncConn, embedded: &[Embedded]) -> Result<BTreeSet<String>, Fail> {
    c.batch_execute(CREATE_VERSION_TABLE)
        .map_err(|e| Fail::Db("creating lease.engine_migrations", e))?;
    let versions: Vec<&str> = embedded.iter().map(|m| m.version.as_str()).collect();
    let names: Vec<&str> = embedded.iter().map(|m| m.name.as_str()).collect();
    let moved: Vec<VersionRow> = diesel::sql_query(
        "INSERT INTO lease.engine_migrations (version, name, applied_at)
         SELECT d.version, e.name, d.run_on
           FROM __diesel_schema_migrations d
           JOIN unnest($1::text[], $2::text[]) AS e (version, name) ON e.version = d.version
         RETURNING version",
    )
    .bind::<Array<Text>, _>(&versions)
    .bind::<Array<Text>, _>(&names)
    .load(c)
    .map_err(|e| Fail::Db("adopting the earlier release's versions", e))?;
    let moved: Vec<String> = moved.into_iter().map(|r| r.version).collect();
    diesel::sql_query("DELETE FROM __diesel_schema_migrations WHERE version = ANY($1)")
        .bind::<Array<Text>, _>(&moved)
        .execute(c)
        .map_err(|e| {
            Fail::Db(
                "removing the engine's rows from __diesel_schema_migrations",
                e,
            )
        })?;
    tracing::info!(
        versions = ?moved,
        "adopted the lease schema of an earlier release: its versions moved from \
         __diesel_schema_migrations to lease.engine_migrations"
    );
    Ok(moved.into_iter().collect())
}

fn no_usage(state: &State) -> PgSetupError {
    PgSetupError::PermissionDenied {
        message: format!(
            "role {:?} may not read schema lease's versions; grant it: GRANT USAGE ON SCHEMA \
             lease TO {:?} (and SELECT on lease.engine_migrations if it was revoked)",
            state.role, state.role
        ),
    }
}

/// The start-up check: the schema exists, is the engine's, and has exactly the migrations of
/// this build. Read-only: it reads the catalogs and `lease.engine_migrations`, creates
/// nothing, and so works on a hot standby and for a role with `USAGE` on the schema alone.
pub(crate) fn check(conn: &mut SyncConn) -> Result<(), PgSetupError> {
    // One transaction for all the reads: through a transaction pooler each read (prepared,
    // then executed, in two round trips) stays on one server connection.
    match conn.transaction(|c| check_in(c).map_err(Fail::Setup)) {
        Ok(()) => Ok(()),
        Err(Fail::Setup(e)) => Err(e),
        Err(Fail::Db(_, e)) => Err(check_failed(e)),
        Err(Fail::Sql(message)) => Err(PgSetupError::SchemaCheck { message }),
    }
}

/// A failed read of the start-up check.
fn check_failed(e: DieselError) -> PgSetupError {
    if lost(&e) {
        PgSetupError::Unreachable {
            message: format!("the connection was lost checking the lease schema: {e}"),
        }
    } else {
        PgSetupError::SchemaCheck {
            message: e.to_string(),
        }
    }
}

/// The start-up check's reads and decisions.
fn check_in(conn: &mut SyncConn) -> Result<(), PgSetupError> {
    let embedded = embedded()?;
    let state = inspect(conn).map_err(check_failed)?;
    if state.owner.is_none() {
        return Err(PgSetupError::NotInstalled);
    }
    if !state.has_versions {
        return Err(if state.looks_legacy() {
            PgSetupError::LegacySchema
        } else {
            state.foreign()
        });
    }
    if !state.usage || !state.versions_readable {
        return Err(no_usage(&state));
    }
    let applied = read_versions(conn).map_err(check_failed)?;
    let unknown: Vec<String> = applied
        .iter()
        .filter(|v| !embedded.iter().any(|m| &m.version == *v))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(PgSetupError::SchemaNewer { unknown });
    }
    let missing: Vec<String> = embedded
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .map(|m| m.version.clone())
        .collect();
    if !missing.is_empty() {
        return Err(PgSetupError::SchemaOutdated { missing });
    }
    Ok(())
}
