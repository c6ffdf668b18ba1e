//! A fresh store on the test process's shared three-member etcd cluster: a prefix of its own
//! per store, so tests never see each other's keys.

#![allow(dead_code)]

use lease_core::ManualClock;
use lease_etcd::{EtcdLeaseStore, EtcdUrl};

/// The URL of a prefix no other store of this process uses, on the shared cluster.
pub fn url() -> EtcdUrl {
    EtcdUrl {
        endpoints: lease_testetcd::cluster().endpoints(),
        prefix: lease_testetcd::prefix().trim_end_matches('/').to_owned(),
    }
}

/// A store whose sessions end by `clock` (the conformance and differential suites).
pub async fn on_clock(clock: ManualClock) -> EtcdLeaseStore {
    EtcdLeaseStore::connect_with_clock(&url(), clock)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A store whose sessions are etcd leases.
pub async fn on_leases() -> EtcdLeaseStore {
    EtcdLeaseStore::connect(&url())
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
