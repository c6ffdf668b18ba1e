//! etcd, the in-memory backend and the reference model in lockstep on random operation
//! sequences (up to 40 operations by 3 workers over 2 groups, with clock moves), every result
//! compared and the invariants checked after every step; see `lease_testing::differential`.
//! The etcd store runs in its test mode (liveness on the sequence's manual clock), each
//! sequence on a prefix of its own. `PROPTEST_CASES` raises the case count.

mod support;

use lease_core::{LeaseStore, ManualClock};
use lease_memory::MemoryLeaseStore;
use lease_testing::differential::{Differential, StoreFactory, config};
use proptest_state_machine::prop_state_machine;
use tokio::runtime::Runtime;

struct EtcdAndMemory;

impl StoreFactory for EtcdAndMemory {
    fn stores(rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
        let etcd = rt.block_on(support::on_clock(clock.clone()));
        vec![
            ("etcd".to_owned(), Box::new(etcd)),
            (
                "memory".to_owned(),
                Box::new(MemoryLeaseStore::with_clock(clock.clone())),
            ),
        ]
    }
}

prop_state_machine! {
    #![proptest_config(config(48))]
    #[test]
    fn etcd_and_memory_match_the_model(
        sequential 1..40 => Differential<EtcdAndMemory>
    );
}
