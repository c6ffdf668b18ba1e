//! Operators' controls (migration 8) against claims, each other and resizes: quarantines,
//! cordons, weights and modes.

use lease_core::{Bucket, StoreError, Takeover};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, flag, hold_row, wait_blocked_by};
use crate::members::{SHARDS, count, long, mode, quarantine_for, two_members};

fn weight(w: u32) -> lease_core::MemberControl {
    lease_core::MemberControl::Weight(lease_core::Weight::new(w).expect("a weight"))
}

/// C10 against a claim's snapshot: a bucket quarantined after a claim's statement took its
/// snapshot (here while the claim waits for its own member row) is never taken by it.
/// `lease.quarantine` writes the bucket row's `quarantined_until` and claims test that
/// column, so the claim's walk, finding the row changed since its snapshot, re-checks the new
/// version and skips it; a quarantine still in flight holds the row, and the walk skips it
/// without waiting (the claim then waits only for the change counter that quarantine moved).
/// Measured with the claims checking `lease.quarantines` instead (in the statement's
/// snapshot, which lacks the quarantine): b's claim took buckets 0, 1 and 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_takes_a_bucket_quarantined_after_its_snapshot() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut claimer = connect(&url).await;
    let operator_pid = backend_pid(&mut operator).await;

    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    hold_row(&mut gate, "lease.members", "node_id", b, "FOR UPDATE").await;
    let pid = backend_pid(&mut claimer).await;
    let claim = {
        let group = group.clone();
        blocked(&mut admin, pid, async move {
            let won = ops::claim(
                &mut claimer,
                None,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, claimer)
        })
        .await
    };
    // Meanwhile bucket 1 goes under quarantine (committed), and bucket 2's quarantine is in
    // flight when the claim walks.
    assert!(
        ops::quarantine(
            &mut operator,
            None,
            &group,
            Bucket(1),
            quarantine_for(60),
            None
        )
        .await
        .expect("quarantine bucket 1")
    );
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::quarantine(
            &mut operator,
            None,
            &group,
            Bucket(2),
            quarantine_for(60),
            None
        )
        .await
        .expect("quarantine bucket 2")
    );
    exec(&mut gate, "COMMIT").await;
    // The claim walks past bucket 2 and then waits for the group's change counter, which the
    // quarantine in flight moved: let it commit then.
    wait_blocked_by(&mut admin, pid, operator_pid).await;
    exec(&mut operator, "COMMIT").await;
    let (won, _claimer) = claim.await.expect("the claim task");
    let taken: Vec<u32> = won.iter().map(|l| l.bucket.0).collect();
    assert!(
        !taken.contains(&1),
        "b took bucket 1, quarantined after its claim's snapshot: {taken:?}"
    );
    assert!(
        !taken.contains(&2),
        "b took bucket 2 while its quarantine was in flight: {taken:?}"
    );
    assert_eq!(taken, [0, 3], "the other buckets are taken");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    for q in [1, 2] {
        let info = &snap.buckets[q];
        assert_eq!(
            (info.owner, info.quarantined_until.is_some()),
            (None, true),
            "bucket {q}: {info:?}"
        );
    }
}

/// C11 and a control of the claimer's member serialize on its member row: `lease.control`
/// share-locks it (`FOR KEY SHARE`) and a claim holds it (`FOR UPDATE`) to its commit, judging
/// its mode once it holds the row on the latest committed state (`lease.may_claim`). So a
/// claim waiting for a cordon's transaction takes nothing once the cordon commits, and a
/// cordon waiting for a claim's transaction lets it keep what it took, then stops the next
/// claim: once a cordon returns, no claim of that member commits having taken something.
/// Measured without each rule: with the mode read in the claim's snapshot (no
/// `lease.may_claim`), the waiting claim took all four buckets after the cordon committed;
/// without the control's lock on the member row, the claim judged its mode before the cordon
/// committed and waited only at the change counter the cordon had moved: it took all four
/// buckets too, committing after the cordon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_a_cordon_of_its_member_serialize() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut claimer = connect(&url).await;
    let claimer_pid = backend_pid(&mut claimer).await;
    let operator_pid = backend_pid(&mut operator).await;

    // A cordon in flight; b's claim waits for it, and once it commits takes nothing.
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::control(
            &mut operator,
            &group,
            b,
            mode(lease_core::MemberMode::Cordoned)
        )
        .await
        .expect("cordon")
    );
    let claim = {
        let group = group.clone();
        blocked(&mut admin, claimer_pid, async move {
            let won = ops::claim(
                &mut claimer,
                None,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, claimer)
        })
        .await
    };
    exec(&mut operator, "COMMIT").await;
    let (won, mut claimer) = claim.await.expect("the claim task");
    assert!(
        won.is_empty(),
        "a claim that waited for a cordon took {won:?} after it committed"
    );

    // Uncordoned. A claim in flight (it took two buckets); a cordon waits for it.
    ops::control(&mut admin, &group, b, mode(lease_core::MemberMode::Active))
        .await
        .expect("uncordon");
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b's claim");
    assert_eq!(won.len(), 2);
    let cordon = {
        let group = group.clone();
        blocked(&mut admin, operator_pid, async move {
            ops::control(
                &mut operator,
                &group,
                b,
                mode(lease_core::MemberMode::Cordoned),
            )
            .await
            .expect("cordon")
        })
        .await
    };
    exec(&mut claimer, "COMMIT").await;
    assert!(
        cordon.await.expect("the cordon task"),
        "the cordon changed nothing"
    );
    let again = ops::claim(
        &mut claimer,
        None,
        &group,
        b,
        b_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("b's next claim");
    assert!(again.is_empty(), "a cordoned member claimed {again:?}");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    let member = snap.members.iter().find(|m| m.worker == b).expect("b");
    assert_eq!(
        (member.owned, member.mode),
        (2, lease_core::MemberMode::Cordoned),
        "b keeps what it claimed before the cordon"
    );
}

/// K3 under concurrency: two controls of one member, one setting its weight and one its mode,
/// both take effect, whether the second finds no control row yet (it waits for the first's
/// insert, then changes the row the first inserted), or a row (it waits for the row's lock and
/// changes the latest committed value), in round 3 a row just set back to weight 1 (it stays,
/// K2). `lease.control` reads the stored value under the row's lock and
/// writes from it. Measured without the lock (the value read in the statement's snapshot): the
/// second round lost the first control's weight (5), leaving weight 3 and draining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_controls_of_one_member_both_take_effect() {
    let (url, group, [_, (b, _)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut first = connect(&url).await;
    let mut second = connect(&url).await;
    let second_pid = backend_pid(&mut second).await;
    use lease_core::MemberMode::{Active, Cordoned, Draining};
    // (the first control, the second one, what b ends with)
    let rounds = [
        (weight(3), mode(Cordoned), (3, Cordoned)),
        (weight(5), mode(Draining), (5, Draining)),
        (mode(Active), weight(4), (4, Active)),
    ];
    for ((one, two, expected), round) in rounds.into_iter().zip(1..) {
        if round == 3 {
            // Weight 1 before round 3 (the row stays, at weight 1 and draining).
            ops::control(&mut admin, &group, b, weight(1))
                .await
                .expect("weight 1");
        }
        exec(&mut first, "BEGIN").await;
        assert!(
            ops::control(&mut first, &group, b, one)
                .await
                .expect("the first control")
        );
        let concurrent = {
            let group = group.clone();
            blocked(&mut admin, second_pid, async move {
                let changed = ops::control(&mut second, &group, b, two)
                    .await
                    .expect("the second control");
                (changed, second)
            })
            .await
        };
        exec(&mut first, "COMMIT").await;
        let (changed, back) = concurrent.await.expect("the second control's task");
        second = back;
        assert!(changed, "round {round}: the second control changed nothing");
        let snap = ops::snapshot(&mut admin, None, &group)
            .await
            .expect("snapshot");
        let member = snap.members.iter().find(|m| m.worker == b).expect("b");
        assert_eq!(
            (member.weight, member.mode),
            expected,
            "round {round}: a control was lost"
        );
    }
}

/// A quarantine and a resize of its group: each lands in one generation. A quarantine in
/// flight holds its row, and the resize (which deletes the group's quarantines before it moves
/// the bucket rows, in the order a quarantine locks them) waits, then lifts it (Q4). A
/// quarantine made while a resize is in flight waits for it (its row's foreign-key check
/// share-locks the group's row, which the resize holds) and then writes the new generation's
/// bucket row, in a statement of its own: the quarantine and the bucket row agree. One whose
/// bucket is out of the new count finds no bucket row to write: it undoes its row and is out
/// of range, nothing written. Measured without the undo: the shrinking round's quarantine of
/// bucket 12 succeeded (`Ok(true)`) and left its row in a group of 4 buckets. (The order of
/// the locks, which keeps a quarantine and a resize out of a deadlock, is not tested here: it
/// would take each statement stopped between two of its row locks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_racing_a_resize_lands_in_one_generation() {
    let (url, group, _) = two_members(4, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut resizer = connect(&url).await;
    let mut gate = connect(&url).await;
    let operator_pid = backend_pid(&mut operator).await;
    let resizer_pid = backend_pid(&mut resizer).await;
    let rows = "SELECT (SELECT count(*) FROM lease.quarantines q WHERE q.group_name = g.name)
                     = (SELECT count(*) FROM lease.shards s
                         WHERE s.group_name = g.name AND s.quarantined_until IS NOT NULL)
                   AS yes
              FROM lease.groups g";

    // A quarantine in flight; the resize waits for it, then lifts it.
    exec(&mut operator, "BEGIN").await;
    ops::quarantine(
        &mut operator,
        None,
        &group,
        Bucket(1),
        quarantine_for(60),
        None,
    )
    .await
    .expect("quarantine");
    let resize = {
        let group = group.clone();
        blocked(&mut admin, resizer_pid, async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(4), count(8))
                .await
                .expect("resize 4 -> 8");
            (outcome, resizer)
        })
        .await
    };
    exec(&mut operator, "COMMIT").await;
    let (_, mut resizer) = resize.await.expect("the resize task");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets.iter().all(|b| b.quarantined_until.is_none()),
        "a quarantine outlived the resize"
    );
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );

    // A resize in flight (held at its last statement, which waits for the change counter); a
    // quarantine of bucket 2 waits for it, then quarantines the new generation's bucket 2.
    hold_row(
        &mut gate,
        "lease.group_changes",
        "group_name",
        group.as_str(),
        "FOR UPDATE",
    )
    .await;
    let resize = {
        let group = group.clone();
        blocked(&mut admin, resizer_pid, async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(8), count(16))
                .await
                .expect("resize 8 -> 16");
            (outcome, resizer)
        })
        .await
    };
    let quarantine = {
        let group = group.clone();
        blocked(&mut admin, operator_pid, async move {
            let result = ops::quarantine(
                &mut operator,
                None,
                &group,
                Bucket(2),
                quarantine_for(60),
                None,
            )
            .await;
            (result, operator)
        })
        .await
    };
    exec(&mut gate, "COMMIT").await;
    let (_, mut resizer) = resize.await.expect("the resize task");
    let (result, mut operator) = quarantine.await.expect("the quarantine task");
    assert!(result.expect("the quarantine"), "it changed nothing");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert_eq!(snap.shard_count, count(16));
    let quarantined: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.quarantined_until.is_some())
        .map(|b| b.bucket.0)
        .collect();
    assert_eq!(quarantined, [2], "the new generation's bucket 2");
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );

    // A shrinking resize in flight; a quarantine of bucket 12 (in range when it reads the
    // count) finds no bucket 12 once the resize commits.
    hold_row(
        &mut gate,
        "lease.group_changes",
        "group_name",
        group.as_str(),
        "FOR UPDATE",
    )
    .await;
    let resize = {
        let group = group.clone();
        blocked(&mut admin, resizer_pid, async move {
            ops::resize(&mut resizer, None, &group, count(16), count(4))
                .await
                .expect("resize 16 -> 4")
        })
        .await
    };
    let quarantine = {
        let group = group.clone();
        blocked(&mut admin, operator_pid, async move {
            ops::quarantine(
                &mut operator,
                None,
                &group,
                Bucket(12),
                quarantine_for(60),
                None,
            )
            .await
        })
        .await
    };
    exec(&mut gate, "COMMIT").await;
    resize.await.expect("the resize task");
    match quarantine.await.expect("the quarantine task") {
        Err(StoreError::BucketOutOfRange {
            bucket,
            shard_count,
            ..
        }) => assert_eq!((bucket, shard_count), (Bucket(12), count(4))),
        other => panic!("a quarantine of bucket 12 of 4: {other:?}"),
    }
    assert!(
        flag(
            &mut admin,
            "SELECT NOT EXISTS (SELECT 1 FROM lease.quarantines) AS yes",
            None
        )
        .await,
        "a quarantine of a bucket out of range was kept"
    );
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );
}
