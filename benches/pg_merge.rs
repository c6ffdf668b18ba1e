//! A merge from 65,536 buckets to 4 on Postgres with one of three owners stopped, on the wall
//! clock, at the store's level: what each call costs while the old generation drains, and how
//! long the four new buckets stay unowned.
//!
//! One throwaway server (lease-testdb, fsync off; `LEASE_TESTDB_DURABLE=1` for a durable one,
//! or the server `DATABASE_URL` names), a fresh database per part.
//!
//! 1. **Heartbeat cost.** Three nodes hold 65,536 buckets (a third each, ttl 10 min); the
//!    group is resized to 4. A fourth member, holding nothing, heartbeats with no stamp handed
//!    in (the view is given: what a heartbeat costs whenever the group changed, which during a
//!    drain is every tick), 20 times; then one of the holders (whose view lists its 21,845 old
//!    buckets), 20 times. Median and maximum of each, on the client (one round trip on a
//!    unix socket; the server's time dominates).
//! 2. **The stall.** Three nodes on stores of their own (as three processes), ttl 3 s, renew
//!    1 s, and each call abandoned after 1.5 s (the worker's call timeout: the larger of the
//!    renew interval and half the ttl; an abandoned call's future is dropped, as a worker's
//!    deadline does). Each holds a third of 65,536 buckets. One node stops (it makes no call
//!    after the resize: a `SIGSTOP`ped process, whose session lives on until its expiry) just
//!    before `resize(65536, 4)`. The two others tick every second, or at once after a tick
//!    that released something: heartbeat (no stamp handed in), release every old bucket the
//!    heartbeat says they hold, claim up to 2. Measured from the resize call: when the first
//!    and the last of the 4 new buckets is owned by a live session (a count polled every
//!    50 ms on a connection of its own), the stopped node's expiry, and per kind of call how
//!    many completed (median and maximum time) and how many were abandoned. At the end, how
//!    many of the group's statements still run on the server.
//!
//! Run: `cargo bench --bench pg_merge`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, Incarnation, SessionId, Takeover, WorkerStore};
use lease::{Bucket, GroupName, MemberMetadata, NodeId, ShardCount, Ttl};

const OLD: u32 = 65_536;
const NEW: u32 = 4;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
/// The worker's call timeout for this ttl and renew interval.
const DEADLINE: Duration = Duration::from_millis(1_500);
/// Give up on the stall after this long.
const LIMIT: Duration = Duration::from_secs(120);

fn count(n: u32) -> ShardCount {
    ShardCount::new(n).expect("a shard count")
}

fn store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url)
        .max_connections(4)
        .build()
        .expect("a store")
}

/// A node: its id, process, session.
#[derive(Clone, Copy)]
struct Node {
    id: NodeId,
    process: Incarnation,
    session: SessionId,
}

/// `k` nodes on `g`, each holding its share of the group's `OLD` buckets, with sessions of
/// `ttl`.
async fn holders(stores: &[PgLeaseStore], g: &GroupName, ttl: Ttl) -> Vec<Node> {
    let meta = MemberMetadata::empty();
    let mut nodes = Vec::new();
    for s in stores {
        let (id, process) = (NodeId::new(), Incarnation::new());
        let session = s
            .heartbeat(id, process, ttl, &meta, &[])
            .await
            .expect("a session")
            .session;
        s.join(g, id, session).await.expect("join");
        nodes.push(Node {
            id,
            process,
            session,
        });
    }
    let k = nodes.len() as u32;
    for (i, (s, n)) in stores.iter().zip(&nodes).enumerate() {
        let share = OLD / k + u32::from((i as u32) < OLD % k);
        let won = s
            .claim(g, n.id, n.session, share, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), share as usize);
    }
    nodes
}

fn median_max(mut v: Vec<Duration>) -> String {
    if v.is_empty() {
        return "none".to_owned();
    }
    v.sort();
    format!(
        "median {:.1} ms, max {:.1} ms",
        v[v.len() / 2].as_secs_f64() * 1e3,
        v[v.len() - 1].as_secs_f64() * 1e3
    )
}

async fn heartbeat_cost(rt_url: &str) {
    let s = store(rt_url);
    let g = GroupName::new("merge").expect("name");
    s.ensure_group(&g, count(OLD)).await.expect("ensure");
    let ttl = Ttl::from_secs(600).expect("ttl");
    let stores: Vec<PgLeaseStore> = (0..3).map(|_| store(rt_url)).collect();
    let nodes = holders(&stores, &g, ttl).await;
    let (idle, idle_process) = (NodeId::new(), Incarnation::new());
    let meta = MemberMetadata::empty();
    let session = s
        .heartbeat(idle, idle_process, ttl, &meta, &[])
        .await
        .expect("a session")
        .session;
    s.join(&g, idle, session).await.expect("join");
    s.resize(&g, count(OLD), count(NEW)).await.expect("resize");
    for (who, node, process, owned) in [
        ("a member holding nothing", idle, idle_process, 0),
        (
            "a holder of 21,846 old buckets",
            nodes[0].id,
            nodes[0].process,
            21_846,
        ),
    ] {
        let mut samples = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let beat = s
                .heartbeat(node, process, ttl, &meta, &[])
                .await
                .expect("heartbeat");
            samples.push(started.elapsed());
            let view = beat.group(&g).expect("a view");
            assert_eq!(view.view.draining, OLD);
            assert_eq!(view.owned.len(), owned);
        }
        eprintln!(
            "heartbeat giving the view, {OLD} old buckets draining, of {who}: {}",
            median_max(samples)
        );
    }
}

#[derive(Default)]
struct Calls {
    done: Vec<Duration>,
    abandoned: usize,
}

#[derive(Default)]
struct Tally {
    heartbeat: Calls,
    release: Calls,
    claim: Calls,
}

/// Run `call` with the worker's deadline, recording it in `calls`; `None` when abandoned or
/// failed.
async fn timed<T>(
    calls: &Mutex<Tally>,
    which: fn(&mut Tally) -> &mut Calls,
    call: impl std::future::Future<Output = Result<T, lease::StoreError>>,
) -> Option<T> {
    let started = Instant::now();
    let result = tokio::time::timeout(DEADLINE, call).await;
    let mut tally = calls.lock().expect("tally");
    match result {
        Ok(Ok(v)) => {
            which(&mut tally).done.push(started.elapsed());
            Some(v)
        }
        Ok(Err(e)) => {
            eprintln!("  a call failed: {e}");
            None
        }
        Err(_) => {
            which(&mut tally).abandoned += 1;
            None
        }
    }
}

/// One live node's ticks until `stop`.
async fn live_node(
    s: PgLeaseStore,
    g: GroupName,
    node: Node,
    ttl: Ttl,
    tally: Arc<Mutex<Tally>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    let meta = MemberMetadata::empty();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let tick = Instant::now();
        let mut released = false;
        if let Some(beat) = timed(&tally, |t| &mut t.heartbeat, async {
            s.heartbeat(node.id, node.process, ttl, &meta, &[]).await
        })
        .await
        {
            let session = beat.session;
            if beat.group(&g).is_none() {
                s.join(&g, node.id, session).await.ok();
            }
            let old: Vec<Bucket> = beat
                .group(&g)
                .map(|v| v.draining_buckets())
                .unwrap_or_default();
            if !old.is_empty() {
                released = timed(&tally, |t| &mut t.release, async {
                    s.release(&g, node.id, session, &old).await
                })
                .await
                .is_some();
            }
            timed(&tally, |t| &mut t.claim, async {
                s.claim(&g, node.id, session, 2, Takeover::Allowed).await
            })
            .await;
        }
        if !released {
            tokio::time::sleep(RENEW.saturating_sub(tick.elapsed())).await;
        }
    }
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    // Scoped: its blanket `load` would shadow the atomics' `load` elsewhere in this file.
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

async fn stall(url: &str, db: &str) {
    let g = GroupName::new("merge").expect("name");
    let admin = store(url);
    admin.ensure_group(&g, count(OLD)).await.expect("ensure");
    let ttl = Ttl::new(TTL).expect("ttl");
    let stores: Vec<PgLeaseStore> = (0..3).map(|_| store(url)).collect();
    let nodes = holders(&stores, &g, ttl).await;
    // Every node renews, the stopped one last: its session ends a ttl after this.
    let meta = MemberMetadata::empty();
    let mut stopped_expiry = None;
    for (s, n) in stores.iter().zip(&nodes) {
        let beat = s
            .heartbeat(n.id, n.process, ttl, &meta, &[])
            .await
            .expect("renew");
        stopped_expiry = Some(Instant::now() + TTL);
        let _ = beat;
    }
    let stopped_expiry = stopped_expiry.expect("three nodes");
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .expect("a connection");
    let owned = "SELECT count(*) AS n FROM lease.shards s
                   JOIN lease.nodes y ON y.node_id = s.owner_node AND y.session_id = s.owner_session
                   JOIN lease.members m ON m.group_name = s.group_name AND m.node_id = s.owner_node
                  WHERE s.group_name = 'merge' AND y.expires_at > clock_timestamp()";
    let tally = Arc::new(Mutex::new(Tally::default()));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let resized = Instant::now();
    admin
        .resize(&g, count(OLD), count(NEW))
        .await
        .expect("resize");
    let resize_call = resized.elapsed();
    let tasks: Vec<_> = stores
        .iter()
        .zip(&nodes)
        .take(2)
        .map(|(s, &n)| {
            tokio::spawn(live_node(
                s.clone(),
                g.clone(),
                n,
                ttl,
                tally.clone(),
                stop.clone(),
            ))
        })
        .collect();
    let (mut first, mut all) = (None, None);
    while resized.elapsed() < LIMIT {
        let n = scalar(&mut conn, owned).await;
        if n > 0 && first.is_none() {
            first = Some(resized.elapsed());
        }
        if n == i64::from(NEW) {
            all = Some(resized.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in tasks {
        t.await.expect("a node's task");
    }
    let running = scalar(
        &mut conn,
        &format!(
            "SELECT count(*) AS n FROM pg_stat_activity
              WHERE datname = '{db}' AND state = 'active' AND pid <> pg_backend_pid()"
        ),
    )
    .await;
    let tally = tally.lock().expect("tally");
    eprintln!(
        "merge {OLD} -> {NEW}, one of 3 owners stopped: resize call {:.2} s; the stopped \
         owner's session ends {:.2} s after the resize began; first new bucket owned after \
         {}; all {NEW} owned after {}",
        resize_call.as_secs_f64(),
        stopped_expiry
            .saturating_duration_since(resized)
            .as_secs_f64(),
        first.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64())),
        all.map_or(format!("more than {LIMIT:?}"), |d| format!(
            "{:.2} s",
            d.as_secs_f64()
        )),
    );
    for (what, calls) in [
        ("heartbeats", &tally.heartbeat),
        ("releases", &tally.release),
        ("claims", &tally.claim),
    ] {
        eprintln!(
            "  {what}: {} completed ({}), {} abandoned at {DEADLINE:?}",
            calls.done.len(),
            median_max(calls.done.clone()),
            calls.abandoned
        );
    }
    eprintln!("  statements still running on the server after the run: {running}");
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let db = lease_testdb::database().await;
        heartbeat_cost(&db.url).await;
        let db = lease_testdb::database().await;
        stall(&db.url, &db.name).await;
    });
}
