//! Conformance cases of node sessions and heartbeats: starting, extending and ending sessions (H1-H9, G1, G2), one process per node id (H7), the views a heartbeat gives.

use super::*;

/// H2, H4: the first heartbeat starts a session that expires after the ttl.
pub async fn first_heartbeat_starts_a_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert_eq!(hb.observed_at, clock.now());
    assert_eq!(hb.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(hb.view.shard_count, shards(3));
    assert_eq!(hb.view.members.len(), 1);
    assert_eq!(hb.view.members[0].worker, a);
    assert_eq!(hb.view.members[0].owned, 0);
    assert_eq!(hb.view.claimable, 3);
    assert!(hb.owned.is_empty());
}

/// H1: a heartbeat before expiry extends the same session.
pub async fn heartbeat_extends_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    let second = beat(&store, &g, a).await;
    assert!(!second.new_session);
    assert_eq!(second.session, first.session);
    assert_eq!(second.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(nums(&second.owned), vec![0, 1]);
    assert!(
        second
            .owned
            .iter()
            .all(|l| l.expires_at == second.expires_at)
    );
    // A shorter ttl shortens the session.
    let short = Ttl::from_secs(1).expect("valid ttl");
    let third = beat_as(&store, &g, a, inc(a), short, &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    assert_eq!(third.session, first.session);
    assert_eq!(third.expires_at, clock.now() + short.as_chrono());
}

/// H2, G1, G2: at the instant of expiry the session is dead; the next heartbeat starts a new
/// session and reports nothing owned.
pub async fn expired_session_is_never_renewed<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    let second = beat(&store, &g, a).await;
    assert!(
        second.new_session,
        "a heartbeat at expiry renewed a dead session"
    );
    assert_ne!(second.session, first.session);
    assert!(second.owned.is_empty());
    assert_eq!(second.view.members[0].owned, 0);
    assert_eq!(second.view.claimable, 3);
    // The session started now: renewing it right away keeps it.
    let third = beat(&store, &g, a).await;
    assert!(!third.new_session);
    assert_eq!(third.session, second.session);
}

/// H2: the dead session's buckets are claimable by another worker, with new tokens.
pub async fn old_session_buckets_are_claimable_by_anyone<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 4).await;
    clock.advance(secs(TTL_SECS));
    beat(&store, &g, a).await; // a is back, under a new session
    beat(&store, &g, b).await;
    let taken = claim(&store, &g, b, 4).await;
    assert_eq!(nums(&taken), vec![0, 1, 2, 3]);
    for (new, old) in taken.iter().zip(&old) {
        assert_eq!(new.token.0, old.token.0 + 1);
        assert_eq!(new.owner, b);
    }
    assert!(beat(&store, &g, a).await.owned.is_empty());
}

/// H2, G4: a worker whose session expired may claim its old buckets back, with new tokens.
pub async fn a_worker_reclaims_its_old_buckets_with_new_tokens<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 2).await;
    clock.advance(secs(TTL_SECS + 5));
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert_eq!(hb.view.claimable, 2);
    let again = claim(&store, &g, a, 2).await;
    assert_eq!(nums(&again), vec![0, 1]);
    assert!(
        again
            .iter()
            .zip(&old)
            .all(|(n, o)| n.token.0 == o.token.0 + 1)
    );
    assert!(
        !store
            .is_current(&g, old[0].bucket, a, old[0].token)
            .await
            .expect("is_current"),
        "the old session's token still passes the fencing check"
    );
    let hb = beat(&store, &g, a).await;
    assert_eq!(
        hb.owned,
        again
            .iter()
            .map(|l| Lease {
                expires_at: hb.expires_at,
                ..*l
            })
            .collect::<Vec<_>>()
    );
}

/// H3: any heartbeat, a renewal included, removes the dead member rows of the group; their
/// buckets stay claimable.
pub async fn heartbeats_remove_dead_members<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    beat(&store, &g, b).await;
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, b).await; // b stays live, a does not
    clock.advance(secs(TTL_SECS / 2));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.members.len(), 2, "a snapshot removes nothing");
    assert!(
        !snap
            .members
            .iter()
            .find(|m| m.worker == a)
            .expect("a's row")
            .live
    );
    // A renewal in a stable pool removes the dead row: dead members do not linger.
    let renewal = beat(&store, &g, b).await;
    assert!(!renewal.new_session);
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b],
        "a dead member's row outlived a renewal of the group"
    );
    assert_eq!(snap.buckets[0].owner, Some(a));
    assert_eq!(snap.buckets[0].state, BucketState::Expired);
    assert_eq!(
        snap.buckets[0].expires_at, None,
        "the owner's session is gone"
    );
    assert_eq!(renewal.view.claimable, 4);
    let hb = beat(&store, &g, c).await;
    assert!(hb.new_session);
    assert_eq!(hb.view.claimable, 4);
    assert_eq!(nums(&claim(&store, &g, c, 4).await), vec![0, 1, 2, 3]);
}

/// H7: a second incarnation of a node id is refused while the first one's session lives,
/// without writing anything; once that session ends it starts a session of its own, and the
/// first incarnation is refused in turn and can no longer act under its old session.
pub async fn a_node_id_in_use_is_refused<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let (first, second) = (Incarnation::new(), Incarnation::new());
    let meta = MemberMetadata::new("first").expect("metadata");
    let hb = beat_as(&store, &g, a, first, ttl(), &meta)
        .await
        .expect("first heartbeat");
    let won = store
        .claim(&g, a, hb.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 2);
    clock.advance(secs(1));
    let before = store.snapshot(&g).await.expect("snapshot");
    let refused = store
        .heartbeat(
            a,
            second,
            ttl(),
            &MemberMetadata::new("second").expect("metadata"),
            &[],
        )
        .await;
    match refused {
        Err(StoreError::NodeIdInUse { worker, expires_at }) => {
            assert_eq!(worker, a);
            assert_eq!(expires_at, hb.expires_at, "the live session's expiry");
        }
        other => panic!("a second incarnation was not refused: {other:?}"),
    }
    let mut after = store.snapshot(&g).await.expect("snapshot");
    after.observed_at = before.observed_at;
    assert_eq!(after, before, "a refused heartbeat wrote something");
    // The first incarnation renews as before: same session, its buckets intact.
    let renewed = beat_as(&store, &g, a, first, ttl(), &meta)
        .await
        .expect("renewal");
    assert!(!renewed.new_session);
    assert_eq!(renewed.session, hb.session);
    assert_eq!(renewed.owned.len(), 2);
    // Once that session has expired, the second incarnation starts its own.
    clock.advance(secs(TTL_SECS));
    let taken = beat_as(&store, &g, a, second, ttl(), &meta)
        .await
        .expect("the second incarnation after expiry");
    assert!(taken.new_session);
    assert_ne!(taken.session, hb.session);
    assert!(
        taken.owned.is_empty(),
        "the old session's buckets came back"
    );
    assert_eq!(taken.view.claimable, 4);
    // The first incarnation is refused now, and its old session is void everywhere.
    assert_kind(
        store.heartbeat(a, first, ttl(), &meta, &[]).await,
        ErrorKind::NodeIdInUse,
        "the first incarnation after the second took over",
    );
    assert_kind(
        store.claim(&g, a, hb.session, 4, Takeover::Allowed).await,
        ErrorKind::SessionExpired,
        "a claim under the replaced session",
    );
    assert!(
        store
            .release(&g, a, hb.session, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert!(
        store
            .leave(&g, a, hb.session)
            .await
            .expect("leave")
            .is_empty()
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.len(),
        1,
        "a leave under an old session removed the row"
    );
    assert_eq!(snap.members[0].session, taken.session);
    let mine = store
        .claim(&g, a, taken.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(mine.len(), 4);
}

/// C1, R2, L1, L2: claim, release and leave act only under the session they name.
pub async fn operations_act_only_under_the_named_session<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    let stranger = SessionId::new();
    assert_kind(
        store.claim(&g, a, stranger, 2, Takeover::Allowed).await,
        ErrorKind::SessionExpired,
        "a claim under a session the worker does not hold",
    );
    assert_eq!(hb.view.claimable, 4);
    let won = store
        .claim(&g, a, hb.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 1]);
    assert!(
        store
            .release(&g, a, stranger, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert!(
        store
            .leave(&g, a, stranger)
            .await
            .expect("leave")
            .is_empty()
    );
    assert_eq!(
        live_owners(&store, &g).await.len(),
        2,
        "something was released"
    );
    // A node leaving its last group under its own session frees the node id at once (L3).
    let left = store.leave(&g, a, hb.session).await.expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1]);
    let next = beat_as(
        &store,
        &g,
        a,
        Incarnation::new(),
        ttl(),
        &MemberMetadata::empty(),
    )
    .await
    .expect("a new incarnation after a graceful leave");
    assert!(next.new_session);
}

/// H4: idle members are listed with zero buckets, sorted by node id.
pub async fn heartbeat_lists_idle_members_with_zero<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let ws = workers(3);
    for &w in &ws {
        beat(&store, &g, w).await;
    }
    claim(&store, &g, ws[1], 4).await;
    let hb = beat(&store, &g, ws[2]).await;
    let loads: Vec<(NodeId, u32)> = hb
        .view
        .members
        .iter()
        .map(|m| (m.worker, m.owned))
        .collect();
    assert_eq!(loads, vec![(ws[0], 0), (ws[1], 4), (ws[2], 0)]);
    assert_eq!(hb.view.claimable, 2);
}

/// H4: members whose sessions expired are not in the view.
pub async fn heartbeat_omits_expired_members<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    beat(&store, &g, b).await;
    clock.advance(secs(TTL_SECS - 1));
    let hb = beat(&store, &g, b).await;
    assert_eq!(
        hb.view.members.len(),
        2,
        "a is still live one second before expiry"
    );
    assert_eq!(hb.view.claimable, 1);
    clock.advance(secs(1));
    let hb = beat(&store, &g, b).await;
    assert_eq!(
        hb.view.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b]
    );
    assert_eq!(
        hb.view.claimable, 4,
        "a dead session's buckets are claimable"
    );
}

/// H4: `claimable` counts unowned buckets and buckets of dead sessions, not live ones.
pub async fn heartbeat_counts_claimable_buckets<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 10).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    beat(&store, &g, b).await;
    claim(&store, &g, b, 4).await;
    assert_eq!(beat(&store, &g, c).await.view.claimable, 3);
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, b).await;
    beat(&store, &g, c).await;
    clock.advance(secs(TTL_SECS / 2));
    // a died; its 3 are claimable again alongside the 3 never owned.
    assert_eq!(beat(&store, &g, c).await.view.claimable, 6);
    store
        .release(&g, b, session(&store, &g, b).await, &bs(&[3]))
        .await
        .expect("release");
    assert_eq!(beat(&store, &g, c).await.view.claimable, 7);
}

/// H4: `owned` is exactly the worker's leases, with tokens, expiring with the session.
pub async fn heartbeat_returns_exactly_own_leases<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 3).await;
    claim(&store, &g, b, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[1]))
        .await
        .expect("release");
    let again = claim(&store, &g, a, 1).await;
    assert_eq!(nums(&again), vec![1]);
    let hb = beat(&store, &g, a).await;
    assert_eq!(nums(&hb.owned), vec![0, 1, 2]);
    assert_eq!(
        hb.owned.iter().map(|l| l.token.0).collect::<Vec<_>>(),
        vec![1, 2, 1]
    );
    assert!(
        hb.owned
            .iter()
            .all(|l| l.owner == a && l.expires_at == hb.expires_at)
    );
    let hb = beat(&store, &g, b).await;
    assert_eq!(nums(&hb.owned), vec![3, 4]);
}

/// H4: a bucket taken over by another worker is gone from the old owner's heartbeat.
pub async fn lost_bucket_disappears_from_heartbeat<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 2).await), vec![0, 1]);
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert!(
        hb.owned.is_empty(),
        "a still sees buckets it lost: {:?}",
        hb.owned
    );
    // The one nobody took is not a's either: its session died.
    assert_eq!(hb.view.claimable, 1);
}

/// H5: heartbeats never change a bucket or a token.
pub async fn heartbeat_changes_no_bucket<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot").buckets;
    for _ in 0..3 {
        clock.advance(secs(1));
        beat(&store, &g, a).await;
        beat(&store, &g, b).await;
    }
    clock.advance(secs(TTL_SECS * 2));
    beat(&store, &g, a).await; // a new session
    let after = store.snapshot(&g).await.expect("snapshot").buckets;
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(
            (x.bucket, x.owner, x.session, x.token),
            (y.bucket, y.owner, y.session, y.token)
        );
    }
}

// ---- claim ---------------------------------------------------------------------------------

/// H9: a heartbeat that starts a session removes the rows of other nodes that are dead and in
/// no group, and no other: a dead node still a member of a group stays (H3 removes it from
/// there), as does a live node in no group, and nothing else starts a removal.
pub async fn a_new_session_removes_dead_nodes_in_no_group<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let orders = setup(&store, "orders", 2).await;
    let [never_joined, member, idle, newcomer] = workers(4)[..] else {
        unreachable!()
    };
    let empty = MemberMetadata::empty();
    // A process that died before it joined anything, a member, and a live node in no group
    // that outlives them (its session starts while the others are live: nothing removed).
    store
        .heartbeat(never_joined, inc(never_joined), ttl(), &empty, &[])
        .await
        .expect("heartbeat");
    beat(&store, &orders, member).await;
    let long = Ttl::from_secs(3 * TTL_SECS).expect("ttl");
    store
        .heartbeat(idle, inc(idle), long, &empty, &[])
        .await
        .expect("heartbeat");
    let listed = |l: &lease_core::NodesSnapshot| l.nodes.iter().map(|n| n.node).collect::<Vec<_>>();
    let mut all = vec![never_joined, member, idle];
    all.sort();
    clock.advance(secs(TTL_SECS));
    // A renewal removes nothing.
    let renewed = store
        .heartbeat(idle, inc(idle), long, &empty, &[])
        .await
        .expect("heartbeat");
    assert!(!renewed.new_session);
    assert_eq!(
        listed(&store.nodes().await.expect("nodes")),
        all,
        "a renewal removed a node"
    );
    // A new session: the dead node in no group goes; the dead member and the live idle node
    // stay.
    let started = store
        .heartbeat(newcomer, inc(newcomer), ttl(), &empty, &[])
        .await
        .expect("heartbeat");
    assert!(started.new_session);
    let mut want = vec![member, idle, newcomer];
    want.sort();
    assert_eq!(listed(&store.nodes().await.expect("nodes")), want);
}
