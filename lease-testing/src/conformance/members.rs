//! Conformance cases of what changes a membership from outside the node's own calls, and of
//! the one control a node writes itself: an operator's eviction (L5, L6) and a node's own
//! weight under its live session (K4).

use lease_core::{BucketState, EndReason, ErrorKind, LeaseStore, ManualClock, SessionId, Weight};

use super::{TTL_SECS, assert_kind, beat, bucket_nums, claim, group, nums, secs, setup, workers};

fn w(n: u32) -> Weight {
    Weight::new(n).expect("a valid weight")
}

/// The weight the store shows for `node` in the group's snapshot.
async fn weight_of<S: LeaseStore>(
    store: &S,
    g: &lease_core::GroupName,
    node: lease_core::NodeId,
) -> Option<u32> {
    let snap = store.snapshot(g).await.expect("snapshot");
    snap.members
        .iter()
        .find(|m| m.worker == node)
        .map(|m| m.weight)
}

/// K4: a node writes its own weight only under its live session and as a member: another
/// session id (a process refused by H7 holds none of the node's), a group it is no member of
/// and a session that ended are refused with nothing written; an unknown group is not found.
pub async fn a_node_sets_its_own_weight_only_under_its_live_session<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let other = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let mine = beat(&store, &g, a).await.session;
    let theirs = beat(&store, &g, b).await.session;
    store
        .set_weight(&g, a, mine, w(3))
        .await
        .expect("a node's own weight under its live session");
    assert_eq!(weight_of(&store, &g, a).await, Some(3));
    for (session, what) in [
        (SessionId::new(), "a session id the node does not hold"),
        (theirs, "another node's session"),
    ] {
        assert_kind(
            store.set_weight(&g, a, session, w(5)).await,
            ErrorKind::SessionExpired,
            what,
        );
    }
    assert_kind(
        store.set_weight(&other, a, mine, w(5)).await,
        ErrorKind::SessionExpired,
        "a group the node is no member of",
    );
    assert_kind(
        store.set_weight(&group("nowhere"), a, mine, w(5)).await,
        ErrorKind::GroupNotFound,
        "an unknown group",
    );
    assert_eq!(weight_of(&store, &g, a).await, Some(3), "nothing written");
    clock.advance(secs(TTL_SECS + 1));
    assert_kind(
        store.set_weight(&g, a, mine, w(7)).await,
        ErrorKind::SessionExpired,
        "a session that ended",
    );
    assert_eq!(weight_of(&store, &g, a).await, Some(3), "nothing written");
}

/// L5, L6: an eviction releases what the node's live session holds in the group, returns it
/// sorted, ends those tenures as evicted and removes the membership, whatever session the node
/// holds; evicting it again, or a node that is no member, changes nothing; an unknown group is
/// not found. The node's other groups keep it.
pub async fn an_eviction_releases_the_node_s_buckets_whatever_its_session<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let other = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &other, a).await;
    beat(&store, &g, b).await;
    let held = nums(&claim(&store, &g, a, 2).await);
    assert_eq!(held.len(), 2);
    let kept = nums(&claim(&store, &other, a, 1).await);
    let evicted = store.evict(&g, a).await.expect("evict");
    assert_eq!(bucket_nums(&evicted), held, "the node's buckets, sorted");
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.members.iter().all(|m| m.worker != a), "{snap:?}");
    for &n in &held {
        assert_eq!(snap.buckets[n as usize].state, BucketState::Unowned);
        let tenures = store
            .history(&g, lease_core::Bucket(n))
            .await
            .expect("history");
        let last = tenures.last().expect("a tenure");
        assert_eq!(
            last.ended.map(|e| e.reason),
            Some(EndReason::Evicted),
            "{tenures:?}"
        );
    }
    assert!(store.evict(&g, a).await.expect("again").is_empty());
    assert!(store.evict(&other, b).await.expect("no member").is_empty());
    assert_kind(
        store.evict(&group("nowhere"), a).await,
        ErrorKind::GroupNotFound,
        "an unknown group",
    );
    let snap = store.snapshot(&other).await.expect("snapshot");
    assert!(snap.members.iter().any(|m| m.worker == a), "{snap:?}");
    for n in kept {
        assert_eq!(snap.buckets[n as usize].owner, Some(a));
    }
}
