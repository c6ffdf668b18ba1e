//! [`WorkerStore`]: the operations a node's runtime makes.

use std::sync::Arc;

use async_trait::async_trait;

use super::Takeover;
use crate::change::ChangeFeed;
#[cfg(doc)]
use crate::control::MemberControl;
use crate::control::Weight;
use crate::error::StoreError;
use crate::failover::SessionBound;
use crate::ids::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionId, ShardCount,
};
use crate::load::Load;
use crate::time::Ttl;
use crate::view::{GroupStamp, Heartbeat, Lease};

/// What a node's runtime needs of the store: its session (heartbeats, hand-over), its
/// memberships (join, leave), its buckets (claim, release), its own weight, its buckets'
/// loads, the fencing check and the change feed. The rules every operation keeps (G1-G9, and V1-V3 after a
/// failover) are written on [`LeaseStore`](crate::LeaseStore); each method lists its own.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait WorkerStore: Send + Sync {
    /// Create `group` with `shards` buckets, or check that it exists with that many.
    ///
    /// # Contract
    ///
    /// - **E1** A new group gets buckets `0..shards`, all unowned with token 0, and no members.
    /// - **E2** Calling it again with the same count succeeds and changes nothing: owners,
    ///   tokens and members stay as they were.
    /// - **E3** If the group exists with another count it fails with
    ///   [`StoreError::ShardCountMismatch`] (`configured` = `shards`, `found` = the stored
    ///   count) and writes nothing, unless `shards` is the count the group was last resized
    ///   from ([`GroupView::previous`](crate::GroupView::previous)): then it succeeds and
    ///   changes nothing, and the caller adopts the stored count (a worker configured before
    ///   the resize keeps working).
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError>;

    /// Extend `node`'s live session, or start a new one for `incarnation`, and return the view
    /// of every group the node is a member of, in one round trip.
    ///
    /// # Contract
    ///
    /// - **H1** If the node has a live session started by `incarnation`, it is extended: same
    ///   session id, `new_session == false`, `expires_at = now + ttl`, metadata replaced.
    /// - **H2** If the node has no live session (first heartbeat, or at or after the session's
    ///   expiry) a new session starts for `incarnation`, with a never-used id and
    ///   `new_session == true`. Buckets held under the old session are not owned any more:
    ///   they are claimable by anyone, the node itself included, with a new token. The node's
    ///   member rows are removed (each such group hears [`Change::Left`](crate::Change::Left)):
    ///   a new session is a member of no group until it [`join`](Self::join)s.
    /// - **H9** A heartbeat that starts a session also removes the rows of other nodes whose
    ///   sessions are dead and that are members of no group (a process that died before it
    ///   joined, or after it left), so they do not linger in [`nodes`](crate::AdminStore::nodes). (A store
    ///   may leave one that another transaction holds for a later heartbeat.)
    /// - **H7** If the node has a live session started by another incarnation (a second
    ///   process with the same node id), the call fails with [`StoreError::NodeIdInUse`]
    ///   naming when that session expires, and writes nothing: the session is never shared
    ///   (but see HO3: a session handed over is taken over).
    /// - **H3** In every group whose view it gives, the heartbeat removes the member rows of
    ///   other nodes whose sessions are dead (their buckets stay claimable), and the node
    ///   rows of those nodes that are then members of no group, so dead members do not linger
    ///   in snapshots. (A store may remove a bounded number per heartbeat and the others at later
    ///   ones; a group with one left is not answered unchanged.)
    /// - **H4** For each group the node is a member of, the view lists every live member, idle
    ///   ones with 0, with the buckets of the current generation it owns, sorted by node id,
    ///   the node itself included, each with its weight and mode (K1); `claimable` counts the
    ///   current generation's buckets no live session owns and not under quarantine (waiting
    ///   ones included); `quarantined` counts the current generation's buckets under
    ///   quarantine (Q1), and the beat's `quarantined` lists those of them the node owns; `generation`, `previous` and `draining` are the
    ///   group's (Z1, Z3); `owned` is exactly the node's leases in the group under `session`
    ///   in both generations, sorted by bucket, each with its generation's shard count and
    ///   expiring with the session. Groups come sorted by name.
    /// - **H8** A group of `seen` may be answered in `unchanged` (with a stamp to hand in next
    ///   time) instead of with its view only if the view and the node's leases in the group
    ///   are those it was given with the stamp it handed in (the leases now expiring with the
    ///   session): nothing changed since (no join, leave, claim, release, resize, member's
    ///   session ending, control (K3), quarantine set or lifted, or quarantine ending). A store may always give the view instead. Groups of `seen` the node
    ///   is not a member of are ignored. (So a group answered unchanged has no dead member
    ///   for H3 to remove.)
    /// - **H5** It never changes a bucket or a token; a renewal writes only the node's row,
    ///   and the rows of members and nodes found dead (H3, H9).
    /// - After a failover of the store, see V1 and V4 (the trait's "Failover"): this hands in
    ///   no bound, so a session of the old store is never kept;
    ///   [`heartbeat_with_bound`](Self::heartbeat_with_bound) may keep it.
    async fn heartbeat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        self.heartbeat_with_bound(node, incarnation, ttl, metadata, seen, None)
            .await
    }

    /// [`heartbeat`](Self::heartbeat), handing in the bound of the session's writes (or
    /// `None`): the node runtime's heartbeat.
    ///
    /// # Contract
    ///
    /// - Every rule of [`heartbeat`](Self::heartbeat); `bound` matters only on the first
    ///   heartbeat of the session on a store that failed over since it was last renewed,
    ///   where V4 (the trait's "Failover") decides whether the session is kept.
    /// - **H10** The answer's [`position`](Heartbeat::position), when the store gives one, is
    ///   at or after the commit of every write answered before the call was made, on the
    ///   answer's timeline.
    async fn heartbeat_with_bound(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
        bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError>;

    /// Make `node` a member of `group` under its live session `session`.
    ///
    /// # Contract
    ///
    /// - **J1** `session` must be the node's live session, or the call fails with
    ///   [`StoreError::SessionExpired`] and writes nothing.
    /// - **J2** If the node is not a member, a member row is created (joined now) and
    ///   [`Change::Joined`](crate::Change::Joined) is sent; the node's next heartbeat gives the
    ///   group's view. If it is a member already, nothing changes.
    /// - **J3** Nothing in the node's other groups changes.
    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError>;

    /// Claim up to `want` claimable buckets of `group` for `worker`'s live session `session`.
    ///
    /// # Contract
    ///
    /// - **C1** `session` must be the node's live session and the node a member of the group,
    ///   or the call fails with [`StoreError::SessionExpired`] and writes nothing.
    /// - **C2** A bucket is claimable if it has no owner or its recorded session is not live.
    ///   A bucket of a live session, the caller's included, is never taken.
    /// - **C3** At most `want` claimable buckets are taken (none for 0): the first ones in the
    ///   worker's claim order, which starts at
    ///   [`ShardCount::claim_start`](crate::ShardCount::claim_start) and goes up, wrapping
    ///   around to bucket 0. (Starting where the node id says spreads workers that claim at
    ///   once over the group, instead of all of them contending for the lowest buckets.)
    ///   Buckets being claimed concurrently by others are skipped, not waited for.
    /// - **C4** Each claimed bucket's token becomes its previous token plus one; its lease
    ///   expires with the session. The result is sorted by bucket.
    /// - **C5** Two concurrent claims never both win a bucket.
    /// - **C6** Claiming does not extend the session.
    /// - **C7** With [`Takeover::Deferred`], only buckets with no owner recorded (never
    ///   owned, released, or left) are claimable: a bucket whose recorded session is not live
    ///   is left alone. [`Takeover::Allowed`] takes both kinds; [`Takeover::AllowedWithin`]
    ///   (`d`) takes both kinds if the store's time now is at most `d` after the session's
    ///   last renewal, and only the first kind otherwise.
    /// - **C9** Sticky claims: among the claimable buckets, those whose last owner (the node
    ///   of the last session that held them, kept when they are released, left or taken
    ///   from a dead session) is `worker` come first, in claim order; then the others, in
    ///   claim order. A restarted worker with a stable id gets back what it had.
    /// - **C10** A bucket under quarantine (Q1) is not claimable.
    /// - **C11** A member whose mode is [`MemberMode::Cordoned`](crate::MemberMode::Cordoned)
    ///   or [`MemberMode::Draining`](crate::MemberMode::Draining) claims nothing: the call
    ///   returns no lease and writes nothing (a plan made before the control took effect
    ///   cannot undo it).
    /// - **C8** Only buckets of the current generation are claimed. While a resize drains, a
    ///   bucket is claimable only if, in addition, every old bucket it shares keys with
    ///   ([`resize::parents`](crate::resize::parents)) is retired: released, or (when the
    ///   claim may take dead sessions' buckets, by C7) its recorded session is not live.
    /// - After a failover of the store, see V2 and V3 (the trait's "Failover").
    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError>;

    /// Claim, of `buckets`, those that are claimable, for `worker`'s live session `session`:
    /// how the load-aware policy takes the buckets it chose (a hot one, say) instead of the
    /// first ones in claim order.
    ///
    /// # Contract
    ///
    /// - **C12** Every rule of [`claim`](Self::claim) holds (C1, C2, C4-C8, C10, C11, and V2
    ///   and V3 after a failover), except that the buckets taken are not the first `want` in
    ///   claim order (C3, C9) but every listed bucket of the current generation that is
    ///   claimable. A bucket listed twice counts once; none listed takes none.
    /// - **C13** A bucket outside `0..shards` fails the call with
    ///   [`StoreError::BucketOutOfRange`]; nothing is written.
    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError>;

    /// Give up those of `buckets` that `worker` owns under `session`, so others can claim them
    /// at once.
    ///
    /// # Contract
    ///
    /// - **R1** A bucket outside `0..shards` (and, while a resize drains, outside the old
    ///   generation's `0..previous`) fails the call with [`StoreError::BucketOutOfRange`];
    ///   nothing is written.
    /// - **R2** Of the listed buckets, those owned by `session` while it is the node's live
    ///   session and the node a member of the group become unowned; the others (unowned, another's, repeated, or any when `session`
    ///   is not live) are left alone, whichever generation they are of (a session never holds
    ///   one number in both). The released buckets are returned sorted. A store may skip, rather
    ///   than wait for, a bucket another transaction holds locked (an application's fencing
    ///   check in Postgres); it stays owned and the caller retries it.
    /// - **R3** Tokens do not change: the next claim of a released bucket gets token + 1.
    /// - **R4** A release that released something sends
    ///   [`Change::Released`](crate::Change::Released).
    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError>;

    /// Leave `group`: release every bucket `node` holds in it under `session` and delete its
    /// member row (a node leaving; an operator removes a node with
    /// [`evict`](crate::AdminStore::evict)).
    ///
    /// # Contract
    ///
    /// - **L1** If the node is a member and `session` is its node's session, every bucket of
    ///   the group owned by that session while live, in both generations, becomes unowned
    ///   (tokens unchanged) and is returned, sorted; the member row, live or dead, is deleted.
    ///   A bucket row another transaction holds locked may be skipped instead: the node is no
    ///   member any more, so it is claimable once that transaction ends.
    /// - **L2** Leaving a group the node is not a member of, or naming a session the node does
    ///   not hold, succeeds and changes nothing.
    /// - **L3** The node's other groups are untouched, and so is its session while it is a
    ///   member of some group: its next heartbeat renews the session and no longer lists the
    ///   group. Leaving its last group deletes the node's row: its session ends, so a process
    ///   started with the same node id (a restart) starts a session at once, and the node's
    ///   own next heartbeat starts a new one.
    /// - **L4** Deleting a member row sends [`Change::Left`](crate::Change::Left).
    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError>;

    /// Hand `node`'s live session over to the next process started with the same node id,
    /// instead of ending it: a graceful stop that keeps the node's buckets for its successor.
    /// The caller has stopped working on them (revoked them in its application) and makes no
    /// more calls under the session.
    ///
    /// # Contract
    ///
    /// - **HO1** Only the incarnation that holds the node's live session hands it over: its
    ///   expiry becomes the store's time now plus `keep`, and it is marked handed over; the
    ///   result is the new expiry. Otherwise (no live session, or another incarnation's) it
    ///   writes nothing and returns `None`.
    /// - **HO2** A handed-over session stays live until that expiry, for everyone: its
    ///   memberships, buckets and tokens stay as they were, nobody else can claim its
    ///   buckets, and views list it with its load. [`nodes`](crate::AdminStore::nodes) shows it handed
    ///   over. Past its expiry it is dead like any other (its buckets become claimable).
    /// - **HO3** A heartbeat of the node by any incarnation while a handed-over session is
    ///   live takes it over: the same session id, `new_session == false`, now of the caller's
    ///   incarnation and no longer handed over, expiring `ttl` from now (H1 from then on), with
    ///   its memberships and its buckets under their tokens. This is the only way a session
    ///   passes from one process to another, and only after the first stopped.
    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<crate::Timestamp>, StoreError>;

    /// The fencing check: does `worker` own `bucket` right now, with `token`?
    ///
    /// # Contract
    ///
    /// - **F1** True if and only if the bucket's recorded owner is `worker`, under its live
    ///   session, with exactly `token`. A stale token, another owner, a dead session, a
    ///   released bucket, an unknown group or a bucket out of range all give `false`. During
    ///   a resize it answers for either generation: an old bucket not retired yet is current
    ///   for its owner, and a bucket number never matches in both (Z4: the new bucket's
    ///   tokens are above its parents').
    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError>;

    /// Set `node`'s own weight in `group` (K1) under its live session `session`: how a node
    /// configured with a weight writes it, so that a process refused by H7 (another live
    /// process with its node id) can never change the live node's weight.
    ///
    /// # Contract
    ///
    /// - **K4** `session` must be the node's live session and the node a member of the group,
    ///   or the call fails with [`StoreError::SessionExpired`] and writes nothing (an unknown
    ///   group gives [`StoreError::GroupNotFound`]). Otherwise it is
    ///   [`control`](crate::AdminStore::control) with
    ///   [`MemberControl::Weight`]: the weight is kept per (group, node) (K1) and setting a
    ///   new value moves the group's change counter and sends
    ///   [`Change::Controlled`](crate::Change::Controlled) (K3).
    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError>;

    /// Record the loads `worker`'s application measured on buckets it owns in `group`, under
    /// its live session `session`, and its work as the load-aware policy weighs it.
    ///
    /// # Contract
    ///
    /// - **P1** `session` must be the node's live session and the node a member of the group,
    ///   or the call fails with [`StoreError::SessionExpired`] and writes nothing.
    /// - **P2** A bucket outside `0..shards` fails the call with
    ///   [`StoreError::BucketOutOfRange`]; nothing is written. Of the listed buckets, each one
    ///   of the current generation the session owns gets its load recorded (for one listed
    ///   twice, the last); the others are left alone. Returns how many buckets were recorded
    ///   (one listed twice counts once).
    /// - **P3** Then the member's work is computed again from the loads recorded on the
    ///   buckets of the current generation it owns: their sum and the largest
    ///   ([`MemberLoad::load`](crate::MemberLoad::load),
    ///   [`MemberLoad::hottest`](crate::MemberLoad::hottest)), which views list from then on.
    ///   Claims and releases leave it as it is: it is the work at the member's last
    ///   publication (a worker publishes again after its buckets changed, even with no load
    ///   to record).
    /// - **P4** A recorded load stays on its bucket until its next owner records another:
    ///   through release, leave, a dead session's takeover and claims; a claimable bucket's
    ///   load is listed by views ([`GroupView::loaded`](crate::GroupView::loaded)). Owners,
    ///   tokens and sessions are untouched, and the session is not extended.
    /// - **P5** When the member's work or a recorded load changed, the group's change
    ///   counter moves (so H8 gives views again); no wake-up is sent, as loads are planned on
    ///   at the next renew tick.
    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError>;

    /// Subscribe to `group`'s wake-ups (joins, leaves, releases, resizes). `None` if the store has no
    /// change feed; workers then re-plan on their renew interval only (and say so in their
    /// `lease_polling_fallback` gauge). A store that cannot push wake-ups in its configuration
    /// (Postgres behind a transaction pooler without a direct URL) answers `None` rather than
    /// a feed that stays silent, so the worker knows it is polling.
    ///
    /// # Contract
    ///
    /// - **W1** A feed returned before an operation receives the change that operation sends
    ///   (H2, J2, R4, L4, Z2), from whichever process performed it.
    async fn changes(&self, _group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        Ok(None)
    }
}

// Every method forwarded: a default one would skip the inner store's own behaviour (a feed
// that exists would look absent).
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: WorkerStore + ?Sized> WorkerStore for Arc<S> {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        (**self).ensure_group(group, shards).await
    }

    async fn heartbeat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        (**self)
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
        (**self)
            .heartbeat_with_bound(node, incarnation, ttl, metadata, seen, bound)
            .await
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        (**self).join(group, node, session).await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        (**self).claim(group, worker, session, want, takeover).await
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        (**self)
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
        (**self).release(group, worker, session, buckets).await
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        (**self).leave(group, node, session).await
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<crate::Timestamp>, StoreError> {
        (**self).hand_over(node, incarnation, keep).await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        (**self).is_current(group, bucket, worker, token).await
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        (**self).changes(group).await
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        (**self).set_weight(group, node, session, weight).await
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        (**self).publish_loads(group, worker, session, loads).await
    }
}
