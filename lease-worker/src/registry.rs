//! A node (or worker) configuration runs as one task at a time: a clone of a running
//! configuration started again is refused, as two tasks of one node would break contract rule
//! G8 (one caller per incarnation) and compete for its session.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use lease_core::{GroupName, NodeId, StoreError};

/// Whether a configuration (and its clones) is running; shared by the clones.
#[derive(Debug, Clone, Default)]
pub(crate) struct RunFlag(Arc<AtomicBool>);

/// A configuration running; dropping it (when the worker task ends) lets it start again.
#[derive(Debug)]
pub(crate) struct Running(Arc<AtomicBool>);

impl RunFlag {
    /// Mark the configuration running, or say it runs already.
    pub(crate) fn claim(&self, group: &GroupName, worker: NodeId) -> Result<Running, StartError> {
        if self
            .0
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(StartError::AlreadyRunning {
                group: group.clone(),
                worker,
            });
        }
        Ok(Running(self.0.clone()))
    }

    /// Mark a node configuration running, or say it runs already.
    pub(crate) fn claim_node(&self, node: NodeId) -> Result<Running, StartError> {
        if self
            .0
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(StartError::NodeAlreadyRunning { node });
        }
        Ok(Running(self.0.clone()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}

/// Why a worker or a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The store refused: the group exists with another shard count, or the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// This configuration (or a clone of it) is running already: two tasks of one worker
    /// would break contract rule G8 (one caller per incarnation) and compete for its session.
    /// (A configuration built anew with the same node id starts, and is refused by the store
    /// while the other's session lives: `StoreError::NodeIdInUse`.)
    #[error(
        "worker {worker} of group {group:?} is running already; stop it before starting it again"
    )]
    AlreadyRunning {
        /// The group.
        group: GroupName,
        /// The node id.
        worker: NodeId,
    },
    /// This node configuration (or a clone of it) is running already, for the same reason.
    #[error("node {node} is running already; stop it before starting it again")]
    NodeAlreadyRunning {
        /// The node id.
        node: NodeId,
    },
}

impl StartError {
    /// The store's error, if that is why.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(e) => Some(e),
            Self::AlreadyRunning { .. } | Self::NodeAlreadyRunning { .. } => None,
        }
    }
}
