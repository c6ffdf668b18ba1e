//! A graceful stop of a worker holding many buckets, on the wall clock: how long the stop takes
//! (revoking every bucket in the application, then leaving the group), and whether a peer can
//! be handed a bucket before the stopping worker's application was told to stop working on it.
//!
//! For each size N (8,192, 32,768 and 65,536 buckets; `LEASE_BENCH_SIZES=8192,1024` for
//! others) a worker (`LeaseWorker`, one group of N buckets, an `OwnershipHandler` that returns
//! at once and stamps every revocation) starts alone on a fresh group and is waited for until
//! its application owns all N. Then, in three settings:
//!
//! - **cost** (ttl 30 s, renew 10 s: `leasectl worker`'s defaults, so no renewal is due during
//!   the stop): the time from the `shutdown` call until it returns, and until the last
//!   revocation reached the application;
//! - **peer** (ttl 3 s, renew 500 ms, the default margin of 500 ms): the same, with a peer
//!   started at the stop: a session of its own on the same store that joins the group and
//!   claims every 50 ms, taking dead sessions' buckets at once (`Takeover::Allowed`, as a
//!   peer that has watched the store's clock for a ttl does), in batches of 512 like a worker.
//!   Reported: how many buckets the peer won before the stopping worker's application heard
//!   their revocation (**held twice**), the longest such overlap, and when the peer won its
//!   first bucket (after the stop began);
//! - **slow** (as peer, N = 8,192 only): the application takes 1 ms over each revocation
//!   (at least: a tokio sleep), so the stop lasts more than two ttls and must renew meanwhile.
//!
//! Stores: the memory store (one `MemoryLeaseStore::new()` per run); with `LEASE_BENCH_PG=1`
//! Postgres too (one throwaway server from lease-testdb, fsync off, or the server
//! `DATABASE_URL` names; a fresh group per run; a `PgLeaseStore` for the worker and one for
//! the peer; `ANALYZE lease.shards` once the worker owns its group, see [`analyze`]).
//!
//! Run: `cargo bench --bench worker_stop` (`LEASE_BENCH_PG=1 cargo bench --bench worker_stop`
//! for both stores).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease::memory::MemoryLeaseStore;
use lease::postgres::PgLeaseStore;
use lease::store::{Incarnation, LeaseStore, Takeover};
use lease::{
    Assignment, Bucket, FencingToken, GroupName, LeaseWorker, MemberMetadata, NodeId,
    OwnershipHandler, RevokeReason, ShardCount, Ttl,
};

const SIZES: [u32; 3] = [8_192, 32_768, 65_536];
/// Give up waiting for the worker to own its group after this long (the bench then fails).
const LIMIT: Duration = Duration::from_secs(600);
/// How often the peer heartbeats and claims.
const PEER_EVERY: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The stopping worker's application: counts assignments, stamps revocations (when it is
/// told), then takes `delay` to finish with each.
#[derive(Clone, Default)]
struct Stamping {
    assigned: Arc<AtomicUsize>,
    revoked: Arc<Mutex<HashMap<Bucket, (Instant, RevokeReason)>>>,
    delay: Duration,
}

#[async_trait]
impl OwnershipHandler for Stamping {
    async fn on_assigned(&self, _assignment: Assignment) {
        self.assigned.fetch_add(1, Ordering::Relaxed);
    }

    async fn on_revoked(&self, bucket: Bucket, _token: FencingToken, reason: RevokeReason) {
        lock(&self.revoked).insert(bucket, (Instant::now(), reason));
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
    }
}

/// A timing of the worker.
#[derive(Clone, Copy)]
struct Setting {
    name: &'static str,
    ttl: Duration,
    renew: Duration,
    peer: bool,
    /// How long the application takes with each revocation.
    delay: Duration,
    /// The largest size the setting runs.
    up_to: u32,
}

const SETTINGS: [Setting; 3] = [
    Setting {
        name: "cost",
        ttl: Duration::from_secs(30),
        renew: Duration::from_secs(10),
        peer: false,
        delay: Duration::ZERO,
        up_to: u32::MAX,
    },
    Setting {
        name: "peer",
        ttl: Duration::from_secs(3),
        renew: Duration::from_millis(500),
        peer: true,
        delay: Duration::ZERO,
        up_to: u32::MAX,
    },
    // A slow application: 8,192 revocations take more than 8 s, over two ttls.
    Setting {
        name: "slow",
        ttl: Duration::from_secs(3),
        renew: Duration::from_millis(500),
        peer: true,
        delay: Duration::from_millis(1),
        up_to: 8_192,
    },
];

/// What one stop measured.
struct Measured {
    stop: Duration,
    last_revoke: Duration,
    reasons: HashMap<RevokeReason, usize>,
    held_twice: usize,
    longest_overlap: Duration,
    peer_first: Option<Duration>,
}

/// A peer on `store`: heartbeats, joins `group` and claims everything it can every
/// [`PEER_EVERY`] until `done` is cancelled; returns when it won each bucket.
async fn peer(
    store: Arc<dyn LeaseStore>,
    group: GroupName,
    done: tokio_util::sync::CancellationToken,
) -> HashMap<Bucket, Instant> {
    let me = NodeId::new();
    let incarnation = Incarnation::new();
    let ttl = Ttl::new(Duration::from_secs(3)).expect("ttl");
    let mut won = HashMap::new();
    let mut joined = None;
    while !done.is_cancelled() {
        if let Ok(beat) = store
            .heartbeat(me, incarnation, ttl, &MemberMetadata::empty(), &[])
            .await
        {
            if joined != Some(beat.session) && store.join(&group, me, beat.session).await.is_ok() {
                joined = Some(beat.session);
            }
            if let Some(session) = joined {
                loop {
                    match store
                        .claim(&group, me, session, 512, Takeover::Allowed)
                        .await
                    {
                        Ok(leases) if !leases.is_empty() => {
                            let at = Instant::now();
                            for l in leases {
                                won.entry(l.bucket).or_insert(at);
                            }
                        }
                        _ => break,
                    }
                }
            }
        }
        tokio::select! {
            () = done.cancelled() => {}
            () = tokio::time::sleep(PEER_EVERY) => {}
        }
    }
    won
}

/// The stores of a run: the worker's and the peer's, on one backend.
type Stores = dyn Fn() -> (Arc<dyn LeaseStore>, Arc<dyn LeaseStore>);

/// Postgres only: refresh the planner's statistics once the worker owns its group, as
/// autovacuum would on a group that has run for a while. A group created moments before has
/// none, and the leave's `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)` is then planned
/// as a nested loop that runs the subquery once per bucket: a leave of 8,192 buckets took 65 s
/// that way (the stop's leave times out), which is not what this bench measures.
async fn analyze(url: &str) {
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .expect("a connection");
    conn.batch_execute("ANALYZE lease.shards")
        .await
        .expect("ANALYZE");
}

async fn run(stores: &Stores, analyzed: Option<&str>, n: u32, setting: Setting) -> Measured {
    let (store, peer_store) = stores();
    let group = GroupName::new(format!(
        "stop-{}-{n}-{}",
        setting.name,
        uuid::Uuid::new_v4()
    ))
    .expect("a group name");
    let handler = Stamping {
        delay: setting.delay,
        ..Stamping::default()
    };
    let worker = LeaseWorker::builder(group.clone(), ShardCount::new(n).expect("a count"))
        .ttl(setting.ttl)
        .renew_interval(setting.renew)
        .build()
        .expect("a valid configuration")
        .start(store, handler.clone())
        .await
        .expect("the worker starts");
    let started = Instant::now();
    while handler.assigned.load(Ordering::Relaxed) < n as usize {
        assert!(
            started.elapsed() < LIMIT,
            "the worker owns {} of {n} after {LIMIT:?}",
            handler.assigned.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if let Some(url) = analyzed {
        analyze(url).await;
    }
    // Steady: let a renewal pass so the stop does not begin on a fresh heartbeat by chance.
    tokio::time::sleep(setting.renew / 2).await;
    let done = tokio_util::sync::CancellationToken::new();
    let peer_task = setting
        .peer
        .then(|| tokio::spawn(peer(peer_store, group.clone(), done.clone())));
    let begin = Instant::now();
    let ended = worker.shutdown().await;
    let stop = begin.elapsed();
    if let Err(e) = ended {
        println!("    (the stop ended with an error: {e})");
    }
    let won = match peer_task {
        Some(task) => {
            // Long enough for the peer to take whatever the stop let go of.
            tokio::time::sleep(Duration::from_millis(300)).await;
            done.cancel();
            task.await.expect("the peer ran")
        }
        None => HashMap::new(),
    };
    let revoked = std::mem::take(&mut *lock(&handler.revoked));
    let last_revoke = revoked
        .values()
        .map(|(at, _)| at.saturating_duration_since(begin))
        .max()
        .unwrap_or_default();
    let mut reasons = HashMap::new();
    for (_, reason) in revoked.values() {
        *reasons.entry(*reason).or_insert(0) += 1;
    }
    let mut held_twice = 0;
    let mut longest_overlap = Duration::ZERO;
    for (bucket, peer_at) in &won {
        if let Some((revoked_at, _)) = revoked.get(bucket)
            && revoked_at > peer_at
        {
            held_twice += 1;
            longest_overlap = longest_overlap.max(*revoked_at - *peer_at);
        }
    }
    let peer_first = won
        .values()
        .min()
        .map(|at| at.saturating_duration_since(begin));
    Measured {
        stop,
        last_revoke,
        reasons,
        held_twice,
        longest_overlap,
        peer_first,
    }
}

async fn section(name: &str, stores: &Stores, analyzed: Option<&str>, sizes: &[u32]) {
    println!();
    println!("## {name}");
    for setting in SETTINGS {
        println!();
        let runs: Vec<u32> = sizes
            .iter()
            .copied()
            .filter(|&n| n <= setting.up_to)
            .collect();
        if runs.is_empty() {
            continue;
        }
        println!(
            "{} (ttl {:?}, renew {:?}{}{}):",
            setting.name,
            setting.ttl,
            setting.renew,
            if setting.peer {
                ", a peer claiming from the stop on"
            } else {
                ""
            },
            if setting.delay.is_zero() {
                String::new()
            } else {
                format!(", the application takes {:?} per revocation", setting.delay)
            }
        );
        for n in runs {
            let m = run(stores, analyzed, n, setting).await;
            let mut reasons: Vec<String> = m
                .reasons
                .iter()
                .map(|(r, k)| format!("{} {k}", r.as_str()))
                .collect();
            reasons.sort();
            print!(
                "  N = {n:>6}: stop {:>8.3} s, last revocation at {:>8.3} s ({})",
                m.stop.as_secs_f64(),
                m.last_revoke.as_secs_f64(),
                reasons.join(", ")
            );
            if setting.peer {
                print!(
                    "; held twice {} (longest {:.3} s), the peer's first bucket at {}",
                    m.held_twice,
                    m.longest_overlap.as_secs_f64(),
                    m.peer_first
                        .map_or("-".to_owned(), |d| format!("{:.3} s", d.as_secs_f64()))
                );
            }
            println!();
        }
    }
}

fn main() {
    let sizes: Vec<u32> = match std::env::var("LEASE_BENCH_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().parse().expect("LEASE_BENCH_SIZES: whole numbers"))
            .collect(),
        Err(_) => SIZES.to_vec(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let memory = || -> (Arc<dyn LeaseStore>, Arc<dyn LeaseStore>) {
        let store: Arc<dyn LeaseStore> = Arc::new(MemoryLeaseStore::new());
        (store.clone(), store)
    };
    rt.block_on(section("The memory store", &memory, None, &sizes));
    if std::env::var("LEASE_BENCH_PG").is_ok_and(|v| v == "1") {
        rt.block_on(async {
            let url = lease_testdb::database().await.url;
            let admin = url.clone();
            let store = move || -> Arc<dyn LeaseStore> {
                Arc::new(
                    PgLeaseStore::builder(url.clone())
                        .max_connections(2)
                        .timeout(Duration::from_secs(10))
                        .build()
                        .expect("a store"),
                )
            };
            let stores = move || (store(), store());
            section("Postgres", &stores, Some(&admin), &sizes).await;
        });
    } else {
        println!();
        println!("(Postgres skipped: set LEASE_BENCH_PG=1 to run it too)");
    }
}
