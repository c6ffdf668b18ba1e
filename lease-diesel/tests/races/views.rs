//! The views a heartbeat gives and its "unchanged" answers: never unchanged after a commit, a
//! renewal or an end the view did not count.

use std::time::Duration;

use lease_core::{Bucket, NodeId, Takeover, Ttl};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, wait_server_past};
use crate::members::{SHARDS, long, member, renew, short, stamps, two_members};

/// A claim not committed yet while a node heartbeats is not in the view it is given (nor in
/// an "unchanged" answer); once the claim commits, the node's next heartbeat, handing in the
/// stamps it was given, gets the view with it: the claim moved the group's change counter, and
/// the heartbeat reads the counter with the same snapshot as whatever it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_between_two_heartbeats_is_never_answered_unchanged() {
    let (url, group, [(a, _), (c, c_beat)]) = two_members(8, long()).await;
    let mut hearts = connect(&url).await;
    let mut claimer = connect(&url).await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert_eq!(view.view.claimable, 8);
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        c,
        c_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("c claims");
    assert_eq!(won.len(), 2);
    let during = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a during the claim",
    )
    .await;
    assert!(
        during.groups.is_empty(),
        "nothing committed changed: {:?}",
        during.groups
    );
    exec(&mut claimer, "COMMIT").await;
    let after = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&during),
        "a after the claim",
    )
    .await;
    let view = after.group(&group).unwrap_or_else(|| {
        panic!(
            "a committed claim was answered unchanged: {:?}",
            after.unchanged
        )
    });
    assert_eq!(view.view.claimable, 6);
    assert_eq!(
        view.view
            .members
            .iter()
            .find(|m| m.worker == c)
            .map(|m| m.owned),
        Some(2)
    );
}

/// A heartbeat that removes a dead member (H3) moves the group's change counter; a claim that
/// commits after the view's snapshot and before that move (it holds the counter's lock: the
/// heartbeat's move waits for it) moved it too. The view given does not show the claim, so its
/// stamp must not be the counter the heartbeat moved it to (two above the view's): it is one
/// no counter matches, and the next heartbeat gives the view again, with the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_while_a_view_is_built_is_never_answered_unchanged() {
    let (url, group, [(a, _), (c, c_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    let mut claimer = connect(&url).await;
    // d: a member whose session ends, owning nothing (a claim of its buckets would lock its
    // node row and keep the heartbeat from removing it).
    let d = NodeId::new();
    let d_beat = member(&mut admin, &group, d, short(), "d joins").await;
    wait_server_past(&mut admin, d_beat.expires_at).await;
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        c,
        c_beat.session,
        2,
        Takeover::Deferred,
    )
    .await
    .expect("c claims");
    assert_eq!(won.len(), 2);
    let pid = backend_pid(&mut hearts).await;
    let first = blocked(&mut admin, pid, async move {
        let beat = renew(&mut hearts, a, long(), &[], "a's views").await;
        (beat, hearts)
    })
    .await;
    exec(&mut claimer, "COMMIT").await;
    let (first, mut hearts) = first.await.expect("the heartbeat task");
    let view = first.group(&group).expect("a's view");
    assert!(
        view.view.members.iter().all(|m| m.worker != d),
        "d is dead: {:?}",
        view.view.members
    );
    assert_eq!(
        view.view.claimable, 8,
        "the view's snapshot predates the claim"
    );
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a's next heartbeat",
    )
    .await;
    let view = next.group(&group).unwrap_or_else(|| {
        panic!(
            "a claim committed while the view was built was answered unchanged: {:?}",
            next.unchanged
        )
    });
    assert_eq!(view.view.claimable, 6);
}

/// A member whose renewal is in flight when another node's view is built looks dead to the
/// view's snapshot (its committed expiry has passed), so the view leaves it out; the heartbeat
/// cannot remove it (its node row is locked by the renewal), so the stamp it gives is one no
/// counter matches: once the renewal commits, the next heartbeat gives the view again, with the
/// member. A stamp at the counter would make every later answer "unchanged" while the member
/// lives, its load missing from every fair share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_renewing_while_a_view_is_built_is_not_left_out() {
    let (url, group, [(a, _), (b, b_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    let mut renewal = connect(&url).await;
    // b's session is short; it renews just in time, and the renewal stays uncommitted.
    ops::leave(&mut admin, None, &group, b, b_beat.session)
        .await
        .expect("b leaves its long session");
    let b_beat = member(
        &mut admin,
        &group,
        b,
        Ttl::from_secs(2).expect("ttl"),
        "b joins",
    )
    .await;
    exec(&mut renewal, "BEGIN").await;
    let renewed = renew(&mut renewal, b, long(), &[], "b renews").await;
    assert!(
        !renewed.new_session,
        "b renewed too late; the race was not set up"
    );
    wait_server_past(&mut admin, b_beat.expires_at).await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert!(
        view.view.members.iter().all(|m| m.worker != b),
        "the view's snapshot sees b's old expiry: {:?}",
        view.view.members
    );
    exec(&mut renewal, "COMMIT").await;
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a's next heartbeat",
    )
    .await;
    let view = next.group(&group).unwrap_or_else(|| {
        panic!(
            "a member the view left out while it renewed was answered unchanged: {:?}",
            next.unchanged
        )
    });
    assert!(
        view.view.members.iter().any(|m| m.worker == b),
        "{:?}",
        view.view.members
    );
}

/// A member whose session ends moves no counter by itself: the stamp carries the earliest
/// expiry among the other members, and past it the heartbeat looks again (without building the
/// view if no member died). Here b dies: a's stamp, past its `until`, gets the view without b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_session_ended_is_never_answered_unchanged() {
    let (url, group, [(a, _), (b, b_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    ops::leave(&mut admin, None, &group, b, b_beat.session)
        .await
        .expect("b leaves its long session");
    let b_beat = member(
        &mut admin,
        &group,
        b,
        Ttl::from_secs(2).expect("ttl"),
        "b joins",
    )
    .await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert!(view.view.members.iter().any(|m| m.worker == b));
    assert_eq!(view.stamp.until(), Some(b_beat.expires_at));
    // Before b's expiry the group is unchanged; after it, it is not.
    let steady = renew(&mut hearts, a, long(), &stamps(&first), "a renews").await;
    if steady.observed_at < b_beat.expires_at {
        assert!(steady.groups.is_empty(), "{:?}", steady.groups);
    }
    wait_server_past(&mut admin, b_beat.expires_at).await;
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&steady),
        "a after b's expiry",
    )
    .await;
    let view = next
        .group(&group)
        .unwrap_or_else(|| panic!("a dead member was answered unchanged: {:?}", next.unchanged));
    assert!(
        view.view.members.iter().all(|m| m.worker != b),
        "{:?}",
        view.view.members
    );
}

/// Q3 when a quarantine ends and is then lifted: a stamp whose view counted the quarantine is
/// never answered "unchanged" once it ended, even when a lift came in between. The look at a
/// group past a stamp's `until` (the counter unchanged) finds the quarantine rows that ended
/// since that `until`, and lifting a quarantine that has ended writes nothing and leaves its
/// row for that look. Measured with the lift deleting the ended row (without moving the
/// counter, since nothing visible changed): the heartbeat answered "unchanged" to the view
/// that still counted the quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_that_ended_and_was_lifted_is_never_answered_unchanged() {
    let (url, group, [(a, _), _]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut conn = connect(&url).await;
    let first = renew(&mut conn, a, long(), &[], "a's view").await;
    assert!(
        ops::quarantine(
            &mut admin,
            None,
            &group,
            Bucket(1),
            Some(lease_core::QuarantineFor::new(Duration::from_millis(500)).expect("duration")),
            None,
        )
        .await
        .expect("quarantine")
    );
    let counted = renew(&mut conn, a, long(), &stamps(&first), "a's view again").await;
    let view = &counted.group(&group).expect("the view is given").view;
    assert_eq!(view.quarantined, 1);
    let end = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot")
        .buckets[1]
        .quarantined_until
        .expect("bucket 1's quarantine");
    wait_server_past(&mut admin, end).await;
    assert!(
        !ops::quarantine(&mut admin, None, &group, Bucket(1), None, None)
            .await
            .expect("lift"),
        "lifting a quarantine that ended wrote"
    );
    let after = renew(&mut conn, a, long(), &stamps(&counted), "a's heartbeat").await;
    let given = after
        .group(&group)
        .unwrap_or_else(|| panic!("answered unchanged: {:?}", after.unchanged));
    assert_eq!(given.view.quarantined, 0);
}
