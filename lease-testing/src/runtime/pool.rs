//! The harness of the cases on workers of one group: a [`Pool`] starts them on one store,
//! each behind fault switches of its own, and keeps the one ownership log they record into.
//! Several families use it, so it lives apart from their cases.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use lease_core::ownership_log::{OwnershipLog, Summary};
use lease_core::{
    Assignment, Clock, ErrorKind, GroupName, LeaseStore, NodeId, OwnershipEvent, RevokeReason,
    ShardCount, Timestamp,
};
use lease_worker::{LeaseWorker, StartError, WorkerHandle};

use super::{
    Env, POLL, RENEW, Reported, SLOW_RENEW, SLOW_TTL, Slow, SlowHandler, TTL, balanced, lock, until,
};
use crate::{Faults, FaultyStore, RecordingHandler};

/// Workers of one group on one store, each behind its own fault switches, recording into one
/// ownership log.
pub(super) struct Pool<S> {
    pub(super) store: S,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    events: Arc<AtomicUsize>,
    pub(super) group: GroupName,
    pub(super) shards: u32,
    wakeups: bool,
    /// The workers' renew interval and ttl.
    pub(super) renew: Duration,
    ttl: Duration,
    pub(super) workers: BTreeMap<NodeId, (WorkerHandle, Arc<Faults>)>,
    errors: BTreeMap<NodeId, Reported>,
}

impl<S: LeaseStore + Clone + 'static> Pool<S> {
    /// A pool of `group` (`shards` buckets) whose workers ([`RENEW`], [`TTL`]) get wake-ups
    /// from the store's change feed or, with `wakeups` false, only tick on the renew interval.
    pub(super) fn new(env: &Env<S>, group: &str, shards: u32, wakeups: bool) -> Self {
        Self {
            store: env.store.clone(),
            clock: env.clock.clone(),
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            events: Arc::new(AtomicUsize::new(0)),
            group: GroupName::new(group).expect("a group name"),
            shards,
            wakeups,
            renew: RENEW,
            ttl: TTL,
            workers: BTreeMap::new(),
            errors: BTreeMap::new(),
        }
    }

    /// The same pool, its workers on [`SLOW_RENEW`] and [`SLOW_TTL`].
    pub(super) fn slow_ticks(self) -> Self {
        Self {
            renew: SLOW_RENEW,
            ttl: SLOW_TTL,
            ..self
        }
    }

    pub(super) fn config(&self, id: Option<NodeId>) -> LeaseWorker {
        let mut builder = LeaseWorker::builder(
            self.group.clone(),
            ShardCount::new(self.shards).expect("a shard count"),
        )
        .ttl(self.ttl)
        .renew_interval(self.renew);
        if let Some(id) = id {
            builder = builder.node_id(id);
        }
        builder.build().expect("a valid configuration")
    }

    pub(super) async fn start(&mut self) -> NodeId {
        self.launch(None, Slow::default()).await
    }

    /// Start a worker with the application `slow`.
    pub(super) async fn start_slow(&mut self, slow: Slow) -> NodeId {
        self.launch(None, slow).await
    }

    /// Start a worker that uses the node id `id` in the store, as a second process started
    /// with the id of another would; it is told apart in this pool (and in the ownership log)
    /// by the id returned.
    pub(super) async fn start_as(&mut self, id: NodeId) -> NodeId {
        self.launch(Some(id), Slow::default()).await
    }

    async fn launch(&mut self, id: Option<NodeId>, slow: Slow) -> NodeId {
        let config = self.config(id);
        let label = if id.is_some() {
            NodeId::new()
        } else {
            config.node_id()
        };
        let (handle, faults) = self
            .launch_config(config, label, slow)
            .await
            .expect("the worker starts");
        self.workers.insert(label, (handle, faults));
        label
    }

    /// Start `config` behind fault switches of its own, recording as `label`.
    pub(super) async fn launch_config(
        &mut self,
        config: LeaseWorker,
        label: NodeId,
        slow: Slow,
    ) -> Result<(WorkerHandle, Arc<Faults>), StartError> {
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        faults.no_feed.store(!self.wakeups, Ordering::SeqCst);
        let errors = self.errors.entry(label).or_default().clone();
        let handler = SlowHandler {
            inner: RecordingHandler::new(label, self.log.clone(), self.clock.clone()),
            slow,
            assigned: AtomicUsize::new(0),
            events: self.events.clone(),
            errors,
        };
        let handle = config.start(store, handler).await?;
        Ok((handle, faults))
    }

    pub(super) fn faults(&self, w: NodeId) -> Arc<Faults> {
        self.workers[&w].1.clone()
    }

    pub(super) async fn stop(&mut self, w: NodeId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.shutdown().await.expect("a clean stop");
    }

    /// Stop `w` at once, without revoking or leaving: a crash, to the others.
    pub(super) fn crash(&mut self, w: NodeId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.abort();
        lock(&self.log).crashed(w, self.clock.now());
    }

    /// What each running worker's application owns.
    pub(super) fn owned(&self) -> BTreeMap<NodeId, usize> {
        self.workers
            .iter()
            .map(|(&w, (h, _))| (w, h.owned().borrow().len()))
            .collect()
    }

    pub(super) fn balanced(&self) -> bool {
        balanced(self.owned().into_values(), self.shards)
    }

    /// Wait until balanced; how long it took. Panics after `limit`.
    pub(super) async fn until_balanced(&self, limit: Duration, what: &str) -> Duration {
        until(limit, what, || self.balanced(), || self.owned()).await
    }

    /// Wait until `w`'s application owns `n` buckets. Panics after `limit`.
    pub(super) async fn until_owns(&self, w: NodeId, n: usize, limit: Duration) -> Duration {
        let what = format!("worker {w} owning {n}");
        until(
            limit,
            &what,
            || self.owned().get(&w) == Some(&n),
            || self.owned(),
        )
        .await
    }

    /// When `w`'s application heard each revocation with `reason`.
    pub(super) fn revoked_at(&self, w: NodeId, reason: RevokeReason) -> Vec<Timestamp> {
        self.events_of(w)
            .into_iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Revoked { reason: r, .. } if *r == reason))
            .map(|(t, _)| t)
            .collect()
    }

    /// When `w`'s application was assigned each bucket.
    pub(super) fn assigned_at(&self, w: NodeId) -> Vec<Timestamp> {
        self.events_of(w)
            .into_iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .map(|(t, _)| t)
            .collect()
    }

    pub(super) fn events_of(&self, w: NodeId) -> Vec<(Timestamp, OwnershipEvent)> {
        lock(&self.log)
            .entries()
            .iter()
            .filter(|e| e.worker == w)
            .map(|e| (e.at, e.event))
            .collect()
    }

    /// The expiry of `w`'s session as the store holds it now, if it holds one.
    pub(super) async fn session_expiry(&self, w: NodeId) -> Option<Timestamp> {
        self.store
            .snapshot(&self.group)
            .await
            .expect("snapshot")
            .members
            .iter()
            .find(|m| m.worker == w)
            .map(|m| m.expires_at)
    }

    /// Wait until `done` holds, meanwhile following the expiry of `w`'s session in the store:
    /// the latest one seen. A heartbeat already sent when `w` was cut off may still renew it,
    /// so the expiry read before could be one renewal short; the store keeps the member until
    /// some time after it expired, so polling sees the last one.
    pub(super) async fn until_following_expiry(
        &self,
        w: NodeId,
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> Timestamp {
        let start = Instant::now();
        let mut expiry = None;
        loop {
            if let Some(e) = self.session_expiry(w).await {
                expiry = expiry.max(Some(e));
            }
            if done() {
                return expiry.expect("the worker's session was seen in the store");
            }
            let elapsed = start.elapsed();
            assert!(
                elapsed < limit,
                "{what}: not within {limit:?}; {:?}",
                self.owned()
            );
            tokio::time::sleep(POLL.min(limit - elapsed)).await;
        }
    }

    /// The kinds of the errors `w` reported, in order (`None`: a timeout).
    pub(super) fn errors_of(&self, w: NodeId) -> Vec<Option<ErrorKind>> {
        lock(&self.errors[&w]).clone()
    }

    pub(super) fn check(&self) -> Summary {
        lock(&self.log)
            .check()
            .unwrap_or_else(|e| panic!("ownership log of {}: {e}", self.group))
    }

    /// Resize the group from the count the pool's workers have to `to`; from now on the pool
    /// judges balance by `to`.
    pub(super) async fn resize(&mut self, to: u32) {
        let (from, to) = (
            ShardCount::new(self.shards).expect("a shard count"),
            ShardCount::new(to).expect("a shard count"),
        );
        let outcome = self
            .store
            .resize(&self.group, from, to)
            .await
            .expect("the resize");
        assert!(
            matches!(outcome, lease_core::ResizeOutcome::Started { .. }),
            "{outcome:?}"
        );
        self.shards = to.get();
    }

    /// Wait until the resize is over (no old bucket left in the store) and the workers own
    /// every new bucket evenly; how long that took. Panics after `limit`.
    pub(super) async fn until_resized(&self, limit: Duration, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            if self.balanced() {
                let snap = self.store.snapshot(&self.group).await.expect("snapshot");
                if snap.draining.is_empty() && snap.shard_count.get() == self.shards {
                    return start.elapsed();
                }
            }
            let elapsed = start.elapsed();
            assert!(
                elapsed < limit,
                "{what}: not within {limit:?}; {:?}",
                self.owned()
            );
            tokio::time::sleep(POLL.min(limit - elapsed)).await;
        }
    }

    /// Start a worker configured with the pool's count and check that it is refused with the
    /// typed mismatch.
    pub(super) async fn refused_for_its_count(&self) {
        let err = self
            .config(None)
            .start(self.store.clone(), lease_worker::event_channel(8).0)
            .await
            .expect_err("a worker configured with another count started");
        assert_eq!(
            err.store_error().map(lease_core::StoreError::kind),
            Some(ErrorKind::ShardCountMismatch)
        );
    }

    /// Every assignment `w`'s application heard of a bucket of `shards` buckets.
    pub(super) fn assignments_of(&self, w: NodeId, shards: u32) -> Vec<Assignment> {
        self.events_of(w)
            .into_iter()
            .filter_map(|(_, e)| match e {
                OwnershipEvent::Assigned(a) if a.shards.get() == shards => Some(a),
                _ => None,
            })
            .collect()
    }

    /// Stop every worker gracefully and check the ownership log.
    pub(super) async fn shutdown(mut self) -> Summary {
        let ids: Vec<NodeId> = self.workers.keys().copied().collect();
        for w in ids {
            self.stop(w).await;
        }
        self.check()
    }
}
