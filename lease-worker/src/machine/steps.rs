//! A group's queue of work and its revocations in progress, kept so that every question the
//! machine asks of them per delivery or per acknowledgement costs O(log n), not O(n): a node
//! revoking 65,536 buckets at a stop (or a shed, or a resize) asks them once per bucket.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Instant;

use lease_core::{Bucket, RevokeReason, SessionId};

use super::Delivery;

/// One step of a group's part of the current tick (or of its removal), done in order.
#[derive(Debug)]
pub(super) enum Step {
    Deliver(Delivery),
    /// Join the group under the node's session.
    Join,
    /// Release what is shed and acknowledged (and what earlier releases skipped).
    Release,
    Claim(u32),
    /// Claim these buckets, chosen by load.
    ClaimNamed(Vec<Bucket>),
    /// Wait until every revocation was acknowledged or given up on (removing).
    AwaitAcks,
    /// Leave the group (removing).
    Leave,
    /// The end of the group's part of a tick.
    EndTick,
    /// The end of the group.
    Finish,
}

impl Step {
    /// Whether the step is a store call (they wait for the node's one call slot).
    pub(super) fn is_call(&self) -> bool {
        matches!(
            self,
            Step::Join | Step::Release | Step::Claim(_) | Step::ClaimNamed(_) | Step::Leave
        )
    }

    pub(super) fn is_revoke(&self) -> bool {
        matches!(self, Step::Deliver(Delivery::Revoke { .. }))
    }

    /// Whether the step ends the group's current work: a step added to that work goes before
    /// it.
    fn is_end(&self) -> bool {
        matches!(self, Step::EndTick | Step::AwaitAcks | Step::Finish)
    }

    fn revoked_bucket(&self) -> Option<Bucket> {
        match self {
            Step::Deliver(Delivery::Revoke { bucket, .. }) => Some(*bucket),
            _ => None,
        }
    }
}

/// A group's steps, in order, with what the machine asks of them kept up to date as steps come
/// and go: how many are store calls and releases, which buckets have a revocation queued, and
/// where the current work ends.
#[derive(Debug, Default)]
pub(super) struct Steps {
    queue: VecDeque<Step>,
    calls: usize,
    releases: usize,
    /// The buckets whose revocation is queued (not delivered yet), with how many times.
    revokes: BTreeMap<Bucket, u32>,
    /// The index of the first step that ends the current work, if any.
    first_end: Option<usize>,
}

impl Steps {
    fn count(&mut self, step: &Step, added: bool) {
        let change = |n: &mut usize| {
            if added {
                *n += 1;
            } else {
                *n = n.saturating_sub(1);
            }
        };
        if step.is_call() {
            change(&mut self.calls);
        }
        if matches!(step, Step::Release) {
            change(&mut self.releases);
        }
        if let Some(bucket) = step.revoked_bucket() {
            if added {
                *self.revokes.entry(bucket).or_insert(0) += 1;
            } else if let Some(n) = self.revokes.get_mut(&bucket) {
                *n -= 1;
                if *n == 0 {
                    self.revokes.remove(&bucket);
                }
            }
        }
    }

    fn find_end(&self) -> Option<usize> {
        self.queue.iter().position(Step::is_end)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn front(&self) -> Option<&Step> {
        self.queue.front()
    }

    pub(super) fn pop_front(&mut self) -> Option<Step> {
        let step = self.queue.pop_front()?;
        self.count(&step, false);
        self.first_end = match self.first_end {
            // The end went: look for the next one (there are few, so this is rare).
            Some(0) => self.find_end(),
            other => other.map(|i| i - 1),
        };
        Some(step)
    }

    pub(super) fn push_front(&mut self, step: Step) {
        self.count(&step, true);
        self.first_end = if step.is_end() {
            Some(0)
        } else {
            self.first_end.map(|i| i + 1)
        };
        self.queue.push_front(step);
    }

    pub(super) fn push_back(&mut self, step: Step) {
        self.count(&step, true);
        if self.first_end.is_none() && step.is_end() {
            self.first_end = Some(self.queue.len());
        }
        self.queue.push_back(step);
    }

    pub(super) fn extend(&mut self, steps: impl IntoIterator<Item = Step>) {
        for step in steps {
            self.push_back(step);
        }
    }

    /// Add `step` before the end of the current work (at the back if nothing ends it). Cheap:
    /// the end is near the back.
    pub(super) fn insert_before_end(&mut self, step: Step) {
        match self.first_end {
            Some(end) => {
                self.count(&step, true);
                self.first_end = Some(end + 1);
                self.queue.insert(end, step);
            }
            None => self.push_back(step),
        }
    }

    /// Keep only the steps `keep` says to keep.
    pub(super) fn retain(&mut self, keep: impl FnMut(&Step) -> bool) {
        self.queue.retain(keep);
        self.calls = 0;
        self.releases = 0;
        self.revokes.clear();
        let steps = std::mem::take(&mut self.queue);
        for step in &steps {
            self.count(step, true);
        }
        self.queue = steps;
        self.first_end = self.find_end();
    }

    /// Whether a store call is queued.
    pub(super) fn has_call(&self) -> bool {
        self.calls > 0
    }

    /// Whether a release is queued.
    pub(super) fn has_release(&self) -> bool {
        self.releases > 0
    }

    /// Whether a revocation of `bucket` is queued, not delivered yet: it is on its way out.
    pub(super) fn revokes(&self, bucket: Bucket) -> bool {
        self.revokes.contains_key(&bucket)
    }

    /// Whether any revocation is queued.
    pub(super) fn has_revoke(&self) -> bool {
        !self.revokes.is_empty()
    }

    /// Give every queued revocation `reason`: the application must not act on the reason it
    /// was queued with (the lease is not trusted any more, or not ours). One queued by the
    /// node's fence keeps saying so: the node stopped trusting the lease by its own clock
    /// before the store said why, and the application hears the first cause (a frozen process
    /// whose renewal answers while its fenced revocations are still going out).
    pub(super) fn set_revoke_reasons(&mut self, to: RevokeReason) {
        for step in &mut self.queue {
            if let Step::Deliver(Delivery::Revoke { reason, .. }) = step
                && *reason != RevokeReason::Fenced
            {
                *reason = to;
            }
        }
    }
}

/// A revocation not acknowledged (yet, or in time).
#[derive(Debug, Clone, Copy)]
pub(super) struct Revoking {
    pub(super) reason: RevokeReason,
    /// The session the bucket was held under when it was revoked: once acknowledged, a shed
    /// bucket is released only if that session is still the node's.
    pub(super) session: Option<SessionId>,
    /// When the application must have acknowledged it.
    pub(super) deadline: Option<Instant>,
}

/// The revocations a group's application has not acknowledged yet, with their deadlines in
/// order: the earliest is found without looking at the others.
#[derive(Debug, Default)]
pub(super) struct Revocations {
    by_bucket: BTreeMap<Bucket, Revoking>,
    deadlines: BTreeSet<(Instant, Bucket)>,
}

impl Revocations {
    pub(super) fn insert(&mut self, bucket: Bucket, revoking: Revoking) {
        if let Some(old) = self.by_bucket.insert(bucket, revoking)
            && let Some(d) = old.deadline
        {
            self.deadlines.remove(&(d, bucket));
        }
        if let Some(d) = revoking.deadline {
            self.deadlines.insert((d, bucket));
        }
    }

    pub(super) fn remove(&mut self, bucket: &Bucket) -> Option<Revoking> {
        let revoking = self.by_bucket.remove(bucket)?;
        if let Some(d) = revoking.deadline {
            self.deadlines.remove(&(d, *bucket));
        }
        Some(revoking)
    }

    pub(super) fn contains_key(&self, bucket: &Bucket) -> bool {
        self.by_bucket.contains_key(bucket)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_bucket.is_empty()
    }

    /// The earliest deadline.
    pub(super) fn earliest(&self) -> Option<Instant> {
        self.deadlines.first().map(|&(d, _)| d)
    }

    /// Take the revocations whose deadline passed by `now`, earliest first.
    pub(super) fn take_late(&mut self, now: Instant) -> Vec<(Bucket, Revoking)> {
        let mut late = Vec::new();
        while let Some(&(d, bucket)) = self.deadlines.first()
            && d <= now
        {
            self.deadlines.pop_first();
            if let Some(r) = self.by_bucket.remove(&bucket) {
                late.push((bucket, r));
            }
        }
        late
    }
}

#[cfg(test)]
mod tests {
    use lease_core::FencingToken;

    use super::*;

    fn revoke(b: u32) -> Step {
        Step::Deliver(Delivery::Revoke {
            bucket: Bucket(b),
            token: FencingToken(1),
            reason: RevokeReason::Shed,
        })
    }

    /// The counts and the end follow every kind of change, as a scan of the queue finds them.
    #[test]
    fn the_counts_follow_the_queue() {
        let mut s = Steps::default();
        let check = |s: &Steps| {
            let calls = s.queue.iter().filter(|x| x.is_call()).count();
            let releases = s
                .queue
                .iter()
                .filter(|x| matches!(x, Step::Release))
                .count();
            let revoked: BTreeSet<Bucket> =
                s.queue.iter().filter_map(Step::revoked_bucket).collect();
            assert_eq!(s.calls, calls);
            assert_eq!(s.releases, releases);
            assert_eq!(s.revokes.keys().copied().collect::<BTreeSet<_>>(), revoked);
            assert_eq!(s.first_end, s.find_end());
        };
        s.extend([revoke(1), revoke(2), Step::Release, Step::EndTick]);
        check(&s);
        s.push_front(revoke(3));
        check(&s);
        s.insert_before_end(Step::Release);
        check(&s);
        assert!(matches!(s.queue[4], Step::Release) && matches!(s.queue[5], Step::EndTick));
        s.push_back(Step::Join);
        s.push_back(Step::EndTick);
        check(&s);
        while s.pop_front().is_some() {
            check(&s);
        }
        s.extend([revoke(1), Step::Claim(3), revoke(1), Step::EndTick]);
        s.retain(Step::is_revoke);
        check(&s);
        assert!(s.revokes(Bucket(1)) && !s.has_call());
        s.pop_front();
        assert!(s.revokes(Bucket(1)), "queued twice, delivered once");
        s.pop_front();
        assert!(!s.revokes(Bucket(1)) && !s.has_revoke());
        s.insert_before_end(Step::Release);
        check(&s);
    }

    #[test]
    fn deadlines_come_out_in_order() {
        let t = Instant::now();
        let at = |ms: u64| Some(t + std::time::Duration::from_millis(ms));
        let r = |deadline| Revoking {
            reason: RevokeReason::Shed,
            session: None,
            deadline,
        };
        let mut v = Revocations::default();
        v.insert(Bucket(1), r(at(30)));
        v.insert(Bucket(2), r(at(10)));
        v.insert(Bucket(3), r(None));
        v.insert(Bucket(4), r(at(20)));
        assert_eq!(v.earliest(), at(10));
        assert!(v.remove(&Bucket(2)).is_some());
        assert_eq!(v.earliest(), at(20));
        // Revoked again with a later deadline: the earlier one is gone.
        v.insert(Bucket(4), r(at(40)));
        assert_eq!(v.earliest(), at(30));
        let late: Vec<Bucket> = v
            .take_late(t + std::time::Duration::from_millis(35))
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        assert_eq!(late, vec![Bucket(1)]);
        assert!(v.contains_key(&Bucket(3)) && v.contains_key(&Bucket(4)));
        assert_eq!(v.earliest(), at(40));
    }
}
