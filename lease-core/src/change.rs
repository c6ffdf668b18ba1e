//! Wake-ups: a store tells the workers of a group that membership or ownership moved, so they
//! re-plan at once instead of at their next renew tick.

use std::fmt;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::task::{Context, Poll, Waker};

use futures_core::Stream;

use crate::ids::NodeId;

/// A change in a group that may call for re-planning.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum Change {
    /// A node joined the group.
    Joined(NodeId),
    /// A node left the group (or was evicted, or started a new session, which ends its
    /// memberships).
    Left(NodeId),
    /// A worker released buckets.
    Released(NodeId),
    /// The group's shard count was changed: owners of the old generation's buckets should
    /// revoke and release them.
    Resized,
    /// An operator changed a member's weight or mode, or a bucket's quarantine: targets
    /// may have moved.
    Controlled,
    /// Changes were dropped because the receiver fell behind, or the store lost its channel
    /// for a while; re-plan anyway.
    Missed,
}

/// A subscription to one group's changes. Wake-ups are hints: a worker that misses one still
/// converges at its next renew tick.
///
/// A feed is any stream of changes, so that this crate needs no async runtime: a store built
/// on tokio wraps a broadcast receiver, say, mapping "lagged" to [`Change::Missed`].
pub struct ChangeFeed {
    // Only ever reached through `&mut self` (`Mutex::get_mut`, no locking): the mutex is there
    // so that a feed is `Sync` whatever the stream is, as a worker's state holding it must be.
    changes: Mutex<Pin<Box<dyn Stream<Item = Change> + Send>>>,
}

impl fmt::Debug for ChangeFeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeFeed").finish_non_exhaustive()
    }
}

impl ChangeFeed {
    /// A feed of the changes `changes` yields; it ends when the stream does (the store went
    /// away).
    pub fn new(changes: impl Stream<Item = Change> + Send + 'static) -> Self {
        Self {
            changes: Mutex::new(Box::pin(changes)),
        }
    }

    fn stream(&mut self) -> Pin<&mut (dyn Stream<Item = Change> + Send)> {
        self.changes
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
    }

    /// The next change; `None` once the store has ended the feed.
    pub async fn recv(&mut self) -> Option<Change> {
        std::future::poll_fn(|cx| self.stream().poll_next(cx)).await
    }

    /// A change already waiting, without waiting for one.
    pub fn try_recv(&mut self) -> Option<Change> {
        let mut cx = Context::from_waker(Waker::noop());
        match self.stream().poll_next(&mut cx) {
            Poll::Ready(change) => change,
            Poll::Pending => None,
        }
    }
}
