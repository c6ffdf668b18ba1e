//! The etcd store next to the Postgres store, on this machine, in one run: steady heartbeat
//! latency and throughput, and claim latency.
//!
//! - etcd: lease-testetcd's shared three-member cluster from the system's etcd (loopback, data
//!   under `/dev/shm` by default, where its fsyncs cost nothing; `LEASE_TESTETCD_DIR=/tmp` puts
//!   it on disk), the store in production mode (sessions on etcd leases).
//! - Postgres: lease-testdb's server (fsync off by default; `LEASE_TESTDB_DURABLE=1` for fsync
//!   and synchronous commit on).
//!
//! Compare like with like: both durable (`LEASE_TESTDB_DURABLE=1 LEASE_TESTETCD_DIR=/tmp`) or
//! both in memory (neither set).
//!
//! For each store and each group size (64 and 1,024 buckets): 8 nodes join one group and
//! claim an equal share (ttl 1 h, nothing expires). *Heartbeat*: one node's heartbeat handing
//! in the stamp of the view it last got (steady state: answered "unchanged"), sequentially
//! (`LEASE_BENCH_BEATS`, default 300; p50/p99) and from 8 clients at once for
//! `LEASE_BENCH_SECS` (default 5; heartbeats per second). *Claim*: a ninth node releases and
//! claims back 8 buckets (`want` 8), sequentially, 100 times (p50/p99 of the claim).
//! *Cold start*: 16 nodes at once heartbeat, join a fresh group of 1,024 buckets and claim 64
//! each (the etcd store serializes a group's writers: this is where they contend, and a claim
//! that lost a race rereads and reruns inside the store); the time until all 16 hold their
//! share, and the claims that came back short and were repeated.
//!
//! Run: `LEASE_TESTDB_DURABLE=1 LEASE_TESTETCD_DIR=/tmp cargo bench --bench etcd_vs_pg`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lease::etcd::{EtcdLeaseStore, EtcdUrl};
use lease::postgres::PgLeaseStore;
use lease::store::{GroupStamp, Incarnation, LeaseStore, SessionId, Takeover};
use lease::{GroupName, MemberMetadata, NodeId, ShardCount, Ttl};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Member {
    node: NodeId,
    incarnation: Incarnation,
    session: SessionId,
    seen: Vec<GroupStamp>,
}

fn quantile(sorted: &[Duration], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

/// 8 members of a group of `shards`, each with its share, their views seen.
async fn populate(store: &dyn LeaseStore, group: &GroupName, shards: u32) -> Vec<Member> {
    let ttl = Ttl::from_secs(3600).expect("a ttl");
    let none = MemberMetadata::empty();
    store
        .ensure_group(group, ShardCount::new(shards).expect("a count"))
        .await
        .expect("a group");
    let mut members = Vec::new();
    for _ in 0..8 {
        let (node, incarnation) = (NodeId::new(), Incarnation::new());
        let beat = store
            .heartbeat(node, incarnation, ttl, &none, &[])
            .await
            .expect("a heartbeat");
        store.join(group, node, beat.session).await.expect("a join");
        let won = store
            .claim(group, node, beat.session, shards / 8, Takeover::Allowed)
            .await
            .expect("a claim");
        assert_eq!(won.len() as u32, shards / 8);
        members.push(Member {
            node,
            incarnation,
            session: beat.session,
            seen: Vec::new(),
        });
    }
    for m in &mut members {
        let beat = store
            .heartbeat(m.node, m.incarnation, ttl, &none, &[])
            .await
            .expect("a heartbeat");
        m.seen = beat
            .groups
            .iter()
            .map(|g| GroupStamp {
                group: g.group.clone(),
                stamp: g.stamp,
            })
            .collect();
    }
    members
}

async fn measure(name: &str, store: Arc<dyn LeaseStore>, shards: u32) {
    let group = GroupName::new(format!("bench-{shards}")).expect("a group name");
    let members = populate(store.as_ref(), &group, shards).await;
    let ttl = Ttl::from_secs(3600).expect("a ttl");
    let none = MemberMetadata::empty();

    // Sequential heartbeats of one node.
    let beats = env("LEASE_BENCH_BEATS", 300);
    let m = &members[0];
    let mut times = Vec::new();
    let mut unchanged = 0;
    for _ in 0..beats {
        let start = Instant::now();
        let beat = store
            .heartbeat(m.node, m.incarnation, ttl, &none, &m.seen)
            .await
            .expect("a heartbeat");
        times.push(start.elapsed());
        unchanged += usize::from(beat.groups.is_empty());
    }
    times.sort();

    // 8 clients at once, each beating as its own node.
    let secs = env("LEASE_BENCH_SECS", 5);
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for m in &members {
        let (store, done, seen) = (store.clone(), done.clone(), m.seen.clone());
        let (node, incarnation) = (m.node, m.incarnation);
        tasks.push(tokio::spawn(async move {
            let none = MemberMetadata::empty();
            while Instant::now() < deadline {
                store
                    .heartbeat(node, incarnation, ttl, &none, &seen)
                    .await
                    .expect("a heartbeat");
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for t in tasks {
        t.await.expect("a client");
    }
    let rate = done.load(Ordering::Relaxed) as f64 / secs as f64;

    // Claims: a member releases 8 of its buckets and claims them back.
    let m = &members[1];
    let mut claims = Vec::new();
    for _ in 0..100 {
        let snap = store.snapshot(&group).await.expect("a snapshot");
        let mine: Vec<_> = snap
            .buckets
            .iter()
            .filter(|b| b.owner == Some(m.node))
            .map(|b| b.bucket)
            .take(8)
            .collect();
        store
            .release(&group, m.node, m.session, &mine)
            .await
            .expect("a release");
        let start = Instant::now();
        let won = store
            .claim(&group, m.node, m.session, 8, Takeover::Allowed)
            .await
            .expect("a claim");
        claims.push(start.elapsed());
        assert_eq!(won.len(), mine.len());
    }
    claims.sort();
    println!(
        "| {name} | {shards} | {:.2} | {:.2} | {unchanged}/{beats} | {rate:.0} | {:.2} | {:.2} |",
        quantile(&times, 0.5),
        quantile(&times, 0.99),
        quantile(&claims, 0.5),
        quantile(&claims, 0.99),
    );
}

/// 16 nodes claim a fresh group of 1,024 buckets at once: seconds until all hold 64, and the
/// claims that came back short (contention) and were repeated.
async fn cold_start(name: &str, store: Arc<dyn LeaseStore>) {
    let group = GroupName::new("bench-cold").expect("a group name");
    store
        .ensure_group(&group, ShardCount::new(1024).expect("a count"))
        .await
        .expect("a group");
    let short = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (store, group, short) = (store.clone(), group.clone(), short.clone());
        tasks.push(tokio::spawn(async move {
            let ttl = Ttl::from_secs(3600).expect("a ttl");
            let node = NodeId::new();
            let beat = store
                .heartbeat(node, Incarnation::new(), ttl, &MemberMetadata::empty(), &[])
                .await
                .expect("a heartbeat");
            store
                .join(&group, node, beat.session)
                .await
                .expect("a join");
            let mut held = 0;
            while held < 64 {
                match store
                    .claim(&group, node, beat.session, 64 - held, Takeover::Allowed)
                    .await
                {
                    Ok(won) => held += won.len() as u32,
                    Err(e) => panic!("a claim: {e}"),
                }
                if held < 64 {
                    short.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a node");
    }
    println!(
        "| {name} | 16 nodes x 64 of 1,024 | {:.3} s | {} |",
        start.elapsed().as_secs_f64(),
        short.load(Ordering::Relaxed)
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let cluster = lease_testetcd::cluster();
        let db = lease_testdb::database().await;
        let pg = PgLeaseStore::builder(db.url.clone())
            .max_connections(8)
            .build()
            .expect("a Postgres store");
        println!(
            "Postgres durable: {}; etcd: {} members, data under {}",
            lease_testdb::durable(),
            cluster.members(),
            lease_testetcd::data_root().display()
        );
        println!(
            "| store | buckets | heartbeat p50 ms | p99 ms | unchanged | heartbeats/s (8 clients) | claim 8 p50 ms | p99 ms |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for shards in [64, 1024] {
            let url = EtcdUrl {
                endpoints: cluster.endpoints(),
                prefix: format!("bench-{shards}"),
            };
            let etcd = EtcdLeaseStore::connect(&url)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            measure("Postgres", Arc::new(pg.clone()), shards).await;
            measure("etcd", Arc::new(etcd), shards).await;
        }
        println!();
        println!("| store | cold start | until all hold their share | claims repeated |");
        println!("|---|---|---:|---:|");
        let etcd = EtcdLeaseStore::connect(&EtcdUrl {
            endpoints: cluster.endpoints(),
            prefix: "bench-cold".to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        cold_start("Postgres", Arc::new(pg.clone())).await;
        cold_start("etcd", Arc::new(etcd)).await;
    });
}
