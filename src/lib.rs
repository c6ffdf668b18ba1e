#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

//! ## This crate
//!
//! The facade an application depends on. The root holds what an application touches, and
//! nothing else; what backend authors, operators' tools and tests need lives in modules named
//! for who needs it. Each item of `lease-core` and `lease-worker` has exactly one home here.
//!
//! - **The root**: the builders ([`LeaseNode`], [`LeaseWorker`] and their builders,
//!   [`ConfigError`]), the handles they start ([`NodeHandle`], [`GroupHandle`],
//!   [`WorkerHandle`], [`StartError`], [`GroupError`]), the application side
//!   ([`OwnershipHandler`] and its events, [`event_channel`], [`BucketLease`] and [`Leases`],
//!   [`Owned`], the errors a handler hears: [`WorkerError`], [`WorkerFailed`]), the ids and
//!   values an application names to call them ([`GroupName`], [`ShardCount`], [`NodeId`],
//!   [`Bucket`], [`FencingToken`], [`Ttl`], [`MemberMetadata`], [`Weight`]) and the errors
//!   it handles ([`StoreError`] and its [`ErrorKind`], [`InvalidInput`]).
//! - [`store`]: the [`LeaseStore`](store::LeaseStore) contract and everything its signatures
//!   name (sessions, heartbeats and views, backend failures, change feeds, clocks, operators'
//!   controls, bucket history, resizes): for backend authors, operators' tools and tests that
//!   drive a store by hand. A mockall mock of it behind the feature `mock`.
//! - [`policy`]: the pure fair-share policy every worker runs.
//! - [`machine`]: the node's rules as a sans-IO state machine, for custom drivers and tests.
//! - [`audit`]: the ownership-log checker, to prove from recorded events that no bucket was
//!   ever held twice at once.
//! - The backends, each behind a feature of the same name: [`postgres`] and [`memory`] (both
//!   on by default), and `etcd` (off by default: building the etcd client needs `protoc`).
//! - `testing` (feature `testing`): the conformance and runtime suites and their helpers.
//!
//! An application's imports come from the root and a backend; a store driven by hand (a
//! backend's test, an operator's tool) adds [`store`]:
//!
//! ```
//! use lease::memory::MemoryLeaseStore;
//! use lease::store::{Incarnation, Takeover, WorkerStore};
//! use lease::{GroupName, MemberMetadata, ShardCount, Ttl, NodeId};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryLeaseStore::new();
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(4)?).await?;
//! let (me, ttl, none) = (NodeId::new(), Ttl::from_secs(30)?, MemberMetadata::empty());
//! let session = store.heartbeat(me, Incarnation::new(), ttl, &none, &[]).await?.session;
//! store.join(&group, me, session).await?;
//! let won = store.claim(&group, me, session, 4, Takeover::Allowed).await?;
//! assert_eq!(won.len(), 4);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! The command line is the separate `leasectl` package, so this crate pulls in no CLI,
//! logging-subscriber or metrics-exporter dependency.

// The builders and what they are configured with.
pub use lease_worker::{ConfigError, LeaseNode, LeaseNodeBuilder, LeaseWorker, LeaseWorkerBuilder};

// What a started node or worker hands back, and why starting or adding a group can fail.
pub use lease_worker::{
    GroupError, GroupHandle, LoadReporter, NodeHandle, StartError, WorkerHandle,
};

// The application side: a handler and the events it is told, or a lease per bucket.
pub use lease_core::{Assignment, OwnershipEvent, RevokeReason};
pub use lease_worker::{
    BucketLease, EventSender, Leases, Owned, OwnershipHandler, WorkerError, WorkerFailed,
    event_channel,
};

// The ids and values an application names: a group and its shard count, a node id, a bucket
// and its fencing token, a ttl, a member's metadata and weight, a bucket's load.
pub use lease_core::{
    Bucket, FencingToken, GroupName, Load, MemberMetadata, NodeId, ShardCount, Ttl, Weight,
};

// The errors an application handles: the store's (with its kind, for matching) and a value's
// that failed validation.
pub use lease_core::{ErrorKind, InvalidInput, StoreError};

/// The storage contract, for backend authors, operators' tools and tests that call a store
/// directly: the [`WorkerStore`](store::WorkerStore) and [`AdminStore`](store::AdminStore)
/// traits (and [`LeaseStore`](store::LeaseStore), both) and everything their signatures name
/// that an application does not. The ids, [`Ttl`],
/// [`MemberMetadata`], [`Weight`] and
/// [`StoreError`] it shares with applications are at the crate root.
///
/// - The traits: [`WorkerStore`](store::WorkerStore) (what a node's runtime calls),
///   [`AdminStore`](store::AdminStore) (what an operator calls), [`LeaseStore`](store::LeaseStore)
///   (both, with the rules every operation keeps), [`Takeover`](store::Takeover); with the
///   feature `mock`, `MockWorkerStore` and `MockAdminStore`, mockall mocks of them.
/// - Sessions: [`SessionId`](store::SessionId), [`Incarnation`](store::Incarnation).
/// - What heartbeats and snapshots return: [`Heartbeat`](store::Heartbeat),
///   [`GroupBeat`](store::GroupBeat), [`ViewStamp`](store::ViewStamp),
///   [`GroupView`](store::GroupView), [`GroupSnapshot`](store::GroupSnapshot),
///   [`NodesSnapshot`](store::NodesSnapshot) and the rows they hold.
/// - Backend failures: [`BackendFailure`](store::BackendFailure),
///   [`Operation`](store::Operation), and [`Chain`](store::Chain) to print an error with its
///   sources on one line.
/// - Wake-ups: [`Change`](store::Change), [`ChangeFeed`](store::ChangeFeed).
/// - Time: [`Clock`](store::Clock), [`SystemClock`](store::SystemClock),
///   [`ManualClock`](store::ManualClock), [`Timestamp`](store::Timestamp),
///   [`store_precision`](store::store_precision).
/// - Operators' controls, bucket history and resizes, with their bounds:
///   [`MemberControl`](store::MemberControl), [`QuarantineFor`](store::QuarantineFor),
///   [`QuarantineReason`](store::QuarantineReason),
///   [`Tenure`](store::Tenure), [`EndReason`](store::EndReason),
///   [`Generation`](store::Generation), [`ResizeOutcome`](store::ResizeOutcome), and the key
///   arithmetic of a resize in [`store::resize`].
pub mod store {
    // The traits every backend implements; their "# Contract" sections are the
    // specification, checked by the conformance suite (`lease::testing`, feature `testing`).
    pub use lease_core::{AdminStore, LeaseStore, Takeover, WorkerStore};

    // mockall mocks of the two traits, for tests of code that calls a store.
    #[cfg(feature = "mock")]
    pub use lease_core::{MockAdminStore, MockWorkerStore};

    // A node's session and the process holding it.
    pub use lease_core::{Incarnation, SessionId};

    // Where a store's write history stands, and the bound of a session's writes that keeps
    // the session across a failover that lost none of them (rule V4).
    pub use lease_core::{LogPosition, SessionBound};

    // What a heartbeat answers, and the views of groups, members, buckets and nodes that
    // heartbeats and snapshots return.
    pub use lease_core::{
        BucketInfo, BucketState, GroupBeat, GroupSnapshot, GroupStamp, GroupView, Heartbeat, Lease,
        MemberInfo, MemberLoad, MemberMode, NodeInfo, NodesSnapshot, ViewStamp,
    };

    // The claimable buckets with a load a view lists: how many at most, and in what order.
    pub use lease_core::{LOADED_LISTED, list_loaded};

    // How a backend reports a failure (which operation, what went wrong), and an error chain's
    // one-line rendering.
    pub use lease_core::{BackendFailure, Chain, Operation};

    // A group's change feed, which wakes its members.
    pub use lease_core::{Change, ChangeFeed};

    // Time: the clocks a store may be given, its timestamps and their precision.
    pub use lease_core::{Clock, ManualClock, SystemClock, Timestamp, store_precision};

    // Operators' controls on members and buckets, and their bounds.
    pub use lease_core::control::{MAX_QUARANTINE, MAX_WEIGHT};
    pub use lease_core::{MemberControl, QuarantineFor, QuarantineReason};

    // A bucket's recorded claims (`LeaseStore::history`), and how many are kept.
    pub use lease_core::history::TENURES_KEPT;
    pub use lease_core::{EndReason, Tenure, TenureEnd, Tenures};

    // A group's generations and what a resize did.
    pub use lease_core::{Generation, ResizeOutcome};

    /// The key arithmetic of a resize from `from` to `to` buckets: which old and new buckets
    /// share keys. An application needs it only through
    /// [`Assignment::parents`](crate::Assignment::parents) and
    /// [`Assignment::shares_keys`](crate::Assignment::shares_keys).
    pub mod resize {
        pub use lease_core::resize::{children, gcd, parents, shares_keys};
    }
}

/// The load-aware policy: share the applications' measured loads, not bucket counts (see
/// [`lease_core::balance`]), and the loads themselves.
pub mod balance {
    pub use lease_core::balance::*;
    pub use lease_core::load::{HalfLife, Smoothed, worth_publishing};
}

/// The fair-share policy: pure, no I/O, no clock; every worker computes the same targets from
/// the same view (`lease_core::policy`).
pub mod policy {
    pub use lease_core::policy::*;
}

/// The node's rules as a sans-IO state machine (`lease_worker::machine`): time is an argument,
/// nothing is awaited. The tokio driver behind [`LeaseNode`] runs it; so can
/// a test or a driver of your own. What a group owns, [`Owned`], is at the root.
pub mod machine {
    pub use lease_worker::machine::{
        Answered, CLAIM_BATCH, ClockStep, Delivery, Input, LoadRules, Machine, Output,
        RELEASE_BATCH, Report, Rules, StoreCall,
    };
}

/// The ownership-log checker (`lease_core::ownership_log`): from every worker's recorded
/// events, prove that no bucket (no key, across a resize) was held by two workers at one
/// instant and that tokens only grew. The tests and `leasectl demo` judge runs with it; an
/// application can audit its own logs.
pub mod audit {
    pub use lease_core::ownership_log::*;
}

/// The Postgres backend (feature `postgres`): [`postgres::PgLeaseStore`], its migrations and
/// its set-up errors.
#[cfg(feature = "postgres")]
pub mod postgres {
    pub use lease_diesel::*;
}

/// The in-memory backend (feature `memory`): [`memory::MemoryLeaseStore`], the executable
/// specification of the contract, for one process and for tests.
#[cfg(feature = "memory")]
pub mod memory {
    pub use lease_memory::*;
}

/// The etcd backend (feature `etcd`, off by default: building the etcd client needs `protoc`):
/// [`etcd::EtcdLeaseStore`] and its `etcd://` URLs.
#[cfg(feature = "etcd")]
pub mod etcd {
    pub use lease_etcd::*;
}

/// Test support (feature `testing`): the conformance and runtime suites, the model, the
/// differential harness, fault injection, a recording handler.
#[cfg(feature = "testing")]
pub mod testing {
    pub use lease_testing::*;
}
