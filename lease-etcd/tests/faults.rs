//! etcd faults under a running pool: three workers (`LeaseWorker`, sessions on etcd leases)
//! share 24 buckets on a three-member cluster of their own, and members are SIGKILLed.
//!
//! - The leader: a new one is elected; every worker keeps its buckets throughout (nothing is
//!   revoked after the kill), and the ownership log shows no bucket held twice.
//! - A majority: nothing answers; every worker fences itself (revokes everything it held, each
//!   bucket once, because its trust ran out) within its ttl, while etcd still holds its lease
//!   (a new leader extends every lease, so nobody could have taken one); when the members come
//!   back, the pool is whole again, still without a bucket held twice.
//!
//! Figures (times to a new leader, to fencing, to recovery; buckets that moved) are printed
//! for BENCHMARKS.md; the assertions are the safety and liveness properties above.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lease_core::ownership_log::OwnershipLog;
use lease_core::{
    Bucket, GroupName, NodeId, OwnershipEvent, RevokeReason, ShardCount, SystemClock, Timestamp,
};
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
    workers: BTreeMap<NodeId, WorkerHandle>,
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
            let id = config.node_id();
            let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
            let handle = config
                .start(store, handler)
                .await
                .expect("the worker starts");
            workers.insert(id, handle);
        }
        Self { log, workers }
    }

    fn owned(&self) -> BTreeMap<NodeId, usize> {
        self.workers
            .iter()
            .map(|(&w, h)| (w, h.owned().borrow().len()))
            .collect()
    }

    /// Each worker's buckets.
    fn holdings(&self) -> BTreeMap<NodeId, Vec<Bucket>> {
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

    /// How many events the log holds: a mark to look at what came after.
    fn logged(&self) -> usize {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries()
            .len()
    }

    /// Every event logged after `mark`: by whom, what.
    fn events_since(&self, mark: usize) -> Vec<(NodeId, OwnershipEvent)> {
        let log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.entries()[mark..]
            .iter()
            .map(|e| (e.worker, e.event))
            .collect()
    }

    /// Every revocation logged after `mark`: by whom, of which bucket, why; sorted.
    fn revoked_since(&self, mark: usize) -> Vec<(NodeId, Bucket, RevokeReason)> {
        let mut revoked: Vec<_> = self
            .events_since(mark)
            .into_iter()
            .filter_map(|(worker, event)| match event {
                OwnershipEvent::Revoked { bucket, reason, .. } => Some((worker, bucket, reason)),
                OwnershipEvent::Assigned(_) => None,
            })
            .collect();
        revoked.sort_by_key(|&(w, b, reason)| (w, b, reason.as_str()));
        revoked
    }

    /// Watch (every 20 ms) that `holds` stays true until `end`.
    async fn throughout(&self, end: Instant, what: &str, holds: impl Fn(&Self) -> bool) {
        loop {
            assert!(
                holds(self),
                "{what}: not so {:?} before the end of the watch; owned {:?}",
                end.saturating_duration_since(Instant::now()),
                self.owned()
            );
            if Instant::now() >= end {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
    let held = pool.holdings();

    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let mark = pool.logged();
    let killed = Instant::now();
    cluster.kill(leader).expect("killing the leader");
    let new = cluster
        .wait_for_leader(Duration::from_secs(15))
        .unwrap_or_else(|e| panic!("{e}"));
    let elected = killed.elapsed();
    assert_ne!(new, leader);

    // A worker that renews nothing after the kill stops trusting its session a ttl after its
    // last renewal, before the kill, and revokes everything. Watched past that point with no
    // bucket changing hands, every worker has renewed through the new leader.
    pool.throughout(
        killed + TTL + RENEW,
        "every worker keeps the buckets it had",
        |p| p.holdings() == held,
    )
    .await;
    pool.check();
    let since = pool.events_since(mark);
    assert!(since.is_empty(), "events after the kill: {since:?}");
    eprintln!("leader kill: new leader after {elected:?}; nothing revoked or assigned since");
    pool.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_majority_fences_every_worker_and_it_recovers() {
    let mut cluster = EtcdCluster::start(3).unwrap_or_else(|e| panic!("{e}"));
    let pool = Pool::start(&url_of(&cluster)).await;
    pool.until(10 * RENEW, "cold start", Pool::balanced).await;

    let held = pool.holdings();
    let leader = cluster
        .wait_for_leader(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e}"));
    let other = (leader + 1) % 3;
    let mark = pool.logged();
    let cold_start = pool.check().revocations;
    let killed = Instant::now();
    cluster.kill(leader).expect("killing the leader");
    cluster.kill(other).expect("killing a second member");

    // No quorum: no heartbeat succeeds, so each worker's trust runs out within its ttl of
    // its last renewal, before the kill; by then it has revoked everything (a renew interval
    // of slack for the timers and the deliveries on a loaded machine).
    let fenced = pool
        .until(TTL + RENEW, "every worker fenced", |p| {
            p.owned().values().all(|&n| n == 0)
        })
        .await;
    // Nobody can have taken a bucket meanwhile: no member could commit a write. The log
    // check finds no bucket held twice.
    pool.check();
    // What was revoked since the kill: each bucket held then, once, by its holder, because
    // its trust ran out; nothing else.
    let mut expected: Vec<(NodeId, Bucket, RevokeReason)> = held
        .iter()
        .flat_map(|(&w, buckets)| buckets.iter().map(move |&b| (w, b, RevokeReason::Fenced)))
        .collect();
    expected.sort_by_key(|&(w, b, reason)| (w, b, reason.as_str()));
    assert_eq!(expected.len(), SHARDS as usize);
    assert_eq!(pool.revoked_since(mark), expected);

    // The outage goes on for a ttl past the fencing: the sessions that come through it were
    // kept by etcd (a new leader extends every lease), not renewed.
    tokio::time::sleep(TTL).await;
    cluster.restart(leader).expect("restarting a member");
    cluster.restart(other).expect("restarting a member");
    let restarted = killed.elapsed();
    cluster
        .wait_for_leader(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{e}"));
    let quorum = killed.elapsed();
    // The sessions survived: each worker's next heartbeat (a renew interval away at most,
    // its backoff's cap) finds its own and it claims its share back at once. Two ttls allow
    // for the client's reconnections to the restarted members (1.4 s seen after a contested
    // election).
    let recovered = pool
        .until(2 * TTL, "the pool whole again", Pool::balanced)
        .await;
    pool.check();
    eprintln!(
        "majority kill: every worker fenced {fenced:?} after the kill; members restarted at \
         {restarted:?}, quorum at {quorum:?}; balanced again {recovered:?} after that; \
         revocations before the kill (the cold start's): {cold_start:?}"
    );
    pool.stop().await;
}
