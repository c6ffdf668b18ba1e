//! Runtime cases of resizes: running workers follow a group's new shard count on wake-ups,
//! a worker configured with the old count follows it too, and a dead owner holds back only
//! its keys.

use lease_core::{BucketState, LeaseStore, OwnershipEvent, RevokeReason, ShardCount};

use super::{Env, Pool, RENEW, TTL, WAKE_UP_BOUND};

/// Three workers on 12 buckets, renewing every 5 s, follow a split to 24 and then a change to
/// 18 (each new bucket waiting for four old ones held by different workers) without restarting:
/// each revokes its old buckets (reason `resharded`), releases them once the handler returned,
/// and the new generation is owned evenly within [`WAKE_UP_BOUND`] of each resize, which only
/// wake-ups can explain. Every assignment names its shard count and parents, and the ownership
/// log finds no key in two buckets held at once across the generations.
pub async fn a_resize_is_followed_on_wake_ups_without_restarting<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 12, true).slow_ticks();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(pool.start().await);
    }
    pool.until_balanced(5 * pool.renew, "cold start").await;
    for (from, to) in [(12, 24), (24, 18)] {
        pool.resize(to).await;
        let took = pool
            .until_resized(
                WAKE_UP_BOUND + env.slack(),
                &format!("the resize from {from} to {to} followed by wake-ups"),
            )
            .await;
        eprintln!("resize {from} -> {to} with 3 live workers: followed in {took:?}");
        let (from_n, to_n) = (
            ShardCount::new(from).expect("n"),
            ShardCount::new(to).expect("n"),
        );
        for &w in &ids {
            for a in pool.assignments_of(w, to) {
                assert_eq!(a.resized_from, Some(from_n), "{a:?}");
                assert_eq!(
                    a.parents(),
                    lease_core::resize::parents(from_n, to_n, a.bucket)
                );
            }
        }
    }
    let resharded: usize = ids
        .iter()
        .map(|&w| pool.revoked_at(w, RevokeReason::Resharded).len())
        .sum();
    assert_eq!(resharded, 12 + 24, "every old bucket revoked as resharded");
    let summary = pool.check();
    assert!(summary.key_pairs > 0, "{summary:?}");
    pool.shutdown().await;
}

/// A worker configured with the count a group was resized from starts (contract rule E3)
/// and follows the group's count, owning every new bucket; one configured with any other
/// count is refused with the typed mismatch.
pub async fn a_worker_configured_before_a_resize_follows_it<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 8, true);
    pool.store
        .ensure_group(&pool.group, ShardCount::new(8).expect("n"))
        .await
        .expect("ensure");
    pool.resize(16).await;
    // The workers' configuration still says 8.
    pool.shards = 8;
    let w = pool.start().await;
    pool.shards = 16;
    pool.until_owns(w, 16, 2 * RENEW + env.slack()).await;
    let assigned = pool.assignments_of(w, 16);
    assert_eq!(assigned.len(), 16, "{assigned:?}");
    pool.shards = 12;
    pool.refused_for_its_count().await;
    pool.shards = 16;
    pool.shutdown().await;
}

/// A worker crashes holding half of 8 buckets, and the group splits to 16 at once: the
/// survivor's old buckets retire by release and their new buckets are owned within
/// [`WAKE_UP_BOUND`]; the crashed worker's retire only when its session expires, and the new
/// buckets sharing their keys are assigned no earlier. In the end the survivor owns all 16.
pub async fn an_owner_dead_during_a_resize_holds_back_only_its_keys<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 8, true);
    let (live, dead) = (pool.start().await, pool.start().await);
    pool.until_balanced(5 * RENEW, "cold start").await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let dead_held: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(dead) && b.state == BucketState::Live)
        .map(|b| b.bucket.get())
        .collect();
    assert_eq!(dead_held.len(), 4);
    pool.crash(dead);
    pool.resize(16).await;
    pool.until_owns(live, 8, WAKE_UP_BOUND + env.slack()).await;
    let expires = pool
        .until_following_expiry(
            dead,
            TTL + RENEW + env.slack(),
            "the dead worker's keys",
            || pool.owned().get(&live) == Some(&16),
        )
        .await;
    for a in pool.assignments_of(live, 16) {
        let held_by_dead = dead_held.contains(&(a.bucket.get() % 8));
        let at = pool
            .events_of(live)
            .into_iter()
            .find(|(_, e)| *e == OwnershipEvent::Assigned(a))
            .map(|(t, _)| t)
            .expect("the assignment's time");
        assert_eq!(
            at >= expires,
            held_by_dead,
            "new bucket {} assigned at {at}, the dead session expired at {expires}",
            a.bucket
        );
    }
    pool.until_resized(RENEW + env.slack(), "the drain over")
        .await;
    pool.shutdown().await;
}
