#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

//! ## This crate
//!
//! The facade re-exports the pieces: [`core`] (types, the `LeaseStore` contract, the policy,
//! the worker runtime), [`memory`] (the in-memory backend) and [`diesel`] (the Postgres
//! backend).

pub use lease_core as core;
pub use lease_core::*;
pub use lease_diesel as diesel;
pub use lease_memory as memory;

/// Test support (feature `testing`): the conformance suite, the model, the ownership log.
#[cfg(feature = "testing")]
pub use lease_core::testing;
