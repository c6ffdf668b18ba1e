//! [`AdminStore`]: the operations an operator (or a status display) makes.

use std::sync::Arc;

use async_trait::async_trait;

use crate::control::{MemberControl, QuarantineFor, QuarantineReason};
use crate::error::StoreError;
use crate::history::Tenure;
use crate::ids::{Bucket, GroupName, NodeId, ShardCount};
use crate::resize::ResizeOutcome;
use crate::view::{GroupSnapshot, NodesSnapshot};

/// What an operator needs of the store: snapshots of groups and nodes, members' controls,
/// quarantines, bucket history, resizes and evictions. None of it is needed to run a node;
/// `leasectl` and tests use it. The rules every operation keeps are written on
/// [`LeaseStore`](crate::LeaseStore); each method lists its own.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait AdminStore: Send + Sync {
    /// Everything the store knows about `group`: for status displays and tests.
    ///
    /// # Contract
    ///
    /// - **S1** Every bucket of the current generation, in order, with its recorded owner and
    ///   session, token, the owner session's expiry (if that session still exists) and its
    ///   state: live, expired (owner recorded, session dead or gone) or unowned; the
    ///   generation and `previous`; while a resize drains, the old generation's buckets the
    ///   same way in `draining` (live = not retired).
    /// - **S2** Every member row, live or dead, sorted by node id, with its node's session and
    ///   metadata and the number of the group's buckets that session owns (0 if dead).
    /// - **S3** It writes nothing.
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError>;

    /// Every node the store knows: for status displays and tests.
    ///
    /// # Contract
    ///
    /// - **N1** Every node row, live or dead (until H3 or H9 removes it), sorted by node id, with its session, when it
    ///   started and was last renewed, its expiry, whether it is live now, its metadata and
    ///   the groups it is a member of.
    /// - **N2** It writes nothing.
    async fn nodes(&self) -> Result<NodesSnapshot, StoreError>;

    /// Set an operator's control on `node` in `group`: its weight or its mode.
    ///
    /// # Contract
    ///
    /// - **K1** A control is kept per (group, node), whatever the node's session: it outlives
    ///   the session, a leave and a restart, and applies again when the node joins the group.
    ///   A node never controlled has [`Weight::DEFAULT`](crate::Weight::DEFAULT) and
    ///   [`MemberMode::Active`](crate::MemberMode::Active). Views and snapshots show each
    ///   member's weight and mode.
    /// - **K2** `node` must be a member of the group (live or not) or have a control stored
    ///   there (once a call changed its weight or mode, a control stays stored, even when set
    ///   back to the defaults); otherwise the call fails with [`StoreError::NotAMember`] and
    ///   writes nothing.
    ///   An unknown group gives [`StoreError::GroupNotFound`].
    /// - **K3** Setting a value moves the group's change counter (H8: every member's next
    ///   heartbeat gives the view) and sends [`Change::Controlled`](crate::Change::Controlled),
    ///   unless the value is the one stored (then nothing is written). It never changes a
    ///   bucket, a token or a session: a drained member sheds through its own releases.
    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError>;

    /// Put `bucket` of `group` under quarantine for `duration` (from the store's time now),
    /// or lift its quarantine (`None`).
    ///
    /// # Contract
    ///
    /// - **Q1** A bucket under quarantine is not claimable (C10) until the store's time
    ///   reaches its end or it is lifted; a new quarantine replaces the bucket's previous one.
    ///   Views count it (`quarantined`) and snapshots show its end.
    /// - **Q2** Its owner keeps the lease (F1 stays true) until it releases it; the owner's
    ///   heartbeat lists it in the beat's `quarantined`, so the owner revokes it (reason
    ///   `quarantined`) and releases.
    /// - **Q3** Setting or lifting moves the group's change counter (H8) and sends
    ///   [`Change::Controlled`](crate::Change::Controlled); lifting a bucket not under
    ///   quarantine writes nothing. A view's stamp is not answered unchanged past the
    ///   earliest end of a quarantine it counted.
    /// - **Q4** A bucket outside the group's current count fails with
    ///   [`StoreError::BucketOutOfRange`], an unknown group with
    ///   [`StoreError::GroupNotFound`]; each writes nothing. A resize lifts every quarantine
    ///   of the group (bucket numbers change meaning).
    /// - **Q5** A quarantine keeps the reason it was set with while it runs: a snapshot shows
    ///   it with its end ([`BucketInfo::quarantine_reason`](crate::BucketInfo)); a quarantine
    ///   that replaces it replaces its reason too (with none when given none), and it goes
    ///   with the quarantine (lifted, ended, or lifted by a resize).
    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError>;

    /// [`quarantine_with_reason`](Self::quarantine_with_reason) with no reason: put `bucket`
    /// of `group` under quarantine for `duration` (from the store's time now), or lift its
    /// quarantine (`None`).
    async fn quarantine(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError> {
        self.quarantine_with_reason(group, bucket, duration, None)
            .await
    }

    /// The last tenures of `bucket` of `group`'s current generation, oldest first: which node
    /// held it, from when, with which token, and how each holding ended. What `leasectl status
    /// --why` explains a bucket's place from.
    ///
    /// # Contract
    ///
    /// - **T1** Every claim that wins the bucket begins a tenure: the claiming node, the token
    ///   the claim gave and the store's time of the claim, not ended.
    /// - **T2** A tenure ends, at the store's time of the call that ends it, when its session
    ///   gives the bucket up: a release ends it as [`EndReason::Quarantined`] if the bucket
    ///   is under quarantine then, else [`EndReason::Drained`] if the owner's mode is
    ///   draining, else [`EndReason::Released`]; a leave that releases it (L1: its session
    ///   live) ends it as [`EndReason::Left`], or [`EndReason::Evicted`] when an operator evicts the node
    ///   ([`evict`](Self::evict)); a claim that takes the bucket from a session that is not live ends it as
    ///   [`EndReason::Expired`] (at the claim's time), whatever left the group meanwhile. Nothing else changes a tenure: a hand-over keeps it (same node, same
    ///   token).
    /// - **T3** Only the last [`TENURES_KEPT`](crate::history::TENURES_KEPT) tenures are
    ///   kept; older ones are dropped as new ones begin.
    /// - **T4** A resize clears the group's history: the new generation's buckets start with
    ///   none (bucket numbers change meaning), and releases of the old generation's buckets
    ///   record nothing.
    /// - **T5** A bucket outside the group's current count fails with
    ///   [`StoreError::BucketOutOfRange`], an unknown group with
    ///   [`StoreError::GroupNotFound`]. It writes nothing.
    ///
    /// [`EndReason::Quarantined`]: crate::EndReason::Quarantined
    /// [`EndReason::Drained`]: crate::EndReason::Drained
    /// [`EndReason::Released`]: crate::EndReason::Released
    /// [`EndReason::Left`]: crate::EndReason::Left
    /// [`EndReason::Evicted`]: crate::EndReason::Evicted
    /// [`EndReason::Expired`]: crate::EndReason::Expired
    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError>;

    /// Change the shard count of `group` from `from` to `to` while it runs: open generation
    /// g+1 with `to` unowned buckets and let generation g drain.
    ///
    /// # Contract
    ///
    /// - **Z1** A compare-and-set on the count: if the group's count is not `from` it fails
    ///   with [`StoreError::ResizeFromMismatch`]; if an earlier resize is still draining, with
    ///   [`StoreError::ResizeInProgress`]; an unknown group gives
    ///   [`StoreError::GroupNotFound`]. Each writes nothing. `from == to` (the group's count)
    ///   is a no-op: [`ResizeOutcome::Unchanged`], nothing written.
    /// - **Z2** Otherwise the generation rises by one, the count becomes `to` with buckets
    ///   `0..to`, and the old buckets keep their owners and tokens as the draining generation
    ///   (`previous` = `from`). Nothing can claim an old bucket any more. Members' loads count
    ///   the new generation only. It sends [`Change::Resized`](crate::Change::Resized).
    /// - **Z3** An old bucket is **retired** once released (or left) or once its recorded
    ///   session is not live; it never comes back. While some old bucket is not retired the
    ///   group drains (`draining` > 0); once all are, the old generation is gone (snapshots
    ///   and views no longer show it) and the count is `to` for good. `previous` stays `from`
    ///   until the next resize (E3 accepts it).
    /// - **Z4** A new bucket starts at the highest token of its parents, so its first claim
    ///   gets a token above every token its keys had.
    /// - **Z5** A new bucket is claimable only when all its parents are retired (C8): for
    ///   every key, at no instant do two live sessions own buckets containing it.
    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError>;

    /// Remove `node` from `group` whatever session it holds (an operator's forced release):
    /// every bucket it owns there is released and its member row deleted.
    ///
    /// # Contract
    ///
    /// - **L5** As [`leave`](crate::WorkerStore::leave) (L1-L4) under the node's session,
    ///   whichever it is, live or not: the buckets its live session owns in the group become
    ///   unowned and are returned, sorted, and their tenures end as
    ///   [`EndReason::Evicted`](crate::EndReason::Evicted) (T2). The node's process, if it
    ///   runs, hears at its next heartbeat that it is no member any more, revokes what it
    ///   held as lost, and joins again.
    /// - **L6** Evicting a node that is no member of the group succeeds and changes nothing.
    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError>;
}

#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: AdminStore + ?Sized> AdminStore for Arc<S> {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        (**self).snapshot(group).await
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        (**self).nodes().await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        (**self).control(group, node, control).await
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        (**self)
            .quarantine_with_reason(group, bucket, duration, reason)
            .await
    }

    async fn quarantine(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError> {
        (**self).quarantine(group, bucket, duration).await
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        (**self).history(group, bucket).await
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        (**self).resize(group, from, to).await
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        (**self).evict(group, node).await
    }
}
