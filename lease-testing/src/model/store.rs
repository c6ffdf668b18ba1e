//! The model as a [`LeaseStore`]: one mutex around a [`Model`], its time from a clock.
//!
//! The differential test runs every operation through one interpreter
//! ([`apply_to_store`](crate::differential::apply_to_store)), on the model through this
//! adapter and on the stores it judges, so the model and the stores cannot be driven
//! differently. The model never waits: each call is ready at once.

use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use lease_core::{
    AdminStore, Bucket, FencingToken, GroupName, GroupSnapshot, GroupStamp, Heartbeat, Incarnation,
    Lease, Load, MemberControl, MemberMetadata, NodeId, NodesSnapshot, QuarantineFor,
    QuarantineReason, ResizeOutcome, SessionId, ShardCount, StoreError, Takeover, Tenure,
    Timestamp, Ttl, Weight, WorkerStore,
};
use lease_core::{Clock, ManualClock, SessionBound};

use super::Model;

/// A [`Model`] behind a mutex, at the time of its [`ManualClock`]. Cloning it forks the state
/// and the clock (the proptest reference state is cloned).
pub struct ModelStore {
    model: Mutex<Model>,
    clock: ManualClock,
}

impl ModelStore {
    /// `model` at the time of `clock`.
    pub fn new(model: Model, clock: ManualClock) -> Self {
        Self {
            model: Mutex::new(model),
            clock,
        }
    }

    /// A copy of the model as it is now.
    pub fn model(&self) -> Model {
        self.model
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The clock the model's time is read from.
    pub fn clock(&self) -> &ManualClock {
        &self.clock
    }

    fn with<T>(&self, f: impl FnOnce(&mut Model, Timestamp) -> T) -> T {
        let now = self.clock.now();
        let mut model = self.model.lock().unwrap_or_else(PoisonError::into_inner);
        model.call();
        f(&mut model, now)
    }

    /// A failover to `standby` (a copy of the model taken with [`model`](Self::model) when its
    /// replication stopped): it becomes the store on the next timeline, and what the store did
    /// since the copy is lost.
    pub fn fail_over(&self, mut standby: Model) {
        standby.promote();
        *self.model.lock().unwrap_or_else(PoisonError::into_inner) = standby;
    }
}

impl Clone for ModelStore {
    fn clone(&self) -> Self {
        Self::new(self.model(), ManualClock::starting_at(self.clock.now()))
    }
}

#[async_trait]
impl WorkerStore for ModelStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        self.with(|m, _| m.ensure_group(group, shards))
    }

    /// The model never answers "unchanged" (H8 allows always giving the view), so `seen` is
    /// not read.
    async fn heartbeat_with_bound(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        _seen: &[GroupStamp],
        bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError> {
        self.with(|m, now| m.heartbeat(node, incarnation, ttl, metadata, bound.as_ref(), now))
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        self.with(|m, now| m.join(group, node, session, now))
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.with(|m, now| m.claim(group, worker, session, want, takeover, now))
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.with(|m, now| m.claim_buckets(group, worker, session, buckets, takeover, now))
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        self.with(|m, now| m.release(group, worker, session, buckets, now))
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        self.with(|m, now| m.publish_loads(group, worker, session, loads, now))
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        self.with(|m, now| m.leave(group, node, Some(session), now))
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        Ok(self.with(|m, now| m.is_current(group, bucket, worker, token, now)))
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        Ok(self.with(|m, now| m.hand_over(node, incarnation, keep, now)))
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        self.with(|m, now| m.set_weight(group, node, session, weight, now))
    }
}

#[async_trait]
impl AdminStore for ModelStore {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        self.with(|m, now| m.snapshot(group, now))
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        Ok(self.with(|m, now| m.nodes(now)))
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        self.with(|m, now| m.resize(group, from, to, now))
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.with(|m, _| m.control(group, node, control))
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        self.with(|m, now| m.quarantine(group, bucket, duration, reason.clone(), now))
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        self.with(|m, _| m.history(group, bucket))
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        self.with(|m, now| m.leave(group, node, None, now))
    }
}

/// Fails a [`ModelStore`] over (the failover suite's [`Failovers`](crate::failover::Failovers)):
/// a standby is a copy of the model.
#[derive(Clone, Copy, Debug)]
pub struct ModelFailovers;

impl crate::failover::Failovers<ModelStore> for ModelFailovers {
    type Standby = Model;

    fn standby(&self, store: &ModelStore) -> Model {
        store.model()
    }

    fn fail_over(&self, store: &ModelStore, standby: Model) {
        store.fail_over(standby);
    }
}
