//! Values that failed validation when they were built.

use std::time::Duration;

/// A value that failed validation when it was built. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// A group name must not be empty.
    #[error("group name is empty")]
    EmptyGroupName,
    /// A group name is longer than allowed.
    #[error("group name is {bytes} bytes long; at most {max} are allowed")]
    GroupNameTooLong {
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A group name contains a NUL character, which Postgres text cannot store.
    #[error("group name contains a NUL character")]
    GroupNameHasNul,
    /// A shard count outside `1..=65_536`.
    #[error("shard count {value} is out of range; it must be between 1 and 65536")]
    ShardCountOutOfRange {
        /// The value given.
        value: i64,
    },
    /// A ttl outside its bounds.
    #[error("ttl {value:?} is out of range; it must be between {min:?} and {max:?}")]
    TtlOutOfRange {
        /// The value given.
        value: Duration,
        /// The shortest allowed.
        min: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// A node id that is not a UUID.
    #[error("node id {value:?} is not a UUID")]
    NodeIdNotUuid {
        /// The text given (at most 64 characters of it).
        value: String,
    },
    /// Member metadata longer than allowed.
    #[error("member metadata is {bytes} bytes long; at most {max} are allowed")]
    MetadataTooLong {
        /// Its length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Member metadata containing a NUL character.
    #[error("member metadata contains a NUL character")]
    MetadataHasNul,
    /// A weight above the maximum.
    #[error("weight {value} is out of range; it must be between 0 and {max}")]
    WeightOutOfRange {
        /// The value given.
        value: u64,
        /// The largest allowed.
        max: u32,
    },
    /// A weight that is not a whole number.
    #[error("weight {value:?} is not a whole number")]
    WeightNotANumber {
        /// The text given (at most 64 characters of it).
        value: String,
    },
    /// A quarantine too short or too long.
    #[error("quarantine of {value:?} is out of range; it must be between 1ms and {max:?}")]
    QuarantineOutOfRange {
        /// The value given.
        value: Duration,
        /// The longest allowed.
        max: Duration,
    },
    /// A quarantine's reason that is empty or too long.
    #[error("a quarantine's reason must be 1 to {max} characters, not {len}")]
    QuarantineReasonLength {
        /// Its length in characters.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A load that is negative, not a number, infinite or too large.
    #[error("load {value} is out of range; it must be a number between 0 and {max}")]
    LoadOutOfRange {
        /// The value given, as text.
        value: String,
        /// The largest load, in units.
        max: u64,
    },
    /// A load's half-life of zero or longer than allowed.
    #[error("half-life {value:?} is out of range; it must be above 0 and at most {max:?}")]
    HalfLifeOutOfRange {
        /// The value given.
        value: Duration,
        /// The longest allowed.
        max: Duration,
    },
}
