//! The worker runtime on Postgres, in what only Postgres has: a group deleted and created
//! again behind a running worker, and server processes frozen under the workers. Everything
//! any backend must do is in the runtime suite (`lease_testing::runtime`), which
//! `lease-diesel/tests/runtime.rs` runs on Postgres and `lease-memory/tests/runtime.rs` on the
//! in-memory store. Waits poll with a deadline; they never sleep a guessed time.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, Clock, SystemClock};
use lease::testing::runtime::balanced;
use lease::testing::{FaultyStore, OwnershipLog, RecordingHandler};
use lease::{
    GroupName, LeaseWorker, NodeId, OwnershipEvent, ShardCount, StoreError, WorkerFailed,
    WorkerHandle,
};

/// A running worker whose group is deleted and created again with another shard count stops
/// with the typed mismatch error (checked on every heartbeat) instead of being assigned
/// buckets of a group it routes by another count; the worker of the new group owns them all.
///
/// The worker must not see the group missing in between: a heartbeat then ends it with
/// `GroupNotFound` (an unknown group is permanent), another case. Deleting the group notifies
/// the worker, which heartbeats again at once, so it raced the second worker's start (6 runs
/// in 30 ended with `GroupNotFound`). So the first worker's store calls fail (transiently)
/// from before the delete until the group is back: once one of them failed, none of its calls
/// is at the store (it makes one at a time), and it retries only into the new group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stops_when_its_group_returns_with_another_shard_count() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(4)
        .build()
        .expect("store");
    let group = GroupName::new("del").expect("name");
    let log = Arc::new(Mutex::new(OwnershipLog::new()));
    let start = |shards: u32| {
        let config = LeaseWorker::builder(group.clone(), ShardCount::new(shards).expect("n"))
            .ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_millis(500))
            .build()
            .expect("config");
        let id = config.node_id();
        let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
        (config, id, handler)
    };
    let (config, first_id, handler) = start(4);
    let cut = FaultyStore::new(store.clone());
    let faults = cut.faults();
    let mut first = config.start(cut, handler).await.expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.owned().borrow().len() < 4 {
        assert!(Instant::now() < deadline, "the first worker never owned 4");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    faults.fail_all.store(true, Ordering::SeqCst);
    // Its next call fails (within a renew interval): from then on none reaches the store.
    let deadline = Instant::now() + Duration::from_secs(20);
    while faults.injected.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the first worker made no call");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    admin
        .batch_execute("DELETE FROM lease.groups WHERE name = 'del'")
        .await
        .expect("delete the group");
    let deleted_at = SystemClock.now();
    let (config, second_id, handler) = start(2);
    // Its start creates the group again, with 2 buckets.
    let second = config.start(store.clone(), handler).await.expect("start");
    faults.fail_all.store(false, Ordering::SeqCst);

    let ended = tokio::time::timeout(Duration::from_secs(20), first.wait())
        .await
        .expect("the first worker kept running on a group of another shard count");
    match ended {
        Err(WorkerFailed::Store(StoreError::ShardCountMismatch {
            configured, found, ..
        })) => assert_eq!((configured.get(), found.get()), (4, 2)),
        other => panic!("the first worker ended with {other:?}"),
    }
    assert!(first.owned().borrow().is_empty());
    let deadline = Instant::now() + Duration::from_secs(20);
    while second.owned().borrow().len() < 2 {
        assert!(Instant::now() < deadline, "the second worker never owned 2");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let log = log.lock().expect("log").clone();
    let late: Vec<_> = log
        .entries()
        .iter()
        .filter(|e| e.worker == first_id && e.at >= deleted_at)
        .filter(|e| matches!(e.event, OwnershipEvent::Assigned { .. }))
        .collect();
    assert!(
        late.is_empty(),
        "the first worker was assigned buckets of the new group: {late:?}"
    );
    // It left the new group on its way out: only the second worker is a member.
    let snap = store.snapshot(&group).await.expect("snapshot");
    let members: Vec<NodeId> = snap.members.iter().map(|m| m.worker).collect();
    assert_eq!(members, vec![second_id]);
    second.shutdown().await.expect("a clean stop");
}

/// Every server process serving three workers is frozen (`SIGSTOP`) while idle, so it holds no
/// lock; the server still accepts connections. A call abandoned at its deadline must not give
/// its connection back to the pool, or the next call hangs on it again: the workers reconnect
/// to fresh server processes and every bucket is owned and balanced again within ttl + renew +
/// 2 s of the freeze, while the frozen ones stay frozen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_processes_are_left_behind() {
    const BUCKETS: u32 = 12;
    let (ttl, renew) = (Duration::from_secs(3), Duration::from_secs(1));
    let db = lease_testdb::database().await;
    let group = GroupName::new("frozen").expect("name");
    let log = Arc::new(Mutex::new(OwnershipLog::new()));
    let mut workers = Vec::new();
    for _ in 0..3 {
        // A store each, as three processes would have.
        let store = PgLeaseStore::builder(db.url.clone())
            .max_connections(4)
            .build()
            .expect("store");
        let config = LeaseWorker::builder(group.clone(), ShardCount::new(BUCKETS).expect("n"))
            .ttl(ttl)
            .renew_interval(renew)
            .build()
            .expect("config");
        let handler = RecordingHandler::new(config.node_id(), log.clone(), Arc::new(SystemClock));
        workers.push(config.start(store, handler).await.expect("start"));
    }
    let balanced = |workers: &[WorkerHandle]| {
        balanced(workers.iter().map(|h| h.owned().borrow().len()), BUCKETS)
    };
    let start = Instant::now();
    while !balanced(&workers) {
        assert!(start.elapsed() < Duration::from_secs(20), "no cold start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // Freeze every server process of the database, when all of them are idle: a process frozen
    // mid-statement would hold row locks nobody can take over (a limit of any database).
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    let frozen = loop {
        let pids = lease_testdb::backends(&mut admin, &db.name)
            .await
            .iter()
            .map(|b| b.pid)
            .collect();
        let frozen = lease_testdb::Frozen::freeze(pids);
        // What each was doing when frozen (the statistics outlive the freeze).
        let states = lease_testdb::backends(&mut admin, &db.name).await;
        if states
            .iter()
            .filter(|b| frozen.pids().contains(&b.pid))
            .all(|b| b.state == "idle")
        {
            break frozen;
        }
        drop(frozen);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let frozen_at = Instant::now();
    let frozen_on_server = SystemClock.now();
    assert!(
        frozen.pids().len() >= 6,
        "the workers' connections: {:?}",
        frozen.pids()
    );
    // Recovered: every worker renewed its session after the freeze (through a connection to a
    // fresh server process), and the applications own every bucket, evenly.
    let bound = ttl + renew + Duration::from_secs(2);
    let observer = PgLeaseStore::builder(db.url.clone())
        .max_connections(1)
        .build()
        .expect("store");
    let ids: Vec<NodeId> = workers.iter().map(WorkerHandle::node_id).collect();
    loop {
        let snap = observer.snapshot(&group).await.expect("snapshot");
        let renewed = snap
            .members
            .iter()
            .filter(|m| ids.contains(&m.worker) && m.live && m.heartbeat_at > frozen_on_server)
            .count();
        if renewed == ids.len() && balanced(&workers) {
            break;
        }
        assert!(
            frozen_at.elapsed() < bound,
            "not recovered within {bound:?}: {renewed} of 3 renewed, loads {:?}",
            workers
                .iter()
                .map(|h| h.owned().borrow().len())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    eprintln!(
        "{} frozen server processes: every worker renewed and every bucket owned and balanced \
         again {:?} after the freeze",
        frozen.pids().len(),
        frozen_at.elapsed()
    );
    // Still frozen: the workers recovered around them, not through them.
    assert!(frozen.all_stopped(), "a frozen server process was resumed");
    assert!(balanced(&workers));
    drop(frozen);
    for w in workers {
        w.shutdown().await.expect("a clean stop");
    }
    let summary = log
        .lock()
        .expect("log")
        .check()
        .unwrap_or_else(|e| panic!("ownership log: {e}"));
    eprintln!("ownership log: {summary:?}");
}
