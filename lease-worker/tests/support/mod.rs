//! What the worker's integration tests share.

use std::time::Duration;

use tokio::time::Instant;

/// Polls `cond` every 5 ms (of the paused clock, in the tests that pause it) until it holds,
/// failing with `what` once `limit` has passed.
pub async fn until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
