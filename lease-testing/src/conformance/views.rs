//! Conformance cases of what the store shows and tells: snapshots (S1-S3), the change feed (W1), one heartbeat for every group, joins (J1-J3), "unchanged" answers (H8), the node list (N1, N2).

use super::*;

/// S1, S3: a snapshot shows live, expired and unowned buckets with their expiries, and
/// writes nothing.
pub async fn snapshot_reports_states_and_expiries<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let hba = beat(&store, &g, a).await;
    claim(&store, &g, a, 1).await; // 0: a, dies
    clock.advance(secs(1));
    let hbb = beat(&store, &g, b).await;
    claim(&store, &g, b, 2).await; // 1, 2: b, live
    clock.advance(secs(TTL_SECS - 1));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.observed_at, clock.now());
    let states: Vec<BucketState> = snap.buckets.iter().map(|x| x.state).collect();
    assert_eq!(
        states,
        vec![
            BucketState::Expired,
            BucketState::Live,
            BucketState::Live,
            BucketState::Unowned
        ]
    );
    assert_eq!(snap.buckets[0].owner, Some(a));
    assert_eq!(snap.buckets[0].session, Some(hba.session));
    assert_eq!(snap.buckets[0].expires_at, Some(hba.expires_at));
    assert_eq!(snap.buckets[1].owner, Some(b));
    assert_eq!(snap.buckets[1].session, Some(hbb.session));
    assert_eq!(snap.buckets[1].expires_at, Some(hbb.expires_at));
    assert_eq!(snap.buckets[3].owner, None);
    assert_eq!(snap.live_leases().len(), 2);
    assert_eq!(snap.view().claimable, 2);
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot"),
        snap,
        "a snapshot wrote"
    );
}

/// S2: a snapshot lists every member row, live or dead, with metadata and live load.
pub async fn snapshot_lists_every_member<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let meta_a = MemberMetadata::new("host=a pid=1").expect("valid");
    let meta_b = MemberMetadata::new("host=b pid=2").expect("valid");
    beat_as(&store, &g, a, inc(a), ttl(), &meta_a)
        .await
        .expect("heartbeat");
    claim(&store, &g, a, 3).await;
    clock.advance(secs(2));
    let t_b = clock.now();
    let hb = beat_as(&store, &g, b, inc(b), ttl(), &meta_b)
        .await
        .expect("heartbeat");
    claim(&store, &g, b, 1).await;
    clock.advance(secs(3));
    let renewed_at = clock.now();
    beat_as(&store, &g, b, inc(b), ttl(), &meta_a)
        .await
        .expect("heartbeat");
    clock.advance(secs(TTL_SECS - 2 - 3));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.members.len(), 2);
    let (ma, mb) = (&snap.members[0], &snap.members[1]);
    assert_eq!((ma.worker, ma.live, ma.owned), (a, false, 0));
    assert_eq!(ma.metadata, meta_a);
    assert_eq!((mb.worker, mb.live, mb.owned), (b, true, 1));
    assert_eq!(mb.session, hb.session);
    assert_eq!(mb.joined_at, t_b);
    assert_eq!(mb.heartbeat_at, renewed_at);
    assert_eq!(mb.expires_at, renewed_at + ttl().as_chrono());
    assert_eq!(mb.metadata, meta_a, "metadata is replaced on renewal");
    assert_eq!(snap.live_members().len(), 1);
}

// ---- changes -------------------------------------------------------------------------------

/// W1, H6, R4, L4: joins, releases and leaves reach a feed opened before them, in order; a
/// renewal and an empty release send nothing.
pub async fn changes_report_joins_releases_and_leaves<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let other = setup(&store, "other", 4).await;
    let mut feed = feed(&store, &g).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    assert_eq!(next_change(&mut feed, "join").await, Change::Joined(a));
    beat(&store, &g, a).await; // renewal: nothing
    claim(&store, &g, a, 2).await; // claim: nothing
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[3]))
        .await
        .expect("release"); // releases nothing: nothing
    beat(&store, &other, b).await; // another group: nothing here
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[1]))
        .await
        .expect("release");
    assert_eq!(next_change(&mut feed, "release").await, Change::Released(a));
    store.evict(&g, a).await.expect("leave");
    assert_eq!(next_change(&mut feed, "leave").await, Change::Left(a));
    beat(&store, &g, b).await;
    assert_eq!(
        next_change(&mut feed, "second join").await,
        Change::Joined(b)
    );
    let mut seen = BTreeSet::new();
    while let Some(extra) = feed.try_recv() {
        seen.insert(format!("{extra:?}"));
    }
    assert!(seen.is_empty(), "unexpected changes: {seen:?}");
}

// ---- nodes ---------------------------------------------------------------------------------

/// H1, H4, G7: a node in two groups renews one session with one heartbeat, which gives each
/// group's view and the node's leases in it, sorted by group name.
pub async fn a_node_renews_every_group_in_one_heartbeat<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let billing = setup(&store, "billing", 8).await;
    let orders = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let first = beat(&store, &orders, a).await;
    let second = beat(&store, &billing, a).await;
    assert_eq!(first.session, second.session, "one session for both groups");
    assert!(!second.new_session);
    beat(&store, &orders, b).await;
    claim(&store, &orders, a, 2).await;
    claim(&store, &billing, a, 5).await;
    clock.advance(secs(1));
    let hb = node_beat(&store, a, &[]).await;
    assert!(!hb.new_session);
    assert_eq!(hb.session, first.session);
    assert_eq!(hb.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(
        names(&hb),
        (vec!["billing".to_owned(), "orders".to_owned()], vec![])
    );
    let (gb, go) = (&hb.groups[0], &hb.groups[1]);
    assert_eq!(gb.view.shard_count, shards(8));
    assert_eq!(nums(&gb.owned), vec![0, 1, 2, 3, 4]);
    assert_eq!(gb.view.claimable, 3);
    assert_eq!(go.view.shard_count, shards(4));
    assert_eq!(nums(&go.owned), vec![0, 1]);
    assert_eq!(
        go.view
            .members
            .iter()
            .map(|m| (m.worker, m.owned))
            .collect::<Vec<_>>(),
        vec![(a, 2), (b, 0)]
    );
    assert!(
        hb.groups
            .iter()
            .flat_map(|g| &g.owned)
            .all(|l| l.expires_at == hb.expires_at),
        "every lease of the node expires with its session"
    );
    // Both groups see the one session, renewed.
    for g in [&billing, &orders] {
        let snap = store.snapshot(g).await.expect("snapshot");
        let me = snap.members.iter().find(|m| m.worker == a).expect("a");
        assert_eq!((me.session, me.expires_at), (hb.session, hb.expires_at));
    }
}

/// H2: a node whose session expired starts a new one that is a member of no group: its old
/// memberships are gone (each group hears it left), its buckets are claimable, and it claims
/// again only after joining.
pub async fn a_new_session_is_a_member_of_no_group<S: LeaseStore>(store: S, clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &orders, a).await;
    beat(&store, &billing, a).await;
    claim(&store, &orders, a, 4).await;
    let mut feed = feed(&store, &orders).await;
    clock.advance(secs(TTL_SECS));
    let hb = node_beat(&store, a, &[]).await;
    assert!(hb.new_session);
    assert!(hb.groups.is_empty() && hb.unchanged.is_empty(), "{hb:?}");
    assert_eq!(
        next_change(&mut feed, "a new session").await,
        Change::Left(a)
    );
    for g in [&orders, &billing] {
        let snap = store.snapshot(g).await.expect("snapshot");
        assert!(snap.members.is_empty(), "{g:?}: {:?}", snap.members);
    }
    assert_kind(
        store
            .claim(&orders, a, hb.session, 4, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "a claim before joining",
    );
    store.join(&orders, a, hb.session).await.expect("join");
    let won = store
        .claim(&orders, a, hb.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 1, 2, 3]);
    assert!(won.iter().all(|l| l.token == FencingToken(2)));
}

/// J1: a join needs the node's live session; an unknown group fails; nothing is written.
pub async fn join_needs_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    assert_kind(
        store.join(&g, a, SessionId::new()).await,
        ErrorKind::SessionExpired,
        "a join of a node with no session",
    );
    let hb = node_beat(&store, a, &[]).await;
    assert_kind(
        store.join(&g, a, SessionId::new()).await,
        ErrorKind::SessionExpired,
        "a join under a session the node does not hold",
    );
    assert_kind(
        store.join(&group("unknown"), a, hb.session).await,
        ErrorKind::GroupNotFound,
        "a join of an unknown group",
    );
    clock.advance(secs(TTL_SECS));
    assert_kind(
        store.join(&g, a, hb.session).await,
        ErrorKind::SessionExpired,
        "a join under an expired session",
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.members.is_empty(), "a refused join wrote a member");
}

/// J2, J3: joining twice makes one member (joined at the first) and one wake-up; the node's
/// other groups do not change.
pub async fn join_is_idempotent_and_touches_no_other_group<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &billing, a).await;
    claim(&store, &billing, a, 2).await;
    let before = store.snapshot(&billing).await.expect("snapshot");
    let mut feed = feed(&store, &orders).await;
    let session = session(&store, &billing, a).await;
    let joined_at = clock.now();
    store.join(&orders, a, session).await.expect("join");
    clock.advance(secs(1));
    store.join(&orders, a, session).await.expect("join again");
    assert_eq!(next_change(&mut feed, "join").await, Change::Joined(a));
    assert!(feed.try_recv().is_none(), "a second join sent a change");
    let snap = store.snapshot(&orders).await.expect("snapshot");
    assert_eq!(snap.members.len(), 1);
    assert_eq!(snap.members[0].joined_at, joined_at);
    let mut after = store.snapshot(&billing).await.expect("snapshot");
    after.observed_at = before.observed_at;
    assert_eq!(after, before, "joining orders changed billing");
}

/// C1, R2: a node with a live session claims and releases only in groups it is a member of.
pub async fn claims_and_releases_need_membership<S: LeaseStore>(store: S, _clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let hb = beat(&store, &orders, a).await;
    claim(&store, &orders, a, 2).await;
    assert_kind(
        store
            .claim(&billing, a, hb.session, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "a claim in a group the node is not a member of",
    );
    // b, a member of billing only, names buckets of orders that a holds: nothing moves.
    let sb = beat(&store, &billing, b).await.session;
    assert!(
        store
            .release(&orders, b, sb, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert_eq!(live_owners(&store, &orders).await.len(), 2);
    assert!(
        store
            .snapshot(&billing)
            .await
            .expect("snapshot")
            .live_leases()
            .is_empty()
    );
}

/// L3: leaving one group releases its buckets only; the session lives on, renewed by the next
/// heartbeat, which no longer lists the group; the node's other group keeps its buckets.
pub async fn leaving_one_group_keeps_the_session_and_the_others<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &orders, a).await;
    beat(&store, &billing, a).await;
    claim(&store, &orders, a, 2).await;
    let kept = claim(&store, &billing, a, 3).await;
    let left = store.leave(&orders, a, hb.session).await.expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1]);
    let next = node_beat(&store, a, &[]).await;
    assert!(!next.new_session, "leaving one group ended the session");
    assert_eq!(next.session, hb.session);
    assert_eq!(names(&next), (vec!["billing".to_owned()], vec![]));
    assert_eq!(
        next.groups[0]
            .owned
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>(),
        kept.iter().map(|l| (l.bucket, l.token)).collect::<Vec<_>>()
    );
    assert!(
        store
            .is_current(&billing, kept[0].bucket, a, kept[0].token)
            .await
            .expect("is_current")
    );
}

/// H8: a group may be answered unchanged only while nothing a view shows changed since the
/// stamp handed in; after a claim, a release, a join, a leave, a resize or a member's session
/// ending, the view is given.
pub async fn unchanged_is_answered_only_when_nothing_changed<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 8).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await;
    // a's last view, and the stamp to hand in.
    let mut last = node_beat(&store, a, &[]).await.groups.remove(0);
    // Judge one heartbeat of a's: unchanged only if the view would be the same.
    async fn judge<S: LeaseStore>(
        store: &S,
        a: NodeId,
        last: &mut lease_core::GroupBeat,
        changed: bool,
        what: &str,
    ) {
        let seen = [GroupStamp {
            group: last.group.clone(),
            stamp: last.stamp,
        }];
        let hb = node_beat(store, a, &seen).await;
        match (hb.groups.first(), hb.unchanged.first()) {
            (Some(given), None) => {
                if !changed {
                    let mut expected = last.clone();
                    expected.stamp = given.stamp;
                    for l in &mut expected.owned {
                        l.expires_at = hb.expires_at;
                    }
                    assert_eq!(given, &expected, "{what}: the view given differs");
                }
                *last = given.clone();
            }
            (None, Some(u)) => {
                assert!(!changed, "{what}: answered unchanged after a change");
                last.stamp = u.stamp;
            }
            other => panic!("{what}: not one answer for the group: {other:?}"),
        }
    }
    judge(&store, a, &mut last, false, "a renewal").await;
    clock.advance(secs(1));
    judge(&store, a, &mut last, false, "a renewal a second later").await;
    claim(&store, &g, b, 1).await;
    judge(&store, a, &mut last, true, "b claimed").await;
    release(&store, &g, b, &[2]).await;
    judge(&store, a, &mut last, true, "b released").await;
    beat(&store, &g, c).await;
    judge(&store, a, &mut last, true, "c joined").await;
    store.evict(&g, c).await.expect("leave");
    judge(&store, a, &mut last, true, "c left").await;
    resize(&store, &g, 8, 16).await;
    judge(&store, a, &mut last, true, "resized").await;
    release(&store, &g, a, &[0, 1]).await;
    judge(&store, a, &mut last, true, "a released (the drain ended)").await;
    judge(&store, a, &mut last, false, "a renewal after the drain").await;
    // b (last renewed a second after the start) stops renewing: once its session ends, a's
    // view changes.
    clock.advance(secs(TTL_SECS - 2));
    judge(&store, a, &mut last, false, "just before b's session ends").await;
    clock.advance(secs(1));
    judge(&store, a, &mut last, true, "b's session ended").await;
    assert_eq!(last.view.members.len(), 1, "{:?}", last.view.members);
    // K3: a control moves the counter, unless it sets the value stored.
    let two = MemberControl::Weight(Weight::new(2).expect("weight"));
    store.control(&g, a, two).await.expect("control");
    judge(&store, a, &mut last, true, "a's weight set").await;
    store.control(&g, a, two).await.expect("control");
    judge(&store, a, &mut last, false, "a's weight set to the same").await;
    // Q3: so do setting and lifting a quarantine, and its end.
    let five = QuarantineFor::new(secs(5)).ok();
    store
        .quarantine(&g, Bucket(9), five)
        .await
        .expect("quarantine");
    judge(&store, a, &mut last, true, "a quarantine set").await;
    judge(&store, a, &mut last, false, "a renewal under quarantine").await;
    clock.advance(secs(5));
    judge(&store, a, &mut last, true, "the quarantine ended").await;
    store.quarantine(&g, Bucket(9), None).await.expect("lift");
    judge(&store, a, &mut last, false, "no quarantine to lift").await;
    store
        .quarantine(&g, Bucket(9), five)
        .await
        .expect("quarantine");
    judge(&store, a, &mut last, true, "a quarantine set again").await;
    store.quarantine(&g, Bucket(9), None).await.expect("lift");
    judge(&store, a, &mut last, true, "the quarantine lifted").await;
}

/// N1, N2, H3: `nodes` lists every node row with its session, liveness, metadata and groups;
/// a dead node goes once a heartbeat removed its last membership.
pub async fn nodes_lists_every_node_with_its_groups<S: LeaseStore>(store: S, clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let meta = MemberMetadata::new("host=a").expect("metadata");
    let started = clock.now();
    beat_as(&store, &orders, a, inc(a), ttl(), &meta)
        .await
        .expect("heartbeat");
    beat_as(&store, &billing, a, inc(a), ttl(), &meta)
        .await
        .expect("heartbeat");
    clock.advance(secs(1));
    let hb_b = beat(&store, &orders, b).await;
    let listing = store.nodes().await.expect("nodes");
    assert_eq!(listing.observed_at, clock.now());
    assert_eq!(
        listing.nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
        vec![a, b]
    );
    let na = &listing.nodes[0];
    assert_eq!(na.started_at, started);
    assert_eq!(na.expires_at, started + ttl().as_chrono());
    assert!(na.live);
    assert_eq!(na.metadata, meta);
    assert_eq!(na.groups, vec![billing.clone(), orders.clone()]);
    assert_eq!(listing.nodes[1].session, hb_b.session);
    assert_eq!(listing.nodes[1].groups, vec![orders.clone()]);
    assert_eq!(
        store.nodes().await.expect("nodes").nodes,
        listing.nodes,
        "listing wrote something"
    );
    // a's session ends; b's heartbeat removes a from orders, which is not a's last group.
    clock.advance(secs(TTL_SECS - 1));
    beat(&store, &orders, b).await;
    let listing = store.nodes().await.expect("nodes");
    let na = listing
        .nodes
        .iter()
        .find(|n| n.node == a)
        .expect("a is still a member of billing");
    assert!(!na.live);
    assert_eq!(na.groups, vec![billing.clone()]);
    // b joins billing: its heartbeat removes a's last membership, and a's node row with it.
    beat(&store, &billing, b).await;
    let listing = store.nodes().await.expect("nodes");
    assert_eq!(
        listing.nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
        vec![b]
    );
}

// ---- resize (run by `resize_suite!`) -----------------------------------------------------
