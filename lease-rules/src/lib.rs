//! The contract's rules over one in-memory state: every [`LeaseStore`](lease_core::LeaseStore)
//! operation as a function of the state and the store's time.
//!
//! The memory store holds one [`State`] behind a mutex. The etcd store loads the part of its
//! keys an operation touches into a [`State`], runs the same function and writes back what
//! changed, on condition that nothing it read changed meanwhile: one specification, two
//! stores. A [`State`] need not hold every group: an operation reads the nodes and the groups
//! it names (and a node's groups, through [`NodeRow::groups`]) and nothing else.
//!
//! Pure: no I/O, no clock reads, no async runtime. The reference model of `lease-testing` is
//! an independent statement of the same contract, which the differential test runs against
//! both stores.

#![warn(missing_docs)]

mod admin;
mod claims;
mod group;
mod history;
mod rows;
mod sessions;

pub use history::{BASE_TIMELINE, Epoch, History};
pub use rows::{BucketRow, GroupState, MemberRow, NodeRow, Nodes, State};
