//! Failover to a standby, on the wall clock: how long from the primary's death until every
//! bucket is owned again, and how many bucket-seconds went without an owner.
//!
//! Each run starts a primary and a streaming standby (lease-testdb, from the system binaries;
//! fsync off), a database migrated on the primary, and 3 `LeaseWorker`s in this process, each
//! on a store of its own, reaching both servers through one multi-host URL
//! (`target_session_attrs=read-write`), on a group of 24 buckets (ttl 3 s, renew 1 s). Then:
//!
//! - **synchronous**: in steady state, the primary is killed (`pg_ctl stop -m immediate`) and
//!   the standby promoted (`pg_ctl promote -w`);
//! - **asynchronous, writes lost**: replication is cut, a fourth worker joins and takes its
//!   share on the primary alone, and at once the primary is killed and the standby promoted.
//!
//! Measured from the kill, on this host's clock (the servers run on it too): the promotion
//! returning; every bucket owned again (the last new assignment in the applications' ownership
//! log); the workers settled (every bucket live on the new primary, held by the worker it names
//! with the token it names, every worker renewed there, loads within one); the bucket-seconds
//! without a holder between the kill and the settling; and overlaps in the ownership log
//! (there must be none). `LEASE_BENCH_RUNS` runs of each (default 3).
//!
//! Run: `cargo bench --bench pg_failover`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, BucketState, Clock, SystemClock, Timestamp};
use lease::testing::{OwnershipLog, RecordingHandler, coverage};
use lease::{Bucket, FencingToken, GroupName, LeaseWorker, NodeId, ShardCount, WorkerHandle};
use lease_testdb::{Cluster, ClusterOptions, Replication};

const DB: &str = "failover";
const BUCKETS: u32 = 24;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

struct Fleet {
    url: String,
    group: GroupName,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    workers: Vec<WorkerHandle>,
}

impl Fleet {
    async fn start(&mut self) {
        let store = PgLeaseStore::builder(self.url.clone())
            .max_connections(4)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a store");
        let config = LeaseWorker::builder(self.group.clone(), ShardCount::new(BUCKETS).expect("n"))
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .expect("a config");
        let handler =
            RecordingHandler::new(config.node_id(), self.log.clone(), Arc::new(SystemClock));
        self.workers
            .push(config.start(store, handler).await.expect("start"));
    }

    /// Poll until the workers agree with `server` (see the module's doc), at most 30 s.
    async fn until_settled_on(&self, server: &Cluster, since: Timestamp) {
        let observer = PgLeaseStore::builder(server.tcp_url("postgres", DB, ""))
            .max_connections(1)
            .build()
            .expect("an observer");
        let ids: Vec<NodeId> = self.workers.iter().map(WorkerHandle::node_id).collect();
        let limit = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(snap) = observer.snapshot(&self.group).await {
                let mut held = BTreeMap::new();
                let mut loads = Vec::new();
                for w in &self.workers {
                    let owned = w.owned().borrow().clone();
                    loads.push(owned.len());
                    held.extend(owned.into_iter().map(|(b, t)| (b, (w.node_id(), t))));
                }
                let live: BTreeMap<Bucket, (NodeId, FencingToken)> = snap
                    .buckets
                    .iter()
                    .filter(|b| b.state == BucketState::Live)
                    .filter_map(|b| Some((b.bucket, (b.owner?, b.token))))
                    .collect();
                let renewed = snap
                    .members
                    .iter()
                    .filter(|m| ids.contains(&m.worker) && m.live && m.heartbeat_at > since)
                    .count();
                let spread = loads
                    .iter()
                    .max()
                    .zip(loads.iter().min())
                    .map(|(a, b)| a - b);
                if live.len() == BUCKETS as usize
                    && held == live
                    && renewed == ids.len()
                    && spread.is_some_and(|d| d <= 1)
                {
                    return;
                }
            }
            assert!(Instant::now() < limit, "the workers never settled");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// One run's figures, in seconds from the kill (bucket-seconds for `unowned`).
struct Run {
    promoted: f64,
    all_owned: f64,
    settled: f64,
    unowned: f64,
    overlaps: usize,
}

async fn run(replication: Replication) -> Run {
    let primary = Cluster::start(ClusterOptions {
        tcp: true,
        ..ClusterOptions::default()
    })
    .expect("a primary");
    primary
        .psql(&format!("CREATE DATABASE {DB}"))
        .expect("a database");
    PgLeaseStore::builder(primary.tcp_url("postgres", DB, ""))
        .max_connections(1)
        .build()
        .expect("a store")
        .migrate()
        .await
        .expect("migrating");
    let standby =
        tokio::task::block_in_place(|| primary.start_standby(replication)).expect("a standby");
    let mut fleet = Fleet {
        url: Cluster::multi_host_url(
            &[&primary, &standby],
            "postgres",
            DB,
            "target_session_attrs=read-write",
        ),
        group: GroupName::new("failover").expect("a name"),
        log: Arc::new(Mutex::new(OwnershipLog::new())),
        workers: Vec::new(),
    };
    for _ in 0..3 {
        fleet.start().await;
    }
    fleet.until_settled_on(&primary, SystemClock.now()).await;
    if replication == Replication::Asynchronous {
        tokio::task::block_in_place(|| standby.cut_replication()).expect("cutting replication");
        fleet.start().await;
        let limit = Instant::now() + Duration::from_secs(10);
        while fleet.workers.last().map_or(0, |w| w.owned().borrow().len()) < 6 {
            assert!(Instant::now() < limit, "the joiner never got its share");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let (killed, killed_wall) = (Instant::now(), SystemClock.now());
    tokio::task::block_in_place(|| {
        primary.kill().expect("killing the primary");
        standby.promote().expect("promoting");
    });
    let promoted = killed.elapsed();
    let promoted_wall = SystemClock.now();
    fleet.until_settled_on(&standby, promoted_wall).await;
    let settled = killed.elapsed();
    let settled_wall = SystemClock.now();
    for w in fleet.workers {
        w.shutdown().await.expect("a clean stop");
    }
    let log = fleet.log.lock().expect("the log").clone();
    let holdings = log.holdings().expect("a well-formed log");
    // The last bucket to get the holder it had when the workers settled.
    let last_assigned = holdings
        .values()
        .filter_map(|hs| {
            hs.iter()
                .filter(|h| h.from <= settled_wall)
                .map(|h| h.from)
                .max()
        })
        .max()
        .unwrap_or(killed_wall);
    let shards = ShardCount::new(BUCKETS).expect("n");
    Run {
        promoted: promoted.as_secs_f64(),
        all_owned: (last_assigned - killed_wall)
            .to_std()
            .unwrap_or_default()
            .as_secs_f64(),
        settled: settled.as_secs_f64(),
        unowned: coverage::unowned(&log, shards, killed_wall, settled_wall)
            .expect("a well-formed log")
            .values()
            .map(Duration::as_secs_f64)
            .sum(),
        overlaps: coverage::overlaps(&log, settled_wall)
            .expect("a well-formed log")
            .len(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::var("LEASE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    println!(
        "failover to a standby: 3 workers (4 with the asynchronous run's joiner), {BUCKETS} \
         buckets, ttl {TTL:?}, renew {RENEW:?}; seconds from the kill"
    );
    println!();
    println!(
        "| replication | run | promoted | every bucket owned again | settled | bucket-s unowned | overlaps |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (name, replication) in [
        ("synchronous, steady state", Replication::Synchronous),
        ("asynchronous, writes lost", Replication::Asynchronous),
    ] {
        let mut all = Vec::new();
        for i in 1..=runs {
            let r = rt.block_on(run(replication));
            println!(
                "| {name} | {i} | {:.3} | {:.3} | {:.3} | {:.1} | {} |",
                r.promoted, r.all_owned, r.settled, r.unowned, r.overlaps
            );
            all.push(r);
        }
        println!(
            "| {name} | median | {:.3} | {:.3} | {:.3} | {:.1} | {} |",
            median(all.iter().map(|r| r.promoted).collect()),
            median(all.iter().map(|r| r.all_owned).collect()),
            median(all.iter().map(|r| r.settled).collect()),
            median(all.iter().map(|r| r.unowned).collect()),
            all.iter().map(|r| r.overlaps).sum::<usize>()
        );
    }
}
