//! What a worker tells the application: buckets assigned and revoked, and errors.

use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::mpsc;

use lease_core::{
    Assignment, Bucket, FencingToken, GroupName, Operation, OwnershipEvent, RevokeReason,
    StoreError,
};

/// A failure the worker survived; it keeps running and retries with backoff.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// A store operation failed; `source` says why (and whether it is transient).
    #[error("{operation} failed")]
    Store {
        /// Which operation.
        operation: Operation,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A store operation did not answer in time.
    #[error("{operation} did not answer within {after:?}")]
    Timeout {
        /// Which operation.
        operation: Operation,
        /// How long it was given.
        after: Duration,
    },
}

/// Why a worker, a node or one of a node's groups ended without being asked to (or, asked to
/// stop, could not leave).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerFailed {
    /// The application's handler panicked; the worker stopped without leaving the group, so
    /// its leases expire.
    #[error("a handler panicked: {message}")]
    HandlerPanicked {
        /// The panic's message.
        message: String,
    },
    /// The store answered in a way retrying cannot change (the group was re-created with
    /// another shard count, for one): the worker revoked everything, left the group and
    /// stopped.
    #[error(transparent)]
    Store(StoreError),
    /// The worker task was cancelled from outside (its runtime shut down).
    #[error("the lease worker task was cancelled")]
    Cancelled,
    /// Asked to stop, the worker revoked everything but could not leave the group (the store
    /// failed or did not answer): its session and leases stay in the store until they expire,
    /// and only then can other workers take its buckets.
    #[error("stopped, but could not leave the group")]
    LeaveFailed {
        /// Why the leave failed.
        source: WorkerError,
    },
    /// The node this group ran on failed (the node's own result says why,
    /// [`NodeHandle::wait`](crate::NodeHandle::wait)): the group's buckets were revoked and the
    /// group left, as far as the store allowed.
    #[error("the node running this group failed")]
    NodeFailed,
    /// Asked to stop, the node revoked everything but could not leave these groups (the store
    /// failed or did not answer): the node's leases in them stay in the store until its
    /// session expires, and only then can other nodes take those buckets. Each group's
    /// [`GroupHandle`](crate::GroupHandle) says why.
    #[error("stopped, but could not leave group(s) {}", names(groups))]
    GroupsNotLeft {
        /// The groups, in the order they ended.
        groups: Vec<GroupName>,
    },
    /// Asked to stop with `keep_on_stop`, the node revoked everything but could not hand its
    /// session over (the store failed or did not answer, or the session had already ended):
    /// its memberships and leases stay in the store until the session expires; a successor
    /// is refused until then.
    #[error(
        "stopped, but the session could not be handed over{}; its buckets pass on when it expires",
        source.as_ref().map(|e| format!(": {e}")).unwrap_or_else(|| " (it had ended)".to_owned())
    )]
    HandOverFailed {
        /// Why, when the store said or did not answer; `None` when the session had ended.
        source: Option<WorkerError>,
    },
}

fn names(groups: &[GroupName]) -> String {
    groups
        .iter()
        .map(|g| format!("{:?}", g.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The application side of a group: one handler per group of a node (a worker is a node of one
/// group). Calls are awaited one at a time, in order, on a task of the group's own; for each
/// bucket an assignment always comes before its revocation, and a shed bucket is released
/// only after `on_revoked` returns. The node renews its session while a handler works (a slow
/// handler delays its own group's events, never the renewals nor the other groups'), but a
/// handler call that outlasts the trust deadline (`ttl - margin` after the last heartbeat was
/// sent) holds a bucket the node no longer trusts: the node revokes it once the call
/// returns. A panicking handler stops the whole node at once, as a crash would: no group is
/// revoked or left, and its leases expire ([`WorkerHandle::wait`](crate::WorkerHandle::wait)
/// and [`NodeHandle::wait`](crate::NodeHandle::wait) report it).
#[async_trait]
pub trait OwnershipHandler: Send + Sync + 'static {
    /// The worker now owns a bucket with a token: start working on it. After a resize the
    /// assignment names the bucket's shard count and its parents, whose checkpoints its keys
    /// continue ([`Assignment::parents`]).
    async fn on_assigned(&self, assignment: Assignment);

    /// The worker no longer owns `bucket`: stop working on it before returning.
    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason);

    /// The worker hit an error and will retry (also logged through `tracing`).
    async fn on_error(&self, _error: &WorkerError) {}
}

/// A handler that forwards every event to a channel, for applications that prefer a stream.
/// With it, "revoked before released" means the event was queued before the release; the
/// channel's capacity bounds how far the worker runs ahead of the application.
#[derive(Debug, Clone)]
pub struct EventSender {
    tx: mpsc::Sender<OwnershipEvent>,
}

/// A channel of [`OwnershipEvent`]s and its sending handler.
pub fn event_channel(capacity: usize) -> (EventSender, mpsc::Receiver<OwnershipEvent>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (EventSender { tx }, rx)
}

#[async_trait]
impl OwnershipHandler for EventSender {
    async fn on_assigned(&self, assignment: Assignment) {
        // A dropped receiver means nobody listens any more; the worker carries on.
        self.tx
            .send(OwnershipEvent::Assigned(assignment))
            .await
            .ok();
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.tx
            .send(OwnershipEvent::Revoked {
                bucket,
                token,
                reason,
            })
            .await
            .ok();
    }
}
