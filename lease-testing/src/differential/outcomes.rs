//! What the stores' answers are compared as: an [`Outcome`] per operation, with the session
//! ids each store mints renamed by order of appearance ([`SessionNames`]), so that two stores
//! agree exactly when their answers mean the same.

use std::collections::HashMap;

use lease_core::{
    Bucket, GroupSnapshot, Heartbeat, Lease, NodesSnapshot, ResizeOutcome, SessionId, Tenure,
    Timestamp,
};
use uuid::Uuid;

/// The result of one operation, in a form two stores can be compared by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The operation succeeded with nothing to report (ensure, advance).
    Done,
    /// A heartbeat's result, every group's view given (stamps cleared: they are the store's).
    Heartbeat(Heartbeat),
    /// A tick: the heartbeat's outcome, the join's if one was made, and the claim's if the
    /// node got that far.
    Tick(Box<Outcome>, Option<Box<Outcome>>, Option<Box<Outcome>>),
    /// A listing of the nodes.
    Nodes(NodesSnapshot),
    /// A claim's leases.
    Leases(Vec<Lease>),
    /// Released buckets.
    Buckets(Vec<Bucket>),
    /// How many loads a publication recorded.
    Recorded(u32),
    /// A snapshot.
    Snapshot(GroupSnapshot),
    /// A fencing check.
    Bool(bool),
    /// A resize's outcome.
    Resized(ResizeOutcome),
    /// A hand-over's outcome: the session's new expiry, if it was handed over.
    HandedOver(Option<Timestamp>),
    /// A bucket's history.
    History(Vec<Tenure>),
    /// A failure, with every field: the error as it displays (a contract error shows all its
    /// fields, so two stores agree on it only if they agree on each).
    Failed(String),
}

/// Renames session ids to their order of first appearance, so two stores that mint different
/// ids can be compared.
#[derive(Clone, Debug, Default)]
pub struct SessionNames(HashMap<SessionId, u128>);

impl SessionNames {
    fn name(&mut self, s: &mut SessionId) {
        let next = self.0.len() as u128 + 1;
        let n = *self.0.entry(*s).or_insert(next);
        *s = SessionId::from_uuid(Uuid::from_u128(n));
    }

    /// Rewrite every session id in `outcome`, and drop a heartbeat's position: each store's
    /// own count (etcd gives none), which only its own later heartbeats compare with (H10).
    pub fn normalize(&mut self, outcome: &mut Outcome) {
        match outcome {
            Outcome::Heartbeat(hb) => {
                self.name(&mut hb.session);
                hb.position = None;
            }
            Outcome::Tick(beat, join, claim) => {
                self.normalize(beat);
                for part in [join, claim].into_iter().flatten() {
                    self.normalize(part);
                }
            }
            Outcome::Nodes(listing) => {
                for n in &mut listing.nodes {
                    self.name(&mut n.session);
                }
            }
            Outcome::Snapshot(snap) => {
                for m in &mut snap.members {
                    self.name(&mut m.session);
                }
                for b in snap.buckets.iter_mut().chain(&mut snap.draining) {
                    if let Some(s) = &mut b.session {
                        self.name(s);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The leases an outcome says a claim won.
pub(super) fn won(out: &Outcome) -> &[Lease] {
    match out {
        Outcome::Leases(won) => won,
        Outcome::Tick(_, _, Some(claim)) => won(claim),
        _ => &[],
    }
}
