//! The `LeaseStore` trait: the storage contract every backend implements.

use std::sync::Arc;

use async_trait::async_trait;

use crate::change::ChangeFeed;
use crate::control::{MemberControl, QuarantineFor};
use crate::error::StoreError;
use crate::history::Tenure;
use crate::ids::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, SessionId, ShardCount, WorkerId,
};
use crate::resize::ResizeOutcome;
use crate::time::Ttl;
use crate::view::{GroupSnapshot, GroupStamp, Heartbeat, Lease, NodesSnapshot};

/// Which claimable buckets a [`claim`](LeaseStore::claim) may take (contract rule C7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Takeover {
    /// Buckets with no owner and buckets whose recorded session is not live.
    Allowed,
    /// Only buckets with no owner recorded. For a caller that cannot yet rule out that the
    /// holder of a session the store calls dead still trusts it: a worker that has not
    /// watched the store's clock advance steadily for a ttl (it just started, or the store's
    /// clock just stepped forward), so a session's expiry may not mean its holder fenced.
    Deferred,
    /// As [`Allowed`](Self::Allowed) if the store's clock has advanced by at most this much
    /// since the caller's session was last renewed (its last heartbeat), otherwise as
    /// [`Deferred`](Self::Deferred). A caller that watched the store's clock up to its
    /// heartbeat covers the time from there to the claim with it: a step in between defers
    /// the takeover instead of making it.
    AllowedWithin(std::time::Duration),
}

impl Takeover {
    /// Whether a claim with this takeover may take dead sessions' buckets (C7), when the
    /// store's time is `since_renewal` after the caller's session was last renewed (negative
    /// if the store's clock went back).
    pub fn takes_dead(self, since_renewal: chrono::TimeDelta) -> bool {
        match self {
            Takeover::Deferred => false,
            Takeover::AllowedWithin(bound) => {
                since_renewal.to_std().map_or(true, |since| since <= bound)
            }
            Takeover::Allowed => true,
        }
    }
}

/// Where leases live: the shared state a pool of workers agrees through.
///
/// Ownership hangs on **node sessions**. A node is a process (identified by a [`WorkerId`]):
/// it has at most one node row holding its session (id, expiry and the [`Incarnation`] that
/// started it), and one member row per group it is a member of. Each bucket row records its
/// owner node and the session it was claimed under, and a fencing token. A member is live if
/// and only if its node's session is live, and a bucket is owned if and only if its recorded
/// session is its owner node's current session and that session is live. Renewing is extending
/// the node's session: one row per node per heartbeat, however many groups it is in and
/// whatever it holds. A session belongs to the incarnation that started it: only that
/// incarnation extends it, and the operations that change ownership name the session they act
/// under, so two processes given one node id never share a session.
///
/// # Contract
///
/// These rules hold for every operation; each method lists its own. The conformance suite
/// (`lease_core::testing::conformance`, feature `testing`) checks every rule on every backend.
///
/// - **G1 One clock.** The store's clock alone decides expiry. A session with expiry `e` is
///   live at time `t` if and only if `t < e`: at `e` exactly it is dead. No operation compares
///   the wall clocks of two hosts.
/// - **G2 Sessions never come back.** A session that is not live can never be renewed; it is
///   dead forever, and session ids are never reused.
/// - **G3 Exclusive ownership.** At any instant a bucket has at most one owner, also under
///   concurrent calls from many processes.
/// - **G4 Fencing tokens** are per bucket, start at 0 (never owned; for a bucket opened by a
///   [`resize`](Self::resize), at the highest token of its parents, Z4), increase by exactly
///   one on every claim and never change otherwise (not on renewal, release, leave or
///   expiry). So tokens rise **per key** too: every claim of a bucket containing key `k`
///   gets a token above every earlier token of a bucket containing `k`, across generations.
/// - **G9 Per-key exclusion.** With `hash mod n` as the routing rule
///   ([`ShardCount::bucket_of`](crate::ShardCount::bucket_of)), at no instant do two live
///   sessions own buckets containing one key, across generations (Z5).
/// - **G5 Unknown groups.** Every operation on a group (all but `heartbeat` and `nodes`) never created with
///   [`ensure_group`](Self::ensure_group) fails with [`StoreError::GroupNotFound`], except
///   [`is_current`](Self::is_current), which answers `false`, and
///   [`changes`](Self::changes), which subscribes to any name (a worker may listen before
///   the group exists).
/// - **G8 One caller per incarnation.** Calls for one `(node, incarnation)` must not overlap
///   (heartbeats, and the calls of one group); the node runtime makes them one at a time.
///   Different nodes, and different incarnations of one node id (H7 keeps them apart), may
///   call concurrently.
/// - **G6 Names are data.** Group names and metadata with quotes, unicode or SQL text are
///   stored and returned unchanged and never interpreted.
/// - **G7 Groups are independent.** Nothing done in one group changes another; a node's
///   session is the only thing its groups share.
///
/// # Failover
///
/// Backend-specific: a store replicated to standbys (Postgres) can be replaced by one of them,
/// which with asynchronous replication may lack writes the old one acknowledged (a claim, a
/// release, a session start). The Postgres backend detects the replacement on every heartbeat
/// and claim by the server's timeline (a promotion starts a new one) and keeps these rules; the
/// memory store never fails over.
///
/// - **V1 Sessions end.** A heartbeat on a store that failed over since the node's session
///   was started or last renewed starts a new session (as H2), however live the old one looks
///   there: what the node released or claimed under it may be missing.
/// - **V2 Quiet period.** A claim takes nothing until a heartbeat has run on the new store and
///   the longest ttl of the group's members has passed since: by then every holder of a lease
///   granted by the old store has fenced itself (its trust deadline precedes its expiry).
/// - **V3 Tokens rise across it.** Every token issued after a failover exceeds every token
///   issued before it: C4's "plus one" becomes "plus one, and at least the new store's floor".
///
/// Heartbeats (V1 aside), releases, leaves, snapshots and fencing checks work as usual
/// meanwhile. Together: no bucket is held by two workers at once across a failover, and a
/// fencing token is never issued twice. They assume that the old store takes no write once
/// the new one is promoted (the high-availability manager fences it), that members of a group
/// share their ttl (or one with the longest has a row on the new store), and fewer than 2^32
/// claims of one bucket between two failovers.
#[cfg_attr(any(test, feature = "mock"), mockall::automock)]
#[async_trait]
pub trait LeaseStore: Send + Sync {
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
    ///   joined, or after it left), so they do not linger in [`nodes`](Self::nodes). (A store
    ///   may leave one that another transaction holds for a later heartbeat.)
    /// - **H7** If the node has a live session started by another incarnation (a second
    ///   process with the same node id), the call fails with [`StoreError::WorkerIdInUse`]
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
    /// - After a failover of the store, see V1 (the trait's "Failover").
    async fn heartbeat(
        &self,
        node: WorkerId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
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
        node: WorkerId,
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
    ///   around to bucket 0. (Starting where the worker id says spreads workers that claim at
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
        worker: WorkerId,
        session: SessionId,
        want: u32,
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
        worker: WorkerId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError>;

    /// Leave `group`: release every bucket `worker` holds in it and delete its member row.
    /// With `Some(session)` only if that is the node's session (a node leaving); with `None`
    /// whatever session it holds (an operator evicting a node from the group).
    ///
    /// # Contract
    ///
    /// - **L1** If the node is a member and `session` is its node's session (or `session` is
    ///   `None`), every bucket of the group owned by that session while live, in both
    ///   generations, becomes unowned (tokens unchanged) and is returned, sorted; the member
    ///   row, live or dead, is deleted. A bucket row another transaction holds locked may be
    ///   skipped instead: the node is no member any more, so it is claimable once that
    ///   transaction ends.
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
        worker: WorkerId,
        session: Option<SessionId>,
    ) -> Result<Vec<Bucket>, StoreError>;

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
        worker: WorkerId,
        token: FencingToken,
    ) -> Result<bool, StoreError>;

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
    ///   buckets, and views list it with its load. [`nodes`](Self::nodes) shows it handed
    ///   over. Past its expiry it is dead like any other (its buckets become claimable).
    /// - **HO3** A heartbeat of the node by any incarnation while a handed-over session is
    ///   live takes it over: the same session id, `new_session == false`, now of the caller's
    ///   incarnation and no longer handed over, expiring `ttl` from now (H1 from then on), with
    ///   its memberships and its buckets under their tokens. This is the only way a session
    ///   passes from one process to another, and only after the first stopped.
    async fn hand_over(
        &self,
        node: WorkerId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<crate::Timestamp>, StoreError>;

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
        node: WorkerId,
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
    async fn quarantine(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError>;

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
    ///   live) ends it as [`EndReason::Left`], or [`EndReason::Evicted`] when the leave names
    ///   no session; a claim that takes the bucket from a session that is not live ends it as
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
impl<S: LeaseStore + ?Sized> LeaseStore for Arc<S> {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        (**self).ensure_group(group, shards).await
    }

    async fn heartbeat(
        &self,
        node: WorkerId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        (**self)
            .heartbeat(node, incarnation, ttl, metadata, seen)
            .await
    }

    async fn join(
        &self,
        group: &GroupName,
        node: WorkerId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        (**self).join(group, node, session).await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        (**self).claim(group, worker, session, want, takeover).await
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        (**self).release(group, worker, session, buckets).await
    }

    async fn leave(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: Option<SessionId>,
    ) -> Result<Vec<Bucket>, StoreError> {
        (**self).leave(group, worker, session).await
    }

    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        (**self).snapshot(group).await
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        (**self).nodes().await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: WorkerId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        (**self).is_current(group, bucket, worker, token).await
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        (**self).resize(group, from, to).await
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        (**self).changes(group).await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: WorkerId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        (**self).control(group, node, control).await
    }

    async fn hand_over(
        &self,
        node: WorkerId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<crate::Timestamp>, StoreError> {
        (**self).hand_over(node, incarnation, keep).await
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
}
