//! What a worker tells its application about ownership: the vocabulary of the worker runtime,
//! and of the ownership logs that judge it.

use crate::ids::{Bucket, FencingToken, ShardCount};
use crate::resize;

/// Why the application must stop working on a bucket.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum RevokeReason {
    /// The fair share moved: the worker gives the bucket up for another member. It is released
    /// only after the handler returns.
    Shed,
    /// The store says the worker does not own the bucket any more.
    Lost,
    /// The node could not renew before its trust deadline (`sent + ttl - margin` after its
    /// last successful heartbeat: the store unreachable, calls too slow, the process paused):
    /// the lease can no longer be trusted, and may pass to another node from then on.
    Fenced,
    /// The store says the node's session ended (a heartbeat answered with a new session):
    /// nothing held under the old one is the node's any more.
    Expired,
    /// The worker is stopping.
    Shutdown,
    /// The group's shard count changed: the bucket belongs to the old generation and is
    /// released once the handler returns, so that the new buckets sharing its keys can be
    /// claimed (the application may checkpoint first).
    Resharded,
    /// An operator drained the worker (`leasectl drain`), or set its weight to 0: it gives up
    /// everything it holds and claims nothing until `uncordon` (or a weight above 0).
    Drained,
    /// An operator put the bucket under quarantine (`leasectl quarantine`): nobody may claim
    /// it until the quarantine ends or is lifted.
    Quarantined,
}

impl RevokeReason {
    /// `shed`, `lost`, `fenced`, `expired`, `shutdown`, `resharded`, `drained` or
    /// `quarantined`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Shed => "shed",
            Self::Lost => "lost",
            Self::Fenced => "fenced",
            Self::Expired => "expired",
            Self::Shutdown => "shutdown",
            Self::Resharded => "resharded",
            Self::Drained => "drained",
            Self::Quarantined => "quarantined",
        }
    }
}

/// A bucket handed to the application: which one, with which token, and of which generation
/// of the group.
///
/// After a [`resize`](crate::AdminStore::resize) a bucket's keys were held by other buckets
/// before (its [`parents`](Self::parents)): an application that keeps a checkpoint per bucket
/// and has none for this one continues from its parents' (the lowest of their positions, when
/// the work is ordered per key).
///
/// ```
/// use lease_core::{Assignment, Bucket, FencingToken, ShardCount};
/// let a = Assignment {
///     bucket: Bucket(5),
///     token: FencingToken(3),
///     shards: ShardCount::new(24)?,
///     resized_from: Some(ShardCount::new(16)?),
/// };
/// assert_eq!(a.parents(), vec![Bucket(5), Bucket(13)]);
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Assignment {
    /// The bucket.
    pub bucket: Bucket,
    /// Its fencing token.
    pub token: FencingToken,
    /// The shard count of the bucket's generation: keys with `hash mod shards == bucket` are
    /// this bucket's ([`ShardCount::bucket_of`]).
    pub shards: ShardCount,
    /// The count the bucket's generation was resized from; `None` for a group never resized.
    pub resized_from: Option<ShardCount>,
}

impl Assignment {
    /// The buckets of the previous generation that held this bucket's keys, in order
    /// ([`resize::parents`]); empty for a group never resized.
    pub fn parents(&self) -> Vec<Bucket> {
        self.resized_from
            .map(|from| resize::parents(from, self.shards, self.bucket))
            .unwrap_or_default()
    }

    /// Whether this bucket and `other` (of `other_shards` buckets) hold a key in common.
    pub fn shares_keys(&self, other: Bucket, other_shards: ShardCount) -> bool {
        resize::shares_keys(self.shards, other_shards, self.bucket, other)
    }
}

/// A change of what the application owns.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum OwnershipEvent {
    /// Start working on a bucket, fencing writes with its token.
    Assigned(Assignment),
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
