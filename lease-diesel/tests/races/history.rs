//! A bucket's history (T1-T5, migration 9): how tenures end and are numbered when claims,
//! releases, drains, quarantines and resizes race.

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use lease_core::{Bucket, GroupName, NodeId, Takeover};
use lease_diesel::ops;

use crate::duel::{
    backend_pid, blocked, blocked_by, blocked_by_or_done, connect, exec, hold_row, pids,
    wait_blocked_by,
};
use crate::members::{SHARDS, count, long, mode, quarantine_for, short, two_members};

/// Each tenure of `bucket` as (owner, token, how it ended).
async fn tenures(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    bucket: Bucket,
) -> Vec<(NodeId, i64, Option<lease_core::EndReason>)> {
    ops::history(conn, group, bucket)
        .await
        .expect("history")
        .iter()
        .map(|t| (t.owner, t.token.0, t.ended.map(|e| e.reason)))
        .collect()
}

/// T4 against a release in flight: a resize clears the tenure a release ended while the resize
/// waited for that release's bucket row. The resize deletes the group's tenures in a statement
/// after the one that moves the bucket rows (RESIZE_OPEN), whose snapshot is taken once the
/// move has waited for every transaction holding a bucket row, so it sees the ends they wrote.
/// With the delete before the move (in RESIZE_DROP_OLD, whose snapshot lacks the release's
/// uncommitted ring row) the new generation's bucket of that number would show a's released
/// tenure of the old one. (Before the open tenure moved to the bucket row, this test held a
/// claim in flight: a claim of a free bucket now writes no ring row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_clears_the_tenure_a_concurrent_release_ended() {
    let (url, group, [(a, a_beat), _]) = two_members(2, long()).await;
    let mut admin = connect(&url).await;
    let mut releaser = connect(&url).await;
    let mut resizer = connect(&url).await;
    let (releaser_pid, resizer_pid) = pids(&mut releaser, &mut resizer).await;

    let won = ops::claim(
        &mut releaser,
        None,
        &group,
        a,
        a_beat.session,
        1,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(won.len(), 1);
    exec(&mut releaser, "BEGIN").await;
    let released = ops::release(
        &mut releaser,
        None,
        &group,
        a,
        a_beat.session,
        &[won[0].bucket],
    )
    .await
    .expect("a releases");
    assert_eq!(released, [won[0].bucket]);
    let resize = {
        let group = group.clone();
        blocked_by(&mut admin, resizer_pid, releaser_pid, async move {
            ops::resize(&mut resizer, None, &group, count(2), count(4)).await
        })
        .await
    };
    exec(&mut releaser, "COMMIT").await;
    resize
        .await
        .expect("the resize task")
        .expect("the resize succeeds");
    for b in 0..4 {
        assert_eq!(
            tenures(&mut admin, &group, Bucket(b)).await,
            [],
            "bucket {b} of the new generation shows a tenure of the old one (a released old \
             bucket {})",
            won[0].bucket.0
        );
    }
}

/// T1, T3 against a claim's snapshot: a claim that takes a dead session's bucket numbers the
/// tenure it ends (expired) from the bucket row's count of ended tenures as its UPDATE leaves
/// it, the row's latest version, so a tenure ended after the claim's snapshot (here while the
/// claim waits for its own member row) keeps its ring slot. a holds every bucket when b's
/// claim takes its snapshot; meanwhile a releases them (ended tenure 1) and claims them again
/// with the same session (its open tenure, no ring row), then its session runs out; b's claim
/// then takes them from a's dead session and ends a's second tenure as expired, ended tenure 2.
/// With the number read in the claim's snapshot (the count 0, before a's release), a's expired
/// tenure would take the slot of its released one, and the history would lose that holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_numbers_the_tenure_it_ends_after_one_ended_since_its_snapshot() {
    use lease_core::EndReason::{Expired, Released};
    // a's session lasts 1 s, b's 60 s; every call runs at a client time, a's before its
    // session's end, b's claim after it.
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(SHARDS, short()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut claimer = connect(&url).await;
    let pid = backend_pid(&mut claimer).await;
    let base = a_beat.observed_at;
    let at = move |ms: i64| Some(base + chrono::Duration::milliseconds(ms));
    let every: Vec<Bucket> = (0..SHARDS).map(Bucket).collect();

    let first = ops::claim(
        &mut admin,
        at(100),
        &group,
        a,
        a_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(first.len(), SHARDS as usize);
    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    hold_row(&mut gate, "lease.members", "node_id", b, "FOR UPDATE").await;
    let b_at = at(2_000);
    let claim = {
        let group = group.clone();
        blocked(&mut admin, pid, async move {
            ops::claim(
                &mut claimer,
                b_at,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim")
        })
        .await
    };
    let released = ops::release(&mut admin, at(200), &group, a, a_beat.session, &every)
        .await
        .expect("a releases");
    assert_eq!(released, every);
    let again = ops::claim(
        &mut admin,
        at(300),
        &group,
        a,
        a_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("a claims again");
    assert_eq!(again.len(), SHARDS as usize);
    exec(&mut gate, "COMMIT").await;
    let taken = claim.await.expect("the claim task");
    assert_eq!(taken.len(), SHARDS as usize, "b takes every bucket");
    for bucket in every {
        let (t1, t2) = (
            first
                .iter()
                .find(|l| l.bucket == bucket)
                .expect("first")
                .token
                .0,
            again
                .iter()
                .find(|l| l.bucket == bucket)
                .expect("again")
                .token
                .0,
        );
        let t3 = taken
            .iter()
            .find(|l| l.bucket == bucket)
            .expect("taken")
            .token
            .0;
        assert_eq!(
            tenures(&mut admin, &group, bucket).await,
            [
                (a, t1, Some(Released)),
                (a, t2, Some(Expired)),
                (b, t3, None)
            ],
            "bucket {}",
            bucket.0
        );
    }
}

/// T2 and a drain of the releasing member: a release judges its owner's mode once it holds
/// its member row, on the latest committed state (`lease.mode_of`); `lease.control` share-locks
/// that row, so a release that waited for a drain's transaction ends its tenures as drained.
/// Measured with the mode read in the release's snapshot (the control row, inserted after it,
/// missing): the tenures ended as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_a_drain_ends_its_tenures_as_drained() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut releaser = connect(&url).await;
    let (operator_pid, releaser_pid) = pids(&mut operator, &mut releaser).await;
    let won = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    let held: Vec<Bucket> = won.iter().map(|l| l.bucket).collect();

    // A drain in flight; b's release waits for it.
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::control(
            &mut operator,
            &group,
            b,
            mode(lease_core::MemberMode::Draining)
        )
        .await
        .expect("drain")
    );
    let release = {
        let (group, held) = (group.clone(), held.clone());
        blocked_by(&mut admin, releaser_pid, operator_pid, async move {
            ops::release(&mut releaser, None, &group, b, b_beat.session, &held)
                .await
                .expect("b's release")
        })
        .await
    };
    exec(&mut operator, "COMMIT").await;
    assert_eq!(release.await.expect("the release task"), held);
    for l in &won {
        assert_eq!(
            tenures(&mut admin, &group, l.bucket).await,
            [(b, l.token.0, Some(lease_core::EndReason::Drained))],
            "bucket {}",
            l.bucket.0
        );
    }
}

/// T2 against a release's snapshot: a bucket quarantined after a release's statement took its
/// snapshot (here while the release waits for its member row) ends its tenure as
/// quarantined. The release judges the quarantine on the bucket row it updates, whose
/// `quarantined_until` `lease.quarantine` writes: Postgres updates the row's latest version.
/// Measured with the quarantine looked up in `lease.quarantines` (in the release's snapshot,
/// which lacks it): the quarantined bucket's tenure ended as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_ends_as_quarantined_a_bucket_quarantined_after_its_snapshot() {
    use lease_core::EndReason::{Quarantined, Released};
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut releaser = connect(&url).await;
    let pid = backend_pid(&mut releaser).await;
    let won = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    let held: Vec<Bucket> = won.iter().map(|l| l.bucket).collect();

    hold_row(&mut gate, "lease.members", "node_id", b, "FOR UPDATE").await;
    let release = {
        let (group, held) = (group.clone(), held.clone());
        blocked(&mut admin, pid, async move {
            ops::release(&mut releaser, None, &group, b, b_beat.session, &held)
                .await
                .expect("b's release")
        })
        .await
    };
    assert!(
        ops::quarantine(&mut admin, None, &group, held[1], quarantine_for(60), None)
            .await
            .expect("quarantine")
    );
    exec(&mut gate, "COMMIT").await;
    assert_eq!(release.await.expect("the release task"), held);
    assert_eq!(
        tenures(&mut admin, &group, held[0]).await,
        [(b, won[0].token.0, Some(Released))]
    );
    assert_eq!(
        tenures(&mut admin, &group, held[1]).await,
        [(b, won[1].token.0, Some(Quarantined))],
        "bucket {} was quarantined before the release updated its row",
        held[1].0
    );
}

/// A statement ending a tenure never waits for its group's row, which a resize locks first
/// (RESIZE_LOCK) and holds while it waits for bucket rows (RESIZE_MOVE): lease.tenures has no
/// foreign key to lease.groups, whose check would share-lock the group's row after the
/// statement has locked its bucket rows. So a release made while a resize holds the group's
/// row commits, and the resize waits for it and then clears the tenure it ended (T4). With
/// the foreign key (`ON DELETE CASCADE`) the release's ring insert would wait for the group's
/// row, the resize for the release's bucket row: a deadlock, which Postgres breaks by failing
/// one of them. (Before the open tenure moved to the bucket row, a claim's ring insert showed
/// it: measured then, "deadlock detected", the claim failed. A claim of a free bucket now
/// writes no ring row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_ending_a_tenure_never_waits_for_the_groups_row() {
    let (url, group, [(a, a_beat), _]) = two_members(2, long()).await;
    let mut admin = connect(&url).await;
    let mut claimer = connect(&url).await;
    let mut resizer = connect(&url).await;
    let (claimer_pid, resizer_pid) = pids(&mut claimer, &mut resizer).await;
    let held = ops::claim(
        &mut claimer,
        None,
        &group,
        a,
        a_beat.session,
        1,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(held.len(), 1);
    let bucket = held[0].bucket;
    // The resize's first lock, in a transaction the resize below continues.
    hold_row(&mut resizer, "lease.groups", "name", &group, "FOR UPDATE").await;
    exec(&mut claimer, "BEGIN").await;
    // The release returns, or waits for a lock: then the resize below would meet it.
    let claim = {
        let group = group.clone();
        blocked_by_or_done(&mut admin, claimer_pid, resizer_pid, async move {
            let released =
                ops::release(&mut claimer, None, &group, a, a_beat.session, &[bucket]).await;
            (released, claimer)
        })
        .await
    };
    let resize = {
        let group = group.clone();
        tokio::spawn(async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(2), count(4)).await;
            (outcome, resizer)
        })
    };
    let (released, mut claimer) = claim.await.expect("the release task");
    let released = released.expect("a's release while a resize holds the group's row");
    assert_eq!(released, [bucket]);
    wait_blocked_by(&mut admin, resizer_pid, claimer_pid).await;
    exec(&mut claimer, "COMMIT").await;
    let (outcome, mut resizer) = resize.await.expect("the resize task");
    outcome.expect("the resize after the claim");
    exec(&mut resizer, "COMMIT").await;
    for b in 0..4 {
        assert_eq!(
            tenures(&mut admin, &group, Bucket(b)).await,
            [],
            "bucket {b}"
        );
    }
}

/// Whether `group`'s change counter is free: locked `NOWAIT` in a transaction rolled back.
async fn counter_free(admin: &mut AsyncPgConnection, group: &GroupName) -> bool {
    exec(admin, "BEGIN").await;
    let free = admin
        .batch_execute(&format!(
            "SELECT 1 FROM lease.group_changes WHERE group_name = '{group}' FOR UPDATE NOWAIT"
        ))
        .await
        .is_ok();
    exec(admin, "ROLLBACK").await;
    free
}

/// The group's change counter is the last lock a claim or a release takes, after its tenure
/// writes: `bumped` counts the rows `expired` (`ended` in a release) return, which runs them to
/// completion first. Postgres runs the data-modifying CTEs the main query does not read in the
/// reverse of their order in the `WITH`, so without that `bumped` ran first and every claim,
/// release and join of the group waited for the counter while one statement wrote its
/// tenures. Here a tenure write is held up (the ring slot the end goes to, inserted by a
/// transaction left open), and the counter must be free meanwhile: first a claim taking a
/// dead session's bucket (the expired end), then a release. Measured without the counts
/// (before the open tenure moved to the bucket row, with a claim's begun tenure held up): the
/// counter was locked while the claim waited for the slot (the 50-worker cold start of
/// `pg_scale` went from 4-6 s to 20-52 s, its claims and heartbeats waiting for the counter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_a_release_take_the_counter_after_their_tenure_writes() {
    use lease_core::EndReason::{Expired, Released};
    // a's session lasts 1 s; calls at client times, b's after a's session ended.
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(1, short()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut worker = connect(&url).await;
    let (gate_pid, worker_pid) = pids(&mut gate, &mut worker).await;
    let base = a_beat.observed_at;
    let at = move |ms: i64| Some(base + chrono::Duration::milliseconds(ms));
    let held = ops::claim(
        &mut admin,
        at(100),
        &group,
        a,
        a_beat.session,
        1,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(held.len(), 1);

    // The slot a's tenure ends in (ended tenure 1), inserted by a transaction left open.
    let hold_slot = |slot: i32| {
        format!(
            "BEGIN; INSERT INTO lease.tenures (group_name, bucket, slot, seq, token, owner_node, \
             began_at, ended_at, reason) VALUES ('{group}', 0, {slot}, {slot}, 1, '{b}', \
             clock_timestamp(), clock_timestamp(), 'released')"
        )
    };
    exec(&mut gate, &hold_slot(1)).await;
    let claim = {
        let group = group.clone();
        let b_at = at(2_000);
        blocked_by(&mut admin, worker_pid, gate_pid, async move {
            let won = ops::claim(
                &mut worker,
                b_at,
                &group,
                b,
                b_beat.session,
                1,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, worker)
        })
        .await
    };
    let free_while_claiming = counter_free(&mut admin, &group).await;
    exec(&mut gate, "ROLLBACK").await;
    let (won, mut worker) = claim.await.expect("the claim task");
    assert!(
        free_while_claiming,
        "the claim held the group's counter while it wrote its tenures"
    );
    assert_eq!(won.len(), 1, "b takes a's bucket");

    // The slot b's tenure ends in (ended tenure 2), likewise.
    exec(&mut gate, &hold_slot(2)).await;
    let release = {
        let group = group.clone();
        blocked_by(&mut admin, worker_pid, gate_pid, async move {
            ops::release(
                &mut worker,
                at(2_100),
                &group,
                b,
                b_beat.session,
                &[Bucket(0)],
            )
            .await
            .expect("b's release")
        })
        .await
    };
    let free_while_releasing = counter_free(&mut admin, &group).await;
    exec(&mut gate, "ROLLBACK").await;
    assert_eq!(release.await.expect("the release task"), [Bucket(0)]);
    assert!(
        free_while_releasing,
        "the release held the group's counter while it ended its tenures"
    );
    assert_eq!(
        tenures(&mut admin, &group, Bucket(0)).await,
        [
            (a, held[0].token.0, Some(Expired)),
            (b, won[0].token.0, Some(Released))
        ]
    );
}
