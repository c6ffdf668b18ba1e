//! What a worker tells its application about ownership: the vocabulary of the worker runtime,
//! and of the ownership logs that judge it.

use crate::ids::{Bucket, FencingToken};

/// Why the application must stop working on a bucket.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RevokeReason {
    /// The fair share moved: the worker gives the bucket up for another member. It is released
    /// only after the handler returns.
    Shed,
    /// The store says the worker does not own the bucket any more.
    Lost,
    /// The worker could not renew in time (store unreachable, process paused, or the store
    /// reported the session expired): the lease can no longer be trusted.
    Expired,
    /// The worker is stopping.
    Shutdown,
    /// The group's shard count changed: the bucket belongs to the old generation and is
    /// released once the handler returns, so that the new buckets sharing its keys can be
    /// claimed (the application may checkpoint first).
    Resharded,
}

impl RevokeReason {
    /// `shed`, `lost`, `expired`, `shutdown` or `resharded`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shed => "shed",
            Self::Lost => "lost",
            Self::Expired => "expired",
            Self::Shutdown => "shutdown",
            Self::Resharded => "resharded",
        }
    }
}

/// A change of what the application owns.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OwnershipEvent {
    /// Start working on `bucket`, fencing writes with `token`.
    Assigned {
        /// The bucket.
        bucket: Bucket,
        /// Its fencing token.
        token: FencingToken,
    },
    /// Stop working on `bucket` now.
    Revoked {
        /// The bucket.
        bucket: Bucket,
        /// The token it was held with.
        token: FencingToken,
        /// Why.
        reason: RevokeReason,
    },
}
