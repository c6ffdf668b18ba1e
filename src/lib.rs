//! `lease`: cooperative shard ownership on renewable leases.
//!
//! This facade re-exports the pieces: [`core`] (types, the `LeaseStore` contract, the policy),
//! [`memory`] (the in-memory backend) and [`diesel`] (the Postgres backend).

#![warn(missing_docs)]

pub use lease_core as core;
pub use lease_core::*;
pub use lease_diesel as diesel;
pub use lease_memory as memory;
