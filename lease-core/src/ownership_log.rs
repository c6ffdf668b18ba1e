//! The ownership log checker: from every worker's assigned/revoked events with their times,
//! prove that no bucket was ever held by two workers at the same instant, that each worker
//! saw each bucket assigned before revoked, and that tokens only grew; across a resize, that
//! no key was in buckets held at one instant and that tokens grew per key. The tests, the chaos
//! test and `leasectl demo` all judge runs with it; an application can audit its own logs.
//! (`lease_testing::RecordingHandler` records a worker's events into one.)

use std::collections::BTreeMap;
use std::fmt::Debug;

use crate::event::{OwnershipEvent, RevokeReason};
use crate::ids::{Bucket, FencingToken, NodeId, ShardCount};
use crate::resize;

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<T> {
    /// When the application heard it.
    pub at: T,
    /// Which worker's application.
    pub worker: NodeId,
    /// The event.
    pub event: OwnershipEvent,
}

/// A span of time one worker held one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding<T> {
    /// The worker.
    pub worker: NodeId,
    /// The bucket.
    pub bucket: Bucket,
    /// The shard count of the bucket's generation.
    pub shards: ShardCount,
    /// The token it held it with.
    pub token: FencingToken,
    /// When it was assigned.
    pub from: T,
    /// When it was revoked (or the worker crashed); `None` if still held at the end.
    pub until: Option<T>,
    /// Why it ended, if it ended by a revocation.
    pub reason: Option<RevokeReason>,
}

/// What a checked log contained.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Assignments seen.
    pub assignments: usize,
    /// Revocations seen, by reason.
    pub revocations: BTreeMap<&'static str, usize>,
    /// Buckets that moved from one worker to another.
    pub handoffs: usize,
    /// Pairs of holdings of buckets of different shard counts sharing keys (a resize's old
    /// and new buckets) checked for per-key exclusion and token order.
    pub key_pairs: usize,
}

/// A log of ownership events from many workers. Times are any ordered type: a tokio
/// `Instant`, a store [`Timestamp`](crate::Timestamp), the RFC 3339 times of `leasectl worker --json` parsed.
#[derive(Clone, Debug)]
pub struct OwnershipLog<T> {
    entries: Vec<Entry<T>>,
    crashes: BTreeMap<NodeId, T>,
}

impl<T> Default for OwnershipLog<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            crashes: BTreeMap::new(),
        }
    }
}

impl<T: Ord + Copy + Debug> OwnershipLog<T> {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that `worker`'s application heard `event` at `at`. Entries of one worker must be
    /// recorded in the order that worker delivered them.
    pub fn record(&mut self, worker: NodeId, event: OwnershipEvent, at: T) {
        self.entries.push(Entry { at, worker, event });
    }

    /// Record that `worker` crashed at `at`: whatever it held, it stopped working on then.
    pub fn crashed(&mut self, worker: NodeId, at: T) {
        self.crashes.insert(worker, at);
    }

    /// Every entry, in recording order.
    pub fn entries(&self) -> &[Entry<T>] {
        &self.entries
    }

    /// Every holding, per bucket number in order of assignment. Fails on a worker whose events
    /// for a bucket do not alternate assigned, revoked, assigned..., or whose revocation names
    /// another token than its assignment.
    ///
    /// Across a resize, the holdings of one bucket number in either generation are listed
    /// together (see [`Holding::shards`]): the new bucket of a number shares keys with the
    /// old bucket of that number, so they are held one after the other like one bucket.
    pub fn holdings(&self) -> Result<BTreeMap<Bucket, Vec<Holding<T>>>, String> {
        let mut open: BTreeMap<(NodeId, Bucket), Holding<T>> = BTreeMap::new();
        let mut done: BTreeMap<Bucket, Vec<Holding<T>>> = BTreeMap::new();
        for e in &self.entries {
            match e.event {
                OwnershipEvent::Assigned(a) => {
                    let (bucket, token) = (a.bucket, a.token);
                    if let Some(h) = open.get(&(e.worker, bucket)) {
                        return Err(format!(
                            "worker {} was assigned bucket {bucket} (token {token}) at {:?} \
                             while holding it since {:?} (token {})",
                            e.worker, e.at, h.from, h.token
                        ));
                    }
                    open.insert(
                        (e.worker, bucket),
                        Holding {
                            worker: e.worker,
                            bucket,
                            shards: a.shards,
                            token,
                            from: e.at,
                            until: None,
                            reason: None,
                        },
                    );
                }
                OwnershipEvent::Revoked {
                    bucket,
                    token,
                    reason,
                } => {
                    let Some(mut h) = open.remove(&(e.worker, bucket)) else {
                        return Err(format!(
                            "worker {} had bucket {bucket} revoked at {:?} without holding it",
                            e.worker, e.at
                        ));
                    };
                    if h.token != token {
                        return Err(format!(
                            "worker {} held bucket {bucket} with token {} but it was revoked \
                             with token {token}",
                            e.worker, h.token
                        ));
                    }
                    h.until = Some(e.at);
                    h.reason = Some(reason);
                    done.entry(bucket).or_default().push(h);
                }
            }
        }
        for ((worker, bucket), mut h) in open {
            h.until = self.crashes.get(&worker).copied();
            done.entry(bucket).or_default().push(h);
        }
        for hs in done.values_mut() {
            hs.sort_by(|a, b| a.from.cmp(&b.from).then(a.token.cmp(&b.token)));
        }
        Ok(done)
    }

    /// Check the whole log: per-worker order, no two holders of a bucket at one instant
    /// (a holding ending at `t` and the next starting at `t` is a clean handoff), and tokens
    /// strictly increasing from one holder of a bucket to the next (the same worker may hold
    /// it again with the same token after revoking it on its own, e.g. by self-fencing).
    pub fn check(&self) -> Result<Summary, String> {
        let holdings = self.holdings()?;
        let mut summary = Summary::default();
        for e in &self.entries {
            match e.event {
                OwnershipEvent::Assigned(_) => summary.assignments += 1,
                OwnershipEvent::Revoked { reason, .. } => {
                    *summary.revocations.entry(reason.as_str()).or_default() += 1;
                }
            }
        }
        for (bucket, hs) in &holdings {
            for pair in hs.windows(2) {
                let (prev, next) = (&pair[0], &pair[1]);
                match prev.until {
                    Some(until) if until <= next.from => {}
                    until => {
                        return Err(format!(
                            "bucket {bucket} held twice: by {} (token {}) from {:?} until {:?}, \
                             and by {} (token {}) from {:?}",
                            prev.worker,
                            prev.token,
                            prev.from,
                            until,
                            next.worker,
                            next.token,
                            next.from
                        ));
                    }
                }
                // A worker that fenced itself and then found its session still alive is
                // assigned the same bucket again with the same token: legal. Any other holder
                // must hold a higher token.
                let same_lease = next.worker == prev.worker && next.token == prev.token;
                if next.token < prev.token || (next.token == prev.token && !same_lease) {
                    return Err(format!(
                        "bucket {bucket}: token went from {} ({}) to {} ({})",
                        prev.token, prev.worker, next.token, next.worker
                    ));
                }
                if next.worker != prev.worker {
                    summary.handoffs += 1;
                }
            }
        }
        summary.key_pairs = check_across_counts(&holdings)?;
        Ok(summary)
    }
}

/// Whether `t` comes before `until`, an open end (`None`) being later than any time.
fn before<T: Ord>(t: &T, until: Option<&T>) -> bool {
    until.is_none_or(|u| t < u)
}

/// Per-key exclusion and token order between buckets of different shard counts: two holdings
/// sharing a key never overlap in time, and the later one holds the higher token. (Holdings of
/// one count share keys only within one bucket, which [`OwnershipLog::check`] judges.) Returns
/// how many pairs sharing keys it checked.
fn check_across_counts<T: Ord + Copy + Debug>(
    holdings: &BTreeMap<Bucket, Vec<Holding<T>>>,
) -> Result<usize, String> {
    let mut by_count: BTreeMap<ShardCount, BTreeMap<Bucket, Vec<&Holding<T>>>> = BTreeMap::new();
    for h in holdings.values().flatten() {
        by_count
            .entry(h.shards)
            .or_default()
            .entry(h.bucket)
            .or_default()
            .push(h);
    }
    let mut pairs = 0;
    for (&a, in_a) in &by_count {
        for (&b, in_b) in by_count.range((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded))
        {
            for (&x, hx) in in_a {
                for y in resize::children(a, b, x) {
                    for h1 in hx {
                        for h2 in in_b.get(&y).map(Vec::as_slice).unwrap_or_default() {
                            pairs += 1;
                            let (first, second) = if h1.from <= h2.from {
                                (h1, h2)
                            } else {
                                (h2, h1)
                            };
                            if before(&second.from, first.until.as_ref()) {
                                return Err(format!(
                                    "a key of bucket {} (of {}) and bucket {} (of {}) held twice: \
                                     by {} (token {}) from {:?} until {:?}, and by {} (token {}) \
                                     from {:?}",
                                    first.bucket,
                                    first.shards,
                                    second.bucket,
                                    second.shards,
                                    first.worker,
                                    first.token,
                                    first.from,
                                    first.until,
                                    second.worker,
                                    second.token,
                                    second.from
                                ));
                            }
                            if second.token <= first.token {
                                return Err(format!(
                                    "a key of bucket {} (of {}) and bucket {} (of {}): token went \
                                     from {} ({}) to {} ({})",
                                    first.bucket,
                                    first.shards,
                                    second.bucket,
                                    second.shards,
                                    first.token,
                                    first.worker,
                                    second.token,
                                    second.worker
                                ));
                            }
                        }
                    }
                }
            }
        }
    }
    Ok(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn w(i: u128) -> NodeId {
        NodeId::from_uuid(Uuid::from_u128(i))
    }

    fn assigned(b: u32, t: i64) -> OwnershipEvent {
        assigned_of(8, b, t)
    }

    fn n(x: u32) -> ShardCount {
        ShardCount::new(x).expect("a valid count")
    }

    fn assigned_of(shards: u32, b: u32, t: i64) -> OwnershipEvent {
        OwnershipEvent::Assigned(crate::Assignment {
            bucket: Bucket(b),
            token: FencingToken(t),
            shards: n(shards),
            resized_from: None,
        })
    }

    fn revoked(b: u32, t: i64) -> OwnershipEvent {
        OwnershipEvent::Revoked {
            bucket: Bucket(b),
            token: FencingToken(t),
            reason: RevokeReason::Shed,
        }
    }

    #[test]
    fn a_clean_handoff_passes() {
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 1), 0);
        log.record(w(1), revoked(0, 1), 5);
        log.record(w(2), assigned(0, 2), 5);
        let s = log.check().unwrap();
        assert_eq!((s.assignments, s.handoffs), (2, 1));
    }

    #[test]
    fn an_overlap_fails() {
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 1), 0);
        log.record(w(2), assigned(0, 2), 4);
        log.record(w(1), revoked(0, 1), 5);
        assert!(log.check().unwrap_err().contains("held twice"));
    }

    #[test]
    fn a_crash_ends_a_holding() {
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 1), 0);
        log.crashed(w(1), 3);
        log.record(w(2), assigned(0, 2), 10);
        assert!(log.check().is_ok());
        let mut log2 = OwnershipLog::new();
        log2.record(w(1), assigned(0, 1), 0);
        log2.record(w(2), assigned(0, 2), 10);
        assert!(
            log2.check().is_err(),
            "a holder that never stopped overlaps"
        );
    }

    #[test]
    fn order_and_tokens_are_checked() {
        let mut log = OwnershipLog::new();
        log.record(w(1), revoked(0, 1), 0);
        assert!(log.check().unwrap_err().contains("without holding"));
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 2), 0);
        log.record(w(1), revoked(0, 2), 1);
        log.record(w(2), assigned(0, 2), 2);
        assert!(log.check().unwrap_err().contains("token went"));
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 3), 0);
        log.record(w(1), revoked(0, 3), 1);
        log.record(w(2), assigned(0, 2), 2);
        assert!(log.check().unwrap_err().contains("token went"));
        // Self-fenced, then the session turned out alive: the same lease again.
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 2), 0);
        log.record(w(1), revoked(0, 2), 1);
        log.record(w(1), assigned(0, 2), 2);
        assert!(log.check().is_ok());
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned(0, 2), 0);
        log.record(w(1), assigned(0, 3), 1);
        assert!(log.check().unwrap_err().contains("while holding"));
    }

    #[test]
    fn keys_are_judged_across_a_resize() {
        // 4 -> 8: new bucket 5 shares keys with old bucket 1 only.
        let clean = |new_from: i64, new_token: i64| {
            let mut log = OwnershipLog::new();
            log.record(w(1), assigned_of(4, 1, 3), 0);
            log.record(w(1), revoked(1, 3), 10);
            log.record(w(2), assigned_of(8, 5, new_token), new_from);
            // Bucket 2 of 4 shares nothing with 5 of 8: held throughout, never judged with it.
            log.record(w(3), assigned_of(4, 2, 1), 0);
            log.check()
        };
        let s = clean(10, 4).expect("a clean split");
        assert_eq!(s.key_pairs, 1);
        assert!(
            clean(9, 4).unwrap_err().contains("held twice"),
            "the new bucket taken before the old one was revoked"
        );
        assert!(
            clean(10, 3).unwrap_err().contains("token went"),
            "the new bucket's token not above its parent's"
        );
        // A merge 8 -> 4: bucket 1 of 4 has parents 1 and 5 of 8; one still held is a fault.
        let mut log = OwnershipLog::new();
        log.record(w(1), assigned_of(8, 1, 2), 0);
        log.record(w(2), assigned_of(8, 5, 7), 0);
        log.record(w(1), revoked(1, 2), 10);
        log.record(w(3), assigned_of(4, 1, 8), 11);
        assert!(log.check().unwrap_err().contains("held twice"));
    }
}
