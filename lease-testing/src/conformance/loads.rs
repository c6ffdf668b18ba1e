//! Loads: claims of named buckets (C12, C13) and the loads recorded on buckets (P1-P5).

use lease_core::{Load, QuarantineFor};

use super::*;

fn load(units: u64) -> Load {
    Load::from_micros(units * 1_000_000)
}

async fn claim_named<S: LeaseStore>(
    store: &S,
    g: &GroupName,
    w: NodeId,
    ns: &[u32],
) -> Result<Vec<u32>, StoreError> {
    let s = session(store, g, w).await;
    store
        .claim_buckets(g, w, s, &bs(ns), Takeover::Allowed)
        .await
        .map(|won| nums(&won))
}

async fn publish<S: LeaseStore>(
    store: &S,
    g: &GroupName,
    w: NodeId,
    loads: &[(u32, u64)],
) -> Result<u32, StoreError> {
    let s = session(store, g, w).await;
    let loads: Vec<(Bucket, Load)> = loads.iter().map(|&(b, l)| (Bucket(b), load(l))).collect();
    store.publish_loads(g, w, s, &loads).await
}

/// C12, C13: a named claim takes every named bucket that is claimable and nothing else,
/// under the rules of a claim.
pub async fn named_claims_take_only_the_named_claimable_buckets<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 2).await), vec![0, 1]);
    let before = tokens(&store, &g).await;
    // A's live bucket 1 is skipped (C2), a repeated name counts once, the result is sorted.
    let won = claim_named(&store, &g, b, &[5, 1, 3, 5])
        .await
        .expect("claim");
    assert_eq!(won, vec![3, 5]);
    let after = tokens(&store, &g).await;
    assert_eq!((after[3], after[5]), (before[3] + 1, before[5] + 1), "C4");
    // None named takes none; a quarantined bucket is skipped (C10).
    assert_eq!(
        claim_named(&store, &g, b, &[]).await.expect("claim"),
        Vec::<u32>::new()
    );
    store
        .quarantine(&g, Bucket(6), QuarantineFor::new(secs(60)).ok())
        .await
        .expect("quarantine");
    assert_eq!(
        claim_named(&store, &g, b, &[6, 7]).await.expect("claim"),
        vec![7]
    );
    // C13: a bucket out of range fails the call and nothing is written.
    let snap = tokens(&store, &g).await;
    assert_kind(
        claim_named(&store, &g, b, &[2, 8]).await,
        ErrorKind::BucketOutOfRange,
        "bucket 8 of 8",
    );
    assert_eq!(tokens(&store, &g).await, snap, "nothing written");
    // C1: only under the node's live session.
    assert_kind(
        store
            .claim_buckets(&g, b, SessionId::new(), &bs(&[2]), Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "another session",
    );
    assert_eq!(live_owners(&store, &g).await.get(&2), None);
    // C11: a cordoned member claims nothing.
    store
        .control(&g, b, MemberControl::Mode(lease_core::MemberMode::Cordoned))
        .await
        .expect("cordon");
    assert_eq!(
        claim_named(&store, &g, b, &[2]).await.expect("claim"),
        Vec::<u32>::new()
    );
}

/// P1-P3, P5: loads are recorded on the buckets the session owns, the member's work is
/// computed from them, views and snapshots show both, and a change gives views again.
pub async fn published_loads_are_recorded_on_owned_buckets_and_shown<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 3).await;
    claim(&store, &g, b, 1).await;
    let b_stamp = node_beat(&store, b, &[]).await;
    let seen: Vec<GroupStamp> = b_stamp
        .groups
        .iter()
        .map(|gb| GroupStamp {
            group: gb.group.clone(),
            stamp: gb.stamp,
        })
        .collect();
    // Bucket 3 is b's and 4 nobody's: left alone. Bucket 1 twice: the last counts.
    let recorded = publish(&store, &g, a, &[(0, 5), (1, 2), (3, 9), (4, 1), (1, 3)])
        .await
        .expect("publish");
    assert_eq!(recorded, 2, "0, and 1 (listed twice) once");
    let snap = store.snapshot(&g).await.expect("snapshot");
    let loads: Vec<Load> = snap.buckets.iter().map(|x| x.load).collect();
    assert_eq!(
        loads,
        vec![
            load(5),
            load(3),
            Load::ZERO,
            Load::ZERO,
            Load::ZERO,
            Load::ZERO
        ]
    );
    let member = |snap: &lease_core::GroupSnapshot, w: NodeId| {
        let m = snap
            .members
            .iter()
            .find(|m| m.worker == w)
            .expect("a member");
        (m.load, m.hottest)
    };
    assert_eq!(member(&snap, a), (8_000_000, load(5)));
    assert_eq!(member(&snap, b), (0, Load::ZERO), "b never published");
    // P5: b's next heartbeat gives the view again, with a's work in it.
    let hb = node_beat(&store, b, &seen).await;
    let view = &hb.group(&g).expect("the view, given again").view;
    let of_a = view.members.iter().find(|m| m.worker == a).expect("a");
    assert_eq!((of_a.load, of_a.hottest), (8_000_000, load(5)));
    // P2: a bucket out of range fails the call; nothing is written.
    assert_kind(
        publish(&store, &g, a, &[(0, 1), (6, 1)]).await,
        ErrorKind::BucketOutOfRange,
        "bucket 6 of 6",
    );
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot").buckets[0].load,
        load(5)
    );
    // P1: only under the node's live session.
    assert_kind(
        store
            .publish_loads(&g, a, SessionId::new(), &[(Bucket(0), load(1))])
            .await,
        ErrorKind::SessionExpired,
        "another session",
    );
    // An empty publication computes the work again: the same here.
    assert_eq!(publish(&store, &g, a, &[]).await.expect("publish"), 0);
    assert_eq!(
        member(&store.snapshot(&g).await.expect("snapshot"), a),
        (8_000_000, load(5))
    );
}

/// P3, P4: a load stays on its bucket through a release, a claim and a dead session; views
/// list the claimable buckets that have one, hottest first; the member's work is its last
/// publication's until it publishes again.
pub async fn a_bucket_keeps_its_load_until_its_next_owner_records_one<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 4).await;
    publish(&store, &g, a, &[(0, 4), (1, 7), (2, 7), (3, 1)])
        .await
        .expect("publish");
    assert_eq!(release(&store, &g, a, &[1, 2, 3]).await, vec![1, 2, 3]);
    let view = beat(&store, &g, b).await.view;
    // Hottest first, by bucket between equals; 4 and 5 have no load and are not listed.
    assert_eq!(
        view.loaded,
        vec![
            (Bucket(1), load(7)),
            (Bucket(2), load(7)),
            (Bucket(3), load(1))
        ]
    );
    let of_a = view.members.iter().find(|m| m.worker == a).expect("a");
    assert_eq!(
        (of_a.load, of_a.hottest),
        (19_000_000, load(7)),
        "P3: as published, until a publishes again"
    );
    assert_eq!(publish(&store, &g, a, &[]).await.expect("publish"), 0);
    let of_a = beat(&store, &g, b)
        .await
        .view
        .members
        .into_iter()
        .find(|m| m.worker == a);
    assert_eq!(
        of_a.map(|m| (m.load, m.hottest)),
        Some((4_000_000, load(4)))
    );
    // B claims one by name: it keeps its load until b records another.
    assert_eq!(
        claim_named(&store, &g, b, &[2]).await.expect("claim"),
        vec![2]
    );
    let view = beat(&store, &g, b).await.view;
    assert_eq!(
        view.loaded,
        vec![(Bucket(1), load(7)), (Bucket(3), load(1))]
    );
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot").buckets[2].load,
        load(7)
    );
    publish(&store, &g, b, &[(2, 2)]).await.expect("publish");
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot").buckets[2].load,
        load(2)
    );
    // A quarantined bucket is not claimable, so not listed.
    store
        .quarantine(&g, Bucket(1), QuarantineFor::new(secs(600)).ok())
        .await
        .expect("quarantine");
    assert_eq!(
        beat(&store, &g, b).await.view.loaded,
        vec![(Bucket(3), load(1))]
    );
    // A's session dies (b's lives on): its bucket 0 is claimable, with its load.
    clock.advance(secs(TTL_SECS - 4));
    beat(&store, &g, b).await;
    clock.advance(secs(5));
    let view = beat(&store, &g, b).await.view;
    assert_eq!(
        view.loaded,
        vec![(Bucket(0), load(4)), (Bucket(3), load(1))]
    );
}
