//! Postgres, the in-memory backend and the reference model in lockstep on random operation
//! sequences (up to 40 operations by 3 workers over 2 groups, with clock moves). Every result is
//! compared and the invariants are checked after every step; see
//! `lease_testing::differential`: the run's checked sequences must reach every risky state,
//! then random ones explore (`PROPTEST_CASES` sets how many).

use lease_core::{LeaseStore, ManualClock};
use lease_diesel::PgLeaseStore;
use lease_memory::MemoryLeaseStore;
use lease_testing::differential::{StoreFactory, run};
use tokio::runtime::Runtime;

struct PostgresAndMemory;

impl StoreFactory for PostgresAndMemory {
    fn stores(rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
        let db = rt.block_on(lease_testdb::database());
        let pg = PgLeaseStore::builder(db.url)
            .max_connections(2)
            .build()
            .expect("a store on the test database")
            .with_client_clock(clock.clone());
        vec![
            ("postgres".to_owned(), Box::new(pg)),
            (
                "memory".to_owned(),
                Box::new(MemoryLeaseStore::with_clock(clock.clone())),
            ),
        ]
    }
}

#[test]
fn postgres_and_memory_match_the_model() {
    run::<PostgresAndMemory>(16);
}
