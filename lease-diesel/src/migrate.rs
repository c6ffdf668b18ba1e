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
//! The schema carries its version: the rows of `lease.engine_migrations`, each saying whether
//! its migration is *additive* (binaries that do not know it keep working: it adds columns with
//! a default or nullable, tables, indexes, functions, and changes nothing older binaries use)
//! or *breaking*. Each migration declares which on the first line of its `up.sql` (the build
//! script reads it; a migration that does not say fails the build). A binary requires every
//! migration it knows to be applied ([`PgSetupError::SchemaOutdated`]: run `migrate`), accepts
//! applied migrations it does not know if all of them are additive (reporting them in
//! [`SchemaStatus::newer_additive`]), and refuses a schema with a breaking one it does not know
//! ([`PgSetupError::SchemaNewer`]: upgrade). So a release whose migrations are all additive
//! deploys as: `migrate` first, while the old binaries run on, then roll the binaries.
//!
//! Both entry points are synchronous (diesel's `Migration::run` is) and run on a blocking
//! thread over diesel-async's connection wrapper; see `PgLeaseStore::{migrate, check_schema}`.

use std::collections::BTreeMap;
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

use crate::PgLeaseStore;
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

/// Whether binaries that do not know a migration keep working once it is applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compatibility {
    /// They keep working: it adds what they do not use (a table, an index, a function, a
    /// column that is nullable or has a default) and changes nothing they use. They accept a
    /// schema carrying it, and report it.
    Additive,
    /// They must not run on it: they refuse a schema carrying it, at start-up, with
    /// [`PgSetupError::SchemaNewer`].
    Breaking,
}

impl Compatibility {
    /// `additive` or `breaking`, as a migration's first line says it.
    pub fn as_str(self) -> &'static str {
        match self {
            Compatibility::Additive => "additive",
            Compatibility::Breaking => "breaking",
        }
    }
}

// `DECLARED`: each embedded migration's compatibility, read from its up.sql by build.rs.
include!(concat!(env!("OUT_DIR"), "/compatibility.rs"));

/// A migration given to the runner besides the embedded ones, as a newer release would ship
/// it: for tests of the compatibility rule (workers keep running while a newer release
/// migrates; a breaking migration stops old binaries from starting). Runs in a transaction.
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct ExtraMigration {
    /// Its version, as diesel takes it from a directory name (`20991231000001`).
    pub version: String,
    /// Its name, as recorded.
    pub name: String,
    /// Its SQL.
    pub up: String,
    /// Whether binaries that do not know it keep working.
    pub compatibility: Compatibility,
}

/// What the start-up check found in a schema it accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SchemaStatus {
    /// Every version applied, in order: this build's, and any newer ones.
    pub applied: Vec<String>,
    /// Applied migrations this build does not know, all additive: a newer release migrated,
    /// and this build keeps working. Upgrade when convenient.
    pub newer_additive: Vec<String>,
}

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
    applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    additive   boolean     NOT NULL DEFAULT false
);
COMMENT ON TABLE lease.engine_migrations IS
    'Migrations of the lease engine applied here, written by its migrate (leasectl migrate)';
COMMENT ON COLUMN lease.engine_migrations.additive IS
    'Binaries that do not know this migration keep working with it (else they refuse the schema)';
GRANT SELECT ON lease.engine_migrations TO PUBLIC;
"#;

/// A version table made before migrations carried their compatibility gets the column when a
/// runner next records a migration. Its rows say nothing: they count as breaking, and every
/// binary that reads the column knows them.
const ADD_ADDITIVE_COLUMN: &str = r#"
ALTER TABLE lease.engine_migrations
    ADD COLUMN IF NOT EXISTS additive boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN lease.engine_migrations.additive IS
    'Binaries that do not know this migration keep working with it (else they refuse the schema)';
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
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = v.oid AND a.attname = 'additive' AND NOT a.attisdropped)
         AS has_additive,
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
    /// The version table says which migrations are additive (a table made by a release
    /// before the rule does not).
    #[diesel(sql_type = Bool)]
    has_additive: bool,
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
struct AppliedRow {
    #[diesel(sql_type = Text)]
    version: String,
    #[diesel(sql_type = Bool)]
    additive: bool,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

/// How a known migration runs.
enum Step {
    /// One of this build's, embedded from `migrations/`.
    Embedded(Box<dyn Migration<Pg>>),
    /// One given to the runner ([`ExtraMigration`]), run in a transaction.
    Sql(String),
}

/// A migration this build knows, with its version and compatibility.
struct Known {
    version: String,
    name: String,
    compatibility: Compatibility,
    step: Step,
}

impl Known {
    fn additive(&self) -> bool {
        self.compatibility == Compatibility::Additive
    }

    fn run_in_transaction(&self) -> bool {
        match &self.step {
            Step::Embedded(m) => m.metadata().run_in_transaction(),
            Step::Sql(_) => true,
        }
    }

    fn run(&self, c: &mut SyncConn) -> Result<(), Fail> {
        match &self.step {
            Step::Embedded(m) => m
                .run(c)
                .map_err(|e| Fail::Sql(format!("migration {}: {e}", self.name))),
            Step::Sql(up) => c
                .batch_execute(up)
                .map_err(|e| Fail::Sql(format!("migration {}: {e}", self.name))),
        }
    }
}

/// The migrations this build knows, in version order: the embedded ones and `extra`.
fn known(extra: &[ExtraMigration]) -> Result<Vec<Known>, PgSetupError> {
    let migrations =
        MigrationSource::<Pg>::migrations(&MIGRATIONS).map_err(|e| PgSetupError::Migration {
            message: format!("reading the embedded migrations: {e}"),
        })?;
    let mut list = Vec::new();
    for m in migrations {
        let name = m.name().to_string();
        let compatibility = DECLARED
            .iter()
            .find(|(declared, _)| *declared == name)
            .map(|(_, c)| *c)
            .ok_or_else(|| PgSetupError::Migration {
                message: format!(
                    "migration {name} declares no compatibility (rebuild: the build script \
                     reads it from the first line of its up.sql)"
                ),
            })?;
        list.push(Known {
            version: m.name().version().to_string(),
            name,
            compatibility,
            step: Step::Embedded(m),
        });
    }
    list.extend(extra.iter().map(|e| Known {
        version: e.version.clone(),
        name: e.name.clone(),
        compatibility: e.compatibility,
        step: Step::Sql(e.up.clone()),
    }));
    list.sort_by(|a, b| a.version.cmp(&b.version));
    if let Some(twice) = list.windows(2).find(|w| w[0].version == w[1].version) {
        return Err(PgSetupError::Migration {
            message: format!("two migrations have version {}", twice[0].version),
        });
    }
    Ok(list)
}

/// What a build knowing `known` makes of a schema with `applied` (version: additive).
#[derive(Debug, Default, PartialEq, Eq)]
struct Verdict {
    /// This build's migrations not applied yet, in order.
    missing: Vec<String>,
    /// Applied migrations this build does not know that are additive.
    newer_additive: Vec<String>,
    /// Applied migrations this build does not know that are breaking (or say nothing).
    newer_breaking: Vec<String>,
}

fn judge(known: &[Known], applied: &BTreeMap<String, bool>) -> Verdict {
    let mut verdict = Verdict {
        missing: known
            .iter()
            .filter(|m| !applied.contains_key(&m.version))
            .map(|m| m.version.clone())
            .collect(),
        ..Verdict::default()
    };
    for (version, &additive) in applied {
        if known.iter().any(|m| &m.version == version) {
            continue;
        }
        if additive {
            verdict.newer_additive.push(version.clone());
        } else {
            verdict.newer_breaking.push(version.clone());
        }
    }
    verdict
}

fn report_newer(newer_additive: &[String]) {
    if !newer_additive.is_empty() {
        tracing::info!(
            versions = ?newer_additive,
            "the lease schema has migrations newer than this build, all additive: it keeps \
             working; upgrade when convenient"
        );
    }
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

/// The applied versions, each with whether it is additive (none is, in a version table made
/// before the rule).
fn read_versions(
    conn: &mut SyncConn,
    has_additive: bool,
) -> Result<BTreeMap<String, bool>, DieselError> {
    let sql = if has_additive {
        "SELECT version, additive FROM lease.engine_migrations"
    } else {
        "SELECT version, false AS additive FROM lease.engine_migrations"
    };
    let rows: Vec<AppliedRow> = diesel::sql_query(sql).load(conn)?;
    Ok(rows.into_iter().map(|r| (r.version, r.additive)).collect())
}

/// Apply every embedded migration not applied yet, in version order; returns the versions
/// applied. Takes the advisory lock before it reads anything, so that concurrent runners see
/// each other's work, never a half-made schema.
fn migrate(conn: &mut SyncConn, known: &[Known]) -> Result<Vec<String>, PgSetupError> {
    lock(conn)?;
    let result = migrate_locked(conn, known);
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

fn migrate_locked(conn: &mut SyncConn, known: &[Known]) -> Result<Vec<String>, Fail> {
    let pending = conn.transaction(|c| prepare(c, known))?;
    let mut applied = Vec::new();
    for m in pending {
        let apply = |c: &mut SyncConn| -> Result<(), Fail> {
            m.run(c)?;
            diesel::sql_query(
                "INSERT INTO lease.engine_migrations (version, name, additive) VALUES ($1, $2, $3)",
            )
            .bind::<Text, _>(&m.version)
            .bind::<Text, _>(&m.name)
            .bind::<Bool, _>(m.additive())
            .execute(c)
            .map_err(|e| Fail::Db("recording a migration", e))?;
            Ok(())
        };
        if m.run_in_transaction() {
            conn.transaction(apply)?;
        } else {
            apply(conn)?;
        }
        tracing::info!(
            version = %m.version,
            name = %m.name,
            compatibility = m.compatibility.as_str(),
            "applied a lease migration"
        );
        applied.push(m.version.clone());
    }
    Ok(applied)
}

/// In one transaction: find the version table, create it with the schema on a fresh
/// database, or adopt an earlier release's deployment; refuse a schema someone else made, or
/// one with a breaking migration this build does not know. Returns the migrations still to
/// apply, having given the version table its `additive` column if they need it. Writes
/// nothing when it refuses.
fn prepare<'a>(c: &mut SyncConn, known: &'a [Known]) -> Result<Vec<&'a Known>, Fail> {
    let state = inspect(c).map_err(|e| Fail::Db("inspecting the database", e))?;
    let mut needs_column = false;
    let applied = match (&state.owner, state.has_versions) {
        (None, _) => {
            state.may_write(true)?;
            c.batch_execute(&format!("{CREATE_SCHEMA}{CREATE_VERSION_TABLE}"))
                .map_err(|e| Fail::Db("creating schema lease", e))?;
            BTreeMap::new()
        }
        (Some(_), true) => {
            if !state.usage || !state.versions_readable {
                return Err(no_usage(&state).into());
            }
            needs_column = !state.has_additive;
            read_versions(c, state.has_additive)
                .map_err(|e| Fail::Db("reading lease.engine_migrations", e))?
        }
        (Some(_), false) => {
            if !state.looks_legacy() || !diesel_records_legacy(c)? {
                return Err(state.foreign().into());
            }
            state.may_write(false)?;
            adopt(c, known)?
        }
    };
    let verdict = judge(known, &applied);
    if !verdict.newer_breaking.is_empty() {
        return Err(PgSetupError::SchemaNewer {
            unknown: verdict.newer_breaking,
        }
        .into());
    }
    report_newer(&verdict.newer_additive);
    let pending: Vec<&Known> = known
        .iter()
        .filter(|m| verdict.missing.contains(&m.version))
        .collect();
    if !pending.is_empty() && state.owner.is_some() {
        state.may_write(false)?;
    }
    if !pending.is_empty() && needs_column {
        c.batch_execute(ADD_ADDITIVE_COLUMN)
            .map_err(|e| Fail::Db("adding lease.engine_migrations.additive", e))?;
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
fn adopt(c: &mut SyncConn, known: &[Known]) -> Result<BTreeMap<String, bool>, Fail> {
    c.batch_execute(CREATE_VERSION_TABLE)
        .map_err(|e| Fail::Db("creating lease.engine_migrations", e))?;
    let versions: Vec<&str> = known.iter().map(|m| m.version.as_str()).collect();
    let names: Vec<&str> = known.iter().map(|m| m.name.as_str()).collect();
    let additive: Vec<bool> = known.iter().map(Known::additive).collect();
    let moved: Vec<AppliedRow> = diesel::sql_query(
        "INSERT INTO lease.engine_migrations (version, name, applied_at, additive)
         SELECT d.version, e.name, d.run_on, e.additive
           FROM __diesel_schema_migrations d
           JOIN unnest($1::text[], $2::text[], $3::boolean[]) AS e (version, name, additive)
             ON e.version = d.version
         RETURNING version, additive",
    )
    .bind::<Array<Text>, _>(&versions)
    .bind::<Array<Text>, _>(&names)
    .bind::<Array<Bool>, _>(&additive)
    .load(c)
    .map_err(|e| Fail::Db("adopting the earlier release's versions", e))?;
    let moved: BTreeMap<String, bool> =
        moved.into_iter().map(|r| (r.version, r.additive)).collect();
    let versions: Vec<&String> = moved.keys().collect();
    diesel::sql_query("DELETE FROM __diesel_schema_migrations WHERE version = ANY($1)")
        .bind::<Array<Text>, _>(&versions)
        .execute(c)
        .map_err(|e| {
            Fail::Db(
                "removing the engine's rows from __diesel_schema_migrations",
                e,
            )
        })?;
    tracing::info!(
        versions = ?versions,
        "adopted the lease schema of an earlier release: its versions moved from \
         __diesel_schema_migrations to lease.engine_migrations"
    );
    Ok(moved)
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

/// The start-up check: the schema exists, is the engine's, has every migration this build
/// knows, and no breaking one it does not. Read-only: it reads the catalogs and
/// `lease.engine_migrations`, creates nothing, and so works on a hot standby and for a role
/// with `USAGE` on the schema alone.
fn check(conn: &mut SyncConn, known: &[Known]) -> Result<SchemaStatus, PgSetupError> {
    // One transaction for all the reads: through a transaction pooler each read (prepared,
    // then executed, in two round trips) stays on one server connection.
    match conn.transaction(|c| check_in(c, known).map_err(Fail::Setup)) {
        Ok(status) => Ok(status),
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
fn check_in(conn: &mut SyncConn, known: &[Known]) -> Result<SchemaStatus, PgSetupError> {
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
    let applied = read_versions(conn, state.has_additive).map_err(check_failed)?;
    let verdict = judge(known, &applied);
    if !verdict.newer_breaking.is_empty() {
        return Err(PgSetupError::SchemaNewer {
            unknown: verdict.newer_breaking,
        });
    }
    if !verdict.missing.is_empty() {
        return Err(PgSetupError::SchemaOutdated {
            missing: verdict.missing,
        });
    }
    report_newer(&verdict.newer_additive);
    Ok(SchemaStatus {
        applied: applied.into_keys().collect(),
        newer_additive: verdict.newer_additive,
    })
}

/// Run `f` on `conn` on a blocking thread (the runner is synchronous, driving the async
/// connection from there), resuming a panic; a task that did not run fails as `not_run` says.
async fn blocking<T: Send + 'static>(
    conn: AsyncPgConnection,
    not_run: fn(String) -> PgSetupError,
    f: impl FnOnce(&mut SyncConn) -> Result<T, PgSetupError> + Send + 'static,
) -> Result<T, PgSetupError> {
    let task = tokio::task::spawn_blocking(move || f(&mut SyncConn::from(conn)));
    match task.await {
        Ok(result) => result,
        Err(e) => match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => Err(not_run(format!("the task did not run: {e}"))),
        },
    }
}

impl PgLeaseStore {
    /// What [`check_schema`](Self::check_schema) checks, with what it found: the versions
    /// applied, and the additive migrations of a newer release this build works with.
    pub async fn schema_status(&self) -> Result<SchemaStatus, PgSetupError> {
        self.schema_status_with(&[]).await
    }

    /// [`migrate`](Self::migrate) as a build that also knew `extra` would run it. For tests
    /// of the compatibility rule; the engine's own migrations are all embedded.
    #[doc(hidden)]
    pub async fn migrate_with(
        &self,
        extra: &[ExtraMigration],
    ) -> Result<Vec<String>, PgSetupError> {
        let extra = extra.to_vec();
        // The connection left the pool (or was made for this) and is dropped afterwards,
        // which also ends the advisory lock's session.
        let conn = match &self.direct {
            Some((direct, timeout)) => match tokio::time::timeout(*timeout, direct.connect()).await
            {
                Ok(connected) => connected.map_err(crate::error::from_connection_setup)?,
                Err(_) => {
                    return Err(PgSetupError::Unreachable {
                        message: format!("no connection on the direct URL within {timeout:?}"),
                    });
                }
            },
            None if self.pooler.is_some() => return Err(PgSetupError::DirectConnectionRequired),
            None => self.setup_connection().await?,
        };
        blocking(
            conn,
            |message| PgSetupError::Migration { message },
            move |c| migrate(c, &known(&extra)?),
        )
        .await
    }

    /// [`schema_status`](Self::schema_status) as a build that also knew `extra` would see it.
    /// For tests of the compatibility rule.
    #[doc(hidden)]
    pub async fn schema_status_with(
        &self,
        extra: &[ExtraMigration],
    ) -> Result<SchemaStatus, PgSetupError> {
        let extra = extra.to_vec();
        let conn = self.setup_connection().await?;
        blocking(
            conn,
            |message| PgSetupError::SchemaCheck { message },
            move |c| check(c, &known(&extra)?),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sql(version: &str, compatibility: Compatibility) -> Known {
        Known {
            version: version.to_owned(),
            name: version.to_owned(),
            compatibility,
            step: Step::Sql(String::new()),
        }
    }

    fn applied(rows: &[(&str, bool)]) -> BTreeMap<String, bool> {
        rows.iter().map(|(v, a)| ((*v).to_owned(), *a)).collect()
    }

    #[test]
    fn a_build_needs_its_own_and_accepts_newer_additive_migrations() {
        let known = [
            sql("1", Compatibility::Breaking),
            sql("2", Compatibility::Additive),
        ];
        assert_eq!(
            judge(&known, &applied(&[("1", false), ("2", true)])),
            Verdict::default()
        );
        assert_eq!(
            judge(&known, &applied(&[("1", false)])).missing,
            ["2"],
            "its own migrations are required, whatever their compatibility"
        );
        let newer = judge(&known, &applied(&[("1", false), ("2", true), ("3", true)]));
        assert_eq!(newer.newer_additive, ["3"]);
        assert!(newer.newer_breaking.is_empty() && newer.missing.is_empty());
        let breaking = judge(
            &known,
            &applied(&[("1", false), ("2", true), ("3", true), ("4", false)]),
        );
        assert_eq!(breaking.newer_breaking, ["4"]);
        assert_eq!(breaking.newer_additive, ["3"]);
    }

    #[test]
    fn every_embedded_migration_declares_its_compatibility() {
        let known = known(&[]).expect("the embedded migrations");
        assert_eq!(known.len(), DECLARED.len());
        assert_eq!(
            known[0].compatibility,
            Compatibility::Breaking,
            "the first migration creates everything"
        );
    }
}
