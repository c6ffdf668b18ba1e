//! etcd and the reference model in lockstep on random operation
//! sequences (up to 40 operations by 3 workers over 2 groups, with clock moves), every result
//! compared and the invariants checked after every step; see `lease_testing::differential`.
//! The etcd store runs in its test mode (liveness on the sequence's manual clock), each
//! sequence on a prefix of its own. `PROPTEST_CASES` raises the case count.

mod support;

use lease_core::{LeaseStore, ManualClock};
use lease_testing::differential::{StoreFactory, run};
use tokio::runtime::Runtime;

struct Etcd;

impl StoreFactory for Etcd {
    fn stores(rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
        let etcd = rt.block_on(support::on_clock(clock.clone()));
        vec![("etcd".to_owned(), Box::new(etcd))]
    }
}

/// The checked sequences (every risky state reached), then 16 random ones.
#[test]
fn etcd_matches_the_model() {
    run::<Etcd>(16);
}
