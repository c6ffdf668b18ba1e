//! etcd faults under a running pool: three workers (`LeaseWorker`, sessions on etcd leases)
//! share 24 buckets on a three-member cluster of their own, and members are SIGKILLed.
//!
//! - The leader: a new one is elected; every worker keeps (or regains) its buckets, and the
//!   ownership log shows no bucket held twice.
//! - A majority: nothing answers; every worker fences itself (revokes everything) within its
//!   ttl, while etcd still holds its lease (a new leader extends every lease, so nobody could
//!   have taken one); when the members come back, the pool is whole again, still without a
//!   bucket held twice.
//!
//! Figures (times to a new leader, to fencing, to recovery; buckets that moved) are printed
//! for BENCHMARKS.md; the assertions are the safety and liveness properties above.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lease_core::ownership_log::OwnershipLog;
use lease_core::{GroupName, ShardCount, SystemClock, Timestamp, WorkerId};
use lease_etcd::{EtcdLeaseStore, EtcdUrl};
use lease_testetcd::EtcdCluster;
use lease_testing::RecordingHandler;
use lease_worker::{LeaseWorker, WorkerHandle};

const SHARDS: u32 = 24;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

type Log = Arc<Mutex<OwnershipLog<Timestamp>>>;

struct Pool {
    log: Log,
    workers: BTreeMap<WorkerId, WorkerHandle>,
}

impl Pool {
    async fn start(url: &EtcdUrl) -> Self {
        let log: Log = Arc::new(Mutex::new(OwnershipLog::new()));
        let mut workers = BTreeMap::new();
        for _ in 0..3 {
            // A client of its own per worker, as separate processes would have.
            let store = EtcdLeaseStore::connect(url)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            let config = LeaseWorker::builder(
                GroupName::new("faults").expect("a group name"),
                ShardCount::new(SHARDS).expect("a shard count"),
            )
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .expect("a configuration");
            let id = config.worker_id();
            let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
            let handle = config
                .start(store, handler)
                .await
                .expect("the worker starts");
            workers.insert(id, handle);
        }
        Self { log, workers }
    }

    fn owned(&self) -> BTreeMap<WorkerId, usize> {
        self.workers
            .iter()
            .map(|(&w, h)| (w, h.owned().borrow().len()))
            .collect()
    }

    /// Each worker's buckets.
    fn holdings(&self) -> BTreeMap<WorkerId, Vec<lease_core::Bucket>> {
        self.workers
            .iter()
            .map(|(&w, h)| (w, h.owned().borrow().keys().copied().collect()))
            .collect()
    }

    fn balanced(&self) -> bool {
        self.owned().values().all(|&n| n == (SHARDS / 3) as usize)
    }

    /// Poll `done` every 20 ms; how long it took, failing after `limit`.
    async fn until(&self, limit: Duration, what: &str, done: impl Fn(&Self) -> bool) -> Duration {
        let start = Instant::now();
        while !done(self) {
            assert!(
                start.elapsed() < limit,
                "{what}: not within {limit:?}; owned {:?}",
                self.owned()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        start.elapsed()
    }

    fn check(&self) -> lease_core::ownership_log::Summary {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .check()
            .unwrap_or_else(|e| panic!("ownership log: {e}"))
    }

    async fn stop(self) {
        for (_, h) in self.workers {
            h.shutdown().await.expect("a clean stop");
        }
    }
}

fn url_of(cluster: &EtcdCluster) -> EtcdUrl {
    EtcdUrl {
        endpoints: cluster.endpoints(),
        prefix: "faults".to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_keeps_every_lease_and_overlaps_nothing() {
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let pool = Pool::start(&url_of(&cluster)).await;
    pool.until(10 * RENEW, "cold start", Pool::balanced).await;
    let before = pool.check();
    let held = pool.holdings();

    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let killed = Instant::now();
    cluster.kill(leader).expect("killing the leader");
    let new = cluster
        .wait_for_leader(Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}"));
    let elected = killed.elapsed();
    assert_ne!(new, leader);

    // Three ttls after the kill every session has been renewed through the new leader (or
    // ended and replaced): the pool must be whole and balanced then, and stay so.
    tokio::time::sleep(TTL * 3).await;
    pool.until(5 * RENEW, "balanced after the new leader", Pool::balanced)
        .await;
    let after = pool.check();
    assert_eq!(
        pool.holdings(),
        held,
        "every worker keeps (or regains) the buckets it had"
    );
    let moved = after.assignments - before.assignments;
    eprintln!(
        "leader kill: new leader after {elected:?}; buckets assigned again since: {moved}; \
         revocations {:?}",
        after.revocations
    );
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_majority_fences_every_worker_and_it_recovers() {
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let pool = Pool::start(&url_of(&cluster)).await;
    pool.until(10 * RENEW, "cold start", Pool::balanced).await;

    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let other = (leader + 1) % 3;
    let killed = Instant::now();
    cluster.kill(leader).expect("killing the leader");
    cluster.kill(other).expect("killing a second member");

    // No quorum: no heartbeat succeeds, so each worker's trust runs out within its ttl of
    // its last renewal; by then it has revoked everything.
    let fenced = pool
        .until(TTL + 2 * RENEW, "every worker fenced", |p| {
            p.owned().values().all(|&n| n == 0)
        })
        .await;
    let summary = pool.check();
    assert!(
        summary.revocations.values().sum::<usize>() >= SHARDS as usize,
        "every bucket revoked: {:?}",
        summary.revocations
    );
    // Nobody can have taken a bucket meanwhile: no member could commit a write. The log
    // check above found no bucket held twice.

    tokio::time::sleep(TTL).await;
    cluster.restart(leader).expect("restarting a member");
    cluster.restart(other).expect("restarting a member");
    let restarted = killed.elapsed();
    cluster
        .wait_for_leader(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let quorum = killed.elapsed();
    let recovered = pool
        .until(3 * TTL + 5 * RENEW, "the pool whole again", Pool::balanced)
        .await;
    let after = pool.check();
    eprintln!(
        "majority kill: every worker fenced {fenced:?} after the kill; members restarted at \
         {restarted:?}, quorum at {quorum:?}; balanced again {recovered:?} after that; \
         revocations {:?}",
        after.revocations
    );
    pool.stop().await;
}
