//! Node sessions on Postgres: what a node's steady tick costs as it is in more groups, one node
//! in 20 groups against 20 single-group nodes, and how many nodes x groups one Postgres core
//! sustains.
//!
//! Every group has 64 buckets and 8 member nodes holding 8 each (ttl 1 h, so nothing expires
//! and every tick is a steady one). A *steady tick* is a heartbeat handing in the stamps of the
//! views the node was last given (after one full view), as the node runtime sends it.
//!
//! 1. **Rows and statements per steady tick** of one node in 1, 10 and 100 groups: statements
//!    counted by diesel's instrumentation on every pooled connection, rows written counted
//!    exactly (rows of the engine's tables whose `xmin` is newer than a transaction id taken
//!    before the tick). Both must be 1, for any number of groups: the bench fails otherwise.
//! 2. **One node in 20 groups against 20 nodes in one group each**, on one server in one run,
//!    one client, `LEASE_BENCH_SECS` each (default 5), alternating: steady ticks per second,
//!    and group renewals per second (a tick of the 20-group node renews 20). Also the 20-group
//!    node when every tick asks for the full views (no stamps handed in).
//! 3. **Capacity**: the server's CPU time per steady tick, from `/proc` of the postmaster and
//!    its children (user + system, the postmaster's reaped children included), while 16
//!    clients tick nodes in 1, 10 and 100 groups; then how many nodes one core sustains at a
//!    renew interval of 1 s and 10 s (`renew / cpu per tick`), and the node-groups that makes.
//!
//! A steady heartbeat against the physical limit (a bare one-row `UPDATE`, `SELECT 1`) is
//! measured by `benches/pg_tick.rs`, in every run, on the shape the seed comparison uses.
//!
//! Server: lease-testdb's throwaway cluster (fsync off; `LEASE_TESTDB_DURABLE=1` for a durable
//! one). Section 3 needs the cluster's own processes
//! and is skipped with a line saying so when `DATABASE_URL` names another server.
//!
//! Run: `cargo bench --bench pg_nodes` and `LEASE_TESTDB_DURABLE=1 cargo bench --bench pg_nodes`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::sql_types::BigInt;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use lease::postgres::PgLeaseStore;
use lease::store::{GroupStamp, Heartbeat, Incarnation, Takeover, ViewStamp, WorkerStore};
use lease::{GroupName, MemberMetadata, NodeId, ShardCount, Ttl};

const BUCKETS: u32 = 64;
const MEMBERS: usize = 8;
const SHARE: u32 = BUCKETS / MEMBERS as u32;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ttl() -> Ttl {
    Ttl::from_secs(3_600).expect("a valid ttl")
}

fn inc(node: NodeId) -> Incarnation {
    Incarnation::from_uuid(node.as_uuid())
}

#[derive(Default)]
struct Counts {
    statements: AtomicUsize,
}

struct Counting(Arc<Counts>);

impl Instrumentation for Counting {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        if let InstrumentationEvent::StartQuery { .. } = event {
            self.0.statements.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A store of `max` connections whose every statement is counted in `counts`.
fn counted_store(url: &str, counts: Arc<Counts>, max: usize) -> PgLeaseStore {
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = Box::new(move |url| {
        let counts = counts.clone();
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = AsyncPgConnection::establish(&url).await?;
            conn.set_instrumentation(Counting(counts));
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::new_with_config(url.to_owned(), config);
    let pool = Pool::builder(manager)
        .max_size(max)
        .build()
        .expect("a pool");
    PgLeaseStore::from_pool(pool)
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    // Scoped: the trait's `load` would shadow the atomics' elsewhere in this file.
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// Rows of the engine's tables written after transaction `xid`.
async fn rows_after(conn: &mut AsyncPgConnection, xid: i64) -> i64 {
    let mut total = 0;
    for table in [
        "lease.nodes",
        "lease.members",
        "lease.shards",
        "lease.groups",
        "lease.group_changes",
        "lease.draining_shards",
        "lease.server_epochs",
    ] {
        total += scalar(
            conn,
            &format!("SELECT count(*) AS n FROM {table} WHERE xmin::text::bigint > {xid}"),
        )
        .await;
    }
    total
}

/// A node that heartbeats as the runtime does: it hands in the stamps of the views it was
/// last given.
struct Node {
    id: NodeId,
    stamps: BTreeMap<GroupName, GroupStamp>,
}

impl Node {
    fn new() -> Self {
        Self {
            id: NodeId::new(),
            stamps: BTreeMap::new(),
        }
    }

    async fn tick(&mut self, store: &PgLeaseStore, full: bool) -> Heartbeat {
        let seen: Vec<GroupStamp> = if full {
            Vec::new()
        } else {
            self.stamps.values().cloned().collect()
        };
        self.tick_with(store, &seen).await
    }

    /// A steady tick whose stamps' `until` has passed, as when another member's expiry seen
    /// with the last view has come: the store looks at the members' expiries again and, with
    /// nobody dead and nothing changed, answers "unchanged" with a new `until`.
    async fn recheck(&mut self, store: &PgLeaseStore) -> Heartbeat {
        let past = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let seen: Vec<GroupStamp> = self
            .stamps
            .values()
            .map(|s| GroupStamp {
                group: s.group.clone(),
                stamp: ViewStamp::new(s.stamp.version(), Some(past)),
            })
            .collect();
        self.tick_with(store, &seen).await
    }

    async fn tick_with(&mut self, store: &PgLeaseStore, seen: &[GroupStamp]) -> Heartbeat {
        let hb = store
            .heartbeat(self.id, inc(self.id), ttl(), &MemberMetadata::empty(), seen)
            .await
            .expect("heartbeat");
        for g in &hb.groups {
            self.stamps.insert(
                g.group.clone(),
                GroupStamp {
                    group: g.group.clone(),
                    stamp: g.stamp,
                },
            );
        }
        for u in &hb.unchanged {
            self.stamps.insert(u.group.clone(), u.clone());
        }
        hb
    }

    /// Join `group` and claim `share` of it.
    async fn join(&mut self, store: &PgLeaseStore, group: &GroupName, share: u32) {
        let hb = self.tick(store, true).await;
        store.join(group, self.id, hb.session).await.expect("join");
        let won = store
            .claim(group, self.id, hb.session, share, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len() as u32, share, "claimed a share of {group}");
    }
}

/// `groups` fresh groups of 64 buckets named `prefix-i`, each with 8 member nodes holding 8:
/// the nodes are `nodes[k]` for k in 0..8 when `nodes` is given (each then in every group),
/// fresh ones otherwise.
async fn populate(
    store: &PgLeaseStore,
    prefix: &str,
    groups: usize,
    nodes: &mut [Node],
) -> Vec<GroupName> {
    let mut names = Vec::new();
    for i in 0..groups {
        let g = GroupName::new(format!("{prefix}-{i}")).expect("a name");
        store
            .ensure_group(&g, ShardCount::new(BUCKETS).expect("n"))
            .await
            .expect("ensure");
        for node in nodes.iter_mut() {
            node.join(store, &g, SHARE).await;
        }
        names.push(g);
    }
    names
}

/// Section 1.
async fn rows_and_statements(url: &str) {
    println!(
        "\n## 1. One node's steady tick, in 1, 10 and 100 groups (64 buckets, 8 members each)\n"
    );
    println!(
        "| groups | statements per tick | rows written per tick | tick latency, ms (median of 50) | full view latency, ms (median of 50) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for g in [1usize, 10, 100] {
        let counts = Arc::new(Counts::default());
        let store = counted_store(url, counts.clone(), 4);
        let mut nodes: Vec<Node> = (0..MEMBERS).map(|_| Node::new()).collect();
        populate(&store, &format!("rows{g}"), g, &mut nodes).await;
        let me = &mut nodes[0];
        // Warm every connection and learn every stamp.
        for _ in 0..8 {
            me.tick(&store, false).await;
        }
        let mut admin = AsyncPgConnection::establish(url).await.expect("admin");
        let ticks = 10;
        let mut rows = 0;
        let before = counts.statements.load(Ordering::SeqCst);
        for _ in 0..ticks {
            let xid = scalar(&mut admin, "SELECT txid_current() AS n").await;
            let hb = me.tick(&store, false).await;
            assert_eq!(
                hb.groups.len() + hb.unchanged.len(),
                g,
                "every group answered"
            );
            rows += rows_after(&mut admin, xid).await;
        }
        let statements = counts.statements.load(Ordering::SeqCst) - before;
        assert_eq!(
            (statements, rows),
            (ticks, ticks as i64),
            "a steady tick in {g} groups is 1 statement writing 1 row"
        );
        let steady = latency(|| me_tick(&store, &nodes[0].id, &nodes[0].stamps, false)).await;
        let full = latency(|| me_tick(&store, &nodes[0].id, &nodes[0].stamps, true)).await;
        println!(
            "| {g} | {:.1} | {:.1} | {:.3} | {:.3} |",
            statements as f64 / ticks as f64,
            rows as f64 / ticks as f64,
            steady,
            full
        );
    }
}

/// One heartbeat of `node` handing in `stamps` (or none, for the full views).
async fn me_tick(
    store: &PgLeaseStore,
    node: &NodeId,
    stamps: &BTreeMap<GroupName, GroupStamp>,
    full: bool,
) {
    let seen: Vec<GroupStamp> = if full {
        Vec::new()
    } else {
        stamps.values().cloned().collect()
    };
    store
        .heartbeat(*node, inc(*node), ttl(), &MemberMetadata::empty(), &seen)
        .await
        .expect("heartbeat");
}

/// The median of 50 calls, in milliseconds.
async fn latency<F, Fut>(mut call: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut took: Vec<f64> = Vec::with_capacity(50);
    for _ in 0..50 {
        let t = Instant::now();
        call().await;
        took.push(t.elapsed().as_secs_f64() * 1_000.0);
    }
    took.sort_by(f64::total_cmp);
    took[took.len() / 2]
}

/// Section 2.
async fn twenty_groups(url: &str) {
    let secs = env_or("LEASE_BENCH_SECS", 5);
    let store = PgLeaseStore::builder(url.to_owned())
        .max_connections(2)
        .build()
        .expect("a store");
    // One node in 20 groups, and in each group one single-group node more; the other 7
    // members of each group are shared by the 20 groups.
    let mut shared: Vec<Node> = (0..MEMBERS - 2).map(|_| Node::new()).collect();
    let groups = populate(&store, "twenty", 20, &mut shared).await;
    let mut big = Node::new();
    for g in &groups {
        big.join(&store, g, SHARE).await;
    }
    let mut singles: Vec<Node> = Vec::new();
    for g in &groups {
        let mut n = Node::new();
        n.join(&store, g, SHARE).await;
        singles.push(n);
    }
    for n in singles.iter_mut().chain(std::iter::once(&mut big)) {
        n.tick(&store, false).await;
    }
    let mut rates: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for _round in 0..env_or("LEASE_BENCH_ROUNDS", 3) {
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < Duration::from_secs(secs) {
            big.tick(&store, false).await;
            n += 1;
        }
        rates
            .entry("node in 20 groups, steady")
            .or_default()
            .push(n as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < Duration::from_secs(secs) {
            big.tick(&store, true).await;
            n += 1;
        }
        rates
            .entry("node in 20 groups, full views")
            .or_default()
            .push(n as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < Duration::from_secs(secs) {
            for s in singles.iter_mut() {
                s.tick(&store, false).await;
            }
            n += 1;
        }
        rates
            .entry("20 nodes in 1 group each, steady")
            .or_default()
            .push(n as f64 * 20.0 / t.elapsed().as_secs_f64());
    }
    println!(
        "\n## 2. One node in 20 groups against 20 nodes in one group each (1 client, {secs} s per kind per round)\n"
    );
    println!(
        "| kind | heartbeats/s (median of rounds) | group renewals/s | per-round heartbeats/s |"
    );
    println!("|---|---:|---:|---|");
    for (kind, rs) in &rates {
        let mut sorted = rs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        let renewals = if kind.starts_with("node in 20") {
            median * 20.0
        } else {
            median
        };
        println!(
            "| {kind} | {median:.0} | {renewals:.0} | {} |",
            rs.iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// CPU seconds (user + system) the server's processes used so far, the reaped ones included.
fn server_cpu_secs(postmaster: i32) -> f64 {
    let tick = clock_ticks_per_sec();
    let fields = |pid: i32| -> Option<Vec<String>> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command may hold spaces: fields start after its closing parenthesis.
        let rest = &stat[stat.rfind(')')? + 2..];
        Some(rest.split_whitespace().map(str::to_owned).collect())
    };
    let num = |f: &[String], i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    let mut total = 0.0;
    // Fields after the command: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
    if let Some(f) = fields(postmaster) {
        total += num(&f, 11) + num(&f, 12) + num(&f, 13) + num(&f, 14);
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            if let Some(f) = fields(pid)
                && f.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(postmaster)
            {
                total += num(&f, 11) + num(&f, 12);
            }
        }
    }
    total / tick
}

fn clock_ticks_per_sec() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Section 3.
async fn capacity(url: &str, postmaster: Option<i32>) {
    let Some(postmaster) = postmaster else {
        println!("\n## 3. Capacity: skipped (the server's processes are not on this machine)");
        return;
    };
    const CLIENTS: usize = 16;
    let secs = env_or("LEASE_BENCH_SECS", 5);
    let store = PgLeaseStore::builder(url.to_owned())
        .max_connections(CLIENTS)
        .build()
        .expect("a store");
    println!(
        "\n## 3. Capacity: server CPU per steady tick ({CLIENTS} clients, {secs} s per row)\n"
    );
    println!(
        "Two steady paths: *by stamp* (the counter and the stamp's `until` say unchanged: the \
         node row and the node's member and counter rows are read) and *re-check* (the stamp's \
         `until` has passed: the group's members' expiries are read again, nobody is dead, \
         unchanged with a new `until`). With ttl = 3 x renew (the defaults, 30 s and 10 s), a \
         stamp's `until` is at least ttl - renew after the view, so at most every other tick \
         re-checks: the blend below counts half the ticks as re-checks.\n"
    );
    println!(
        "| groups per node | path | ticks/s | server CPU, cores busy | server CPU per tick, µs |"
    );
    println!("|---:|---|---:|---:|---:|");
    let mut blended = Vec::new();
    for g in [1usize, 10, 100] {
        // 16 nodes, each a member of the same g groups: the first 8 hold 8 buckets of each,
        // the other 8 are idle members (16 members per group).
        let mut nodes: Vec<Node> = (0..CLIENTS).map(|_| Node::new()).collect();
        let groups = populate(&store, &format!("cap{g}"), g, &mut nodes[..MEMBERS]).await;
        for n in nodes[MEMBERS..].iter_mut() {
            let hb = n.tick(&store, true).await;
            for group in &groups {
                store.join(group, n.id, hb.session).await.expect("join");
            }
        }
        for n in nodes.iter_mut() {
            n.tick(&store, false).await;
            n.tick(&store, false).await;
        }
        let mut per_path = Vec::new();
        for recheck in [false, true] {
            let done = Arc::new(AtomicU64::new(0));
            let cpu_before = server_cpu_secs(postmaster);
            let t = Instant::now();
            let deadline = t + Duration::from_secs(secs);
            let mut tasks = Vec::new();
            for mut n in std::mem::take(&mut nodes) {
                let (store, done) = (store.clone(), done.clone());
                tasks.push(tokio::spawn(async move {
                    while Instant::now() < deadline {
                        let hb = if recheck {
                            n.recheck(&store).await
                        } else {
                            n.tick(&store, false).await
                        };
                        assert!(hb.groups.is_empty(), "a steady tick was given a view");
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    n
                }));
            }
            for task in tasks {
                nodes.push(task.await.expect("a client task"));
            }
            let wall = t.elapsed().as_secs_f64();
            let cpu = server_cpu_secs(postmaster) - cpu_before;
            let ticks = done.load(Ordering::Relaxed) as f64;
            let per_tick = cpu / ticks;
            println!(
                "| {g} | {} | {:.0} | {:.2} | {:.0} |",
                if recheck { "re-check" } else { "by stamp" },
                ticks / wall,
                cpu / wall,
                per_tick * 1e6,
            );
            per_path.push(per_tick);
        }
        blended.push((g, (per_path[0] + per_path[1]) / 2.0));
    }
    println!(
        "\nNodes and node-groups one server core sustains, from the blended CPU per tick \
         (half by stamp, half re-check):\n"
    );
    println!(
        "| groups per node | CPU per tick, µs | nodes per core at renew 1 s | node-groups at 1 s | nodes per core at renew 10 s | node-groups at 10 s |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for (g, per_tick) in blended {
        println!(
            "| {g} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} |",
            per_tick * 1e6,
            1.0 / per_tick,
            g as f64 / per_tick,
            10.0 / per_tick,
            10.0 / per_tick * g as f64
        );
    }
}

/// The postmaster of the server at `url`, when it runs on this machine: the parent of a
/// backend serving a connection of ours.
async fn postmaster_pid(url: &str) -> Option<i32> {
    let mut conn = AsyncPgConnection::establish(url).await.ok()?;
    let backend =
        i32::try_from(scalar(&mut conn, "SELECT pg_backend_pid()::bigint AS n").await).ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{backend}/stat")).ok()?;
    // Fields after the command (which may hold spaces): state, then ppid.
    stat[stat.rfind(')')? + 2..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let db = lease_testdb::database().await;
        let durable = std::env::var("LEASE_TESTDB_DURABLE").is_ok_and(|v| v == "1");
        println!(
            "# pg_nodes: node sessions on Postgres ({} server)",
            if durable { "durable" } else { "fsync off" }
        );
        rows_and_statements(&db.url).await;
        twenty_groups(&db.url).await;
        capacity(&db.url, postmaster_pid(&db.url).await).await;
    });
}
