//! The subscription example (`examples/subscription.rs`) end to end on Postgres: three
//! consumer processes share a group of 4 buckets while events are appended; one is SIGKILLed
//! mid-stream; the group is resized online to 6 buckets (a new bucket has two parents);
//! more events are appended. Every event must be handled exactly once, by the bucket its
//! stream belongs to in the generation that handled it. Waits poll with deadlines.
//!
//! The example's binary is built by `cargo test` (examples are built with the tests); run
//! alone, this test needs `cargo build --example subscription` first.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, ResizeOutcome};
use lease::{GroupName, ShardCount};

const GROUP: &str = "subscription";

/// The example's binary, next to this test's (`target/<profile>/examples/subscription`).
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's path");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps/<test>");
    let path = profile.join("examples").join("subscription");
    let built = std::fs::metadata(&path).and_then(|m| m.modified());
    let source = std::fs::metadata(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/subscription.rs"
    ))
    .and_then(|m| m.modified())
    .expect("the example's source");
    assert!(
        built.is_ok_and(|built| built >= source),
        "{} is missing or older than its source: `cargo test` builds it, or \
         `cargo build --example subscription`",
        path.display()
    );
    path
}

struct Consumer(Child);

impl Consumer {
    fn start(url: &str, logs: &std::path::Path, n: usize) -> Self {
        let log = |kind: &str| {
            std::fs::File::create(logs.join(format!("consumer-{n}.{kind}"))).expect("a log file")
        };
        let child = Command::new(example())
            .arg("consume")
            .env("DATABASE_URL", url)
            .env("LEASE_GROUP", GROUP)
            .env("LEASE_SHARDS", "4")
            .env("LEASE_TTL_MS", "2000")
            .env("LEASE_RENEW_MS", "500")
            .stdout(Stdio::from(log("out")))
            .stderr(Stdio::from(log("err")))
            .spawn()
            .expect("starting a consumer");
        Self(child)
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.0.id().to_string()])
            .status()
            .expect("kill(1)");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGTERM, then the exit status within `limit`.
    fn stop(mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.0.try_wait().expect("waiting") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "a consumer did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(url: &str, args: &[&str]) {
    let out = Command::new(example())
        .args(args)
        .env("DATABASE_URL", url)
        .output()
        .expect("running the example");
    assert!(
        out.status.success(),
        "subscription {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// Wait until every event appended so far was handled (at least once).
async fn until_all_handled(conn: &mut AsyncPgConnection, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let missing = count(
            conn,
            "SELECT count(*) AS n FROM app.events e
              WHERE NOT EXISTS (SELECT 1 FROM app.handled h WHERE h.event_id = e.id)",
        )
        .await;
        if missing == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} events still unhandled after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_is_handled_exactly_once_across_a_kill_and_a_resize() {
    let db = lease_testdb::database().await;
    let logs = std::env::temp_dir().join(format!("lease-subscription-{}", std::process::id()));
    std::fs::create_dir_all(&logs).expect("a log directory");
    run(&db.url, &["setup"]);
    run(&db.url, &["append", "400"]);
    let mut consumers: Vec<Consumer> = (0..3).map(|n| Consumer::start(&db.url, &logs, n)).collect();
    let mut conn = AsyncPgConnection::establish(&db.url)
        .await
        .expect("a connection");
    until_all_handled(&mut conn, Duration::from_secs(30)).await;

    // A consumer dies mid-stream: its buckets expire and the others go on from its
    // checkpoints.
    run(&db.url, &["append", "300"]);
    let killed = consumers.remove(1);
    killed.signal("KILL");
    drop(killed);
    run(&db.url, &["append", "300"]);
    until_all_handled(&mut conn, Duration::from_secs(30)).await;

    // Online from 4 to 6 buckets: each new bucket continues from two old ones.
    run(&db.url, &["append", "200"]);
    let store = PgLeaseStore::builder(db.url.clone())
        .build()
        .expect("a store");
    let group = GroupName::new(GROUP).expect("name");
    let n = |c| ShardCount::new(c).expect("count");
    assert!(matches!(
        store.resize(&group, n(4), n(6)).await.expect("resize"),
        ResizeOutcome::Started { .. }
    ));
    run(&db.url, &["append", "300"]);
    until_all_handled(&mut conn, Duration::from_secs(60)).await;

    let events = count(&mut conn, "SELECT count(*) AS n FROM app.events").await;
    assert_eq!(events, 1500);
    let handled = count(&mut conn, "SELECT count(*) AS n FROM app.handled").await;
    let twice = count(
        &mut conn,
        "SELECT count(*) AS n FROM (SELECT event_id FROM app.handled
                                    GROUP BY event_id HAVING count(*) > 1) d",
    )
    .await;
    assert_eq!(
        (handled, twice),
        (events, 0),
        "{handled} handlings of {events} events, {twice} events handled more than once"
    );
    let misrouted = count(
        &mut conn,
        "SELECT count(*) AS n FROM app.handled h JOIN app.events e ON e.id = h.event_id
          WHERE e.key_hash % h.shards <> h.bucket",
    )
    .await;
    assert_eq!(
        misrouted, 0,
        "events handled by a bucket not of their stream"
    );
    let after_resize = count(
        &mut conn,
        "SELECT count(*) AS n FROM app.handled WHERE shards = 6",
    )
    .await;
    assert!(
        after_resize > 0,
        "no event was handled by the new generation"
    );
    for consumer in consumers {
        let status = consumer.stop(Duration::from_secs(10));
        assert!(status.success(), "a consumer ended with {status}");
    }
    let _ = std::fs::remove_dir_all(&logs);
}
