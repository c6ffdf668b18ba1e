//! [`AdminStore`] on etcd: what an operator reads and changes, each in the read, rule, write
//! loop; in lease mode the times shown are the etcd leases'.

use std::collections::BTreeSet;

use async_trait::async_trait;
use lease_core::{
    AdminStore, Bucket, GroupName, GroupSnapshot, MemberControl, NodeId, NodesSnapshot, Operation,
    QuarantineFor, QuarantineReason, ResizeOutcome, ShardCount, StoreError, Tenure,
};

use super::{EtcdLeaseStore, MAX_SHARDS, Scope, too_large};

#[async_trait]
impl AdminStore for EtcdLeaseStore {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        let op = Operation::Snapshot;
        let now = self.now();
        let loaded = self.load(op, &Scope::Group(group), now, true).await?;
        let mut snap = loaded.state.clone().snapshot(now, group)?;
        if self.leases() {
            let shown: BTreeSet<NodeId> = snap
                .members
                .iter()
                .map(|m| m.worker)
                .chain(snap.buckets.iter().filter_map(|b| b.owner))
                .chain(snap.draining.iter().filter_map(|b| b.owner))
                .collect();
            let times = self
                .lease_times(op, &loaded, now, |w| shown.contains(&w))
                .await?;
            for m in &mut snap.members {
                if let Some(&(renewed, expires)) = times.get(&m.worker) {
                    (m.heartbeat_at, m.expires_at) = (renewed, expires);
                }
            }
            for b in snap.buckets.iter_mut().chain(snap.draining.iter_mut()) {
                if let (Some(owner), Some(expires)) = (b.owner, b.expires_at.as_mut())
                    && let Some(&(_, at)) = times.get(&owner)
                {
                    *expires = at;
                }
            }
        }
        Ok(snap)
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        let op = Operation::Nodes;
        let now = self.now();
        let loaded = self.load(op, &Scope::Nodes, now, true).await?;
        let mut nodes = loaded.state.clone().nodes(now)?;
        if self.leases() {
            let times = self.lease_times(op, &loaded, now, |_| true).await?;
            for n in &mut nodes.nodes {
                if let Some(&(renewed, expires)) = times.get(&n.node) {
                    (n.heartbeat_at, n.expires_at) = (renewed, expires);
                }
            }
        }
        Ok(nodes)
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        self.run(Operation::Resize, Scope::Group(group), true, |s, now| {
            // Z1's refusals come first; only a resize that would start is too large.
            let outcome = s.resize(now, group, from, to)?;
            if to.get() > MAX_SHARDS && matches!(outcome, ResizeOutcome::Started { .. }) {
                return Err(too_large(Operation::Resize, group, to));
            }
            Ok(outcome)
        })
        .await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.run(Operation::Control, Scope::Group(group), true, |s, _| {
            s.control(group, node, control)
        })
        .await
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        self.run(
            Operation::Quarantine,
            Scope::Group(group),
            true,
            |s, now| s.quarantine(now, group, bucket, duration, reason.clone()),
        )
        .await
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        self.run(Operation::History, Scope::Group(group), false, |s, _| {
            s.history(group, bucket)
        })
        .await
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Evict, Scope::Group(group), true, |s, now| {
            s.leave(now, group, node, None)
        })
        .await
    }
}
