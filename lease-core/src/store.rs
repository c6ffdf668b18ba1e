//! The storage contract every backend implements: [`WorkerStore`] (what a node's runtime
//! calls) and [`AdminStore`] (what an operator calls), and [`LeaseStore`], both together, on
//! which the rules common to every operation are written.

mod admin;
mod worker;

pub use admin::AdminStore;
#[cfg(any(test, feature = "mock"))]
pub use admin::MockAdminStore;
#[cfg(any(test, feature = "mock"))]
pub use worker::MockWorkerStore;
pub use worker::WorkerStore;

#[cfg(doc)]
use crate::{
    error::StoreError,
    ids::{Incarnation, NodeId, ShardCount},
};

/// Which claimable buckets a [`claim`](WorkerStore::claim) may take (contract rule C7).
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
/// Ownership hangs on **node sessions**. A node is a process (identified by a [`NodeId`]):
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
///   [`resize`](crate::AdminStore::resize), at the highest token of its parents, Z4), increase by exactly
///   one on every claim and never change otherwise (not on renewal, release, leave or
///   expiry). So tokens rise **per key** too: every claim of a bucket containing key `k`
///   gets a token above every earlier token of a bucket containing `k`, across generations.
/// - **G9 Per-key exclusion.** With `hash mod n` as the routing rule
///   ([`ShardCount::bucket_of`](crate::ShardCount::bucket_of)), at no instant do two live
///   sessions own buckets containing one key, across generations (Z5).
/// - **G5 Unknown groups.** Every operation on a group (all but `heartbeat` and `nodes`) never created with
///   [`ensure_group`](crate::WorkerStore::ensure_group) fails with [`StoreError::GroupNotFound`], except
///   [`is_current`](crate::WorkerStore::is_current), which answers `false`, and
///   [`changes`](crate::WorkerStore::changes), which subscribes to any name (a worker may listen before
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
/// memory store keeps them when a test fails it over to a copy of itself
/// (`MemoryLeaseStore::fail_over`); etcd never fails over (its writes are a quorum's).
///
/// - **V1 Sessions end.** A heartbeat on a store that failed over since the node's session
///   was started or last renewed starts a new session (as H2), however live the old one looks
///   there: what the node released or claimed under it may be missing. Unless V4 keeps it.
/// - **V2 Quiet period.** A claim takes nothing until a heartbeat has run on the new store and
///   the longest ttl of the group's members has passed since: by then every holder of a lease
///   granted by the old store has fenced itself (its trust deadline precedes its expiry).
/// - **V3 Tokens rise across it.** Every token issued after a failover exceeds every token
///   issued before it: C4's "plus one" becomes "plus one, and at least the new store's floor".
/// - **V4 Sessions that lost nothing are kept.** A store that records where the new store's
///   history leaves its parent's (the *switch point*, a [`LogPosition`](crate::LogPosition) on
///   the timeline it was promoted from) keeps a session across the failover when the
///   heartbeat ([`heartbeat_with_bound`](crate::WorkerStore::heartbeat_with_bound)) hands in
///   a [`SessionBound`](crate::SessionBound) naming the session, the session is the caller's
///   incarnation's, not handed over, and live there or expired less than its ttl after the
///   new store's first heartbeat, and the bound's position is on the parent timeline at or
///   before the switch point: every write under the session is then on the new store. The
///   heartbeat extends it as H1 (same session, `new_session == false`), its memberships,
///   buckets and tokens unchanged; until then, heartbeats do not remove the memberships of a
///   session that may still be kept (H3). A caller hands in a bound only while it trusts its
///   session (before its trust deadline), so a session kept though expired there outlived
///   the old store. A store that cannot tell the switch point (a promoted server restarted
///   before its first heartbeat) keeps nothing.
///
/// Why a kept session never shares a bucket with a takeover on the new store: a claim there
/// takes nothing before the quiet period is over (V2), and by then the kept session has been
/// renewed there or has expired. It held, on the old store, exactly what the new one records
/// (its writes are all there), and no claim on the old store took any of it: its session was
/// live on the old one until its end (live on the new store, it was live at the switch and
/// expiries only grow; kept though expired there, its holder still trusted it, so its last
/// renewal on the old store outlived that store). The buckets others claimed with writes the
/// new store lacks are not the kept session's, and stay unclaimed until their claimers have
/// fenced themselves (V2).
///
/// Heartbeats (V1 aside), releases, leaves, snapshots and fencing checks work as usual
/// meanwhile. Together: no bucket is held by two workers at once across a failover, and a
/// fencing token is never issued twice. They assume that the old store takes no write once
/// the new one is promoted (the high-availability manager fences it), that members of a group
/// share their ttl (or one with the longest has a row on the new store), and fewer than 2^32
/// claims of one bucket between two failovers.
pub trait LeaseStore: WorkerStore + AdminStore {}

impl<S: WorkerStore + AdminStore + ?Sized> LeaseStore for S {}
