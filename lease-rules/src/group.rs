//! A group's rules that several operations share: who owns what, what is retired, the view.

use lease_core::Weight;
use lease_core::resize;
use lease_core::{
    Bucket, BucketInfo, BucketState, FencingToken, GroupBeat, GroupName, GroupView, Lease,
    MemberLoad, MemberMode, NodeId, SessionId, Takeover, Timestamp, ViewStamp, list_loaded,
};

use crate::history::History;
use crate::rows::*;

impl GroupState {
    pub(crate) fn bump(&mut self) {
        self.version += 1;
    }

    /// The member row of `node`, if `session` is its node's live session.
    pub(crate) fn live_member_mut(
        &mut self,
        nodes: &Nodes,
        node: NodeId,
        session: SessionId,
        now: Timestamp,
    ) -> Option<&mut MemberRow> {
        self.members
            .get_mut(&node)
            .filter(|_| session_live(nodes, node, session, now))
    }

    /// Owned: recorded under its node's live session, the node a member of the group.
    pub(crate) fn is_owned_live(&self, nodes: &Nodes, row: &BucketRow, now: Timestamp) -> bool {
        row.owner
            .is_some_and(|(w, s)| self.members.contains_key(&w) && session_live(nodes, w, s, now))
    }

    /// Z3: an old bucket is retired once released or once its session is not live; with
    /// `Takeover::Deferred` (C8) only a released one counts.
    pub(crate) fn retired(
        &self,
        nodes: &Nodes,
        row: &BucketRow,
        now: Timestamp,
        takeover: Takeover,
    ) -> bool {
        match takeover {
            Takeover::Deferred => row.owner.is_none(),
            _ => !self.is_owned_live(nodes, row, now),
        }
    }

    /// Old buckets not retired yet; when none is left, the old generation is dropped.
    pub(crate) fn draining(&mut self, nodes: &Nodes, now: Timestamp) -> u32 {
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
    pub(crate) fn parents_retired(
        &self,
        nodes: &Nodes,
        i: usize,
        now: Timestamp,
        takeover: Takeover,
    ) -> bool {
        let Some(from) = self.previous.filter(|_| !self.old.is_empty()) else {
            return true;
        };
        resize::parents(from, self.shards, Bucket(i as u32))
            .iter()
            .all(|p| self.retired(nodes, &self.old[p.0 as usize], now, takeover))
    }

    pub(crate) fn bucket_info(
        &self,
        nodes: &Nodes,
        i: usize,
        row: &BucketRow,
        now: Timestamp,
    ) -> BucketInfo {
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
            quarantine_reason: self
                .quarantined(Bucket(i as u32), now)
                .and_then(|_| self.quarantine_reasons.get(&Bucket(i as u32)).cloned()),
            load: row.load,
        }
    }

    /// K1: a node's weight and mode.
    pub(crate) fn control(&self, node: NodeId) -> (u32, MemberMode) {
        self.controls
            .get(&node)
            .copied()
            .unwrap_or((Weight::DEFAULT.get(), MemberMode::Active))
    }

    /// Q1: when `bucket`'s quarantine ends, if it is under one at `now`.
    pub(crate) fn quarantined(&self, bucket: Bucket, now: Timestamp) -> Option<Timestamp> {
        self.quarantines
            .get(&bucket)
            .copied()
            .filter(|&end| now < end)
    }

    pub(crate) fn live_held(&self, nodes: &Nodes, now: Timestamp) -> usize {
        self.members
            .iter()
            .filter(|(w, _)| node_live(nodes, **w, now))
            .map(|(_, m)| m.held.len())
            .sum()
    }

    /// H3: remove the member rows of nodes whose sessions are dead; the nodes removed.
    /// At most `budget` of them (taken from it); the others wait for a later heartbeat.
    pub(crate) fn remove_dead_members(
        &mut self,
        nodes: &Nodes,
        history: &History,
        now: Timestamp,
        budget: &mut usize,
    ) -> Vec<NodeId> {
        let dead: Vec<NodeId> = self
            .members
            .keys()
            .copied()
            // V4: a session that may still be kept keeps its memberships meanwhile.
            .filter(|w| {
                !node_live(nodes, *w, now)
                    && nodes.get(w).is_none_or(|n| !history.revivable(n, now))
            })
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
    pub(crate) fn beat(
        &self,
        nodes: &Nodes,
        group: &GroupName,
        node: NodeId,
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
                    load: m.load,
                    hottest: m.hottest,
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
                // P4: the claimable buckets' loads, as C2 and C10 say what is claimable.
                loaded: list_loaded(
                    self.buckets
                        .iter()
                        .enumerate()
                        .filter(|&(i, row)| {
                            !self.is_owned_live(nodes, row, now)
                                && self.quarantined(Bucket(i as u32), now).is_none()
                        })
                        .map(|(i, row)| (Bucket(i as u32), row.load)),
                ),
            },
            owned,
            stamp: ViewStamp::new(self.version, until),
            quarantined: own_quarantined,
        }
    }
}
