//! The ownership log checker: from every worker's assigned/revoked events with their times,
//! prove that no bucket was ever held by two workers at the same instant, that each worker
//! saw each bucket assigned before revoked, and that tokens only grew. The tests, the chaos
//! test and `leasectl demo` all judge runs with it; an application can audit its own logs.
//! (`lease_testing::RecordingHandler` records a worker's events into one.)

use std::collections::BTreeMap;
use std::fmt::Debug;

use crate::event::{OwnershipEvent, RevokeReason};
use crate::ids::{Bucket, FencingToken, WorkerId};

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry<T> {
    /// When the application heard it.
    pub at: T,
    /// Which worker's application.
    pub worker: WorkerId,
    /// The event.
    pub event: OwnershipEvent,
}

/// A span of time one worker held one bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holding<T> {
    /// The worker.
    pub worker: WorkerId,
    /// The bucket.
    pub bucket: Bucket,
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
}

/// A log of ownership events from many workers. Times are any ordered type: a tokio
/// `Instant`, a store [`Timestamp`](crate::Timestamp), the RFC 3339 times of `leasectl worker --json` parsed.
#[derive(Clone, Debug)]
pub struct OwnershipLog<T> {
    entries: Vec<Entry<T>>,
    crashes: BTreeMap<WorkerId, T>,
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
    pub fn record(&mut self, worker: WorkerId, event: OwnershipEvent, at: T) {
        self.entries.push(Entry { at, worker, event });
    }

    /// Record that `worker` crashed at `at`: whatever it held, it stopped working on then.
    pub fn crashed(&mut self, worker: WorkerId, at: T) {
        self.crashes.insert(worker, at);
    }

    /// Every entry, in recording order.
    pub fn entries(&self) -> &[Entry<T>] {
        &self.entries
    }

    /// Every holding, per bucket in order of assignment. Fails on a worker whose events for a
    /// bucket do not alternate assigned, revoked, assigned..., or whose revocation names another
    /// token than its assignment.
    pub fn holdings(&self) -> Result<BTreeMap<Bucket, Vec<Holding<T>>>, String> {
        let mut open: BTreeMap<(WorkerId, Bucket), Holding<T>> = BTreeMap::new();
        let mut done: BTreeMap<Bucket, Vec<Holding<T>>> = BTreeMap::new();
        for e in &self.entries {
            match e.event {
                OwnershipEvent::Assigned { bucket, token } => {
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
                OwnershipEvent::Assigned { .. } => summary.assignments += 1,
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
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn w(i: u128) -> WorkerId {
        WorkerId::from_uuid(Uuid::from_u128(i))
    }

    fn assigned(b: u32, t: i64) -> OwnershipEvent {
        OwnershipEvent::Assigned {
            bucket: Bucket(b),
            token: FencingToken(t),
        }
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
}
