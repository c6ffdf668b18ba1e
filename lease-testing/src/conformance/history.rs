//! Conformance cases of a bucket's history (T1-T5).

use lease_core::history::TENURES_KEPT;
use lease_core::{Bucket, Clock, EndReason, ErrorKind, FencingToken, LeaseStore, ManualClock};
use lease_core::{GroupName, MemberControl, MemberMode, QuarantineFor, Tenure, Timestamp};
use lease_core::{NodeId, store_precision};

use super::{
    TTL_SECS, assert_kind, beat, bs, claim, group, nums, release, resize, secs, session, setup,
    workers,
};

async fn history<S: LeaseStore>(store: &S, g: &GroupName, b: u32) -> Vec<Tenure> {
    store.history(g, Bucket(b)).await.expect("history")
}

/// Each tenure as (owner, token, began, (ended, reason)), to compare whole histories at once.
type Row = (NodeId, i64, Timestamp, Option<(Timestamp, EndReason)>);

fn rows(h: &[Tenure]) -> Vec<Row> {
    h.iter()
        .map(|t| {
            (
                t.owner,
                t.token.0,
                t.began_at,
                t.ended.map(|e| (e.at, e.reason)),
            )
        })
        .collect()
}

fn mode(m: MemberMode) -> MemberControl {
    MemberControl::Mode(m)
}

/// T1, T2: every claim that wins the bucket begins a tenure; a release ends it as released,
/// drained (the owner draining) or quarantined (the bucket under quarantine, even while
/// draining); a leave as left, or evicted when it names no session; a claim that takes it
/// from a dead session as expired, at the claim's time (a leave of a dead session ends
/// nothing).
pub async fn history_records_each_tenure_and_how_it_ended<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 1).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    let now = || store_precision(clock.now());
    assert!(history(&store, &g, 0).await.is_empty(), "a new bucket");

    beat(&store, &g, a).await;
    let t0 = now();
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    assert_eq!(rows(&history(&store, &g, 0).await), vec![(a, 1, t0, None)]);

    clock.advance(secs(1));
    let t1 = now();
    assert_eq!(release(&store, &g, a, &[0]).await, vec![0]);
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 1).await), vec![0]);

    // b dies; a, in a new session, takes the bucket from it.
    clock.advance(secs(TTL_SECS + 1));
    let t2 = now();
    beat(&store, &g, a).await;
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);

    clock.advance(secs(1));
    let t3 = now();
    store
        .control(&g, a, mode(MemberMode::Draining))
        .await
        .expect("drain");
    assert_eq!(release(&store, &g, a, &[0]).await, vec![0]);
    beat(&store, &g, c).await;
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![0]);

    // Under quarantine and draining: the quarantine is the reason.
    clock.advance(secs(1));
    let t4 = now();
    store
        .quarantine(
            &g,
            Bucket(0),
            Some(QuarantineFor::new(secs(60)).expect("a valid quarantine")),
        )
        .await
        .expect("quarantine");
    store
        .control(&g, c, mode(MemberMode::Draining))
        .await
        .expect("drain");
    assert_eq!(release(&store, &g, c, &[0]).await, vec![0]);
    store
        .quarantine(&g, Bucket(0), None)
        .await
        .expect("lift the quarantine");
    store
        .control(&g, c, mode(MemberMode::Active))
        .await
        .expect("uncordon");
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![0]);

    clock.advance(secs(1));
    let t5 = now();
    let s = session(&store, &g, c).await;
    assert_eq!(
        store.leave(&g, c, s).await.expect("leave"),
        bs(&[0]),
        "c leaves"
    );
    beat(&store, &g, c).await;
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![0]);

    clock.advance(secs(1));
    let t6 = now();
    assert_eq!(
        store.evict(&g, c).await.expect("evict"),
        bs(&[0]),
        "c is evicted"
    );

    // A dead session's tenure is not ended by a leave (it released nothing, L1): the claim
    // that takes the bucket ends it, as expired.
    beat(&store, &g, c).await;
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![0]);
    clock.advance(secs(TTL_SECS + 1));
    let t7 = now();
    assert!(
        store.evict(&g, c).await.expect("evict").is_empty(),
        "a dead session released a bucket"
    );
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 1).await), vec![0]);

    use EndReason::*;
    assert_eq!(
        rows(&history(&store, &g, 0).await),
        vec![
            (a, 1, t0, Some((t1, Released))),
            (b, 2, t1, Some((t2, Expired))),
            (a, 3, t2, Some((t3, Drained))),
            (c, 4, t3, Some((t4, Quarantined))),
            (c, 5, t4, Some((t5, Left))),
            (c, 6, t5, Some((t6, Evicted))),
            (c, 7, t6, Some((t7, Expired))),
            (b, 8, t7, None),
        ]
    );
}

/// T3: only the last [`TENURES_KEPT`] tenures are kept, oldest first; a release that releases
/// nothing (another's bucket, an unowned one) ends no tenure.
pub async fn history_keeps_the_last_tenures<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let rounds = TENURES_KEPT as i64 + 2;
    for _ in 0..rounds {
        assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
        assert_eq!(release(&store, &g, a, &[0]).await, vec![0]);
    }
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    assert!(release(&store, &g, b, &[0]).await.is_empty());
    let h = history(&store, &g, 0).await;
    assert_eq!(
        h.iter().map(|t| t.token).collect::<Vec<_>>(),
        ((rounds + 2 - TENURES_KEPT as i64)..=rounds + 1)
            .map(FencingToken)
            .collect::<Vec<_>>(),
        "{h:?}"
    );
    assert!(h[..TENURES_KEPT - 1].iter().all(|t| t.ended.is_some()));
    assert_eq!(
        h[TENURES_KEPT - 1].ended,
        None,
        "b's release ended a's tenure"
    );
    assert!(
        history(&store, &g, 1).await.is_empty(),
        "bucket 1 was never held"
    );
}

/// T4, T5: bad input fails with its error; a resize clears the history, and releasing an old
/// bucket records nothing in the new one of the same number.
pub async fn history_is_checked_and_cleared_by_resizes<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    assert_kind(
        store.history(&group("nowhere"), Bucket(0)).await,
        ErrorKind::GroupNotFound,
        "an unknown group",
    );
    assert_kind(
        store.history(&g, Bucket(2)).await,
        ErrorKind::BucketOutOfRange,
        "bucket 2 of 2",
    );
    beat(&store, &g, a).await;
    assert_eq!(nums(&claim(&store, &g, a, 2).await), vec![0, 1]);
    assert_eq!(history(&store, &g, 0).await.len(), 1);
    resize(&store, &g, 2, 4).await;
    for b in 0..4 {
        assert!(history(&store, &g, b).await.is_empty(), "new bucket {b}");
    }
    assert_eq!(release(&store, &g, a, &[0, 1]).await, vec![0, 1]);
    assert!(history(&store, &g, 0).await.is_empty(), "an old release");
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    let h = history(&store, &g, 0).await;
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!((h[0].owner, h[0].ended), (a, None));
    assert_kind(
        store.history(&g, Bucket(4)).await,
        ErrorKind::BucketOutOfRange,
        "bucket 4 of 4",
    );
}
