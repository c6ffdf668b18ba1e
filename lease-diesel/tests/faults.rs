//! Faults on real Postgres, on the server's clock: an unreachable server gives typed
//! `Backend` errors (never a panic), hostile group names are plain data, and connections
//! killed under the store's pool are replaced without losing the worker's session or leases.
//!
//! Stopping and restarting the server is in `server_restart.rs`: every test of a file shares
//! one cluster, so a stopped server would break the other tests here.

mod support;

use support::{expect_backend, ok_or_backend, process, tokens};

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_core::{
    AdminStore, BackendFailure, Bucket, BucketState, Change, FencingToken, GroupName,
    MemberMetadata, SessionId, ShardCount, StoreError, Takeover, Ttl, WorkerStore,
};
use lease_diesel::{PgLeaseStore, PgSetupError};

fn group(name: &str) -> GroupName {
    GroupName::new(name).expect("a valid group name")
}

fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a valid shard count")
}

fn ttl(secs: u64) -> Ttl {
    Ttl::from_secs(secs).expect("a valid ttl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_gives_backend_errors() {
    let timeout = Duration::from_secs(1);
    // A socket directory that does not exist: nothing listens there.
    let store = PgLeaseStore::builder("host=/nonexistent-dir port=5432 user=postgres dbname=x")
        .max_connections(2)
        .timeout(timeout)
        .build()
        .expect("building a store makes no connection");
    let g = group("unreachable");
    let me = support::worker();
    // Generous: the failure is a refused connection, it should come at once; it must not
    // take much more than the configured timeout in any case.
    let bound = timeout + Duration::from_secs(4);

    macro_rules! fails_fast {
        ($what:literal, $op:expr) => {{
            let started = Instant::now();
            let message = expect_backend($what, $op.await);
            let took = started.elapsed();
            assert!(took <= bound, "{}: took {took:?} to fail", $what);
            assert!(!message.is_empty(), "{}: an empty error message", $what);
        }};
    }

    fails_fast!("ensure_group", store.ensure_group(&g, shards(4)));
    fails_fast!(
        "heartbeat",
        support::beat_as(
            &store,
            &g,
            me,
            process(me),
            ttl(30),
            &MemberMetadata::empty()
        )
    );
    fails_fast!(
        "claim",
        store.claim(&g, me, SessionId::new(), 4, Takeover::Allowed)
    );
    fails_fast!(
        "release",
        store.release(&g, me, SessionId::new(), &[Bucket(0)])
    );
    fails_fast!("leave", store.evict(&g, me));
    fails_fast!("snapshot", store.snapshot(&g));
    fails_fast!(
        "is_current",
        store.is_current(&g, Bucket(0), me, FencingToken(1))
    );
    fails_fast!("changes", store.changes(&g));
    // Asking again fails the same way: nothing is cached in a broken state.
    fails_fast!(
        "heartbeat (again)",
        support::beat_as(
            &store,
            &g,
            me,
            process(me),
            ttl(30),
            &MemberMetadata::empty()
        )
    );

    let started = Instant::now();
    match store.check_schema().await {
        Err(PgSetupError::Unreachable { message }) => assert!(!message.is_empty()),
        other => panic!("check_schema: expected PgSetupError::Unreachable, got {other:?}"),
    }
    match store.migrate().await {
        Err(PgSetupError::Unreachable { .. }) => {}
        other => panic!("migrate: expected PgSetupError::Unreachable, got {other:?}"),
    }
    assert!(started.elapsed() <= 2 * bound, "the setup calls hung");
}

#[derive(QueryableByName, Debug)]
struct NameRow {
    #[diesel(sql_type = Text)]
    name: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_group_names_are_plain_data_on_the_server_clock() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .build()
        .expect("a store on the test database");
    let names = [
        r#"it's a "quoted" \ name"#,
        "グループ — ñandú 🦀 Ω",
        "x'); DROP TABLE lease.shards; SELECT ('",
    ];
    let metadata =
        MemberMetadata::new("host='a'; DELETE FROM lease.members; -- ✓").expect("valid metadata");
    let me = support::worker();
    for (i, name) in names.iter().enumerate() {
        let g = group(name);
        let n = 3 + i as u32; // a count of its own, to tell the groups apart
        store
            .ensure_group(&g, shards(n))
            .await
            .expect("ensure_group");
        store
            .ensure_group(&g, shards(n))
            .await
            .expect("ensure_group again");
        let beat = support::beat_as(&store, &g, me, process(me), ttl(30), &metadata)
            .await
            .expect("heartbeat");
        // One session for the node, started by its first heartbeat, whatever its groups.
        assert_eq!(beat.new_session, i == 0);
        assert_eq!(beat.view.shard_count.get(), n);
        assert_eq!(beat.view.claimable, n);
        let won = store
            .claim(&g, me, beat.session, 2, Takeover::Allowed)
            .await
            .expect("claim");
        let won: Vec<(u32, i64)> = won.iter().map(|l| (l.bucket.0, l.token.0)).collect();
        assert_eq!(won, vec![(0, 1), (1, 1)], "claim in group {name:?}");
    }
    for (i, name) in names.iter().enumerate() {
        let g = group(name);
        let snap = store.snapshot(&g).await.expect("snapshot");
        assert_eq!(snap.group.as_str(), *name);
        assert_eq!(snap.shard_count.get(), 3 + i as u32);
        assert_eq!(snap.members.len(), 1);
        assert_eq!(snap.members[0].worker, me);
        assert_eq!(snap.members[0].metadata, metadata);
        assert_eq!(snap.members[0].owned, 2);
        let live: Vec<u32> = snap.live_leases().iter().map(|l| l.bucket.0).collect();
        assert_eq!(live, vec![0, 1], "live leases in group {name:?}");
        assert!(
            store
                .is_current(&g, Bucket(1), me, FencingToken(1))
                .await
                .expect("is_current")
        );
    }
    // The names are stored byte for byte, and the SQL in them ran nowhere.
    let mut conn = AsyncPgConnection::establish(&db.url)
        .await
        .expect("a direct connection");
    let stored: BTreeSet<String> = diesel::sql_query("SELECT name FROM lease.groups")
        .load::<NameRow>(&mut conn)
        .await
        .expect("reading lease.groups")
        .into_iter()
        .map(|r| r.name)
        .collect();
    let expected: BTreeSet<String> = names.iter().map(|n| (*n).to_owned()).collect();
    assert_eq!(stored, expected);
}

#[derive(QueryableByName, Debug)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The store's connections to `db`: every backend on it but the asking one.
async fn other_backends(conn: &mut AsyncPgConnection, db: &str) -> i64 {
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity \
          WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind::<Text, _>(db)
    .get_result::<CountRow>(conn)
    .await
    .expect("counting backends")
    .n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_are_replaced_and_ownership_survives() {
    const POOL: usize = 4;
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(POOL)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a store on the test database");
    let g = group("terminated");
    let me = support::worker();
    let meta = MemberMetadata::empty();
    store
        .ensure_group(&g, shards(8))
        .await
        .expect("ensure_group");
    let first = support::beat_as(&store, &g, me, process(me), ttl(30), &meta)
        .await
        .expect("heartbeat");
    let won = store
        .claim(&g, me, first.session, 3, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(tokens(&won), vec![(0, 1), (1, 1), (2, 1)]);

    let mut admin = AsyncPgConnection::establish(&db.url)
        .await
        .expect("an admin connection");

    for round in 1..=2 {
        // Fill the pool: hold every connection at once, then run operations concurrently on
        // them, so that every pooled connection has run statements (and prepared them).
        let held = futures_util::future::join_all((0..POOL).map(|_| store.pool().get())).await;
        assert!(
            held.iter().all(Result::is_ok),
            "checking out {POOL} connections"
        );
        drop(held);
        let (a, b, c, d) = tokio::join!(
            support::beat_as(&store, &g, me, process(me), ttl(30), &meta),
            store.snapshot(&g),
            store.is_current(&g, Bucket(0), me, FencingToken(1)),
            store.claim(&g, me, first.session, 0, Takeover::Allowed),
        );
        assert!(a.is_ok() && b.is_ok() && c.is_ok() && d.is_ok());
        assert_eq!(store.pool().status().size, POOL, "the pool is full");
        assert_eq!(
            other_backends(&mut admin, &db.name).await,
            POOL as i64,
            "round {round}: the store's connections before termination"
        );

        admin
            .batch_execute(&format!(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                  WHERE datname = '{}' AND pid <> pg_backend_pid()",
                db.name
            ))
            .await
            .expect("terminating the store's connections");
        // Termination is asynchronous. In round 1, wait (bounded) until the backends are
        // gone; in round 2, go on at once and race the store's operations against it.
        if round == 1 {
            let deadline = Instant::now() + Duration::from_secs(10);
            while other_backends(&mut admin, &db.name).await > 0 {
                assert!(
                    Instant::now() < deadline,
                    "round {round}: the terminated backends did not go away"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }

        // Operations now, concurrently, on whatever the pool hands out: each one succeeds
        // or fails with a Backend error.
        let (a, b, c, d) = tokio::join!(
            support::beat_as(&store, &g, me, process(me), ttl(30), &meta),
            store.snapshot(&g),
            store.is_current(&g, Bucket(0), me, FencingToken(1)),
            store.claim(&g, me, first.session, 0, Takeover::Allowed),
        );
        let ok = [
            ok_or_backend("heartbeat", &a),
            ok_or_backend("snapshot", &b),
            ok_or_backend("is_current", &c),
            ok_or_backend("claim", &d),
        ];
        eprintln!("round {round}: right after termination, ok = {ok:?}");

        // Within a few attempts, operations succeed again, and the worker still has its
        // session and its leases: the ttl (30 s) has not passed.
        let mut attempts = 0;
        let beat = loop {
            attempts += 1;
            let result = support::beat_as(&store, &g, me, process(me), ttl(30), &meta).await;
            if ok_or_backend("heartbeat", &result) {
                break result.expect("checked");
            }
            assert!(
                attempts < 10,
                "round {round}: no recovery in {attempts} attempts"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        eprintln!("round {round}: recovered after {attempts} heartbeat attempt(s)");
        assert_eq!(beat.session, first.session, "the same session");
        assert!(!beat.new_session);
        assert_eq!(
            tokens(&beat.owned),
            tokens(&won),
            "the same buckets and tokens"
        );

        // Recovered for good: every operation works from here on, with no further failures.
        for lease in &won {
            assert!(
                store
                    .is_current(&g, lease.bucket, me, lease.token)
                    .await
                    .expect("is_current after recovery")
            );
        }
        let snap = store.snapshot(&g).await.expect("snapshot after recovery");
        let live: Vec<(u32, i64)> = snap
            .live_leases()
            .iter()
            .filter(|l| l.owner == me)
            .map(|l| (l.bucket.0, l.token.0))
            .collect();
        assert_eq!(live, tokens(&won));
        assert!(
            snap.buckets[3..]
                .iter()
                .all(|b| b.state == BucketState::Unowned && b.token == FencingToken(0)),
            "nothing else changed: {:?}",
            snap.buckets
        );
        let again = store
            .claim(&g, me, first.session, 0, Takeover::Allowed)
            .await
            .expect("claim after recovery");
        assert!(again.is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_killed_mid_statement_gives_a_backend_error() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("a store on the test database");
    let g = group("killed_mid_statement");
    let me = support::worker();
    let meta = MemberMetadata::empty();
    store
        .ensure_group(&g, shards(4))
        .await
        .expect("ensure_group");
    let first = support::beat_as(&store, &g, me, process(me), ttl(30), &meta)
        .await
        .expect("heartbeat");
    let won = store
        .claim(&g, me, first.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(tokens(&won), vec![(0, 1), (1, 1)]);

    // Another session locks the node's row, so the next heartbeat waits on it.
    let mut locker = AsyncPgConnection::establish(&db.url)
        .await
        .expect("a locking connection");
    locker
        .batch_execute(&format!(
            "BEGIN; SELECT 1 FROM lease.nodes WHERE node_id = '{me}' FOR UPDATE"
        ))
        .await
        .expect("locking the node row");
    let waiting = tokio::spawn({
        let store = store.clone();
        let g = g.clone();
        let meta = meta.clone();
        async move { support::beat_as(&store, &g, me, process(me), ttl(30), &meta).await }
    });

    // Once the heartbeat's backend is seen waiting for the lock, terminate it.
    let mut admin = AsyncPgConnection::establish(&db.url)
        .await
        .expect("an admin connection");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let killed = diesel::sql_query(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) AS n \
               FROM pg_stat_activity \
              WHERE datname = $1 AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()",
        )
        .bind::<Text, _>(&db.name)
        .get_result::<CountRow>(&mut admin)
        .await
        .expect("terminating the waiting backend")
        .n;
        if killed == 1 {
            break;
        }
        assert_eq!(killed, 0);
        assert!(
            Instant::now() < deadline,
            "the heartbeat never waited on the lock"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let result = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the killed heartbeat returns")
        .expect("the heartbeat task does not panic");
    let message = expect_backend("heartbeat killed mid-statement", result);
    eprintln!("heartbeat killed mid-statement: {message}");
    locker.batch_execute("COMMIT").await.expect("unlocking");

    // The store recovers within a few attempts; the killed heartbeat changed nothing, and the
    // session and leases are intact.
    let mut attempts = 0;
    let beat = loop {
        attempts += 1;
        let result = support::beat_as(&store, &g, me, process(me), ttl(30), &meta).await;
        if ok_or_backend("heartbeat", &result) {
            break result.expect("checked");
        }
        assert!(attempts < 10, "no recovery in {attempts} attempts");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(beat.session, first.session);
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
}

/// A statement stuck behind someone else's lock is cancelled by the store's statement timeout
/// with a `Backend` error instead of hanging the caller; the store works again once the lock
/// is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_stuck_on_a_lock_times_out() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .statement_timeout(Duration::from_millis(300))
        .build()
        .expect("store");
    let g = group("orders");
    let w = support::worker();
    store.ensure_group(&g, shards(4)).await.expect("ensure");
    support::beat_as(&store, &g, w, process(w), ttl(30), &MemberMetadata::empty())
        .await
        .expect("join");
    let mut blocker = AsyncPgConnection::establish(&db.url)
        .await
        .expect("connect");
    blocker
        .batch_execute("BEGIN; SELECT 1 FROM lease.nodes FOR UPDATE")
        .await
        .expect("lock the node rows");
    let started = Instant::now();
    let stuck = tokio::time::timeout(
        Duration::from_secs(5),
        support::beat_as(&store, &g, w, process(w), ttl(30), &MemberMetadata::empty()),
    )
    .await
    .expect("the heartbeat hung past the statement timeout");
    match &stuck {
        Err(StoreError::Backend { failure, .. }) => {
            assert_eq!(*failure, BackendFailure::Timeout);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(stuck.as_ref().is_err_and(StoreError::is_transient));
    let message = expect_backend("a heartbeat behind a held lock", stuck);
    assert!(message.contains("statement timeout"), "{message}");
    eprintln!(
        "a heartbeat behind a held lock failed after {:?}",
        started.elapsed()
    );
    blocker.batch_execute("ROLLBACK").await.expect("unlock");
    let beat = support::beat_as(&store, &g, w, process(w), ttl(30), &MemberMetadata::empty())
        .await
        .expect("the heartbeat after the lock is gone");
    assert!(!beat.new_session);
}

/// The connection that listens for wake-ups only reads, so a frozen server process behind it
/// would go unnoticed: the store checks it, replaces it within two check intervals, tells the
/// feed that wake-ups may have been missed, and later changes arrive on the new connection,
/// while the old process stays frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_listening_connection_is_replaced() {
    let db = lease_testdb::database().await;
    let check = Duration::from_millis(300);
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .listen_check_interval(check)
        .build()
        .expect("store");
    let g = group("listening");
    store.ensure_group(&g, shards(4)).await.expect("ensure");
    let mut feed = store.changes(&g).await.expect("changes").expect("a feed");
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    let listener: Vec<i32> = lease_testdb::backends(&mut admin, &db.name)
        .await
        .into_iter()
        .filter(|b| b.query.starts_with("LISTEN") && b.state == "idle")
        .map(|b| b.pid)
        .collect();
    assert_eq!(listener.len(), 1, "the listening connection");
    let frozen = lease_testdb::Frozen::freeze(listener);
    let missed = tokio::time::timeout(check * 10, feed.recv())
        .await
        .expect("the frozen listening connection went unnoticed");
    assert_eq!(missed, Some(Change::Missed));
    // A join, through another store, reaches the feed on the replacement connection.
    let other = PgLeaseStore::builder(db.url.clone())
        .max_connections(1)
        .build()
        .expect("store");
    let w = support::worker();
    support::beat_as(&other, &g, w, process(w), ttl(30), &MemberMetadata::empty())
        .await
        .expect("join");
    let joined = tokio::time::timeout(Duration::from_secs(5), feed.recv())
        .await
        .expect("no wake-up after the listening connection was replaced");
    assert_eq!(joined, Some(Change::Joined(w)));
    assert!(frozen.all_stopped());
}

/// Errors say whether retrying can help: a role without the privileges the engine needs gets a
/// permanent `PermissionDenied` (a worker stops on it), an unreachable server a transient
/// `Unavailable` (a worker retries), and the message names the cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_classified_permanent_or_transient() {
    let db = lease_testdb::database().await;
    let g = group("classified");
    let owner = PgLeaseStore::builder(db.url.clone())
        .max_connections(1)
        .build()
        .expect("store");
    owner.ensure_group(&g, shards(2)).await.expect("ensure");
    let role = format!("r_{}", db.name);
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA lease TO {role};"
        ))
        .await
        .expect("a role without table privileges");
    let url = format!("{} user={role}", db.url);
    let store = PgLeaseStore::builder(url)
        .max_connections(1)
        .build()
        .expect("store");
    let w = support::worker();
    let denied =
        support::beat_as(&store, &g, w, process(w), ttl(30), &MemberMetadata::empty()).await;
    match &denied {
        Err(e @ StoreError::Backend { failure, .. }) => {
            assert_eq!(*failure, BackendFailure::PermissionDenied, "{e:?}");
            assert!(!e.is_transient());
            let text = lease_core::Chain(e).to_string();
            assert!(text.starts_with("permission denied: "), "{text}");
            assert_eq!(text.matches("permission denied").count(), 2, "{text}");
        }
        other => panic!("expected permission denied, got {other:?}"),
    }
    let gone = PgLeaseStore::builder("host=/nonexistent-dir port=5432 user=postgres dbname=x")
        .max_connections(1)
        .timeout(Duration::from_secs(1))
        .build()
        .expect("store");
    match gone.snapshot(&g).await {
        Err(e @ StoreError::Backend { failure, .. }) => {
            assert_eq!(failure, BackendFailure::Unavailable, "{e:?}");
            assert!(e.is_transient());
        }
        other => panic!("expected unavailable, got {other:?}"),
    }
}
