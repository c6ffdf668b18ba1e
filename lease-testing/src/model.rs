//! The reference model: the store contract as plain, synchronous data manipulation.
//!
//! It is written for obviousness, not speed: every count is recomputed by scanning, time is an
//! argument, and session ids come from a counter. Property tests run it beside real backends
//! and compare every result, through [`ModelStore`], the model as a
//! [`LeaseStore`](lease_core::LeaseStore).

use std::collections::BTreeMap;

use uuid::Uuid;

mod admin;
mod failover;
mod loads;
mod store;
pub use store::{ModelFailovers, ModelStore};

use lease_core::StoreError;
use lease_core::resize;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionBound, SessionId,
    ShardCount, Takeover,
};
use lease_core::{
    BucketInfo, BucketState, GroupBeat, GroupSnapshot, GroupView, Heartbeat, Lease, Load,
    MemberInfo, MemberLoad, MemberMode, NodeInfo, NodesSnapshot, ViewStamp, list_loaded,
};
use lease_core::{
    EndReason, MemberControl, QuarantineFor, QuarantineReason, Tenure, Tenures, Weight,
};
use lease_core::{Generation, ResizeOutcome};
use lease_core::{Timestamp, Ttl, store_precision};

#[derive(Clone, Debug, Default)]
struct ModelBucket {
    owner: Option<(NodeId, SessionId)>,
    token: i64,
    /// C9: the node of the last session that held it.
    last_node: Option<NodeId>,
    /// Q1: when its quarantine ends.
    quarantine: Option<Timestamp>,
    /// Q5: the reason that quarantine was set with.
    quarantine_reason: Option<QuarantineReason>,
    /// T1-T3: its last tenures.
    tenures: Tenures,
    /// P2, P4: the load last recorded on it.
    load: Load,
}

impl ModelBucket {
    /// Q1: under quarantine at `now`.
    fn quarantined(&self, now: Timestamp) -> Option<Timestamp> {
        self.quarantine.filter(|&end| now < end)
    }
}

#[derive(Clone, Debug)]
struct ModelNode {
    session: SessionId,
    incarnation: Incarnation,
    started_at: Timestamp,
    heartbeat_at: Timestamp,
    expires_at: Timestamp,
    metadata: MemberMetadata,
    /// HO1: handed over, waiting for a successor.
    handed_over: bool,
    /// V1, V4: the timeline the session was started or last renewed on.
    timeline: u64,
    /// V4: how the session came through the last failover.
    crossed: Option<String>,
}

type Nodes = BTreeMap<NodeId, ModelNode>;

#[derive(Clone, Debug)]
struct ModelGroup {
    shards: ShardCount,
    buckets: Vec<ModelBucket>,
    /// Members and when they joined.
    members: BTreeMap<NodeId, Timestamp>,
    generation: Generation,
    /// The count the current generation was resized from.
    previous: Option<ShardCount>,
    /// The previous generation's buckets (of `previous`), kept after the drain ends; the drain
    /// runs while one of them is not retired (see `draining`).
    old: Vec<ModelBucket>,
    /// K1: the controls set, by node (absent: weight 1, active).
    controls: BTreeMap<NodeId, (u32, MemberMode)>,
    /// P3: each member's work at its last publication (absent: none), cleared when it joins.
    work: BTreeMap<NodeId, (u64, Load)>,
}

/// The node's session if it is live at `now`.
fn live_node(nodes: &Nodes, node: NodeId, now: Timestamp) -> Option<&ModelNode> {
    nodes.get(&node).filter(|n| now < n.expires_at)
}

impl ModelGroup {
    /// `node`'s live session, if it is `session` and the node a member.
    fn live_as<'n>(
        &self,
        nodes: &'n Nodes,
        node: NodeId,
        session: SessionId,
        now: Timestamp,
    ) -> Option<&'n ModelNode> {
        live_node(nodes, node, now)
            .filter(|n| n.session == session && self.members.contains_key(&node))
    }

    /// Whether bucket `b` is owned by a live member's session at `now`: its owner.
    fn live_owner(&self, nodes: &Nodes, b: &ModelBucket, now: Timestamp) -> Option<NodeId> {
        let (w, s) = b.owner?;
        self.live_as(nodes, w, s, now).map(|_| w)
    }

    fn owned_by(&self, nodes: &Nodes, worker: NodeId, now: Timestamp) -> Vec<Bucket> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| self.live_owner(nodes, b, now) == Some(worker))
            .map(|(i, _)| Bucket(i as u32))
            .collect()
    }

    /// Z3: an old bucket is retired once released or once its session is not live. With
    /// `Takeover::Deferred` (C8) only a released one counts.
    fn retired(&self, nodes: &Nodes, b: &ModelBucket, now: Timestamp, takeover: Takeover) -> bool {
        match takeover {
            Takeover::Deferred => b.owner.is_none(),
            _ => self.live_owner(nodes, b, now).is_none(),
        }
    }

    /// How many old buckets are not retired: 0 when no resize drains.
    fn draining(&self, nodes: &Nodes, now: Timestamp) -> u32 {
        self.old
            .iter()
            .filter(|b| !self.retired(nodes, b, now, Takeover::Allowed))
            .count() as u32
    }

    /// The old generation's buckets `worker` owns, while it drains.
    fn old_owned_by(&self, nodes: &Nodes, worker: NodeId, now: Timestamp) -> Vec<Bucket> {
        self.old
            .iter()
            .enumerate()
            .filter(|(_, b)| self.live_owner(nodes, b, now) == Some(worker))
            .map(|(i, _)| Bucket(i as u32))
            .collect()
    }

    /// C8: whether every old bucket new bucket `i` shares keys with is retired.
    fn parents_retired(&self, nodes: &Nodes, i: usize, now: Timestamp, takeover: Takeover) -> bool {
        let (Some(from), true) = (self.previous, self.draining(nodes, now) > 0) else {
            return true;
        };
        resize::parents(from, self.shards, Bucket(i as u32))
            .iter()
            .all(|p| self.retired(nodes, &self.old[p.0 as usize], now, takeover))
    }

    /// K1: a node's weight and mode.
    fn control(&self, node: NodeId) -> (u32, MemberMode) {
        self.controls
            .get(&node)
            .copied()
            .unwrap_or((Weight::DEFAULT.get(), MemberMode::Active))
    }

    fn lease(&self, nodes: &Nodes, bucket: Bucket, worker: NodeId) -> Option<Lease> {
        let b = &self.buckets[bucket.0 as usize];
        Some(Lease {
            bucket,
            shards: self.shards,
            owner: worker,
            token: FencingToken(b.token),
            expires_at: nodes.get(&worker)?.expires_at,
        })
    }

    fn old_lease(&self, nodes: &Nodes, bucket: Bucket, worker: NodeId) -> Option<Lease> {
        let b = &self.old[bucket.0 as usize];
        Some(Lease {
            bucket,
            shards: self.previous?,
            owner: worker,
            token: FencingToken(b.token),
            expires_at: nodes.get(&worker)?.expires_at,
        })
    }

    fn bucket_info(&self, nodes: &Nodes, i: usize, b: &ModelBucket, now: Timestamp) -> BucketInfo {
        let expires_at = b.owner.and_then(|(w, s)| {
            nodes
                .get(&w)
                .filter(|n| n.session == s && self.members.contains_key(&w))
                .map(|n| n.expires_at)
        });
        let state = match (b.owner, self.live_owner(nodes, b, now)) {
            (None, _) => BucketState::Unowned,
            (Some(_), Some(_)) => BucketState::Live,
            (Some(_), None) => BucketState::Expired,
        };
        BucketInfo {
            bucket: Bucket(i as u32),
            owner: b.owner.map(|(w, _)| w),
            session: b.owner.map(|(_, s)| s),
            token: FencingToken(b.token),
            expires_at,
            state,
            quarantined_until: b.quarantined(now),
            quarantine_reason: b.quarantined(now).and_then(|_| b.quarantine_reason.clone()),
            load: b.load,
        }
    }

    /// H4: the group's view for `node` (the model always gives the view: H8 allows it).
    fn beat(&self, nodes: &Nodes, group: &GroupName, node: NodeId, now: Timestamp) -> GroupBeat {
        let members: Vec<MemberLoad> = self
            .members
            .keys()
            .filter(|&&w| live_node(nodes, w, now).is_some())
            .map(|&w| {
                let (weight, mode) = self.control(w);
                let (load, hottest) = self.work.get(&w).copied().unwrap_or_default();
                MemberLoad {
                    worker: w,
                    owned: self.owned_by(nodes, w, now).len() as u32,
                    weight,
                    mode,
                    load,
                    hottest,
                }
            })
            .collect();
        let claimable = self
            .buckets
            .iter()
            .filter(|b| self.live_owner(nodes, b, now).is_none() && b.quarantined(now).is_none())
            .count() as u32;
        let quarantined = self
            .buckets
            .iter()
            .filter(|b| b.quarantined(now).is_some())
            .count() as u32;
        let mut owned: Vec<Lease> = self
            .owned_by(nodes, node, now)
            .into_iter()
            .filter_map(|b| self.lease(nodes, b, node))
            .chain(
                self.old_owned_by(nodes, node, now)
                    .into_iter()
                    .filter_map(|b| self.old_lease(nodes, b, node)),
            )
            .collect();
        owned.sort_by_key(|l| l.bucket);
        GroupBeat {
            group: group.clone(),
            view: GroupView {
                shard_count: self.shards,
                members,
                claimable,
                generation: self.generation,
                previous: self.previous,
                draining: self.draining(nodes, now),
                quarantined,
                loaded: list_loaded(
                    self.buckets
                        .iter()
                        .enumerate()
                        .filter(|(_, b)| {
                            self.live_owner(nodes, b, now).is_none() && b.quarantined(now).is_none()
                        })
                        .map(|(i, b)| (Bucket(i as u32), b.load)),
                ),
            },
            quarantined: owned
                .iter()
                .filter(|l| l.shards == self.shards)
                .filter(|l| self.buckets[l.bucket.0 as usize].quarantined(now).is_some())
                .map(|l| l.bucket)
                .collect(),
            owned,
            stamp: ViewStamp::default(),
        }
    }
}

/// The reference model of a [`LeaseStore`](lease_core::LeaseStore). Cloning it forks the state.
#[derive(Clone, Debug, Default)]
pub struct Model {
    nodes: Nodes,
    groups: BTreeMap<GroupName, ModelGroup>,
    sessions_minted: u128,
    timelines: failover::Timelines,
}

impl Model {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn group(&self, group: &GroupName) -> Result<&ModelGroup, StoreError> {
        self.groups
            .get(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })
    }

    fn group_mut(&mut self, group: &GroupName) -> Result<&mut ModelGroup, StoreError> {
        self.groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })
    }

    /// The groups `node` is a member of, by name.
    fn groups_of(&self, node: NodeId) -> Vec<GroupName> {
        self.groups
            .iter()
            .filter(|(_, g)| g.members.contains_key(&node))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// See [`WorkerStore::ensure_group`](lease_core::WorkerStore::ensure_group).
    pub fn ensure_group(
        &mut self,
        group: &GroupName,
        shards: ShardCount,
    ) -> Result<(), StoreError> {
        match self.groups.get(group) {
            // E3: the count the group was resized from is accepted too (the caller adopts).
            Some(g) if g.shards == shards || g.previous == Some(shards) => Ok(()),
            Some(g) => Err(StoreError::ShardCountMismatch {
                group: group.clone(),
                configured: shards,
                found: g.shards,
            }),
            None => {
                let buckets = shards.buckets().map(|_| ModelBucket::default()).collect();
                self.groups.insert(
                    group.clone(),
                    ModelGroup {
                        shards,
                        buckets,
                        members: BTreeMap::new(),
                        generation: Generation::default(),
                        previous: None,
                        old: Vec::new(),
                        controls: BTreeMap::new(),
                        work: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// A call is made: the model's writes move on (a position read later is past it).
    pub fn call(&mut self) {
        self.timelines.call();
    }

    /// This copy of the model becomes the store on the next timeline: a failover to a standby
    /// that had everything up to the copy.
    pub fn promote(&mut self) {
        self.timelines.promote();
    }

    /// See [`WorkerStore::heartbeat_with_bound`](lease_core::WorkerStore::heartbeat_with_bound).
    /// The model gives every group's view (H8 lets a store always do so).
    pub fn heartbeat(
        &mut self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        bound: Option<&SessionBound>,
        now: Timestamp,
    ) -> Result<Heartbeat, StoreError> {
        let now = store_precision(now);
        let timeline = self.timelines.current();
        // HO3: a handed-over session is taken over, not refused; one of an earlier timeline
        // is not refused either (V1: it ends, unless V4 keeps it).
        if let Some(n) = live_node(&self.nodes, node, now)
            .filter(|n| n.incarnation != incarnation && !n.handed_over && n.timeline == timeline)
        {
            return Err(StoreError::NodeIdInUse {
                worker: node,
                expires_at: n.expires_at,
            });
        }
        // V4: a session of an earlier timeline is kept or ends, judged once the timeline is
        // recorded.
        let crossed = match self.nodes.get(&node).filter(|n| n.timeline != timeline) {
            Some(n) => {
                self.timelines.heartbeat_at(now);
                let c = failover::Crossing {
                    session: n.session,
                    incarnation: n.incarnation,
                    live: now < n.expires_at
                        || self
                            .timelines
                            .may_keep(n.timeline, n.heartbeat_at, n.expires_at, now),
                    handed_over: n.handed_over,
                    bound,
                };
                Some(self.timelines.judge(&c, incarnation))
            }
            None => None,
        };
        let kept = crossed.as_deref() == Some("kept");
        let expires_at = now + ttl.as_chrono();
        let new_session =
            !kept && (live_node(&self.nodes, node, now).is_none() || crossed.is_some());
        if new_session {
            self.timelines.heartbeat_at(now);
            // H2: a new session is a member of no group.
            for g in self.groups.values_mut() {
                g.members.remove(&node);
            }
            self.sessions_minted += 1;
            self.nodes.insert(
                node,
                ModelNode {
                    session: SessionId::from_uuid(Uuid::from_u128(self.sessions_minted)),
                    incarnation,
                    started_at: now,
                    heartbeat_at: now,
                    expires_at,
                    metadata: metadata.clone(),
                    handed_over: false,
                    timeline,
                    crossed: crossed.clone(),
                },
            );
            // H9: dead nodes in no group go.
            let members: std::collections::BTreeSet<NodeId> = self
                .groups
                .values()
                .flat_map(|g| g.members.keys().copied())
                .collect();
            let timelines = &self.timelines;
            self.nodes.retain(|&w, n| {
                w == node
                    || now < n.expires_at
                    || members.contains(&w)
                    || timelines.may_keep(n.timeline, n.heartbeat_at, n.expires_at, now)
            });
        } else if let Some(n) = self.nodes.get_mut(&node) {
            n.expires_at = expires_at;
            n.heartbeat_at = now;
            n.metadata = metadata.clone();
            n.incarnation = incarnation;
            n.handed_over = false;
            if kept {
                n.timeline = timeline;
                n.crossed = crossed;
            }
        }
        let session = self.nodes[&node].session;
        let mine = self.groups_of(node);
        // H3: in the node's groups, dead members go, and their nodes if in no group any more.
        let mut dead = Vec::new();
        for name in &mine {
            let nodes = &self.nodes;
            let timelines = &self.timelines;
            if let Some(g) = self.groups.get_mut(name) {
                g.members.retain(|&w, _| {
                    // V4: a session that may still be kept keeps its memberships meanwhile.
                    let keep = live_node(nodes, w, now).is_some()
                        || nodes.get(&w).is_some_and(|n| {
                            timelines.may_keep(n.timeline, n.heartbeat_at, n.expires_at, now)
                        });
                    if !keep {
                        dead.push(w);
                    }
                    keep
                });
            }
        }
        for w in dead {
            if self.groups_of(w).is_empty() {
                self.nodes.remove(&w);
            }
        }
        let groups = mine
            .iter()
            .filter_map(|name| Some(self.groups.get(name)?.beat(&self.nodes, name, node, now)))
            .collect();
        Ok(Heartbeat {
            session,
            new_session,
            observed_at: now,
            expires_at,
            groups,
            unchanged: Vec::new(),
            position: Some(self.timelines.position()),
        })
    }

    /// See [`WorkerStore::join`](lease_core::WorkerStore::join).
    pub fn join(
        &mut self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = store_precision(now);
        let live = live_node(&self.nodes, node, now).is_some_and(|n| n.session == session);
        let g = self.group_mut(group)?;
        if !live {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker: node,
            });
        }
        if let std::collections::btree_map::Entry::Vacant(e) = g.members.entry(node) {
            e.insert(now);
            // A new member row: nothing published under it yet.
            g.work.remove(&node);
        }
        Ok(())
    }

    /// See [`WorkerStore::claim`](lease_core::WorkerStore::claim).
    pub fn claim(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
        now: Timestamp,
    ) -> Result<Vec<Lease>, StoreError> {
        self.take(group, worker, session, Err(want), takeover, now)
    }

    /// A claim of the first `want` claimable buckets in claim order (`Err(want)`), or of the
    /// named ones that are claimable (`Ok(named)`, C12).
    fn take(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        pick: Result<&[Bucket], u32>,
        takeover: Takeover,
        now: Timestamp,
    ) -> Result<Vec<Lease>, StoreError> {
        let now = store_precision(now);
        let nodes = &self.nodes;
        let timelines = &self.timelines;
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })?;
        // C13.
        if let Ok(named) = pick
            && let Some(&bucket) = named.iter().find(|&&b| !g.shards.contains(b))
        {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        let renewed_at = g
            .live_as(nodes, worker, session, now)
            .map(|n| n.heartbeat_at)
            .ok_or_else(|| StoreError::SessionExpired {
                group: group.clone(),
                worker,
            })?;
        // C7: dead sessions' buckets only when the takeover allows it now.
        // C11: a cordoned or draining member claims nothing.
        if g.control(worker).1 != MemberMode::Active {
            return Ok(Vec::new());
        }
        // V2: a quiet period of the longest ttl among the members' sessions.
        let longest = g
            .members
            .keys()
            .filter_map(|w| nodes.get(w))
            .map(|n| n.expires_at - n.heartbeat_at)
            .max()
            .unwrap_or_default();
        if timelines.quiet(now, longest) {
            return Ok(Vec::new());
        }
        let take_dead = takeover.takes_dead(now - renewed_at);
        let effective = if take_dead {
            Takeover::Allowed
        } else {
            Takeover::Deferred
        };
        let (mut claimable, others): (Vec<usize>, Vec<usize>) = g
            .shards
            .claim_order(worker)
            .map(|b| b.0 as usize)
            .filter(|&i| {
                if take_dead {
                    g.live_owner(nodes, &g.buckets[i], now).is_none()
                } else {
                    g.buckets[i].owner.is_none()
                }
            })
            // C10: not under quarantine.
            .filter(|&i| g.buckets[i].quarantined(now).is_none())
            // C8: the resize barrier.
            .filter(|&i| g.parents_retired(nodes, i, now, effective))
            // C12: only the named ones, if any are.
            .filter(|&i| pick.ok().is_none_or(|n| n.contains(&Bucket(i as u32))))
            // C9: the buckets it last held first.
            .partition(|&i| g.buckets[i].last_node == Some(worker));
        claimable.extend(others);
        if let Err(want) = pick {
            claimable.truncate(want as usize);
        }
        claimable.sort_unstable();
        let mut won = Vec::new();
        for i in claimable {
            let b = &mut g.buckets[i];
            // T2: taken from a session that is not live.
            if b.owner.is_some() {
                b.tenures.end(now, EndReason::Expired);
            }
            b.owner = Some((worker, session));
            b.last_node = Some(worker);
            b.token = timelines.next_token(b.token);
            b.tenures.begin(worker, FencingToken(b.token), now);
            won.push(Bucket(i as u32));
        }
        Ok(won
            .into_iter()
            .filter_map(|b| g.lease(nodes, b, worker))
            .collect())
    }

    /// See [`WorkerStore::release`](lease_core::WorkerStore::release).
    pub fn release(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        now: Timestamp,
    ) -> Result<Vec<Bucket>, StoreError> {
        let now = store_precision(now);
        let nodes = &self.nodes;
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })?;
        let old_range = if g.draining(nodes, now) > 0 {
            g.old.len()
        } else {
            0
        };
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
        let mut released: Vec<Bucket> = Vec::new();
        if g.live_as(nodes, worker, session, now).is_none() {
            return Ok(released);
        }
        let mode = g.control(worker).1;
        for &bucket in buckets {
            let i = bucket.0 as usize;
            if g.buckets.get(i).and_then(|b| g.live_owner(nodes, b, now)) == Some(worker) {
                let b = &mut g.buckets[i];
                b.owner = None;
                let reason = EndReason::of_release(b.quarantined(now).is_some(), mode);
                b.tenures.end(now, reason);
                released.push(bucket);
            } else if g.old.get(i).and_then(|b| g.live_owner(nodes, b, now)) == Some(worker) {
                g.old[i].owner = None;
                released.push(bucket);
            }
        }
        released.sort_unstable();
        Ok(released)
    }

    /// See [`WorkerStore::leave`](lease_core::WorkerStore::leave).
    pub fn leave(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: Option<SessionId>,
        now: Timestamp,
    ) -> Result<Vec<Bucket>, StoreError> {
        let now = store_precision(now);
        let nodes = &self.nodes;
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })?;
        let holds = session.is_none_or(|s| nodes.get(&worker).is_some_and(|n| n.session == s));
        if !holds || !g.members.contains_key(&worker) {
            return Ok(Vec::new());
        }
        let released = g.owned_by(nodes, worker, now);
        let reason = match session {
            Some(_) => EndReason::Left,
            None => EndReason::Evicted,
        };
        for b in &released {
            let b = &mut g.buckets[b.0 as usize];
            b.owner = None;
            b.tenures.end(now, reason);
        }
        let old = g.old_owned_by(nodes, worker, now);
        for b in &old {
            g.old[b.0 as usize].owner = None;
        }
        g.members.remove(&worker);
        // L3: a node in no group any more has no session to keep.
        if self.groups_of(worker).is_empty() {
            self.nodes.remove(&worker);
        }
        let mut released = [released, old].concat();
        released.sort_unstable();
        Ok(released)
    }

    /// See [`WorkerStore::is_current`](lease_core::WorkerStore::is_current).
    pub fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
        now: Timestamp,
    ) -> bool {
        let now = store_precision(now);
        let Some(g) = self.groups.get(group) else {
            return false;
        };
        let current = |b: &ModelBucket| {
            b.token == token.0 && g.live_owner(&self.nodes, b, now) == Some(worker)
        };
        // F1: either generation; an old bucket owned live is not retired.
        g.buckets.get(bucket.0 as usize).is_some_and(current)
            || g.old.get(bucket.0 as usize).is_some_and(current)
    }

    /// See [`WorkerStore::hand_over`](lease_core::WorkerStore::hand_over).
    pub fn hand_over(
        &mut self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
        now: Timestamp,
    ) -> Option<Timestamp> {
        let now = store_precision(now);
        let n = self
            .nodes
            .get_mut(&node)
            .filter(|n| now < n.expires_at && n.incarnation == incarnation)?;
        n.expires_at = now + keep.as_chrono();
        n.handed_over = true;
        Some(n.expires_at)
    }
}
