//! Runtime cases of self-fencing: a worker that cannot renew, or whose store calls hang,
//! revokes before its session expires; a new session revokes everything of the old one first;
//! slow handlers do not starve renewals.

use std::sync::atomic::Ordering;
use std::time::Duration;

use lease_core::{LeaseStore, OwnershipEvent, RevokeReason};

use super::{Env, Pool, RENEW, Slow, TTL, until};

/// A worker whose heartbeats fail revokes its 4 buckets (expired) before its session expires
/// in the store, so before anyone can take them; the other then owns all 8. Healed, it starts
/// a new session and gets its share back.
pub async fn a_worker_that_cannot_renew_fences_itself_before_anyone_takes_over<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.fail_heartbeats.store(true, Ordering::SeqCst);
    let latest_expiry = pool
        .until_following_expiry(a, TTL + RENEW + env.slack(), "b taking over", || {
            pool.owned()[&b] == 8
        })
        .await;
    let fenced = pool.revoked_at(a, RevokeReason::Fenced);
    assert_eq!(
        fenced.len(),
        4,
        "a did not revoke its four buckets: {:?}",
        pool.events_of(a)
    );
    for t in &fenced {
        assert!(
            *t < latest_expiry,
            "a fenced at {t}, after its session expired at {latest_expiry}"
        );
    }
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.fail_heartbeats.store(false, Ordering::SeqCst);
    // Only that it recovers matters here, not how fast.
    pool.until_balanced(5 * RENEW, "a's share back").await;
    let summary = pool.shutdown().await;
    assert_eq!(summary.revocations.get("fenced"), Some(&4));
}

/// A worker whose store calls hang, as over a cut network (no error ever comes back), revokes
/// its 4 buckets at its trust deadline while the call hangs, before its session expires; the
/// other worker owns all 8 after that. Healed, it gets its share back.
pub async fn a_worker_cut_off_mid_call_fences_while_the_call_hangs<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.hang.store(true, Ordering::SeqCst);
    let expiry = pool
        .until_following_expiry(a, TTL + RENEW + env.slack(), "b taking over", || {
            pool.owned()[&b] == 8
        })
        .await;
    let fenced = pool.revoked_at(a, RevokeReason::Fenced);
    assert_eq!(
        fenced.len(),
        4,
        "a kept trusting its leases while its store calls hung"
    );
    assert_eq!(
        pool.owned()[&a],
        0,
        "the owned set still lists buckets after fencing"
    );
    assert!(
        fenced.iter().all(|t| *t < expiry),
        "fenced at {fenced:?}, expiry {expiry}"
    );
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.hang.store(false, Ordering::SeqCst);
    pool.until_balanced(5 * RENEW, "a's share back").await;
    pool.shutdown().await;
}

/// A worker whose session was ended behind its back (an operator's forced release) revokes
/// everything it held (expired) before it is assigned anything under its new session, at its
/// next tick.
pub async fn a_new_session_revokes_everything_before_claiming_again<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, false);
    let a = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let before = pool.events_of(a).len();
    pool.store.evict(&pool.group, a).await.expect("leave");
    let reclaimed = || {
        let events = pool.events_of(a);
        let after = &events[before..];
        let revoked = after
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Expired,
                        ..
                    }
                )
            })
            .count();
        let assigned = after
            .iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .count();
        revoked == 4 && assigned == 4
    };
    until(
        RENEW + env.slack(),
        "a revoking its 4 buckets (expired) and claiming them again",
        reclaimed,
        || pool.events_of(a),
    )
    .await;
    let events = pool.events_of(a);
    let first_assigned = events[before..]
        .iter()
        .position(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
        .expect("assigned again");
    let last_revoked = events[before..]
        .iter()
        .rposition(|(_, e)| matches!(e, OwnershipEvent::Revoked { .. }))
        .expect("revoked");
    assert!(
        last_revoked < first_assigned,
        "assigned under the new session before every old bucket was revoked: {:?}",
        &events[before..]
    );
    // The application's events are logged as it is told; its owned set is published once
    // the worker sees the call return: wait for that, not for the next instant.
    pool.until_balanced(env.slack(), "a holding its 4 buckets again")
        .await;
    pool.shutdown().await;
}

/// Slow handlers cannot starve the renewals: a worker assigning 40 buckets at 200 ms each
/// (8 s, past the 2.5 s trust window) interleaves renewals and never fences on the way. A store
/// stall of 2.8 s then makes it fence exactly once (40 revocations), and it gets all 40 back
/// without flapping; a joiner then gets half.
pub async fn slow_handlers_do_not_starve_renewals<S: LeaseStore + Clone + 'static>(env: Env<S>) {
    let mut pool = Pool::new(&env, "orders", 40, true);
    let a = pool
        .start_slow(Slow {
            assign: Duration::from_millis(200),
            ..Slow::default()
        })
        .await;
    // 8 s of handler time, a renewal every second between assignments.
    pool.until_owns(a, 40, 12 * RENEW).await;
    assert_eq!(
        pool.revoked_at(a, RevokeReason::Fenced).len(),
        0,
        "a fenced itself while assigning"
    );
    let faults = pool.faults(a);
    faults.hang.store(true, Ordering::SeqCst);
    // The stall is the fault's length, past the 2.5 s trust window.
    tokio::time::sleep(Duration::from_millis(2_800)).await;
    faults.hang.store(false, Ordering::SeqCst);
    // Fenced (at the trust deadline, during the stall), then all 40 back.
    until(
        20 * RENEW,
        "a fenced and owning 40 again",
        || pool.revoked_at(a, RevokeReason::Fenced).len() >= 40 && pool.owned()[&a] == 40,
        || pool.owned(),
    )
    .await;
    let b = pool.start().await;
    pool.until_balanced(20 * RENEW, "b's half").await;
    assert_eq!(pool.owned()[&b], 20);
    // Counted after b's half, so that a fence after the recovery would show too.
    let fenced = pool.revoked_at(a, RevokeReason::Fenced).len();
    assert_eq!(
        fenced, 40,
        "a did not fence exactly once ({fenced} revocations)"
    );
    pool.shutdown().await;
}
