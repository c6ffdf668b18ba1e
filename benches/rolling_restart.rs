//! A rolling restart, on the wall clock: how many buckets move while 4 nodes sharing one group
//! of 64 buckets are restarted one after another, how many claims that costs, and how long
//! each restart takes until the pool is balanced again, in three ways of restarting a node.
//!
//! Each run starts 4 nodes (`LeaseNode`, ttl 3 s, renew 1 s, wake-ups on with the default
//! 10 ms debounce) in this process, each with a node id of its own, and adds a fresh group of
//! 64 buckets to each (`NodeHandle::add_group`, a `RecordingHandler` writing into one
//! ownership log); waits until their applications own 16 each, then for a ttl and a renew
//! interval more ([`STEADY`]: every node past the ttl after its start during which it defers
//! taking dead sessions' buckets), and checks that they still do. Then, for k = 1..4: node k
//! is stopped gracefully (`NodeHandle::shutdown`, awaited), its replacement is started at once
//! and added to the group, and the bench waits until the pool is **balanced** again (the
//! first poll, every 1 ms, at which the 4 running nodes' applications own 16 buckets each,
//! so every bucket is owned) before restarting the next. (So the next stop follows a re-balance
//! at once: a re-plan the other nodes still have due, the debounced wake-up from the previous
//! restart's changes or a renew tick, can fall between a stop and its replacement's first
//! claim; they then take some of the released buckets and shed them to the replacement later.)
//! The three modes differ only in the replacement:
//!
//! - **plain**: a node with a fresh node id (the stop revokes, leaves the group, releases);
//! - **sticky**: a node with the same node id (the stop as in plain; the store's sticky
//!   claims, rule C9, give it its last-held buckets first among the claimable ones);
//! - **handover**: the same node id, and every node built with `keep_on_stop(10 s)`: the stop
//!   revokes, then hands the session over instead of leaving (HO1); the successor's first
//!   heartbeat takes it over with its buckets under their tokens (HO3).
//!
//! Measured from the ownership log between the first stop and the last re-balance (entries
//! recorded from just before node 1's `shutdown` call until the poll that saw the last
//! re-balance): **moves**, assignments of a bucket to a node other than the node that last
//! held it (the last holder of every bucket is followed through the whole log from the start,
//! by node id, so a node taking its own bucket back is no move); **assignments**; revocations
//! by reason (`shutdown`, `shed`, any other); **claims**, the sum of the 64 buckets' fencing
//! tokens in the store's snapshot at the last re-balance minus that just before the first stop
//! (each claim raises a token by one; a hand-over raises none); and **per restart to
//! balanced**, from just before node k's `shutdown` call until the poll that saw the pool
//! balanced again, median (the upper one of the 4) and max over the restarts. The whole log
//! (until the nodes are shut down at the end) must pass `OwnershipLog::check`; the bench fails
//! otherwise, or when a pool does not balance within [`LIMIT`]. `LEASE_BENCH_RUNS` runs of each
//! mode (default 1; with more, counts show as `min-max` over the runs and the times are taken
//! over every restart of every run). `LEASE_BENCH_VERBOSE=1` also prints every restart: the
//! stop call's time, the moves to the replacement and to the other nodes, how many of the
//! stopped node's buckets the replacement got back (directly or after a detour through other
//! nodes), when the first bucket was assigned to the replacement and to another node (by the
//! times the handler stamped), and the errors the nodes reported to their handlers.
//!
//! Stores: always the memory store (one `MemoryLeaseStore::new()`, the host's clock, shared by
//! every node of the section; a fresh group per run); with `LEASE_BENCH_PG=1` Postgres too (one
//! throwaway server from lease-testdb, fsync off, `LEASE_TESTDB_DURABLE=1` for a durable one,
//! or the server `DATABASE_URL` names; one migrated database; a `PgLeaseStore` of its own per
//! node, as a process would have; a fresh group per run).
//!
//! Run: `cargo bench --bench rolling_restart` (`LEASE_BENCH_PG=1 cargo bench --bench
//! rolling_restart` for both stores).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease::memory::MemoryLeaseStore;
use lease::postgres::PgLeaseStore;
use lease::store::{Clock, LeaseStore, SystemClock, Timestamp};
use lease::testing::{OwnershipLog, RecordingHandler};
use lease::{
    Assignment, Bucket, FencingToken, GroupHandle, GroupName, LeaseNode, NodeHandle, NodeId,
    OwnershipEvent, OwnershipHandler, RevokeReason, ShardCount, WorkerError,
};

const NODES: usize = 4;
const BUCKETS: u32 = 64;
/// Each node's share when balanced.
const SHARE: usize = BUCKETS as usize / NODES;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
/// How long a handed-over session waits for its successor (mode handover).
const KEEP: Duration = Duration::from_secs(10);
/// How long the balanced pool runs before the first restart: every node has then watched the
/// store's clock for a ttl, so it may take dead sessions' buckets, as in a pool that has been
/// running for a while.
const STEADY: Duration = Duration::from_secs(TTL.as_secs() + RENEW.as_secs());
/// How often the balance is polled.
const POLL: Duration = Duration::from_millis(1);
/// Give up on a wait for balance after this long (the bench then fails).
const LIMIT: Duration = Duration::from_secs(30);

/// How a stopped node is replaced.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    /// A fresh node id.
    Plain,
    /// The same node id.
    Sticky,
    /// The same node id, every node handing its session over on stop.
    Handover,
}

const MODES: [Mode; 3] = [Mode::Plain, Mode::Sticky, Mode::Handover];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Sticky => "sticky",
            Self::Handover => "handover",
        }
    }
}

type Log = Arc<Mutex<OwnershipLog<Timestamp>>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The errors the nodes of a run reported: how many, and the first one.
#[derive(Default)]
struct Errors {
    count: AtomicUsize,
    first: Mutex<Option<String>>,
}

/// The recording handler, counting the errors the node reports.
struct Counting {
    inner: RecordingHandler,
    errors: Arc<Errors>,
}

#[async_trait]
impl OwnershipHandler for Counting {
    async fn on_assigned(&self, assignment: Assignment) {
        self.inner.on_assigned(assignment).await;
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.inner.on_revoked(bucket, token, reason).await;
    }

    async fn on_error(&self, error: &WorkerError) {
        self.errors.count.fetch_add(1, Ordering::Relaxed);
        lock(&self.errors.first).get_or_insert_with(|| error.to_string());
    }
}

/// Where the nodes of a section keep their leases: a store per node, and one to observe.
struct Stores {
    name: &'static str,
    /// The store of a node being started.
    new_store: Box<dyn Fn() -> Arc<dyn LeaseStore>>,
    /// The store the bench reads snapshots from.
    observer: Arc<dyn LeaseStore>,
}

/// The running nodes of a run, each with its group.
struct Pool<'a> {
    stores: &'a Stores,
    mode: Mode,
    group: GroupName,
    log: Log,
    errors: Arc<Errors>,
    nodes: Vec<(NodeHandle, GroupHandle)>,
}

impl Pool<'_> {
    /// Start a node with id `id` and add the group to it.
    async fn start(&self, id: NodeId) -> (NodeHandle, GroupHandle) {
        let mut builder = LeaseNode::builder()
            .ttl(TTL)
            .renew_interval(RENEW)
            .node_id(id);
        if self.mode == Mode::Handover {
            builder = builder.keep_on_stop(KEEP);
        }
        let node = builder
            .build()
            .expect("a valid configuration")
            .start((self.stores.new_store)())
            .expect("the node starts");
        let handler = Counting {
            inner: RecordingHandler::new(id, self.log.clone(), Arc::new(SystemClock)),
            errors: self.errors.clone(),
        };
        let group = node
            .add_group(
                self.group.clone(),
                ShardCount::new(BUCKETS).expect("a shard count"),
                handler,
            )
            .await
            .expect("the group is added");
        (node, group)
    }

    /// Whether every node runs and its application owns its share.
    fn balanced(&self) -> bool {
        self.nodes.len() == NODES
            && self
                .nodes
                .iter()
                .all(|(_, g)| g.owned().borrow().len() == SHARE)
    }

    /// Poll until [`balanced`](Self::balanced); when it was seen. Fails after [`LIMIT`].
    async fn until_balanced(&self, what: &str) -> Instant {
        let limit = Instant::now() + LIMIT;
        loop {
            if self.balanced() {
                return Instant::now();
            }
            assert!(
                Instant::now() < limit,
                "{} ({}): not balanced in {LIMIT:?} ({what}): {:?}",
                self.stores.name,
                self.mode.name(),
                self.nodes
                    .iter()
                    .map(|(_, g)| g.owned().borrow().len())
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The sum of the group's tokens in the store.
    async fn token_sum(&self) -> i64 {
        self.stores
            .observer
            .snapshot(&self.group)
            .await
            .expect("a snapshot")
            .buckets
            .iter()
            .map(|b| b.token.0)
            .sum()
    }

    fn log_len(&self) -> usize {
        lock(&self.log).entries().len()
    }
}

/// One restart's figures.
#[derive(Default)]
struct Restart {
    /// The `shutdown` call, ms.
    stop: f64,
    /// From just before the `shutdown` call until balanced again, ms.
    balanced: f64,
    /// Moves to the replacement and to the other nodes.
    to_replacement: usize,
    to_others: usize,
    /// Assignments to the replacement of buckets the stopped node held last (with or without
    /// a detour through other nodes).
    back: usize,
    /// The first assignment to the replacement and to another node, ms after the stop began.
    first: (Option<f64>, Option<f64>),
}

/// One run's figures.
struct Run {
    moves: usize,
    assignments: usize,
    revoked: BTreeMap<&'static str, usize>,
    claims: i64,
    restarts: Vec<Restart>,
    errors: usize,
    first_error: Option<String>,
}

impl Run {
    fn revoked(&self, reason: RevokeReason) -> usize {
        self.revoked.get(reason.as_str()).copied().unwrap_or(0)
    }

    fn revoked_other(&self) -> usize {
        self.revoked.values().sum::<usize>()
            - self.revoked(RevokeReason::Shutdown)
            - self.revoked(RevokeReason::Shed)
    }
}

/// Run `i` of `mode` on `stores`.
async fn run(stores: &Stores, mode: Mode, i: usize) -> Run {
    let group = GroupName::new(format!("rolling-{}-{i}", mode.name())).expect("a group name");
    let mut pool = Pool {
        stores,
        mode,
        group,
        log: Arc::new(Mutex::new(OwnershipLog::new())),
        errors: Arc::new(Errors::default()),
        nodes: Vec::new(),
    };
    for _ in 0..NODES {
        let node = pool.start(NodeId::new()).await;
        pool.nodes.push(node);
    }
    pool.until_balanced("cold start").await;
    tokio::time::sleep(STEADY).await;
    pool.until_balanced("steady").await;

    let tokens_before = pool.token_sum().await;
    // The log's length before each stop, then at the last re-balance.
    let mut bounds = Vec::new();
    // Per restart: the stopped node, its replacement, when the stop began (the clock the
    // handlers stamp with).
    let mut who = Vec::new();
    let mut restarts = Vec::new();
    for k in 0..NODES {
        bounds.push(pool.log_len());
        let (start, start_wall) = (Instant::now(), SystemClock.now());
        let (node, group) = pool.nodes.remove(k);
        let id = node.node_id();
        drop(group);
        node.shutdown().await.unwrap_or_else(|e| {
            panic!("{} ({}): stopping node {k}: {e}", stores.name, mode.name())
        });
        let stop = start.elapsed();
        let successor = if mode == Mode::Plain {
            NodeId::new()
        } else {
            id
        };
        let replacement = pool.start(successor).await;
        pool.nodes.insert(k, replacement);
        let at = pool.until_balanced(&format!("restart {}", k + 1)).await;
        who.push((id, successor, start_wall));
        restarts.push(Restart {
            stop: stop.as_secs_f64() * 1_000.0,
            balanced: (at - start).as_secs_f64() * 1_000.0,
            ..Restart::default()
        });
    }
    bounds.push(pool.log_len());
    let tokens_after = pool.token_sum().await;

    for (node, _) in std::mem::take(&mut pool.nodes) {
        node.shutdown().await.expect("a clean stop");
    }
    let log = lock(&pool.log).clone();
    log.check().unwrap_or_else(|e| {
        panic!(
            "{} ({}): ownership log of run {i}: {e}",
            stores.name,
            mode.name()
        )
    });

    // Follow each bucket's last holder through the whole log; count within the restarts.
    let entries = log.entries();
    let mut last: BTreeMap<Bucket, NodeId> = BTreeMap::new();
    let (mut assignments, mut revoked) = (0, BTreeMap::new());
    for e in &entries[..bounds[0]] {
        if let OwnershipEvent::Assigned(a) = e.event {
            last.insert(a.bucket, e.worker);
        }
    }
    for (k, r) in restarts.iter_mut().enumerate() {
        let (stopped, successor, began) = who[k];
        let held: BTreeSet<Bucket> = last
            .iter()
            .filter(|&(_, &w)| w == stopped)
            .map(|(&b, _)| b)
            .collect();
        for e in &entries[bounds[k]..bounds[k + 1]] {
            match e.event {
                OwnershipEvent::Assigned(a) => {
                    assignments += 1;
                    let moved = last
                        .insert(a.bucket, e.worker)
                        .is_some_and(|w| w != e.worker);
                    let mine = e.worker == successor;
                    let after = ms_between(began, e.at);
                    if mine {
                        r.first.0.get_or_insert(after);
                        r.to_replacement += usize::from(moved);
                        r.back += usize::from(held.contains(&a.bucket));
                    } else {
                        r.first.1.get_or_insert(after);
                        r.to_others += usize::from(moved);
                    }
                }
                OwnershipEvent::Revoked { reason, .. } => {
                    *revoked.entry(reason.as_str()).or_default() += 1;
                }
            }
        }
    }
    Run {
        moves: restarts
            .iter()
            .map(|r| r.to_replacement + r.to_others)
            .sum(),
        assignments,
        revoked,
        claims: tokens_after - tokens_before,
        restarts,
        errors: pool.errors.count.load(Ordering::Relaxed),
        first_error: lock(&pool.errors.first).clone(),
    }
}

/// Milliseconds from `a` to `b` on one clock (negative if `b` comes first).
fn ms_between(a: Timestamp, b: Timestamp) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1_000.0
}

/// `a` if every value is `a`, else `min-max`.
fn range<T: Ord + Copy + std::fmt::Display>(v: impl IntoIterator<Item = T>) -> String {
    let v: Vec<T> = v.into_iter().collect();
    match (v.iter().min(), v.iter().max()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}-{b}"),
        _ => "-".to_owned(),
    }
}

/// Median (the upper one of an even count) and maximum.
fn median_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

/// Every mode, `runs` times each, on `stores`: a table row per mode as it completes.
async fn section(stores: &Stores, runs: usize, verbose: bool) {
    let began = Instant::now();
    println!();
    println!(
        "rolling restart on {}: {NODES} nodes x {BUCKETS} buckets (one group), ttl {TTL:?}, \
         renew {RENEW:?}, wake-ups on; {runs} run(s) per mode",
        stores.name
    );
    println!();
    println!(
        "| mode | moves | assignments | revoked (shutdown/shed/other) | claims (token sum \
         delta) | per restart to balanced, median / max ms |"
    );
    println!("|---|---:|---:|---|---:|---|");
    let mut details = Vec::new();
    for mode in MODES {
        let mut done = Vec::new();
        for i in 1..=runs {
            done.push(run(stores, mode, i).await);
        }
        let (median, max) = median_max(
            done.iter()
                .flat_map(|r| r.restarts.iter().map(|s| s.balanced))
                .collect(),
        );
        println!(
            "| {} | {} | {} | {} / {} / {} | {} | {median:.1} / {max:.1} |",
            mode.name(),
            range(done.iter().map(|r| r.moves)),
            range(done.iter().map(|r| r.assignments)),
            range(done.iter().map(|r| r.revoked(RevokeReason::Shutdown))),
            range(done.iter().map(|r| r.revoked(RevokeReason::Shed))),
            range(done.iter().map(Run::revoked_other)),
            range(done.iter().map(|r| r.claims)),
        );
        details.push((mode, done));
    }
    println!();
    println!(
        "({}: {:.1} s in all)",
        stores.name,
        began.elapsed().as_secs_f64()
    );
    if verbose {
        println!();
        println!(
            "| mode | run | restart | stop call ms | to balanced ms | moves to the replacement | \
             moves to the others | the stopped node's buckets back to the replacement | first \
             assignment to the replacement / to another node, ms after the stop began |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---|");
        for (mode, done) in &details {
            for (i, r) in done.iter().enumerate() {
                for (k, s) in r.restarts.iter().enumerate() {
                    let ms =
                        |t: Option<f64>| t.map_or_else(|| "-".to_owned(), |t| format!("{t:.1}"));
                    println!(
                        "| {} | {} | {} | {:.1} | {:.1} | {} | {} | {} | {} / {} |",
                        mode.name(),
                        i + 1,
                        k + 1,
                        s.stop,
                        s.balanced,
                        s.to_replacement,
                        s.to_others,
                        s.back,
                        ms(s.first.0),
                        ms(s.first.1)
                    );
                }
            }
        }
        for (mode, done) in &details {
            for (i, r) in done.iter().enumerate() {
                println!(
                    "{} run {}: revoked {:?}; {} error(s) reported{}",
                    mode.name(),
                    i + 1,
                    r.revoked,
                    r.errors,
                    r.first_error
                        .as_ref()
                        .map_or_else(String::new, |e| format!(", the first: {e}"))
                );
            }
        }
    }
}

fn main() {
    let runs: usize = std::env::var("LEASE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let verbose = std::env::var_os("LEASE_BENCH_VERBOSE").is_some_and(|v| v != "0");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");

    let memory: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
    let shared = memory.clone();
    let stores = Stores {
        name: "the memory store",
        new_store: Box::new(move || shared.clone()),
        observer: memory,
    };
    rt.block_on(section(&stores, runs, verbose));

    if std::env::var("LEASE_BENCH_PG").is_ok_and(|v| v == "1") {
        rt.block_on(async {
            let url = lease_testdb::database().await.url;
            let store = move |connections: usize| -> Arc<dyn LeaseStore> {
                Arc::new(
                    PgLeaseStore::builder(url.clone())
                        .max_connections(connections)
                        .timeout(Duration::from_secs(2))
                        .build()
                        .expect("a store"),
                )
            };
            let observer = store(1);
            let stores = Stores {
                name: "Postgres",
                new_store: Box::new(move || store(4)),
                observer,
            };
            section(&stores, runs, verbose).await;
        });
    } else {
        println!();
        println!("(Postgres skipped: set LEASE_BENCH_PG=1 to run it too)");
    }
}
