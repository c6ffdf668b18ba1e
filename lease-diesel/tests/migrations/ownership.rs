//! The engine owns its schema: it refuses a `lease` schema it did not create, adopts no
//! lookalike tables, and its down migrations drop only its own objects.

use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use lease_diesel::{MIGRATIONS, PgSetupError};

use crate::db::{connect, exec, flag, names, objects, relation_exists, schema_exists, store, sync};

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
