//! A fault-injecting store wrapper and a clock that follows tokio's (paused) time.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::time::Instant;

use lease_core::ChangeFeed;
use lease_core::{AdminStore, Weight, WorkerStore};
use lease_core::{BackendFailure, Operation, ResizeOutcome, StoreError, Takeover};
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionId, ShardCount,
};
use lease_core::{Clock, ManualClock, Timestamp, Ttl, store_precision};
use lease_core::{GroupSnapshot, GroupStamp, Heartbeat, Lease, Load, NodesSnapshot};
use lease_core::{MemberControl, QuarantineFor, QuarantineReason, SessionBound, Tenure};

/// A [`Clock`] that reads tokio's clock, so a store's expiry follows `tokio::time::pause` and
/// `advance` in tests. Starts at the same instant as [`ManualClock::new`].
#[derive(Clone, Debug)]
pub struct TokioClock {
    base: Timestamp,
    start: Instant,
}

impl TokioClock {
    /// A clock reading tokio's time from now on. Create it inside the runtime.
    pub fn new() -> Self {
        Self {
            base: ManualClock::new().now(),
            start: Instant::now(),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        let elapsed = Instant::now().saturating_duration_since(self.start);
        store_precision(
            self.base
                + chrono::Duration::microseconds(
                    i64::try_from(elapsed.as_micros()).unwrap_or(i64::MAX),
                ),
        )
    }
}

/// The switches of a [`FaultyStore`]. Shared: flip them while the worker runs.
#[derive(Debug, Default)]
pub struct Faults {
    /// Every call fails with a transient backend error (the store is unavailable).
    pub fail_all: AtomicBool,
    /// Heartbeats fail with a backend error.
    pub fail_heartbeats: AtomicBool,
    /// Every call fails with a backend error retrying cannot fix (permission denied).
    pub fail_permanently: AtomicBool,
    /// Every call hangs until this is cleared (a network cut without resets).
    pub hang: AtomicBool,
    /// `changes` returns no feed.
    pub no_feed: AtomicBool,
    /// Calls that failed or hung because of a switch.
    pub injected: AtomicU64,
    /// Heartbeats passed on to the inner store (one per tick of a node, whatever its groups).
    pub heartbeats: AtomicU64,
}

/// A store that delegates to `S` unless a [`Faults`] switch says otherwise.
#[derive(Clone, Debug)]
pub struct FaultyStore<S> {
    inner: S,
    faults: Arc<Faults>,
}

impl<S> FaultyStore<S> {
    /// Wrap `inner`, with every switch off.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            faults: Arc::new(Faults::default()),
        }
    }

    /// The switches.
    pub fn faults(&self) -> Arc<Faults> {
        self.faults.clone()
    }

    async fn gate(&self, op: Operation) -> Result<(), StoreError> {
        let f = &self.faults;
        let heartbeat = op == Operation::Heartbeat;
        if f.hang.load(Ordering::SeqCst) {
            f.injected.fetch_add(1, Ordering::SeqCst);
            while f.hang.load(Ordering::SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
        if f.fail_all.load(Ordering::SeqCst)
            || (heartbeat && f.fail_heartbeats.load(Ordering::SeqCst))
        {
            f.injected.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::backend_detail(
                op,
                BackendFailure::Unavailable,
                "injected fault",
            ));
        }
        if f.fail_permanently.load(Ordering::SeqCst) {
            f.injected.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::backend_detail(
                op,
                BackendFailure::PermissionDenied,
                "injected fault",
            ));
        }
        Ok(())
    }
}

// Every method forwarded: a default one would skip the inner store's own behaviour.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: WorkerStore> WorkerStore for FaultyStore<S> {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        self.gate(Operation::EnsureGroup).await?;
        self.inner.ensure_group(group, shards).await
    }

    async fn heartbeat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        self.gate(Operation::Heartbeat).await?;
        self.faults.heartbeats.fetch_add(1, Ordering::SeqCst);
        self.inner
            .heartbeat(node, incarnation, ttl, metadata, seen)
            .await
    }

    async fn heartbeat_with_bound(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
        bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError> {
        self.gate(Operation::Heartbeat).await?;
        self.faults.heartbeats.fetch_add(1, Ordering::SeqCst);
        self.inner
            .heartbeat_with_bound(node, incarnation, ttl, metadata, seen, bound)
            .await
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        self.gate(Operation::Join).await?;
        self.inner.join(group, node, session).await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.gate(Operation::Claim).await?;
        self.inner
            .claim(group, worker, session, want, takeover)
            .await
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.gate(Operation::ClaimBuckets).await?;
        self.inner
            .claim_buckets(group, worker, session, buckets, takeover)
            .await
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        self.gate(Operation::Release).await?;
        self.inner.release(group, worker, session, buckets).await
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        self.gate(Operation::PublishLoads).await?;
        self.inner
            .publish_loads(group, worker, session, loads)
            .await
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        self.gate(Operation::Leave).await?;
        self.inner.leave(group, node, session).await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.gate(Operation::IsCurrent).await?;
        self.inner.is_current(group, bucket, worker, token).await
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.gate(Operation::HandOver).await?;
        self.inner.hand_over(node, incarnation, keep).await
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        if self.faults.no_feed.load(Ordering::SeqCst) {
            return Ok(None);
        }
        self.inner.changes(group).await
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        self.gate(Operation::SetWeight).await?;
        self.inner.set_weight(group, node, session, weight).await
    }
}

// Every method forwarded: a default one would skip the inner store's own behaviour.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: AdminStore> AdminStore for FaultyStore<S> {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        self.gate(Operation::Snapshot).await?;
        self.inner.snapshot(group).await
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        self.gate(Operation::Nodes).await?;
        self.inner.nodes().await
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        self.gate(Operation::Resize).await?;
        self.inner.resize(group, from, to).await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.gate(Operation::Control).await?;
        self.inner.control(group, node, control).await
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        self.gate(Operation::Quarantine).await?;
        self.inner
            .quarantine_with_reason(group, bucket, duration, reason)
            .await
    }

    async fn quarantine(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError> {
        self.gate(Operation::Quarantine).await?;
        self.inner.quarantine(group, bucket, duration).await
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        self.gate(Operation::History).await?;
        self.inner.history(group, bucket).await
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        self.gate(Operation::Evict).await?;
        self.inner.evict(group, node).await
    }
}
