//! Wake-ups: a store tells the workers of a group that membership or ownership moved, so they
//! re-plan at once instead of at their next renew tick.

use tokio::sync::broadcast;

use crate::ids::WorkerId;

/// A change in a group that may call for re-planning.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Change {
    /// A worker started a new session.
    Joined(WorkerId),
    /// A worker left the group.
    Left(WorkerId),
    /// A worker released buckets.
    Released(WorkerId),
    /// Changes were dropped because the receiver fell behind; re-plan anyway.
    Missed,
}

/// A subscription to one group's changes. Wake-ups are hints: a worker that misses one still
/// converges at its next renew tick.
#[derive(Debug)]
pub struct ChangeFeed {
    rx: broadcast::Receiver<Change>,
}

impl ChangeFeed {
    /// Wrap a broadcast receiver that a store feeds.
    pub fn new(rx: broadcast::Receiver<Change>) -> Self {
        Self { rx }
    }

    /// The next change; `None` once the store has dropped the feed's sender.
    pub async fn recv(&mut self) -> Option<Change> {
        match self.rx.recv().await {
            Ok(change) => Some(change),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Change::Missed),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }

    /// A change already waiting, without waiting for one.
    pub fn try_recv(&mut self) -> Option<Change> {
        match self.rx.try_recv() {
            Ok(change) => Some(change),
            Err(broadcast::error::TryRecvError::Lagged(_)) => Some(Change::Missed),
            Err(_) => None,
        }
    }
}
