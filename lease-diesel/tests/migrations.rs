//! The migration runner and the start-up check on real Postgres: the engine owns its schema
//! (refuses one it did not make, reverts only its own objects), keeps its versions out of the
//! application's diesel table (and adopts a deployment of the earlier release that kept them
//! there), checks without writing (on a read-only connection, as a SELECT-only role), lets a
//! role with EXECUTE alone fence, and reports connection failures with their cause and
//! whether to retry. Roles are made with exactly the grants each test is about.

mod support;

use support::process;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel::QueryableByName;
use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel::sql_types::{Bool, Integer, Nullable, Text, Timestamptz};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use lease_core::{
    AdminStore, Bucket, BucketState, FencingToken, GroupName, MemberMetadata, NodeId, ShardCount,
    Takeover, Timestamp, Ttl, WorkerStore,
};
use lease_diesel::privileges::{self, Grant, Object, RoleKind, RoleName};
use lease_diesel::{Compatibility, ExtraMigration, MIGRATIONS, PgLeaseStore, PgSetupError, ops};

/// A host application's own diesel migrations (dated before the engine's).
const APP: EmbeddedMigrations = embed_migrations!("tests/fixtures/app_migrations");
/// The engine's migrations as the earlier release shipped and ran them (through diesel's
/// harness, into the application's table, creating the schema with IF NOT EXISTS).
const LEGACY: EmbeddedMigrations = embed_migrations!("tests/fixtures/legacy_migrations");
/// The version of the app's one migration.
const APP_VERSION: &str = "20200101000001";
/// The password of the roles the tests make (the test cluster trusts local connections; a
/// server named by `DATABASE_URL` may not).
const PASSWORD: &str = "lease-test-pw";

type SyncConn = AsyncConnectionWrapper<AsyncPgConnection>;

/// Node `w` starts its session on `conn` and joins `g`: the heartbeat that started it.
async fn member_on(
    conn: &mut AsyncPgConnection,
    g: &GroupName,
    w: NodeId,
    ttl: Ttl,
) -> lease_core::Heartbeat {
    let beat = ops::heartbeat(
        conn,
        None,
        w,
        process(w),
        ttl,
        &MemberMetadata::empty(),
        &[],
    )
    .await
    .expect("a session");
    ops::join(conn, None, g, w, beat.session)
        .await
        .expect("join");
    beat
}

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
}

/// Run `f` on a synchronous connection to `url` (diesel's migration harness is synchronous).
async fn sync<T, F>(url: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(&mut SyncConn) -> T + Send + 'static,
{
    let conn = connect(url).await;
    tokio::task::spawn_blocking(move || f(&mut SyncConn::from(conn)))
        .await
        .expect("the blocking task")
}

/// The versions of the engine's migrations in this build, in order.
fn engine_versions() -> Vec<String> {
    let mut v: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .expect("the embedded migrations")
        .iter()
        .map(|m| m.name().version().to_string())
        .collect();
    v.sort();
    v
}

fn legacy_versions() -> Vec<String> {
    MigrationSource::<Pg>::migrations(&LEGACY)
        .expect("the legacy migrations")
        .iter()
        .map(|m| m.name().version().to_string())
        .collect()
}

/// A role name of its own (roles are cluster-wide).
fn fresh_role(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "lease_{what}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// `url` logging in as `role` instead.
fn url_as(url: &str, role: &str) -> String {
    lease_testdb::url_as(url, role, PASSWORD)
}

/// A login role with `grants` (each `{role}` replaced by its name), on database `db`.
async fn make_role(admin: &mut AsyncPgConnection, db: &str, what: &str, grants: &str) -> String {
    let role = fresh_role(what);
    exec(
        admin,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'; \
             GRANT CONNECT ON DATABASE \"{db}\" TO {role}; {}",
            grants.replace("{role}", &role)
        ),
    )
    .await;
    role
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

async fn names(conn: &mut AsyncPgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Name>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .map(|n| n.name)
        .collect()
}

async fn flag(conn: &mut AsyncPgConnection, sql: &str) -> bool {
    diesel::sql_query(sql)
        .get_result::<Flag>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .yes
}

/// Every schema, relation (tables, indexes, sequences, their types' relations), function and
/// type outside the system schemas: what a read-only operation must leave as it found.
async fn objects(conn: &mut AsyncPgConnection) -> BTreeSet<String> {
    names(
        conn,
        r"SELECT x.name FROM (
            SELECT 'schema ' || n.nspname AS name, n.nspname AS nsp FROM pg_namespace n
            UNION ALL
            SELECT 'relation ' || n.nspname || '.' || c.relname, n.nspname
              FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            UNION ALL
            SELECT 'function ' || n.nspname || '.' || p.proname, n.nspname
              FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            UNION ALL
            SELECT 'type ' || n.nspname || '.' || t.typname, n.nspname
              FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
          ) AS x
          WHERE x.nsp NOT LIKE 'pg\_%' AND x.nsp <> 'information_schema'
          ORDER BY 1",
    )
    .await
    .into_iter()
    .collect()
}

async fn diesel_versions(conn: &mut AsyncPgConnection) -> Vec<String> {
    names(
        conn,
        "SELECT version::text AS name FROM __diesel_schema_migrations ORDER BY version",
    )
    .await
}

async fn engine_table_versions(conn: &mut AsyncPgConnection) -> Vec<String> {
    names(
        conn,
        "SELECT version AS name FROM lease.engine_migrations ORDER BY version",
    )
    .await
}

async fn relation_exists(conn: &mut AsyncPgConnection, name: &str) -> bool {
    flag(
        conn,
        &format!("SELECT to_regclass('{name}') IS NOT NULL AS yes"),
    )
    .await
}

async fn schema_exists(conn: &mut AsyncPgConnection) -> bool {
    flag(
        conn,
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'lease') AS yes",
    )
    .await
}

fn group(name: &str) -> GroupName {
    GroupName::new(name).expect("a group name")
}

fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a shard count")
}

fn ttl_ms(ms: u64) -> Ttl {
    Ttl::new(Duration::from_millis(ms)).expect("a ttl")
}

// ---- the engine owns its schema ------------------------------------------------------------

/// A user's own `lease` schema is refused, with a message naming what it holds, and nothing
/// is written: not the engine's tables, not a version table, not diesel's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_lease_schema_it_did_not_create() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "CREATE SCHEMA lease; CREATE TABLE lease.invoices (id int PRIMARY KEY); \
         INSERT INTO lease.invoices VALUES (1), (2)",
    )
    .await;
    let before = objects(&mut admin).await;
    let store = store(&db.url);

    match store.migrate().await {
        Err(e @ PgSetupError::ForeignSchema { .. }) => {
            assert!(!e.is_transient());
            let text = e.to_string();
            assert!(
                text.contains("lease.invoices") && text.contains("nothing was written"),
                "{text}"
            );
        }
        other => panic!("migrate into a user's schema: expected ForeignSchema, got {other:?}"),
    }
    match store.check_schema().await {
        Err(PgSetupError::ForeignSchema { .. }) => {}
        other => panic!("check_schema: expected ForeignSchema, got {other:?}"),
    }
    assert_eq!(objects(&mut admin).await, before, "a refused migrate wrote");
    assert!(flag(&mut admin, "SELECT count(*) = 2 AS yes FROM lease.invoices").await);

    // An empty schema someone made is not the engine's either.
    exec(&mut admin, "DROP TABLE lease.invoices").await;
    match store.migrate().await {
        Err(PgSetupError::ForeignSchema { found }) => assert!(found.contains("empty"), "{found}"),
        other => panic!("migrate into an empty foreign schema: got {other:?}"),
    }
    assert!(!relation_exists(&mut admin, "lease.groups").await);
}

/// Tables named like the engine's, without the engine's record of them, are not adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookalike_tables_without_a_record_are_not_adopted() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "CREATE SCHEMA lease; CREATE TABLE lease.groups (x int); \
         CREATE TABLE lease.members (x int); CREATE TABLE lease.shards (x int)",
    )
    .await;
    let before = objects(&mut admin).await;
    match store(&db.url).migrate().await {
        Err(PgSetupError::ForeignSchema { found }) => {
            assert!(found.contains("no record"), "{found}")
        }
        other => panic!("expected ForeignSchema, got {other:?}"),
    }
    assert_eq!(objects(&mut admin).await, before);
}

/// Revert every migration of this build, newest first, as diesel's harness would.
async fn revert_all(url: &str) {
    sync(url, |c| {
        let mut all = MigrationSource::<Pg>::migrations(&MIGRATIONS).expect("the migrations");
        all.sort_by_key(|m| std::cmp::Reverse(m.name().version().to_string()));
        for m in all {
            m.revert(c)
                .unwrap_or_else(|e| panic!("reverting {}: {e}", m.name()));
        }
    })
    .await;
}

/// The engine's down migrations drop the engine's objects and leave a table someone added to
/// the schema, and so the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_migrations_drop_only_the_engines_objects() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "CREATE TABLE lease.user_notes (note text); INSERT INTO lease.user_notes VALUES ('mine')",
    )
    .await;
    revert_all(&db.url).await;
    assert!(
        flag(
            &mut admin,
            "SELECT count(*) = 1 AS yes FROM lease.user_notes"
        )
        .await,
        "the user's table in schema lease was dropped"
    );
    let left = names(
        &mut admin,
        "SELECT c.relname::text AS name FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE n.nspname = 'lease' AND c.relkind = 'r'
         UNION ALL
         SELECT p.proname::text FROM pg_proc p
           JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'lease'",
    )
    .await;
    assert_eq!(left, vec!["user_notes".to_owned()], "what is left in lease");
}

/// With nothing else in it, the schema goes too: reverting leaves the database as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_migrations_drop_an_engine_only_schema() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    let before = objects(&mut admin).await;
    store(&db.url).migrate().await.expect("migrate");
    assert!(schema_exists(&mut admin).await);
    revert_all(&db.url).await;
    assert_eq!(objects(&mut admin).await, before);
}

// ---- the engine's versions are its own -----------------------------------------------------

async fn run_app_migrations(url: &str) {
    sync(url, |c| {
        c.run_pending_migrations(APP)
            .map(|v| v.len())
            .unwrap_or_else(|e| panic!("the app's migrations: {e}"))
    })
    .await;
}

/// The app's `revert_last_migration` reverts the app's last migration (not "unknown migration
/// version" for an engine version in its table).
async fn revert_app_migration(url: &str) {
    let reverted = sync(url, |c| {
        c.revert_last_migration(APP)
            .map(|v| v.to_string())
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(
        reverted.as_deref(),
        Ok(APP_VERSION),
        "the app's revert_last_migration"
    );
}

/// An application's diesel migrations table holds only the application's versions after the
/// engine migrates, so the application can still revert its own last migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apps_diesel_migrations_still_revert_after_the_engine_migrates() {
    let db = lease_testdb::empty_database().await;
    run_app_migrations(&db.url).await;
    let store = store(&db.url);
    assert_eq!(store.migrate().await.expect("migrate"), engine_versions());
    revert_app_migration(&db.url).await;

    let mut admin = connect(&db.url).await;
    assert!(!relation_exists(&mut admin, "app_items").await);
    assert!(diesel_versions(&mut admin).await.is_empty());
    assert_eq!(engine_table_versions(&mut admin).await, engine_versions());
    store.check_schema().await.expect("the engine is intact");
}

/// A deployment of the earlier release (schema and versions made by diesel's harness, in the
/// application's table) is adopted: its versions move to the engine's table, its data stays,
/// the newer migrations are applied, and the application's rows are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_the_earlier_release_is_adopted() {
    let db = lease_testdb::empty_database().await;
    run_app_migrations(&db.url).await;
    sync(&db.url, |c| {
        c.run_pending_migrations(LEGACY)
            .map(|v| v.len())
            .unwrap_or_else(|e| panic!("the earlier release's migrations: {e}"))
    })
    .await;
    let store = store(&db.url);
    let g = group("kept");
    // A group as the earlier release's ensure_group left it (this build's writes tables the
    // earlier schema lacks).
    exec(
        &mut connect(&db.url).await,
        &format!(
            "INSERT INTO lease.groups (name, shard_count) VALUES ('{g}', 4);
             INSERT INTO lease.shards (group_name, bucket)
                  SELECT '{g}', b FROM generate_series(0, 3) b;",
            g = g.as_str()
        ),
    )
    .await;
    match store.check_schema().await {
        Err(e @ PgSetupError::LegacySchema) => {
            assert!(e.to_string().contains("leasectl migrate"), "{e}");
        }
        other => panic!("check before adoption: expected LegacySchema, got {other:?}"),
    }

    let applied = store.migrate().await.expect("migrate adopts");
    let legacy = legacy_versions();
    let newer: Vec<String> = engine_versions()
        .into_iter()
        .filter(|v| !legacy.contains(v))
        .collect();
    assert_eq!(
        applied, newer,
        "only the migrations the old release lacked ran"
    );
    let mut admin = connect(&db.url).await;
    assert_eq!(engine_table_versions(&mut admin).await, engine_versions());
    assert_eq!(
        diesel_versions(&mut admin).await,
        vec![APP_VERSION],
        "the engine's rows left the app's table, and only they"
    );
    assert!(relation_exists(&mut admin, "app_items").await);
    store.check_schema().await.expect("the adopted schema");
    let snap = store.snapshot(&g).await.expect("the group survived");
    assert_eq!(snap.shard_count.get(), 4);
    assert!(store.migrate().await.expect("again").is_empty());
    revert_app_migration(&db.url).await;
}

/// A deployment that stopped at the earlier release's first migration is adopted too, and
/// brought up to date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_of_the_earlier_first_migration_only_is_adopted() {
    let db = lease_testdb::empty_database().await;
    sync(&db.url, |c| {
        c.run_next_migration(LEGACY)
            .map(|v| v.to_string())
            .unwrap_or_else(|e| panic!("the earlier release's first migration: {e}"))
    })
    .await;
    let store = store(&db.url);
    let applied = store.migrate().await.expect("migrate adopts");
    assert_eq!(applied, engine_versions()[1..].to_vec());
    store.check_schema().await.expect("up to date");
    let mut admin = connect(&db.url).await;
    assert!(diesel_versions(&mut admin).await.is_empty());
    // The second migration's column is there: the store runs.
    let me = NodeId::new();
    let g = group("upgraded");
    store.ensure_group(&g, shards(2)).await.expect("ensure");
    support::beat(&store, &g, me, ttl_ms(5_000), &MemberMetadata::empty())
        .await
        .expect("heartbeat on the adopted schema");
}

// ---- the start-up check writes nothing -----------------------------------------------------

/// On a fresh database the check says "not installed" and creates nothing, also on a
/// read-only connection (as on a hot standby).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_startup_check_writes_nothing() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    let before = objects(&mut admin).await;
    let checked = store(&db.url).check_schema().await;
    assert_eq!(
        objects(&mut admin).await,
        before,
        "the check created something"
    );
    match checked {
        Err(e @ PgSetupError::NotInstalled) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("leasectl migrate"), "{e}");
        }
        other => panic!("check on a fresh database: expected NotInstalled, got {other:?}"),
    }

    exec(
        &mut admin,
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name
        ),
    )
    .await;
    let checked = store(&db.url).check_schema().await;
    assert_eq!(objects(&mut admin).await, before);
    match checked {
        Err(PgSetupError::NotInstalled) => {}
        other => panic!("check on a read-only connection: expected NotInstalled, got {other:?}"),
    }
}

/// Several processes migrating and checking a fresh database at once: one migrates, the
/// others find it done, and each check sees a consistent state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_and_checks_on_a_fresh_database() {
    let db = lease_testdb::empty_database().await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let s = store(&db.url);
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                Ok(s.migrate().await)
            } else {
                Err(s.check_schema().await)
            }
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(migrated) => applied.push(migrated.expect("a concurrent migrate")),
            Err(Ok(()))
            | Err(Err(PgSetupError::NotInstalled | PgSetupError::SchemaOutdated { .. })) => {}
            Err(Err(other)) => panic!("a concurrent check: {other:?}"),
        }
    }
    applied.sort();
    let all = engine_versions();
    assert_eq!(applied, vec![vec![], vec![], vec![], all]);
    store(&db.url).check_schema().await.expect("migrated");
}

/// The runner's advisory lock key (the runner's own constant).
const RUNNER_LOCK_KEY: i64 = 0x6c65_6173_655f_6d69;

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// Poll `sql` (one boolean `yes`) until it holds, failing after 20 s.
async fn wait_until(conn: &mut AsyncPgConnection, what: &str, sql: &str) {
    for _ in 0..2_000 {
        if flag(conn, sql).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

/// A runner waiting for the migration lock holds no snapshot, so the runner holding the lock
/// can build an index concurrently (a migration with `run_in_transaction = false`): a runner
/// blocked in `pg_advisory_lock` made that a deadlock, which Postgres broke by failing one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_waiting_for_the_lock_lets_the_holder_build_an_index_concurrently() {
    let db = lease_testdb::database().await;
    let mut holder = connect(&db.url).await;
    exec(
        &mut holder,
        "CREATE TABLE probe (x int); SET statement_timeout = '20s'",
    )
    .await;
    exec(
        &mut holder,
        &format!("SELECT pg_advisory_lock({RUNNER_LOCK_KEY})"),
    )
    .await;
    let holder_pid = diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(&mut holder)
        .await
        .expect("pid")
        .pid;
    let runner = store(&db.url);
    let waiting = tokio::spawn(async move { runner.migrate().await });
    let mut admin = connect(&db.url).await;
    wait_until(
        &mut admin,
        "the runner to ask for the lock",
        &format!(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                             WHERE datname = current_database()
                               AND pid NOT IN ({holder_pid}, pg_backend_pid())
                               AND query LIKE '%advisory_lock%') AS yes"
        ),
    )
    .await;
    holder
        .batch_execute("CREATE INDEX CONCURRENTLY probe_idx ON probe (x)")
        .await
        .expect("building an index concurrently while a runner waits");
    exec(
        &mut holder,
        &format!("SELECT pg_advisory_unlock({RUNNER_LOCK_KEY})"),
    )
    .await;
    let applied = waiting.await.expect("the runner task");
    assert_eq!(applied.expect("the waiting runner"), Vec::<String>::new());
}

// ---- least privilege -----------------------------------------------------------------------

/// A login role with exactly the privileges `lease_diesel::privileges` lists for `kind` (the
/// statements `leasectl grant` prints), on database `db`.
async fn role_of_kind(
    admin: &mut AsyncPgConnection,
    db: &str,
    what: &str,
    kind: RoleKind,
) -> String {
    let role = make_role(admin, db, what, "").await;
    let name = RoleName::new(&role).expect("a role name");
    exec(admin, &privileges::grants(kind, &name).join("\n")).await;
    role
}

/// Take from PUBLIC what Postgres and the runner give it by default on the engine's objects
/// (EXECUTE on functions, SELECT on the version table), so that a role holds only what it was
/// granted and the privilege list is all a test runs on.
const REVOKE_PUBLIC_DEFAULTS: &str = "
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    REVOKE SELECT ON lease.engine_migrations FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC;
";

/// A monitoring role with the monitor's privileges, whose transactions are read-only (as on a
/// hot standby), checks the schema and reads a group; nothing is created anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_role_on_a_read_only_connection_checks_and_reads() {
    let db = lease_testdb::database().await;
    let owner = store(&db.url);
    let g = group("watched");
    owner.ensure_group(&g, shards(4)).await.expect("ensure");
    let me = NodeId::new();
    let beat = support::beat(&owner, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    owner
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("claim");

    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let role = role_of_kind(&mut admin, &db.name, "mon", RoleKind::Monitor).await;
    exec(
        &mut admin,
        &format!("ALTER ROLE {role} SET default_transaction_read_only = on"),
    )
    .await;
    let url = url_as(&db.url, &role);
    let mut as_role = connect(&url).await;
    assert!(
        flag(
            &mut as_role,
            "SELECT current_setting('transaction_read_only') = 'on' AS yes"
        )
        .await,
        "the role's connections are not read-only: the test would prove nothing"
    );
    assert!(
        as_role
            .batch_execute("SET transaction_read_only = off; DELETE FROM lease.members")
            .await
            .is_err(),
        "the monitor may delete members: the test would prove nothing"
    );
    let before = objects(&mut admin).await;

    let monitor = store(&url);
    monitor
        .check_schema()
        .await
        .expect("check as a monitor role");
    let snap = monitor
        .snapshot(&g)
        .await
        .expect("snapshot as a monitor role");
    assert!(snap.buckets.iter().all(|b| b.owner == Some(me)));
    assert_eq!(objects(&mut admin).await, before);
}

/// A worker's role with exactly the worker's privileges (PUBLIC's defaults revoked, no right
/// to create anything) runs every operation and every path of the engine's statements: the
/// start-up check, a claim judging a dead owner (which share-locks its member row), a
/// heartbeat removing a dead member's row, releases, operators' controls and quarantines,
/// leaves, wake-ups, fencing, snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_with_the_workers_privileges_runs_the_engine() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let role = role_of_kind(&mut admin, &db.name, "wkr", RoleKind::Worker).await;
    assert!(
        !flag(
            &mut admin,
            &format!(
                "SELECT has_database_privilege('{role}', current_database(), 'CREATE')
                     OR EXISTS (SELECT 1 FROM pg_namespace n
                                 WHERE has_schema_privilege('{role}', n.oid, 'CREATE')) AS yes"
            ),
        )
        .await,
        "the worker role may create something: the test would prove less"
    );
    let before = objects(&mut admin).await;
    let worker = store(&url_as(&db.url, &role));
    worker
        .check_schema()
        .await
        .expect("check as the worker role");
    let g = group("work");
    worker.ensure_group(&g, shards(4)).await.expect("ensure");
    worker
        .ensure_group(&g, shards(4))
        .await
        .expect("ensure an existing group");
    let (short, me) = (NodeId::new(), NodeId::new());
    let brief = support::beat(&worker, &g, short, ttl_ms(300), &MemberMetadata::empty())
        .await
        .expect("a short-lived member joins");
    let held = worker
        .claim(&g, short, brief.session, 2, Takeover::Allowed)
        .await
        .expect("the short-lived member claims");
    assert_eq!(held.len(), 2);
    let beat = support::beat(&worker, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    wait_server_past(&mut admin, brief.expires_at).await;
    // The dead member's row is still there: the claim judges it dead in lease.owner_is_dead,
    // share-locking it.
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 4, "the free and the dead member's buckets");
    support::beat(&worker, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("a heartbeat removing the dead member");
    assert_eq!(
        worker.snapshot(&g).await.expect("snapshot").members.len(),
        1,
        "the dead member's row was not removed"
    );
    assert!(
        worker
            .is_current(&g, won[0].bucket, me, won[0].token)
            .await
            .expect("is_current")
    );
    worker
        .release(&g, me, beat.session, &[won[0].bucket])
        .await
        .expect("release");
    // Operators' controls: a weight, a cordon and its lift (a claim judging the mode), a
    // quarantine and its lift.
    let weight = lease_core::MemberControl::Weight(lease_core::Weight::new(2).expect("weight"));
    worker.control(&g, me, weight).await.expect("a weight");
    for mode in [
        lease_core::MemberMode::Cordoned,
        lease_core::MemberMode::Active,
    ] {
        worker
            .control(&g, me, lease_core::MemberControl::Mode(mode))
            .await
            .expect("a mode");
        worker
            .claim(&g, me, beat.session, 1, Takeover::Allowed)
            .await
            .expect("a claim under a mode");
    }
    let minute = lease_core::QuarantineFor::new(Duration::from_secs(60)).expect("duration");
    worker
        .quarantine(&g, won[1].bucket, Some(minute))
        .await
        .expect("a quarantine");
    worker
        .quarantine(&g, won[1].bucket, None)
        .await
        .expect("a lift");
    worker.changes(&g).await.expect("changes");
    worker.leave(&g, me, beat.session).await.expect("leave");
    assert!(
        worker
            .snapshot(&g)
            .await
            .expect("snapshot")
            .members
            .is_empty()
    );
    assert_eq!(objects(&mut admin).await, before);
}

/// The objects of schema `lease` (relations and functions, as `relation lease.x`,
/// `sequence lease.x`, `function lease.f(args)`) that the privilege list does not account
/// for, and the list's entries that name nothing in the database.
async fn uncovered(conn: &mut AsyncPgConnection) -> (Vec<String>, Vec<String>) {
    let in_schema: BTreeSet<String> = names(
        conn,
        "SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'relation ' END
                || c.oid::regclass::text AS name
           FROM pg_class c
          WHERE c.relnamespace = 'lease'::regnamespace
            AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
         UNION ALL
         SELECT 'function ' || p.oid::regprocedure::text
           FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace",
    )
    .await
    .into_iter()
    .collect();
    let mut listed = BTreeSet::new();
    let mut dangling = Vec::new();
    for object in privileges::objects() {
        let (label, lookup) = match object {
            Object::Schema(name) => {
                if !flag(
                    conn,
                    &format!("SELECT to_regnamespace('{name}') IS NOT NULL AS yes"),
                )
                .await
                {
                    dangling.push(format!("schema {name}"));
                }
                continue;
            }
            Object::Table(name) => ("relation", format!("to_regclass('{name}')::text")),
            Object::Sequence(name) => ("sequence", format!("to_regclass('{name}')::text")),
            Object::Function(sig) => ("function", format!("to_regprocedure('{sig}')::text")),
        };
        let found = names(
            conn,
            &format!("SELECT {lookup} AS name WHERE {lookup} IS NOT NULL"),
        )
        .await;
        match found.into_iter().next() {
            Some(canonical) => {
                listed.insert(format!("{label} {canonical}"));
            }
            None => dangling.push(format!("{object}")),
        }
    }
    let missing = in_schema.difference(&listed).cloned().collect();
    (missing, dangling)
}

/// Every table, sequence and function of schema `lease` after migrating is in the privilege
/// list (decided: which kinds of role need what on it), and everything the list names exists:
/// a migration that adds an object fails here until the grants say who may use it. The
/// check itself is shown to notice an object added to the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grants_cover_every_object_of_schema_lease() {
    let db = lease_testdb::empty_database().await;
    store(&db.url).migrate().await.expect("migrate");
    let mut admin = connect(&db.url).await;
    let (missing, dangling) = uncovered(&mut admin).await;
    assert!(
        missing.is_empty(),
        "objects of schema lease that lease_diesel::privileges does not cover: {missing:?}. \
         Add each to its list (NEEDS in lease-diesel/src/privileges.rs) with what each kind of \
         role needs on it (nothing, if only the owner uses it), and the README's table of roles"
    );
    assert!(
        dangling.is_empty(),
        "lease_diesel::privileges names objects the migrations do not create: {dangling:?}"
    );

    exec(
        &mut admin,
        "CREATE TABLE lease.drain_requests (worker uuid PRIMARY KEY);
         CREATE SEQUENCE lease.drain_seq;
         CREATE FUNCTION lease.drain(p uuid) RETURNS void LANGUAGE sql AS $$ SELECT $$;",
    )
    .await;
    let (missing, _) = uncovered(&mut admin).await;
    assert_eq!(
        missing,
        [
            "function lease.drain(uuid)",
            "relation lease.drain_requests",
            "sequence lease.drain_seq",
        ],
        "the coverage check missed new objects"
    );
}

/// What a role lacks is named object by object and privilege by privilege; a role that does
/// not exist is an error of its own; granting gives exactly what was missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_privileges_name_what_a_role_lacks() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let owner = store(&db.url);
    let bare = make_role(&mut admin, &db.name, "bare", "").await;
    let bare = RoleName::new(&bare).expect("a name");
    for kind in RoleKind::ALL {
        assert_eq!(
            owner
                .missing_privileges(&bare, kind)
                .await
                .expect("missing privileges"),
            privileges::required(kind),
            "a role without grants lacks everything a {kind} needs"
        );
    }

    let granted = owner
        .grant_privileges(&bare, RoleKind::Worker)
        .await
        .expect("granting as the owner");
    assert_eq!(granted, privileges::grants(RoleKind::Worker, &bare));
    for kind in RoleKind::ALL {
        assert_eq!(
            owner
                .missing_privileges(&bare, kind)
                .await
                .expect("missing"),
            [],
            "a worker's role is a {kind} too"
        );
    }

    exec(
        &mut admin,
        &format!("REVOKE UPDATE ON lease.shards FROM {}", bare.as_str()),
    )
    .await;
    assert_eq!(
        owner
            .missing_privileges(&bare, RoleKind::Worker)
            .await
            .expect("missing"),
        [Grant {
            on: Object::Table("lease.shards"),
            privileges: vec!["UPDATE"],
        }]
    );
    // The check is read-only: the role itself may ask.
    let as_bare = store(&url_as(&db.url, bare.as_str()));
    assert_eq!(
        as_bare
            .missing_privileges(&bare, RoleKind::Monitor)
            .await
            .expect("asking about itself"),
        []
    );

    // A role that holds the privileges without the grant option cannot pass them on: Postgres
    // only warns, and nothing is granted.
    let other = RoleName::new(&make_role(&mut admin, &db.name, "other", "").await).expect("name");
    exec(
        &mut admin,
        &format!("GRANT UPDATE ON lease.shards TO {}", bare.as_str()),
    )
    .await;
    match as_bare.grant_privileges(&other, RoleKind::Worker).await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("owner of schema lease"), "{e}");
        }
        other => panic!("granting as a non-owner: got {other:?}"),
    }
    assert_eq!(
        owner
            .missing_privileges(&other, RoleKind::Worker)
            .await
            .expect("missing"),
        privileges::required(RoleKind::Worker),
        "a refused grant left something granted"
    );

    let ghost = RoleName::new(&fresh_role("ghost")).expect("a name");
    for result in [
        owner.missing_privileges(&ghost, RoleKind::Worker).await,
        owner
            .grant_privileges(&ghost, RoleKind::Worker)
            .await
            .map(|_| Vec::new()),
    ] {
        match result {
            Err(e @ PgSetupError::UnknownRole { .. }) => {
                assert!(e.to_string().contains(ghost.as_str()), "{e}")
            }
            other => panic!("an unknown role: got {other:?}"),
        }
    }
}

/// Missing, older and newer schemas, and a role that may not read the schema, are typed,
/// permanent, and say what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_mismatches_are_typed_and_say_what_to_do() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let store = store(&db.url);
    let all = engine_versions();
    let newest = all.last().expect("a migration").clone();

    exec(
        &mut admin,
        &format!("DELETE FROM lease.engine_migrations WHERE version = '{newest}'"),
    )
    .await;
    match store.check_schema().await {
        Err(e @ PgSetupError::SchemaOutdated { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("run `leasectl migrate`"), "{e}");
            let PgSetupError::SchemaOutdated { missing } = e else {
                unreachable!()
            };
            assert_eq!(missing, vec![newest.clone()]);
        }
        other => panic!("an older schema: got {other:?}"),
    }
    exec(
        &mut admin,
        &format!(
            "INSERT INTO lease.engine_migrations (version, name) VALUES \
             ('{newest}', 'back'), ('29991231000000', 'from_the_future')"
        ),
    )
    .await;
    match store.check_schema().await {
        Err(e @ PgSetupError::SchemaNewer { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("upgrade"), "{e}");
        }
        other => panic!("a newer schema: got {other:?}"),
    }
    let before = objects(&mut admin).await;
    match store.migrate().await {
        Err(PgSetupError::SchemaNewer { unknown }) => assert_eq!(unknown, ["29991231000000"]),
        other => panic!("migrate on a newer schema: got {other:?}"),
    }
    assert_eq!(objects(&mut admin).await, before);
    exec(
        &mut admin,
        "DELETE FROM lease.engine_migrations WHERE version = '29991231000000'",
    )
    .await;
    store.check_schema().await.expect("as it was");

    let role = make_role(&mut admin, &db.name, "nousage", "").await;
    match self::store(&url_as(&db.url, &role)).check_schema().await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("GRANT USAGE ON SCHEMA lease"), "{e}");
        }
        other => panic!("a role without USAGE: got {other:?}"),
    }
    // Nor may it migrate a database it cannot create a schema in.
    let empty = lease_testdb::empty_database().await;
    let mut empty_admin = connect(&empty.url).await;
    exec(
        &mut empty_admin,
        &format!("GRANT CONNECT ON DATABASE \"{}\" TO {role}", empty.name),
    )
    .await;
    match self::store(&url_as(&empty.url, &role)).migrate().await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(e.to_string().contains("may not create schemas"), "{e}")
        }
        other => panic!("migrate without CREATE: got {other:?}"),
    }
    assert!(!schema_exists(&mut empty_admin).await);
}

/// A migration with work to do on a read-only connection is refused as such, not as an
/// unreachable database; on an up-to-date one, migrating is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_read_only_database() {
    let fresh = lease_testdb::empty_database().await;
    let done = lease_testdb::database().await;
    let mut admin = connect(&fresh.url).await;
    for name in [&fresh.name, &done.name] {
        exec(
            &mut admin,
            &format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"),
        )
        .await;
    }
    match store(&fresh.url).migrate().await {
        Err(e @ PgSetupError::ReadOnly) => assert!(!e.is_transient()),
        other => panic!("migrate on a read-only database: got {other:?}"),
    }
    assert!(!schema_exists(&mut admin).await);
    assert!(store(&done.url).migrate().await.expect("no-op").is_empty());
}

// ---- fencing with EXECUTE alone ------------------------------------------------------------

async fn wait_server_past(admin: &mut AsyncPgConnection, t: Timestamp) {
    for _ in 0..2_000 {
        let past = diesel::sql_query("SELECT clock_timestamp() >= $1 AS yes")
            .bind::<Nullable<Timestamptz>, _>(Some(t))
            .get_result::<Flag>(admin)
            .await
            .expect("the server clock")
            .yes;
        if past {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the server clock did not pass {t}");
}

/// A role with the fencing privileges (USAGE on the schema and EXECUTE on `lease.is_current`,
/// no privilege on the engine's tables), gets true and false right, and its `true` still holds off a takeover of the bucket
/// past the lease's expiry, until its transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_current_needs_only_execute_and_its_lock_holds_off_a_takeover() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let role = role_of_kind(&mut admin, &db.name, "fence", RoleKind::Fencing).await;
    let mut app = connect(&url_as(&db.url, &role)).await;
    assert!(
        app.batch_execute("SELECT 1 FROM lease.shards")
            .await
            .is_err(),
        "the fencing role can read lease.shards: the test would prove nothing"
    );

    let g = group("fenced");
    let mut conn = connect(&db.url).await;
    let mut ids = [NodeId::new(), NodeId::new()];
    ids.sort();
    let [a, b] = ids;
    ops::ensure_group(&mut conn, None, &g, shards(4))
        .await
        .expect("ensure");
    let first = member_on(&mut conn, &g, a, ttl_ms(1_000)).await;
    let leases = ops::claim(&mut conn, None, &g, a, first.session, 4, Takeover::Allowed)
        .await
        .expect("a claims");
    let b_join = member_on(&mut conn, &g, b, ttl_ms(60_000)).await;
    assert!(b_join.observed_at < first.expires_at, "b joined too late");
    let lease = leases[0];

    for (bucket, token, want) in [
        (lease.bucket, lease.token, true),
        (lease.bucket, FencingToken(lease.token.0 + 1), false),
        (Bucket(99), lease.token, false),
    ] {
        let got = ops::is_current(&mut app, None, &g, bucket, a, token)
            .await
            .expect("is_current with EXECUTE alone");
        assert_eq!(got, want, "is_current({bucket:?}, {token:?})");
    }

    exec(&mut app, "BEGIN").await;
    assert!(
        ops::is_current(&mut app, None, &g, lease.bucket, a, lease.token)
            .await
            .expect("is_current in a transaction")
    );
    wait_server_past(&mut admin, first.expires_at).await;
    let taken = ops::claim(&mut conn, None, &g, b, b_join.session, 4, Takeover::Allowed)
        .await
        .expect("b claims");
    assert_eq!(taken.len(), 3, "b took the bucket being written");
    assert!(taken.iter().all(|l| l.bucket != lease.bucket));
    exec(&mut app, "COMMIT").await;
    let taken = ops::claim(&mut conn, None, &g, b, b_join.session, 4, Takeover::Allowed)
        .await
        .expect("b claims again");
    assert_eq!(
        taken.iter().map(|l| l.bucket).collect::<Vec<_>>(),
        vec![lease.bucket]
    );
    let snap = ops::snapshot(&mut conn, None, &g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.owner == Some(b) && x.state == BucketState::Live)
    );
}

/// Upgrading keeps `lease.is_current` callable for the roles that could call it before (with
/// UPDATE on lease.shards); the others need EXECUTE granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_is_current_for_the_roles_that_could_call_it() {
    let db = lease_testdb::empty_database().await;
    sync(&db.url, |c| {
        c.run_pending_migrations(LEGACY)
            .map(|v| v.len())
            .unwrap_or_else(|e| panic!("the earlier release's migrations: {e}"))
    })
    .await;
    let mut admin = connect(&db.url).await;
    let old_app = make_role(
        &mut admin,
        &db.name,
        "oldapp",
        "GRANT USAGE ON SCHEMA lease TO {role}; \
         GRANT SELECT, UPDATE ON lease.shards TO {role}; \
         GRANT SELECT ON lease.members TO {role};",
    )
    .await;
    let reader = make_role(
        &mut admin,
        &db.name,
        "reader",
        "GRANT USAGE ON SCHEMA lease TO {role}; GRANT SELECT ON lease.shards TO {role};",
    )
    .await;
    let call = "SELECT lease.is_current('g', 0, gen_random_uuid(), 1) = false AS yes";
    let mut old = connect(&url_as(&db.url, &old_app)).await;
    assert!(flag(&mut old, call).await, "before the upgrade");

    store(&db.url).migrate().await.expect("migrate");
    assert!(flag(&mut old, call).await, "after the upgrade");
    let mut read_only = connect(&url_as(&db.url, &reader)).await;
    let denied = read_only
        .batch_execute(call)
        .await
        .expect_err("a reader may take the fencing lock");
    assert!(denied.to_string().contains("permission denied"), "{denied}");
}

/// The newest migrations' versions and `down.sql`, newest first: what a test undoes to stand
/// where the previous release left the schema.
const DOWNS: &[(&str, &str)] = &[
    (
        "20261208000010",
        include_str!("../../migrations/2026-12-08-000010_draining_counts/down.sql"),
    ),
    (
        "20261207000009",
        include_str!("../../migrations/2026-12-07-000009_bucket_history/down.sql"),
    ),
    (
        "20261206000008",
        include_str!("../../migrations/2026-12-06-000008_operators_controls/down.sql"),
    ),
    (
        "20261205000007",
        include_str!("../../migrations/2026-12-05-000007_node_sessions/down.sql"),
    ),
];

/// The objects each of [`DOWNS`]' migrations added, as the privilege list names them: the
/// previous release's grants are today's without them.
const ADDED: &[(&str, &[&str])] = &[
    ("20261208000010", &[]),
    ("20261207000009", &["lease.tenures", "lease.mode_of("]),
    (
        "20261206000008",
        &[
            "lease.member_controls",
            "lease.quarantines",
            "lease.may_claim(",
            "lease.control(",
            "lease.quarantine(",
            "lease.hand_over(",
        ],
    ),
    (
        "20261205000007",
        &[
            "lease.nodes",
            "lease.group_changes",
            "lease.heartbeat(",
            "lease.group_view(",
            "lease.leave(",
            "lease.renewal_too_late(",
        ],
    ),
];

/// Undo the engine's migrations from the newest down to `version` included, each with its
/// `down.sql`, and forget their versions: the schema of the release before `version`.
async fn undo_through(admin: &mut AsyncPgConnection, version: &str) {
    for (v, down) in DOWNS {
        exec(admin, down).await;
        exec(
            admin,
            &format!("DELETE FROM lease.engine_migrations WHERE version = '{v}'"),
        )
        .await;
        if *v == version {
            return;
        }
    }
    panic!("no down.sql for {version}");
}

/// The grants of `kind` the release before migration `version` printed: today's, less the
/// objects `version` and later migrations added (the old lease.members, which migration 7
/// replaces, was granted as the new one is).
fn grants_before(kind: RoleKind, role: &RoleName, version: &str) -> Vec<String> {
    let newer: Vec<&str> = ADDED
        .iter()
        .filter(|(v, _)| *v >= version)
        .flat_map(|(_, objects)| objects.iter().copied())
        .collect();
    privileges::grants(kind, role)
        .into_iter()
        .filter(|g| !newer.iter().any(|new| g.contains(new)))
        .collect()
}

/// Migration 7 (node sessions) under its documented rollout (stop the old workers, migrate,
/// start the new ones): a worker role set up by the previous release's `leasectl grant` runs
/// the new release's heartbeats, joins and claims once migrated (the migration gives such
/// roles what the node statements use). Migration 5 did the same for its objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_worker_roles_of_the_previous_release_working() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    // The previous release's schema: migrations 8 and 7 undone.
    undo_through(&mut admin, "20261205000007").await;
    let role = make_role(&mut admin, &db.name, "oldwkr", "").await;
    let name = RoleName::new(&role).expect("a role name");
    let previous = grants_before(RoleKind::Worker, &name, "20261205000007");
    exec(&mut admin, &previous.join("\n")).await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.nodes') IS NULL AND to_regclass('lease.group_changes') IS NULL AS yes"
        )
        .await,
        "migration 7 is not undone: the test would prove nothing"
    );

    store(&db.url).migrate().await.expect("migrate");

    let worker = store(&url_as(&db.url, &role));
    let g = GroupName::new("upgraded").expect("name");
    worker
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group as the old worker role");
    let me = NodeId::new();
    let beat = support::beat_as(
        &worker,
        &g,
        me,
        lease_core::Incarnation::new(),
        Ttl::from_secs(10).expect("ttl"),
        &MemberMetadata::empty(),
    )
    .await
    .expect("a heartbeat as the old worker role");
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(won.len(), 4);
    let missing = store(&db.url)
        .missing_privileges(&name, RoleKind::Worker)
        .await
        .expect("checking the role");
    assert!(missing.is_empty(), "the role lacks {missing:?}");
}

/// Migration 8 (operators' controls) under its documented rollout: what the previous release
/// left is kept (sessions, owners, tokens; each owned bucket's last owner is its owner), its
/// `down.sql` undoes it and migrating again restores it, and roles set up by the previous
/// release's `leasectl grant` run the new release: a worker role its heartbeats, claims,
/// controls and quarantines (the migration grants them the new tables and functions, and the
/// heartbeat again, which it drops and creates), a monitor role its snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_8_keeps_the_rows_and_the_roles_of_the_previous_release() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("controlled").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(30).expect("ttl");
    // Claims from bucket 0: it holds 0 and 1.
    let held = support::worker();
    let beat = support::beat(&owner, &g, held, ttl, &MemberMetadata::empty())
        .await
        .expect("a member");
    let won = owner
        .claim(&g, held, beat.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 2);

    // The previous release's schema, and its roles.
    undo_through(&mut admin, "20261206000008").await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.member_controls') IS NULL
                    AND to_regclass('lease.quarantines') IS NULL
                    AND to_regprocedure('lease.hand_over(uuid, uuid, interval, timestamptz)')
                        IS NULL
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'shards'
                                       AND column_name IN ('last_node', 'quarantined_until'))
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'nodes'
                                       AND column_name = 'handed_over')
                    AS yes"
        )
        .await,
        "migration 8 is not undone: the test would prove nothing"
    );
    let worker_role = make_role(&mut admin, &db.name, "m8wkr", "").await;
    let monitor_role = make_role(&mut admin, &db.name, "m8mon", "").await;
    let (worker_name, monitor_name) = (
        RoleName::new(&worker_role).expect("a role name"),
        RoleName::new(&monitor_role).expect("a role name"),
    );
    let mut previous = grants_before(RoleKind::Worker, &worker_name, "20261206000008");
    previous.extend(grants_before(
        RoleKind::Monitor,
        &monitor_name,
        "20261206000008",
    ));
    exec(&mut admin, &previous.join("\n")).await;

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        ["20261206000008", "20261207000009", "20261208000010"],
        "only migrations 8, 9 and 10 (undone with it) were missing"
    );
    // From here the roles hold only what they were granted, by the previous release's grants
    // and by the migration (Postgres lets PUBLIC execute every new function by default).
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    assert!(
        flag(
            &mut admin,
            &format!(
                "SELECT count(*) FILTER (WHERE last_node = '{held}') = 2
                        AND count(*) FILTER (WHERE last_node IS NULL) = 2
                        AND bool_and(quarantined_until IS NULL) AS yes
                   FROM lease.shards WHERE group_name = 'controlled'"
            ),
        )
        .await,
        "each owned bucket's last owner is its owner, the others have none"
    );
    assert!(
        flag(
            &mut admin,
            "SELECT count(*) = 1 AND bool_and(NOT handed_over) AS yes FROM lease.nodes",
        )
        .await,
        "the previous release's session is kept, not handed over"
    );
    let snap = owner.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.live_leases()
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        won.iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        "the migration moved a bucket"
    );

    let worker = store(&url_as(&db.url, &worker_role));
    let me = NodeId::new();
    let beat = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a heartbeat as the old worker role");
    assert_eq!(beat.view.members.len(), 2);
    worker
        .control(
            &g,
            me,
            lease_core::MemberControl::Weight(lease_core::Weight::new(3).expect("weight")),
        )
        .await
        .expect("a control as the old worker role");
    worker
        .quarantine(
            &g,
            Bucket(3),
            Some(lease_core::QuarantineFor::new(Duration::from_secs(60)).expect("duration")),
        )
        .await
        .expect("a quarantine as the old worker role");
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(
        won.iter().map(|l| l.bucket).collect::<Vec<_>>(),
        [Bucket(2)],
        "the free bucket, not the quarantined one"
    );
    let view = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a view as the old worker role")
        .view;
    assert_eq!(view.quarantined, 1);
    assert_eq!(
        view.members
            .iter()
            .find(|m| m.worker == me)
            .map(|m| m.weight),
        Some(3)
    );
    let monitor = store(&url_as(&db.url, &monitor_role));
    let snap = monitor
        .snapshot(&g)
        .await
        .expect("a snapshot as the old monitor role");
    assert!(snap.buckets[3].quarantined_until.is_some());
    assert_eq!(snap.view(), view);
    // The worker role hands its session over (HO1: only the incarnation holding it), a monitor
    // role sees it handed over, and the node's next process takes it over (HO3).
    assert!(
        worker
            .hand_over(me, lease_core::Incarnation::new(), ttl)
            .await
            .expect("a hand-over as the old worker role")
            .is_none(),
        "another incarnation's session was handed over"
    );
    assert!(
        worker
            .hand_over(me, support::process(me), ttl)
            .await
            .expect("a hand-over as the old worker role")
            .is_some(),
        "the live session was not handed over"
    );
    let listed = monitor
        .nodes()
        .await
        .expect("nodes as the old monitor role");
    assert!(listed.nodes.iter().any(|n| n.node == me && n.handed_over));
    let next = worker
        .heartbeat(
            me,
            lease_core::Incarnation::new(),
            ttl,
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("the next process's heartbeat as the old worker role");
    assert_eq!((next.session, next.new_session), (beat.session, false));
    for (name, kind) in [
        (&worker_name, RoleKind::Worker),
        (&monitor_name, RoleKind::Monitor),
    ] {
        let missing = owner
            .missing_privileges(name, kind)
            .await
            .expect("checking the role");
        assert!(missing.is_empty(), "{kind} role {name} lacks {missing:?}");
    }
}

/// Migration 9 (a bucket's history), additive: it keeps every row, and each owned bucket shows
/// its current tenure with no ring row written for it (the open tenure is the bucket row: its
/// owner and token, begun at its `updated_at`, which the claim that took it wrote), none for a
/// bucket released before it; its `down.sql` undoes it; and roles set up by the previous
/// release's `leasectl grant` run the new release: a worker role's claims, releases and leaves
/// (an eviction too) end tenures into the ring (the migration grants it the table and
/// `lease.mode_of`; `lease.leave` keeps its grant), a monitor role reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_9_gives_owned_buckets_their_tenure_and_keeps_the_roles() {
    use lease_core::EndReason::{Evicted, Left, Released};
    #[derive(QueryableByName)]
    struct Claimed {
        #[diesel(sql_type = Integer)]
        bucket: i32,
        #[diesel(sql_type = Timestamptz)]
        updated_at: Timestamp,
    }
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("remembered").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(30).expect("ttl");
    let held = support::worker();
    let beat = support::beat(&owner, &g, held, ttl, &MemberMetadata::empty())
        .await
        .expect("a member");
    let won = owner
        .claim(&g, held, beat.session, 3, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 3);
    let gone = won[2].bucket;
    assert_eq!(
        owner
            .release(&g, held, beat.session, &[gone])
            .await
            .expect("release"),
        [gone]
    );
    let claimed: Vec<Claimed> = diesel::sql_query(
        "SELECT bucket, updated_at FROM lease.shards
          WHERE group_name = 'remembered' AND owner_node IS NOT NULL ORDER BY bucket",
    )
    .load(&mut admin)
    .await
    .expect("the owned buckets");
    assert_eq!(claimed.len(), 2);

    // The previous release's schema, and its roles.
    undo_through(&mut admin, "20261207000009").await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.tenures') IS NULL
                    AND to_regprocedure('lease.mode_of(text, uuid)') IS NULL
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'shards'
                                       AND column_name = 'tenures')
                    AS yes"
        )
        .await,
        "migration 9 is not undone: the test would prove nothing"
    );
    let worker_role = make_role(&mut admin, &db.name, "m9wkr", "").await;
    let monitor_role = make_role(&mut admin, &db.name, "m9mon", "").await;
    let (worker_name, monitor_name) = (
        RoleName::new(&worker_role).expect("a role name"),
        RoleName::new(&monitor_role).expect("a role name"),
    );
    let mut previous = grants_before(RoleKind::Worker, &worker_name, "20261207000009");
    previous.extend(grants_before(
        RoleKind::Monitor,
        &monitor_name,
        "20261207000009",
    ));
    exec(&mut admin, &previous.join("\n")).await;

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        ["20261207000009", "20261208000010"],
        "only migrations 9 and 10 (undone with it) were missing"
    );
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let monitor = store(&url_as(&db.url, &monitor_role));
    let history = async |bucket: Bucket| {
        monitor
            .history(&g, bucket)
            .await
            .expect("history as the old monitor role")
            .iter()
            .map(|t| (t.owner, t.token, t.began_at, t.ended.map(|e| e.reason)))
            .collect::<Vec<_>>()
    };
    for (lease, row) in won.iter().zip(&claimed) {
        assert_eq!(lease.bucket.0 as i32, row.bucket);
        assert_eq!(
            history(lease.bucket).await,
            [(held, lease.token, row.updated_at, None)],
            "owned bucket {}",
            row.bucket
        );
    }
    assert_eq!(
        history(gone).await,
        [],
        "a bucket released before the migration"
    );
    let snap = owner.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.live_leases()
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        won[..2]
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        "the migration moved a bucket"
    );

    // The old worker role: a new node claims what is free, releases one, leaves; the first
    // node is evicted.
    let worker = store(&url_as(&db.url, &worker_role));
    let me = NodeId::new();
    let beat = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a heartbeat as the old worker role");
    let mine = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(mine.len(), 2, "the two free buckets");
    assert_eq!(
        worker
            .release(&g, me, beat.session, &[mine[0].bucket])
            .await
            .expect("a release as the old worker role"),
        [mine[0].bucket]
    );
    assert_eq!(
        worker
            .leave(&g, me, beat.session)
            .await
            .expect("a leave as the old worker role"),
        [mine[1].bucket]
    );
    assert_eq!(
        worker
            .evict(&g, held)
            .await
            .expect("an eviction as the old worker role")
            .len(),
        2
    );
    let ended = |h: Vec<(NodeId, FencingToken, Timestamp, _)>| {
        h.into_iter()
            .map(|(w, t, _, e)| (w, t, e))
            .collect::<Vec<_>>()
    };
    for l in &won[..2] {
        assert_eq!(
            ended(history(l.bucket).await),
            [(held, l.token, Some(Evicted))]
        );
    }
    let reasons = [Released, Left];
    for (l, reason) in mine.iter().zip(reasons) {
        assert_eq!(
            ended(history(l.bucket).await),
            [(me, l.token, Some(reason))],
            "bucket {}",
            l.bucket.0
        );
    }
    for (name, kind) in [
        (&worker_name, RoleKind::Worker),
        (&monitor_name, RoleKind::Monitor),
    ] {
        let missing = owner
            .missing_privileges(name, kind)
            .await
            .expect("checking the role");
        assert!(missing.is_empty(), "{kind} role {name} lacks {missing:?}");
    }
}

// ---- connection failures -------------------------------------------------------------------

/// A missing database and an unknown role are permanent, a refused connection transient; each
/// message says its cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_say_their_cause_and_whether_to_retry() {
    let server = lease_testdb::server();
    let missing = format!("lease_missing_{}", std::process::id());
    let s = store(&server.url_for(&missing));
    for (what, result) in [
        ("check", s.check_schema().await),
        ("migrate", s.migrate().await.map(drop)),
    ] {
        match result {
            Err(e @ PgSetupError::DatabaseNotFound { .. }) => {
                assert!(!e.is_transient());
                let text = e.to_string();
                assert!(
                    text.contains(&missing) && text.contains("does not exist"),
                    "{text}"
                );
            }
            other => panic!("{what} on a missing database: got {other:?}"),
        }
    }

    let nobody = fresh_role("nobody"); // never created
    let db = lease_testdb::database().await;
    match store(&url_as(&db.url, &nobody)).check_schema().await {
        Err(e @ PgSetupError::AuthenticationFailed { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains(&nobody), "{e}");
        }
        other => panic!("an unknown role: got {other:?}"),
    }

    // Nothing listens on a port just given back by the kernel.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let refused = store(&format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=5"
    ));
    match refused.check_schema().await {
        Err(e @ PgSetupError::Unreachable { .. }) => {
            assert!(e.is_transient());
            let text = e.to_string();
            assert_eq!(
                text.matches("Connection refused").count(),
                1,
                "the cause, once: {text}"
            );
            assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        }
        other => panic!("a refused connection: got {other:?}"),
    }
}

// ---- versions and compatibility ----------------------------------------------------------

/// Columns, with defaults or nullable, on each of the engine's tables, and an index: what a
/// newer release might add (a drain request, a paused bucket, a group's note).
const ADD_COLUMNS: &str = "
    ALTER TABLE lease.members ADD COLUMN drain_requested_at timestamptz;
    ALTER TABLE lease.shards ADD COLUMN paused boolean NOT NULL DEFAULT false;
    ALTER TABLE lease.groups ADD COLUMN note text NOT NULL DEFAULT '';
    CREATE INDEX members_draining_idx ON lease.members (group_name)
        WHERE drain_requested_at IS NOT NULL;
";

/// A migration of a newer release, as its runner would apply it.
fn newer(version: &str, up: &str, compatibility: Compatibility) -> ExtraMigration {
    ExtraMigration {
        version: version.to_owned(),
        name: format!("{version}_test_{}", compatibility.as_str()),
        up: up.to_owned(),
        compatibility,
    }
}

fn additive() -> ExtraMigration {
    newer("29990101000001", ADD_COLUMNS, Compatibility::Additive)
}

fn breaking() -> ExtraMigration {
    newer(
        "29990101000002",
        "COMMENT ON TABLE lease.shards IS 'a breaking change, for the test'",
        Compatibility::Breaking,
    )
}

/// `version: additive` for every row of the version table.
async fn recorded(conn: &mut AsyncPgConnection) -> Vec<String> {
    names(
        conn,
        "SELECT version || ': ' || additive AS name FROM lease.engine_migrations ORDER BY version",
    )
    .await
}

/// A build accepts a schema with newer additive migrations (reporting them) and needs its own;
/// a breaking migration it does not know makes it refuse the schema, and its `migrate` writes
/// nothing. Each migration is recorded with its compatibility.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_additive_migrations_are_accepted_and_breaking_ones_refused() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let this = store(&db.url);
    let (add, brk) = (additive(), breaking());

    match this.schema_status_with(std::slice::from_ref(&add)).await {
        Err(PgSetupError::SchemaOutdated { missing }) => {
            assert_eq!(missing, std::slice::from_ref(&add.version))
        }
        other => panic!("a newer build before its migration: got {other:?}"),
    }
    assert_eq!(
        this.migrate_with(std::slice::from_ref(&add))
            .await
            .expect("the newer release migrates"),
        [add.version.as_str()]
    );
    let status = this
        .schema_status()
        .await
        .expect("this build on the newer schema");
    assert_eq!(status.newer_additive, [add.version.as_str()]);
    assert_eq!(status.applied.last(), Some(&add.version));
    this.check_schema().await.expect("check_schema accepts it");
    let before = objects(&mut admin).await;
    assert!(
        this.migrate()
            .await
            .expect("this build's migrate")
            .is_empty()
    );
    assert_eq!(objects(&mut admin).await, before, "a no-op migrate wrote");
    assert_eq!(
        this.schema_status_with(std::slice::from_ref(&add))
            .await
            .expect("the newer build")
            .newer_additive,
        Vec::<String>::new()
    );

    assert_eq!(
        this.migrate_with(&[add.clone(), brk.clone()])
            .await
            .expect("a breaking migration"),
        [brk.version.as_str()]
    );
    for (what, result) in [
        ("check", this.check_schema().await),
        ("migrate", this.migrate().await.map(drop)),
    ] {
        match result {
            Err(e @ PgSetupError::SchemaNewer { .. }) => {
                assert!(!e.is_transient());
                let text = e.to_string();
                assert!(
                    text.contains(&brk.version) && text.contains("upgrade"),
                    "{text}"
                );
                assert!(
                    !text.contains(&add.version),
                    "an additive one is named: {text}"
                );
            }
            other => panic!("{what} with a newer breaking migration: got {other:?}"),
        }
    }
    let before = objects(&mut admin).await;
    let versions = recorded(&mut admin).await;
    assert!(matches!(
        this.migrate().await,
        Err(PgSetupError::SchemaNewer { .. })
    ));
    assert_eq!(objects(&mut admin).await, before);
    assert_eq!(recorded(&mut admin).await, versions);
    this.schema_status_with(&[add.clone(), brk.clone()])
        .await
        .expect("the build that knows it");

    let mut want: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .expect("the migrations")
        .iter()
        .map(|m| {
            let name = m.name().to_string();
            // As the migrations' first lines say.
            let additive = !["create_lease_schema", "node_sessions", "operators_controls"]
                .iter()
                .any(|breaking| name.ends_with(breaking));
            format!("{}: {additive}", m.name().version())
        })
        .collect();
    want.sort();
    want.push(format!("{}: true", add.version));
    want.push(format!("{}: false", brk.version));
    assert_eq!(recorded(&mut admin).await, want);
}

/// A version table made before migrations carried their compatibility (no `additive`
/// column) still serves the check; its rows count as breaking to a build that does not know
/// them; it gets the column when a runner next records a migration, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_table_from_before_the_rule_gets_its_column_when_a_migration_is_recorded() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "ALTER TABLE lease.engine_migrations DROP COLUMN additive",
    )
    .await;
    let has_column = "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                       WHERE table_schema = 'lease' AND table_name = 'engine_migrations'
                         AND column_name = 'additive') AS yes";
    let this = store(&db.url);
    this.check_schema().await.expect("an old version table");
    assert!(this.migrate().await.expect("nothing to do").is_empty());
    assert!(
        !flag(&mut admin, has_column).await,
        "a no-op migrate altered it"
    );

    exec(
        &mut admin,
        "INSERT INTO lease.engine_migrations (version, name) VALUES ('29990101000009', 'old')",
    )
    .await;
    match this.check_schema().await {
        Err(PgSetupError::SchemaNewer { unknown }) => assert_eq!(unknown, ["29990101000009"]),
        other => panic!("an unknown row without a compatibility: got {other:?}"),
    }
    exec(
        &mut admin,
        "DELETE FROM lease.engine_migrations WHERE version = '29990101000009'",
    )
    .await;

    let add = additive();
    assert_eq!(
        this.migrate_with(std::slice::from_ref(&add))
            .await
            .expect("migrate"),
        [add.version.as_str()]
    );
    assert!(flag(&mut admin, has_column).await);
    let rows = recorded(&mut admin).await;
    assert_eq!(rows.last(), Some(&format!("{}: true", add.version)));
    assert!(
        rows[..rows.len() - 1]
            .iter()
            .all(|r| r.ends_with(": false"))
    );
    assert_eq!(
        this.schema_status().await.expect("check").newer_additive,
        [add.version]
    );
}

/// Every statement of the engine, prepared on a connection before columns are added to each
/// of its tables, runs on that connection afterwards: they name their columns, so a cached
/// plan never changes its result type ("cached plan must not change result type").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_statements_survive_added_columns_on_connections_that_prepared_them() {
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let g = group("prepared");
    let me = NodeId::new();
    let round = async |conn: &mut AsyncPgConnection| {
        // Twice: creating, then finding the group, are two statements.
        for _ in 0..2 {
            ops::ensure_group(conn, None, &g, shards(4))
                .await
                .expect("ensure");
        }
        let beat = member_on(conn, &g, me, ttl_ms(30_000)).await;
        // A full view, then the same group answered "unchanged" (H8's path).
        let full = ops::heartbeat(
            conn,
            None,
            me,
            process(me),
            ttl_ms(30_000),
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("heartbeat with a view");
        let seen: Vec<lease_core::GroupStamp> = full
            .groups
            .iter()
            .map(|b| lease_core::GroupStamp {
                group: b.group.clone(),
                stamp: b.stamp,
            })
            .collect();
        let steady = ops::heartbeat(
            conn,
            None,
            me,
            process(me),
            ttl_ms(30_000),
            &MemberMetadata::empty(),
            &seen,
        )
        .await
        .expect("a steady heartbeat");
        assert_eq!(steady.unchanged.len(), 1, "the steady heartbeat's answer");
        let won = ops::claim(conn, None, &g, me, beat.session, 4, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), 4);
        assert!(
            ops::is_current(conn, None, &g, won[0].bucket, me, won[0].token)
                .await
                .expect("is_current")
        );
        ops::release(conn, None, &g, me, beat.session, &[won[0].bucket])
            .await
            .expect("release");
        let snap = ops::snapshot(conn, None, &g).await.expect("snapshot");
        assert_eq!(snap.members.len(), 1);
        let nodes = ops::nodes(conn, None).await.expect("nodes");
        assert!(!nodes.nodes.is_empty(), "the node is listed");
        ops::leave(conn, None, &g, me, beat.session)
            .await
            .expect("leave");
    };
    round(&mut conn).await;
    store(&db.url)
        .migrate_with(&[additive()])
        .await
        .expect("the additive migration");
    round(&mut conn).await;
    round(&mut conn).await;
}

/// Runners of this build and of a newer one, and checks, at once on a migrated database: the
/// newer migration is applied once, every runner and check succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runners_of_two_releases_and_checks() {
    let db = lease_testdb::database().await;
    let add = additive();
    let mut tasks = Vec::new();
    for i in 0..9 {
        let (s, add) = (store(&db.url), add.clone());
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => s.migrate_with(&[add]).await,
                1 => s.migrate().await,
                _ => s.check_schema().await.map(|()| Vec::new()),
            }
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(
            t.await
                .expect("task")
                .expect("a concurrent runner or check"),
        );
    }
    assert_eq!(applied, [add.version.as_str()]);
    let mut admin = connect(&db.url).await;
    assert_eq!(
        recorded(&mut admin)
            .await
            .iter()
            .filter(|r| r.starts_with(&add.version))
            .count(),
        1
    );
}

/// Old rows of `lease.draining_shards` read (index entries and sequential reads) by `node`'s
/// heartbeat giving every view, on `conn` in a transaction of its own, and the view's count of
/// old buckets not retired in `g`.
async fn draining_seen_by(
    conn: &mut AsyncPgConnection,
    g: &GroupName,
    node: NodeId,
    ttl: Ttl,
) -> (u32, i64) {
    #[derive(QueryableByName)]
    struct Read {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    const READ: &str = "SELECT (pg_stat_get_xact_tuples_returned('lease.draining_shards'::regclass)
                               + (SELECT COALESCE(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)
                                    FROM pg_index i
                                   WHERE i.indrelid = 'lease.draining_shards'::regclass))::bigint
                              AS n";
    exec(conn, "BEGIN").await;
    let before = diesel::sql_query(READ)
        .get_result::<Read>(conn)
        .await
        .expect("rows read")
        .n;
    let beat = ops::heartbeat(
        conn,
        None,
        node,
        process(node),
        ttl,
        &MemberMetadata::empty(),
        &[],
    )
    .await
    .expect("heartbeat");
    let after = diesel::sql_query(READ)
        .get_result::<Read>(conn)
        .await
        .expect("rows read")
        .n;
    exec(conn, "COMMIT").await;
    (beat.group(g).expect("a view").view.draining, after - before)
}

/// Migration 10 under its documented rollout, in the middle of a drain: member rows get the
/// count of their sessions' old buckets, so the view's `draining` is the same before and after
/// the migration and no longer reads the others' old rows; its `down.sql` gives back the
/// previous view. A member whose count is not of the group's generation (as a resize by a
/// binary of the previous release leaves it) is counted row by row, rightly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_10_counts_the_old_buckets_of_a_drain_in_progress() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("merging").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(64).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(600).expect("ttl");
    let (a, b, idle) = (support::worker(), support::worker(), support::worker());
    for w in [a, b, idle] {
        member_on(&mut admin, &g, w, ttl).await;
    }
    for w in [a, b] {
        let session = support::beat(&owner, &g, w, ttl, &MemberMetadata::empty())
            .await
            .expect("heartbeat")
            .session;
        let won = owner
            .claim(&g, w, session, 32, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), 32);
    }
    owner
        .resize(
            &g,
            ShardCount::new(64).expect("count"),
            ShardCount::new(4).expect("count"),
        )
        .await
        .expect("resize");
    let a_beat = support::beat(&owner, &g, a, ttl, &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    let some: Vec<Bucket> = a_beat.owned.iter().take(5).map(|l| l.bucket).collect();
    assert_eq!(
        owner
            .release(&g, a, a_beat.session, &some)
            .await
            .expect("release"),
        some
    );

    undo_through(&mut admin, "20261208000010").await;
    assert!(
        flag(
            &mut admin,
            "SELECT NOT EXISTS (SELECT 1 FROM information_schema.columns
                                 WHERE table_schema = 'lease' AND table_name = 'members'
                                   AND column_name IN ('old_owned', 'old_generation')) AS yes"
        )
        .await,
        "migration 10 is not undone: the test would prove nothing"
    );
    let (counted, read) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59);
    assert!(
        read >= 59,
        "the previous view counts the old rows: {read} read"
    );

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        ["20261208000010"],
        "only migration 10 was missing"
    );
    let (counted, read) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59, "the counts the migration set");
    assert!(read <= 4, "{read} old rows read with the counts set");

    // A count of another generation is not used: the member's rows are counted.
    exec(
        &mut admin,
        &format!(
            "UPDATE lease.members SET old_owned = 1000, old_generation = NULL
              WHERE node_id = '{}'",
            b.as_uuid()
        ),
    )
    .await;
    let (counted, _) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59, "a count of no known generation was used");
}
