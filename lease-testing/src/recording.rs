//! A handler that records a worker's events into a shared ownership log.

use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use lease_core::ownership_log::OwnershipLog;
use lease_core::{
    Assignment, Bucket, Clock, FencingToken, NodeId, OwnershipEvent, RevokeReason, Timestamp,
};
use lease_worker::OwnershipHandler;

/// A handler that records into a shared [`OwnershipLog`], stamping events with a store-side
/// [`Clock`] (a [`TokioClock`](crate::TokioClock) in paused-time tests), and keeps
/// the worker's own event list.
#[derive(Clone, Debug)]
pub struct RecordingHandler {
    worker: NodeId,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    clock: Arc<dyn Clock>,
}

impl RecordingHandler {
    /// A handler for `worker` writing to `log`.
    pub fn new(
        worker: NodeId,
        log: Arc<Mutex<OwnershipLog<Timestamp>>>,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self { worker, log, clock }
    }

    fn push(&self, event: OwnershipEvent) {
        let at = self.clock.now();
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .record(self.worker, event, at);
    }
}

#[async_trait]
impl OwnershipHandler for RecordingHandler {
    async fn on_assigned(&self, assignment: Assignment) {
        self.push(OwnershipEvent::Assigned(assignment));
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.push(OwnershipEvent::Revoked {
            bucket,
            token,
            reason,
        });
    }
}
