//! `lease-core`: the types, the storage contract and the fair-share policy of the lease
//! engine, a library for cooperative shard ownership.
//!
//! A pool of identical workers shares the `N` buckets of a group with no coordinator: each
//! bucket has at most one live owner at a time, held as a renewable lease in a
//! [`LeaseStore`]. Leases hang on a process's (a node's) **session**, renewed by one heartbeat
//! per tick whatever it holds in however many groups; a dead worker's session expires and its buckets are claimed by others,
//! each change of owner raising the bucket's [`FencingToken`].
//!
//! The store contract is written on [`LeaseStore`] ("# Contract" sections) and checked by the
//! conformance suite of `lease-testing`, which every backend runs. The policy in [`policy`] is
//! pure: it turns a heartbeat's view into a [`Plan`]; [`balance`] is its load-aware
//! form, which shares the applications' measured loads instead of bucket counts. This crate does no I/O, reads no clock
//! and needs no async runtime: the worker runtime is `lease-worker`, the backends
//! `lease-memory` and `lease-diesel`.
//!
//! A tick of one node in one group, by hand, on the in-memory backend:
//!
//! ```
//! use lease_core::{
//!     policy, GroupName, Incarnation, MemberMetadata, ShardCount, Takeover, Ttl, WorkerStore,
//!     NodeId,
//! };
//! use lease_memory::MemoryLeaseStore;
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let store = MemoryLeaseStore::new();
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(8)?).await?;
//!
//! let (me, process) = (NodeId::new(), Incarnation::new());
//! let (ttl, none) = (Ttl::from_secs(30)?, MemberMetadata::empty());
//! let session = store.heartbeat(me, process, ttl, &none, &[]).await?.session;
//! store.join(&group, me, session).await?;
//! let beat = store.heartbeat(me, process, ttl, &none, &[]).await?;
//! let orders = beat.group(&group).expect("a member of orders");
//! let plan = policy::plan(&orders.view, me, &orders.owned_buckets());
//! assert_eq!(plan.claim, 8); // alone in the group: everything is mine
//! let won = store.claim(&group, me, session, plan.claim, Takeover::Allowed).await?;
//! assert_eq!(won.len(), 8);
//! assert!(store.is_current(&group, won[0].bucket, me, won[0].token).await?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

#![warn(missing_docs)]

pub mod balance;
mod change;
pub mod control;
mod error;
mod event;
mod failover;
pub mod history;
mod ids;
mod invalid;
pub mod load;
pub mod ownership_log;
pub mod policy;
pub mod resize;
mod store;
mod time;
mod view;

pub use change::{Change, ChangeFeed};
pub use control::{MemberControl, QuarantineFor, QuarantineReason, Weight};
pub use error::{BackendFailure, Chain, ErrorKind, Operation, StoreError};
pub use event::{Assignment, OwnershipEvent, RevokeReason};
pub use failover::{LogPosition, SessionBound};
pub use history::{EndReason, Tenure, TenureEnd, Tenures};
pub use ids::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionId, ShardCount,
};
pub use invalid::InvalidInput;
pub use load::{HalfLife, Load, Smoothed};
pub use policy::{Plan, plan};
pub use resize::{Generation, ResizeOutcome};
pub use store::{AdminStore, LeaseStore, Takeover, WorkerStore};
#[cfg(any(test, feature = "mock"))]
pub use store::{MockAdminStore, MockWorkerStore};
pub use time::{Clock, ManualClock, SystemClock, Timestamp, Ttl, store_precision};
pub use view::{
    BucketInfo, BucketState, GroupBeat, GroupSnapshot, GroupStamp, GroupView, Heartbeat,
    LOADED_LISTED, Lease, MemberInfo, MemberLoad, MemberMode, NodeInfo, NodesSnapshot, ViewStamp,
    list_loaded,
};
