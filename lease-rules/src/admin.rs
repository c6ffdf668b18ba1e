//! What operators read and change: snapshots, nodes, resizes, controls, quarantines, history.

use lease_core::{
    Bucket, BucketInfo, Change, GroupName, GroupSnapshot, MemberInfo, NodeId, NodeInfo,
    NodesSnapshot, ShardCount, StoreError, Timestamp, store_precision,
};
use lease_core::{Load, ResizeOutcome, resize};
use lease_core::{
    MemberControl, QuarantineFor, QuarantineReason, SessionId, Tenure, Tenures, Weight,
};

use crate::rows::*;

impl State {
    /// [`AdminStore::snapshot`](lease_core::AdminStore::snapshot) at the store's time `now`.
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
                    load: m.load,
                    hottest: m.hottest,
                })
            })
            .collect();
        let buckets = g
            .buckets
            .iter()
            .enumerate()
            .map(|(i, row)| g.bucket_info(nodes, i, row, now))
            .collect();
        // Quarantines are of the current generation's buckets only (Q4), and so are loads
        // (P2: the old generation's are not listed).
        let draining = g
            .old
            .iter()
            .enumerate()
            .map(|(i, row)| BucketInfo {
                quarantined_until: None,
                quarantine_reason: None,
                load: Load::ZERO,
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

    /// [`AdminStore::nodes`](lease_core::AdminStore::nodes) at the store's time `now`.
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
                crossed: n.crossed.clone(),
            })
            .collect();
        Ok(NodesSnapshot {
            observed_at: now,
            nodes,
        })
    }

    /// [`AdminStore::resize`](lease_core::AdminStore::resize) at the store's time `now`.
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
        g.quarantine_reasons.clear();
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

    /// [`AdminStore::control`](lease_core::AdminStore::control) (it needs no time).
    pub fn control(
        &mut self,

        group: &GroupName,
        node: NodeId,
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

    /// [`WorkerStore::set_weight`](lease_core::WorkerStore::set_weight) at the store's time
    /// `now`: the node's own weight, only under its live session as a member (K4).
    pub fn set_weight(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        let (nodes, g) = self.split(group)?;
        if !session_live(nodes, node, session, now) || !g.members.contains_key(&node) {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker: node,
            });
        }
        self.control(group, node, MemberControl::Weight(weight))
    }

    /// [`AdminStore::quarantine_with_reason`](lease_core::AdminStore::quarantine_with_reason)
    /// at the store's time `now`.
    pub fn quarantine(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
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
                // Q5: the new quarantine's reason, or none.
                match reason {
                    Some(reason) => g.quarantine_reasons.insert(bucket, reason),
                    None => g.quarantine_reasons.remove(&bucket),
                };
            }
            None => {
                g.quarantines.remove(&bucket);
            }
        }
        let quarantines = &g.quarantines;
        g.quarantine_reasons
            .retain(|b, _| quarantines.contains_key(b));
        g.bump();
        state.notify(group, Change::Controlled);
        Ok(())
    }

    /// [`AdminStore::history`](lease_core::AdminStore::history) (it needs no time).
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
