//! The contract's rules over one in-memory state: every [`LeaseStore`](lease_core::LeaseStore)
//! operation as a function of the state and the store's time.
//!
//! The memory store holds one [`State`] behind a mutex. The etcd store loads the part of its
//! keys an operation touches into a [`State`], runs the same function and writes back what
//! changed, on condition that nothing it read changed meanwhile: one specification, two
//! stores. A [`State`] need not hold every group: an operation reads the nodes and the groups
//! it names (and a node's groups, through [`NodeRow::groups`]) and nothing else.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use lease_core::{
    BackendFailure, Bucket, BucketInfo, BucketState, Change, FencingToken, GroupBeat, GroupName,
    GroupSnapshot, GroupStamp, GroupView, Heartbeat, Incarnation, Lease, MemberInfo, MemberLoad,
    MemberMetadata, MemberMode, NodeInfo, NodesSnapshot, Operation, SessionId, ShardCount,
    StoreError, Takeover, Timestamp, Ttl, ViewStamp, WorkerId, store_precision,
};
use lease_core::{EndReason, MemberControl, QuarantineFor, Tenure, Tenures, Weight};
use lease_core::{Generation, ResizeOutcome, resize};

/// A bucket.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketRow {
    /// The node and session it was last claimed under; `None` once released or left.
    pub owner: Option<(WorkerId, SessionId)>,
    /// Its fencing token (G4).
    pub token: i64,
    /// C9: the node of the last session that held it.
    pub last_node: Option<WorkerId>,
    /// T1-T3: its last tenures (the current generation's only: T4).
    pub tenures: Tenures,
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
}

impl NodeRow {
    /// G1: live at `now`.
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }
}

/// The node rows, by node.
pub type Nodes = BTreeMap<WorkerId, NodeRow>;

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
}

/// A group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupState {
    /// Its count.
    pub shards: ShardCount,
    /// The current generation's buckets, `0..shards`.
    pub buckets: Vec<BucketRow>,
    /// Its member rows, by node.
    pub members: BTreeMap<WorkerId, MemberRow>,
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
    pub controls: BTreeMap<WorkerId, (u32, MemberMode)>,
    /// Q1: buckets of the current generation under quarantine, and when it ends (past ends
    /// are ignored, and dropped by the next quarantine call).
    pub quarantines: BTreeMap<Bucket, Timestamp>,
}

/// Whether `node`'s session is `session` and live.
fn session_live(nodes: &Nodes, node: WorkerId, session: SessionId, now: Timestamp) -> bool {
    nodes
        .get(&node)
        .is_some_and(|n| n.session == session && n.is_live(now))
}

fn node_live(nodes: &Nodes, node: WorkerId, now: Timestamp) -> bool {
    nodes.get(&node).is_some_and(|n| n.is_live(now))
}

impl GroupState {
    fn bump(&mut self) {
        self.version += 1;
    }

    /// The member row of `node`, if `session` is its node's live session.
    fn live_member_mut(
        &mut self,
        nodes: &Nodes,
        node: WorkerId,
        session: SessionId,
        now: Timestamp,
    ) -> Option<&mut MemberRow> {
        self.members
            .get_mut(&node)
            .filter(|_| session_live(nodes, node, session, now))
    }

    /// Owned: recorded under its node's live session, the node a member of the group.
    fn is_owned_live(&self, nodes: &Nodes, row: &BucketRow, now: Timestamp) -> bool {
        row.owner
            .is_some_and(|(w, s)| self.members.contains_key(&w) && session_live(nodes, w, s, now))
    }

    /// Z3: an old bucket is retired once released or once its session is not live; with
    /// `Takeover::Deferred` (C8) only a released one counts.
    fn retired(&self, nodes: &Nodes, row: &BucketRow, now: Timestamp, takeover: Takeover) -> bool {
        match takeover {
            Takeover::Deferred => row.owner.is_none(),
            _ => !self.is_owned_live(nodes, row, now),
        }
    }

    /// Old buckets not retired yet; when none is left, the old generation is dropped.
    fn draining(&mut self, nodes: &Nodes, now: Timestamp) -> u32 {
        let n = self
            .old
            .iter()
            .filter(|row| !self.retired(nodes, row, now, Takeover::Allowed))
            .count();
        if n == 0 && !self.old.is_empty() {
            self.old = Vec::new();
            for m in self.members.values_mut() {
                m.held_old.clear();
            }
        }
        n as u32
    }

    /// C8: whether every old bucket new bucket `i` shares keys with is retired.
    fn parents_retired(&self, nodes: &Nodes, i: usize, now: Timestamp, takeover: Takeover) -> bool {
        let Some(from) = self.previous.filter(|_| !self.old.is_empty()) else {
            return true;
        };
        resize::parents(from, self.shards, Bucket(i as u32))
            .iter()
            .all(|p| self.retired(nodes, &self.old[p.0 as usize], now, takeover))
    }

    fn bucket_info(&self, nodes: &Nodes, i: usize, row: &BucketRow, now: Timestamp) -> BucketInfo {
        let session = row.owner.and_then(|(w, s)| {
            nodes
                .get(&w)
                .filter(|n| n.session == s && self.members.contains_key(&w))
        });
        let state = match (row.owner, session) {
            (None, _) => BucketState::Unowned,
            (Some(_), Some(n)) if n.is_live(now) => BucketState::Live,
            (Some(_), _) => BucketState::Expired,
        };
        BucketInfo {
            bucket: Bucket(i as u32),
            owner: row.owner.map(|(w, _)| w),
            session: row.owner.map(|(_, s)| s),
            token: FencingToken(row.token),
            expires_at: session.map(|n| n.expires_at),
            state,
            quarantined_until: self.quarantined(Bucket(i as u32), now),
        }
    }

    /// K1: a node's weight and mode.
    fn control(&self, node: WorkerId) -> (u32, MemberMode) {
        self.controls
            .get(&node)
            .copied()
            .unwrap_or((Weight::DEFAULT.get(), MemberMode::Active))
    }

    /// Q1: when `bucket`'s quarantine ends, if it is under one at `now`.
    fn quarantined(&self, bucket: Bucket, now: Timestamp) -> Option<Timestamp> {
        self.quarantines
            .get(&bucket)
            .copied()
            .filter(|&end| now < end)
    }

    fn live_held(&self, nodes: &Nodes, now: Timestamp) -> usize {
        self.members
            .iter()
            .filter(|(w, _)| node_live(nodes, **w, now))
            .map(|(_, m)| m.held.len())
            .sum()
    }

    /// H3: remove the member rows of nodes whose sessions are dead; the nodes removed.
    /// At most `budget` of them (taken from it); the others wait for a later heartbeat.
    fn remove_dead_members(
        &mut self,
        nodes: &Nodes,
        now: Timestamp,
        budget: &mut usize,
    ) -> Vec<WorkerId> {
        let dead: Vec<WorkerId> = self
            .members
            .keys()
            .copied()
            .filter(|w| !node_live(nodes, *w, now))
            .take(*budget)
            .collect();
        *budget -= dead.len();
        for w in &dead {
            self.members.remove(w);
        }
        if !dead.is_empty() {
            self.bump();
        }
        dead
    }

    /// H4: the view of the group and `node`'s leases in it, expiring at `expires_at`.
    fn beat(
        &self,
        nodes: &Nodes,
        group: &GroupName,
        node: WorkerId,
        draining: u32,
        expires_at: Timestamp,
        now: Timestamp,
    ) -> GroupBeat {
        let mut owned: Vec<Lease> = Vec::new();
        if let Some(me) = self.members.get(&node) {
            owned = me
                .held
                .iter()
                .map(|&bucket| Lease {
                    bucket,
                    shards: self.shards,
                    owner: node,
                    token: FencingToken(self.buckets[bucket.0 as usize].token),
                    expires_at,
                })
                .chain(me.held_old.iter().filter_map(|&bucket| {
                    Some(Lease {
                        bucket,
                        shards: self.previous?,
                        owner: node,
                        token: FencingToken(self.old.get(bucket.0 as usize)?.token),
                        expires_at,
                    })
                }))
                .collect();
            owned.sort_by_key(|l| l.bucket);
        }
        let members = self
            .members
            .iter()
            .filter(|(w, _)| node_live(nodes, **w, now))
            .map(|(&w, m)| {
                let (weight, mode) = self.control(w);
                MemberLoad {
                    worker: w,
                    owned: m.held.len() as u32,
                    weight,
                    mode,
                }
            })
            .collect();
        let quarantined: Vec<(Bucket, Timestamp)> = self
            .quarantines
            .iter()
            .filter(|&(_, &end)| now < end)
            .map(|(&b, &end)| (b, end))
            .collect();
        let held_quarantined = quarantined
            .iter()
            .filter(|(b, _)| self.is_owned_live(nodes, &self.buckets[b.0 as usize], now))
            .count();
        let claimable = (self.shards.get() as usize
            - self.live_held(nodes, now)
            - (quarantined.len() - held_quarantined)) as u32;
        // Q3: not "unchanged" past a quarantine's end, nor past another member's expiry.
        let until = self
            .members
            .keys()
            .filter(|&&w| w != node)
            .filter_map(|w| nodes.get(w).filter(|n| n.is_live(now)))
            .map(|n| n.expires_at)
            .chain(quarantined.iter().map(|&(_, end)| end))
            .min();
        let own_quarantined = owned
            .iter()
            .filter(|l| l.shards == self.shards && self.quarantined(l.bucket, now).is_some())
            .map(|l| l.bucket)
            .collect();
        GroupBeat {
            group: group.clone(),
            view: GroupView {
                shard_count: self.shards,
                members,
                claimable,
                generation: self.generation,
                previous: self.previous,
                draining,
                quarantined: quarantined.len() as u32,
            },
            owned,
            stamp: ViewStamp::new(self.version, until),
            quarantined: own_quarantined,
        }
    }
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
}

impl State {
    fn group_mut(&mut self, group: &GroupName) -> Result<&mut GroupState, StoreError> {
        self.groups.get_mut(group).ok_or_else(|| not_found(group))
    }

    /// The nodes and a group, borrowed apart.
    fn split(&mut self, group: &GroupName) -> Result<(&Nodes, &mut GroupState), StoreError> {
        let g = self.groups.get_mut(group).ok_or_else(|| not_found(group))?;
        Ok((&self.nodes, g))
    }

    fn notify(&mut self, group: &GroupName, change: Change) {
        self.outbox.push((group.clone(), change));
    }

    /// The groups `node` is a member of, sorted by name (none for a node without a row).
    pub fn groups_of(&self, node: WorkerId) -> Vec<GroupName> {
        self.nodes
            .get(&node)
            .map(|n| n.groups.iter().cloned().collect())
            .unwrap_or_default()
    }
}

fn not_found(group: &GroupName) -> StoreError {
    StoreError::GroupNotFound {
        group: group.clone(),
    }
}

impl State {
    /// [`LeaseStore::ensure_group`](lease_core::LeaseStore::ensure_group) (it needs no time).
    pub fn ensure_group(
        &mut self,

        group: &GroupName,
        shards: ShardCount,
    ) -> Result<(), StoreError> {
        let state = self;
        match state.groups.get(group) {
            // E3: the count the group was resized from is accepted too (the caller adopts).
            Some(g) if g.shards == shards || g.previous == Some(shards) => Ok(()),
            Some(g) => Err(StoreError::ShardCountMismatch {
                group: group.clone(),
                configured: shards,
                found: g.shards,
            }),
            None => {
                let buckets = shards.buckets().map(|_| BucketRow::default()).collect();
                state.groups.insert(
                    group.clone(),
                    GroupState {
                        shards,
                        buckets,
                        members: BTreeMap::new(),
                        generation: Generation::default(),
                        previous: None,
                        old: Vec::new(),
                        version: 0,
                        controls: BTreeMap::new(),
                        quarantines: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// [`LeaseStore::heartbeat`](lease_core::LeaseStore::heartbeat) at the store's time `now`.
    pub fn heartbeat(
        &mut self,
        now: Timestamp,
        node: WorkerId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        let state = self;
        if let Some(other) = state
            .nodes
            .get(&node)
            .filter(|n| n.is_live(now) && n.incarnation != incarnation && !n.handed_over)
        {
            return Err(StoreError::WorkerIdInUse {
                worker: node,
                expires_at: other.expires_at,
            });
        }
        let expires_at = now + ttl.as_chrono();
        let new_session = !node_live(&state.nodes, node, now);
        let mut budget = state.removal_budget.unwrap_or(usize::MAX);
        if new_session {
            // H2: a new session is a member of no group.
            for name in state.groups_of(node) {
                if let Ok(g) = state.group_mut(&name) {
                    g.members.remove(&node);
                    g.bump();
                }
                state.notify(&name, Change::Left(node));
            }
            state.nodes.insert(
                node,
                NodeRow {
                    session: SessionId::new(),
                    incarnation,
                    started_at: now,
                    heartbeat_at: now,
                    expires_at,
                    metadata: metadata.clone(),
                    handed_over: false,
                    groups: BTreeSet::new(),
                },
            );
            // H9: dead nodes in no group go (within the budget; the others at later ones).
            let gone: Vec<WorkerId> = state
                .nodes
                .iter()
                .filter(|&(&w, n)| w != node && !n.is_live(now) && n.groups.is_empty())
                .map(|(&w, _)| w)
                .take(budget)
                .collect();
            budget -= gone.len();
            for w in gone {
                state.nodes.remove(&w);
            }
        }
        let session = {
            let me = state.nodes.get_mut(&node).ok_or_else(|| {
                StoreError::backend_detail(
                    Operation::Heartbeat,
                    BackendFailure::Corrupt,
                    "the memory store lost a node row it had just written",
                )
            })?;
            me.expires_at = expires_at;
            me.heartbeat_at = now;
            me.metadata = metadata.clone();
            // HO3: a handed-over session is now this incarnation's.
            me.incarnation = incarnation;
            me.handed_over = false;
            me.session
        };
        let mut groups = Vec::new();
        let mut unchanged = Vec::new();
        let mut dead_nodes: BTreeSet<WorkerId> = BTreeSet::new();
        for name in state.groups_of(node) {
            let (nodes, g) = state.split(&name)?;
            let dead = g.remove_dead_members(nodes, now, &mut budget);
            for w in &dead {
                if let Some(n) = state.nodes.get_mut(w) {
                    n.groups.remove(&name);
                }
            }
            dead_nodes.extend(dead);
            let (nodes, g) = state.split(&name)?;
            let draining = g.draining(nodes, now);
            let beat = g.beat(nodes, &name, node, draining, expires_at, now);
            // H8: the same version means no change a view could show (a member whose session
            // ended was removed just above, which moved it), unless a quarantine the view
            // counted has ended since (Q3: its `until`).
            // Dead members left for a later heartbeat (the budget ran out) make a change.
            let leftover = g.members.keys().any(|w| !node_live(nodes, *w, now));
            let same = !leftover
                && seen.iter().any(|s| {
                    s.group == name
                        && s.stamp.version() == g.version
                        && s.stamp.until().is_none_or(|u| now < u)
                });
            if same {
                unchanged.push(GroupStamp {
                    group: name,
                    stamp: beat.stamp,
                });
            } else {
                groups.push(beat);
            }
        }
        // H3: nodes found dead that are members of no group any more go too.
        for dead in dead_nodes {
            if state.groups_of(dead).is_empty() {
                state.nodes.remove(&dead);
            }
        }
        Ok(Heartbeat {
            session,
            new_session,
            observed_at: now,
            expires_at,
            groups,
            unchanged,
        })
    }

    /// [`LeaseStore::join`](lease_core::LeaseStore::join) at the store's time `now`.
    pub fn join(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        node: WorkerId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        if !session_live(nodes, node, session, now) {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker: node,
            });
        }
        if g.members.contains_key(&node) {
            return Ok(());
        }
        g.members.insert(
            node,
            MemberRow {
                joined_at: now,
                held: BTreeSet::new(),
                held_old: BTreeSet::new(),
            },
        );
        g.bump();
        if let Some(n) = state.nodes.get_mut(&node) {
            n.groups.insert(group.clone());
        }
        state.notify(group, Change::Joined(node));
        Ok(())
    }

    /// [`LeaseStore::claim`](lease_core::LeaseStore::claim) at the store's time `now`.
    pub fn claim(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        let (expires_at, renewed_at) = match g.live_member_mut(nodes, worker, session, now) {
            Some(_) => nodes
                .get(&worker)
                .map(|n| (n.expires_at, n.heartbeat_at))
                .ok_or_else(|| StoreError::SessionExpired {
                    group: group.clone(),
                    worker,
                })?,
            None => {
                return Err(StoreError::SessionExpired {
                    group: group.clone(),
                    worker,
                });
            }
        };
        // C11: a cordoned or draining member claims nothing (and changes nothing).
        if g.control(worker).1 != MemberMode::Active {
            return Ok(Vec::new());
        }
        g.draining(nodes, now);
        let take_dead = takeover.takes_dead(now - renewed_at);
        let effective = if take_dead {
            Takeover::Allowed
        } else {
            Takeover::Deferred
        };
        let (mut picked, others): (Vec<usize>, Vec<usize>) = g
            .shards
            .claim_order(worker)
            .map(|b| b.0 as usize)
            .filter(|&i| {
                if take_dead {
                    !g.is_owned_live(nodes, &g.buckets[i], now)
                } else {
                    g.buckets[i].owner.is_none()
                }
            })
            // C10: not under quarantine.
            .filter(|&i| g.quarantined(Bucket(i as u32), now).is_none())
            // C8: the resize barrier, with the takeover C7 allows now.
            .filter(|&i| g.parents_retired(nodes, i, now, effective))
            // C9: the buckets it last held first.
            .partition(|&i| g.buckets[i].last_node == Some(worker));
        picked.extend(others);
        picked.truncate(want as usize);
        picked.sort_unstable();
        let mut won = Vec::with_capacity(picked.len());
        for i in picked {
            let bucket = Bucket(i as u32);
            let row = &mut g.buckets[i];
            let previous = row.owner.replace((worker, session));
            if previous.is_some() {
                row.tenures.end(now, EndReason::Expired);
            }
            row.token += 1;
            row.last_node = Some(worker);
            row.tenures.begin(worker, FencingToken(row.token), now);
            // The previous session is dead; keep its member row's set honest for snapshots.
            if let Some((w, s)) = previous
                && nodes.get(&w).is_some_and(|n| n.session == s)
                && let Some(m) = g.members.get_mut(&w)
            {
                m.held.remove(&bucket);
            }
            won.push(Lease {
                bucket,
                shards: g.shards,
                owner: worker,
                token: FencingToken(g.buckets[i].token),
                expires_at,
            });
        }
        if let Some(me) = g.members.get_mut(&worker) {
            me.held.extend(won.iter().map(|l| l.bucket));
        }
        if !won.is_empty() {
            g.bump();
        }
        Ok(won)
    }

    /// [`LeaseStore::release`](lease_core::LeaseStore::release) at the store's time `now`.
    pub fn release(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        g.draining(nodes, now);
        let old_range = g.old.len();
        if let Some(&bucket) = buckets
            .iter()
            .find(|&&b| !g.shards.contains(b) && b.0 as usize >= old_range)
        {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        let Some(me) = g.live_member_mut(nodes, worker, session, now) else {
            return Ok(Vec::new());
        };
        let mut released: Vec<Bucket> = Vec::new();
        let mut released_old: Vec<Bucket> = Vec::new();
        for b in buckets {
            if me.held.remove(b) {
                released.push(*b);
            } else if me.held_old.remove(b) {
                released_old.push(*b);
            }
        }
        let mode = g.control(worker).1;
        for &b in &released {
            let reason = EndReason::of_release(g.quarantined(b, now).is_some(), mode);
            let row = &mut g.buckets[b.0 as usize];
            row.owner = None;
            row.tenures.end(now, reason);
        }
        for b in &released_old {
            g.old[b.0 as usize].owner = None;
        }
        released.extend(released_old);
        released.sort_unstable();
        if !released.is_empty() {
            g.bump();
            state.notify(group, Change::Released(worker));
        }
        Ok(released)
    }

    /// [`LeaseStore::leave`](lease_core::LeaseStore::leave) at the store's time `now`.
    pub fn leave(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: WorkerId,
        session: Option<SessionId>,
    ) -> Result<Vec<Bucket>, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        let holds = session.is_none_or(|s| nodes.get(&worker).is_some_and(|n| n.session == s));
        if !holds || !g.members.contains_key(&worker) {
            return Ok(Vec::new());
        }
        let live = node_live(nodes, worker, now);
        let Some(me) = g.members.remove(&worker) else {
            return Ok(Vec::new());
        };
        let (held, held_old) = if live {
            (me.held, me.held_old)
        } else {
            Default::default()
        };
        let reason = match session {
            Some(_) => EndReason::Left,
            None => EndReason::Evicted,
        };
        for b in &held {
            let row = &mut g.buckets[b.0 as usize];
            row.owner = None;
            row.tenures.end(now, reason);
        }
        for b in &held_old {
            if let Some(row) = g.old.get_mut(b.0 as usize) {
                row.owner = None;
            }
        }
        g.bump();
        let mut released: Vec<Bucket> = held.into_iter().chain(held_old).collect();
        released.sort_unstable();
        state.notify(group, Change::Left(worker));
        if let Some(n) = state.nodes.get_mut(&worker) {
            n.groups.remove(group);
        }
        // L3: a node in no group any more has no session to keep.
        if state.groups_of(worker).is_empty() {
            state.nodes.remove(&worker);
        }
        Ok(released)
    }

    /// [`LeaseStore::snapshot`](lease_core::LeaseStore::snapshot) at the store's time `now`.
    pub fn snapshot(
        &mut self,
        now: Timestamp,
        group: &GroupName,
    ) -> Result<GroupSnapshot, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        g.draining(nodes, now);
        let members = g
            .members
            .iter()
            .filter_map(|(&worker, m)| {
                let n = nodes.get(&worker)?;
                let live = n.is_live(now);
                let (weight, mode) = g.control(worker);
                Some(MemberInfo {
                    worker,
                    session: n.session,
                    joined_at: m.joined_at,
                    heartbeat_at: n.heartbeat_at,
                    expires_at: n.expires_at,
                    live,
                    owned: if live { m.held.len() as u32 } else { 0 },
                    metadata: n.metadata.clone(),
                    weight,
                    mode,
                })
            })
            .collect();
        let buckets = g
            .buckets
            .iter()
            .enumerate()
            .map(|(i, row)| g.bucket_info(nodes, i, row, now))
            .collect();
        // Quarantines are of the current generation's buckets only (Q4).
        let draining = g
            .old
            .iter()
            .enumerate()
            .map(|(i, row)| BucketInfo {
                quarantined_until: None,
                ..g.bucket_info(nodes, i, row, now)
            })
            .collect();
        Ok(GroupSnapshot {
            group: group.clone(),
            shard_count: g.shards,
            observed_at: now,
            members,
            buckets,
            generation: g.generation,
            previous: g.previous,
            draining,
        })
    }

    /// [`LeaseStore::nodes`](lease_core::LeaseStore::nodes) at the store's time `now`.
    pub fn nodes(&mut self, now: Timestamp) -> Result<NodesSnapshot, StoreError> {
        let state = self;
        let nodes = state
            .nodes
            .iter()
            .map(|(&node, n)| NodeInfo {
                node,
                session: n.session,
                started_at: n.started_at,
                heartbeat_at: n.heartbeat_at,
                expires_at: n.expires_at,
                live: n.is_live(now),
                metadata: n.metadata.clone(),
                groups: state.groups_of(node),
                handed_over: n.handed_over,
            })
            .collect();
        Ok(NodesSnapshot {
            observed_at: now,
            nodes,
        })
    }

    /// [`LeaseStore::is_current`](lease_core::LeaseStore::is_current) at the store's time `now`.
    pub fn is_current(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        bucket: Bucket,
        worker: WorkerId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let state = self;
        let Some(g) = state.groups.get(group) else {
            return Ok(false);
        };
        let current = |row: &BucketRow| {
            row.token == token.0
                && row.owner.is_some_and(|(w, _)| w == worker)
                && g.is_owned_live(&state.nodes, row, now)
        };
        // F1: either generation; an old bucket owned live is not retired.
        Ok(g.buckets.get(bucket.0 as usize).is_some_and(current)
            || g.old.get(bucket.0 as usize).is_some_and(current))
    }

    /// [`LeaseStore::resize`](lease_core::LeaseStore::resize) at the store's time `now`.
    pub fn resize(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        if g.shards != from {
            return Err(StoreError::ResizeFromMismatch {
                group: group.clone(),
                from,
                found: g.shards,
            });
        }
        if from == to {
            return Ok(ResizeOutcome::Unchanged {
                generation: g.generation,
            });
        }
        let draining = g.draining(nodes, now);
        if let (Some(previous), true) = (g.previous, draining > 0) {
            return Err(StoreError::ResizeInProgress {
                group: group.clone(),
                from: previous,
                to: g.shards,
                draining,
            });
        }
        // Z4: a new bucket starts at its parents' highest token.
        let buckets = to
            .buckets()
            .map(|new| BucketRow {
                token: resize::parents(from, to, new)
                    .iter()
                    .map(|p| g.buckets[p.0 as usize].token)
                    .max()
                    .unwrap_or(0),
                ..BucketRow::default()
            })
            .collect();
        // Q4: bucket numbers change meaning.
        g.quarantines.clear();
        g.old = std::mem::replace(&mut g.buckets, buckets);
        // T4: the new generation starts with no history.
        for row in &mut g.old {
            row.tenures = Tenures::default();
        }
        for m in g.members.values_mut() {
            m.held_old = std::mem::take(&mut m.held);
        }
        g.shards = to;
        g.previous = Some(from);
        g.generation = g.generation.next();
        g.bump();
        let generation = g.generation;
        state.notify(group, Change::Resized);
        Ok(ResizeOutcome::Started { generation })
    }

    /// [`LeaseStore::hand_over`](lease_core::LeaseStore::hand_over) at the store's time `now`.
    pub fn hand_over(
        &mut self,
        now: Timestamp,
        node: WorkerId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        let state = self;
        let Some(n) = state
            .nodes
            .get_mut(&node)
            .filter(|n| n.is_live(now) && n.incarnation == incarnation)
        else {
            return Ok(None);
        };
        n.expires_at = now + keep.as_chrono();
        n.handed_over = true;
        let expires_at = n.expires_at;
        // The other members' stamps hold the session's old expiry (H8's `until`).
        for name in state.groups_of(node) {
            if let Ok(g) = state.group_mut(&name) {
                g.bump();
            }
        }
        Ok(Some(expires_at))
    }

    /// [`LeaseStore::control`](lease_core::LeaseStore::control) (it needs no time).
    pub fn control(
        &mut self,

        group: &GroupName,
        node: WorkerId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        let state = self;
        let g = state.group_mut(group)?;
        // K2: a member, or a node controlled before.
        if !g.members.contains_key(&node) && !g.controls.contains_key(&node) {
            return Err(StoreError::NotAMember {
                group: group.clone(),
                worker: node,
            });
        }
        let current = g.control(node);
        let next = control.apply(current);
        // K3: the value stored already writes nothing.
        if next == current {
            return Ok(());
        }
        g.controls.insert(node, next);
        g.bump();
        state.notify(group, Change::Controlled);
        Ok(())
    }

    /// [`LeaseStore::quarantine`](lease_core::LeaseStore::quarantine) at the store's time `now`.
    pub fn quarantine(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError> {
        let state = self;
        let g = state.group_mut(group)?;
        if !g.shards.contains(bucket) {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        // Q3: lifting a bucket not under quarantine writes nothing (not even the removal of
        // ended quarantines, which a store writing its state back would write).
        if duration.is_none() && g.quarantined(bucket, now).is_none() {
            return Ok(());
        }
        g.quarantines.retain(|_, end| now < *end);
        match duration {
            Some(d) => {
                g.quarantines
                    .insert(bucket, store_precision(now + d.as_chrono()));
            }
            None => {
                g.quarantines.remove(&bucket);
            }
        }
        g.bump();
        state.notify(group, Change::Controlled);
        Ok(())
    }

    /// [`LeaseStore::history`](lease_core::LeaseStore::history) (it needs no time).
    pub fn history(
        &mut self,

        group: &GroupName,
        bucket: Bucket,
    ) -> Result<Vec<Tenure>, StoreError> {
        let state = self;
        let g = state.group_mut(group)?;
        g.buckets
            .get(bucket.0 as usize)
            .map(|row| row.tenures.to_vec())
            .ok_or_else(|| StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            })
    }
}
