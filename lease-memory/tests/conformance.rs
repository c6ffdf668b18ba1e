//! The whole conformance suite on the in-memory backend, each case its own test, and the
//! resize contract's cases.

use lease_core::ManualClock;
use lease_memory::MemoryLeaseStore;

lease_testing::conformance_suite!(|clock: ManualClock| async move {
    MemoryLeaseStore::with_clock(clock)
});

mod resize {
    use super::*;

    lease_testing::resize_suite!(|clock: ManualClock| async move {
        MemoryLeaseStore::with_clock(clock)
    });
}
