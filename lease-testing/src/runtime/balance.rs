//! Runtime cases of balance: workers starting together, and a worker joining running ones,
//! share a group evenly within a bound in ticks, or in [`WAKE_UP_BOUND`] with wake-ups.

use tokio::time::Instant;

use lease_core::{Clock, LeaseStore, OwnershipEvent, RevokeReason};

use super::{Env, Pool, RENEW, WAKE_UP_BOUND, lock, ms};

/// Eight workers starting together on 64 buckets own 8 each within three ticks, with and without
/// wake-ups: by their third tick, 2 renew intervals after they start. On the paused clock that is
/// exact (balanced at 2.005 s without wake-ups, bound 2.05 s); on real time the bound counts from
/// before the first worker starts and adds [`REAL_SLACK`](super::REAL_SLACK) for the eight starts
/// and the round trips, still short of a fourth tick.
pub async fn cold_start_of_eight_workers_balances_within_three_ticks<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 64, wakeups);
        let started = Instant::now();
        for _ in 0..8 {
            pool.start().await;
        }
        let limit = (2 * RENEW + env.slack()).saturating_sub(started.elapsed());
        pool.until_balanced(limit, "cold start of 8 workers").await;
        eprintln!(
            "cold start, 8 workers x 64 buckets, wake-ups {wakeups}: balanced in {:?}",
            started.elapsed()
        );
        assert!(pool.owned().values().all(|&n| n == 8), "{:?}", pool.owned());
        pool.shutdown().await;
    }
}

/// A fourth worker joining three on 64 buckets gets its 16 within two ticks (its own first and the
/// next: one renew interval), or within 250 ms with wake-ups, and only those 16 move (each shed
/// exactly once, from the others' excess). Without wake-ups (renew 1 s) the two-tick bound is exact
/// on the paused clock (1.000 s, bound 1.05 s) and a renew interval plus
/// [`REAL_SLACK`](super::REAL_SLACK) on real time, still short of a third tick. With wake-ups the
/// workers renew every 5 s ([`SLOW_RENEW`](super::SLOW_RENEW)), so only wake-ups can serve the
/// joiner within 250 ms, the same bound on both clocks.
pub async fn a_joiner_gets_its_share_within_two_ticks<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 64, wakeups);
        if wakeups {
            pool = pool.slow_ticks();
        }
        let started = Instant::now();
        for _ in 0..3 {
            pool.start().await;
        }
        pool.until_balanced(5 * pool.renew, "cold start").await;
        eprintln!(
            "cold start, 3 workers x 64 buckets, wake-ups {wakeups}, renew {:?}: balanced in \
             {:?}",
            pool.renew,
            started.elapsed()
        );
        let start = pool.clock.now();
        let joiner = pool.start().await;
        pool.until_balanced(pool.renew + env.slack(), "the joiner's share")
            .await;
        assert_eq!(pool.owned()[&joiner], 16);
        let at = pool
            .assigned_at(joiner)
            .into_iter()
            .max()
            .expect("the joiner was assigned buckets");
        let took = ms(at - start);
        eprintln!(
            "join, 3 -> 4 workers x 64 buckets, wake-ups {wakeups}, renew {:?}: share complete \
             {took} ms after joining",
            pool.renew
        );
        if wakeups {
            assert!(
                took < WAKE_UP_BOUND.as_millis() as i64,
                "with wake-ups the joiner waited {took} ms"
            );
        }
        let moved = lock(&pool.log)
            .entries()
            .iter()
            .filter(|e| e.at >= start)
            .filter(|e| {
                matches!(
                    e.event,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Shed,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(moved, 16, "buckets shed after the join");
        pool.shutdown().await;
    }
}
