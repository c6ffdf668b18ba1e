//! What the families share: connections and the store on the test database, diesel's
//! synchronous harness, the engine's migrations (and the earlier release's), queries of the
//! catalog, the server clock, and a member's session.

use std::collections::BTreeSet;
use std::time::Duration;

use diesel::QueryableByName;
use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel::sql_types::{Bool, Nullable, Text, Timestamptz};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::{EmbeddedMigrations, embed_migrations};
use lease_core::{GroupName, MemberMetadata, NodeId, ShardCount, Timestamp, Ttl};
use lease_diesel::{MIGRATIONS, PgLeaseStore, ops};

use crate::support::process;

pub type SyncConn = AsyncConnectionWrapper<AsyncPgConnection>;

pub async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

pub async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

pub fn store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
}

/// Run `f` on a synchronous connection to `url` (diesel's migration harness is synchronous).
pub async fn sync<T, F>(url: &str, f: F) -> T
where
    T: Send + 'static,
    F: FnOnce(&mut SyncConn) -> T + Send + 'static,
{
    let conn = connect(url).await;
    tokio::task::spawn_blocking(move || f(&mut SyncConn::from(conn)))
        .await
        .expect("the blocking task")
}

/// The engine's migrations as the earlier release shipped and ran them (through diesel's
/// harness, into the application's table, creating the schema with IF NOT EXISTS).
pub const LEGACY: EmbeddedMigrations = embed_migrations!("tests/fixtures/legacy_migrations");

/// The versions of the engine's migrations in this build, in order.
pub fn engine_versions() -> Vec<String> {
    let mut v: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .expect("the embedded migrations")
        .iter()
        .map(|m| m.name().version().to_string())
        .collect();
    v.sort();
    v
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

pub async fn names(conn: &mut AsyncPgConnection, sql: &str) -> Vec<String> {
    diesel::sql_query(sql)
        .load::<Name>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .map(|n| n.name)
        .collect()
}

pub async fn flag(conn: &mut AsyncPgConnection, sql: &str) -> bool {
    diesel::sql_query(sql)
        .get_result::<Flag>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .yes
}

/// Every schema, relation (tables, indexes, sequences, their types' relations), function and
/// type outside the system schemas: what a read-only operation must leave as it found.
pub async fn objects(conn: &mut AsyncPgConnection) -> BTreeSet<String> {
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

pub async fn relation_exists(conn: &mut AsyncPgConnection, name: &str) -> bool {
    flag(
        conn,
        &format!("SELECT to_regclass('{name}') IS NOT NULL AS yes"),
    )
    .await
}

pub async fn schema_exists(conn: &mut AsyncPgConnection) -> bool {
    flag(
        conn,
        "SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = 'lease') AS yes",
    )
    .await
}

pub async fn wait_server_past(admin: &mut AsyncPgConnection, t: Timestamp) {
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

pub fn group(name: &str) -> GroupName {
    GroupName::new(name).expect("a group name")
}

pub fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a shard count")
}

pub fn ttl_ms(ms: u64) -> Ttl {
    Ttl::new(Duration::from_millis(ms)).expect("a ttl")
}

/// Node `w` starts its session on `conn` and joins `g`: the heartbeat that started it.
pub async fn member_on(
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
