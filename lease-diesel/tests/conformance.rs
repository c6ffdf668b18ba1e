//! The whole conformance suite on Postgres, each case on a database of its own, with the
//! suite's manual clock injected as the store's client clock, and the resize contract's cases.

use lease_core::ManualClock;
use lease_diesel::PgLeaseStore;

lease_testing::conformance_suite!(|clock: ManualClock| async move {
    let db = lease_testdb::database().await;
    PgLeaseStore::builder(db.url)
        .max_connections(12)
        .build()
        .expect("a store on the test database")
        .with_client_clock(clock)
});

mod resize {
    use super::*;

    lease_testing::resize_suite!(|clock: ManualClock| async move {
        let db = lease_testdb::database().await;
        PgLeaseStore::builder(db.url)
            .max_connections(12)
            .build()
            .expect("a store on the test database")
            .with_client_clock(clock)
    });
}
