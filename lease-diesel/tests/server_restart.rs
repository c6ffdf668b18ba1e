//! The database server going away and coming back, on the server's clock: while it is down
//! every operation fails with a typed `Backend` error within the configured timeout; once it is
//! back the store recovers on its own within a few attempts, and the worker's session and
//! leases are intact (the ttl has not passed).
//!
//! This is the only test of its file on purpose: each integration test file is a process of
//! its own with a cluster of its own, and stopping the server would break any other test
//! running beside this one. With `DATABASE_URL` set it fails: an external server is not its
//! to stop.

mod support;

use support::{ok_or_backend, process, tokens};

use std::time::{Duration, Instant};

use lease_core::{
    AdminStore, Bucket, ErrorKind, FencingToken, GroupName, MemberMetadata, ShardCount, Takeover,
    Ttl, WorkerStore,
};
use lease_diesel::PgLeaseStore;
use lease_testdb::Cluster;

/// Starts the server again if the test fails while it is stopped, so the failure is reported
/// as it happened rather than as a hang elsewhere.
struct ResumeOnDrop(Option<&'static Cluster>);

impl Drop for ResumeOnDrop {
    fn drop(&mut self) {
        if let Some(own) = self.0.take()
            && let Err(e) = own.resume()
        {
            eprintln!("resuming the server after a failure: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stop_and_resume_keeps_ownership() {
    let server = lease_testdb::server();
    // Passing here would claim a check that never ran; libtest cannot mark a test ignored at
    // run time, so it fails and says what to do.
    let Some(own) = server.own() else {
        panic!(
            "this test stops and restarts the database server, so it needs a server of its \
             own: unset DATABASE_URL to let it start one (the other tests can use an external \
             server)"
        );
    };

    const POOL: usize = 4;
    let timeout = Duration::from_secs(1);
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(POOL)
        .timeout(timeout)
        .build()
        .expect("a store on the test database");
    let g = GroupName::new("restart").expect("a valid group name");
    let me = support::worker();
    let ttl = Ttl::from_secs(30).expect("a valid ttl");
    let meta = MemberMetadata::empty();
    store
        .ensure_group(&g, ShardCount::new(8).expect("a valid shard count"))
        .await
        .expect("ensure_group");
    let first = support::beat_as(&store, &g, me, process(me), ttl, &meta)
        .await
        .expect("heartbeat");
    let won = store
        .claim(&g, me, first.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(tokens(&won), vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    // Several pooled connections, all of them open when the server goes away.
    let (a, b, c) = tokio::join!(
        store.snapshot(&g),
        store.is_current(&g, Bucket(0), me, FencingToken(1)),
        support::beat_as(&store, &g, me, process(me), ttl, &meta),
    );
    assert!(a.is_ok() && b.is_ok() && c.is_ok());
    assert!(
        store.pool().status().size >= 2,
        "several pooled connections"
    );

    // Stop the server (fast shutdown: the connections are cut).
    let mut guard = ResumeOnDrop(Some(own));
    tokio::task::spawn_blocking(|| own.stop())
        .await
        .expect("the stop task")
        .expect("stopping the server");

    // Every operation fails with a Backend error, and within the configured timeout (plus
    // slack for a loaded machine). Twice over: the pool does not get stuck either way.
    let bound = timeout + Duration::from_secs(2);
    for pass in 1..=2 {
        macro_rules! fails {
            ($what:literal, $op:expr) => {{
                let started = Instant::now();
                let result = $op.await;
                let took = started.elapsed();
                match result {
                    Err(e) if e.kind() == ErrorKind::Backend => {}
                    other => panic!(
                        "pass {pass}, {} with the server stopped: expected a Backend error, \
                         got {other:?}",
                        $what
                    ),
                }
                assert!(
                    took <= bound,
                    "pass {pass}, {}: took {took:?} to fail, the timeout is {timeout:?}",
                    $what
                );
            }};
        }
        fails!(
            "heartbeat",
            support::beat_as(&store, &g, me, process(me), ttl, &meta)
        );
        fails!(
            "claim",
            store.claim(&g, me, first.session, 4, Takeover::Allowed)
        );
        fails!(
            "release",
            store.release(&g, me, first.session, &[Bucket(0)])
        );
        fails!("snapshot", store.snapshot(&g));
        fails!(
            "is_current",
            store.is_current(&g, Bucket(0), me, FencingToken(1))
        );
        fails!(
            "ensure_group",
            store.ensure_group(&g, ShardCount::new(8).expect("a valid shard count"))
        );
    }

    // Start it again: operations recover within a bounded number of attempts.
    let resumed = tokio::task::spawn_blocking(|| own.resume())
        .await
        .expect("the resume task");
    guard.0 = None;
    resumed.expect("starting the server again");
    let mut attempts = 0;
    let beat = loop {
        attempts += 1;
        let result = support::beat_as(&store, &g, me, process(me), ttl, &meta).await;
        if ok_or_backend("heartbeat after resume", &result) {
            break result.expect("checked");
        }
        assert!(attempts < 20, "no recovery in {attempts} attempts");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("recovered after {attempts} heartbeat attempt(s)");

    // Ownership is intact: the same session, the same buckets with the same tokens.
    assert_eq!(beat.session, first.session, "the same session");
    assert!(!beat.new_session);
    assert_eq!(tokens(&beat.owned), tokens(&won));
    for lease in &won {
        assert!(
            store
                .is_current(&g, lease.bucket, me, lease.token)
                .await
                .expect("is_current after recovery")
        );
    }
    let snap = store.snapshot(&g).await.expect("snapshot after recovery");
    assert_eq!(tokens(&snap.live_leases()), tokens(&won));
    // And the store works in full again: the remaining buckets can be claimed.
    let rest = store
        .claim(&g, me, beat.session, 8, Takeover::Allowed)
        .await
        .expect("claim after recovery");
    assert_eq!(tokens(&rest), vec![(4, 1), (5, 1), (6, 1), (7, 1)]);
}
