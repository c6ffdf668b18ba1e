//! Sessions and memberships: heartbeats, joins, leaves and hand-overs (H, J, L, HO).

use std::collections::{BTreeMap, BTreeSet};

use lease_core::EndReason;
use lease_core::Generation;
use lease_core::{
    BackendFailure, Bucket, Change, GroupName, GroupStamp, Heartbeat, Incarnation, Load,
    MemberMetadata, NodeId, Operation, SessionBound, SessionId, ShardCount, StoreError, Timestamp,
    Ttl,
};

use crate::history::KEPT;
use crate::rows::*;

impl State {
    /// [`WorkerStore::ensure_group`](lease_core::WorkerStore::ensure_group) (it needs no time).
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
                        quarantine_reasons: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// [`WorkerStore::heartbeat_with_bound`](lease_core::WorkerStore::heartbeat_with_bound) at
    /// the store's time `now`.
    #[allow(clippy::too_many_arguments)]
    pub fn heartbeat(
        &mut self,
        now: Timestamp,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
        bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError> {
        let state = self;
        let timeline = state.history.timeline;
        // H7 on this timeline only: a session of an earlier one is never extended but by V4.
        if let Some(other) = state.nodes.get(&node).filter(|n| {
            n.is_live(now)
                && n.incarnation != incarnation
                && !n.handed_over
                && n.timeline == timeline
        }) {
            return Err(StoreError::NodeIdInUse {
                worker: node,
                expires_at: other.expires_at,
            });
        }
        // V4: a session of an earlier timeline, at its first heartbeat on this one, is kept
        // or ends (V1); the timeline is recorded first, with its switch point.
        let crossed = match state.nodes.get(&node) {
            Some(row) if row.timeline != timeline => {
                state.history.record(now);
                Some(state.history.crossing(row, incarnation, now, bound))
            }
            _ => None,
        };
        let kept = crossed.as_deref() == Some(KEPT);
        let expires_at = now + ttl.as_chrono();
        // A session kept may have expired during the promotion (V4); otherwise a new session
        // when none is live (H2) or the failover ended it (V1).
        let new_session = !kept && (!node_live(&state.nodes, node, now) || crossed.is_some());
        let mut budget = state.removal_budget.unwrap_or(usize::MAX);
        if new_session {
            // The first heartbeat on a timeline records it (V2), whoever makes it.
            state.history.record(now);
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
                    timeline,
                    crossed: crossed.clone(),
                },
            );
            // H9: dead nodes in no group go (within the budget; the others at later ones).
            let gone: Vec<NodeId> = state
                .nodes
                .iter()
                .filter(|&(&w, n)| {
                    w != node
                        && !n.is_live(now)
                        && n.groups.is_empty()
                        && !state.history.revivable(n, now)
                })
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
            if kept {
                me.timeline = timeline;
                me.crossed = crossed;
            }
            me.session
        };
        let mut groups = Vec::new();
        let mut unchanged = Vec::new();
        let mut dead_nodes: BTreeSet<NodeId> = BTreeSet::new();
        let history = state.history.clone();
        for name in state.groups_of(node) {
            let (nodes, g) = state.split(&name)?;
            let dead = g.remove_dead_members(nodes, &history, now, &mut budget);
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
            position: state.history.position(),
        })
    }

    /// [`WorkerStore::join`](lease_core::WorkerStore::join) at the store's time `now`.
    pub fn join(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        node: NodeId,
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
                load: 0,
                hottest: Load::ZERO,
            },
        );
        g.bump();
        if let Some(n) = state.nodes.get_mut(&node) {
            n.groups.insert(group.clone());
        }
        state.notify(group, Change::Joined(node));
        Ok(())
    }

    /// [`WorkerStore::leave`](lease_core::WorkerStore::leave) (`Some(session)`) or
    /// [`AdminStore::evict`](lease_core::AdminStore::evict) (`None`) at the store's time `now`.
    pub fn leave(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
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

    /// [`WorkerStore::hand_over`](lease_core::WorkerStore::hand_over) at the store's time `now`.
    pub fn hand_over(
        &mut self,
        now: Timestamp,
        node: NodeId,
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
}
