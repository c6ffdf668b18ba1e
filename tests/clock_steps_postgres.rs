//! Steps of the Postgres server's wall clock (the server runs under libfaketime, Debian
//! package `faketime`), with three workers (ttl 10 s, renew 2 s) on 12 buckets. Expiry is the
//! server's clock, so a forward step ages every session at once: the workers see the step in
//! their heartbeats and take no dead session's bucket until a ttl after, by when every holder
//! has fenced. The ownership log, stamped with this host's clock, must show no bucket held
//! twice at once. A backward step is reported and moves nothing. The workers have no wake-ups,
//! so each learns of the step only at its own renewal. Waits poll with deadlines.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use lease::postgres::PgLeaseStore;
use lease::store::{SystemClock, Timestamp};
use lease::testing::{Counters, FaultyStore, OwnershipLog, RecordingHandler};
use lease::{
    GroupName, LeaseWorker, NodeId, OwnershipEvent, RevokeReason, ShardCount, WorkerHandle,
};
use lease_testdb::{Cluster, ClusterOptions};

const SHARDS: u32 = 12;
const TTL: Duration = Duration::from_secs(10);
const RENEW: Duration = Duration::from_secs(2);

struct Pool {
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    workers: BTreeMap<NodeId, WorkerHandle>,
}

impl Pool {
    async fn start(cluster: &Cluster, name: &str) -> Self {
        cluster
            .psql(&format!("CREATE DATABASE {name}"))
            .unwrap_or_else(|e| panic!("{e}"));
        let store = PgLeaseStore::builder(cluster.socket_url(name))
            .build()
            .expect("store");
        store.migrate().await.expect("migrate");
        let group = GroupName::new(name).expect("name");
        let log = Arc::new(Mutex::new(OwnershipLog::new()));
        let mut workers = BTreeMap::new();
        for _ in 0..3 {
            let config = LeaseWorker::builder(group.clone(), ShardCount::new(SHARDS).expect("n"))
                .ttl(TTL)
                .renew_interval(RENEW)
                .build()
                .expect("config");
            let id = config.node_id();
            let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
            // Without wake-ups, a holder learns that its session expired only at its next
            // renewal (as behind a pooler, or when a notification is lost): the widest window
            // for a claimer to take its buckets while it still works on them.
            let store = FaultyStore::new(store.clone());
            store.faults().no_feed.store(true, Ordering::SeqCst);
            let handle = config.start(store, handler).await.expect("start");
            workers.insert(id, handle);
            // Renewals a third of the interval apart (they keep their cadence, having no
            // wake-ups): after a step, the first to renew finds the others' sessions dead
            // while they still hold their buckets.
            tokio::time::sleep(RENEW / 3).await;
        }
        Self { log, workers }
    }

    fn owned(&self) -> Vec<usize> {
        self.workers
            .values()
            .map(|h| h.owned().borrow().len())
            .collect()
    }

    fn balanced(&self) -> bool {
        let owned = self.owned();
        owned.iter().sum::<usize>() == SHARDS as usize
            && owned
                .iter()
                .max()
                .zip(owned.iter().min())
                .is_some_and(|(a, b)| a - b <= 1)
    }

    async fn until_balanced(&self, limit: Duration) -> Duration {
        let start = Instant::now();
        while !self.balanced() {
            assert!(
                start.elapsed() < limit,
                "not balanced within {limit:?}: {:?}",
                self.owned()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        start.elapsed()
    }

    /// How many revocations with `reason` the log holds.
    fn revoked(&self, reason: RevokeReason) -> usize {
        self.log
            .lock()
            .expect("log")
            .entries()
            .iter()
            .filter(|e| matches!(e.event, OwnershipEvent::Revoked { reason: r, .. } if r == reason))
            .count()
    }

    async fn shutdown(self) {
        for (_, h) in self.workers {
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

fn fake_clock_server() -> Cluster {
    Cluster::start(ClusterOptions {
        fake_clock: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a server under libfaketime: {e}"))
}

/// The server's clock is `seconds` off this host's, give or take a second.
fn assert_stepped(cluster: &Cluster, seconds: i64) {
    let server: f64 = cluster
        .psql("SELECT extract(epoch FROM clock_timestamp())")
        .expect("reading the server's clock")
        .parse()
        .expect("a number");
    let here = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs_f64();
    let off = server - here;
    assert!(
        (off - seconds as f64).abs() < 1.0,
        "the server's clock is {off:+.1} s off, not {seconds:+} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_step_of_the_server_clock_puts_no_bucket_in_two_hands() {
    let steps = counters();
    let cluster = fake_clock_server();
    let pool = Pool::start(&cluster, "forward").await;
    // Past the workers' first ttl, so that takeovers are open as in a long-running pool.
    pool.until_balanced(Duration::from_secs(30)).await;
    tokio::time::sleep(TTL).await;
    assert!(pool.balanced(), "{:?}", pool.owned());

    cluster.set_clock_offset(15).expect("stepping the clock");
    let stepped = Instant::now();
    // Every session looked dead to the server at once: each worker's next heartbeat started a
    // new session and fenced what it held.
    let deadline = stepped + RENEW * 3;
    while pool.revoked(RevokeReason::Expired) < SHARDS as usize {
        assert!(
            Instant::now() < deadline,
            "the step did not expire the sessions: {} revoked",
            pool.revoked(RevokeReason::Expired)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_stepped(&cluster, 15);
    // Nobody takes a dead session's bucket for a ttl from when it saw the step.
    pool.until_balanced(TTL + RENEW + Duration::from_secs(4))
        .await;
    eprintln!(
        "+15 s step: balanced again {:?} after it",
        stepped.elapsed()
    );
    assert_eq!(
        steps.sum(
            "lease_clock_steps_total",
            &[("group", "forward"), ("direction", "forward")]
        ),
        3,
        "one report per worker: {:?}",
        steps.series()
    );
    pool.shutdown().await;
}

/// A backward step lengthens sessions in the server's eyes: safe (holders fence by their own
/// clocks), so nothing may move because of it, and every worker must report it once
/// (`lease_clock_steps_total{direction="backward"}`). Watched for longer than a ttl after the
/// step, so that every worker renewed several times on the stepped clock and every lease
/// granted before the step would have run out: a worker that fenced, started a new session or
/// took a bucket because of the step shows in the log, and one that did not notice the step
/// shows in the count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backward_step_of_the_server_clock_is_reported_and_moves_nothing() {
    let steps = counters();
    let backward = || {
        steps.sum(
            "lease_clock_steps_total",
            &[("group", "backward"), ("direction", "backward")],
        )
    };
    let cluster = fake_clock_server();
    let pool = Pool::start(&cluster, "backward").await;
    pool.until_balanced(Duration::from_secs(30)).await;
    let before = pool.log.lock().expect("log").entries().len();
    let reported_before = backward();
    cluster.set_clock_offset(-15).expect("stepping the clock");
    assert_stepped(&cluster, -15);
    let stepped = Instant::now();
    // Every worker renews within one interval of the step and reports it then.
    while backward() - reported_before < 3 {
        assert!(
            stepped.elapsed() < RENEW * 3,
            "the backward step was not reported by every worker: {:?}",
            steps.series()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tokio::time::sleep(TTL + RENEW).await;
    assert!(pool.balanced(), "{:?}", pool.owned());
    let after = pool.log.lock().expect("log").entries().len();
    assert_eq!(before, after, "ownership changed after a backward step");
    assert_eq!(
        backward() - reported_before,
        3,
        "one report per worker: {:?}",
        steps.series()
    );
    assert_eq!(
        steps.sum(
            "lease_clock_steps_total",
            &[("group", "backward"), ("direction", "forward")]
        ),
        0,
        "a backward step taken for a forward one: {:?}",
        steps.series()
    );
    pool.shutdown().await;
}

/// The process's metrics recorder (one per test binary): the workers count steps of the
/// store's clock into it.
fn counters() -> &'static Counters {
    static COUNTERS: OnceLock<&'static Counters> = OnceLock::new();
    COUNTERS.get_or_init(|| {
        let counters: &'static Counters = Box::leak(Box::default());
        metrics::set_global_recorder(counters).expect("the only recorder of this test binary");
        counters
    })
}
