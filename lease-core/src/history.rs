//! A bucket's recent history: who held it, from when, and how each holding ended, as the store
//! recorded it ([`LeaseStore::history`](crate::AdminStore::history)). `leasectl status --why`
//! explains a bucket's place from it.

use std::collections::VecDeque;

use crate::ids::{FencingToken, NodeId};
use crate::time::Timestamp;
use crate::view::MemberMode;

/// How many tenures a store keeps per bucket: enough to see a bucket bounce between workers,
/// few enough that the history costs a constant per bucket.
pub const TENURES_KEPT: usize = 8;

/// One node's holding of a bucket: from the claim that won it to its end.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Tenure {
    /// The node that claimed it.
    pub owner: NodeId,
    /// The token the claim gave it.
    pub token: FencingToken,
    /// When the claim won it (the store's time).
    pub began_at: Timestamp,
    /// How and when it ended; `None` while the owner still holds it (or its session ended and
    /// nobody has claimed the bucket since).
    pub ended: Option<TenureEnd>,
}

/// The end of a [`Tenure`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TenureEnd {
    /// When (the store's time of the call that ended it).
    pub at: Timestamp,
    /// How.
    pub reason: EndReason,
}

/// How a [`Tenure`] ended, as far as the store can tell.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum EndReason {
    /// The owner released it: the policy shed it to balance the group (or the owner's weight
    /// is 0). A node that stops leaves its groups instead ([`Left`](Self::Left)).
    Released,
    /// The owner released it while an operator had it draining (`leasectl drain`).
    Drained,
    /// The owner released it while the bucket was under quarantine.
    Quarantined,
    /// The owner's node left the group (a graceful stop).
    Left,
    /// An operator removed the owner from the group (a leave naming no session).
    Evicted,
    /// The owner's session was no longer live and a claim took the bucket (a crash, a pause,
    /// a lost connection): `at` is the claim's time, not the session's expiry.
    Expired,
}

impl EndReason {
    /// The reason's name as stored and printed: `released`, `drained`, `quarantined`, `left`,
    /// `evicted`, `expired`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Drained => "drained",
            Self::Quarantined => "quarantined",
            Self::Left => "left",
            Self::Evicted => "evicted",
            Self::Expired => "expired",
        }
    }

    /// The reason named by [`as_str`](Self::as_str); `None` for another name.
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::Released,
            Self::Drained,
            Self::Quarantined,
            Self::Left,
            Self::Evicted,
            Self::Expired,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

impl EndReason {
    /// T2: how a release ends a tenure: `quarantined` if the bucket is under quarantine,
    /// else `drained` if the owner's mode is draining, else `released`.
    pub fn of_release(quarantined: bool, mode: MemberMode) -> Self {
        match (quarantined, mode) {
            (true, _) => Self::Quarantined,
            (false, MemberMode::Draining) => Self::Drained,
            _ => Self::Released,
        }
    }
}

/// A bucket's kept tenures (T3), for stores that hold them in memory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tenures(VecDeque<Tenure>);

impl Tenures {
    /// T1: a claim won the bucket. The oldest tenure goes once [`TENURES_KEPT`] are kept.
    pub fn begin(&mut self, owner: NodeId, token: FencingToken, at: Timestamp) {
        if self.0.len() == TENURES_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(Tenure {
            owner,
            token,
            began_at: at,
            ended: None,
        });
    }

    /// T2: the bucket was given up or taken: the last tenure ends, if it has not.
    pub fn end(&mut self, at: Timestamp, reason: EndReason) {
        if let Some(t) = self.0.back_mut().filter(|t| t.ended.is_none()) {
            t.ended = Some(TenureEnd { at, reason });
        }
    }

    /// The tenures, oldest first.
    pub fn to_vec(&self) -> Vec<Tenure> {
        self.0.iter().copied().collect()
    }
}

/// Tenures read back from storage, oldest first; only the last [`TENURES_KEPT`] are kept.
impl From<Vec<Tenure>> for Tenures {
    fn from(mut tenures: Vec<Tenure>) -> Self {
        let excess = tenures.len().saturating_sub(TENURES_KEPT);
        tenures.drain(..excess);
        Self(tenures.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for r in [
            EndReason::Released,
            EndReason::Drained,
            EndReason::Quarantined,
            EndReason::Left,
            EndReason::Evicted,
            EndReason::Expired,
        ] {
            assert_eq!(EndReason::from_name(r.as_str()), Some(r));
        }
        assert_eq!(EndReason::from_name("shed"), None);
    }

    #[test]
    fn a_release_under_quarantine_is_quarantined_even_while_draining() {
        use MemberMode::*;
        assert_eq!(
            EndReason::of_release(true, Draining),
            EndReason::Quarantined
        );
        assert_eq!(EndReason::of_release(false, Draining), EndReason::Drained);
        assert_eq!(EndReason::of_release(false, Cordoned), EndReason::Released);
        assert_eq!(EndReason::of_release(false, Active), EndReason::Released);
    }

    #[test]
    fn tenures_keep_the_last_ones_and_end_only_an_open_one() {
        let w = NodeId::from_uuid(uuid::Uuid::from_u128(1));
        let t0 = Timestamp::UNIX_EPOCH;
        let mut h = Tenures::default();
        for i in 0..(TENURES_KEPT as i64 + 3) {
            h.begin(w, FencingToken(i + 1), t0);
            h.end(t0, EndReason::Released);
            // A second end does not overwrite the first.
            h.end(t0, EndReason::Expired);
        }
        let v = h.to_vec();
        assert_eq!(v.len(), TENURES_KEPT);
        assert_eq!(v[0].token, FencingToken(4));
        assert_eq!(
            v[TENURES_KEPT - 1].token,
            FencingToken(TENURES_KEPT as i64 + 3)
        );
        assert!(
            v.iter()
                .all(|t| t.ended.map(|e| e.reason) == Some(EndReason::Released))
        );
    }
}
