//! The lease engine's store on etcd: [`EtcdLeaseStore`].
//!
//! It runs the contract's rules ([`lease_rules`], as the memory store does) on what each operation reads
//! from etcd and writes the result back in one transaction that holds only if nothing it read
//! changed meanwhile; sessions are etcd leases (the etcd leader decides expiry). The design is
//! in `docs/etcd.md`.

#![warn(missing_docs)]

mod codec;
mod error;
pub mod keys;
mod store;
mod url;

pub use error::classify;
pub use store::{ConnectError, EtcdLeaseStore, MAX_SHARDS, PAGE_ROWS};
pub use url::{EtcdUrl, EtcdUrlError};
