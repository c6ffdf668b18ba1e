//! `lease`: cooperative shard ownership on renewable leases.
//!
//! This facade re-exports the pieces: [`core`] (types, the `LeaseStore` contract, the policy),
//! [`memory`] (the in-memory backend) and [`diesel`] (the Postgres backend).

#![warn(missing_docs)]

pub use lease_core as core;
pub use lease_core::*;
pub use lease_diesel as diesel;
pub use lease_memory as memory;

/// Test support (feature `testing`): the conformance suite, the model, the ownership log.
#[cfg(feature = "testing")]
pub use lease_core::testing;
