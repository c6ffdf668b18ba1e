//! The whole runtime suite on Postgres, on real time, each case on a database of its own. The
//! store is on the server's clock; events are stamped with the system clock, which is the
//! server's too (the test server runs on this host), so they compare with the store's expiries.

use lease_core::SystemClock;
use lease_diesel::PgLeaseStore;

lease_testing::runtime_suite!(real_clock: || async {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url)
        .max_connections(16)
        .build()
        .expect("a store on the test database");
    (store, SystemClock)
});
