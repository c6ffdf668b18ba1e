//! Runtime cases of graceful stops and hand-overs between running workers: a stop hands
//! over without overlap, a slow one renews until it leaves, and a shed bucket is released only
//! after its application's revoke returned.

use std::time::Duration;

use lease_core::{Clock, LeaseStore, RevokeReason, Timestamp};

use super::{Env, Pool, RENEW, Slow, TTL, WAKE_UP_BOUND, ms};

/// One of three workers stopping gracefully has its 4 buckets revoked (shutdown), and the others
/// own them within two ticks (a renew interval), or within 250 ms with wake-ups, with no overlap.
/// As for a join, the two-tick bound (renew 1 s) is exact on the paused clock (1.05 s) and a renew
/// interval plus [`REAL_SLACK`](super::REAL_SLACK) on real time; with wake-ups the workers renew
/// every 5 s ([`SLOW_RENEW`](super::SLOW_RENEW)) and the 250 ms bound is the same on both clocks.
pub async fn a_graceful_stop_hands_over_without_overlap<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 12, wakeups);
        if wakeups {
            pool = pool.slow_ticks();
        }
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(pool.start().await);
        }
        pool.until_balanced(5 * pool.renew, "cold start").await;
        let stopped_at = pool.clock.now();
        pool.stop(ids[0]).await;
        pool.until_balanced(
            pool.renew + env.slack(),
            "the stopped worker's buckets re-owned",
        )
        .await;
        let last_assigned = [ids[1], ids[2]]
            .iter()
            .flat_map(|&w| pool.assigned_at(w))
            .max()
            .expect("assignments");
        let took = ms(last_assigned - stopped_at);
        eprintln!(
            "graceful stop of 1 of 3 (12 buckets), wake-ups {wakeups}, renew {:?}: re-owned in \
             {took} ms",
            pool.renew
        );
        if wakeups {
            assert!(
                took < WAKE_UP_BOUND.as_millis() as i64,
                "with wake-ups the handoff took {took} ms"
            );
        }
        assert_eq!(
            pool.revoked_at(ids[0], RevokeReason::Shutdown).len(),
            4,
            "the stopped worker's application was not told"
        );
        let summary = pool.shutdown().await;
        assert!(summary.handoffs >= 4);
    }
}

/// A graceful stop whose application takes longer than a ttl over its revocations (1 s each, 4
/// buckets: 4 s, against a ttl of 3 s) keeps its session: the worker renews while it revokes
/// and leaves at the end, so the other worker is assigned those buckets only after the last
/// revocation returned, and the ownership log shows no bucket held twice. Without renewals
/// during the stop the session expired 3 s into it, and the other worker took the last bucket
/// while the stopping application still worked on it.
pub async fn a_slow_graceful_stop_renews_until_it_leaves<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let slow = pool
        .start_slow(Slow {
            revoke: Duration::from_secs(1),
            ..Slow::default()
        })
        .await;
    let other = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let stopped_at = pool.clock.now();
    pool.stop(slow).await;
    let revoked = pool.revoked_at(slow, RevokeReason::Shutdown);
    assert_eq!(
        revoked.len(),
        4,
        "the stopping application heard 4 shutdowns"
    );
    let last_revoked = revoked.iter().max().copied().expect("revocations");
    assert!(
        last_revoked - stopped_at >= chrono::TimeDelta::from_std(TTL).expect("a ttl"),
        "the stop lasted {} ms, less than a ttl",
        ms(last_revoked - stopped_at)
    );
    pool.until_owns(other, 8, RENEW + env.slack()).await;
    let taken: Vec<Timestamp> = pool
        .assigned_at(other)
        .into_iter()
        .filter(|&t| t > stopped_at)
        .collect();
    assert_eq!(
        taken.len(),
        4,
        "the other worker took the stopped one's buckets"
    );
    let first_taken = taken.iter().min().copied().expect("assignments");
    assert!(
        first_taken >= last_revoked,
        "a bucket was assigned {} ms before the stopping application's last revocation returned",
        ms(last_revoked - first_taken)
    );
    let summary = pool.shutdown().await;
    assert!(summary.handoffs >= 4);
}

/// Revoke before release, the rule a graceful handoff rests on: a worker shedding 4 buckets to a
/// joiner releases each one only after its application acknowledged the revocation (the handler
/// returned, 200 ms each here), so the joiner, woken by the release, is assigned it only after
/// that, as the ownership log shows (a revocation is recorded when the handler returns). The
/// workers renew every 5 s ([`SLOW_RENEW`](super::SLOW_RENEW)): only wake-ups can complete the
/// handoff within the four revocations plus [`WAKE_UP_BOUND`] (and the slack).
pub async fn a_shed_bucket_is_released_only_after_its_revoke_returns<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const REVOKE: Duration = Duration::from_millis(200);
    let mut pool = Pool::new(&env, "orders", 8, true).slow_ticks();
    let a = pool
        .start_slow(Slow {
            revoke: REVOKE,
            ..Slow::default()
        })
        .await;
    pool.until_owns(a, 8, 5 * RENEW).await;
    let b = pool.start().await;
    let took = pool
        .until_balanced(
            4 * REVOKE + WAKE_UP_BOUND + env.slack(),
            "the joiner's half, by wake-ups",
        )
        .await;
    eprintln!("shed 4 of 8 to a joiner, 200 ms per revocation: handed over in {took:?}");
    assert_eq!(pool.owned()[&b], 4);
    assert_eq!(pool.revoked_at(a, RevokeReason::Shed).len(), 4);
    // Checked here, before the workers stop (stopping hands buckets over again).
    assert_eq!(pool.check().handoffs, 4, "the shed buckets went to b");
    pool.shutdown().await;
}
