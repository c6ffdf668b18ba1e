//! The bound of the session's writes (the contract's V4): what a heartbeat hands in so that a
//! failover that lost none of them keeps the session, its buckets and tokens.
//!
//! A write's commit position is known only after the fact: a position the store reads in a
//! later call (every heartbeat answers one, H10) is at or after the commit of every write
//! answered before that call was made. Calls are one at a time, so the first heartbeat
//! answered after a write was answered bounds it, and every write before it. The first such
//! answer is kept, not the latest: a later position may run ahead of what a synchronous
//! standby had received of other nodes' transactions in flight, and would end the session
//! for nothing. A write whose call failed or was given up may still commit after any read:
//! the session has no bound until it ends. The machine hands the bound in only while it trusts
//! the session (before its trust deadline): the store may then keep the session even if it
//! expired on the promoted server, since it outlived the old one.

use lease_core::{Heartbeat, LogPosition, SessionBound, SessionId};

/// What the node knows of its session's writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Writes {
    /// The session the state is about.
    session: Option<SessionId>,
    state: State,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum State {
    /// Written and answered (the session's start counts), no position read since.
    #[default]
    Unbounded,
    /// A write is in flight: it commits before its answer, or it fails.
    InFlight,
    /// A write failed, or was given up: it may commit after any read, for as long as the
    /// session lasts.
    Failed,
    /// Every write of the session committed at or before this position.
    Bounded(LogPosition),
}

impl Writes {
    /// A write under the session is sent (a join, claim, release, leave, weight or
    /// hand-over).
    pub(super) fn sent(&mut self) {
        self.state = match self.state {
            // The write before was never answered: given up.
            State::InFlight | State::Failed => State::Failed,
            State::Unbounded | State::Bounded(_) => State::InFlight,
        };
    }

    /// The write in flight was answered: `ok`, it committed (or wrote nothing) before any
    /// later call is made; otherwise it may commit after any read.
    pub(super) fn answered(&mut self, ok: bool) {
        if self.state == State::InFlight {
            self.state = if ok { State::Unbounded } else { State::Failed };
        }
    }

    /// A heartbeat was answered. A new session starts unbounded (its start is a write this
    /// very answer cannot bound); otherwise its position bounds what was unbounded. A bound
    /// kept across a change of timeline (the session survived a failover, so the store
    /// judged it at or before the switch point, which the new timeline's history shares)
    /// is carried onto the new timeline.
    pub(super) fn beat(&mut self, beat: &Heartbeat) {
        if beat.new_session || self.session != Some(beat.session) {
            self.session = Some(beat.session);
            self.state = State::Unbounded;
            return;
        }
        match (self.state, beat.position) {
            (State::Unbounded, Some(position)) => self.state = State::Bounded(position),
            (State::Bounded(bound), Some(position)) if position.timeline != bound.timeline => {
                self.state = State::Bounded(LogPosition {
                    timeline: position.timeline,
                    offset: bound.offset,
                });
            }
            _ => {}
        }
    }

    /// The bound to hand in with the next heartbeat, if the session has one.
    pub(super) fn bound(&self) -> Option<SessionBound> {
        match (self.session, self.state) {
            (Some(session), State::Bounded(position)) => Some(SessionBound { session, position }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use lease_core::Timestamp;

    use super::*;

    fn at(timeline: u64, offset: u64) -> LogPosition {
        LogPosition { timeline, offset }
    }

    fn beat(session: SessionId, new_session: bool, position: LogPosition) -> Heartbeat {
        let t = Timestamp::UNIX_EPOCH;
        Heartbeat {
            session,
            new_session,
            observed_at: t,
            expires_at: t,
            groups: Vec::new(),
            unchanged: Vec::new(),
            position: Some(position),
        }
    }

    #[test]
    fn a_session_is_bounded_by_the_first_heartbeat_after_its_start() {
        let s = SessionId::new();
        let mut w = Writes::default();
        w.beat(&beat(s, true, at(1, 100)));
        assert_eq!(w.bound(), None, "the start is the answer's own write");
        w.beat(&beat(s, false, at(1, 200)));
        w.beat(&beat(s, false, at(1, 300)));
        assert_eq!(
            w.bound().map(|b| b.position),
            Some(at(1, 200)),
            "the first, not the latest"
        );
        assert_eq!(w.bound().map(|b| b.session), Some(s));
    }

    #[test]
    fn a_write_is_bounded_only_by_a_heartbeat_after_its_answer() {
        let s = SessionId::new();
        let mut w = Writes::default();
        w.beat(&beat(s, true, at(1, 100)));
        w.beat(&beat(s, false, at(1, 200)));
        w.sent();
        assert_eq!(w.bound(), None, "a write in flight");
        w.answered(true);
        assert_eq!(w.bound(), None, "answered, not yet bounded");
        w.beat(&beat(s, false, at(1, 400)));
        assert_eq!(w.bound().map(|b| b.position), Some(at(1, 400)));
    }

    #[test]
    fn a_failed_write_leaves_the_session_without_a_bound_until_it_ends() {
        let s = SessionId::new();
        let mut w = Writes::default();
        w.beat(&beat(s, true, at(1, 100)));
        w.sent();
        w.answered(false);
        w.beat(&beat(s, false, at(1, 200)));
        w.sent();
        w.answered(true);
        w.beat(&beat(s, false, at(1, 300)));
        assert_eq!(w.bound(), None, "a later write's answer clears no doubt");
        let t = SessionId::new();
        w.beat(&beat(t, true, at(1, 360)));
        w.sent();
        w.beat(&beat(t, false, at(1, 370)));
        w.sent();
        w.answered(true);
        w.beat(&beat(t, false, at(1, 380)));
        assert_eq!(w.bound(), None, "a write given up, then one answered");
        let next = SessionId::new();
        w.beat(&beat(next, true, at(1, 400)));
        w.beat(&beat(next, false, at(1, 500)));
        assert_eq!(
            w.bound().map(|b| (b.session, b.position)),
            Some((next, at(1, 500)))
        );
    }

    #[test]
    fn a_session_unknown_to_the_node_starts_unbounded() {
        // A heartbeat whose answer was lost may have started a session: the next answer
        // names it without `new_session`.
        let (s, t) = (SessionId::new(), SessionId::new());
        let mut w = Writes::default();
        w.beat(&beat(s, true, at(1, 100)));
        w.beat(&beat(s, false, at(1, 200)));
        w.beat(&beat(t, false, at(1, 300)));
        assert_eq!(w.bound(), None);
    }

    #[test]
    fn a_kept_bound_carries_onto_the_new_timeline() {
        let s = SessionId::new();
        let mut w = Writes::default();
        w.beat(&beat(s, true, at(1, 100)));
        w.beat(&beat(s, false, at(1, 200)));
        w.beat(&beat(s, false, at(2, 900)));
        assert_eq!(w.bound().map(|b| b.position), Some(at(2, 200)));
    }
}
