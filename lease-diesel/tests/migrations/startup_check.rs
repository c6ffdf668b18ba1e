//! The start-up check writes nothing: not on a fresh database, not while runners migrate it,
//! and a runner waiting for the migration lock holds no snapshot.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::Integer;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_diesel::PgSetupError;

use crate::db::{connect, engine_versions, exec, flag, objects, store};

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
