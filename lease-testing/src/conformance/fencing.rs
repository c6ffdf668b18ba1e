//! Conformance cases of fencing: tokens rising across owners (G4) and `is_current` (F1).

use super::*;

/// G4: across owners, releases and expiries, each bucket's tokens strictly increase.
pub async fn tokens_strictly_increase_across_owners<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 1).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let mut seen = Vec::new();
    for step in 0..6 {
        let w = if step % 2 == 0 { a } else { b };
        beat(&store, &g, w).await;
        let won = claim(&store, &g, w, 1).await;
        assert_eq!(won.len(), 1, "step {step}: bucket 0 was claimable");
        seen.push(won[0].token.0);
        if step % 3 == 0 {
            store
                .release(&g, w, session(&store, &g, w).await, &bs(&[0]))
                .await
                .expect("release");
        } else if step % 3 == 1 {
            clock.advance(secs(TTL_SECS));
        } else {
            store.evict(&g, w).await.expect("leave");
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5, 6]);
}

// ---- fencing -------------------------------------------------------------------------------

/// F1: the current owner with its current token passes.
pub async fn is_current_accepts_the_current_owner<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    for lease in claim(&store, &g, a, 3).await {
        assert!(
            store
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current")
        );
    }
}

/// F1: a stale token, a wrong token, another worker, a bucket out of range all fail.
pub async fn is_current_rejects_stale_tokens_and_other_owners<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let first = claim(&store, &g, a, 1).await[0];
    store
        .release(&g, a, session(&store, &g, a).await, &[first.bucket])
        .await
        .expect("release");
    let second = claim(&store, &g, b, 1).await[0];
    assert_eq!(second.bucket, first.bucket);
    let check = |w: NodeId, t: i64| {
        let store = &store;
        let g = &g;
        async move {
            store
                .is_current(g, first.bucket, w, FencingToken(t))
                .await
                .expect("is_current")
        }
    };
    assert!(check(b, second.token.0).await);
    assert!(
        !check(a, first.token.0).await,
        "stale token of the old owner"
    );
    assert!(
        !check(a, second.token.0).await,
        "current token, wrong worker"
    );
    assert!(!check(b, first.token.0).await, "right worker, stale token");
    assert!(!check(b, second.token.0 + 1).await, "a future token");
    assert!(
        !store
            .is_current(&g, Bucket(2), b, second.token)
            .await
            .expect("is_current"),
        "bucket out of range"
    );
}

/// F1: a dead session's token and a released bucket's token fail.
pub async fn is_current_rejects_dead_sessions_and_released_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &[won[1].bucket])
        .await
        .expect("release");
    assert!(
        !store
            .is_current(&g, won[1].bucket, a, won[1].token)
            .await
            .expect("is_current")
    );
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    assert!(
        store
            .is_current(&g, won[0].bucket, a, won[0].token)
            .await
            .expect("is_current")
    );
    clock.advance(Duration::from_micros(1));
    assert!(
        !store
            .is_current(&g, won[0].bucket, a, won[0].token)
            .await
            .expect("is_current"),
        "a dead session's lease passed the fencing check"
    );
}

// ---- snapshot ------------------------------------------------------------------------------
