//! The worker runtime on real Postgres with LISTEN/NOTIFY wake-ups and the server's clock.
//! Renew intervals are long (5 s) so that only wake-ups can explain a fast handoff. Waits poll
//! the workers' owned sets with a deadline; they never sleep a guessed time.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease::postgres::PgLeaseStore;
use lease::testing::{Faults, FaultyStore, OwnershipLog, RecordingHandler};
use lease::{
    Clock, GroupName, LeaseStore, LeaseWorker, OwnershipEvent, RevokeReason, ShardCount,
    StoreError, SystemClock, Timestamp, WorkerFailed, WorkerHandle, WorkerId,
};

const SHARDS: u32 = 64;

struct Pool {
    store: PgLeaseStore,
    group: GroupName,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    workers: BTreeMap<WorkerId, (WorkerHandle, Arc<Faults>)>,
}

impl Pool {
    async fn new() -> Self {
        let db = lease_testdb::database().await;
        Self {
            store: PgLeaseStore::builder(db.url)
                .max_connections(16)
                .build()
                .expect("store"),
            group: GroupName::new("orders").expect("name"),
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            workers: BTreeMap::new(),
        }
    }

    async fn start(&mut self, ttl: Duration, renew: Duration) -> WorkerId {
        let config = LeaseWorker::builder(self.group.clone(), ShardCount::new(SHARDS).expect("n"))
            .ttl(ttl)
            .renew_interval(renew)
            .build()
            .expect("config");
        let id = config.worker_id();
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        let handler = RecordingHandler::new(id, self.log.clone(), Arc::new(SystemClock));
        let handle = config.start(store, handler).await.expect("start");
        self.workers.insert(id, (handle, faults));
        id
    }

    fn owned(&self) -> BTreeMap<WorkerId, usize> {
        self.workers
            .iter()
            .map(|(&w, (h, _))| (w, h.owned().borrow().len()))
            .collect()
    }

    fn balanced(&self) -> bool {
        let owned = self.owned();
        let total: usize = owned.values().sum();
        let (min, max) = (owned.values().min(), owned.values().max());
        total == SHARDS as usize && matches!((min, max), (Some(a), Some(b)) if b - a <= 1)
    }

    /// Poll until balanced; the time it took, or a panic after `limit`.
    async fn until_balanced(&self, limit: Duration) -> Duration {
        let start = Instant::now();
        while !self.balanced() {
            assert!(
                start.elapsed() < limit,
                "not balanced within {limit:?}: {:?}",
                self.owned()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        start.elapsed()
    }

    async fn shutdown(mut self) {
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for w in ids {
            let (h, _) = self.workers.remove(&w).expect("worker");
            h.shutdown().await.expect("a clean stop");
        }
        let summary = self
            .log
            .lock()
            .expect("log")
            .check()
            .unwrap_or_else(|e| panic!("ownership log: {e}"));
        eprintln!("ownership log: {summary:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_serve_a_joiner_and_a_graceful_stop_within_250_ms() {
    let (ttl, renew) = (Duration::from_secs(16), Duration::from_secs(5));
    let mut pool = Pool::new().await;
    for _ in 0..3 {
        pool.start(ttl, renew).await;
    }
    let cold = pool.until_balanced(Duration::from_secs(20)).await;
    eprintln!("cold start of 3 workers x 64 buckets on Postgres: balanced in {cold:?}");

    let joined_at = Instant::now();
    let joiner = pool.start(ttl, renew).await;
    pool.until_balanced(Duration::from_secs(20)).await;
    let join = joined_at.elapsed();
    eprintln!("a 4th worker joining: its share of 16 in {join:?} (renew interval {renew:?})");
    assert_eq!(pool.owned()[&joiner], 16);
    assert!(join < Duration::from_millis(250), "join took {join:?}");

    let (victim, _) = pool
        .workers
        .iter()
        .next()
        .map(|(w, _)| (*w, ()))
        .expect("a worker");
    let (handle, _) = pool.workers.remove(&victim).expect("victim");
    let stopped_at = Instant::now();
    handle.shutdown().await.expect("a clean stop");
    pool.until_balanced(Duration::from_secs(20)).await;
    let handoff = stopped_at.elapsed();
    eprintln!("a graceful stop: re-owned by the other 3 in {handoff:?}");
    assert!(
        handoff < Duration::from_millis(250),
        "handoff took {handoff:?}"
    );
    pool.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_cut_off_from_postgres_fences_before_its_buckets_move() {
    let (ttl, renew) = (Duration::from_secs(3), Duration::from_secs(1));
    let mut pool = Pool::new().await;
    let a = pool.start(ttl, renew).await;
    let b = pool.start(ttl, renew).await;
    pool.until_balanced(Duration::from_secs(20)).await;
    let faults = pool.workers[&a].1.clone();
    // a's store calls hang, as over a cut network: no error comes back to tell it anything.
    faults.hang.store(true, Ordering::SeqCst);
    let cut_at = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(20);
    while pool.owned()[&b] < SHARDS as usize {
        assert!(
            Instant::now() < deadline,
            "b never took over: {:?}",
            pool.owned()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = cut_at.elapsed();
    eprintln!("cut-off worker's buckets re-owned {took:?} after the cut (ttl {ttl:?})");
    assert_eq!(pool.owned()[&a], 0);
    let log = pool.log.lock().expect("log").clone();
    let fenced: Vec<Timestamp> = log
        .entries()
        .iter()
        .filter(|e| e.worker == a)
        .filter(|e| {
            matches!(
                e.event,
                OwnershipEvent::Revoked {
                    reason: RevokeReason::Expired,
                    ..
                }
            )
        })
        .map(|e| e.at)
        .collect();
    assert_eq!(fenced.len(), 32, "a did not fence all 32 of its buckets");
    // The log check (no bucket held twice at once) runs at shutdown; heal a first so it can
    // leave cleanly.
    faults.hang.store(false, Ordering::SeqCst);
    pool.shutdown().await;
}

/// A running worker whose group is deleted and created again with another shard count stops
/// with the typed mismatch error (checked on every heartbeat) instead of being assigned
/// buckets of a group it routes by another count; the worker of the new group owns them all.
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
        let id = config.worker_id();
        let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
        (config, id, handler)
    };
    let (config, first_id, handler) = start(4);
    let mut first = config.start(store.clone(), handler).await.expect("start");
    let deadline = Instant::now() + Duration::from_secs(20);
    while first.owned().borrow().len() < 4 {
        assert!(Instant::now() < deadline, "the first worker never owned 4");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    admin
        .batch_execute("DELETE FROM lease.groups WHERE name = 'del'")
        .await
        .expect("delete the group");
    let deleted_at = SystemClock.now();
    let (config, second_id, handler) = start(2);
    let second = config.start(store.clone(), handler).await.expect("start");

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
    let members: Vec<WorkerId> = snap.members.iter().map(|m| m.worker).collect();
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
        let handler = RecordingHandler::new(config.worker_id(), log.clone(), Arc::new(SystemClock));
        workers.push(config.start(store, handler).await.expect("start"));
    }
    let balanced = |workers: &[WorkerHandle]| {
        let loads: Vec<usize> = workers.iter().map(|h| h.owned().borrow().len()).collect();
        loads.iter().sum::<usize>() == BUCKETS as usize
            && loads
                .iter()
                .max()
                .zip(loads.iter().min())
                .is_some_and(|(a, b)| a - b <= 1)
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
    let ids: Vec<WorkerId> = workers.iter().map(WorkerHandle::worker_id).collect();
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

/// An application that takes `delay` to stop working on a revoked bucket; the revocation is
/// recorded when it returns.
struct SlowRevoker {
    inner: RecordingHandler,
    delay: Duration,
}

#[async_trait::async_trait]
impl lease::OwnershipHandler for SlowRevoker {
    async fn on_assigned(&self, bucket: lease::Bucket, token: lease::FencingToken) {
        self.inner.on_assigned(bucket, token).await;
    }

    async fn on_revoked(
        &self,
        bucket: lease::Bucket,
        token: lease::FencingToken,
        reason: RevokeReason,
    ) {
        tokio::time::sleep(self.delay).await;
        self.inner.on_revoked(bucket, token, reason).await;
    }
}

/// Revoke before release on Postgres: a worker sheds half its buckets to a joiner while its
/// application takes 200 ms to stop on each; the joiner, woken by the release's NOTIFY (the
/// renew interval is 5 s), is assigned each bucket only after the revocation returned, as
/// the ownership log shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_bucket_is_released_only_after_its_revoke_returns() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(4)
        .build()
        .expect("store");
    let group = GroupName::new("handoff").expect("name");
    let log = Arc::new(Mutex::new(OwnershipLog::new()));
    let config = |id: Option<WorkerId>| {
        let mut b = LeaseWorker::builder(group.clone(), ShardCount::new(8).expect("n"))
            .ttl(Duration::from_secs(16))
            .renew_interval(Duration::from_secs(5));
        if let Some(id) = id {
            b = b.worker_id(id);
        }
        b.build().expect("config")
    };
    let a_config = config(None);
    let a_id = a_config.worker_id();
    let slow = SlowRevoker {
        inner: RecordingHandler::new(a_id, log.clone(), Arc::new(SystemClock)),
        delay: Duration::from_millis(200),
    };
    let a = a_config.start(store.clone(), slow).await.expect("start a");
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.owned().borrow().len() < 8 {
        assert!(Instant::now() < deadline, "a never owned 8");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let b_config = config(None);
    let b_id = b_config.worker_id();
    let b = b_config
        .start(
            store.clone(),
            RecordingHandler::new(b_id, log.clone(), Arc::new(SystemClock)),
        )
        .await
        .expect("start b");
    let deadline = Instant::now() + Duration::from_secs(4);
    while b.owned().borrow().len() < 4 {
        assert!(
            Instant::now() < deadline,
            "the joiner was not served by wake-ups within 4 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let summary = log
        .lock()
        .expect("log")
        .check()
        .unwrap_or_else(|e| panic!("ownership log: {e}"));
    assert_eq!(summary.handoffs, 4);
    assert_eq!(summary.revocations.get("shed"), Some(&4));
    a.shutdown().await.expect("a clean stop");
    b.shutdown().await.expect("a clean stop");
}
