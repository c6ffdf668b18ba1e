//! The model's failovers (the contract's V1-V4), stated apart from the rest of the model: the
//! timelines, what the model has written, and what a promoted copy keeps.

use std::collections::BTreeMap;

use chrono::TimeDelta;
use lease_core::{Incarnation, LogPosition, SessionBound, SessionId, Timestamp};

/// The model's timelines.
#[derive(Clone, Debug)]
pub(super) struct Timelines {
    /// The one the model runs on; 1 is the base.
    current: u64,
    /// Calls made so far: a position read after a write is at or after it.
    written: u64,
    /// How far the promoted copy had got, until the first heartbeat records it.
    replayed: Option<u64>,
    /// Per timeline after the base: when a heartbeat first ran on it, and its switch point.
    seen: BTreeMap<u64, (Timestamp, Option<u64>)>,
}

impl Default for Timelines {
    fn default() -> Self {
        Self {
            current: 1,
            written: 0,
            replayed: None,
            seen: BTreeMap::new(),
        }
    }
}

/// What a node row holds of its session's timeline, as V4 judges it.
pub(super) struct Crossing<'a> {
    pub(super) session: SessionId,
    pub(super) incarnation: Incarnation,
    pub(super) live: bool,
    pub(super) handed_over: bool,
    pub(super) bound: Option<&'a SessionBound>,
}

impl Timelines {
    pub(super) fn current(&self) -> u64 {
        self.current
    }

    /// A call is made.
    pub(super) fn call(&mut self) {
        self.written += 1;
    }

    pub(super) fn position(&self) -> LogPosition {
        LogPosition {
            timeline: self.current,
            offset: self.written,
        }
    }

    /// The model's copy becomes the store on the next timeline.
    pub(super) fn promote(&mut self) {
        self.current += 1;
        self.replayed = Some(self.written);
    }

    /// A heartbeat ran at `now`: the first on a timeline after the base records it.
    pub(super) fn heartbeat_at(&mut self, now: Timestamp) {
        if self.current > 1 && !self.seen.contains_key(&self.current) {
            self.seen.insert(self.current, (now, self.replayed));
        }
    }

    /// V4: `kept`, or `ended: ` and why.
    pub(super) fn judge(&self, c: &Crossing<'_>, incarnation: Incarnation) -> String {
        let Some(bound) = c.bound else {
            return "ended: its writes had no bound".into();
        };
        if bound.session != c.session {
            return "ended: the bound was of another session".into();
        }
        if c.incarnation != incarnation || c.handed_over {
            return "ended: another process".into();
        }
        if !c.live {
            return "ended: expired".into();
        }
        let Some(switch) = self.seen.get(&self.current).and_then(|&(_, s)| s) else {
            return "ended: switch point unknown".into();
        };
        if bound.position.timeline != self.current - 1 {
            return format!(
                "ended: its writes were on timeline {}",
                bound.position.timeline
            );
        }
        if bound.position.offset > switch {
            return "ended: writes after the switch point".into();
        }
        "kept".into()
    }

    /// V4: whether a session of `timeline`, renewed at `renewed` until `expires`, may still be
    /// kept at `now` though expired: of an earlier timeline, and within its ttl of this one's
    /// first heartbeat (or before it).
    pub(super) fn may_keep(
        &self,
        timeline: u64,
        renewed: Timestamp,
        expires: Timestamp,
        now: Timestamp,
    ) -> bool {
        if timeline == self.current {
            return false;
        }
        match self.seen.get(&self.current) {
            None => true,
            Some(&(first, _)) => now < first + (expires - renewed),
        }
    }

    /// V2: whether a claim at `now` must take nothing, the group's longest ttl `longest`.
    pub(super) fn quiet(&self, now: Timestamp, longest: TimeDelta) -> bool {
        if self.current == 1 {
            return false;
        }
        match self.seen.get(&self.current) {
            None => true,
            Some(&(first, _)) => now < first + longest,
        }
    }

    /// V3: `token + 1`, raised to the timeline's floor.
    pub(super) fn next_token(&self, token: i64) -> i64 {
        let floor = (((self.current - 1) as i64) << 32) + 1;
        std::cmp::max(token + 1, floor)
    }
}
