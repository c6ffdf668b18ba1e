//! The model's operators' side: snapshots, the node listing, resizes, controls, weights, a
//! bucket's history and quarantines, each as plain data manipulation (see the parent module).

use super::*;

impl Model {
    /// See [`AdminStore::snapshot`](lease_core::AdminStore::snapshot).
    pub fn snapshot(&self, group: &GroupName, now: Timestamp) -> Result<GroupSnapshot, StoreError> {
        let now = store_precision(now);
        let g = self.group(group)?;
        let nodes = &self.nodes;
        let members = g
            .members
            .iter()
            .filter_map(|(&w, &joined_at)| {
                let n = nodes.get(&w)?;
                let live = now < n.expires_at;
                let (weight, mode) = g.control(w);
                Some(MemberInfo {
                    worker: w,
                    session: n.session,
                    joined_at,
                    heartbeat_at: n.heartbeat_at,
                    expires_at: n.expires_at,
                    live,
                    owned: g.owned_by(nodes, w, now).len() as u32,
                    metadata: n.metadata.clone(),
                    weight,
                    mode,
                    load: g.work.get(&w).map_or(0, |w| w.0),
                    hottest: g.work.get(&w).map_or(Load::ZERO, |w| w.1),
                })
            })
            .collect();
        let buckets = g
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| g.bucket_info(nodes, i, b, now))
            .collect();
        let draining = if g.draining(nodes, now) > 0 {
            g.old
                .iter()
                .enumerate()
                .map(|(i, b)| g.bucket_info(nodes, i, b, now))
                .collect()
        } else {
            Vec::new()
        };
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

    /// See [`AdminStore::nodes`](lease_core::AdminStore::nodes).
    pub fn nodes(&self, now: Timestamp) -> NodesSnapshot {
        let now = store_precision(now);
        NodesSnapshot {
            observed_at: now,
            nodes: self
                .nodes
                .iter()
                .map(|(&node, n)| NodeInfo {
                    node,
                    session: n.session,
                    started_at: n.started_at,
                    heartbeat_at: n.heartbeat_at,
                    expires_at: n.expires_at,
                    live: now < n.expires_at,
                    metadata: n.metadata.clone(),
                    groups: self.groups_of(node),
                    handed_over: n.handed_over,
                    crossed: n.crossed.clone(),
                })
                .collect(),
        }
    }

    /// See [`AdminStore::resize`](lease_core::AdminStore::resize).
    pub fn resize(
        &mut self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
        now: Timestamp,
    ) -> Result<ResizeOutcome, StoreError> {
        let now = store_precision(now);
        let nodes = &self.nodes;
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })?;
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
            .map(|new| ModelBucket {
                token: resize::parents(from, to, new)
                    .iter()
                    .map(|p| g.buckets[p.0 as usize].token)
                    .max()
                    .unwrap_or(0),
                ..ModelBucket::default()
            })
            .collect();
        g.old = std::mem::replace(&mut g.buckets, buckets);
        // Q4: a resize lifts every quarantine; T4: and clears the history.
        for b in &mut g.old {
            b.quarantine = None;
            b.quarantine_reason = None;
            b.tenures = Tenures::default();
        }
        g.shards = to;
        g.previous = Some(from);
        g.generation = g.generation.next();
        Ok(ResizeOutcome::Started {
            generation: g.generation,
        })
    }

    /// See [`AdminStore::control`](lease_core::AdminStore::control).
    pub fn control(
        &mut self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        let g = self.group_mut(group)?;
        // K2: a member, or a node controlled before.
        if !g.members.contains_key(&node) && !g.controls.contains_key(&node) {
            return Err(StoreError::NotAMember {
                group: group.clone(),
                worker: node,
            });
        }
        let next = control.apply(g.control(node));
        // K3: the value stored already writes nothing (not even a control at the defaults).
        if next != g.control(node) {
            g.controls.insert(node, next);
        }
        Ok(())
    }

    /// See [`WorkerStore::set_weight`](lease_core::WorkerStore::set_weight): K4, the node's
    /// own weight, only under its live session as a member, then as [`control`](Self::control).
    pub fn set_weight(
        &mut self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = store_precision(now);
        let live = live_node(&self.nodes, node, now).is_some_and(|n| n.session == session);
        let g = self.group_mut(group)?;
        if !live || !g.members.contains_key(&node) {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker: node,
            });
        }
        self.control(group, node, MemberControl::Weight(weight))
    }

    /// See [`AdminStore::history`](lease_core::AdminStore::history).
    pub fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        let g = self.group(group)?;
        g.buckets
            .get(bucket.0 as usize)
            .map(|b| b.tenures.to_vec())
            .ok_or_else(|| StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            })
    }

    /// See [`AdminStore::quarantine_with_reason`](lease_core::AdminStore::quarantine_with_reason).
    pub fn quarantine(
        &mut self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
        now: Timestamp,
    ) -> Result<(), StoreError> {
        let now = store_precision(now);
        let g = self.group_mut(group)?;
        let shard_count = g.shards;
        let Some(b) = g.buckets.get_mut(bucket.0 as usize) else {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count,
            });
        };
        b.quarantine = duration.map(|d| store_precision(now + d.as_chrono()));
        // Q5: a quarantine's reason is the one it was set with; a lift takes it away.
        b.quarantine_reason = duration.and(reason);
        Ok(())
    }
}
