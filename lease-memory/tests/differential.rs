//! The in-memory backend against the reference model, on random operation sequences.

use lease_core::LeaseStore;
use lease_core::ManualClock;
use lease_core::testing::differential::{Differential, StoreFactory, config};
use lease_memory::MemoryLeaseStore;
use proptest_state_machine::prop_state_machine;
use tokio::runtime::Runtime;

struct Memory;

impl StoreFactory for Memory {
    fn stores(_rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
        vec![(
            "memory".to_owned(),
            Box::new(MemoryLeaseStore::with_clock(clock.clone())),
        )]
    }
}

prop_state_machine! {
    #![proptest_config(config(256))]
    #[test]
    fn memory_matches_the_model(sequential 1..40 => Differential<Memory>);
}
