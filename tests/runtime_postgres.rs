//! The worker runtime on real Postgres with LISTEN/NOTIFY wake-ups and the server's clock.
//! Renew intervals are long (5 s) so that only wake-ups can explain a fast handoff. Waits poll
//! the workers' owned sets with a deadline; they never sleep a guessed time.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease::diesel::PgLeaseStore;
use lease::testing::{Faults, FaultyStore, OwnershipLog, RecordingHandler};
use lease::{
    GroupName, LeaseWorker, OwnershipEvent, RevokeReason, ShardCount, SystemClock, Timestamp,
    WorkerHandle, WorkerId,
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
            h.shutdown().await;
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
    handle.shutdown().await;
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
