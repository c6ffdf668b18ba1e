//! The reference model: the store contract as plain, synchronous data manipulation.
//!
//! It is written for obviousness, not speed: every count is recomputed by scanning, time is an
//! argument, and session ids come from a counter. Property tests run it beside real backends
//! and compare every result.

use std::collections::BTreeMap;

use uuid::Uuid;

use lease_core::StoreError;
use lease_core::resize;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, SessionId, ShardCount, Takeover,
    WorkerId,
};
use lease_core::{
    BucketInfo, BucketState, GroupSnapshot, GroupView, Heartbeat, Lease, MemberInfo, MemberLoad,
};
use lease_core::{Generation, ResizeOutcome};
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
    generation: Generation,
    /// The count the current generation was resized from.
    previous: Option<ShardCount>,
    /// The previous generation's buckets (of `previous`), kept after the drain ends; the drain
    /// runs while one of them is not retired (see `draining`).
    old: Vec<ModelBucket>,
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

    /// Z3: an old bucket is retired once released or once its session is not live. With
    /// `Takeover::Deferred` (C8) only a released one counts.
    fn retired(&self, b: &ModelBucket, now: Timestamp, takeover: Takeover) -> bool {
        match takeover {
            Takeover::Deferred => b.owner.is_none(),
            _ => self.live_owner(b, now).is_none(),
        }
    }

    /// How many old buckets are not retired: 0 when no resize drains.
    fn draining(&self, now: Timestamp) -> u32 {
        self.old
            .iter()
            .filter(|b| !self.retired(b, now, Takeover::Allowed))
            .count() as u32
    }

    /// The old generation's buckets `worker` owns, while it drains.
    fn old_owned_by(&self, worker: WorkerId, now: Timestamp) -> Vec<Bucket> {
        self.old
            .iter()
            .enumerate()
            .filter(|(_, b)| self.live_owner(b, now) == Some(worker))
            .map(|(i, _)| Bucket(i as u32))
            .collect()
    }

    /// C8: whether every old bucket new bucket `i` shares keys with is retired.
    fn parents_retired(&self, i: usize, now: Timestamp, takeover: Takeover) -> bool {
        let (Some(from), true) = (self.previous, self.draining(now) > 0) else {
            return true;
        };
        resize::parents(from, self.shards, Bucket(i as u32))
            .iter()
            .all(|p| self.retired(&self.old[p.0 as usize], now, takeover))
    }

    fn lease(&self, bucket: Bucket, worker: WorkerId) -> Option<Lease> {
        let b = &self.buckets[bucket.0 as usize];
        Some(Lease {
            bucket,
            shards: self.shards,
            owner: worker,
            token: FencingToken(b.token),
            expires_at: self.members.get(&worker)?.expires_at,
        })
    }

    fn old_lease(&self, bucket: Bucket, worker: WorkerId) -> Option<Lease> {
        let b = &self.old[bucket.0 as usize];
        Some(Lease {
            bucket,
            shards: self.previous?,
            owner: worker,
            token: FencingToken(b.token),
            expires_at: self.members.get(&worker)?.expires_at,
        })
    }

    fn bucket_info(&self, i: usize, b: &ModelBucket, now: Timestamp) -> BucketInfo {
        let expires_at = b.owner.and_then(|(w, s)| {
            self.members
                .get(&w)
                .filter(|m| m.session == s)
                .map(|m| m.expires_at)
        });
        let state = match (b.owner, self.live_owner(b, now)) {
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
            // E3: the count the group was resized from is accepted too (the caller adopts).
            Some(g) if g.shards == shards || g.previous == Some(shards) => Ok(()),
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
                        generation: Generation::default(),
                        previous: None,
                        old: Vec::new(),
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
        let mut owned: Vec<Lease> = g
            .owned_by(worker, now)
            .into_iter()
            .filter_map(|b| g.lease(b, worker))
            .chain(
                g.old_owned_by(worker, now)
                    .into_iter()
                    .filter_map(|b| g.old_lease(b, worker)),
            )
            .collect();
        owned.sort_by_key(|l| l.bucket);
        let view = GroupView {
            shard_count: g.shards,
            members,
            claimable,
            generation: g.generation,
            previous: g.previous,
            draining: g.draining(now),
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
        let take_dead = takeover.takes_dead(now - renewed_at);
        let effective = if take_dead {
            Takeover::Allowed
        } else {
            Takeover::Deferred
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
            // C8: the resize barrier.
            .filter(|&i| g.parents_retired(i, now, effective))
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
        let old_range = if g.draining(now) > 0 { g.old.len() } else { 0 };
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
        if g.live_as(worker, session, now).is_none() {
            return Ok(released);
        }
        for &bucket in buckets {
            let i = bucket.0 as usize;
            if g.buckets.get(i).and_then(|b| g.live_owner(b, now)) == Some(worker) {
                g.buckets[i].owner = None;
                released.push(bucket);
            } else if g.old.get(i).and_then(|b| g.live_owner(b, now)) == Some(worker) {
                g.old[i].owner = None;
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
        let old = g.old_owned_by(worker, now);
        for b in &old {
            g.old[b.0 as usize].owner = None;
        }
        g.members.remove(&worker);
        let mut released = [released, old].concat();
        released.sort_unstable();
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
            .map(|(i, b)| g.bucket_info(i, b, now))
            .collect();
        let draining = if g.draining(now) > 0 {
            g.old
                .iter()
                .enumerate()
                .map(|(i, b)| g.bucket_info(i, b, now))
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
        let current = |b: &ModelBucket| b.token == token.0 && g.live_owner(b, now) == Some(worker);
        // F1: either generation; an old bucket owned live is not retired.
        g.buckets.get(bucket.0 as usize).is_some_and(current)
            || g.old.get(bucket.0 as usize).is_some_and(current)
    }

    /// See [`LeaseStore::resize`](lease_core::LeaseStore::resize).
    pub fn resize(
        &mut self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
        now: Timestamp,
    ) -> Result<ResizeOutcome, StoreError> {
        let now = store_precision(now);
        let g = self.group_mut(group)?;
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
        let draining = g.draining(now);
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
                owner: None,
                token: resize::parents(from, to, new)
                    .iter()
                    .map(|p| g.buckets[p.0 as usize].token)
                    .max()
                    .unwrap_or(0),
            })
            .collect();
        g.old = std::mem::replace(&mut g.buckets, buckets);
        g.shards = to;
        g.previous = Some(from);
        g.generation = g.generation.next();
        Ok(ResizeOutcome::Started {
            generation: g.generation,
        })
    }
}
