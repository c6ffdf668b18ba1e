//! The whole conformance suite on etcd (a three-member cluster), each case its own test, and
//! the resize contract's cases. Liveness is judged on the suite's manual clock (the store's
//! test mode), so expiry can be stepped through exactly as on the other backends.

mod support;

use lease_core::ManualClock;

lease_testing::conformance_suite!(|clock: ManualClock| support::on_clock(clock));

mod resize {
    use super::*;

    lease_testing::resize_suite!(|clock: ManualClock| support::on_clock(clock));
}
