//! Conformance cases of groups: creating them (E1-E3), unknown groups (G5), names as data (G6), independence (G7).

use super::*;

/// E1: a new group has every bucket, unowned, token 0, and no members.
pub async fn ensure_creates_unowned_buckets<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 5).await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.group, g);
    assert_eq!(snap.shard_count, shards(5));
    assert_eq!(
        snap.buckets.iter().map(|b| b.bucket.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    for b in &snap.buckets {
        assert_eq!(b.owner, None);
        assert_eq!(b.session, None);
        assert_eq!(b.token, FencingToken(0));
        assert_eq!(b.expires_at, None);
        assert_eq!(b.state, BucketState::Unowned);
    }
    assert!(snap.members.is_empty());
}

/// E2: ensuring again with the same count changes nothing.
pub async fn ensure_is_idempotent<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    store
        .ensure_group(&g, shards(4))
        .await
        .expect("second ensure with the same count succeeds");
    let after = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(before, after, "a repeated ensure_group changed the group");
    assert_eq!(nums(&won), vec![0, 1]);
}

/// E3: another count fails with the stored count and writes nothing.
pub async fn ensure_mismatch_writes_nothing<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    for other in [3, 5, 64] {
        match store.ensure_group(&g, shards(other)).await {
            Err(StoreError::ShardCountMismatch {
                group: eg,
                configured,
                found,
            }) => {
                assert_eq!(eg, g);
                assert_eq!(configured, shards(other));
                assert_eq!(found, shards(4));
            }
            other => panic!("expected ShardCountMismatch, got {other:?}"),
        }
    }
    let after = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(before, after, "a mismatched ensure_group wrote something");
    assert_eq!(after.buckets.len(), 4);
}

/// G5: every operation on an unknown group fails with GroupNotFound; the fencing check says
/// false.
pub async fn unknown_group_fails_every_operation<S: LeaseStore>(store: S, _clock: ManualClock) {
    setup(&store, "known", 2).await;
    let g = group("unknown");
    let [a] = workers(1)[..] else { unreachable!() };
    let nf = ErrorKind::GroupNotFound;
    let hb = store
        .heartbeat(a, inc(a), ttl(), &MemberMetadata::empty(), &[])
        .await
        .expect("a node heartbeat names no group");
    assert_kind(store.join(&g, a, hb.session).await, nf, "join");
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        nf,
        "claim",
    );
    assert_kind(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0]))
            .await,
        nf,
        "release",
    );
    assert_kind(store.evict(&g, a).await, nf, "leave");
    assert_kind(store.snapshot(&g).await, nf, "snapshot");
    match store.snapshot(&g).await {
        Err(StoreError::GroupNotFound { group: eg }) => assert_eq!(eg, g),
        other => panic!("expected GroupNotFound naming the group, got {other:?}"),
    }
    assert!(
        !store
            .is_current(&g, Bucket(0), a, FencingToken(1))
            .await
            .expect("is_current on an unknown group answers")
    );
    assert!(
        store.changes(&g).await.is_ok(),
        "subscribing to a group not created yet is allowed"
    );
}

/// G7: groups are independent: same worker, same bucket numbers, separate state.
pub async fn groups_are_independent<S: LeaseStore>(store: S, clock: ManualClock) {
    let g1 = setup(&store, "one", 3).await;
    let g2 = setup(&store, "two", 5).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g1, a).await;
    assert_eq!(nums(&claim(&store, &g1, a, 3).await), vec![0, 1, 2]);
    // a has no session in g2 yet.
    assert_kind(
        store
            .claim(&g2, a, session(&store, &g2, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim in a group not joined",
    );
    beat(&store, &g2, b).await;
    assert_eq!(nums(&claim(&store, &g2, b, 5).await), vec![0, 1, 2, 3, 4]);
    let hb = beat(&store, &g2, a).await;
    assert_eq!(hb.view.shard_count, shards(5));
    assert_eq!(hb.view.claimable, 0);
    assert!(hb.owned.is_empty());
    // a leaves g1 without touching g2.
    clock.advance(secs(1));
    let left = store
        .leave(&g1, a, session(&store, &g2, a).await)
        .await
        .expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1, 2]);
    let hb1 = beat(&store, &g1, b).await;
    assert_eq!(hb1.view.claimable, 3, "a's g1 buckets are free");
    assert_eq!(live_owners(&store, &g2).await.len(), 5, "g2 is untouched");
    assert_eq!(tokens(&store, &g1).await, vec![1, 1, 1]);
    assert_eq!(tokens(&store, &g2).await, vec![1, 1, 1, 1, 1]);
    // Leaving g2 does not release g1.
    store.evict(&g2, b).await.expect("leave");
    assert_eq!(nums(&claim(&store, &g1, b, 3).await), vec![0, 1, 2]);
    assert_eq!(live_owners(&store, &g1).await.len(), 3);
}

/// G6: names with quotes, unicode and SQL are plain data.
pub async fn names_are_plain_data<S: LeaseStore>(store: S, _clock: ManualClock) {
    let names = [
        "it's",
        "\"quoted\"",
        "'; DROP TABLE lease.shards; --",
        "x' OR '1'='1",
        "Überweisung-処理-🦀",
        "back\\slash $1 %s",
        " leading and trailing ",
    ];
    let [a] = workers(1)[..] else { unreachable!() };
    let metadata = MemberMetadata::new("host='db'; pid=\"7\" -- ☃").expect("valid metadata");
    for (i, name) in names.iter().enumerate() {
        let g = setup(&store, name, i as u32 + 1).await;
        let hb = beat_as(&store, &g, a, inc(a), ttl(), &metadata)
            .await
            .expect("heartbeat");
        assert_eq!(hb.view.shard_count, shards(i as u32 + 1));
        claim(&store, &g, a, 1).await;
    }
    for (i, name) in names.iter().enumerate() {
        let snap = store.snapshot(&group(name)).await.expect("snapshot");
        assert_eq!(snap.group.as_str(), *name);
        assert_eq!(snap.buckets.len(), i + 1);
        assert_eq!(snap.members.len(), 1);
        assert_eq!(snap.members[0].metadata, metadata);
        assert_eq!(snap.live_leases().len(), 1);
    }
    // A name that is a prefix or a LIKE pattern of another is a different group.
    assert_kind(
        store.snapshot(&group("it%")).await,
        ErrorKind::GroupNotFound,
        "a LIKE pattern is not a name",
    );
}

// ---- heartbeat -----------------------------------------------------------------------------
