//! Conformance cases of online resizes (Z1-Z5, C8), run by `resize_suite!`.

use super::*;

/// Every lease live now in either generation, as `(shard count, bucket, owner)`.
async fn live_in_both<S: LeaseStore>(store: &S, g: &GroupName) -> Vec<(u32, u32, NodeId)> {
    let snap = store.snapshot(g).await.expect("snapshot");
    snap.live_leases()
        .into_iter()
        .chain(snap.draining_leases())
        .map(|l| (l.shards.get(), l.bucket.0, l.owner))
        .collect()
}

/// G9: no key (hash `0..lcm`) lies in two buckets owned live, across generations.
async fn assert_keys_held_once<S: LeaseStore>(store: &S, g: &GroupName, what: &str) {
    let leases = live_in_both(store, g).await;
    for key in 0..720u64 {
        let holders: Vec<_> = leases
            .iter()
            .filter(|(n, b, _)| shards(*n).bucket_of(key) == Bucket(*b))
            .collect();
        assert!(holders.len() <= 1, "{what}: key {key} held by {holders:?}");
    }
}

/// Z1, Z2, Z3, Z4, C8, H4, F1, R2, L1: a split `4 -> 8`. Old buckets keep their owners and
/// tokens; each new bucket waits for its one parent (`b' mod 4`) only; its first token is above
/// the parent's; `is_current` answers for both generations; once every old bucket is released
/// the old generation is gone.
pub async fn resize_splits_with_one_parent_per_bucket<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 4).await;
    assert_eq!(
        resize(&store, &g, 4, 8).await,
        ResizeOutcome::Started {
            generation: Generation(1)
        }
    );
    let hb = beat(&store, &g, a).await;
    assert_eq!(hb.view.shard_count, shards(8));
    assert_eq!(hb.view.generation, Generation(1));
    assert_eq!(hb.view.previous, Some(shards(4)));
    assert_eq!(hb.view.draining, 4);
    assert_eq!(hb.view.claimable, 8);
    assert_eq!(
        hb.view.members[0].owned, 0,
        "loads count the new generation"
    );
    assert_eq!(nums(&hb.owned), vec![0, 1, 2, 3]);
    assert!(hb.owned.iter().all(|l| l.shards == shards(4)));
    assert_eq!(bucket_nums(&hb.draining_buckets()), vec![0, 1, 2, 3]);
    assert!(hb.owned_buckets().is_empty());
    assert!(
        store
            .is_current(&g, Bucket(2), a, old[2].token)
            .await
            .expect("is_current"),
        "an old bucket not retired is current for its owner"
    );

    beat(&store, &g, b).await;
    assert!(claim(&store, &g, b, 8).await.is_empty(), "all wait");
    assert_eq!(release(&store, &g, a, &[1]).await, vec![1]);
    let won = claim(&store, &g, b, 8).await;
    assert_eq!(
        nums(&won),
        vec![1, 5],
        "the children of old 1, nothing else"
    );
    assert!(won.iter().all(|l| l.shards == shards(8)));
    assert!(won.iter().all(|l| l.token > old[1].token), "Z4: {won:?}");
    assert!(
        store
            .is_current(&g, Bucket(1), b, won[0].token)
            .await
            .expect("is_current")
    );
    assert!(
        !store
            .is_current(&g, Bucket(1), a, old[1].token)
            .await
            .expect("is_current")
    );
    assert_keys_held_once(&store, &g, "after one release").await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.draining.len(), 4);
    assert_eq!(snap.view().draining, 3);
    assert_eq!(
        snap.waiting(),
        vec![
            (Bucket(0), bs(&[0])),
            (Bucket(2), bs(&[2])),
            (Bucket(3), bs(&[3])),
            (Bucket(4), bs(&[0])),
            (Bucket(6), bs(&[2])),
            (Bucket(7), bs(&[3])),
        ]
    );

    // a holds old 0, 2, 3; it takes new ones as they free up, then leaves with both kinds.
    assert_eq!(release(&store, &g, a, &[2]).await, vec![2]);
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![2]);
    let hb = beat(&store, &g, a).await;
    assert_eq!(
        hb.owned
            .iter()
            .map(|l| (l.bucket.0, l.shards.get()))
            .collect::<Vec<_>>(),
        vec![(0, 4), (2, 8), (3, 4)]
    );
    assert_eq!(
        bucket_nums(&store.evict(&g, a).await.expect("leave")),
        vec![0, 2, 3]
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.draining.is_empty(),
        "every old bucket retired: the generation is gone"
    );
    assert!(snap.waiting().is_empty());
    assert_eq!(
        (snap.shard_count, snap.generation),
        (shards(8), Generation(1))
    );
    assert_eq!(nums(&claim(&store, &g, b, 8).await), vec![0, 2, 3, 4, 6, 7]);
    assert_eq!(
        store
            .release(&g, b, session(&store, &g, b).await, &bs(&[8]))
            .await
            .map_err(|e| e.kind())
            .err(),
        Some(ErrorKind::BucketOutOfRange),
    );
}

/// C8, Z4: a merge `8 -> 4`: each new bucket waits for both its parents (`b'` and `b' + 4`),
/// and starts above the higher of their tokens.
pub async fn resize_merges_with_two_parents_per_bucket<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 8).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![0, 1, 2, 3]);
    assert_eq!(nums(&claim(&store, &g, b, 4).await), vec![4, 5, 6, 7]);
    // Old 5 changes hands twice more: token 3.
    release(&store, &g, b, &[5]).await;
    claim(&store, &g, b, 1).await;
    release(&store, &g, b, &[5]).await;
    claim(&store, &g, b, 1).await;
    resize(&store, &g, 8, 4).await;
    beat(&store, &g, c).await;
    release(&store, &g, a, &[1]).await;
    assert!(
        claim(&store, &g, c, 4).await.is_empty(),
        "new 1 still waits for old 5"
    );
    release(&store, &g, b, &[5]).await;
    let won = claim(&store, &g, c, 4).await;
    assert_eq!(nums(&won), vec![1]);
    assert_eq!(won[0].token, FencingToken(4), "above old 5's token 3");
    assert_keys_held_once(&store, &g, "merge").await;
}

/// C8: changes that are not splits or merges: `16 -> 24` (gcd 8: each new bucket waits for
/// two old ones) and `16 -> 17` (gcd 1: one old bucket holds back every new one).
pub async fn resize_to_a_non_divisor_count<S: LeaseStore>(store: S, _clock: ManualClock) {
    for (to, expect_free) in [(24u32, 21usize), (17, 0)] {
        let g = setup(&store, &format!("orders-{to}"), 16).await;
        let [a, c] = workers(2)[..] else {
            unreachable!()
        };
        beat(&store, &g, a).await;
        claim(&store, &g, a, 16).await;
        let all: Vec<u32> = (0..16).filter(|&b| b != 3).collect();
        release(&store, &g, a, &all).await;
        resize(&store, &g, 16, to).await;
        beat(&store, &g, c).await;
        let won = claim(&store, &g, c, 100).await;
        assert_eq!(won.len(), expect_free, "16 -> {to}: {:?}", nums(&won));
        assert!(
            won.iter().all(|l| l.bucket.0 % 8 != 3),
            "16 -> {to}: {won:?}"
        );
        assert_keys_held_once(&store, &g, "while old 3 is held").await;
        release(&store, &g, a, &[3]).await;
        let rest = claim(&store, &g, c, 100).await;
        assert_eq!(rest.len() + won.len(), to as usize, "16 -> {to}");
        assert!(
            store
                .snapshot(&g)
                .await
                .expect("snapshot")
                .draining
                .is_empty()
        );
    }
}

/// Z1: a resize while another drains is refused with `ResizeInProgress` (transient), one from
/// a count the group no longer has with `ResizeFromMismatch`; both write nothing. Once the
/// drain ends the next resize opens generation 2.
pub async fn resize_during_a_resize_is_refused<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 1).await;
    resize(&store, &g, 4, 8).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    let busy = store.resize(&g, shards(8), shards(16)).await;
    assert!(
        busy.as_ref().is_err_and(StoreError::is_transient),
        "{busy:?}"
    );
    assert_kind(busy, ErrorKind::ResizeInProgress, "resize while draining");
    let stale = store.resize(&g, shards(4), shards(8)).await;
    assert!(
        stale.as_ref().is_err_and(|e| !e.is_transient()),
        "{stale:?}"
    );
    assert_kind(
        stale,
        ErrorKind::ResizeFromMismatch,
        "resize from the old count",
    );
    assert_eq!(store.snapshot(&g).await.expect("snapshot"), before);
    release(&store, &g, a, &[0]).await;
    assert_eq!(
        resize(&store, &g, 8, 16).await,
        ResizeOutcome::Started {
            generation: Generation(2)
        }
    );
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot").previous,
        Some(shards(8))
    );
}

/// G5, Z1: resizing a group never created fails with `GroupNotFound` and creates nothing.
pub async fn resize_of_an_unknown_group_fails<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = group("unknown");
    assert_kind(
        store.resize(&g, shards(4), shards(8)).await,
        ErrorKind::GroupNotFound,
        "resize",
    );
    assert_kind(
        store.snapshot(&g).await,
        ErrorKind::GroupNotFound,
        "snapshot",
    );
}

/// Z1: `from == to` (the group's count) is a no-op answering `Unchanged`; `from` that is not
/// the group's count is a mismatch even when `from == to`.
pub async fn resize_to_the_same_count_changes_nothing<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        resize(&store, &g, 4, 4).await,
        ResizeOutcome::Unchanged {
            generation: Generation(0)
        }
    );
    assert_eq!(store.snapshot(&g).await.expect("snapshot"), before);
    assert_kind(
        store.resize(&g, shards(5), shards(5)).await,
        ErrorKind::ResizeFromMismatch,
        "same count, but not the group's",
    );
}

/// Z3, C7, C8: an owner whose session dies during the drain retires its old buckets: with
/// takeovers allowed their children are claimable (tokens still above), with takeovers
/// deferred they are not (for a deferred claim only a release retires a bucket). Never-owned
/// old buckets are retired from the start. The drain ends when the last live owner releases.
pub async fn owners_dead_during_the_drain_retire_their_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, c).await;
    let old = claim(&store, &g, a, 2).await;
    assert_eq!(nums(&old), vec![0, 1]);
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![2]);
    resize(&store, &g, 4, 8).await;
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, c).await;
    clock.advance(secs(TTL_SECS / 2));
    let hb = beat(&store, &g, b).await;
    assert_eq!(hb.view.draining, 1, "a is dead: only c's old 2 drains");
    let deferred = store
        .claim(&g, b, hb.session, 8, Takeover::Deferred)
        .await
        .expect("claim");
    assert_eq!(
        nums(&deferred),
        vec![3, 7],
        "children of the never-owned old 3 only"
    );
    let won = claim(&store, &g, b, 8).await;
    assert_eq!(nums(&won), vec![0, 1, 4, 5], "children of a's dead buckets");
    let old_max = old.iter().map(|l| l.token).max().expect("two leases");
    assert!(won.iter().all(|l| l.token > old_max), "{won:?}");
    assert_keys_held_once(&store, &g, "one owner dead").await;
    assert_kind(
        store.resize(&g, shards(8), shards(2)).await,
        ErrorKind::ResizeInProgress,
        "c still holds old 2",
    );
    release(&store, &g, c, &[2]).await;
    assert_eq!(nums(&claim(&store, &g, b, 8).await), vec![2, 6]);
    assert!(
        store
            .snapshot(&g)
            .await
            .expect("snapshot")
            .draining
            .is_empty()
    );
    resize(&store, &g, 8, 2).await;
}

/// E3, Z3: after a resize `4 -> 8`, `ensure_group` accepts 8 and the 4 it was resized from
/// (a worker configured before the resize adopts the stored count), and refuses any other.
pub async fn ensure_group_accepts_the_count_resized_from<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    resize(&store, &g, 4, 8).await;
    store
        .ensure_group(&g, shards(4))
        .await
        .expect("the old count");
    store
        .ensure_group(&g, shards(8))
        .await
        .expect("the new count");
    match store.ensure_group(&g, shards(16)).await {
        Err(StoreError::ShardCountMismatch {
            configured, found, ..
        }) => assert_eq!((configured, found), (shards(16), shards(8))),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// W1, Z2: a resize reaches a feed opened before it.
pub async fn resize_sends_a_change<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let mut feed = feed(&store, &g).await;
    resize(&store, &g, 4, 6).await;
    assert_eq!(next_change(&mut feed, "resize").await, Change::Resized);
}
