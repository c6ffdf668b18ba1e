//! Conformance cases that reach every way a claim finds its buckets, for workers whose claims
//! do not start at bucket 0.
//!
//! A claim takes, in the worker's claim order (C3: from `claim_start` up, then from 0), the
//! buckets it last held first (C9), then the others; of each kind the unowned ones and those
//! of dead sessions (C2, C7), the node's own earlier sessions' counting as last held. A store
//! may find them any way it likes: Postgres walks an index for each of the eight kinds (sticky
//! or not, unowned or a dead session's, from the start bucket up or below it), and each walk
//! repeats the rules a claim obeys: no bucket under quarantine (C10) and, while a resize
//! drains, no new bucket whose old buckets are not retired (C8). The other cases claim with
//! workers whose claims start at 0, so the walks below the start bucket barely run; these use
//! workers starting mid-group and put a bucket of every kind, above and below the start, under
//! each rule, so that a store that forgets a rule in one place takes a bucket it must not.

use lease_core::{Bucket, Clock, LeaseStore, ManualClock, NodeId, QuarantineFor, Takeover};

use super::{TTL_SECS, beat, claim, nums, release, resize, secs, session, setup, workers};

/// A fresh worker whose claims start at bucket `seed % N` (C3: its id's low 32 bits).
fn worker_starting_at(seed: u32) -> NodeId {
    let base = workers(1)[0].as_uuid().as_u128() & !0xFFFF_FFFF;
    NodeId::from_uuid(uuid::Uuid::from_u128(base | u128::from(seed)))
}

/// C3, C9, C10, C2: a claim of a worker starting at bucket 8 of 16, with a bucket of each kind
/// above and below the start under quarantine and another not: the unowned ones it last
/// held (12 and 13 above, 4 and 5 below), its own dead session's (14, 15; 6, 7), unowned ones
/// another node last held (8, 9; 0, 1) and a dead node's (10, 11; 2, 3). It takes every
/// bucket not under quarantine and none under one, a dead session's with its token raised.
pub async fn every_kind_of_claimable_bucket_under_quarantine_is_skipped<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 16).await;
    let w = worker_starting_at(8);
    let d = workers(1)[0];
    assert_eq!(super::shards(16).claim_start(w), Bucket(8));
    beat(&store, &g, d).await;
    assert_eq!(
        nums(&claim(&store, &g, d, 16).await),
        (0..16).collect::<Vec<_>>()
    );
    let mine = [4, 5, 6, 7, 12, 13, 14, 15];
    assert_eq!(release(&store, &g, d, &mine).await, mine);
    let first = beat(&store, &g, w).await;
    assert_eq!(nums(&claim(&store, &g, w, 16).await), mine, "what d let go");
    // w lets go of four (they stay its, C9) and keeps four; d lets go of four more.
    assert_eq!(
        release(&store, &g, w, &[4, 5, 12, 13]).await,
        [4, 5, 12, 13]
    );
    assert_eq!(release(&store, &g, d, &[0, 1, 8, 9]).await, [0, 1, 8, 9]);
    // Both sessions end, d's holding 2, 3, 10, 11 and w's 6, 7, 14, 15; w comes back.
    clock.advance(secs(TTL_SECS));
    let back = beat(&store, &g, w).await;
    assert!(back.new_session && back.session != first.session);
    let tokens_before = super::tokens(&store, &g).await;
    let hour = QuarantineFor::new(secs(3600)).ok();
    for b in [0, 2, 4, 6, 8, 10, 12, 14] {
        store
            .quarantine(&g, Bucket(b), hour)
            .await
            .expect("quarantine");
    }
    let won = claim(&store, &g, w, 16).await;
    assert_eq!(
        nums(&won),
        vec![1, 3, 5, 7, 9, 11, 13, 15],
        "one bucket of each kind, none under quarantine"
    );
    for lease in &won {
        assert_eq!(
            lease.token.0,
            tokens_before[lease.bucket.0 as usize] + 1,
            "{lease:?}"
        );
    }
    let snap = store.snapshot(&g).await.expect("snapshot");
    for b in [0, 2, 4, 6, 8, 10, 12, 14] {
        assert_eq!(
            snap.buckets[b].token.0, tokens_before[b],
            "bucket {b} under quarantine changed hands"
        );
    }
}

/// C8, C7, C9, Z3: while a split `4 -> 8` drains, the claims of a worker starting at bucket 4
/// of 8 wait for the old buckets a live owner holds, above the start and below it (new 4 and
/// 0, children of old 0), and take the children of an old bucket whose owner died (1 and 5)
/// and of old buckets never owned (2, 3, 6, 7). A deferred claim (C7: dead sessions' buckets
/// not taken) counts only released old buckets as retired while an old owner lives: once the
/// worker has let go of 1 and 5 (buckets it last held, so claimed first, C9), its deferred
/// claim takes neither. When the live owner releases old 0 the drain is over and 0, 1, 4, 5
/// are claimable.
pub async fn every_kind_of_new_bucket_waits_for_the_old_ones<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, d] = workers(2)[..] else {
        unreachable!()
    };
    let w = worker_starting_at(4);
    assert_eq!(super::shards(8).claim_start(w), Bucket(4));
    beat(&store, &g, a).await;
    beat(&store, &g, d).await;
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    assert_eq!(nums(&claim(&store, &g, d, 1).await), vec![1]);
    resize(&store, &g, 4, 8).await;
    // d's session ends; a's goes on.
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, a).await;
    clock.advance(secs(TTL_SECS / 2));
    let hb = beat(&store, &g, w).await;
    assert_eq!(hb.view.draining, 1, "only a's old 0 is not retired");
    let won = claim(&store, &g, w, 8).await;
    assert_eq!(
        nums(&won),
        vec![1, 2, 3, 5, 6, 7],
        "children of old 0, which a holds, wait: 4 above the start, 0 below"
    );
    assert_eq!(release(&store, &g, w, &[1, 5]).await, [1, 5]);
    let deferred = store
        .claim(&g, w, hb.session, 8, Takeover::Deferred)
        .await
        .expect("a deferred claim");
    assert!(
        nums(&deferred).is_empty(),
        "a deferred claim took {:?}: old 1 is not released and old 0's owner lives",
        nums(&deferred)
    );
    let a_session = session(&store, &g, a).await;
    assert_eq!(
        store
            .release(&g, a, a_session, &[Bucket(0)])
            .await
            .expect("release"),
        [Bucket(0)]
    );
    let rest = claim(&store, &g, w, 8).await;
    assert_eq!(nums(&rest), vec![0, 1, 4, 5], "the drain is over");
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.draining.is_empty(), "{:?}", snap.draining);
}

/// F1, Z3: `is_current` on an old bucket of a drain answers for its owner with its token (not
/// for another token, nor for another live member) while the owner's session lives, and no longer from the instant it ends, before any claim has retired the
/// bucket (a claim may drop the old generation once every old bucket is retired, after which
/// nothing answers for it anyway) and before any heartbeat removed the owner from the group:
/// the expiry alone decides.
pub async fn is_current_fails_on_an_old_bucket_once_its_owner_expired<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let hb = beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let old = claim(&store, &g, a, 2).await;
    assert_eq!(nums(&old), vec![0, 1]);
    resize(&store, &g, 4, 8).await;
    let expires = lease_core::store_precision(hb.expires_at);
    let before = expires - chrono::TimeDelta::microseconds(1);
    clock.set(before);
    for lease in &old {
        assert!(
            store
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current"),
            "old bucket {} is current for its owner 1 µs before its session ends",
            lease.bucket.0
        );
        // Its owner with another token, and another live member with its token, are not.
        let t = lease.token.0;
        for (who, token) in [(a, t + 1), (a, t - 1), (b, t)] {
            assert!(
                !store
                    .is_current(&g, lease.bucket, who, lease_core::FencingToken(token))
                    .await
                    .expect("is_current"),
                "old bucket {} is current for {who:?} with token {token} (its owner holds {t})",
                lease.bucket.0
            );
        }
    }
    clock.set(expires);
    assert_eq!(clock.now(), expires);
    for lease in &old {
        assert!(
            !store
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current"),
            "old bucket {} is current for an owner whose session ended",
            lease.bucket.0
        );
    }
}

/// C2, C4, C9: the walks over dead sessions' buckets take only those sessions' buckets, above
/// the start bucket and below it, never a live owner's that lies among them. A worker starting
/// at bucket 8 of 16 comes back after its session ended, holding 4, 5, 12 and 13 there (its own
/// dead session's, taken first), with a dead node holding 2, 3, 10 and 11, a live node 0, 1, 8
/// and 9, and 6, 7, 14 and 15 unowned: it takes all but the live node's, each with its token
/// raised by one, and the live node keeps its buckets and tokens.
pub async fn the_walks_over_dead_sessions_take_only_their_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 16).await;
    let [live, dead] = workers(2)[..] else {
        unreachable!()
    };
    let w = worker_starting_at(8);
    assert_eq!(super::shards(16).claim_start(w), Bucket(8));
    beat(&store, &g, dead).await;
    assert_eq!(claim(&store, &g, dead, 16).await.len(), 16);
    assert_eq!(release(&store, &g, dead, &[0, 1, 8, 9]).await, [0, 1, 8, 9]);
    beat(&store, &g, live).await;
    assert_eq!(nums(&claim(&store, &g, live, 16).await), [0, 1, 8, 9]);
    let freed = [4, 5, 6, 7, 12, 13, 14, 15];
    assert_eq!(release(&store, &g, dead, &freed).await, freed);
    let first = beat(&store, &g, w).await;
    assert_eq!(
        nums(&claim(&store, &g, w, 16).await),
        [4, 5, 6, 7, 12, 13, 14, 15]
    );
    assert_eq!(
        release(&store, &g, w, &[6, 7, 14, 15]).await,
        [6, 7, 14, 15]
    );
    // The live node renews a second before the others' sessions end.
    clock.advance(secs(TTL_SECS - 1));
    assert!(!beat(&store, &g, live).await.new_session);
    clock.advance(secs(1));
    let back = beat(&store, &g, w).await;
    assert!(back.new_session && back.session != first.session);
    let tokens_before = super::tokens(&store, &g).await;
    let won = claim(&store, &g, w, 16).await;
    assert_eq!(
        nums(&won),
        vec![2, 3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15],
        "every bucket but the live node's"
    );
    for lease in &won {
        assert_eq!(
            lease.token.0,
            tokens_before[lease.bucket.0 as usize] + 1,
            "{lease:?}"
        );
    }
    let snap = store.snapshot(&g).await.expect("snapshot");
    for b in [0, 1, 8, 9] {
        assert_eq!(snap.buckets[b].owner, Some(live), "bucket {b}");
        assert_eq!(snap.buckets[b].token.0, tokens_before[b], "bucket {b}");
    }
}
