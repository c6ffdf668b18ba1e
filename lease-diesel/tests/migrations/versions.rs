//! The engine's versions are its own: they stay out of the application's diesel table, and a
//! deployment of the earlier release, which kept them there, is adopted.

use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel_async::AsyncPgConnection;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use lease_core::{AdminStore, MemberMetadata, NodeId, WorkerStore};
use lease_diesel::PgSetupError;

use crate::db::{
    LEGACY, connect, engine_versions, exec, group, names, relation_exists, shards, store, sync,
    ttl_ms,
};
use crate::support;

/// A host application's own diesel migrations (dated before the engine's).
const APP: EmbeddedMigrations = embed_migrations!("tests/fixtures/app_migrations");

/// The version of the app's one migration.
const APP_VERSION: &str = "20200101000001";

fn legacy_versions() -> Vec<String> {
    MigrationSource::<Pg>::migrations(&LEGACY)
        .expect("the legacy migrations")
        .iter()
        .map(|m| m.name().version().to_string())
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
