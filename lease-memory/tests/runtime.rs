//! The whole runtime suite on the in-memory backend, on tokio's paused clock: no real sleeps,
//! every instant exact. The store's clock follows tokio's, so expiries and the workers' trust
//! deadlines are on one timeline.

use lease_memory::MemoryLeaseStore;
use lease_testing::TokioClock;

lease_testing::runtime_suite!(paused_clock: || async {
    let clock = TokioClock::new();
    (MemoryLeaseStore::with_clock(clock.clone()), clock)
});
