//! Claims at scale on Postgres: what a claim costs in a group of 65,536 buckets, and how long
//! 50 workers take to share such a group from a cold start.
//!
//! - **Claim latency.** Three groups of 65,536 buckets in one database, each with 50 members
//!   holding nearly everything, so that what is claimable sits where a scan in bucket order
//!   finds it last: (a) 1,346 unowned buckets at the top of the range; (b) the 1,310 buckets of
//!   a member whose session is dead, the rest owned by 49 live members; (c) both: 36 unowned
//!   buckets at the top and a dead member's 1,310. A newly joined worker claims 64, inside a
//!   transaction that is rolled back, so every repetition sees the same state. Each case runs
//!   `LEASE_BENCH_REPS` times (default 30); the table gives the median, the minimum and the
//!   maximum, client round trip included.
//! - **Cold start.** 50 `LeaseWorker`s, each on a store of its own (as 50 processes would be),
//!   start at once on a fresh group of 65,536 buckets (ttl 5 s, renew 1 s): the time until the
//!   applications own every bucket once with loads within one, in renew intervals, and the store
//!   calls that failed or timed out meanwhile (there must be none). `LEASE_BENCH_RUNS` runs
//!   (default 3), each on a fresh database.
//!
//! Server: lease-testdb's throwaway cluster (fsync off; `LEASE_TESTDB_DURABLE=1` for a durable
//! one), or the server `DATABASE_URL` names.
//!
//! Run: `cargo bench --bench pg_scale`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease::postgres::{PgLeaseStore, ops};
use lease::store::{Incarnation, Takeover, WorkerStore};
use lease::{
    Bucket, FencingToken, GroupName, LeaseWorker, MemberMetadata, NodeId, OwnershipHandler,
    RevokeReason, ShardCount, Ttl, WorkerError, WorkerHandle,
};

const BUCKETS: u32 = 65_536;
const MEMBERS: u32 = 50;
const SHARE: u32 = 1_310;
const WANT: u32 = 64;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A member that joins `group` with `ttl` and claims `share` buckets.
async fn member(store: &PgLeaseStore, group: &GroupName, ttl: Ttl, share: u32) -> NodeId {
    let w = NodeId::new();
    let beat = store
        .heartbeat(
            w,
            Incarnation::from_uuid(w.as_uuid()),
            ttl,
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("a session");
    store.join(group, w, beat.session).await.expect("join");
    let won = store
        .claim(group, w, beat.session, share, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len() as u32, share, "setup claim");
    w
}

/// How long the sessions of "dead" members last: they are over by the time claims are timed.
const SHORT: Duration = Duration::from_secs(2);

/// A group of 65,536 buckets: `live` members owning `SHARE` each, then `dead` members owning
/// `SHARE` each under sessions of ttl [`SHORT`].
async fn populate(store: &PgLeaseStore, name: &str, live: u32, dead: u32) -> GroupName {
    let group = GroupName::new(name).expect("name");
    store
        .ensure_group(&group, ShardCount::new(BUCKETS).expect("count"))
        .await
        .expect("ensure");
    let long = Ttl::from_secs(3_600).expect("ttl");
    let short = Ttl::new(SHORT).expect("ttl");
    for _ in 0..live {
        member(store, &group, long, SHARE).await;
    }
    for _ in 0..dead {
        member(store, &group, short, SHARE).await;
    }
    group
}

struct Case {
    name: &'static str,
    group: GroupName,
}

async fn claim_latency(reps: usize) {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(4)
        .build()
        .expect("store");
    let setup = Instant::now();
    let mut cases = vec![
        Case {
            name: "1,346 unowned at the top",
            group: populate(&store, "unowned", MEMBERS - 1, 0).await,
        },
        Case {
            name: "a dead member's 1,310",
            group: {
                let g = populate(&store, "dead", MEMBERS - 1, 1).await;
                // The 36 buckets left go to one more live member.
                let long = Ttl::from_secs(3_600).expect("ttl");
                member(&store, &g, long, BUCKETS - MEMBERS * SHARE).await;
                g
            },
        },
    ];
    cases.push(Case {
        name: "36 unowned + a dead member's 1,310",
        group: populate(&store, "mixed", MEMBERS - 1, 1).await,
    });
    // Every dead member's session is over: the last one began before `populate` returned.
    tokio::time::sleep(SHORT + Duration::from_millis(200)).await;
    eprintln!("claim latency: set up in {:.1?}", setup.elapsed());

    let mut conn = AsyncPgConnection::establish(&db.url)
        .await
        .expect("a connection");
    println!("\n### Claim latency at {BUCKETS} buckets: a new worker claims {WANT}\n");
    println!("| claimable | claimed | p50 ms | min ms | max ms | runs |");
    println!("|---|---:|---:|---:|---:|---:|");
    for case in &cases {
        let me = NodeId::new();
        let beat = ops::heartbeat(
            &mut conn,
            None,
            me,
            Incarnation::new(),
            Ttl::from_secs(3_600).expect("ttl"),
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("the claimer's session");
        ops::join(&mut conn, None, &case.group, me, beat.session)
            .await
            .expect("the claimer joins");
        let mut times = Vec::with_capacity(reps);
        let mut claimed = 0;
        // Two untimed runs first: the first executions of a prepared statement are planned
        // for their parameters, later ones may use a generic plan.
        for rep in 0..reps + 2 {
            conn.batch_execute("BEGIN").await.expect("begin");
            let t0 = Instant::now();
            let won = ops::claim(
                &mut conn,
                None,
                &case.group,
                me,
                beat.session,
                WANT,
                Takeover::Allowed,
            )
            .await
            .expect("claim");
            let took = t0.elapsed();
            conn.batch_execute("ROLLBACK").await.expect("rollback");
            claimed = won.len();
            if rep >= 2 {
                times.push(took);
            }
        }
        times.sort();
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "| {} | {claimed} | {:.2} | {:.2} | {:.2} | {} |",
            case.name,
            ms(times[times.len() / 2]),
            ms(times[0]),
            ms(times[times.len() - 1]),
            times.len()
        );
    }
}

/// Counts the errors a worker reports.
#[derive(Clone, Default)]
struct Counting {
    timeouts: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
}

#[async_trait]
impl OwnershipHandler for Counting {
    async fn on_assigned(&self, _assignment: lease::Assignment) {}

    async fn on_revoked(&self, _bucket: Bucket, _token: FencingToken, _reason: RevokeReason) {}

    async fn on_error(&self, error: &WorkerError) {
        match error {
            WorkerError::Timeout { .. } => self.timeouts.fetch_add(1, Ordering::Relaxed),
            _ => self.failures.fetch_add(1, Ordering::Relaxed),
        };
        if std::env::var_os("LEASE_BENCH_VERBOSE").is_some() {
            eprintln!("{:?} {error}", std::time::SystemTime::now());
        }
    }
}

fn balanced(handles: &[WorkerHandle]) -> bool {
    lease::testing::runtime::balanced(handles.iter().map(|h| h.owned().borrow().len()), BUCKETS)
}

async fn cold_start(run: usize) -> (Duration, Duration, u64, u64, BTreeMap<usize, usize>) {
    const RENEW: Duration = Duration::from_secs(1);
    let db = lease_testdb::database().await;
    let group = GroupName::new("cold").expect("name");
    let counting = Counting::default();
    // 50 processes start at about the same time: start the workers concurrently.
    let started = Instant::now();
    let starts = (0..MEMBERS).map(|_| {
        let store = PgLeaseStore::builder(db.url.clone())
            .max_connections(2)
            .build()
            .expect("store");
        let config = LeaseWorker::builder(group.clone(), ShardCount::new(BUCKETS).expect("n"))
            .ttl(Duration::from_secs(5))
            .renew_interval(RENEW)
            .build()
            .expect("config");
        config.start(store, counting.clone())
    });
    let handles: Vec<WorkerHandle> = futures_util::future::join_all(starts)
        .await
        .into_iter()
        .map(|started| started.expect("start"))
        .collect();
    let all_started = started.elapsed();
    let deadline = started + Duration::from_secs(120);
    while !balanced(&handles) {
        assert!(
            Instant::now() < deadline,
            "run {run}: not balanced within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let took = started.elapsed();
    let mut loads: BTreeMap<usize, usize> = BTreeMap::new();
    for h in &handles {
        *loads.entry(h.owned().borrow().len()).or_default() += 1;
    }
    for h in handles {
        h.shutdown().await.expect("a clean stop");
    }
    (
        took,
        all_started,
        counting.timeouts.load(Ordering::Relaxed),
        counting.failures.load(Ordering::Relaxed),
        loads,
    )
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let reps = env_or("LEASE_BENCH_REPS", 30);
        let runs = env_or("LEASE_BENCH_RUNS", 3);
        claim_latency(reps).await;
        println!("\n### Cold start: {MEMBERS} workers, {BUCKETS} buckets, renew 1 s, ttl 5 s\n");
        // Balanced is timed from the first start call, which includes the starts themselves (50
        // stores connecting at once); the time from the last start is shown beside it.
        println!(
            "| run | balanced after s | renew intervals | every worker started after s | \
             balanced after the last start, s | call timeouts | other errors | loads |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|---|");
        let mut all = Vec::new();
        for run in 1..=runs {
            let (took, all_started, timeouts, failures, loads) = cold_start(run).await;
            let loads: Vec<String> = loads.iter().map(|(l, n)| format!("{n} x {l}")).collect();
            println!(
                "| {run} | {:.2} | {} | {:.2} | {:.2} | {timeouts} | {failures} | {} |",
                took.as_secs_f64(),
                took.as_secs_f64().ceil() as u64,
                all_started.as_secs_f64(),
                (took - all_started).as_secs_f64(),
                loads.join(", ")
            );
            all.push(took);
        }
        all.sort();
        // A time: the worst run is the longest one.
        if let (Some(median), Some(min), Some(max)) =
            (all.get(all.len() / 2), all.first(), all.last())
        {
            println!(
                "\nmedian {:.2} s, min {:.2} s, max {:.2} s over {runs} runs",
                median.as_secs_f64(),
                min.as_secs_f64(),
                max.as_secs_f64()
            );
        }
    });
}
