//! The node runtime: one tokio task per process (a **node**) that holds one session in the
//! store and any number of groups, and turns leases into "you own bucket 7 of `orders` with
//! token 42: start" and "stop working on bucket 7 now".
//!
//! Each tick: one `heartbeat` for the node (one round trip in steady state, whatever its
//! groups) → for each group the pure [`plan`](lease_core::plan) → `claim` or shed → tell the
//! group's application. Ticks run every renew interval, and at once when a group's change feed
//! reports a join, a leave, a release or a resize.
//!
//! - [`LeaseNode`]: a node; groups are added and removed at run time
//!   ([`NodeHandle::add_group`], [`NodeHandle::add_group_leases`],
//!   [`NodeHandle::remove_group`]), each with its own shard count and its own handler (or
//!   per-bucket leases).
//! - [`LeaseWorker`]: a node of one group, for applications with one.
//! - **Revoke before release**: a shed bucket is revoked, and the handler awaited, before it
//!   is released, so a graceful handoff never overlaps.
//! - **Self-fencing, per node**: a lease is trusted until `sent + ttl - margin` on the local
//!   monotonic clock, `sent` being when the last successful heartbeat was sent. Past it every
//!   bucket of every group is revoked with [`RevokeReason::Fenced`](lease_core::RevokeReason::Fenced), even while the store is
//!   unreachable, before the store could give it to anyone else.
//! - Store errors are reported (tracing, [`OwnershipHandler::on_error`], a metric) and retried
//!   with capped backoff; the loop never exits on them.
//! - Cancelling the node's token (or dropping its handle) stops it gracefully: revoke all,
//!   leave every group, which wakes the peers.
//!
//! A worker of one group:
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{GroupName, OwnershipEvent, ShardCount};
//! use lease_worker::{LeaseWorker, event_channel};
//! use lease_memory::MemoryLeaseStore;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store = MemoryLeaseStore::new();
//! let (handler, mut events) = event_channel(64);
//! let worker = LeaseWorker::builder(GroupName::new("orders")?, ShardCount::new(4)?)
//!     .ttl(Duration::from_secs(3))
//!     .renew_interval(Duration::from_secs(1))
//!     .build()?
//!     .start(store, handler)
//!     .await?;
//! // Alone in the group, the worker is assigned all four buckets at its first tick.
//! for _ in 0..4 {
//!     assert!(matches!(events.recv().await, Some(OwnershipEvent::Assigned { .. })));
//! }
//! assert_eq!(worker.owned().borrow().len(), 4);
//! worker.shutdown().await?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```
//!
//! A node in several groups: see [`LeaseNode`].

#![warn(missing_docs)]

mod application;
mod config;
mod driver;
mod events;
mod leases;
pub mod machine;
mod metrics;
mod registry;

pub use config::{ConfigError, LeaseNode, LeaseNodeBuilder, LeaseWorker, LeaseWorkerBuilder};
pub use driver::{GroupError, GroupHandle, LoadReporter, NodeHandle, WorkerHandle};
pub use events::{EventSender, OwnershipHandler, WorkerError, WorkerFailed, event_channel};
pub use leases::{BucketLease, Leases};
pub use machine::Owned;
pub use registry::StartError;
