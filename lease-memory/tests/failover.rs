//! The contract's failover rules (V1-V4) on the memory store, failed over to copies of
//! itself, and on the reference model.

use lease_core::ManualClock;
use lease_memory::{MemoryLeaseStore, Standby};
use lease_testing::failover::Failovers;
use lease_testing::model::{Model, ModelFailovers, ModelStore};

/// Fails a [`MemoryLeaseStore`] over to a [`Standby`] copy.
#[derive(Clone, Copy)]
struct Memory;

impl Failovers<MemoryLeaseStore> for Memory {
    type Standby = Standby;

    fn standby(&self, store: &MemoryLeaseStore) -> Standby {
        store.standby().expect("a standby")
    }

    fn fail_over(&self, store: &MemoryLeaseStore, standby: Standby) {
        store.fail_over(standby).expect("a failover");
    }
}

mod memory {
    use super::*;

    lease_testing::failover_suite!(
        |clock: ManualClock| async move { MemoryLeaseStore::with_clock(clock) },
        Memory
    );
}

mod model {
    use super::*;

    lease_testing::failover_suite!(
        |clock: ManualClock| async move { ModelStore::new(Model::new(), clock) },
        ModelFailovers
    );
}
