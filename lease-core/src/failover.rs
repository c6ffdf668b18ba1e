//! Where a store's write history stands, and the bound of a session's writes that lets the
//! session be kept across a failover that lost none of them (rule V4, the trait's
//! "Failover").

use std::fmt;

use crate::ids::SessionId;

/// A position in a store's write history: a timeline (a promotion starts a new one) and an
/// offset on it that grows with every write (Postgres: the WAL's byte position, an LSN).
/// Positions of one timeline compare by offset; a promoted store's timeline carries on its
/// parent's history up to the switch point, and no further.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct LogPosition {
    /// The timeline.
    pub timeline: u64,
    /// The offset on it.
    pub offset: u64,
}

impl fmt::Display for LogPosition {
    /// `timeline:HI/LO`, the offset as Postgres writes an LSN.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{:X}/{:X}",
            self.timeline,
            self.offset >> 32,
            self.offset & 0xFFFF_FFFF
        )
    }
}

/// What a heartbeat hands in to keep its session across a failover (V4): the session, and a
/// position at or after the commit of every write made under it.
///
/// The position is one a [`Heartbeat`](crate::Heartbeat) answered
/// ([`position`](crate::Heartbeat::position)), sent after every write under the session was
/// answered: the *first* such answer after the last write, not the latest (a later position
/// may run ahead of what a synchronous standby had received of other sessions' writes in
/// flight, and would end the session for nothing). A write whose call failed may commit
/// later than any read: it leaves the session without a bound.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SessionBound {
    /// The session whose writes are bounded.
    pub session: SessionId,
    /// At or after the commit of each of them.
    pub position: LogPosition,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_position_reads_as_an_lsn_on_its_timeline() {
        let p = LogPosition {
            timeline: 2,
            offset: (1 << 32) + 0x3000_0060,
        };
        assert_eq!(p.to_string(), "2:1/30000060");
    }
}
