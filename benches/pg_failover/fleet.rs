//! The servers and the workers of one run, and when the workers have settled.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, BucketState, Clock, SystemClock, Timestamp};
use lease::testing::{OwnershipLog, RecordingHandler};
use lease::{
    Bucket, FencingToken, GroupName, LeaseWorker, NodeId, OwnershipEvent, RevokeReason, ShardCount,
    WorkerHandle,
};
use lease_testdb::{Cluster, ClusterOptions, Replication};

pub const DB: &str = "failover";
pub const BUCKETS: u32 = 24;

/// The workers' ttl and renew interval.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub ttl: Duration,
    pub renew: Duration,
}

/// A primary with a migrated database, and one standby streaming from it.
pub async fn primary_and_standby(replication: Replication) -> (Cluster, Cluster) {
    let primary = tokio::task::block_in_place(|| {
        Cluster::start(ClusterOptions {
            tcp: true,
            ..ClusterOptions::default()
        })
    })
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
    let standby = tokio::task::block_in_place(|| primary.start_standby(replication))
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    (primary, standby)
}

/// `LeaseWorker`s in this process, each on a store of its own (as separate processes would
/// be), all through one URL, recording what their applications are told in one log.
pub struct Fleet {
    url: String,
    timing: Timing,
    group: GroupName,
    pub log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    workers: Vec<WorkerHandle>,
}

impl Fleet {
    pub fn new(url: String, timing: Timing) -> Self {
        Self {
            url,
            timing,
            group: GroupName::new("failover").expect("a name"),
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            workers: Vec::new(),
        }
    }

    pub async fn start(&mut self) {
        let store = PgLeaseStore::builder(self.url.clone())
            .max_connections(4)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("a store");
        let config = LeaseWorker::builder(self.group.clone(), ShardCount::new(BUCKETS).expect("n"))
            .ttl(self.timing.ttl)
            .renew_interval(self.timing.renew)
            .build()
            .expect("a config");
        let handler =
            RecordingHandler::new(config.node_id(), self.log.clone(), Arc::new(SystemClock));
        self.workers
            .push(config.start(store, handler).await.expect("start"));
    }

    /// The workers' node ids, in the order they started.
    pub fn ids(&self) -> Vec<NodeId> {
        self.workers.iter().map(WorkerHandle::node_id).collect()
    }

    /// How many buckets the worker started last holds.
    pub fn last_holds(&self) -> usize {
        self.workers.last().map_or(0, |w| w.owned().borrow().len())
    }

    /// Whether the log has a revocation for a shed after `t`.
    pub fn shed_since(&self, t: Timestamp) -> bool {
        self.log.lock().expect("the log").entries().iter().any(|e| {
            e.at > t
                && matches!(
                    e.event,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Shed,
                        ..
                    }
                )
        })
    }

    /// Poll until the workers agree with `server`: every bucket live there, held by the
    /// worker it names with the token it names, every worker renewed there after `since`,
    /// loads within one. Panics, saying how far they got, if that takes over `limit` after
    /// `start`; otherwise the time it took from `start`.
    pub async fn until_settled_on(
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
        let mut last = String::from("no snapshot");
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

    /// Wait until `standby` has run for 1.2 s, then until every worker has renewed on
    /// `primary` since: the promoted server trusts its switch point only if it ran for over a
    /// second before the old primary's last heartbeat it replayed (V4), and keeps nothing
    /// otherwise.
    pub async fn renewed_after_standby_start(&self, primary: &Cluster, standby: &Cluster) {
        let limit = Duration::from_secs(10);
        let start = Instant::now();
        while standby
            .psql_in(
                DB,
                "SELECT clock_timestamp() > pg_postmaster_start_time() + interval '1.2 seconds'",
            )
            .as_deref()
            != Ok("t")
        {
            assert!(start.elapsed() < limit, "the standby's clock");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let limit = 2 * self.timing.renew + Duration::from_secs(5);
        self.until_settled_on(primary, SystemClock.now(), Instant::now(), limit)
            .await;
    }

    pub async fn shutdown(self) -> OwnershipLog<Timestamp> {
        for w in self.workers {
            w.shutdown().await.expect("a clean stop");
        }
        self.log.lock().expect("the log").clone()
    }
}
