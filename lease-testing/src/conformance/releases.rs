//! Conformance cases of releases (R1-R4) and leaves (L1-L4).

use super::*;

/// R2: release touches only the caller's own buckets and reports what it released.
pub async fn release_only_touches_own_buckets<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await; // 0, 1
    claim(&store, &g, b, 2).await; // 2, 3
    let released = store
        .release(
            &g,
            a,
            session(&store, &g, a).await,
            &bs(&[3, 1, 2, 4, 1, 0]),
        )
        .await
        .expect("release");
    assert_eq!(bucket_nums(&released), vec![0, 1]);
    let owners = live_owners(&store, &g).await;
    assert_eq!(owners, BTreeMap::from([(2, b), (3, b)]));
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &[])
            .await
            .expect("empty release")
            .is_empty()
    );
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1]))
            .await
            .expect("again")
            .is_empty()
    );
}

/// R3: release keeps tokens; the next claim gets token + 1.
pub async fn release_keeps_tokens<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1]))
        .await
        .expect("release");
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.token.0 == 1 && x.state == BucketState::Unowned)
    );
    let won = claim(&store, &g, b, 2).await;
    assert!(won.iter().all(|l| l.token.0 == 2));
}

/// R1: a bucket out of range fails the whole call and releases nothing.
pub async fn release_out_of_range_writes_nothing<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 4).await;
    match store
        .release(&g, a, session(&store, &g, a).await, &bs(&[0, 4]))
        .await
    {
        Err(StoreError::BucketOutOfRange {
            group: eg,
            bucket,
            shard_count,
        }) => {
            assert_eq!((eg, bucket, shard_count), (g.clone(), Bucket(4), shards(4)));
        }
        other => panic!("expected BucketOutOfRange, got {other:?}"),
    }
    assert_kind(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[u32::MAX]))
            .await,
        ErrorKind::BucketOutOfRange,
        "release of bucket u32::MAX",
    );
    assert_eq!(
        live_owners(&store, &g).await.len(),
        4,
        "bucket 0 was released"
    );
}

/// R2: a worker without a live session releases nothing, even buckets it held.
pub async fn release_without_live_session_releases_nothing<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0]))
            .await
            .expect("release")
            .is_empty()
    );
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1, 2]))
            .await
            .expect("release")
            .is_empty()
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|b| b.state == BucketState::Expired && b.owner == Some(a))
    );
}

// ---- leave ---------------------------------------------------------------------------------

/// L1: leave releases every bucket, keeps tokens and removes the member row.
pub async fn leave_releases_everything_and_removes_membership<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 5).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 3).await;
    claim(&store, &g, b, 1).await;
    let released = store.evict(&g, a).await.expect("leave");
    assert_eq!(bucket_nums(&released), vec![0, 1, 2]);
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b]
    );
    assert_eq!(live_owners(&store, &g).await, BTreeMap::from([(3, b)]));
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1, 1, 0]);
    let hb = beat(&store, &g, b).await;
    assert_eq!(hb.view.members.len(), 1);
    assert_eq!(hb.view.claimable, 4);
}

/// L2: leaving when not a member succeeds and changes nothing; a dead member's row goes.
pub async fn leave_is_idempotent<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    assert!(store.evict(&g, a).await.expect("leave").is_empty());
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, b, 2).await;
    assert!(store.evict(&g, a).await.expect("leave").is_empty());
    assert!(store.evict(&g, a).await.expect("leave again").is_empty());
    // b dies; leaving removes its dead row but releases nothing (it owned nothing live).
    clock.advance(secs(TTL_SECS));
    assert!(store.evict(&g, b).await.expect("leave").is_empty());
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.members.is_empty());
    assert!(snap.buckets.iter().all(|x| x.state == BucketState::Expired));
}

/// L3: after leaving, the next heartbeat starts a new session.
pub async fn leaving_the_last_group_ends_the_session<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    store.evict(&g, a).await.expect("leave");
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim after leave",
    );
    let second = beat(&store, &g, a).await;
    assert!(second.new_session);
    assert_ne!(second.session, first.session);
    assert!(second.owned.is_empty());
    assert_eq!(second.view.claimable, 2);
}
