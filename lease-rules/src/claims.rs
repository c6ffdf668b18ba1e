//! Ownership: claims, releases, the fencing check and the loads recorded on buckets (C, R, F,
//! P).

use lease_core::EndReason;
use lease_core::{
    Bucket, Change, FencingToken, GroupName, Lease, Load, MemberMode, NodeId, SessionId,
    StoreError, Takeover, Timestamp,
};

use crate::rows::*;

/// Which claimable buckets a claim takes.
#[derive(Clone, Copy)]
enum Pick<'a> {
    /// The first ones in claim order, at most this many (C3, C9).
    First(u32),
    /// Every one of these that is claimable (C12).
    Named(&'a [Bucket]),
}

impl Pick<'_> {
    fn allows(self, bucket: Bucket) -> bool {
        match self {
            Self::First(_) => true,
            Self::Named(named) => named.contains(&bucket),
        }
    }
}

impl State {
    /// [`WorkerStore::claim`](lease_core::WorkerStore::claim) at the store's time `now`.
    pub fn claim(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.take(now, group, worker, session, Pick::First(want), takeover)
    }

    /// [`WorkerStore::claim_buckets`](lease_core::WorkerStore::claim_buckets) at the store's
    /// time `now`.
    pub fn claim_buckets(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        self.take(now, group, worker, session, Pick::Named(buckets), takeover)
    }

    /// [`WorkerStore::publish_loads`](lease_core::WorkerStore::publish_loads) at the store's
    /// time `now`.
    pub fn publish_loads(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        let (nodes, g) = self.split(group)?;
        // P2: a bucket out of range fails the call before anything is written.
        if let Some(&(bucket, _)) = loads.iter().find(|(b, _)| !g.shards.contains(*b)) {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        // P1.
        let Some(me) = g.live_member_mut(nodes, worker, session, now) else {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker,
            });
        };
        let held = me.held.clone();
        // For a bucket listed twice, the last load.
        let asked: std::collections::BTreeMap<Bucket, Load> = loads.iter().copied().collect();
        let mut recorded = 0u32;
        let mut changed = false;
        for (&bucket, &load) in asked.iter().filter(|(b, _)| held.contains(b)) {
            let row = &mut g.buckets[bucket.0 as usize];
            changed |= row.load != load;
            row.load = load;
            recorded += 1;
        }
        // P3: the member's work, from the loads on what it holds now.
        let total = Load::sum(held.iter().map(|b| &g.buckets[b.0 as usize].load));
        let hottest = held
            .iter()
            .map(|b| g.buckets[b.0 as usize].load)
            .max()
            .unwrap_or(Load::ZERO);
        if let Some(me) = g.members.get_mut(&worker) {
            changed |= (me.load, me.hottest) != (total, hottest);
            me.load = total;
            me.hottest = hottest;
        }
        // P5: a change moves the counter; no wake-up.
        if changed {
            g.bump();
        }
        Ok(recorded)
    }

    /// Claim by C1-C13: the first `want` claimable buckets in claim order, or the named ones
    /// that are claimable.
    fn take(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        pick: Pick<'_>,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        let state = self;
        let (quiet_from, floor) = (state.history.quiet_from(), state.history.floor());
        let (nodes, g) = state.split(group)?;
        // C13: a named bucket out of range fails the call before anything else.
        if let Pick::Named(named) = pick
            && let Some(&bucket) = named.iter().find(|&&b| !g.shards.contains(b))
        {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        let (expires_at, renewed_at) = match g.live_member_mut(nodes, worker, session, now) {
            Some(_) => nodes
                .get(&worker)
                .map(|n| (n.expires_at, n.heartbeat_at))
                .ok_or_else(|| StoreError::SessionExpired {
                    group: group.clone(),
                    worker,
                })?,
            None => {
                return Err(StoreError::SessionExpired {
                    group: group.clone(),
                    worker,
                });
            }
        };
        // C11: a cordoned or draining member claims nothing (and changes nothing).
        if g.control(worker).1 != MemberMode::Active {
            return Ok(Vec::new());
        }
        // V2: nothing until the longest ttl of the group's members has passed since the
        // timeline's first heartbeat (nothing at all before it).
        let longest = g
            .members
            .keys()
            .filter_map(|w| nodes.get(w))
            .map(|n| n.expires_at - n.heartbeat_at)
            .max()
            .unwrap_or_default();
        if let Some(first_seen) = quiet_from
            && first_seen.is_none_or(|t| now < t + longest)
        {
            return Ok(Vec::new());
        }
        g.draining(nodes, now);
        let take_dead = takeover.takes_dead(now - renewed_at);
        let effective = if take_dead {
            Takeover::Allowed
        } else {
            Takeover::Deferred
        };
        let (mut picked, others): (Vec<usize>, Vec<usize>) = g
            .shards
            .claim_order(worker)
            .map(|b| b.0 as usize)
            .filter(|&i| {
                if take_dead {
                    !g.is_owned_live(nodes, &g.buckets[i], now)
                } else {
                    g.buckets[i].owner.is_none()
                }
            })
            // C10: not under quarantine.
            .filter(|&i| g.quarantined(Bucket(i as u32), now).is_none())
            // C8: the resize barrier, with the takeover C7 allows now.
            .filter(|&i| g.parents_retired(nodes, i, now, effective))
            // C12: only the named ones, when buckets are named.
            .filter(|&i| pick.allows(Bucket(i as u32)))
            // C9: the buckets it last held first.
            .partition(|&i| g.buckets[i].last_node == Some(worker));
        picked.extend(others);
        if let Pick::First(want) = pick {
            picked.truncate(want as usize);
        }
        picked.sort_unstable();
        let mut won = Vec::with_capacity(picked.len());
        for i in picked {
            let bucket = Bucket(i as u32);
            let row = &mut g.buckets[i];
            let previous = row.owner.replace((worker, session));
            if previous.is_some() {
                row.tenures.end(now, EndReason::Expired);
            }
            // V3: plus one, and at least the timeline's floor.
            row.token = (row.token + 1).max(floor);
            row.last_node = Some(worker);
            row.tenures.begin(worker, FencingToken(row.token), now);
            // The previous session is dead; keep its member row's set honest for snapshots.
            if let Some((w, s)) = previous
                && nodes.get(&w).is_some_and(|n| n.session == s)
                && let Some(m) = g.members.get_mut(&w)
            {
                m.held.remove(&bucket);
            }
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
        if !won.is_empty() {
            g.bump();
        }
        Ok(won)
    }

    /// [`WorkerStore::release`](lease_core::WorkerStore::release) at the store's time `now`.
    pub fn release(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        let state = self;
        let (nodes, g) = state.split(group)?;
        g.draining(nodes, now);
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
        let Some(me) = g.live_member_mut(nodes, worker, session, now) else {
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
        let mode = g.control(worker).1;
        for &b in &released {
            let reason = EndReason::of_release(g.quarantined(b, now).is_some(), mode);
            let row = &mut g.buckets[b.0 as usize];
            row.owner = None;
            row.tenures.end(now, reason);
        }
        for b in &released_old {
            g.old[b.0 as usize].owner = None;
        }
        released.extend(released_old);
        released.sort_unstable();
        if !released.is_empty() {
            g.bump();
            state.notify(group, Change::Released(worker));
        }
        Ok(released)
    }

    /// [`WorkerStore::is_current`](lease_core::WorkerStore::is_current) at the store's time `now`.
    pub fn is_current(
        &mut self,
        now: Timestamp,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let state = self;
        let Some(g) = state.groups.get(group) else {
            return Ok(false);
        };
        let current = |row: &BucketRow| {
            row.token == token.0
                && row.owner.is_some_and(|(w, _)| w == worker)
                && g.is_owned_live(&state.nodes, row, now)
        };
        // F1: either generation; an old bucket owned live is not retired.
        Ok(g.buckets.get(bucket.0 as usize).is_some_and(current)
            || g.old.get(bucket.0 as usize).is_some_and(current))
    }
}
