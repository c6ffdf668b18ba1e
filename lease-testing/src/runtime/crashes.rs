//! Runtime cases of crashes: a worker that ends without leaving (aborted, or stopped by its
//! handler's panic) keeps its buckets until its session expires in the store.

use lease_core::{Bucket, BucketState, Clock, LeaseStore};
use lease_worker::WorkerFailed;

use super::{Env, Pool, RENEW, Slow, TTL, WAKE_UP_BOUND, lock};

/// A crashed worker's 4 buckets move only after its session expired in the store, and within
/// a renew interval (plus 250 ms) of it: the others find them claimable at their next tick.
pub async fn a_crashed_workers_buckets_move_only_after_its_lease_expires<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 12, true);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(pool.start().await);
    }
    pool.until_balanced(5 * RENEW, "cold start").await;
    let victim = ids[0];
    pool.crash(victim);
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let held: Vec<Bucket> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(victim) && b.state == BucketState::Live)
        .map(|b| b.bucket)
        .collect();
    assert_eq!(held.len(), 4);
    let expires = pool
        .until_following_expiry(
            victim,
            TTL + RENEW + env.slack(),
            "the crashed worker's buckets re-owned",
            || pool.balanced(),
        )
        .await;
    let log = lock(&pool.log).clone();
    let holdings = log.holdings().expect("holdings");
    for b in &held {
        // Buckets move during the cold start: the holding that counts is the one after the
        // crashed worker's.
        let list = &holdings[b];
        let last = list
            .iter()
            .rposition(|h| h.worker == victim)
            .expect("held by the crashed worker");
        let next = list.get(last + 1).expect("re-owned");
        assert!(
            next.from >= expires,
            "bucket {b} re-assigned at {} before the crashed lease expired at {expires}",
            next.from
        );
        let late = (next.from - expires).to_std().expect("after expiry");
        assert!(
            late <= RENEW + WAKE_UP_BOUND,
            "bucket {b} re-owned {late:?} after expiry, more than a renew interval"
        );
    }
    pool.shutdown().await;
}

/// A panicking handler stops the worker visibly: `wait` reports the panic with its message,
/// and the owned set, which held the bucket assigned before, empties. Its session then expires
/// and another worker takes over.
pub async fn a_panicking_handler_stops_the_worker_visibly<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, true);
    // Alone, it claims all 4 at its first tick; the second assignment panics.
    let a = pool
        .start_slow(Slow {
            panic_on: Some(2),
            ..Slow::default()
        })
        .await;
    let (mut handle, _) = pool.workers.remove(&a).expect("a");
    let owned = handle.owned();
    let failure = tokio::time::timeout(RENEW + env.slack(), handle.wait())
        .await
        .expect("the worker did not end")
        .expect_err("the worker survived its handler's panic");
    assert!(
        matches!(&failure, WorkerFailed::HandlerPanicked { message }
            if message.contains("the application's handler failed")),
        "{failure}"
    );
    assert_eq!(pool.assigned_at(a).len(), 1, "the first assignment");
    assert!(
        owned.borrow().is_empty(),
        "the owned set kept buckets: {:?}",
        owned.borrow()
    );
    lock(&pool.log).crashed(a, pool.clock.now());
    let b = pool.start().await;
    pool.until_owns(b, 4, TTL + RENEW + env.slack()).await;
    pool.shutdown().await;
}
