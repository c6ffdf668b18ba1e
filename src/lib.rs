#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

//! ## This crate
//!
//! The facade re-exports the pieces: the types, the `LeaseStore` contract and the policy of
//! `lease-core` and the worker runtime of `lease-worker` at the root, [`memory`] (the
//! in-memory backend) and [`diesel`] (the Postgres backend).

pub use lease_core::*;
pub use lease_diesel as diesel;
pub use lease_memory as memory;
pub use lease_worker::*;

/// Test support (feature `testing`): the conformance suite, the model, the differential
/// harness, fault injection, a recording handler.
#[cfg(feature = "testing")]
pub use lease_testing as testing;
