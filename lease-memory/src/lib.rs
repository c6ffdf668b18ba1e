//! `lease-memory`: the in-memory backend of the lease engine, and the executable
//! specification of the [`LeaseStore`](lease_core::LeaseStore) contract.
//!
//! Every rule of the contract written on [`LeaseStore`](lease_core::LeaseStore) is implemented here in plain Rust
//! behind one mutex, and checked by the same conformance suite the Postgres backend runs. Use
//! it for unit tests, demos and single-process deployments; its state lives and dies with the
//! process.
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{
//!     GroupName, Incarnation, ManualClock, MemberMetadata, ShardCount, Takeover, Ttl,
//!     NodeId, WorkerStore,
//! };
//! use lease_memory::MemoryLeaseStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = ManualClock::new();
//! let store = MemoryLeaseStore::with_clock(clock.clone());
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(4)?).await?;
//!
//! let (a, b) = (NodeId::new(), NodeId::new());
//! let ttl = Ttl::from_secs(10)?;
//! let none = MemberMetadata::empty();
//! let sa = store.heartbeat(a, Incarnation::new(), ttl, &none, &[]).await?.session;
//! store.join(&group, a, sa).await?;
//! let won = store.claim(&group, a, sa, 4, Takeover::Allowed).await?;
//! assert_eq!(won.len(), 4);
//!
//! // b cannot take a live lease...
//! let b_process = Incarnation::new();
//! let sb = store.heartbeat(b, b_process, ttl, &none, &[]).await?.session;
//! store.join(&group, b, sb).await?;
//! assert!(store.claim(&group, b, sb, 4, Takeover::Allowed).await?.is_empty());
//!
//! // ...but once a stops renewing and its session expires, b takes over with higher tokens.
//! clock.advance(Duration::from_secs(6));
//! let beat = store.heartbeat(b, b_process, ttl, &none, &[]).await?;
//! assert!(!beat.new_session, "b renews in time");
//! clock.advance(Duration::from_secs(5)); // a's session ended 10 s after its heartbeat
//! let taken = store.claim(&group, b, sb, 4, Takeover::Allowed).await?;
//! assert_eq!(taken.len(), 4);
//! assert!(taken.iter().zip(&won).all(|(new, old)| new.token > old.token));
//! assert!(!store.is_current(&group, won[0].bucket, a, won[0].token).await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

#![warn(missing_docs)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures_util::StreamExt;
use lease_core::{
    AdminStore, BackendFailure, Bucket, Change, ChangeFeed, Clock, FencingToken, GroupName,
    GroupSnapshot, GroupStamp, Heartbeat, Incarnation, Lease, Load, MemberControl, MemberMetadata,
    NodeId, NodesSnapshot, Operation, QuarantineFor, QuarantineReason, ResizeOutcome, SessionBound,
    SessionId, ShardCount, StoreError, SystemClock, Takeover, Tenure, Timestamp, Ttl, Weight,
    WorkerStore, store_precision,
};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use lease_rules::State;

/// A copy of a [`MemoryLeaseStore`]'s state as a standby has it: see
/// [`MemoryLeaseStore::standby`].
#[derive(Clone, Debug)]
pub struct Standby(State);

/// How many unread changes a feed buffers before reporting [`Change::Missed`].
const FEED_CAPACITY: usize = 256;

#[derive(Debug, Default)]
struct Inner {
    state: State,
    feeds: HashMap<GroupName, broadcast::Sender<Change>>,
}

/// The in-memory [`LeaseStore`](lease_core::LeaseStore). Cheap to clone: clones share the same state.
#[derive(Clone, Debug)]
pub struct MemoryLeaseStore {
    inner: Arc<Mutex<Inner>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLeaseStore {
    /// A store deciding expiry by the host's wall clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store deciding expiry by `clock` (a [`lease_core::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        let mut inner = Inner::default();
        // It may fail over (`fail_over`): heartbeats answer positions (H10).
        inner.state.history.positions = true;
        Self {
            inner: Arc::new(Mutex::new(inner)),
            clock: Arc::new(clock),
        }
    }

    /// A copy of the store as a streaming standby has it when its replication stops now:
    /// what the store does from here on is missing from it. [`fail_over`](Self::fail_over)
    /// promotes it. (A standby taken right before the failover is a synchronous one: it lost
    /// nothing.)
    ///
    /// # Errors
    ///
    /// If the state was poisoned by a panic in another thread.
    pub fn standby(&self) -> Result<Standby, StoreError> {
        let (inner, _) = self.lock(Operation::Snapshot)?;
        Ok(Standby(inner.state.clone()))
    }

    /// A failover to `standby`: it becomes the store's state on the next timeline (rules
    /// V1-V4), and everything done since it was taken is lost. The change feeds stay
    /// subscribed.
    ///
    /// # Errors
    ///
    /// If the state was poisoned by a panic in another thread.
    pub fn fail_over(&self, standby: Standby) -> Result<(), StoreError> {
        let (mut inner, _) = self.lock(Operation::Snapshot)?;
        let mut state = standby.0;
        state.history.promote();
        state.outbox.clear();
        inner.state = state;
        Ok(())
    }

    fn lock(&self, op: Operation) -> Result<(MutexGuard<'_, Inner>, Timestamp), StoreError> {
        let guard = self.inner.lock().map_err(|_| {
            StoreError::backend_detail(
                op,
                BackendFailure::Corrupt,
                "the memory store's state was poisoned by a panic in another thread",
            )
        })?;
        // Read the clock under the lock, so operations are ordered as their times are.
        Ok((guard, store_precision(self.clock.now())))
    }

    /// Run `f` on the state at the store's time, then deliver the changes it sent.
    fn run<T>(
        &self,
        op: Operation,
        f: impl FnOnce(&mut State, Timestamp) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let (mut inner, now) = self.lock(op)?;
        inner.state.history.advance();
        let result = f(&mut inner.state, now);
        let Inner { state, feeds } = &mut *inner;
        for (group, change) in state.outbox.drain(..) {
            if let Some(tx) = feeds.get(&group) {
                // No receiver left is not an error: wake-ups are hints for whoever listens.
                tx.send(change).ok();
            }
        }
        result
    }
}

#[async_trait]
impl WorkerStore for MemoryLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        self.run(Operation::EnsureGroup, |s, _| s.ensure_group(group, shards))
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
        self.run(Operation::Heartbeat, |s, now| {
            s.heartbeat(now, node, incarnation, ttl, metadata, seen, bound)
        })
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        self.run(Operation::Join, |s, now| s.join(now, group, node, session))
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.run(Operation::Claim, |s, now| {
            s.claim(now, group, worker, session, want, takeover)
        })
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.run(Operation::ClaimBuckets, |s, now| {
            s.claim_buckets(now, group, worker, session, buckets, takeover)
        })
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Release, |s, now| {
            s.release(now, group, worker, session, buckets)
        })
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        self.run(Operation::PublishLoads, |s, now| {
            s.publish_loads(now, group, worker, session, loads)
        })
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Leave, |s, now| {
            s.leave(now, group, node, Some(session))
        })
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.run(Operation::IsCurrent, |s, now| {
            s.is_current(now, group, bucket, worker, token)
        })
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        self.run(Operation::HandOver, |s, now| {
            s.hand_over(now, node, incarnation, keep)
        })
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        let (mut inner, _now) = self.lock(Operation::Changes)?;
        let tx = inner
            .feeds
            .entry(group.clone())
            .or_insert_with(|| broadcast::channel(FEED_CAPACITY).0);
        // A receiver that fell behind hears `Missed` and re-plans.
        let changes = BroadcastStream::new(tx.subscribe()).map(|c| c.unwrap_or(Change::Missed));
        Ok(Some(ChangeFeed::new(changes)))
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        self.run(Operation::SetWeight, |s, now| {
            s.set_weight(now, group, node, session, weight)
        })
    }
}

#[async_trait]
impl AdminStore for MemoryLeaseStore {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        self.run(Operation::Snapshot, |s, now| s.snapshot(now, group))
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        self.run(Operation::Nodes, |s, now| s.nodes(now))
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        self.run(Operation::Resize, |s, now| s.resize(now, group, from, to))
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.run(Operation::Control, |s, _| s.control(group, node, control))
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        self.run(Operation::Quarantine, |s, now| {
            s.quarantine(now, group, bucket, duration, reason)
        })
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        self.run(Operation::History, |s, _| s.history(group, bucket))
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Evict, |s, now| s.leave(now, group, node, None))
    }
}
