//! `lease-memory`: the in-memory backend of the lease engine, and the executable
//! specification of the [`LeaseStore`] contract.
//!
//! Every rule of the contract written on [`LeaseStore`] is implemented here in plain Rust
//! behind one mutex, and checked by the same conformance suite the Postgres backend runs. Use
//! it for unit tests, demos and single-process deployments; its state lives and dies with the
//! process.
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{
//!     GroupName, Incarnation, LeaseStore, ManualClock, MemberMetadata, ShardCount, Takeover, Ttl,
//!     WorkerId,
//! };
//! use lease_memory::MemoryLeaseStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let clock = ManualClock::new();
//! let store = MemoryLeaseStore::with_clock(clock.clone());
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(4)?).await?;
//!
//! let (a, b) = (WorkerId::new(), WorkerId::new());
//! let ttl = Ttl::from_secs(10)?;
//! let none = MemberMetadata::empty();
//! let sa = store.heartbeat(&group, a, Incarnation::new(), ttl, &none).await?.session;
//! let won = store.claim(&group, a, sa, 4, Takeover::Allowed).await?;
//! assert_eq!(won.len(), 4);
//!
//! // b cannot take a live lease...
//! let b_process = Incarnation::new();
//! let sb = store.heartbeat(&group, b, b_process, ttl, &none).await?.session;
//! assert!(store.claim(&group, b, sb, 4, Takeover::Allowed).await?.is_empty());
//!
//! // ...but once a stops renewing and its session expires, b takes over with higher tokens.
//! clock.advance(Duration::from_secs(10));
//! let sb = store.heartbeat(&group, b, b_process, ttl, &none).await?.session;
//! let taken = store.claim(&group, b, sb, 4, Takeover::Allowed).await?;
//! assert_eq!(taken.len(), 4);
//! assert!(taken.iter().zip(&won).all(|(new, old)| new.token > old.token));
//! assert!(!store.is_current(&group, won[0].bucket, a, won[0].token).await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

#![warn(missing_docs)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures_util::StreamExt;
use lease_core::{
    BackendFailure, Bucket, BucketInfo, BucketState, Change, ChangeFeed, Clock, FencingToken,
    GroupName, GroupSnapshot, GroupView, Heartbeat, Incarnation, Lease, LeaseStore, MemberInfo,
    MemberLoad, MemberMetadata, Operation, SessionId, ShardCount, StoreError, SystemClock,
    Takeover, Timestamp, Ttl, WorkerId, store_precision,
};
use lease_core::{Generation, ResizeOutcome, resize};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

/// How many unread changes a feed buffers before reporting [`Change::Missed`].
const FEED_CAPACITY: usize = 256;

#[derive(Debug)]
struct BucketRow {
    owner: Option<(WorkerId, SessionId)>,
    token: i64,
}

#[derive(Debug)]
struct MemberRow {
    session: SessionId,
    /// The worker start that began `session`: the only one that may extend it.
    incarnation: Incarnation,
    joined_at: Timestamp,
    heartbeat_at: Timestamp,
    expires_at: Timestamp,
    metadata: MemberMetadata,
    /// Buckets of the current generation recorded under `session`. Exact while the session
    /// is live: a bucket leaves a live session only by release or leave, both of which update
    /// this set.
    held: BTreeSet<Bucket>,
    /// Buckets of the draining generation recorded under `session` (moved here from `held`
    /// by a resize); exact the same way.
    held_old: BTreeSet<Bucket>,
}

impl MemberRow {
    fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }
}

#[derive(Debug)]
struct GroupState {
    shards: ShardCount,
    buckets: Vec<BucketRow>,
    members: BTreeMap<WorkerId, MemberRow>,
    generation: Generation,
    /// The count the current generation was resized from.
    previous: Option<ShardCount>,
    /// The previous generation's rows (of `previous` buckets) while it may drain; emptied by
    /// the first operation that finds every one retired.
    old: Vec<BucketRow>,
}

impl GroupState {
    fn live_member(&self, worker: WorkerId, now: Timestamp) -> Option<&MemberRow> {
        self.members.get(&worker).filter(|m| m.is_live(now))
    }

    /// The member row of `worker`, if `session` is its live session.
    fn live_session_mut(
        &mut self,
        worker: WorkerId,
        session: SessionId,
        now: Timestamp,
    ) -> Option<&mut MemberRow> {
        self.members
            .get_mut(&worker)
            .filter(|m| m.is_live(now) && m.session == session)
    }

    fn is_owned_live(&self, row: &BucketRow, now: Timestamp) -> bool {
        row.owner.is_some_and(|(w, s)| {
            self.live_member(w, now)
                .is_some_and(|member| member.session == s)
        })
    }

    /// Z3: an old bucket is retired once released or once its session is not live; with
    /// `Takeover::Deferred` (C8) only a released one counts.
    fn retired(&self, row: &BucketRow, now: Timestamp, takeover: Takeover) -> bool {
        match takeover {
            Takeover::Deferred => row.owner.is_none(),
            _ => !self.is_owned_live(row, now),
        }
    }

    /// Old buckets not retired yet; when none is left, the old generation is dropped.
    fn draining(&mut self, now: Timestamp) -> u32 {
        let n = self
            .old
            .iter()
            .filter(|row| !self.retired(row, now, Takeover::Allowed))
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
    fn parents_retired(&self, i: usize, now: Timestamp, takeover: Takeover) -> bool {
        let Some(from) = self.previous.filter(|_| !self.old.is_empty()) else {
            return true;
        };
        resize::parents(from, self.shards, Bucket(i as u32))
            .iter()
            .all(|p| self.retired(&self.old[p.0 as usize], now, takeover))
    }

    fn bucket_info(&self, i: usize, row: &BucketRow, now: Timestamp) -> BucketInfo {
        let member = row
            .owner
            .and_then(|(w, s)| self.members.get(&w).filter(|m| m.session == s));
        let state = match (row.owner, member) {
            (None, _) => BucketState::Unowned,
            (Some(_), Some(m)) if m.is_live(now) => BucketState::Live,
            (Some(_), _) => BucketState::Expired,
        };
        BucketInfo {
            bucket: Bucket(i as u32),
            owner: row.owner.map(|(w, _)| w),
            session: row.owner.map(|(_, s)| s),
            token: FencingToken(row.token),
            expires_at: member.map(|m| m.expires_at),
            state,
        }
    }

    fn live_held(&self, now: Timestamp) -> usize {
        self.members
            .values()
            .filter(|m| m.is_live(now))
            .map(|m| m.held.len())
            .sum()
    }
}

#[derive(Debug, Default)]
struct State {
    groups: HashMap<GroupName, GroupState>,
    feeds: HashMap<GroupName, broadcast::Sender<Change>>,
}

impl State {
    fn group_mut(&mut self, group: &GroupName) -> Result<&mut GroupState, StoreError> {
        self.groups.get_mut(group).ok_or_else(|| not_found(group))
    }

    fn notify(&self, group: &GroupName, change: Change) {
        if let Some(tx) = self.feeds.get(group) {
            // No receiver left is not an error: wake-ups are hints for whoever listens.
            tx.send(change).ok();
        }
    }
}

fn not_found(group: &GroupName) -> StoreError {
    StoreError::GroupNotFound {
        group: group.clone(),
    }
}

/// The in-memory [`LeaseStore`]. Cheap to clone: clones share the same state.
#[derive(Clone, Debug)]
pub struct MemoryLeaseStore {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

impl Default for MemoryLeaseStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryLeaseStore {
    /// A store deciding expiry by the host's wall clock.
    pub fn new() -> Self {
        Self::with_clock(SystemClock)
    }

    /// A store deciding expiry by `clock` (a [`lease_core::ManualClock`] in tests).
    pub fn with_clock(clock: impl Clock + 'static) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            clock: Arc::new(clock),
        }
    }

    fn lock(&self, op: Operation) -> Result<(MutexGuard<'_, State>, Timestamp), StoreError> {
        let guard = self.state.lock().map_err(|_| {
            StoreError::backend_detail(
                op,
                BackendFailure::Corrupt,
                "the memory store's state was poisoned by a panic in another thread",
            )
        })?;
        // Read the clock under the lock, so operations are ordered as their times are.
        Ok((guard, store_precision(self.clock.now())))
    }
}

#[async_trait]
impl LeaseStore for MemoryLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        let (mut state, _now) = self.lock(Operation::EnsureGroup)?;
        match state.groups.get(group) {
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
                    .map(|_| BucketRow {
                        owner: None,
                        token: 0,
                    })
                    .collect();
                state.groups.insert(
                    group.clone(),
                    GroupState {
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

    async fn heartbeat(
        &self,
        group: &GroupName,
        worker: WorkerId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
    ) -> Result<Heartbeat, StoreError> {
        let (mut state, now) = self.lock(Operation::Heartbeat)?;
        let g = state.group_mut(group)?;
        if let Some(other) = g
            .live_member(worker, now)
            .filter(|m| m.incarnation != incarnation)
        {
            return Err(StoreError::WorkerIdInUse {
                group: group.clone(),
                worker,
                expires_at: other.expires_at,
            });
        }
        let expires_at = now + ttl.as_chrono();
        let new_session = g.live_member(worker, now).is_none();
        g.members.retain(|&w, m| w == worker || m.is_live(now));
        if new_session {
            g.members.insert(
                worker,
                MemberRow {
                    session: SessionId::new(),
                    incarnation,
                    joined_at: now,
                    heartbeat_at: now,
                    expires_at,
                    metadata: metadata.clone(),
                    held: BTreeSet::new(),
                    held_old: BTreeSet::new(),
                },
            );
        }
        let g = state.group_mut(group)?;
        let draining = g.draining(now);
        let me = g.members.get_mut(&worker).ok_or_else(|| {
            StoreError::backend_detail(
                Operation::Heartbeat,
                BackendFailure::Corrupt,
                "the memory store lost a member row it had just written",
            )
        })?;
        me.expires_at = expires_at;
        me.heartbeat_at = now;
        me.metadata = metadata.clone();
        let session = me.session;
        let mut owned: Vec<Lease> = me
            .held
            .iter()
            .map(|&bucket| Lease {
                bucket,
                shards: g.shards,
                owner: worker,
                token: FencingToken(g.buckets[bucket.0 as usize].token),
                expires_at,
            })
            .chain(me.held_old.iter().filter_map(|&bucket| {
                Some(Lease {
                    bucket,
                    shards: g.previous?,
                    owner: worker,
                    token: FencingToken(g.old.get(bucket.0 as usize)?.token),
                    expires_at,
                })
            }))
            .collect();
        owned.sort_by_key(|l| l.bucket);
        let members = g
            .members
            .iter()
            .filter(|(_, m)| m.is_live(now))
            .map(|(&w, m)| MemberLoad {
                worker: w,
                owned: m.held.len() as u32,
            })
            .collect();
        let claimable = (g.shards.get() as usize - g.live_held(now)) as u32;
        let view = GroupView {
            shard_count: g.shards,
            members,
            claimable,
            generation: g.generation,
            previous: g.previous,
            draining,
        };
        if new_session {
            state.notify(group, Change::Joined(worker));
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

    async fn claim(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        let (mut state, now) = self.lock(Operation::Claim)?;
        let g = state.group_mut(group)?;
        g.draining(now);
        let (expires_at, renewed_at) = g
            .live_session_mut(worker, session, now)
            .map(|m| (m.expires_at, m.heartbeat_at))
            .ok_or_else(|| StoreError::SessionExpired {
                group: group.clone(),
                worker,
            })?;
        let take_dead = takeover.takes_dead(now - renewed_at);
        let effective = if take_dead {
            Takeover::Allowed
        } else {
            Takeover::Deferred
        };
        let mut picked: Vec<usize> = g
            .shards
            .claim_order(worker)
            .map(|b| b.0 as usize)
            .filter(|&i| {
                if take_dead {
                    !g.is_owned_live(&g.buckets[i], now)
                } else {
                    g.buckets[i].owner.is_none()
                }
            })
            // C8: the resize barrier, with the takeover C7 allows now.
            .filter(|&i| g.parents_retired(i, now, effective))
            .take(want as usize)
            .collect();
        picked.sort_unstable();
        let mut won = Vec::with_capacity(picked.len());
        for i in picked {
            let bucket = Bucket(i as u32);
            let previous = g.buckets[i].owner.replace((worker, session));
            // The previous session is dead; keep its member row's set honest for snapshots.
            if let Some((w, s)) = previous
                && let Some(m) = g.members.get_mut(&w).filter(|m| m.session == s)
            {
                m.held.remove(&bucket);
            }
            g.buckets[i].token += 1;
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
        Ok(won)
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        let (mut state, now) = self.lock(Operation::Release)?;
        let g = state.group_mut(group)?;
        g.draining(now);
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
        let Some(me) = g.live_session_mut(worker, session, now) else {
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
        for b in &released {
            g.buckets[b.0 as usize].owner = None;
        }
        for b in &released_old {
            g.old[b.0 as usize].owner = None;
        }
        released.extend(released_old);
        released.sort_unstable();
        if !released.is_empty() {
            state.notify(group, Change::Released(worker));
        }
        Ok(released)
    }

    async fn leave(
        &self,
        group: &GroupName,
        worker: WorkerId,
        session: Option<SessionId>,
    ) -> Result<Vec<Bucket>, StoreError> {
        let (mut state, now) = self.lock(Operation::Leave)?;
        let g = state.group_mut(group)?;
        let holds = |m: &MemberRow| session.is_none_or(|s| s == m.session);
        if !g.members.get(&worker).is_some_and(holds) {
            return Ok(Vec::new());
        }
        let Some(me) = g.members.remove(&worker) else {
            return Ok(Vec::new());
        };
        let (held, held_old) = if me.is_live(now) {
            (me.held, me.held_old)
        } else {
            Default::default()
        };
        for b in &held {
            g.buckets[b.0 as usize].owner = None;
        }
        for b in &held_old {
            if let Some(row) = g.old.get_mut(b.0 as usize) {
                row.owner = None;
            }
        }
        let mut released: Vec<Bucket> = held.into_iter().chain(held_old).collect();
        released.sort_unstable();
        state.notify(group, Change::Left(worker));
        Ok(released)
    }

    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        let (mut state, now) = self.lock(Operation::Snapshot)?;
        let g = state.group_mut(group)?;
        g.draining(now);
        let members = g
            .members
            .iter()
            .map(|(&worker, m)| {
                let live = m.is_live(now);
                MemberInfo {
                    worker,
                    session: m.session,
                    joined_at: m.joined_at,
                    heartbeat_at: m.heartbeat_at,
                    expires_at: m.expires_at,
                    live,
                    owned: if live { m.held.len() as u32 } else { 0 },
                    metadata: m.metadata.clone(),
                }
            })
            .collect();
        let buckets = g
            .buckets
            .iter()
            .enumerate()
            .map(|(i, row)| g.bucket_info(i, row, now))
            .collect();
        let draining = g
            .old
            .iter()
            .enumerate()
            .map(|(i, row)| g.bucket_info(i, row, now))
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

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: WorkerId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let (state, now) = self.lock(Operation::IsCurrent)?;
        let Some(g) = state.groups.get(group) else {
            return Ok(false);
        };
        let current = |row: &BucketRow| {
            row.token == token.0
                && row.owner.is_some_and(|(w, _)| w == worker)
                && g.is_owned_live(row, now)
        };
        // F1: either generation; an old bucket owned live is not retired.
        Ok(g.buckets.get(bucket.0 as usize).is_some_and(current)
            || g.old.get(bucket.0 as usize).is_some_and(current))
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        let (mut state, now) = self.lock(Operation::Resize)?;
        let g = state.group_mut(group)?;
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
            .map(|new| BucketRow {
                owner: None,
                token: resize::parents(from, to, new)
                    .iter()
                    .map(|p| g.buckets[p.0 as usize].token)
                    .max()
                    .unwrap_or(0),
            })
            .collect();
        g.old = std::mem::replace(&mut g.buckets, buckets);
        for m in g.members.values_mut() {
            m.held_old = std::mem::take(&mut m.held);
        }
        g.shards = to;
        g.previous = Some(from);
        g.generation = g.generation.next();
        let generation = g.generation;
        state.notify(group, Change::Resized);
        Ok(ResizeOutcome::Started { generation })
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        let (mut state, _now) = self.lock(Operation::Changes)?;
        let tx = state
            .feeds
            .entry(group.clone())
            .or_insert_with(|| broadcast::channel(FEED_CAPACITY).0);
        // A receiver that fell behind hears `Missed` and re-plans.
        let changes = BroadcastStream::new(tx.subscribe()).map(|c| c.unwrap_or(Change::Missed));
        Ok(Some(ChangeFeed::new(changes)))
    }
}
