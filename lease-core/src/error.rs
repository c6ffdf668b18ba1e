//! Errors of the store surface: bad input, contract refusals and backend failures.

use std::error::Error as StdError;

use crate::ids::{Bucket, GroupName, NodeId, ShardCount};
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
    /// The session the caller named is not the node's live session, or the node is not a
    /// member of the group (it never joined, its session expired, or it was evicted): it must
    /// heartbeat (to start a session) and join.
    #[error(
        "worker {worker} has no live session in group {group:?}; heartbeat and join to get one"
    )]
    SessionExpired {
        /// The group.
        group: GroupName,
        /// The worker.
        worker: NodeId,
    },
    /// Another process holds the node id's live session: two processes were given the same
    /// [`NodeId`]. Nothing was written. Retrying helps once that session ends (its process
    /// stops gracefully or its session expires at `expires_at`); the two never share it.
    #[error(
        "node id {worker} is in use: another process holds its live session, which expires \
         at {expires_at} unless renewed"
    )]
    NodeIdInUse {
        /// The node id both processes use.
        worker: NodeId,
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
    /// A [`resize`](crate::AdminStore::resize) named a `from` count the group does not have
    /// (another resize got there first, or the caller's idea of the group is stale). Nothing
    /// was written; retrying the same call cannot help: read the group's count again.
    #[error(
        "group {group:?} has {found} shards, not {from}; nothing was changed (read its count \
         again before resizing)"
    )]
    ResizeFromMismatch {
        /// The group.
        group: GroupName,
        /// The count the caller expected.
        from: ShardCount,
        /// The count the store holds.
        found: ShardCount,
    },
    /// An earlier resize of the group is still draining: `draining` buckets of its old
    /// generation (of `from` buckets) are not retired yet. Nothing was written; retrying helps
    /// once they are (their owners release them, or their sessions die).
    #[error(
        "group {group:?} is still draining its resize from {from} to {to} shards ({draining} \
         old buckets not retired yet); nothing was changed"
    )]
    ResizeInProgress {
        /// The group.
        group: GroupName,
        /// The count of the draining generation.
        from: ShardCount,
        /// The group's current count.
        to: ShardCount,
        /// Old buckets not retired yet.
        draining: u32,
    },
    /// An operator's control named a node that is not a member of the group and has no
    /// control stored there (a mistyped node id, or a node that left before it was ever
    /// controlled). Nothing was written; retrying cannot help until the node joins.
    #[error("worker {worker} is not a member of group {group:?}; nothing was changed")]
    NotAMember {
        /// The group.
        group: GroupName,
        /// The node named.
        worker: NodeId,
    },
    /// A value failed validation.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// The backend could not carry the operation out. [`failure`](BackendFailure) says why,
    /// and whether retrying can help ([`StoreError::is_transient`]); `source` holds the
    /// underlying error, if any. The operation may or may not have been applied; retrying it
    /// is safe (every operation is idempotent for the same caller, except that a retried claim
    /// may win other buckets).
    #[error("{failure}{}", detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Backend {
        /// The operation that failed.
        operation: Operation,
        /// What went wrong, in the store's terms.
        failure: BackendFailure,
        /// What the store adds that the source does not say (which value was corrupt, say).
        detail: Option<String>,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    },
}

/// A store operation ([`WorkerStore`](crate::WorkerStore) or [`AdminStore`](crate::AdminStore)), for errors and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// [`ensure_group`](crate::WorkerStore::ensure_group).
    EnsureGroup,
    /// [`heartbeat`](crate::WorkerStore::heartbeat).
    Heartbeat,
    /// [`join`](crate::WorkerStore::join).
    Join,
    /// [`claim`](crate::WorkerStore::claim).
    Claim,
    /// [`release`](crate::WorkerStore::release).
    Release,
    /// [`leave`](crate::WorkerStore::leave).
    Leave,
    /// [`snapshot`](crate::AdminStore::snapshot).
    Snapshot,
    /// [`nodes`](crate::AdminStore::nodes).
    Nodes,
    /// [`is_current`](crate::WorkerStore::is_current).
    IsCurrent,
    /// [`changes`](crate::WorkerStore::changes).
    Changes,
    /// [`resize`](crate::AdminStore::resize).
    Resize,
    /// [`control`](crate::AdminStore::control).
    Control,
    /// [`quarantine`](crate::AdminStore::quarantine).
    Quarantine,
    /// [`hand_over`](crate::WorkerStore::hand_over).
    HandOver,
    /// [`history`](crate::AdminStore::history).
    History,
    /// [`set_weight`](crate::WorkerStore::set_weight).
    SetWeight,
    /// [`evict`](crate::AdminStore::evict).
    Evict,
    /// [`claim_buckets`](crate::WorkerStore::claim_buckets).
    ClaimBuckets,
    /// [`publish_loads`](crate::WorkerStore::publish_loads).
    PublishLoads,
}

impl Operation {
    /// The operation's name: `heartbeat`, `claim`...
    pub fn as_str(self) -> &'static str {
        match self {
            Self::EnsureGroup => "ensure_group",
            Self::Heartbeat => "heartbeat",
            Self::Join => "join",
            Self::Claim => "claim",
            Self::Release => "release",
            Self::Leave => "leave",
            Self::Snapshot => "snapshot",
            Self::Nodes => "nodes",
            Self::IsCurrent => "is_current",
            Self::Changes => "changes",
            Self::Resize => "resize",
            Self::Control => "control",
            Self::Quarantine => "quarantine",
            Self::HandOver => "hand_over",
            Self::History => "history",
            Self::SetWeight => "set_weight",
            Self::Evict => "evict",
            Self::ClaimBuckets => "claim_buckets",
            Self::PublishLoads => "publish_loads",
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a backend could not carry an operation out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum BackendFailure {
    /// No connection, a lost one, or a server that is starting, stopping, read-only or a
    /// standby. Transient.
    #[error("the store is unavailable")]
    Unavailable,
    /// The store did not answer in time. Transient.
    #[error("the store did not answer in time")]
    Timeout,
    /// The store aborted the operation in a conflict with another (a serialization failure,
    /// a deadlock). Transient.
    #[error("the store aborted the operation in a conflict with another")]
    Conflict,
    /// The store's schema is missing, or older or newer than this build. Permanent: run the
    /// migrations, or upgrade.
    #[error("the lease schema is missing or of another version (run `leasectl migrate`)")]
    SchemaMismatch,
    /// The store's role lacks a privilege the operation needs. Permanent.
    #[error("permission denied")]
    PermissionDenied,
    /// The store refused the credentials. Permanent.
    #[error("authentication failed")]
    Authentication,
    /// The store's configuration cannot work: an invalid address, a database that does not
    /// exist, a pool that cannot hand out connections. Permanent.
    #[error("the store is misconfigured")]
    Misconfigured,
    /// The connection's TLS settings cannot work (no certificate the server accepts, a name
    /// or authority that does not match). Permanent.
    #[error("TLS is misconfigured")]
    Tls,
    /// The store holds data that breaks the schema's own rules, or the store itself broke
    /// (an in-memory store poisoned by a panic). Permanent.
    #[error("the store holds unexpected data")]
    Corrupt,
    /// An error the backend does not recognise. Taken as transient, so that an unknown error
    /// is retried and reported rather than stopping workers.
    #[error("the store failed")]
    Other,
}

impl BackendFailure {
    /// Whether retrying can help.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Self::Unavailable | Self::Timeout | Self::Conflict | Self::Other
        )
    }
}

impl StoreError {
    /// A backend failure of `operation`, caused by `source`.
    pub fn backend(
        operation: Operation,
        failure: BackendFailure,
        source: impl Into<Box<dyn StdError + Send + Sync + 'static>>,
    ) -> Self {
        Self::Backend {
            operation,
            failure,
            detail: None,
            source: Some(source.into()),
        }
    }

    /// A backend failure of `operation` with no underlying error: `detail` says what is wrong.
    pub fn backend_detail(
        operation: Operation,
        failure: BackendFailure,
        detail: impl Into<String>,
    ) -> Self {
        Self::Backend {
            operation,
            failure,
            detail: Some(detail.into()),
            source: None,
        }
    }

    /// Whether retrying the operation later can succeed without anyone changing anything:
    /// a transient backend failure, a session that expired (the next heartbeat starts one),
    /// a node id another process holds (its session ends eventually), or a resize refused
    /// while an earlier one drains (the drain ends once its owners release or die). Everything else
    /// (an unknown group, a shard-count mismatch, a bucket out of range, bad input, a missing
    /// schema, a refused privilege...) needs someone to act first.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::SessionExpired { .. }
            | Self::NodeIdInUse { .. }
            | Self::ResizeInProgress { .. } => true,
            Self::Backend { failure, .. } => failure.is_transient(),
            _ => false,
        }
    }

    /// The kind of failure, without its payload: for matching and for comparing the outcomes of
    /// two stores.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::GroupNotFound { .. } => ErrorKind::GroupNotFound,
            Self::ShardCountMismatch { .. } => ErrorKind::ShardCountMismatch,
            Self::SessionExpired { .. } => ErrorKind::SessionExpired,
            Self::NodeIdInUse { .. } => ErrorKind::NodeIdInUse,
            Self::BucketOutOfRange { .. } => ErrorKind::BucketOutOfRange,
            Self::ResizeFromMismatch { .. } => ErrorKind::ResizeFromMismatch,
            Self::ResizeInProgress { .. } => ErrorKind::ResizeInProgress,
            Self::NotAMember { .. } => ErrorKind::NotAMember,
            Self::InvalidInput(_) => ErrorKind::InvalidInput,
            Self::Backend { .. } => ErrorKind::Backend,
        }
    }
}

/// An error and its sources, each once, joined by `: `: `heartbeat failed: the store is
/// unavailable: error connecting to server: Connection refused`.
pub struct Chain<'a>(pub &'a (dyn StdError + 'static));

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut shown: Vec<String> = Vec::new();
        let mut next = Some(self.0);
        while let Some(err) = next {
            let text = err.to_string();
            // A source whose text its wrapper already shows (a transparent wrapper, or one
            // that embeds its cause) is not repeated.
            if !text.is_empty() && !shown.iter().any(|s| s.ends_with(&text)) {
                shown.push(text);
            }
            next = err.source();
        }
        f.write_str(&shown.join(": "))
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
    /// See [`StoreError::NodeIdInUse`].
    NodeIdInUse,
    /// See [`StoreError::BucketOutOfRange`].
    BucketOutOfRange,
    /// See [`StoreError::ResizeFromMismatch`].
    ResizeFromMismatch,
    /// See [`StoreError::ResizeInProgress`].
    ResizeInProgress,
    /// See [`StoreError::NotAMember`].
    NotAMember,
    /// See [`StoreError::InvalidInput`].
    InvalidInput,
    /// See [`StoreError::Backend`].
    Backend,
}
