//! The reference model: the store contract as plain, synchronous data manipulation.
//!
//! It is written for obviousness, not speed: every count is recomputed by scanning, time is an
//! argument, and session ids come from a counter. Property tests run it beside real backends
//! and compare every result.

use std::collections::BTreeMap;

use uuid::Uuid;

use lease_core::StoreError;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, SessionId, ShardCount, Takeover,
    WorkerId,
};
use lease_core::{
    BucketInfo, BucketState, GroupSnapshot, GroupView, Heartbeat, Lease, MemberInfo, MemberLoad,
};
use lease_core::{Timestamp, Ttl, store_precision};

#[derive(Clone, Debug)]
struct ModelBucket {
    owner: Option<(WorkerId, SessionId)>,
    token: i64,
}

#[derive(Clone, Debug)]
struct ModelMember {
    session: SessionId,
    incarnation: Incarnation,
    joined_at: Timestamp,
    heartbeat_at: Timestamp,
    expires_at: Timestamp,
    metadata: MemberMetadata,
}

#[derive(Clone, Debug)]
struct ModelGroup {
    shards: ShardCount,
    buckets: Vec<ModelBucket>,
    members: BTreeMap<WorkerId, ModelMember>,
}

impl ModelGroup {
    /// The live session of `worker` at `now`, if any.
    fn live_session(&self, worker: WorkerId, now: Timestamp) -> Option<&ModelMember> {
        self.members.get(&worker).filter(|m| now < m.expires_at)
    }

    /// `session`, if it is `worker`'s live session at `now`.
    fn live_as(
        &self,
        worker: WorkerId,
        session: SessionId,
        now: Timestamp,
    ) -> Option<&ModelMember> {
        self.live_session(worker, now)
            .filter(|m| m.session == session)
    }

    /// Whether bucket `b` is owned by a live session at `now`.
    fn live_owner(&self, b: &ModelBucket, now: Timestamp) -> Option<WorkerId> {
        let (w, s) = b.owner?;
        let m = self.live_session(w, now)?;
        (m.session == s).then_some(w)
    }

    fn owned_by(&self, worker: WorkerId, now: Timestamp) -> Vec<Bucket> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, b)| self.live_owner(b, now) == Some(worker))
            .map(|(i, _)| Bucket(i as u32))
            .collect()
    }

    fn lease(&self, bucket: Bucket, worker: WorkerId) -> Option<Lease> {
        let b = &self.buckets[bucket.0 as usize];
        Some(Lease {
            bucket,
            owner: worker,
            token: FencingToken(b.token),
            expires_at: self.members.get(&worker)?.expires_at,
        })
    }
}

/// The reference model of a [`LeaseStore`](lease_core::LeaseStore). Cloning it forks the state.
#[derive(Clone, Debug, Default)]
pub struct Model {
    groups: BTreeMap<GroupName, ModelGroup>,
    sessions_minted: u128,
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

    /// See [`LeaseStore::ensure_group`](lease_core::LeaseStore::ensure_group).
    pub fn ensure_group(
        &mut self,
        group: &GroupName,
        shards: ShardCount,
    ) -> Result<(), StoreError> {
        match self.groups.get(group) {
            Some(g) if g.shards == shards => Ok(()),
            Some(g) => Err(StoreError::ShardCountMismatch {
                group: group.clone(),
                configured: shards,
                found: g.shards,
            }),
            None => {
                let buckets = shards
                    .buckets()
                    .map(|_| ModelBucket {
                        owner: None,
                        token: 0,
                    })
                    .collect();
                self.groups.insert(
                    group.clone(),
                    ModelGroup {
                        shards,
                        buckets,
                        members: BTreeMap::new(),
                    },
                );
                Ok(())
            }
        }
    }

    /// See [`LeaseStore::heartbeat`](lease_core::LeaseStore::heartbeat).
    pub fn heartbeat(
        &mut self,
        group: &GroupName,
        worker: WorkerId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        now: Timestamp,
    ) -> Result<Heartbeat, StoreError> {
        let now = store_precision(now);
        let next_session = SessionId::from_uuid(Uuid::from_u128(self.sessions_minted + 1));
        let g = self.group_mut(group)?;
        if let Some(m) = g
            .live_session(worker, now)
            .filter(|m| m.incarnation != incarnation)
        {
            return Err(StoreError::WorkerIdInUse {
                group: group.clone(),
                worker,
                expires_at: m.expires_at,
            });
        }
        let expires_at = now + ttl.as_chrono();
        let live = g.live_session(worker, now).is_some();
        let new_session = !live;
        g.members.retain(|&w, m| w == worker || now < m.expires_at);
        if let Some(m) = g.members.get_mut(&worker).filter(|_| live) {
            m.expires_at = expires_at;
            m.heartbeat_at = now;
            m.metadata = metadata.clone();
        } else {
            g.members.insert(
                worker,
                ModelMember {
                    session: next_session,
                    incarnation,
                    joined_at: now,
                    heartbeat_at: now,
                    expires_at,
                    metadata: metadata.clone(),
                },
            );
        }
        let session = g.members[&worker].session;
        let members: Vec<MemberLoad> = g
            .members
            .iter()
            .filter(|(_, m)| now < m.expires_at)
            .map(|(&w, _)| MemberLoad {
                worker: w,
                owned: g.owned_by(w, now).len() as u32,
            })
            .collect();
        let claimable = g
            .buckets
            .iter()
            .filter(|b| g.live_owner(b, now).is_none())
            .count() as u32;
        let owned = g
            .owned_by(worker, now)
            .into_iter()
            .filter_map(|b| g.lease(b, worker))
            .collect();
        let view = GroupView {
            shard_count: g.shards,
            members,
            claimable,
        };
        if new_session {
            self.sessions_minted += 1;
        }
        Ok(Heartbeat {
            session,
            new_session,
            observed_at: now,
            expires_at,
            view,
            owned,
        })
    }

    /// See [`LeaseStore::claim`](lease_core::LeaseStore::claim).
    pub fn claim(
        &mut self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
        now: Timestamp,
    ) -> Result<Vec<Lease>, StoreError> {
        let now = store_precision(now);
        let g = self.group_mut(group)?;
        let (session, renewed_at) = g
            .live_as(worker, session, now)
            .map(|m| (m.session, m.heartbeat_at))
            .ok_or_else(|| StoreError::SessionExpired {
                group: group.clone(),
                worker,
            })?;
        // C7: dead sessions' buckets only when the takeover allows it now.
        let take_dead = match takeover {
            Takeover::Deferred => false,
            Takeover::AllowedWithin(d) => (now - renewed_at).to_std().map_or(true, |s| s <= d),
            _ => true,
        };
        let mut claimable: Vec<usize> = g
            .shards
            .claim_order(worker)
            .map(|b| b.0 as usize)
            .filter(|&i| {
                if take_dead {
                    g.live_owner(&g.buckets[i], now).is_none()
                } else {
                    g.buckets[i].owner.is_none()
                }
            })
            .take(want as usize)
            .collect();
        claimable.sort_unstable();
        let mut won = Vec::new();
        for i in claimable {
            let b = &mut g.buckets[i];
            b.owner = Some((worker, session));
            b.token += 1;
            won.push(Bucket(i as u32));
        }
        Ok(won.into_iter().filter_map(|b| g.lease(b, worker)).collect())
    }

    /// See [`LeaseStore::release`](lease_core::LeaseStore::release).
    pub fn release(
        &mut self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        buckets: &[Bucket],
        now: Timestamp,
    ) -> Result<Vec<Bucket>, StoreError> {
        let now = store_precision(now);
        let g = self.group_mut(group)?;
        if let Some(&bucket) = buckets.iter().find(|&&b| !g.shards.contains(b)) {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        let mut released: Vec<Bucket> = Vec::new();
        if g.live_as(worker, session, now).is_none() {
            return Ok(released);
        }
        for &bucket in buckets {
            let i = bucket.0 as usize;
            if g.live_owner(&g.buckets[i], now) == Some(worker) {
                g.buckets[i].owner = None;
                released.push(bucket);
            }
        }
        released.sort_unstable();
        Ok(released)
    }

    /// See [`LeaseStore::leave`](lease_core::LeaseStore::leave).
    pub fn leave(
        &mut self,
        group: &GroupName,
        worker: WorkerId,
        session: Option<SessionId>,
        now: Timestamp,
    ) -> Result<Vec<Bucket>, StoreError> {
        let now = store_precision(now);
        let g = self.group_mut(group)?;
        let holds = |m: &ModelMember| session.is_none_or(|s| s == m.session);
        if !g.members.get(&worker).is_some_and(holds) {
            return Ok(Vec::new());
        }
        let released = g.owned_by(worker, now);
        for b in &released {
            g.buckets[b.0 as usize].owner = None;
        }
        g.members.remove(&worker);
        Ok(released)
    }

    /// See [`LeaseStore::snapshot`](lease_core::LeaseStore::snapshot).
    pub fn snapshot(&self, group: &GroupName, now: Timestamp) -> Result<GroupSnapshot, StoreError> {
        let now = store_precision(now);
        let g = self.group(group)?;
        let members = g
            .members
            .iter()
            .map(|(&w, m)| {
                let live = now < m.expires_at;
                MemberInfo {
                    worker: w,
                    session: m.session,
                    joined_at: m.joined_at,
                    heartbeat_at: m.heartbeat_at,
                    expires_at: m.expires_at,
                    live,
                    owned: g.owned_by(w, now).len() as u32,
                    metadata: m.metadata.clone(),
                }
            })
            .collect();
        let buckets = g
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let expires_at = b.owner.and_then(|(w, s)| {
                    g.members
                        .get(&w)
                        .filter(|m| m.session == s)
                        .map(|m| m.expires_at)
                });
                let state = match (b.owner, g.live_owner(b, now)) {
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
                }
            })
            .collect();
        Ok(GroupSnapshot {
            group: group.clone(),
            shard_count: g.shards,
            observed_at: now,
            members,
            buckets,
        })
    }

    /// See [`LeaseStore::is_current`](lease_core::LeaseStore::is_current).
    pub fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: WorkerId,
        token: FencingToken,
        now: Timestamp,
    ) -> bool {
        let now = store_precision(now);
        let Some(g) = self.groups.get(group) else {
            return false;
        };
        g.buckets
            .get(bucket.0 as usize)
            .is_some_and(|b| b.token == token.0 && g.live_owner(b, now) == Some(worker))
    }
}
