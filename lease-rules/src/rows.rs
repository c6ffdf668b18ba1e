//! The rows a state holds: nodes, groups, members, buckets; and the state itself.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lease_core::Generation;
use lease_core::Tenures;
use lease_core::{
    Bucket, Change, GroupName, Incarnation, Load, MemberMetadata, MemberMode, NodeId,
    QuarantineReason, SessionId, ShardCount, StoreError, Timestamp,
};

use crate::history::History;

/// A bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketRow {
    /// The node and session it was last claimed under; `None` once released or left.
    pub owner: Option<(NodeId, SessionId)>,
    /// Its fencing token (G4).
    pub token: i64,
    /// C9: the node of the last session that held it.
    pub last_node: Option<NodeId>,
    /// T1-T3: its last tenures (the current generation's only: T4).
    pub tenures: Tenures,
    /// P2, P4: the load last recorded on it, whoever holds it now.
    pub load: Load,
}

/// A node's session: the only row a renewal writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRow {
    /// Its current (or last) session.
    pub session: SessionId,
    /// The process start that began `session`: the only one that may extend it.
    pub incarnation: Incarnation,
    /// When the session started.
    pub started_at: Timestamp,
    /// When it was last renewed.
    pub heartbeat_at: Timestamp,
    /// When it ends (G1: live while the store's time is before it).
    pub expires_at: Timestamp,
    /// What the node said about itself at its last heartbeat.
    pub metadata: MemberMetadata,
    /// HO1: handed over, waiting for a successor.
    pub handed_over: bool,
    /// The groups it is a member of: the index that lets an operation load a node's groups
    /// without reading every group.
    pub groups: BTreeSet<GroupName>,
    /// The timeline the session was started or last renewed on (V1, V4).
    pub timeline: u64,
    /// How the session came through the store's last failover (V4), when it did.
    pub crossed: Option<String>,
}

impl NodeRow {
    /// G1: live at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }
}

/// The node rows, by node.
pub type Nodes = BTreeMap<NodeId, NodeRow>;

/// A node's membership of a group. A member row exists only under its node's current session
/// (a new session removes them all), so its sets are of that session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberRow {
    /// When it joined.
    pub joined_at: Timestamp,
    /// Buckets of the current generation recorded under the node's session. Exact while the
    /// session is live: a bucket leaves a live session only by release or leave, both of which
    /// update this set.
    pub held: BTreeSet<Bucket>,
    /// Buckets of the draining generation recorded under the session (moved here from `held`
    /// by a resize); exact the same way.
    pub held_old: BTreeSet<Bucket>,
    /// P3: the sum of its buckets' loads at its last publication, in millionths.
    pub load: u64,
    /// P3: its hottest bucket's load at its last publication.
    pub hottest: Load,
}

/// A group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupState {
    /// Its count.
    pub shards: ShardCount,
    /// The current generation's buckets, `0..shards`.
    pub buckets: Vec<BucketRow>,
    /// Its member rows, by node.
    pub members: BTreeMap<NodeId, MemberRow>,
    /// Its generation (Z2).
    pub generation: Generation,
    /// The count the current generation was resized from.
    pub previous: Option<ShardCount>,
    /// The previous generation's rows (of `previous` buckets) while it may drain; emptied by
    /// the first operation that finds every one retired.
    pub old: Vec<BucketRow>,
    /// The change counter of H8: moves with every change a view could show.
    pub version: u64,
    /// K1: controls set, by node (absent: weight 1, active).
    pub controls: BTreeMap<NodeId, (u32, MemberMode)>,
    /// Q1: buckets of the current generation under quarantine, and when it ends (past ends
    /// are ignored, and dropped by the next quarantine call).
    pub quarantines: BTreeMap<Bucket, Timestamp>,
    /// Q5: the reasons of the quarantines that have one (only of buckets in `quarantines`).
    pub quarantine_reasons: BTreeMap<Bucket, QuarantineReason>,
}

/// Whether `node`'s session is `session` and live.
pub(crate) fn session_live(
    nodes: &Nodes,
    node: NodeId,
    session: SessionId,
    now: Timestamp,
) -> bool {
    nodes
        .get(&node)
        .is_some_and(|n| n.session == session && n.is_live(now))
}

pub(crate) fn node_live(nodes: &Nodes, node: NodeId, now: Timestamp) -> bool {
    nodes.get(&node).is_some_and(|n| n.is_live(now))
}

/// The nodes and the groups an operation works on, and the changes it sends.
#[derive(Clone, Debug, Default)]
pub struct State {
    /// The node rows.
    pub nodes: Nodes,
    /// The groups (all of them in the memory store; those an operation names in the etcd
    /// store).
    pub groups: HashMap<GroupName, GroupState>,
    /// The changes operations sent since it was last emptied, in order, for the store to
    /// deliver (W1).
    pub outbox: Vec<(GroupName, Change)>,
    /// How many dead nodes' rows one heartbeat removes at most (H3 and H9 together; the
    /// others go at later heartbeats); `None`: all. The etcd store sets one so that a
    /// heartbeat's write fits one etcd transaction.
    pub removal_budget: Option<usize>,
    /// The store's history across failovers (V1-V4); the default for a store that never
    /// fails over.
    pub history: History,
}

impl State {
    pub(crate) fn group_mut(&mut self, group: &GroupName) -> Result<&mut GroupState, StoreError> {
        self.groups.get_mut(group).ok_or_else(|| not_found(group))
    }

    /// The nodes and a group, borrowed apart.
    pub(crate) fn split(
        &mut self,
        group: &GroupName,
    ) -> Result<(&Nodes, &mut GroupState), StoreError> {
        let g = self.groups.get_mut(group).ok_or_else(|| not_found(group))?;
        Ok((&self.nodes, g))
    }

    pub(crate) fn notify(&mut self, group: &GroupName, change: Change) {
        self.outbox.push((group.clone(), change));
    }

    /// The groups `node` is a member of, sorted by name (none for a node without a row).
    pub fn groups_of(&self, node: NodeId) -> Vec<GroupName> {
        self.nodes
            .get(&node)
            .map(|n| n.groups.iter().cloned().collect())
            .unwrap_or_default()
    }
}

pub(crate) fn not_found(group: &GroupName) -> StoreError {
    StoreError::GroupNotFound {
        group: group.clone(),
    }
}
