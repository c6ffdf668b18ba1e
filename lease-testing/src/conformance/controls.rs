//! Conformance cases of the operators' controls: weights and modes (K1-K3, C11), quarantine
//! (Q1-Q5, C10) and sticky claims (C9).

use lease_core::{Bucket, MemberControl, MemberMode, QuarantineFor, QuarantineReason, Weight};
use lease_core::{BucketState, Clock, ErrorKind, LeaseStore, ManualClock, NodeId};

use super::{
    TTL_SECS, assert_kind, beat, bs, claim, nums, release, resize, secs, session, setup, workers,
};

fn weight(w: u32) -> MemberControl {
    MemberControl::Weight(Weight::new(w).expect("a valid weight"))
}

fn mode(m: MemberMode) -> MemberControl {
    MemberControl::Mode(m)
}

fn quarantine_for(s: u64) -> Option<QuarantineFor> {
    Some(QuarantineFor::new(secs(s)).expect("a valid quarantine"))
}

/// K1: views and snapshots carry each member's weight and mode; a node never controlled has
/// weight 1 and is active; setting one leaves the other as it was.
pub async fn controls_show_in_views_and_snapshots<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let view = beat(&store, &g, b).await.view;
    assert!(
        view.members
            .iter()
            .all(|m| m.weight == 1 && m.mode == MemberMode::Active),
        "defaults: {:?}",
        view.members
    );
    store.control(&g, a, weight(3)).await.expect("weight");
    store
        .control(&g, a, mode(MemberMode::Cordoned))
        .await
        .expect("cordon");
    let view = beat(&store, &g, b).await.view;
    let of = |w: NodeId| {
        view.members
            .iter()
            .find(|m| m.worker == w)
            .map(|m| (m.weight, m.mode))
    };
    assert_eq!(of(a), Some((3, MemberMode::Cordoned)), "{view:?}");
    assert_eq!(of(b), Some((1, MemberMode::Active)), "{view:?}");
    let snap = store.snapshot(&g).await.expect("snapshot");
    let info = |w: NodeId| {
        snap.members
            .iter()
            .find(|m| m.worker == w)
            .map(|m| (m.weight, m.mode))
    };
    assert_eq!(info(a), Some((3, MemberMode::Cordoned)));
    assert_eq!(info(b), Some((1, MemberMode::Active)));
}

/// K1, K2: a control outlives the node's session and its leave, and applies again when it
/// joins; a node controlled before may be controlled while away; a stranger is refused.
pub async fn controls_outlive_sessions<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, stranger] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    store
        .control(&g, a, mode(MemberMode::Draining))
        .await
        .expect("drain");
    store.evict(&g, a).await.expect("leave");
    // Away, but controlled before: accepted.
    store.control(&g, a, weight(2)).await.expect("weight");
    // Its session ends too, then it comes back.
    clock.advance(secs(TTL_SECS + 1));
    let back = beat(&store, &g, a).await;
    assert!(back.new_session);
    let me = back
        .view
        .members
        .iter()
        .find(|m| m.worker == a)
        .copied()
        .expect("a is a member");
    assert_eq!((me.weight, me.mode), (2, MemberMode::Draining));
    assert_kind(
        store.control(&g, stranger, weight(2)).await,
        ErrorKind::NotAMember,
        "a node that was never a member",
    );
    // K2: set back to the defaults, a control stays stored.
    store
        .control(&g, a, mode(MemberMode::Active))
        .await
        .expect("uncordon");
    store.control(&g, a, weight(1)).await.expect("weight 1");
    store.evict(&g, a).await.expect("leave");
    store
        .control(&g, a, weight(2))
        .await
        .expect("a control at the defaults stays stored");
    assert_kind(
        store.control(&super::group("nowhere"), a, weight(2)).await,
        ErrorKind::GroupNotFound,
        "an unknown group",
    );
    assert!(
        store
            .snapshot(&g)
            .await
            .expect("snapshot")
            .members
            .iter()
            .all(|m| m.worker != stranger),
        "a refused control wrote a member"
    );
}

/// C11: a cordoned or draining member's claim takes nothing; an active one's takes again.
pub async fn cordoned_and_draining_members_claim_nothing<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    for m in [MemberMode::Cordoned, MemberMode::Draining] {
        store.control(&g, a, mode(m)).await.expect("control");
        assert!(
            claim(&store, &g, a, 4).await.is_empty(),
            "a {} member claimed",
            m.as_str()
        );
    }
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.live_leases().len(), 1, "a control moved a bucket");
    store
        .control(&g, a, mode(MemberMode::Active))
        .await
        .expect("uncordon");
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![1, 2, 3]);
}

/// Q1, C10: a bucket under quarantine is not claimable and views count it, until its end by
/// the store's clock or until lifted; snapshots show the end.
pub async fn quarantined_buckets_are_not_claimable<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    store
        .quarantine(&g, Bucket(0), quarantine_for(30))
        .await
        .expect("quarantine");
    store
        .quarantine(&g, Bucket(2), quarantine_for(5))
        .await
        .expect("quarantine");
    let view = beat(&store, &g, a).await.view;
    assert_eq!((view.quarantined, view.claimable), (2, 2), "{view:?}");
    let snap = store.snapshot(&g).await.expect("snapshot");
    let ends: Vec<Option<_>> = snap.buckets.iter().map(|b| b.quarantined_until).collect();
    assert!(ends[0].is_some() && ends[2].is_some(), "{ends:?}");
    assert!(ends[1].is_none() && ends[3].is_none(), "{ends:?}");
    assert!(
        ends[2] < ends[0],
        "the shorter quarantine ends first: {ends:?}"
    );
    assert_eq!(snap.view(), view);
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![1, 3]);
    // Bucket 2's quarantine ends; bucket 0's is lifted.
    clock.advance(secs(5));
    beat(&store, &g, a).await;
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![2]);
    store.quarantine(&g, Bucket(0), None).await.expect("lift");
    let view = beat(&store, &g, a).await.view;
    assert_eq!((view.quarantined, view.claimable), (0, 1), "{view:?}");
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![0]);
}

/// Q2: the owner of a quarantined bucket keeps it (fencing stays true) and its heartbeat
/// names it; once released nobody may claim it, the owner included.
pub async fn the_owner_keeps_a_quarantined_bucket_until_it_releases<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let won = claim(&store, &g, a, 2).await;
    store
        .quarantine(&g, Bucket(1), quarantine_for(60))
        .await
        .expect("quarantine");
    assert!(
        store
            .is_current(&g, Bucket(1), a, won[1].token)
            .await
            .expect("is_current"),
        "a quarantine fenced the owner out"
    );
    let hb = super::node_beat(&store, a, &[]).await;
    let mine = hb.group(&g).expect("a's view");
    assert_eq!(mine.quarantined, bs(&[1]));
    let others = super::node_beat(&store, b, &[]).await;
    assert!(others.group(&g).expect("b's view").quarantined.is_empty());
    assert_eq!(release(&store, &g, a, &[1]).await, vec![1]);
    assert!(
        claim(&store, &g, b, 4)
            .await
            .iter()
            .all(|l| l.bucket != Bucket(1))
    );
    assert!(claim(&store, &g, a, 4).await.is_empty());
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.buckets[1].state, BucketState::Unowned);
}

/// Q4: a bucket out of range or an unknown group is refused and writes nothing; a resize
/// lifts every quarantine.
pub async fn quarantine_is_checked_and_lifted_by_resizes<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    assert_kind(
        store.quarantine(&g, Bucket(4), quarantine_for(60)).await,
        ErrorKind::BucketOutOfRange,
        "bucket 4 of 4",
    );
    assert_kind(
        store
            .quarantine(&super::group("nowhere"), Bucket(0), quarantine_for(60))
            .await,
        ErrorKind::GroupNotFound,
        "an unknown group",
    );
    assert!(
        store
            .snapshot(&g)
            .await
            .expect("snapshot")
            .buckets
            .iter()
            .all(|b| b.quarantined_until.is_none()),
        "a refused quarantine wrote"
    );
    store
        .quarantine(&g, Bucket(3), quarantine_for(60))
        .await
        .expect("quarantine");
    resize(&store, &g, 4, 8).await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets.iter().all(|b| b.quarantined_until.is_none()),
        "a quarantine survived the resize: {:?}",
        snap.buckets
    );
    assert_eq!(beat(&store, &g, a).await.view.quarantined, 0);
}

/// Q5: a quarantine keeps its reason while it runs; a replacement replaces it (with none
/// when given none); a lift, its end and a resize take it away.
pub async fn a_quarantine_keeps_its_reason_while_it_runs<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let reason = |text: &str| Some(QuarantineReason::new(text).expect("a valid reason"));
    let shown = |snap: &lease_core::GroupSnapshot, b: usize| {
        snap.buckets[b]
            .quarantine_reason
            .as_ref()
            .map(|r| r.as_str().to_owned())
    };
    store
        .quarantine_with_reason(&g, Bucket(1), quarantine_for(60), reason("exit code 3"))
        .await
        .expect("quarantine");
    store
        .quarantine_with_reason(&g, Bucket(2), quarantine_for(5), reason("poison"))
        .await
        .expect("quarantine");
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(shown(&snap, 1).as_deref(), Some("exit code 3"));
    assert_eq!(shown(&snap, 2).as_deref(), Some("poison"));
    assert_eq!(shown(&snap, 0), None, "a bucket never quarantined");
    // A replacement with another reason, then with none.
    store
        .quarantine_with_reason(&g, Bucket(1), quarantine_for(60), reason("by hand"))
        .await
        .expect("quarantine");
    assert_eq!(
        shown(&store.snapshot(&g).await.expect("snapshot"), 1).as_deref(),
        Some("by hand")
    );
    store
        .quarantine(&g, Bucket(1), quarantine_for(60))
        .await
        .expect("quarantine");
    assert_eq!(shown(&store.snapshot(&g).await.expect("snapshot"), 1), None);
    // Its end takes it away; a new quarantine without a reason does not bring it back.
    clock.advance(secs(6));
    assert_eq!(shown(&store.snapshot(&g).await.expect("snapshot"), 2), None);
    store
        .quarantine(&g, Bucket(2), quarantine_for(60))
        .await
        .expect("quarantine");
    assert_eq!(shown(&store.snapshot(&g).await.expect("snapshot"), 2), None);
    // A lift, then a resize.
    store
        .quarantine_with_reason(&g, Bucket(3), quarantine_for(60), reason("lifted"))
        .await
        .expect("quarantine");
    store.quarantine(&g, Bucket(3), None).await.expect("lift");
    assert_eq!(shown(&store.snapshot(&g).await.expect("snapshot"), 3), None);
    store
        .quarantine_with_reason(&g, Bucket(0), quarantine_for(60), reason("resized"))
        .await
        .expect("quarantine");
    resize(&store, &g, 4, 8).await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets.iter().all(|b| b.quarantine_reason.is_none()),
        "a reason survived the resize: {:?}",
        snap.buckets
    );
}

/// C9: a claim takes the buckets its node last held first, ahead of lower ones in its claim
/// order, whether they were released or left behind by its dead session; then the others in
/// claim order.
pub async fn claims_take_the_buckets_last_held_first<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(
        nums(&claim(&store, &g, a, 8).await),
        (0..8).collect::<Vec<_>>()
    );
    // 1 and 6 were a's; b takes 1 (the lowest) and gives it back: 1 is b's now, 6 still a's.
    assert_eq!(release(&store, &g, a, &[1, 6]).await, vec![1, 6]);
    assert_eq!(nums(&claim(&store, &g, b, 1).await), vec![1]);
    assert_eq!(release(&store, &g, b, &[1]).await, vec![1]);
    // a asks for one: 6, its own, before the lower 1.
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![6]);
    // b asks for one: 1, its own. a releases 7; a's session dies with 0, 2-6.
    assert_eq!(release(&store, &g, a, &[7]).await, vec![7]);
    clock.advance(secs(TTL_SECS - 1));
    beat(&store, &g, b).await;
    clock.advance(secs(1));
    let b_session = session(&store, &g, b).await;
    let won = store
        .claim(&g, b, b_session, 1, lease_core::Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![1], "b's own 1 before a's dead 0");
    // a comes back with a new session: its dead session's buckets first, 7 (released by
    // it too) among them, before nothing else is left.
    let back = beat(&store, &g, a).await;
    assert!(back.new_session);
    assert_eq!(
        nums(&claim(&store, &g, a, 7).await),
        vec![0, 2, 3, 4, 5, 6, 7]
    );
}

/// HO1-HO3: a session handed over keeps its buckets live for its successor, who takes it
/// over (same session, same tokens) with its next start's first heartbeat; nobody else
/// claims them meanwhile.
pub async fn a_handed_over_session_is_taken_over_with_its_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let first = beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let won = claim(&store, &g, a, 2).await;
    let keep = lease_core::Ttl::from_secs(5).expect("ttl");
    let until = store
        .hand_over(a, super::inc(a), keep)
        .await
        .expect("hand over")
        .expect("a holds its live session");
    assert_eq!(
        until,
        lease_core::store_precision(clock.now()) + chrono::TimeDelta::seconds(5)
    );
    let listed = store.nodes().await.expect("nodes");
    let info = listed.nodes.iter().find(|n| n.node == a).expect("a listed");
    assert!(info.handed_over && info.live, "{info:?}");
    // Nobody else takes its buckets meanwhile.
    clock.advance(secs(4));
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 4).await), vec![2, 3]);
    // Its successor: another process (incarnation) of the same node id.
    let next = lease_core::Incarnation::new();
    let hb = store
        .heartbeat(
            a,
            next,
            super::ttl(),
            &lease_core::MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("the successor's heartbeat");
    assert!(!hb.new_session, "the successor started a new session");
    assert_eq!(hb.session, first.session);
    let mine = hb.group(&g).expect("still a member");
    assert_eq!(
        mine.owned
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>(),
        won.iter().map(|l| (l.bucket, l.token)).collect::<Vec<_>>()
    );
    for l in &won {
        assert!(
            store
                .is_current(&g, l.bucket, a, l.token)
                .await
                .expect("is_current")
        );
    }
    // T2: the tenure goes on (same node, same token).
    let h = store.history(&g, won[0].bucket).await.expect("history");
    assert_eq!(
        h.iter()
            .map(|t| (t.owner, t.token, t.ended))
            .collect::<Vec<_>>(),
        vec![(a, won[0].token, None)]
    );
    let listed = store.nodes().await.expect("nodes");
    assert!(!listed.nodes.iter().any(|n| n.node == a && n.handed_over));
    // From then on it is the successor's: the first process cannot renew it.
    assert_kind(
        store
            .heartbeat(
                a,
                super::inc(a),
                super::ttl(),
                &lease_core::MemberMetadata::empty(),
                &[],
            )
            .await,
        ErrorKind::NodeIdInUse,
        "the process that handed the session over",
    );
}

/// HO1, HO2: with no successor, a handed-over session dies at its new expiry and its buckets
/// are claimable; only the incarnation holding a live session can hand it over (not another
/// incarnation, not once it died, even before anyone removed its rows).
pub async fn a_handed_over_session_without_successor_expires<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await;
    let keep = lease_core::Ttl::from_secs(2).expect("ttl");
    let other = lease_core::Incarnation::new();
    assert_eq!(
        store.hand_over(a, other, keep).await.expect("hand over"),
        None,
        "another incarnation handed the session over"
    );
    assert!(
        !store
            .nodes()
            .await
            .expect("nodes")
            .nodes
            .iter()
            .any(|n| n.handed_over),
        "a refused hand-over wrote"
    );
    assert!(
        store
            .hand_over(a, super::inc(a), keep)
            .await
            .expect("hand over")
            .is_some()
    );
    clock.advance(secs(2));
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 4).await), vec![0, 1, 2, 3]);
    assert_eq!(
        store
            .hand_over(a, super::inc(a), keep)
            .await
            .expect("hand over"),
        None,
        "a dead session was handed over"
    );
    let hb = store
        .heartbeat(
            a,
            lease_core::Incarnation::new(),
            super::ttl(),
            &lease_core::MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("a late successor");
    assert!(hb.new_session && hb.groups.is_empty());
    // A session past its expiry whose rows nobody removed yet (no heartbeat since) is dead
    // too: handing it over would bring it back, with its memberships and its buckets.
    beat(&store, &g, c).await;
    clock.advance(secs(super::TTL_SECS));
    assert_eq!(
        store
            .hand_over(c, super::inc(c), keep)
            .await
            .expect("hand over"),
        None,
        "an expired session was handed over"
    );
    let listed = store.nodes().await.expect("nodes");
    assert!(
        listed
            .nodes
            .iter()
            .filter(|n| n.node == c)
            .all(|n| !n.live && !n.handed_over),
        "an expired session came back: {listed:?}"
    );
}

/// K3, Q3 (and W1): a control or a quarantine that changes something reaches a feed opened
/// before it as [`Change::Controlled`](lease_core::Change::Controlled), whoever sets it; one
/// that changes nothing (the stored value again, lifting a bucket not under quarantine) sends
/// nothing.
pub async fn controls_wake_the_group<S: LeaseStore>(store: S, _clock: ManualClock) {
    use lease_core::Change;
    let g = setup(&store, "orders", 4).await;
    let mut feed = super::feed(&store, &g).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    assert_eq!(
        super::next_change(&mut feed, "join").await,
        Change::Joined(a)
    );
    store.control(&g, a, weight(2)).await.expect("weight");
    assert_eq!(
        super::next_change(&mut feed, "weight").await,
        Change::Controlled
    );
    store.control(&g, a, weight(2)).await.expect("same weight");
    store
        .quarantine(&g, Bucket(1), None)
        .await
        .expect("lift nothing");
    // A change of another kind next: a change sent by either call above would come first.
    beat(&store, &g, b).await;
    assert_eq!(
        super::next_change(&mut feed, "b's join").await,
        Change::Joined(b),
        "the unchanged weight or the empty lift sent a change"
    );
    store
        .control(&g, a, mode(MemberMode::Cordoned))
        .await
        .expect("cordon");
    assert_eq!(
        super::next_change(&mut feed, "cordon").await,
        Change::Controlled
    );
    store
        .quarantine(&g, Bucket(1), quarantine_for(60))
        .await
        .expect("quarantine");
    assert_eq!(
        super::next_change(&mut feed, "quarantine").await,
        Change::Controlled
    );
    store.quarantine(&g, Bucket(1), None).await.expect("lift");
    assert_eq!(
        super::next_change(&mut feed, "lift").await,
        Change::Controlled
    );
    let mut extra = Vec::new();
    while let Some(c) = feed.try_recv() {
        extra.push(c);
    }
    assert!(extra.is_empty(), "unexpected changes: {extra:?}");
}

/// Q3, H8: a view that counted a quarantine is not answered "unchanged" once the quarantine
/// ends, though nothing was written since: the stamp it came with holds until that end. Before
/// the end, with nothing changed, it is.
pub async fn a_view_that_counted_a_quarantine_is_given_again_once_it_ends<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    store
        .quarantine(&g, Bucket(0), quarantine_for(2))
        .await
        .expect("quarantine");
    let given = super::node_beat(&store, a, &[]).await;
    let view = given.group(&g).expect("the group's view");
    assert_eq!(view.view.quarantined, 1, "{view:?}");
    let seen = [lease_core::GroupStamp {
        group: g.clone(),
        stamp: view.stamp,
    }];
    clock.advance(secs(1));
    let steady = super::node_beat(&store, a, &seen).await;
    assert!(
        steady.group(&g).is_none() && steady.unchanged.iter().any(|u| u.group == g),
        "nothing changed before the quarantine's end: {steady:?}"
    );
    let seen = [steady
        .unchanged
        .iter()
        .find(|u| u.group == g)
        .cloned()
        .expect("the group's stamp")];
    clock.advance(secs(1));
    let after = super::node_beat(&store, a, &seen).await;
    let view = after
        .group(&g)
        .unwrap_or_else(|| panic!("answered unchanged after the quarantine ended: {after:?}"));
    assert_eq!(view.view.quarantined, 0, "{view:?}");
}
