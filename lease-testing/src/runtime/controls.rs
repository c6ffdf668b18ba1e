//! Runtime cases of the operators' controls: drain, cordon, weights and quarantine, set in
//! the store (as `leasectl` does, from anywhere) while workers run.

use std::collections::BTreeMap;
use std::time::Duration;

use lease_core::{Bucket, LeaseStore, MemberControl, MemberMode, QuarantineFor, RevokeReason};
use lease_core::{NodeId, Weight};

use super::{Env, Nodes, Pool, RENEW, until};

/// Wait until the workers' applications own exactly `want`; how long it took.
async fn until_loads<S: LeaseStore + Clone + 'static>(
    pool: &Pool<S>,
    want: &BTreeMap<NodeId, usize>,
    limit: Duration,
    what: &str,
) -> Duration {
    until(limit, what, || &pool.owned() == want, || pool.owned()).await
}

async fn control<S: LeaseStore + Clone + 'static>(pool: &Pool<S>, w: NodeId, c: MemberControl) {
    pool.store
        .control(&pool.group, w, c)
        .await
        .expect("the control is stored");
}

/// A drained worker revokes everything (reason `drained`, never `shed`) and the other takes
/// it all within two ticks; uncordoned, it gets its share back.
pub async fn a_drained_worker_hands_everything_over_and_returns_on_uncordon<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    // On real time one worker may start first and shed to the other: count from here.
    let shed_before = pool.revoked_at(a, RevokeReason::Shed).len();
    let handoffs_before = pool.check().handoffs;
    control(&pool, a, MemberControl::Mode(MemberMode::Draining)).await;
    let took = until_loads(
        &pool,
        &BTreeMap::from([(a, 0), (b, 8)]),
        2 * RENEW + env.slack(),
        "a drained",
    )
    .await;
    eprintln!("drain of 4 buckets: the worker was empty after {took:?}");
    assert_eq!(pool.revoked_at(a, RevokeReason::Drained).len(), 4);
    assert_eq!(pool.revoked_at(a, RevokeReason::Shed).len(), shed_before);
    assert_eq!(
        pool.check().handoffs - handoffs_before,
        4,
        "the drained buckets went to b"
    );
    control(&pool, a, MemberControl::Mode(MemberMode::Active)).await;
    pool.until_balanced(2 * RENEW + env.slack(), "a uncordoned")
        .await;
    pool.shutdown().await;
}

/// A cordoned worker keeps what it holds and takes nothing more: a joiner shares the rest
/// with the third worker, not with it.
pub async fn a_cordoned_worker_keeps_its_buckets_and_takes_no_more<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 12, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let given_up = |pool: &Pool<S>| {
        pool.revoked_at(a, RevokeReason::Shed).len()
            + pool.revoked_at(a, RevokeReason::Drained).len()
    };
    let before = given_up(&pool);
    control(&pool, a, MemberControl::Mode(MemberMode::Cordoned)).await;
    let c = pool.start().await;
    until_loads(
        &pool,
        &BTreeMap::from([(a, 6), (b, 3), (c, 3)]),
        3 * RENEW + env.slack(),
        "the joiner shares b's buckets only",
    )
    .await;
    assert_eq!(given_up(&pool), before, "a cordoned worker gave buckets up");
    pool.shutdown().await;
}

/// Weights 3 : 1 split eight buckets 6 : 2, from a balanced start, with the fewest moves.
pub async fn weights_split_a_group_in_proportion<S: LeaseStore + Clone + 'static>(env: Env<S>) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let handoffs = pool.check().handoffs;
    let three = Weight::new(3).expect("weight");
    control(&pool, a, MemberControl::Weight(three)).await;
    until_loads(
        &pool,
        &BTreeMap::from([(a, 6), (b, 2)]),
        2 * RENEW + env.slack(),
        "weights 3 : 1",
    )
    .await;
    assert_eq!(
        pool.check().handoffs - handoffs,
        2,
        "more moves than the two the weights call for"
    );
    pool.shutdown().await;
}

/// A quarantined bucket is revoked by its owner (reason `quarantined`) and nobody takes it,
/// a joiner included, until the quarantine is lifted.
pub async fn a_quarantined_bucket_is_revoked_and_stays_unowned_until_lifted<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, true);
    let a = pool.start().await;
    pool.until_owns(a, 4, 5 * RENEW).await;
    let hour = QuarantineFor::new(Duration::from_secs(3_600)).ok();
    pool.store
        .quarantine(&pool.group, Bucket(2), hour)
        .await
        .expect("quarantine");
    until(
        2 * RENEW + env.slack(),
        "bucket 2 revoked",
        || pool.revoked_at(a, RevokeReason::Quarantined).len() == 1,
        || pool.events_of(a),
    )
    .await;
    let b = pool.start().await;
    // Three buckets to share: 2 and 1 (which of them has two is the tie rule's).
    until(
        3 * RENEW + env.slack(),
        "three buckets shared",
        || {
            let owned = pool.owned();
            owned.values().sum::<usize>() == 3 && owned[&a].max(owned[&b]) == 2
        },
        || pool.owned(),
    )
    .await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    assert!(
        snap.buckets[2].owner.is_none() || snap.buckets[2].state != lease_core::BucketState::Live
    );
    pool.store
        .quarantine(&pool.group, Bucket(2), None)
        .await
        .expect("lift");
    pool.until_balanced(2 * RENEW + env.slack(), "bucket 2 back")
        .await;
    pool.shutdown().await;
}

/// A rolling restart of two nodes with stable ids that hand their sessions over on stop
/// (`keep_on_stop`): each successor takes over its predecessor's session with every bucket
/// under the same token, within a tick of starting; the other node is assigned nothing and
/// nothing is claimed anew (the store's tokens do not move).
pub async fn a_rolling_restart_with_hand_over_moves_nothing<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    const KEEP: Duration = Duration::from_secs(10);
    let mut nodes = Nodes::new(&env, &[("orders", 16)]);
    let ids = [NodeId::new(), NodeId::new()];
    for id in ids {
        nodes
            .start_with(&["orders"], |b| b.node_id(id).keep_on_stop(KEEP))
            .await;
    }
    nodes
        .until_balanced(&["orders"], 5 * RENEW, "cold start")
        .await;
    let group = lease_core::GroupName::new("orders").expect("a group name");
    let tokens = |snap: &lease_core::GroupSnapshot| -> Vec<(u32, i64, Option<NodeId>)> {
        snap.buckets
            .iter()
            .map(|b| (b.bucket.0, b.token.0, b.owner))
            .collect()
    };
    let before = tokens(&nodes.store.snapshot(&group).await.expect("snapshot"));
    for (k, id) in ids.into_iter().enumerate() {
        let other = ids[1 - k];
        let seen = nodes.events_of(other, "orders").len();
        let held = nodes.owned("orders")[&id];
        nodes.stop(id).await;
        let listed = nodes.store.nodes().await.expect("nodes");
        assert!(
            listed
                .nodes
                .iter()
                .any(|n| n.node == id && n.handed_over && n.live),
            "the stopped node did not hand its session over: {:?}",
            listed.nodes
        );
        nodes
            .start_with(&["orders"], |b| b.node_id(id).keep_on_stop(KEEP))
            .await;
        until(
            RENEW + env.slack(),
            "the successor takes the session over",
            || nodes.owned("orders").get(&id) == Some(&held),
            || nodes.owned("orders"),
        )
        .await;
        assert_eq!(
            nodes.events_of(other, "orders").len(),
            seen,
            "the other node heard of the restart"
        );
    }
    let after = tokens(&nodes.store.snapshot(&group).await.expect("snapshot"));
    assert_eq!(before, after, "a bucket moved or its token rose");
    nodes.shutdown().await;
}

/// A node with `keep_on_stop` (10 s) whose application of "orders" takes `revoke` to
/// acknowledge a revocation, given up on after `ack_limit`; returned once it owns the group.
async fn start_slow_keeper<S: LeaseStore + Clone + 'static>(
    nodes: &mut Nodes<S>,
    env: &Env<S>,
    ack_limit: Duration,
    revoke: Duration,
) -> NodeId {
    let id = NodeId::new();
    nodes
        .start_with(&[], |b| {
            b.node_id(id)
                .keep_on_stop(Duration::from_secs(10))
                .revoke_ack_limit(ack_limit)
        })
        .await;
    nodes
        .add_slow(
            id,
            "orders",
            super::Slow {
                revoke,
                ..super::Slow::default()
            },
        )
        .await;
    let shards = nodes.groups[&Nodes::<S>::group("orders")].0 as usize;
    until(
        3 * RENEW + env.slack(),
        "the node owns the group",
        || nodes.owned("orders").get(&id) == Some(&shards),
        || nodes.owned("orders"),
    )
    .await;
    id
}

/// A node whose application does not acknowledge its shutdown revocations within the limit
/// (a stuck bucket) does not hand its session over, though configured to: a successor would
/// hold the stuck bucket under the same token while the old application may still write. The
/// stop leaves instead; the session is not listed as handed over, and a successor with the
/// node id starts a session of its own.
pub async fn a_stop_with_a_stuck_bucket_does_not_hand_over<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut nodes = Nodes::new(&env, &[("orders", 4)]);
    let id = start_slow_keeper(
        &mut nodes,
        &env,
        Duration::from_millis(200),
        Duration::from_secs(1),
    )
    .await;
    nodes.stop(id).await;
    let listed = nodes.store.nodes().await.expect("nodes");
    assert!(
        !listed.nodes.iter().any(|n| n.node == id && n.handed_over),
        "a node with a stuck bucket handed its session over: {:?}",
        listed.nodes
    );
    let next = nodes
        .store
        .heartbeat(
            id,
            lease_core::Incarnation::new(),
            lease_core::Ttl::new(super::TTL).expect("ttl"),
            &lease_core::MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("the successor's heartbeat");
    assert!(next.new_session, "the successor took the session over");
    nodes.shutdown().await;
}

/// A hand-over the store refuses (it fails) ends the node with
/// [`WorkerFailed::HandOverFailed`](lease_worker::WorkerFailed::HandOverFailed), not with a
/// clean stop: the session was neither handed over nor left, so its buckets wait for its
/// expiry and a successor is refused until then.
pub async fn a_failed_hand_over_ends_the_node_with_its_error<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut nodes = Nodes::new(&env, &[("orders", 4)]);
    let id = NodeId::new();
    nodes
        .start_with(&["orders"], |b| {
            b.node_id(id).keep_on_stop(Duration::from_secs(10))
        })
        .await;
    until(
        3 * RENEW + env.slack(),
        "the node owns the group",
        || nodes.owned("orders").get(&id) == Some(&4),
        || nodes.owned("orders"),
    )
    .await;
    // A stop makes no store call but the hand-over: it fails.
    nodes
        .faults(id)
        .fail_permanently
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let node = nodes.nodes.remove(&id).expect("a running node");
    match node.handle.shutdown().await {
        Err(lease_worker::WorkerFailed::HandOverFailed { source: Some(_) }) => {}
        other => panic!("a failed hand-over ended the node with {other:?}"),
    }
    let listed = nodes.store.nodes().await.expect("nodes");
    assert!(
        listed
            .nodes
            .iter()
            .any(|n| n.node == id && n.live && !n.handed_over),
        "the session should be live, not handed over: {:?}",
        listed.nodes
    );
    nodes.shutdown().await;
}

/// A successor that runs fewer groups than the node it took over from leaves the others:
/// their buckets go to the nodes that run them, instead of staying with a live session that
/// nobody works for (a stall no gauge would show: the buckets look owned).
pub async fn a_successor_leaves_the_groups_it_does_not_run<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    const KEEP: Duration = Duration::from_secs(10);
    let mut nodes = Nodes::new(&env, &[("orders", 4), ("audit", 4)]);
    let id = NodeId::new();
    nodes
        .start_with(&["orders", "audit"], |b| b.node_id(id).keep_on_stop(KEEP))
        .await;
    let other = nodes.start(&["audit"]).await;
    nodes
        .until_balanced(&["orders", "audit"], 5 * RENEW, "cold start")
        .await;
    nodes.stop(id).await;
    nodes
        .start_with(&["orders"], |b| b.node_id(id).keep_on_stop(KEEP))
        .await;
    until(
        3 * RENEW + env.slack(),
        "the other node runs every audit bucket",
        || nodes.owned("audit").get(&other) == Some(&4),
        || (nodes.owned("orders"), nodes.owned("audit")),
    )
    .await;
    assert_eq!(nodes.owned("orders").get(&id), Some(&4));
    let audit = lease_core::GroupName::new("audit").expect("a group name");
    let snap = nodes.store.snapshot(&audit).await.expect("snapshot");
    assert!(
        snap.members.iter().all(|m| m.worker != id),
        "the successor is still a member of a group it does not run: {:?}",
        snap.members
    );
    nodes.shutdown().await;
}

/// A hand-over that finds the session ended (the application took longer than the session
/// had left to acknowledge its shutdown revocations, and the stop's renewals failed) ends the
/// node with [`WorkerFailed::HandOverFailed`](lease_worker::WorkerFailed::HandOverFailed) and
/// no source: nothing was handed over, and the store lists no handed-over session.
pub async fn a_hand_over_after_the_session_ended_fails<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut nodes = Nodes::new(&env, &[("orders", 1)]);
    let id = start_slow_keeper(
        &mut nodes,
        &env,
        Duration::from_secs(30),
        super::TTL + RENEW,
    )
    .await;
    // A stop renews the session while the application acknowledges: these renewals fail.
    nodes
        .faults(id)
        .fail_heartbeats
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let node = nodes.nodes.remove(&id).expect("a running node");
    match node.handle.shutdown().await {
        Err(lease_worker::WorkerFailed::HandOverFailed { source: None }) => {}
        other => panic!("a hand-over of an ended session ended the node with {other:?}"),
    }
    let listed = nodes.store.nodes().await.expect("nodes");
    assert!(
        !listed.nodes.iter().any(|n| n.node == id && n.handed_over),
        "an ended session was handed over: {:?}",
        listed.nodes
    );
    nodes.shutdown().await;
}
