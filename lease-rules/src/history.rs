//! A store's history across failovers (the contract's V1-V4): the timeline it runs on, how
//! far its writes have gone, and what each promotion left. A store that never fails over
//! keeps the default (the base timeline, never promoted), under which none of these rules
//! changes anything.

use std::collections::BTreeMap;

use lease_core::{Incarnation, LogPosition, SessionBound, Timestamp};

use crate::rows::NodeRow;

/// The first timeline: the base, which starts no quiet period and has the token floor 1.
pub const BASE_TIMELINE: u64 = 1;

/// Where a store stands in its history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct History {
    /// The timeline the store runs on; a promotion starts the next one.
    pub timeline: u64,
    /// Advances with every operation: a position read after a write is at or after it (H10).
    pub offset: u64,
    /// Where the current timeline's history left its parent's: the end of what the promoted
    /// copy had, from the promotion until a heartbeat records it.
    pub replayed: Option<u64>,
    /// The timelines after the base a heartbeat has run on (V2, V4).
    pub epochs: BTreeMap<u64, Epoch>,
    /// Whether heartbeats answer positions: a store that may fail over.
    pub positions: bool,
}

impl Default for History {
    fn default() -> Self {
        Self {
            timeline: BASE_TIMELINE,
            offset: 0,
            replayed: None,
            epochs: BTreeMap::new(),
            positions: false,
        }
    }
}

/// A timeline as its first heartbeat recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// When the first heartbeat on it ran (V2's quiet period counts from here).
    pub first_seen: Timestamp,
    /// Where its history left its parent's (V4); `None`: unknown, no session is kept.
    pub switch: Option<u64>,
}

impl History {
    /// One more operation.
    pub fn advance(&mut self) {
        self.offset += 1;
    }

    /// Where the history stands, if the store answers positions.
    pub fn position(&self) -> Option<LogPosition> {
        self.positions.then_some(LogPosition {
            timeline: self.timeline,
            offset: self.offset,
        })
    }

    /// This copy of the state becomes the store's on the next timeline: what the store did
    /// after the copy was made is lost, and the switch point is where the copy ends.
    pub fn promote(&mut self) {
        self.timeline += 1;
        self.replayed = Some(self.offset);
    }

    /// Record the current timeline at its first heartbeat `now` (V2, V4).
    pub(crate) fn record(&mut self, now: Timestamp) {
        if self.timeline != BASE_TIMELINE {
            let switch = self.replayed;
            self.epochs.entry(self.timeline).or_insert(Epoch {
                first_seen: now,
                switch,
            });
        }
    }

    /// V3: the least token a claim on this timeline issues.
    pub(crate) fn floor(&self) -> i64 {
        let above = i64::try_from(self.timeline - BASE_TIMELINE).unwrap_or(i64::MAX >> 32);
        (above << 32) + 1
    }

    /// V2: where the quiet period counts from: `None`, no quiet period (the base timeline);
    /// `Some(None)`, the timeline is not recorded yet, so claims take nothing at all;
    /// `Some(Some(t))`, claims take nothing before `t` plus the longest ttl of the group.
    pub(crate) fn quiet_from(&self) -> Option<Option<Timestamp>> {
        (self.timeline != BASE_TIMELINE)
            .then(|| self.epochs.get(&self.timeline).map(|e| e.first_seen))
    }

    /// V4: whether `row`, expired at `now`, may still be kept: a session of an earlier
    /// timeline within its ttl of this timeline's first heartbeat (before which no claim takes
    /// anything, V2; before the first heartbeat, always). Such a row is not removed as dead.
    pub fn revivable(&self, row: &NodeRow, now: Timestamp) -> bool {
        let ttl = row.expires_at - row.heartbeat_at;
        row.timeline != self.timeline
            && self
                .epochs
                .get(&self.timeline)
                .is_none_or(|e| now < e.first_seen + ttl)
    }

    /// V4: how a session of an earlier timeline fares at its first heartbeat on this one,
    /// handed in `bound` by `incarnation` at `now` (the timeline recorded already): `kept`,
    /// or `ended: ` and why, as the Postgres store says it.
    pub(crate) fn crossing(
        &self,
        row: &NodeRow,
        incarnation: Incarnation,
        now: Timestamp,
        bound: Option<SessionBound>,
    ) -> String {
        let switch = self.epochs.get(&self.timeline).and_then(|e| e.switch);
        match (bound, switch) {
            (None, _) => "ended: its writes had no bound".to_owned(),
            (Some(b), _) if b.session != row.session => {
                "ended: the bound was of another session".to_owned()
            }
            _ if row.incarnation != incarnation || row.handed_over => {
                "ended: another process".to_owned()
            }
            _ if !row.is_live(now) && !self.revivable(row, now) => "ended: expired".to_owned(),
            (_, None) => "ended: switch point unknown".to_owned(),
            (Some(b), _) if b.position.timeline + 1 != self.timeline => {
                format!("ended: its writes were on timeline {}", b.position.timeline)
            }
            (Some(b), Some(switch)) if b.position.offset > switch => {
                "ended: writes after the switch point".to_owned()
            }
            _ => KEPT.to_owned(),
        }
    }
}

/// What [`History::crossing`] says of a session kept.
pub(crate) const KEPT: &str = "kept";
