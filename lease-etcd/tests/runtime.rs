//! The whole runtime suite on etcd, on real time, with sessions on etcd leases (the
//! production mode): each case on a prefix of its own in the shared three-member cluster.
//! Events are stamped with the system clock, the clock the store's recorded times are on.

mod support;

use lease_core::SystemClock;

lease_testing::runtime_suite!(real_clock: || async { (support::on_leases().await, SystemClock) });
