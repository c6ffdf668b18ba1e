//! Small helpers shared by the Postgres test files.

#![allow(dead_code)] // each test binary uses its own subset

use std::fmt::Debug;

use lease_core::{ErrorKind, Incarnation, Lease, StoreError, WorkerId};

/// A fresh worker whose claims start at bucket 0 (its claim seed is 0), so it claims the
/// lowest claimable buckets first and expectations can name them.
pub fn worker() -> WorkerId {
    WorkerId::from_uuid(uuid::Uuid::from_u128(
        WorkerId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
    ))
}

/// The incarnation worker `w` heartbeats as: one process per worker, derived from its id.
pub fn process(w: WorkerId) -> Incarnation {
    Incarnation::from_uuid(w.as_uuid())
}

/// `(bucket, token)` of each lease, to compare ownership at a glance.
pub fn tokens(leases: &[Lease]) -> Vec<(u32, i64)> {
    leases.iter().map(|l| (l.bucket.0, l.token.0)).collect()
}

/// `result` is a `Backend` error; returns its message.
#[track_caller]
pub fn expect_backend<T: Debug>(what: &str, result: Result<T, StoreError>) -> String {
    match result {
        Err(e) if e.kind() == ErrorKind::Backend => lease_core::Chain(&e).to_string(),
        other => panic!("{what}: expected a Backend error, got {other:?}"),
    }
}

/// `result` is `Ok` or a `Backend` error: what an operation racing a lost connection may give.
#[track_caller]
pub fn ok_or_backend<T: Debug>(what: &str, result: &Result<T, StoreError>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::Backend => false,
        Err(e) => panic!("{what}: expected success or a Backend error, got {e:?}"),
    }
}
