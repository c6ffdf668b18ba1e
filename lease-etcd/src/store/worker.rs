//! [`WorkerStore`] on etcd: each operation the rule of the memory store's [`State`] in the
//! read, rule, write loop; the heartbeat and the hand-over also move etcd leases.
//!
//! [`State`]: lease_rules::State

use async_trait::async_trait;
use lease_core::SessionBound;
use lease_core::{
    Bucket, ChangeFeed, FencingToken, GroupName, GroupStamp, Heartbeat, Incarnation, Lease, Load,
    MemberMetadata, NodeId, Operation, SessionId, ShardCount, StoreError, Takeover, Timestamp, Ttl,
    Weight, WorkerStore,
};

use super::{ATTEMPTS, EtcdLeaseStore, LivePuts, MAX_SHARDS, Scope, lost_races, too_large};
use crate::codec::NodeExtra;

#[async_trait]
impl WorkerStore for EtcdLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        if shards.get() > MAX_SHARDS {
            return Err(too_large(Operation::EnsureGroup, group, shards));
        }
        self.run(Operation::EnsureGroup, Scope::Group(group), true, |s, _| {
            s.ensure_group(group, shards)
        })
        .await
    }

    /// etcd never fails over in the sense of V1-V4 (its writes are committed by a quorum):
    /// `bound` is not read, and no position is given.
    async fn heartbeat_with_bound(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
        _bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError> {
        self.beat(node, incarnation, ttl, metadata, seen).await
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        self.run(Operation::Join, Scope::Group(group), true, |s, now| {
            s.join(now, group, node, session)
        })
        .await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        // Lease mode: etcd ended every dead session by its own timers (a new leader extends
        // every lease), so a session it calls dead is one whose holder's trust ran out.
        let takeover = match (self.leases(), takeover) {
            (true, Takeover::AllowedWithin(_)) => Takeover::Allowed,
            (_, t) => t,
        };
        self.run(Operation::Claim, Scope::Group(group), true, |s, now| {
            s.claim(now, group, worker, session, want, takeover)
        })
        .await
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        // As for claim.
        let takeover = match (self.leases(), takeover) {
            (true, Takeover::AllowedWithin(_)) => Takeover::Allowed,
            (_, t) => t,
        };
        self.run(
            Operation::ClaimBuckets,
            Scope::Group(group),
            true,
            |s, now| s.claim_buckets(now, group, worker, session, buckets, takeover),
        )
        .await
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        self.run(
            Operation::PublishLoads,
            Scope::Group(group),
            true,
            |s, now| s.publish_loads(now, group, worker, session, loads),
        )
        .await
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Release, Scope::Group(group), true, |s, now| {
            s.release(now, group, worker, session, buckets)
        })
        .await
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Leave, Scope::Group(group), true, |s, now| {
            s.leave(now, group, node, Some(session))
        })
        .await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.run(
            Operation::IsCurrent,
            Scope::Group(group),
            false,
            |s, now| s.is_current(now, group, bucket, worker, token),
        )
        .await
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        let op = Operation::HandOver;
        if !self.leases() {
            return self
                .run(op, Scope::Node(node, &[]), true, |s, now| {
                    s.hand_over(now, node, incarnation, keep)
                })
                .await;
        }
        // Lease mode: the session's liveness key moves to a lease of `keep`.
        for _ in 0..ATTEMPTS {
            let now = self.now();
            let loaded = self.load(op, &Scope::Node(node, &[]), now, true).await?;
            let mut state = loaded.state.clone();
            let Some(expires_at) = state.hand_over(now, node, incarnation, keep)? else {
                return Ok(None);
            };
            let old = loaded.extras.get(&node).and_then(|e| e.lease);
            let grant = self.grant(op, keep).await?;
            let mut extras = loaded.extras.clone();
            extras.insert(
                node,
                NodeExtra {
                    lease: Some(grant.id()),
                    ttl: Some(keep.as_micros()),
                },
            );
            let rev = loaded.lives.get(&node).map_or(0, |l| l.1);
            let session = state.nodes.get(&node).map(|r| r.session);
            let lives: LivePuts = session
                .map(|s| vec![(node, s, grant.id(), rev)])
                .unwrap_or_default();
            match self.store(op, &loaded, &state, &extras, &lives).await {
                Ok(true) => {
                    self.forget_lease((node, incarnation));
                    if let Some(old) = old {
                        self.revoke(old).await;
                    }
                    return Ok(Some(expires_at));
                }
                outcome => {
                    self.revoke(grant.id()).await;
                    outcome?;
                }
            }
        }
        Err(lost_races(op))
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        self.feed(group).await
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        self.run(Operation::SetWeight, Scope::Group(group), true, |s, now| {
            s.set_weight(now, group, node, session, weight)
        })
        .await
    }
}
