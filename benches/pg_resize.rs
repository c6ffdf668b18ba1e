//! Online resize on Postgres, on the wall clock: how long 8 workers take to follow a change of
//! their group's shard count, how many buckets move to do it, and that no key was ever held
//! twice across the two generations.
//!
//! One throwaway server for the whole bench (lease-testdb, from the system binaries; fsync off,
//! `LEASE_TESTDB_DURABLE=1` for a durable one, or the server `DATABASE_URL` names) and one
//! migrated database; a fresh group per run. Each run starts 8 `LeaseWorker`s in this process,
//! each on a store of its own (as 8 processes would be), on a group of 64 buckets (ttl 3 s,
//! renew 1 s, wake-ups on with the default 10 ms debounce), waits until they own 8 each and
//! then for a ttl and a renew interval more ([`STEADY`]: a pool in steady state, every worker
//! past the ttl after its start during which it defers taking dead sessions' buckets), plus
//! `(i - 1) / runs` of a renew interval in run `i` (the workers renew in phase, so this moves
//! the resize, and the abort below, to another point of their renew cycle in each run), then
//! resizes the group through a separate store (`LeaseStore::resize`, as the schema's owner):
//!
//! - **64 -> 128** and **64 -> 96**, all 8 workers alive;
//! - the same two with **one owner dead**: just before the resize one worker is aborted
//!   (`WorkerHandle::abort`, no revocation, no leave), so its 8 old buckets retire only when its
//!   session expires, and the new buckets sharing their keys wait until then.
//!
//! Measured from just before the `resize` call, on this host's clock (the server runs on it
//! too): the call's own latency; the first and the last old bucket let go (its `resharded`
//! revocation returned; the release follows); **every new bucket owned**, the first instant
//! at which the applications' ownership log has all the new generation's buckets held at once;
//! **settled**, the first poll (every 5 ms, one snapshot each) at which the drain is over in
//! the store (no old bucket left, the count is the new one), every new bucket is live, the
//! running workers' owned sets are exactly the store's owners and tokens, and their loads
//! differ by at most one.
//! Moves, from the ownership log between the resize and the settling: old buckets revoked with
//! reason `resharded`, assignments of new-generation buckets (the minimum is one per new
//! bucket), and revocations with reason `shed` (rebalancing beyond the minimum). The whole log
//! (until the workers are shut down) must pass `OwnershipLog::check`, which judges per-key
//! exclusion and token order across the two shard counts; the bench fails otherwise, and
//! prints how many pairs of old and new holdings sharing keys it judged. With one owner dead,
//! the dead session's expiry (the last `expires_at` of its member row seen in snapshots from
//! before the abort on, server clock) is printed too, with the times from it to every new
//! bucket owned and to settled, and the time until every new bucket sharing no key with the
//! dead worker's old ones was owned (those are not held back). Errors the workers report
//! (timeouts included) are counted. `LEASE_BENCH_RUNS` runs of each scenario (default 3).
//!
//! Run: `cargo bench --bench pg_resize`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease::postgres::PgLeaseStore;
use lease::store::{
    AdminStore, BucketState, Clock, GroupSnapshot, ResizeOutcome, SystemClock, Timestamp,
};
use lease::testing::{OwnershipLog, RecordingHandler};
use lease::{
    Assignment, Bucket, FencingToken, GroupName, LeaseWorker, NodeId, OwnershipEvent,
    OwnershipHandler, RevokeReason, ShardCount, WorkerError, WorkerHandle,
};

const BUCKETS: u32 = 64;
const WORKERS: usize = 8;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
/// How long the balanced pool runs before the resize: every worker has then watched the
/// store's clock for a ttl, so it may take dead sessions' buckets (`LeaseWorker` defers that
/// for a ttl after it starts), as in a pool that has been running for a while.
const STEADY: Duration = Duration::from_secs(TTL.as_secs() + RENEW.as_secs());
/// How often the settling is polled.
const POLL: Duration = Duration::from_millis(5);
/// Give up on a run after this long (the bench then fails).
const LIMIT: Duration = Duration::from_secs(30);

/// One scenario: the new count, and whether an owner dies just before the resize.
#[derive(Clone, Copy)]
struct Scenario {
    name: &'static str,
    to: u32,
    dead: bool,
}

const SCENARIOS: [Scenario; 4] = [
    Scenario {
        name: "64 -> 128, all alive",
        to: 128,
        dead: false,
    },
    Scenario {
        name: "64 -> 96, all alive",
        to: 96,
        dead: false,
    },
    Scenario {
        name: "64 -> 128, one owner dead",
        to: 128,
        dead: true,
    },
    Scenario {
        name: "64 -> 96, one owner dead",
        to: 96,
        dead: true,
    },
];

fn count(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a shard count")
}

/// The recording handler, counting the errors the worker reports.
struct Counting {
    inner: RecordingHandler,
    errors: Arc<AtomicUsize>,
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
        self.errors.fetch_add(1, Ordering::Relaxed);
        if std::env::var_os("LEASE_BENCH_VERBOSE").is_some() {
            eprintln!("{:?} {error}", SystemClock.now());
        }
    }
}

/// What the settling poll saw.
struct Settled {
    /// When it was seen, on this process's clock.
    at: Instant,
    /// The store's time of the snapshot that showed it.
    observed_at: Timestamp,
    /// The last expiry seen of the dead worker's session.
    dead_expiry: Option<Timestamp>,
}

struct Fleet {
    url: String,
    group: GroupName,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    errors: Arc<AtomicUsize>,
    workers: Vec<WorkerHandle>,
    observer: PgLeaseStore,
}

impl Fleet {
    async fn start(&mut self) {
        let store = PgLeaseStore::builder(self.url.clone())
            .max_connections(4)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a store");
        let config = LeaseWorker::builder(self.group.clone(), count(BUCKETS))
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .expect("a config");
        let handler = Counting {
            inner: RecordingHandler::new(config.node_id(), self.log.clone(), Arc::new(SystemClock)),
            errors: self.errors.clone(),
        };
        self.workers
            .push(config.start(store, handler).await.expect("start"));
    }

    /// Whether `snap` shows the workers settled on `shards` buckets (see the module's doc).
    fn settled_in(&self, snap: &GroupSnapshot, shards: u32) -> bool {
        if snap.shard_count.get() != shards || !snap.draining.is_empty() {
            return false;
        }
        let live: BTreeMap<Bucket, (NodeId, FencingToken)> = snap
            .buckets
            .iter()
            .filter(|b| b.state == BucketState::Live)
            .filter_map(|b| Some((b.bucket, (b.owner?, b.token))))
            .collect();
        let mut held = BTreeMap::new();
        let mut loads = Vec::new();
        for w in &self.workers {
            let owned = w.owned().borrow().clone();
            loads.push(owned.len());
            held.extend(owned.into_iter().map(|(b, t)| (b, (w.node_id(), t))));
        }
        let spread = loads
            .iter()
            .max()
            .zip(loads.iter().min())
            .map(|(a, b)| a - b);
        live.len() == shards as usize && held == live && spread.is_some_and(|d| d <= 1)
    }

    /// Poll until the workers settle on `shards` buckets, meanwhile following the expiry of
    /// `dead`'s session (the latest one seen, starting from `dead_expiry`). Fails after
    /// [`LIMIT`].
    async fn until_settled(
        &self,
        shards: u32,
        dead: Option<NodeId>,
        mut dead_expiry: Option<Timestamp>,
    ) -> Settled {
        let limit = Instant::now() + LIMIT;
        loop {
            let snap = self.observer.snapshot(&self.group).await;
            let at = Instant::now();
            if let Ok(snap) = snap {
                if let Some(d) = dead
                    && let Some(m) = snap.members.iter().find(|m| m.worker == d)
                {
                    dead_expiry = dead_expiry.max(Some(m.expires_at));
                }
                if self.settled_in(&snap, shards) {
                    return Settled {
                        at,
                        observed_at: snap.observed_at,
                        dead_expiry,
                    };
                }
            }
            assert!(
                Instant::now() < limit,
                "the workers never settled on {shards} buckets in {LIMIT:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The first instant at which every one of the `shards` buckets of the generation of that
/// count, but those in `except`, is held at once, by the holdings in `log`.
fn all_held_at(
    log: &OwnershipLog<Timestamp>,
    shards: u32,
    except: &BTreeSet<Bucket>,
) -> Option<Timestamp> {
    let holdings = log.holdings().expect("a well-formed log");
    let mut changes: BTreeMap<Timestamp, i64> = BTreeMap::new();
    for h in holdings.values().flatten() {
        if h.shards.get() != shards || except.contains(&h.bucket) {
            continue;
        }
        *changes.entry(h.from).or_default() += 1;
        if let Some(until) = h.until {
            *changes.entry(until).or_default() -= 1;
        }
    }
    let want = i64::from(shards) - i64::try_from(except.len()).expect("a small set");
    let mut held = 0;
    for (at, change) in changes {
        held += change;
        if held == want {
            return Some(at);
        }
    }
    None
}

/// Milliseconds from `a` to `b` on one clock (negative if `b` comes first).
fn ms_between(a: Timestamp, b: Timestamp) -> f64 {
    (b - a).num_microseconds().unwrap_or(i64::MAX) as f64 / 1_000.0
}

/// One run's figures.
struct Run {
    /// The `resize` call, ms.
    call: f64,
    /// From just before the call until every new bucket was owned, ms.
    all_owned: f64,
    /// From just before the call until settled, ms.
    settled: f64,
    /// From just before the call until the first and the last old bucket was let go (its
    /// `resharded` revocation returned), ms.
    let_go: (f64, f64),
    resharded: usize,
    assigned: usize,
    shed: usize,
    key_pairs: usize,
    errors: usize,
    /// With a dead owner: the new buckets sharing keys with its old ones.
    held_back: usize,
    /// With a dead owner: from just before the call until every other new bucket was owned, ms.
    others_owned: f64,
    /// With a dead owner: its session's expiry after the call began, then the times from that
    /// expiry to every new bucket owned and to settled (server clock), ms.
    dead: Option<(f64, f64, f64)>,
}

/// Run `i` of `runs` of `scenario`.
async fn run(url: &str, scenario: Scenario, i: usize, runs: usize) -> Run {
    let group = GroupName::new(format!("resize-{}-{}-{i}", scenario.to, scenario.dead))
        .expect("a group name");
    let observer = PgLeaseStore::builder(url.to_owned())
        .max_connections(1)
        .timeout(Duration::from_secs(2))
        .build()
        .expect("an observer");
    let mut fleet = Fleet {
        url: url.to_owned(),
        group,
        log: Arc::new(Mutex::new(OwnershipLog::new())),
        errors: Arc::new(AtomicUsize::new(0)),
        workers: Vec::new(),
        observer,
    };
    for _ in 0..WORKERS {
        fleet.start().await;
    }
    fleet.until_settled(BUCKETS, None, None).await;
    // Run i: (i - 1) / runs of a renew interval later in the renew cycle.
    let phase = RENEW.mul_f64((i - 1) as f64 / runs as f64);
    tokio::time::sleep(STEADY + phase).await;
    fleet.until_settled(BUCKETS, None, None).await;
    let (from, to) = (count(BUCKETS), count(scenario.to));

    let mut dead = None;
    let mut dead_expiry = None;
    let mut held_back = BTreeSet::new();
    if scenario.dead {
        let victim = fleet.workers.remove(0);
        let id = victim.node_id();
        let snap = fleet
            .observer
            .snapshot(&fleet.group)
            .await
            .expect("a snapshot");
        dead_expiry = snap
            .members
            .iter()
            .find(|m| m.worker == id)
            .map(|m| m.expires_at);
        held_back = snap
            .buckets
            .iter()
            .filter(|b| b.owner == Some(id) && b.state == BucketState::Live)
            .flat_map(|b| lease::store::resize::children(from, to, b.bucket))
            .collect();
        victim.abort();
        fleet
            .log
            .lock()
            .expect("the log")
            .crashed(id, SystemClock.now());
        dead = Some(id);
    }

    let (start, start_wall) = (Instant::now(), SystemClock.now());
    let outcome = fleet
        .observer
        .resize(&fleet.group, from, to)
        .await
        .expect("the resize");
    let call = start.elapsed();
    assert!(
        matches!(outcome, ResizeOutcome::Started { .. }),
        "{outcome:?}"
    );
    let settled = fleet.until_settled(scenario.to, dead, dead_expiry).await;
    let at_settling = fleet.log.lock().expect("the log").clone();

    for w in fleet.workers {
        w.shutdown().await.expect("a clean stop");
    }
    let summary = fleet
        .log
        .lock()
        .expect("the log")
        .check()
        .unwrap_or_else(|e| panic!("ownership log of {}: {e}", scenario.name));
    assert!(summary.key_pairs > 0, "no key pair judged: {summary:?}");

    let all_held = all_held_at(&at_settling, scenario.to, &BTreeSet::new())
        .expect("every new bucket held by the time the workers settled");
    let others_held = all_held_at(&at_settling, scenario.to, &held_back)
        .expect("every new bucket held by the time the workers settled");
    let (mut resharded, mut assigned, mut shed) = (0, 0, 0);
    let (mut first_let_go, mut last_let_go) = (None, None);
    for e in at_settling.entries().iter().filter(|e| e.at >= start_wall) {
        match e.event {
            OwnershipEvent::Assigned(a) if a.shards == to => assigned += 1,
            OwnershipEvent::Revoked {
                reason: RevokeReason::Resharded,
                ..
            } => {
                resharded += 1;
                first_let_go = Some(first_let_go.map_or(e.at, |t: Timestamp| t.min(e.at)));
                last_let_go = last_let_go.max(Some(e.at));
            }
            OwnershipEvent::Revoked {
                reason: RevokeReason::Shed,
                ..
            } => shed += 1,
            _ => {}
        }
    }
    let dead = settled.dead_expiry.filter(|_| scenario.dead).map(|expiry| {
        (
            ms_between(start_wall, expiry),
            ms_between(expiry, all_held),
            ms_between(expiry, settled.observed_at),
        )
    });
    assert!(
        !scenario.dead || dead.is_some(),
        "the dead worker's session was never seen"
    );
    Run {
        call: call.as_secs_f64() * 1_000.0,
        all_owned: ms_between(start_wall, all_held),
        settled: (settled.at - start).as_secs_f64() * 1_000.0,
        let_go: (
            first_let_go.map_or(f64::NAN, |t| ms_between(start_wall, t)),
            last_let_go.map_or(f64::NAN, |t| ms_between(start_wall, t)),
        ),
        resharded,
        assigned,
        shed,
        key_pairs: summary.key_pairs,
        errors: fleet.errors.load(Ordering::Relaxed),
        held_back: held_back.len(),
        others_owned: ms_between(start_wall, others_held),
        dead,
    }
}

/// Median, minimum and maximum.
fn stats(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// `a` if every value is `a`, else `min-max`.
fn range(v: impl IntoIterator<Item = usize>) -> String {
    let v: Vec<usize> = v.into_iter().collect();
    match (v.iter().min(), v.iter().max()) {
        (Some(a), Some(b)) if a == b => a.to_string(),
        (Some(a), Some(b)) => format!("{a}-{b}"),
        _ => "-".to_owned(),
    }
}

fn main() {
    let runs: usize = std::env::var("LEASE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let url = rt.block_on(lease_testdb::database()).url;
    println!(
        "online resize: {WORKERS} workers (each on a store of its own), {BUCKETS} buckets, ttl \
         {TTL:?}, renew {RENEW:?}, wake-ups on; ms from just before the resize call"
    );
    println!();
    println!(
        "| scenario | run | resize call | first old bucket let go | last old bucket let go | \
         every new bucket owned | settled | resharded | new assignments | shed | minimum | key \
         pairs | worker errors | dead session expired | expiry -> every new bucket owned | \
         expiry -> settled |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut all: Vec<(Scenario, Vec<Run>)> = Vec::new();
    for scenario in SCENARIOS {
        let mut done = Vec::new();
        for i in 1..=runs {
            let r = rt.block_on(run(&url, scenario, i, runs));
            let dead = r.dead.map_or_else(
                || "- | - | -".to_owned(),
                |(expired, owned, settled)| format!("{expired:.1} | {owned:.1} | {settled:.1}"),
            );
            println!(
                "| {} | {i} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {} | {} | {} \
                 | {dead} |",
                scenario.name,
                r.call,
                r.let_go.0,
                r.let_go.1,
                r.all_owned,
                r.settled,
                r.resharded,
                r.assigned,
                r.shed,
                scenario.to,
                r.key_pairs,
                r.errors
            );
            done.push(r);
        }
        all.push((scenario, done));
    }

    println!();
    println!(
        "| scenario | runs | every new bucket owned, ms: median / min / max | settled, ms: \
         median / min / max | resize call, ms: median | moves: resharded / new assignments / \
         shed (minimum) | key pairs judged |"
    );
    println!("|---|---:|---|---|---:|---|---:|");
    for (scenario, done) in &all {
        let (a, a_min, a_max) = stats(done.iter().map(|r| r.all_owned).collect());
        let (b, b_min, b_max) = stats(done.iter().map(|r| r.settled).collect());
        let (call, _, _) = stats(done.iter().map(|r| r.call).collect());
        println!(
            "| {} | {} | {a:.1} / {a_min:.1} / {a_max:.1} | {b:.1} / {b_min:.1} / {b_max:.1} | \
             {call:.1} | {} / {} / {} ({}) | {} |",
            scenario.name,
            done.len(),
            range(done.iter().map(|r| r.resharded)),
            range(done.iter().map(|r| r.assigned)),
            range(done.iter().map(|r| r.shed)),
            scenario.to,
            range(done.iter().map(|r| r.key_pairs)),
        );
    }

    println!();
    println!(
        "| one owner dead | runs | new buckets held back | the others owned, ms after the call \
         began: median / min / max | its session expired, ms after the call began: median / min \
         / max | expiry -> every new bucket owned, ms: median / min / max | expiry -> settled, \
         ms: median / min / max |"
    );
    println!("|---|---:|---:|---|---|---|---|");
    for (scenario, done) in all.iter().filter(|(s, _)| s.dead) {
        let dead: Vec<(f64, f64, f64)> = done.iter().filter_map(|r| r.dead).collect();
        let (e, e_min, e_max) = stats(dead.iter().map(|d| d.0).collect());
        let (o, o_min, o_max) = stats(dead.iter().map(|d| d.1).collect());
        let (s, s_min, s_max) = stats(dead.iter().map(|d| d.2).collect());
        let (h, h_min, h_max) = stats(done.iter().map(|r| r.others_owned).collect());
        println!(
            "| {} | {} | {} | {h:.1} / {h_min:.1} / {h_max:.1} | {e:.1} / {e_min:.1} / \
             {e_max:.1} | {o:.1} / {o_min:.1} / {o_max:.1} | {s:.1} / {s_min:.1} / {s_max:.1} |",
            scenario.name,
            done.len(),
            range(done.iter().map(|r| r.held_back)),
        );
    }
}
