//! Conformance cases of claims (C1-C9): live sessions only, never a live lease, claim order, deferred takeovers, tokens.

use super::*;

/// C1: claiming needs a live session.
pub async fn claim_needs_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    match store
        .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
        .await
    {
        Err(StoreError::SessionExpired { group: eg, worker }) => {
            assert_eq!((eg, worker), (g.clone(), a));
        }
        other => panic!("claim without a session: expected SessionExpired, got {other:?}"),
    }
    beat(&store, &g, a).await;
    clock.advance(secs(TTL_SECS));
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim at the instant of expiry",
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|b| b.state == BucketState::Unowned && b.token.0 == 0)
    );
}

/// C3: at most `want` buckets are taken; zero takes none.
pub async fn claim_respects_want<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 10).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    assert!(claim(&store, &g, a, 0).await.is_empty());
    assert_eq!(claim(&store, &g, a, 3).await.len(), 3);
    assert_eq!(claim(&store, &g, a, 4).await.len(), 4);
    assert_eq!(claim(&store, &g, a, 100).await.len(), 3, "only 3 were left");
    assert!(claim(&store, &g, a, 5).await.is_empty());
    assert_eq!(beat(&store, &g, a).await.owned.len(), 10);
}

/// C3, C4: a worker whose claims start at bucket 0 takes the lowest claimable buckets first;
/// the result is sorted.
pub async fn claim_takes_lowest_claimable_first<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 5).await), vec![0, 1, 2, 3, 4]);
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[3, 1]))
        .await
        .expect("release");
    assert_eq!(nums(&claim(&store, &g, b, 3).await), vec![1, 3, 5]);
}

/// C3: a worker's claims start at its claim start (its id's low 32 bits modulo the shard
/// count) and wrap around to 0; the result is sorted by bucket.
pub async fn claims_follow_the_worker_s_order<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a] = workers(1)[..] else { unreachable!() };
    // b starts at bucket 13 % 8 = 5.
    let b = NodeId::from_uuid(uuid::Uuid::from_u128(
        NodeId::new().as_uuid().as_u128() & !0xFFFF_FFFF | 13,
    ));
    assert_eq!(shards(8).claim_start(b), Bucket(5));
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    assert_eq!(nums(&claim(&store, &g, b, 2).await), vec![5, 6]);
    // Past the top it wraps around to 0, skipping what is not claimable (a holds 0).
    assert_eq!(nums(&claim(&store, &g, b, 3).await), vec![1, 2, 7]);
    assert_eq!(nums(&claim(&store, &g, a, 8).await), vec![3, 4]);
}

/// C2, G1: a live lease is never taken, not even a microsecond before it expires.
pub async fn claim_never_takes_a_live_lease<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    beat(&store, &g, b).await;
    assert!(claim(&store, &g, b, 3).await.is_empty());
    // The owner cannot take its own live buckets twice either.
    assert!(claim(&store, &g, a, 3).await.is_empty());
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1]);
}

/// C2, G1: at the instant a session expires, its buckets are claimable.
pub async fn claim_takes_expired_leases<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(1));
    beat(&store, &g, b).await;
    // The instant a's session expires; b's, started a second later, is live.
    clock.advance(secs(TTL_SECS - 1));
    let taken = claim(&store, &g, b, 3).await;
    assert_eq!(nums(&taken), vec![0, 1, 2]);
    assert!(taken.iter().all(|l| l.token.0 == 2));
}

/// C7: a deferred claim leaves a dead session's buckets alone and takes unowned (released)
/// ones; an allowed claim then takes the dead session's.
pub async fn a_deferred_claim_takes_only_unowned_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let held = claim(&store, &g, a, 4).await;
    let a_session = session(&store, &g, a).await;
    let released = store
        .release(&g, a, a_session, &[Bucket(1)])
        .await
        .expect("release");
    assert_eq!(released, vec![Bucket(1)]);
    assert_eq!(held.len(), 4);
    clock.advance(secs(TTL_SECS));
    let hb = beat(&store, &g, b).await;
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Deferred)
        .await
        .expect("deferred claim");
    assert_eq!(nums(&won), vec![1], "only the released bucket");
    assert_eq!(won[0].token.0, 2);
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Deferred)
        .await
        .expect("deferred claim");
    assert!(won.is_empty(), "a dead session's buckets taken: {won:?}");
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 2, 3]);
    assert!(won.iter().all(|l| l.token.0 == 2), "{won:?}");
}

/// C7: `AllowedWithin(d)` takes a dead session's buckets only while the store's time is at
/// most `d` after the caller's last renewal; beyond, it takes only unowned buckets.
pub async fn a_takeover_within_a_bound_checks_the_store_clock<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 4).await;
    let a_session = session(&store, &g, a).await;
    store
        .release(&g, a, a_session, &[Bucket(1)])
        .await
        .expect("release");
    clock.advance(secs(TTL_SECS));
    let hb = beat(&store, &g, b).await;
    // Two seconds after b's renewal: more than a one-second bound allows.
    clock.advance(secs(2));
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::AllowedWithin(secs(1)))
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![1], "only the released bucket");
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::AllowedWithin(secs(3)))
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 2, 3], "within the bound");
}

/// C2, G3: what one worker holds, another cannot claim.
pub async fn claim_excludes_another_worker<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let mine = claim(&store, &g, a, 4).await;
    let theirs = claim(&store, &g, b, 6).await;
    assert_eq!(nums(&mine), vec![0, 1, 2, 3]);
    assert_eq!(nums(&theirs), vec![4, 5]);
    assert!(claim(&store, &g, a, 6).await.is_empty());
    let owners = live_owners(&store, &g).await;
    assert_eq!(owners.values().filter(|&&w| w == a).count(), 4);
    assert_eq!(owners.values().filter(|&&w| w == b).count(), 2);
}

/// C5: many concurrent claims never win the same bucket twice.
pub async fn concurrent_claims_never_overlap<S: LeaseStore + 'static>(
    store: S,
    _clock: ManualClock,
) {
    let store = Arc::new(store);
    let g = setup(&*store, "orders", 64).await;
    let ws = workers(8);
    for &w in &ws {
        beat(&*store, &g, w).await;
    }
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for &w in &ws {
            let (store, g) = (store.clone(), g.clone());
            tasks.spawn(async move {
                (
                    w,
                    store
                        .claim(&g, w, session(&store, &g, w).await, 64, Takeover::Allowed)
                        .await,
                )
            });
        }
        let mut seen: BTreeMap<u32, NodeId> = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            let (w, result) = joined.expect("claim task did not panic");
            for lease in result.expect("claim succeeds") {
                if let Some(other) = seen.insert(lease.bucket.0, w) {
                    panic!(
                        "round {round}: bucket {} won by {other} and {w}",
                        lease.bucket
                    );
                }
            }
        }
        assert_eq!(seen.len(), 64, "round {round}: every bucket was claimable");
        assert_eq!(live_owners(&*store, &g).await, seen);
        assert!(tokens(&*store, &g).await.iter().all(|&t| t == round + 1));
        for &w in &ws {
            let mine: Vec<Bucket> = seen
                .iter()
                .filter(|(_, o)| **o == w)
                .map(|(&b, _)| Bucket(b))
                .collect();
            let released = store
                .release(&g, w, session(&store, &g, w).await, &mine)
                .await
                .expect("release");
            assert_eq!(released, mine);
        }
    }
}

/// C4, G4: each claim raises the token by exactly one.
pub async fn claim_increments_tokens<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let expected_tokens = [1, 2, 3, 4, 5];
    for (i, &expected) in expected_tokens.iter().enumerate() {
        let w = if i % 2 == 0 { a } else { b };
        let won = claim(&store, &g, w, 1).await;
        assert_eq!(nums(&won), vec![0]);
        assert_eq!(won[0].token, FencingToken(expected));
        assert_eq!(won[0].owner, w);
        store
            .release(&g, w, session(&store, &g, w).await, &bs(&[0]))
            .await
            .expect("release");
    }
    assert_eq!(tokens(&store, &g).await, vec![5, 0]);
}

/// C6: a claim does not move the session's expiry.
pub async fn claim_does_not_extend_the_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    clock.advance(secs(TTL_SECS - 1));
    let won = claim(&store, &g, a, 2).await;
    assert!(won.iter().all(|l| l.expires_at == hb.expires_at));
    clock.advance(secs(1));
    assert!(
        beat(&store, &g, a).await.new_session,
        "the claim extended the session"
    );
}

/// G4: renewing never changes a token.
pub async fn renewal_keeps_tokens<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 3).await;
    for _ in 0..5 {
        clock.advance(secs(TTL_SECS / 2));
        let hb = beat(&store, &g, a).await;
        assert!(!hb.new_session);
        assert_eq!(
            hb.owned.iter().map(|l| l.token).collect::<Vec<_>>(),
            won.iter().map(|l| l.token).collect::<Vec<_>>()
        );
    }
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1]);
}

// ---- release -------------------------------------------------------------------------------
