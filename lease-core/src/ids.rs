//! Identifiers and counts, each validated when it is built.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

use crate::invalid::InvalidInput;

/// The name of a group of buckets: a subscription, a consumer group, a queue.
///
/// Any UTF-8 text of 1 to [`GroupName::MAX_BYTES`] bytes without a NUL character (Postgres
/// text cannot hold one). Names are always passed to a store as data, never spliced into SQL,
/// so quotes, unicode and SQL fragments are ordinary names.
///
/// ```
/// use lease_core::GroupName;
/// let name = GroupName::new("orders-projection")?;
/// assert_eq!(name.as_str(), "orders-projection");
/// assert!(GroupName::new("").is_err());
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupName(String);

impl GroupName {
    /// The longest name accepted, in bytes.
    pub const MAX_BYTES: usize = 200;

    /// Validate and wrap a group name.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidInput> {
        let name = name.into();
        if name.is_empty() {
            return Err(InvalidInput::EmptyGroupName);
        }
        if name.len() > Self::MAX_BYTES {
            return Err(InvalidInput::GroupNameTooLong {
                bytes: name.len(),
                max: Self::MAX_BYTES,
            });
        }
        if name.contains('\0') {
            return Err(InvalidInput::GroupNameHasNul);
        }
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl FromStr for GroupName {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for GroupName {
    type Error = InvalidInput;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for GroupName {
    type Error = InvalidInput;
    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl AsRef<str> for GroupName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// How many buckets a group is split into: `1..=65_536`.
///
/// ```
/// use lease_core::ShardCount;
/// assert_eq!(ShardCount::new(64)?.get(), 64);
/// assert!(ShardCount::new(0).is_err());
/// assert!(ShardCount::new(65_537).is_err());
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ShardCount(u32);

impl ShardCount {
    /// The fewest buckets a group can have.
    pub const MIN: u32 = 1;
    /// The most buckets a group can have.
    pub const MAX: u32 = 65_536;

    /// Validate a shard count.
    pub fn new(n: u32) -> Result<Self, InvalidInput> {
        if (Self::MIN..=Self::MAX).contains(&n) {
            Ok(Self(n))
        } else {
            Err(InvalidInput::ShardCountOutOfRange {
                value: i64::from(n),
            })
        }
    }

    /// Validate a shard count read from a wider integer (a database column, a flag).
    pub fn try_from_i64(n: i64) -> Result<Self, InvalidInput> {
        u32::try_from(n)
            .ok()
            .and_then(|n| Self::new(n).ok())
            .ok_or(InvalidInput::ShardCountOutOfRange { value: n })
    }

    /// The number of buckets.
    pub fn get(self) -> u32 {
        self.0
    }

    /// The bucket a key with hash `hash` belongs to: `hash mod n`. This is the routing rule
    /// of the library: applications route work to buckets with it (or the same rule), and a
    /// [`resize`](crate::AdminStore::resize) relies on it to know which old and new buckets
    /// share keys ([`crate::resize`]).
    ///
    /// ```
    /// use lease_core::{Bucket, ShardCount};
    /// assert_eq!(ShardCount::new(16)?.bucket_of(37), Bucket(5));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn bucket_of(self, hash: u64) -> Bucket {
        // The remainder is below `n`, a u32.
        Bucket((hash % u64::from(self.0)) as u32)
    }

    /// Whether `bucket` is one of this group's buckets (`0..n`).
    pub fn contains(self, bucket: Bucket) -> bool {
        bucket.0 < self.0
    }

    /// Every bucket of the group, in order.
    pub fn buckets(self) -> impl DoubleEndedIterator<Item = Bucket> + ExactSizeIterator {
        (0..self.0).map(Bucket)
    }

    /// The bucket `worker`'s claims start from: the node id's low 32 bits
    /// ([`NodeId::claim_seed`]) modulo the shard count. A claim takes claimable buckets from
    /// here upwards, wrapping around to 0, so that workers claiming at the same time mostly
    /// look at different buckets.
    ///
    /// ```
    /// use lease_core::{Bucket, ShardCount, NodeId};
    /// let w = NodeId::from_uuid(uuid::Uuid::from_u128(0xABCD_0000_0000_0000_0000_0000_0000_000A));
    /// assert_eq!(ShardCount::new(8)?.claim_start(w), Bucket(2));
    /// # Ok::<(), lease_core::InvalidInput>(())
    /// ```
    pub fn claim_start(self, worker: NodeId) -> Bucket {
        Bucket(worker.claim_seed() % self.0)
    }

    /// The buckets in `worker`'s claim order: from [`claim_start`](Self::claim_start) up, then
    /// from 0.
    pub fn claim_order(self, worker: NodeId) -> impl Iterator<Item = Bucket> {
        let start = self.claim_start(worker).0;
        (start..self.0).chain(0..start).map(Bucket)
    }
}

impl fmt::Display for ShardCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl TryFrom<u32> for ShardCount {
    type Error = InvalidInput;
    fn try_from(n: u32) -> Result<Self, Self::Error> {
        Self::new(n)
    }
}

/// One bucket of a group, numbered from 0. Whether it is in range is checked against the
/// group's [`ShardCount`] by the operation that uses it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Bucket(pub u32);

impl Bucket {
    /// The bucket number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl fmt::Display for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl From<u32> for Bucket {
    fn from(n: u32) -> Self {
        Self(n)
    }
}

/// A worker process, minted once per process start. Two starts of the same binary are two
/// workers, so a restarted process never inherits the leases of the one that died.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct NodeId(Uuid);

impl NodeId {
    /// A fresh, time-ordered id (UUID v7).
    pub fn new() -> Self {
        Self(Uuid::now_v7())
    }

    /// Wrap an existing UUID.
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }

    /// The id's low 32 bits, where its claims start (see [`ShardCount::claim_start`]). Random
    /// in a fresh (v7) id.
    pub fn claim_seed(&self) -> u32 {
        // The low 32 bits of the 128-bit value, by design.
        self.0.as_u128() as u32
    }
}

impl Default for NodeId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for NodeId {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Uuid::parse_str(s)
            .map(Self)
            .map_err(|_| InvalidInput::NodeIdNotUuid {
                value: s.chars().take(64).collect(),
            })
    }
}

/// One liveness session of a worker in a group, minted by the store. A session that expired is
/// never renewed: the worker's next heartbeat starts a new session with a new id.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SessionId(Uuid);

impl SessionId {
    /// A fresh random session id.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wrap an existing UUID.
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for SessionId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// One start of a worker: minted afresh each time a worker starts, and sent with every
/// heartbeat. A session belongs to the incarnation that started it: only that incarnation can
/// extend it, so two processes given the same [`NodeId`] (a restarted pod whose predecessor
/// is still terminating, a copied configuration) never share a session; the second is refused
/// with [`StoreError::NodeIdInUse`](crate::StoreError::NodeIdInUse) until the first one's
/// session ends.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Incarnation(Uuid);

impl Incarnation {
    /// A fresh random incarnation.
    pub fn new() -> Self {
        Self(Uuid::new_v4())
    }

    /// Wrap an existing UUID.
    pub fn from_uuid(id: Uuid) -> Self {
        Self(id)
    }

    /// The UUID.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for Incarnation {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for Incarnation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// A per-bucket number that strictly increases on every change of ownership and never on a
/// renewal or a release. A bucket never owned has token 0; its first owner holds token 1.
///
/// Systems a worker writes to can reject a write carrying a token lower than one they have
/// seen, which is how a paused ("zombie") former owner is told apart from the new one.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct FencingToken(pub i64);

impl FencingToken {
    /// The token number.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// Free-form text a worker attaches to its membership (host, pid, version), shown by
/// `leasectl status`. At most [`MemberMetadata::MAX_BYTES`] bytes, no NUL character.
#[derive(Clone, PartialEq, Eq, Hash, Debug, Default)]
pub struct MemberMetadata(String);

impl MemberMetadata {
    /// The longest metadata accepted, in bytes.
    pub const MAX_BYTES: usize = 1024;

    /// Validate and wrap metadata text.
    pub fn new(text: impl Into<String>) -> Result<Self, InvalidInput> {
        let text = text.into();
        if text.len() > Self::MAX_BYTES {
            return Err(InvalidInput::MetadataTooLong {
                bytes: text.len(),
                max: Self::MAX_BYTES,
            });
        }
        if text.contains('\0') {
            return Err(InvalidInput::MetadataHasNul);
        }
        Ok(Self(text))
    }

    /// Empty metadata.
    pub fn empty() -> Self {
        Self(String::new())
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberMetadata {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_names_are_validated() {
        assert_eq!(GroupName::new(""), Err(InvalidInput::EmptyGroupName));
        assert_eq!(
            GroupName::new("x".repeat(201)),
            Err(InvalidInput::GroupNameTooLong {
                bytes: 201,
                max: 200
            })
        );
        assert!(GroupName::new("x".repeat(200)).is_ok());
        // 50 four-byte characters are exactly 200 bytes; one more is too many.
        assert!(GroupName::new("🦀".repeat(50)).is_ok());
        assert!(GroupName::new("🦀".repeat(51)).is_err());
        assert_eq!(GroupName::new("a\0b"), Err(InvalidInput::GroupNameHasNul));
        let odd = "o'brien\"; DROP TABLE lease.shards; --";
        assert_eq!(GroupName::new(odd).unwrap().as_str(), odd);
    }

    #[test]
    fn shard_counts_are_validated() {
        assert!(ShardCount::new(0).is_err());
        assert_eq!(ShardCount::new(1).unwrap().get(), 1);
        assert_eq!(ShardCount::new(65_536).unwrap().get(), 65_536);
        assert_eq!(
            ShardCount::new(65_537),
            Err(InvalidInput::ShardCountOutOfRange { value: 65_537 })
        );
        assert!(ShardCount::try_from_i64(-1).is_err());
        assert!(ShardCount::try_from_i64(i64::MAX).is_err());
        assert_eq!(ShardCount::try_from_i64(12).unwrap().get(), 12);
        let n = ShardCount::new(3).unwrap();
        assert!(n.contains(Bucket(2)));
        assert!(!n.contains(Bucket(3)));
        assert_eq!(
            n.buckets().collect::<Vec<_>>(),
            vec![Bucket(0), Bucket(1), Bucket(2)]
        );
    }

    #[test]
    fn node_ids_parse_and_print() {
        let w = NodeId::new();
        assert_eq!(w.to_string().parse::<NodeId>().unwrap(), w);
        assert!(matches!(
            "not-a-uuid".parse::<NodeId>(),
            Err(InvalidInput::NodeIdNotUuid { .. })
        ));
    }

    #[test]
    fn metadata_is_validated() {
        assert!(MemberMetadata::new("host=a pid=1").is_ok());
        assert!(MemberMetadata::new("x".repeat(1025)).is_err());
        assert_eq!(MemberMetadata::new("\0"), Err(InvalidInput::MetadataHasNul));
    }
}
