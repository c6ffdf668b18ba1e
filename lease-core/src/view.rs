//! What stores return: leases, the heartbeat's compact view and the full snapshot.

use crate::control::QuarantineReason;
use crate::failover::LogPosition;
use crate::ids::{Bucket, FencingToken, GroupName, MemberMetadata, NodeId, SessionId, ShardCount};
use crate::load::Load;
use crate::resize::{self, Generation};
use crate::time::Timestamp;

/// Ownership of one bucket: who holds it, with which fencing token, until when.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Lease {
    /// The bucket.
    pub bucket: Bucket,
    /// The shard count of the bucket's generation: the group's count, or during a resize the
    /// old count for a bucket of the draining generation.
    pub shards: ShardCount,
    /// The owner.
    pub owner: NodeId,
    /// The fencing token of this ownership.
    pub token: FencingToken,
    /// When the owner's session expires unless renewed (store clock).
    pub expires_at: Timestamp,
}

/// A live member, how many buckets it owns and the operators' controls on it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct MemberLoad {
    /// The member.
    pub worker: NodeId,
    /// Buckets it owns under its live session.
    pub owned: u32,
    /// Its weight: targets are proportional to weights (default 1; 0 asks for no bucket).
    pub weight: u32,
    /// Whether it claims, keeps or sheds (see [`MemberMode`]).
    pub mode: MemberMode,
    /// The sum of the loads recorded on its buckets, in millionths of a unit, as of its last
    /// [`publish_loads`](crate::WorkerStore::publish_loads) (P3); 0 if it never published.
    pub load: u64,
    /// The largest load recorded on one of its buckets, as of the same publication.
    pub hottest: Load,
}

impl MemberLoad {
    /// A member of weight 1, active, owning `owned` buckets, with no load published.
    pub fn new(worker: NodeId, owned: u32) -> Self {
        Self {
            worker,
            owned,
            weight: 1,
            mode: MemberMode::Active,
            load: 0,
            hottest: Load::ZERO,
        }
    }
}

/// What an operator asked of a member of a group (`leasectl cordon`, `drain`, `uncordon`).
/// Stored per (group, node) in the store: it outlives the member's session and applies again
/// when the node joins the group after a restart, until `uncordon`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
#[non_exhaustive]
pub enum MemberMode {
    /// Claims up to its share and sheds the excess (the default).
    #[default]
    Active,
    /// Claims nothing and keeps what it holds: weight 0 in effect, and what it holds is left
    /// out of the others' shares.
    Cordoned,
    /// Claims nothing and sheds everything it holds (revoke reason `drained`).
    Draining,
}

impl MemberMode {
    /// The mode's name as stored and printed: `active`, `cordoned`, `draining`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Cordoned => "cordoned",
            Self::Draining => "draining",
        }
    }

    /// The mode named by [`as_str`](Self::as_str); `None` for another name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "active" => Some(Self::Active),
            "cordoned" => Some(Self::Cordoned),
            "draining" => Some(Self::Draining),
            _ => None,
        }
    }
}

/// The part of a group's state the fair-share policy decides on.
///
/// During a resize every count here is of the new (current) generation: the policy shares the
/// new generation's buckets, and buckets of the draining generation are only ever released.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupView {
    /// The group's bucket count (of the current generation).
    pub shard_count: ShardCount,
    /// Every live member (idle ones included) with its load, sorted by node id. `owned`
    /// counts buckets of the current generation only.
    pub members: Vec<MemberLoad>,
    /// Buckets of the current generation nobody live owns: never owned, released, or held by
    /// a dead session, and during a resize also those still waiting for their parents.
    pub claimable: u32,
    /// The group's generation (see [`Generation`]).
    pub generation: Generation,
    /// The count the current generation was resized from, until the next resize; `None` for a
    /// group never resized. A worker configured with this count adopts `shard_count`.
    pub previous: Option<ShardCount>,
    /// Buckets of the draining generation (of `previous` buckets) not retired yet: 0 when no
    /// resize is draining.
    pub draining: u32,
    /// Buckets of the current generation under quarantine: nobody may claim them, and their
    /// owner gives them up. The policy shares the others.
    pub quarantined: u32,
    /// Of the claimable buckets (quarantined ones excluded), those with a recorded load above
    /// 0 (P4), hottest first (by bucket between equals), at most [`LOADED_LISTED`] of them:
    /// what the load-aware policy hands out by name.
    pub loaded: Vec<(Bucket, Load)>,
}

/// The most claimable buckets with a load a view lists ([`GroupView::loaded`]): enough for
/// the hand-offs of several ticks, and a bound on the heartbeat's size whatever the shard
/// count.
pub const LOADED_LISTED: usize = 256;

impl GroupView {
    /// The view of a group of `shard_count` buckets never resized, with these members.
    pub fn new(shard_count: ShardCount, members: Vec<MemberLoad>, claimable: u32) -> Self {
        Self {
            shard_count,
            members,
            claimable,
            generation: Generation::default(),
            previous: None,
            draining: 0,
            quarantined: 0,
            loaded: Vec::new(),
        }
    }

    /// The old buckets `bucket` of the current generation shares keys with, when the current
    /// generation came from a resize; empty otherwise.
    pub fn parents(&self, bucket: Bucket) -> Vec<Bucket> {
        self.previous
            .map(|from| resize::parents(from, self.shard_count, bucket))
            .unwrap_or_default()
    }
}

/// What a node was last told of a group, handed back to [`heartbeat`](crate::WorkerStore::heartbeat)
/// so that the store may answer "unchanged" instead of the whole view (contract rule H8).
/// Opaque to the node: the store that issued it reads it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct ViewStamp {
    version: u64,
    until: Option<Timestamp>,
}

impl ViewStamp {
    /// A stamp of a group at its change counter `version`, valid for "unchanged" answers
    /// until `until` (store clock; the earliest expiry among the group's other live members,
    /// `None` if there are none).
    pub fn new(version: u64, until: Option<Timestamp>) -> Self {
        Self { version, until }
    }

    /// The group's change counter when the stamp was issued.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Until when (store clock) nothing can have changed in the group without its change
    /// counter moving: the earliest expiry among the other live members it saw.
    pub fn until(&self) -> Option<Timestamp> {
        self.until
    }
}

/// One group in a node's heartbeat: the view the policy needs and the node's leases.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupBeat {
    /// The group.
    pub group: GroupName,
    /// The group as the policy needs it.
    pub view: GroupView,
    /// The node's leases in the group under its session, sorted by bucket: of the current
    /// generation, and during a resize of the draining one (a lease whose `shards` is not the
    /// view's `shard_count`), which the node must release. A session never holds a bucket
    /// number in both generations at once (a new bucket waits for the old bucket of its
    /// number).
    pub owned: Vec<Lease>,
    /// Hand it back with the next heartbeat ([`GroupStamp`]).
    pub stamp: ViewStamp,
    /// The node's buckets of the current generation under quarantine (Q2), sorted: to revoke
    /// (reason `quarantined`) and release.
    pub quarantined: Vec<Bucket>,
}

impl GroupBeat {
    /// The buckets of the current generation this node owns, in order: what the policy
    /// plans with.
    pub fn owned_buckets(&self) -> Vec<Bucket> {
        self.owned
            .iter()
            .filter(|l| l.shards == self.view.shard_count)
            .map(|l| l.bucket)
            .collect()
    }

    /// The buckets of the draining generation this node still owns, in order: to revoke
    /// (reason `resharded`) and release.
    pub fn draining_buckets(&self) -> Vec<Bucket> {
        self.owned
            .iter()
            .filter(|l| l.shards != self.view.shard_count)
            .map(|l| l.bucket)
            .collect()
    }
}

/// A group and a [`ViewStamp`] of it: what a node hands to
/// [`heartbeat`](crate::WorkerStore::heartbeat) (the stamp of the last view of the group it was
/// given), and what the heartbeat answers for a group unchanged since (with the stamp to hand
/// in next time).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GroupStamp {
    /// The group.
    pub group: GroupName,
    /// The stamp.
    pub stamp: ViewStamp,
}

/// What a heartbeat returns: the node's session and, for every group the node is a member of,
/// the compact view of the group or word that it is unchanged. Its size grows with the node's
/// groups, their members and the node's own buckets, never with the shard counts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Heartbeat {
    /// The node's live session.
    pub session: SessionId,
    /// Whether this heartbeat started `session` (first heartbeat, or after the previous
    /// session expired). When true, nothing held before is owned any more and the node is a
    /// member of no group: it joins again.
    pub new_session: bool,
    /// The store's time of the renewal.
    pub observed_at: Timestamp,
    /// When the session expires unless renewed: `observed_at + ttl`.
    pub expires_at: Timestamp,
    /// The groups the node is a member of whose view is given, sorted by name.
    pub groups: Vec<GroupBeat>,
    /// The groups the node is a member of that are unchanged since the stamp it handed in
    /// (H8), sorted by name, each with the stamp to hand in next: their views are the ones
    /// last given, and the node's leases in them the same, now expiring at `expires_at`.
    pub unchanged: Vec<GroupStamp>,
    /// Where the store's write history stood when the heartbeat ran: at or after the commit
    /// of every write answered before it was sent (H10, for V4). `None` from a store that never
    /// fails over (etcd).
    pub position: Option<LogPosition>,
}

impl Heartbeat {
    /// The beat of `group`, when its view was given.
    pub fn group(&self, group: &GroupName) -> Option<&GroupBeat> {
        self.groups.iter().find(|g| &g.group == group)
    }

    /// Whether the node is a member of `group`, by this heartbeat (given or unchanged).
    pub fn is_member(&self, group: &GroupName) -> bool {
        self.group(group).is_some() || self.unchanged.iter().any(|u| &u.group == group)
    }
}

/// A node as [`nodes`](crate::AdminStore::nodes) lists it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct NodeInfo {
    /// The node.
    pub node: NodeId,
    /// Its current (or last) session.
    pub session: SessionId,
    /// When the session started.
    pub started_at: Timestamp,
    /// When the session was last renewed.
    pub heartbeat_at: Timestamp,
    /// When the session expires (or expired).
    pub expires_at: Timestamp,
    /// Whether the session is live at the listing's time.
    pub live: bool,
    /// What the node attached at its last heartbeat.
    pub metadata: MemberMetadata,
    /// The groups it is a member of, sorted by name.
    pub groups: Vec<GroupName>,
    /// Whether its session was handed over (HO1) and waits for a successor.
    pub handed_over: bool,
    /// How the session came through the store's last failover (V4), for operators: `kept`,
    /// or `ended: ` and why the node's first heartbeat after it started this session instead.
    /// `None` when the session began on the store's current timeline without one.
    pub crossed: Option<String>,
}

/// Every node a store knows, at one instant of its clock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct NodesSnapshot {
    /// The store's time of the listing.
    pub observed_at: Timestamp,
    /// Every node row, live or not, sorted by node id.
    pub nodes: Vec<NodeInfo>,
}

/// A bucket's ownership as a snapshot sees it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum BucketState {
    /// Owned by a live session.
    Live,
    /// The recorded owner's session has expired or ended; anyone may claim it.
    Expired,
    /// No owner recorded (never owned, or released).
    Unowned,
}

impl BucketState {
    /// `live`, `expired` or `unowned`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Expired => "expired",
            Self::Unowned => "unowned",
        }
    }
}

/// One bucket in a [`GroupSnapshot`].
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct BucketInfo {
    /// The bucket.
    pub bucket: Bucket,
    /// The recorded owner, live or not; `None` when unowned.
    pub owner: Option<NodeId>,
    /// The recorded owner's session.
    pub session: Option<SessionId>,
    /// The current fencing token (0 if never owned).
    pub token: FencingToken,
    /// When the owner's session expires (or expired); `None` when unowned or when the owner's
    /// session no longer exists.
    pub expires_at: Option<Timestamp>,
    /// The effective state at `observed_at`.
    pub state: BucketState,
    /// Until when the bucket is under quarantine (unclaimable), when it is at `observed_at`.
    pub quarantined_until: Option<Timestamp>,
    /// Why, when the quarantine running at `observed_at` was given a reason (Q5).
    pub quarantine_reason: Option<QuarantineReason>,
    /// The load last recorded on the bucket (P2, P4); [`Load::ZERO`] if none was.
    pub load: Load,
}

/// One member row in a [`GroupSnapshot`]: a node's membership of the group, with its node's
/// session.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct MemberInfo {
    /// The node.
    pub worker: NodeId,
    /// Its node's current (or last) session.
    pub session: SessionId,
    /// When the node joined the group.
    pub joined_at: Timestamp,
    /// When the node's session was last renewed.
    pub heartbeat_at: Timestamp,
    /// When the node's session expires (or expired).
    pub expires_at: Timestamp,
    /// Whether the node's session is live at `observed_at`.
    pub live: bool,
    /// Buckets of the group owned under the session (0 when it is not live).
    pub owned: u32,
    /// What the node attached at its last heartbeat.
    pub metadata: MemberMetadata,
    /// The member's weight.
    pub weight: u32,
    /// What an operator asked of the member.
    pub mode: MemberMode,
    /// Its work at its last publication (P3): the sum of its buckets' loads, in millionths.
    pub load: u64,
    /// Its hottest bucket's load at its last publication.
    pub hottest: Load,
}

/// Everything a store knows about a group, at one instant of its clock.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct GroupSnapshot {
    /// The group.
    pub group: GroupName,
    /// Its bucket count.
    pub shard_count: ShardCount,
    /// The store's time of the snapshot.
    pub observed_at: Timestamp,
    /// Every member row, live or expired, sorted by node id.
    pub members: Vec<MemberInfo>,
    /// Every bucket of the current generation, in order.
    pub buckets: Vec<BucketInfo>,
    /// The group's generation.
    pub generation: Generation,
    /// The count the current generation was resized from, until the next resize.
    pub previous: Option<ShardCount>,
    /// While a resize drains: every bucket of the old generation (of `previous` buckets), in
    /// order, [`BucketState::Live`] for those not retired yet. Empty otherwise.
    pub draining: Vec<BucketInfo>,
}

impl GroupSnapshot {
    /// The live members with their loads, sorted by node id.
    pub fn live_members(&self) -> Vec<MemberLoad> {
        self.members
            .iter()
            .filter(|m| m.live)
            .map(|m| MemberLoad {
                worker: m.worker,
                owned: m.owned,
                weight: m.weight,
                mode: m.mode,
                load: m.load,
                hottest: m.hottest,
            })
            .collect()
    }

    /// The policy's view of the group, as a heartbeat would report it.
    pub fn view(&self) -> GroupView {
        let claimable = self
            .buckets
            .iter()
            .filter(|b| b.state != BucketState::Live && b.quarantined_until.is_none())
            .count();
        let quarantined = self
            .buckets
            .iter()
            .filter(|b| b.quarantined_until.is_some())
            .count();
        GroupView {
            shard_count: self.shard_count,
            members: self.live_members(),
            claimable: u32::try_from(claimable).unwrap_or(u32::MAX),
            generation: self.generation,
            previous: self.previous,
            draining: u32::try_from(
                self.draining
                    .iter()
                    .filter(|b| b.state == BucketState::Live)
                    .count(),
            )
            .unwrap_or(u32::MAX),
            quarantined: u32::try_from(quarantined).unwrap_or(u32::MAX),
            loaded: list_loaded(
                self.buckets
                    .iter()
                    .filter(|b| b.state != BucketState::Live && b.quarantined_until.is_none())
                    .map(|b| (b.bucket, b.load)),
            ),
        }
    }

    /// While a resize drains: each bucket of the current generation that still waits, with
    /// the old buckets it waits for (its parents not retired yet), in order.
    pub fn waiting(&self) -> Vec<(Bucket, Vec<Bucket>)> {
        let Some(from) = self.previous.filter(|_| !self.draining.is_empty()) else {
            return Vec::new();
        };
        self.shard_count
            .buckets()
            .filter_map(|new| {
                let blocking: Vec<Bucket> = resize::parents(from, self.shard_count, new)
                    .into_iter()
                    .filter(|old| {
                        self.draining
                            .get(old.0 as usize)
                            .is_some_and(|b| b.state == BucketState::Live)
                    })
                    .collect();
                (!blocking.is_empty()).then_some((new, blocking))
            })
            .collect()
    }

    /// The live leases of the current generation, in bucket order.
    pub fn live_leases(&self) -> Vec<Lease> {
        self.buckets
            .iter()
            .filter(|b| b.state == BucketState::Live)
            .filter_map(|b| {
                Some(Lease {
                    bucket: b.bucket,
                    shards: self.shard_count,
                    owner: b.owner?,
                    token: b.token,
                    expires_at: b.expires_at?,
                })
            })
            .collect()
    }

    /// The live leases of the draining generation (not retired yet), in bucket order; each
    /// lease's `shards` is the old count.
    pub fn draining_leases(&self) -> Vec<Lease> {
        let Some(from) = self.previous else {
            return Vec::new();
        };
        self.draining
            .iter()
            .filter(|b| b.state == BucketState::Live)
            .filter_map(|b| {
                Some(Lease {
                    bucket: b.bucket,
                    shards: from,
                    owner: b.owner?,
                    token: b.token,
                    expires_at: b.expires_at?,
                })
            })
            .collect()
    }
}

/// [`GroupView::loaded`] of the claimable buckets `claimable` with their recorded loads: those
/// above 0, hottest first (by bucket between equals), at most [`LOADED_LISTED`]. Every store
/// lists them with this, so that views agree to the bucket.
pub fn list_loaded(claimable: impl IntoIterator<Item = (Bucket, Load)>) -> Vec<(Bucket, Load)> {
    let mut out: Vec<(Bucket, Load)> = claimable
        .into_iter()
        .filter(|&(_, l)| l > Load::ZERO)
        .collect();
    out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    out.truncate(LOADED_LISTED);
    out
}
