//! Errors of the store surface: bad input, contract refusals and backend failures.

use std::error::Error as StdError;

use crate::ids::{Bucket, GroupName, ShardCount, WorkerId};
use crate::invalid::InvalidInput;

/// Everything a [`LeaseStore`](crate::LeaseStore) operation can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The group was never created with `ensure_group`.
    #[error("group {group:?} does not exist; create it with ensure_group first")]
    GroupNotFound {
        /// The group asked for.
        group: GroupName,
    },
    /// The group exists with a different number of buckets. Nothing was written.
    #[error(
        "group {group:?} exists with {found} shards but {configured} were configured; \
         nothing was changed"
    )]
    ShardCountMismatch {
        /// The group.
        group: GroupName,
        /// The count the caller asked for.
        configured: ShardCount,
        /// The count the store holds.
        found: ShardCount,
    },
    /// The session the caller named is not the worker's live session in the group (it never
    /// sent a heartbeat, its session expired, or it was evicted); it must heartbeat to start a
    /// new one.
    #[error("worker {worker} has no live session in group {group:?}; heartbeat to start one")]
    SessionExpired {
        /// The group.
        group: GroupName,
        /// The worker.
        worker: WorkerId,
    },
    /// Another process holds the worker id's live session: two processes were given the same
    /// [`WorkerId`]. Nothing was written. Retrying helps once that session ends (its process
    /// stops gracefully or its session expires at `expires_at`); the two never share it.
    #[error(
        "worker id {worker} is in use in group {group:?}: another process holds its live \
         session, which expires at {expires_at} unless renewed"
    )]
    WorkerIdInUse {
        /// The group.
        group: GroupName,
        /// The worker id both processes use.
        worker: WorkerId,
        /// When the other process's session expires unless it renews it (store clock).
        expires_at: chrono::DateTime<chrono::Utc>,
    },
    /// A bucket number outside the group's `0..n`. Nothing was written.
    #[error("bucket {bucket} is out of range for group {group:?} with {shard_count} shards")]
    BucketOutOfRange {
        /// The group.
        group: GroupName,
        /// The bucket given.
        bucket: Bucket,
        /// The group's shard count.
        shard_count: ShardCount,
    },
    /// A value failed validation.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// The backend failed: connection refused or lost, query error, pool timeout. The
    /// operation may or may not have been applied; retrying it is safe (every operation is
    /// idempotent for the same caller, except that a retried claim may win other buckets).
    #[error("store backend failed: {message}")]
    Backend {
        /// What failed, for people.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    },
}

impl StoreError {
    /// A backend failure with an underlying cause.
    pub fn backend(
        message: impl Into<String>,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// The kind of failure, without its payload: for matching and for comparing the outcomes of
    /// two stores.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::GroupNotFound { .. } => ErrorKind::GroupNotFound,
            Self::ShardCountMismatch { .. } => ErrorKind::ShardCountMismatch,
            Self::SessionExpired { .. } => ErrorKind::SessionExpired,
            Self::WorkerIdInUse { .. } => ErrorKind::WorkerIdInUse,
            Self::BucketOutOfRange { .. } => ErrorKind::BucketOutOfRange,
            Self::InvalidInput(_) => ErrorKind::InvalidInput,
            Self::Backend { .. } => ErrorKind::Backend,
        }
    }
}

/// The kind of a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`StoreError::GroupNotFound`].
    GroupNotFound,
    /// See [`StoreError::ShardCountMismatch`].
    ShardCountMismatch,
    /// See [`StoreError::SessionExpired`].
    SessionExpired,
    /// See [`StoreError::WorkerIdInUse`].
    WorkerIdInUse,
    /// See [`StoreError::BucketOutOfRange`].
    BucketOutOfRange,
    /// See [`StoreError::InvalidInput`].
    InvalidInput,
    /// See [`StoreError::Backend`].
    Backend,
}
