#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

//! ## This crate
//!
//! The facade an application depends on: the types, the `LeaseStore` contract and the policy of
//! `lease-core` and the worker runtime of `lease-worker` at the root; the backends as modules
//! named for what they are, each behind a feature of the same name: [`postgres`] and
//! [`memory`] (both on by default), and `etcd` (off by default: its client needs `protoc`).
//! The command line is the separate `leasectl` package, so this crate pulls in no CLI,
//! logging-subscriber or metrics-exporter dependency.

pub use lease_core::*;
pub use lease_worker::*;

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
