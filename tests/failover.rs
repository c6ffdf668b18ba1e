//! Workers through a failover (docs/postgres.md, "Failover"): `LeaseWorker`s in this
//! process, each on a store of its own as separate processes would be, reach a primary and a
//! streaming standby through one multi-host URL (`target_session_attrs=read-write`); the
//! primary is stopped cleanly (a switchover) or killed (`pg_ctl stop -m immediate`) and the
//! standby promoted. Each test waits, polling with a bound, until the workers agree with the
//! new primary: every bucket live in its snapshot, held by the worker the snapshot names with
//! the token it names, every worker renewed there, the loads within one. The ownership log of
//! every worker's application is then checked: no bucket held twice at any instant, tokens
//! rising from holder to holder. A failover that lost nothing moves no bucket (V4); one that
//! lost writes ends the sessions that made them.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, BucketState, Clock, SystemClock, Timestamp};
use lease::testing::{OwnershipLog, RecordingHandler, coverage};
use lease::{
    Assignment, Bucket, FencingToken, GroupName, LeaseWorker, NodeId, OwnershipEvent, ShardCount,
    WorkerHandle,
};
use lease_testdb::{Cluster, ClusterOptions, Replication};

const DB: &str = "failover";
const BUCKETS: u32 = 24;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
/// The floor of tokens on the second timeline after the base one.
const FLOOR_2: i64 = (2 << 32) + 1;

/// A primary with a migrated database and one standby.
async fn primary_and_standby(replication: Replication) -> (Cluster, Cluster) {
    let primary = tokio::task::spawn_blocking(|| {
        Cluster::start(ClusterOptions {
            tcp: true,
            ..ClusterOptions::default()
        })
    })
    .await
    .expect("a thread")
    .unwrap_or_else(|e| panic!("a primary: {e}"));
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
    let (primary, standby) = tokio::task::spawn_blocking(move || {
        let standby = primary.start_standby(replication);
        (primary, standby)
    })
    .await
    .expect("a thread");
    (
        primary,
        standby.unwrap_or_else(|e| panic!("a standby: {e}")),
    )
}

struct Fleet {
    url: String,
    group: GroupName,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    workers: Vec<WorkerHandle>,
}

impl Fleet {
    fn new(url: String) -> Self {
        Self {
            url,
            group: GroupName::new("failover").expect("a name"),
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            workers: Vec::new(),
        }
    }

    async fn start(&mut self) -> NodeId {
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
        let id = config.node_id();
        let handler = RecordingHandler::new(id, self.log.clone(), Arc::new(SystemClock));
        self.workers
            .push(config.start(store, handler).await.expect("start"));
        id
    }

    /// What the applications hold: bucket -> (worker, token), and each worker's count.
    fn held(&self) -> (BTreeMap<Bucket, (NodeId, FencingToken)>, Vec<usize>) {
        let mut held = BTreeMap::new();
        let mut loads = Vec::new();
        for w in &self.workers {
            let owned = w.owned().borrow().clone();
            loads.push(owned.len());
            for (bucket, token) in owned {
                held.insert(bucket, (w.node_id(), token));
            }
        }
        (held, loads)
    }

    /// Poll until the workers agree with `server` (every bucket live there, held by the
    /// worker it names with the token it names, every worker renewed there since `since`,
    /// loads within one), at most `limit` after `start`; the time it took from `start`.
    async fn until_settled_on(
        &self,
        server: &Cluster,
        since: Timestamp,
        start: Instant,
        limit: Duration,
    ) -> Duration {
        let observer = PgLeaseStore::builder(server.tcp_url("postgres", DB, ""))
            .max_connections(1)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("an observer");
        let ids: Vec<NodeId> = self.workers.iter().map(WorkerHandle::node_id).collect();
        let mut last = String::new();
        loop {
            if let Ok(snap) = observer.snapshot(&self.group).await {
                let (held, loads) = self.held();
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
                let balanced = loads
                    .iter()
                    .max()
                    .zip(loads.iter().min())
                    .is_some_and(|(a, b)| a - b <= 1);
                if live.len() == BUCKETS as usize
                    && held == live
                    && renewed == ids.len()
                    && balanced
                {
                    return start.elapsed();
                }
                last = format!(
                    "{} live on the server, held {loads:?}, {renewed} of {} renewed, agree: {}",
                    live.len(),
                    ids.len(),
                    held == live
                );
            }
            assert!(
                start.elapsed() < limit,
                "not settled within {limit:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn shutdown(self) -> OwnershipLog<Timestamp> {
        for w in self.workers {
            w.shutdown().await.expect("a clean stop");
        }
        self.log.lock().expect("the log").clone()
    }
}

/// Kill `primary` and promote `standby`, off the runtime's threads; the instant the standby
/// took writes, on the test's monotonic clock and on the (shared) wall clock.
async fn fail_over(primary: &Cluster, standby: &Cluster) -> (Instant, Timestamp, Duration) {
    replace(primary, standby, Cluster::kill).await
}

/// Stop `primary` with `stop`, then promote `standby` (as [`fail_over`]).
async fn replace(
    primary: &Cluster,
    standby: &Cluster,
    stop: fn(&Cluster) -> Result<(), String>,
) -> (Instant, Timestamp, Duration) {
    let stopped = Instant::now();
    tokio::task::block_in_place(|| {
        stop(primary).expect("stopping the primary");
        standby.promote().expect("promoting the standby");
    });
    (Instant::now(), SystemClock.now(), stopped.elapsed())
}

/// Wait until `standby` has run for over a second, then until every worker has renewed on
/// `primary` since: the promoted server trusts its switch point only if it ran before the
/// old primary's last heartbeat it replayed, with a second's margin for the clocks (V4).
async fn renewed_after_standby_start(fleet: &Fleet, primary: &Cluster, standby: &Cluster) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while standby
        .psql_in(
            DB,
            "SELECT clock_timestamp() > pg_postmaster_start_time() + interval '1.2 seconds'",
        )
        .as_deref()
        != Ok("t")
    {
        assert!(Instant::now() < deadline, "the standby's clock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fleet
        .until_settled_on(
            primary,
            SystemClock.now(),
            Instant::now(),
            Duration::from_secs(10),
        )
        .await;
}

/// Three workers settled on `primary`, then `primary` stopped with `stop` and `standby`
/// promoted, in steady state: no bucket moves, none is unowned for an instant, every token
/// stays as it was, and every session is kept (V4).
async fn no_bucket_moves(
    what: &str,
    replication: Replication,
    stop: fn(&Cluster) -> Result<(), String>,
) {
    let bound = TTL + RENEW + Duration::from_secs(2);
    let (primary, standby) = primary_and_standby(replication).await;
    let url = Cluster::multi_host_url(
        &[&primary, &standby],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut fleet = Fleet::new(url);
    for _ in 0..3 {
        fleet.start().await;
    }
    let began = SystemClock.now();
    fleet
        .until_settled_on(&primary, began, Instant::now(), Duration::from_secs(20))
        .await;
    renewed_after_standby_start(&fleet, &primary, &standby).await;
    let (held_before, _) = fleet.held();

    let stopped_wall = SystemClock.now();
    let (promoted, promoted_wall, outage) = replace(&primary, &standby, stop).await;
    let took = fleet
        .until_settled_on(&standby, promoted_wall, promoted, bound)
        .await;
    let settled_wall = SystemClock.now();
    let (held_after, _) = fleet.held();
    let log = fleet.log.lock().expect("log").clone();
    let (assigned, revoked) = moves(&log, stopped_wall, settled_wall);
    let unowned = unowned_seconds(&log, stopped_wall, settled_wall);
    eprintln!(
        "{what}: stop to promoted {outage:?}; every worker renewed {took:?} after the \
         promotion; {assigned} assignments, {revoked} revocations, {unowned:.1} bucket-s \
         unowned; sessions: {}",
        crossings(&standby)
    );
    assert_eq!((assigned, revoked), (0, 0), "{what}: buckets moved");
    assert!(unowned == 0.0, "{what}: {unowned} bucket-s unowned");
    assert_eq!(held_after, held_before, "{what}: holders or tokens changed");
    assert_eq!(crossings(&standby), "kept; kept; kept");
    let log = fleet.shutdown().await;
    eprintln!("ownership log: {}", judge(&log));
}

/// A planned switchover: the primary stopped cleanly (`pg_ctl stop -m fast`, which sends the
/// standby every WAL record it wrote), the standby promoted, with asynchronous replication.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_switchover_moves_no_bucket() {
    no_bucket_moves("switchover", Replication::Asynchronous, Cluster::stop).await;
}

/// A synchronous standby promoted after the primary was killed (`-m immediate`), in steady
/// state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_synchronous_failover_in_steady_state_moves_no_bucket() {
    no_bucket_moves(
        "sync failover, steady state",
        Replication::Synchronous,
        Cluster::kill,
    )
    .await;
}

/// No overlap at all in the log, and its own check passes; returns its summary line.
fn judge(log: &OwnershipLog<Timestamp>) -> String {
    let overlaps = coverage::overlaps(log, SystemClock.now()).expect("a well-formed log");
    assert!(
        overlaps.is_empty(),
        "{} overlaps, the longest {:?}: {:#?}",
        overlaps.len(),
        overlaps.iter().map(|o| o.duration).max(),
        overlaps.first()
    );
    let summary = log.check().unwrap_or_else(|e| panic!("ownership log: {e}"));
    format!("{summary:?}")
}

/// Per bucket, the highest token assigned before `t` and the lowest assigned at or after it.
fn tokens_around(
    log: &OwnershipLog<Timestamp>,
    t: Timestamp,
) -> (BTreeMap<Bucket, i64>, BTreeMap<Bucket, i64>) {
    let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
    for e in log.entries() {
        if let OwnershipEvent::Assigned(Assignment { bucket, token, .. }) = e.event {
            if e.at < t {
                let m = before.entry(bucket).or_insert(token.0);
                *m = (*m).max(token.0);
            } else {
                let m = after.entry(bucket).or_insert(token.0);
                *m = (*m).min(token.0);
            }
        }
    }
    (before, after)
}

/// Assignments and revocations in the log between `from` and `until`.
fn moves(log: &OwnershipLog<Timestamp>, from: Timestamp, until: Timestamp) -> (usize, usize) {
    let between = log
        .entries()
        .iter()
        .filter(|e| e.at >= from && e.at <= until);
    between.fold((0, 0), |(assigned, revoked), e| match e.event {
        OwnershipEvent::Assigned(_) => (assigned + 1, revoked),
        OwnershipEvent::Revoked { .. } => (assigned, revoked + 1),
    })
}

/// How each node's session fared on its first heartbeat after the failover, on `server`.
fn crossings(server: &Cluster) -> String {
    server
        .psql_in(
            DB,
            "SELECT string_agg(COALESCE(crossed, 'none'), '; ' ORDER BY crossed) \
             FROM lease.nodes",
        )
        .expect("reading the node rows")
}

/// Bucket-seconds without a holder between `from` and `until`.
fn unowned_seconds(log: &OwnershipLog<Timestamp>, from: Timestamp, until: Timestamp) -> f64 {
    coverage::unowned(log, ShardCount::new(BUCKETS).expect("n"), from, until)
        .expect("a well-formed log")
        .values()
        .map(Duration::as_secs_f64)
        .sum()
}

/// Synchronous replication: three workers on 24 buckets through a failover in steady state
/// (nothing moves), then, with the old primary rebuilt as the new one's synchronous standby, a
/// second failover right after a fourth worker joined (mid-rebalance: releases and claims in
/// flight). Each time every bucket is owned, renewed on the new primary and balanced within
/// ttl + renew + 2 s of the promotion; no bucket is ever held twice; every lease assigned
/// after the second failover carries a token above every token of the timeline before.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn synchronous_failovers_in_steady_state_and_mid_rebalance() {
    let bound = TTL + RENEW + Duration::from_secs(2);
    let (first, second) = primary_and_standby(Replication::Synchronous).await;
    let url = Cluster::multi_host_url(
        &[&first, &second],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut fleet = Fleet::new(url);
    for _ in 0..3 {
        fleet.start().await;
    }
    let began = SystemClock.now();
    fleet
        .until_settled_on(&first, began, Instant::now(), Duration::from_secs(20))
        .await;
    renewed_after_standby_start(&fleet, &first, &second).await;

    // 1. Steady state.
    let killed_wall = SystemClock.now();
    let (promoted, promoted_wall, outage) = fail_over(&first, &second).await;
    let took = fleet
        .until_settled_on(&second, promoted_wall, promoted, bound)
        .await;
    let settled_wall = SystemClock.now();
    let log = fleet.log.lock().expect("log").clone();
    eprintln!(
        "sync failover 1 (steady state): kill to promoted {outage:?}; settled {took:?} after \
         the promotion; {:.1} bucket-s unowned",
        unowned_seconds(&log, killed_wall, settled_wall)
    );
    // Nothing was lost: every session is kept, no bucket assigned again.
    let (_, after) = tokens_around(&log, promoted_wall);
    assert!(after.is_empty(), "buckets assigned again: {after:?}");
    assert_eq!(crossings(&second), "kept; kept; kept");

    // 2. The old primary comes back as the new one's synchronous standby; a fourth worker
    // joins, and the new primary dies in the rebalance that follows.
    tokio::task::block_in_place(|| first.rejoin_as_standby(&second, Replication::Synchronous))
        .unwrap_or_else(|e| panic!("rebuilding the old primary: {e}"));
    renewed_after_standby_start(&fleet, &second, &first).await;
    let joined_at = SystemClock.now();
    let joiner = fleet.start().await;
    // The moment the first of the others is told to shed a bucket for the joiner, the primary
    // dies: revocations, releases and the joiner's claims are under way.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fleet.log.lock().expect("log").entries().iter().any(|e| {
        e.at > joined_at
            && matches!(
                e.event,
                OwnershipEvent::Revoked {
                    reason: lease::RevokeReason::Shed,
                    ..
                }
            )
    }) {
        assert!(Instant::now() < deadline, "nobody shed for the joiner");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    let killed_wall = SystemClock.now();
    let (promoted, promoted_wall, outage) = fail_over(&second, &first).await;
    let rebalanced = fleet
        .log
        .lock()
        .expect("log")
        .entries()
        .iter()
        .filter(|e| e.at > joined_at && e.at < killed_wall)
        .filter(|e| matches!(e.event, OwnershipEvent::Assigned { .. }))
        .count();
    let took = fleet
        .until_settled_on(&first, promoted_wall, promoted, bound)
        .await;
    let settled_wall = SystemClock.now();
    let log = fleet.log.lock().expect("log").clone();
    eprintln!(
        "sync failover 2 (joiner {joiner} joined; {rebalanced} assignments since when the \
         primary died): kill to promoted {outage:?}; settled {took:?} after the promotion; \
         {:.1} bucket-s unowned",
        unowned_seconds(&log, killed_wall, settled_wall)
    );
    // The sessions whose writes the heartbeat had not bounded yet restarted; their buckets,
    // and any the rebalance left unowned, were claimed on the new timeline, above its floor.
    let (_, after) = tokens_around(&log, promoted_wall);
    eprintln!(
        "sessions after failover 2: {}; {} buckets assigned again",
        crossings(&first),
        after.len()
    );
    assert!(
        after.values().all(|&t| t >= FLOOR_2),
        "a lease after the second failover below its floor: {after:?}"
    );
    let log = fleet.shutdown().await;
    eprintln!("ownership log: {}", judge(&log));
}

/// Asynchronous replication with writes lost on purpose: the standby stops receiving WAL, a
/// fourth worker joins and the pool rebalances on the primary alone (session start, sheds,
/// releases and claims the standby never sees), then the primary dies and the standby is
/// promoted. No bucket is ever held by two workers at once, and every token assigned after
/// the failover exceeds every token assigned before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn asynchronous_failover_after_lost_writes_keeps_leases_exclusive() {
    let bound = TTL + RENEW + Duration::from_secs(2);
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    let url = Cluster::multi_host_url(
        &[&primary, &standby],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut fleet = Fleet::new(url);
    for _ in 0..3 {
        fleet.start().await;
    }
    let began = SystemClock.now();
    fleet
        .until_settled_on(&primary, began, Instant::now(), Duration::from_secs(20))
        .await;
    renewed_after_standby_start(&fleet, &primary, &standby).await;
    tokio::task::block_in_place(|| standby.cut_replication()).expect("cutting replication");
    let cut_wall = SystemClock.now();
    // The joiner takes its share at once, woken by the others' releases: the sessions the
    // standby knows are still live when the primary dies right after.
    fleet.start().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fleet.workers.last().map_or(0, |w| w.owned().borrow().len()) < 6 {
        assert!(Instant::now() < deadline, "the joiner never got its share");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let lost = tokens_around(&fleet.log.lock().expect("log"), cut_wall).1;
    eprintln!(
        "on the primary only, after the cut: {} buckets assigned anew",
        lost.len()
    );
    assert!(!lost.is_empty(), "the rebalance wrote nothing to lose");

    let killed_wall = SystemClock.now();
    let (promoted, promoted_wall, outage) = fail_over(&primary, &standby).await;
    let took = fleet
        .until_settled_on(&standby, promoted_wall, promoted, bound)
        .await;
    let settled_wall = SystemClock.now();
    let sessions = crossings(&standby);
    let log = fleet.shutdown().await;
    let overlaps = coverage::overlaps(&log, SystemClock.now()).expect("a well-formed log");
    eprintln!(
        "async failover after lost writes: kill to promoted {outage:?}; settled {took:?} \
         after the promotion; {:.1} bucket-s unowned; {} overlaps (longest {:?})",
        unowned_seconds(&log, killed_wall, settled_wall),
        overlaps.len(),
        overlaps.iter().map(|o| o.duration).max()
    );
    // The sessions that lost writes restarted (and the joiner, whose session start was
    // lost); a session kept holds on with its tokens.
    let (before, after) = tokens_around(&log, killed_wall);
    eprintln!(
        "sessions: {sessions}; {} buckets assigned again",
        after.len()
    );
    assert!(!after.is_empty(), "no session lost a write");
    for (bucket, first_after) in &after {
        let last_before = before.get(bucket).copied().unwrap_or(0);
        assert!(
            *first_after > last_before,
            "bucket {bucket}: token {first_after} after the failover, {last_before} before"
        );
    }
    eprintln!("ownership log: {}", judge(&log));
}
