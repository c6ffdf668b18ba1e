//! The node API on the in-memory store, on tokio's paused clock (the store's clock follows
//! it): groups added and removed on a running node, each with its own handler or leases, what
//! is refused and why, and how a node that cannot leave its groups says so.

mod support;
use support::until;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lease_core::{AdminStore, GroupName, LeaseStore, RevokeReason, ShardCount};
use lease_memory::MemoryLeaseStore;
use lease_testing::{FaultyStore, TokioClock};
use lease_worker::{GroupError, LeaseNode, NodeHandle, WorkerFailed, event_channel};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

fn name(g: &str) -> GroupName {
    GroupName::new(g).expect("name")
}

fn n(x: u32) -> ShardCount {
    ShardCount::new(x).expect("n")
}

fn node<S: LeaseStore + 'static>(store: S) -> NodeHandle {
    LeaseNode::builder()
        .ttl(TTL)
        .renew_interval(RENEW)
        .build()
        .expect("config")
        .start(store)
        .expect("start")
}

/// A group is added once; a group the node does not have cannot be removed; a stopped node
/// takes no group; a configuration runs once at a time.
#[tokio::test(start_paused = true)]
async fn what_a_node_refuses() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let config = LeaseNode::builder()
        .ttl(TTL)
        .renew_interval(RENEW)
        .build()
        .expect("config");
    let node = config.start(store.clone()).expect("start");
    assert!(matches!(
        config.start(store.clone()),
        Err(lease_worker::StartError::NodeAlreadyRunning { node: id }) if id == node.node_id()
    ));
    let (h, _events) = event_channel(16);
    let orders = node
        .add_group(name("orders"), n(4), h.clone())
        .await
        .expect("added");
    assert!(matches!(
        node.add_group(name("orders"), n(4), h.clone()).await,
        Err(GroupError::AlreadyAdded { .. })
    ));
    // Another count than the store's is the store's refusal, typed (the group exists with 4).
    lease_core::WorkerStore::ensure_group(&store, &name("orders-too"), n(4))
        .await
        .expect("ensured");
    let refused = node.add_group(name("orders-too"), n(5), h.clone()).await;
    assert_eq!(
        refused
            .err()
            .and_then(|e| e.store_error().map(|e| e.kind())),
        Some(lease_core::ErrorKind::ShardCountMismatch)
    );
    // Refused, the group is not the node's: added with the store's count, it runs.
    node.add_group(name("orders-too"), n(4), h.clone())
        .await
        .expect("added with the store's count");
    assert!(matches!(
        node.remove_group(&name("billing")).await,
        Err(GroupError::NotAdded { .. })
    ));
    until("orders owned", RENEW * 3, || {
        orders.owned().borrow().len() == 4
    })
    .await;
    let cancel = node.cancellation_token();
    let mut waiting = orders;
    cancel.cancel();
    waiting.wait().await.expect("removed with the node's stop");
    // The node's task ended: no group is added any more.
    let mut node = node;
    node.wait().await.expect("a clean stop");
    assert!(matches!(
        node.add_group(name("late"), n(2), h).await,
        Err(GroupError::NodeEnded)
    ));
    drop(node);
    // Stopped, the configuration starts again.
    config
        .start(store)
        .expect("a second run")
        .shutdown()
        .await
        .expect("stop");
}

/// Two groups, one with a handler and one with leases, on one node: removing the leases' group
/// revokes its leases (shutdown) and leaves it, the other group untouched and the session
/// kept; the node's store calls are one heartbeat per tick throughout.
#[tokio::test(start_paused = true)]
async fn a_group_of_leases_removed_beside_a_group_of_events() {
    let store = FaultyStore::new(MemoryLeaseStore::with_clock(TokioClock::new()));
    let faults = store.faults();
    let node = node(store.clone());
    let (h, mut events) = event_channel(16);
    let orders = node
        .add_group(name("orders"), n(3), h)
        .await
        .expect("orders");
    let (billing, mut leases) = node
        .add_group_leases(name("billing"), n(2))
        .await
        .expect("billing");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            tokio::time::timeout(RENEW * 3, leases.recv())
                .await
                .expect("in time")
                .expect("a lease"),
        );
    }
    until("orders owned", RENEW * 3, || {
        orders.owned().borrow().len() == 3
    })
    .await;
    let before = faults.heartbeats.load(Ordering::SeqCst);
    tokio::time::sleep(RENEW * 4).await;
    assert_eq!(
        faults.heartbeats.load(Ordering::SeqCst) - before,
        4,
        "heartbeats of a node in two groups in four renew intervals"
    );
    let watchers: Vec<_> = held
        .into_iter()
        .map(|lease| tokio::spawn(async move { lease.revoked().await }))
        .collect();
    billing.remove().await.expect("removed and left");
    for w in watchers {
        assert_eq!(w.await.expect("task"), RevokeReason::Shutdown);
    }
    let snap = store.snapshot(&name("billing")).await.expect("snapshot");
    assert!(snap.members.is_empty(), "the node is still in billing");
    assert_eq!(orders.owned().borrow().len(), 3);
    let nodes = store.nodes().await.expect("nodes");
    assert_eq!(nodes.nodes.len(), 1);
    assert_eq!(nodes.nodes[0].groups, vec![name("orders")]);
    assert!(nodes.nodes[0].live);
    while let Ok(e) = events.try_recv() {
        assert!(
            matches!(e, lease_core::OwnershipEvent::Assigned(_)),
            "orders heard {e:?}"
        );
    }
    node.shutdown().await.expect("a clean stop");
    assert!(store.nodes().await.expect("nodes").nodes.is_empty());
}

/// A node that cannot leave its groups when stopped (the store does not answer) says which:
/// the node's `shutdown` fails with `GroupsNotLeft` naming both, and each group's handle with
/// its leave's failure; the store keeps the node's memberships until its session expires.
#[tokio::test(start_paused = true)]
async fn a_node_that_cannot_leave_names_the_groups() {
    let store = FaultyStore::new(MemoryLeaseStore::with_clock(TokioClock::new()));
    let faults = store.faults();
    let node = node(store.clone());
    let mut handles = Vec::new();
    for g in ["orders", "billing"] {
        let (h, _) = event_channel(16);
        handles.push(node.add_group(name(g), n(2), h).await.expect("added"));
    }
    until("both owned", RENEW * 3, || {
        handles.iter().all(|h| h.owned().borrow().len() == 2)
    })
    .await;
    faults.fail_all.store(true, Ordering::SeqCst);
    match node.shutdown().await {
        Err(WorkerFailed::GroupsNotLeft { groups }) => {
            assert_eq!(groups, vec![name("orders"), name("billing")]);
        }
        other => panic!("{other:?}"),
    }
    for mut h in handles {
        match h.wait().await {
            Err(GroupError::Failed(failed)) => {
                assert!(
                    matches!(*failed, WorkerFailed::LeaveFailed { .. }),
                    "{failed:?}"
                );
            }
            other => panic!("{}: {other:?}", h.group()),
        }
    }
    faults.fail_all.store(false, Ordering::SeqCst);
    let listed = store.nodes().await.expect("nodes");
    assert_eq!(listed.nodes.len(), 1, "the node's row went without a leave");
    assert_eq!(listed.nodes[0].groups.len(), 2);
}

/// A handler that takes its time over every assignment, counting those it began.
struct Slow(Duration, Arc<AtomicUsize>);

#[async_trait::async_trait]
impl lease_worker::OwnershipHandler for Slow {
    async fn on_assigned(&self, _: lease_core::Assignment) {
        self.1.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.0).await;
    }

    async fn on_revoked(
        &self,
        _: lease_core::Bucket,
        _: lease_core::FencingToken,
        _: RevokeReason,
    ) {
    }
}

/// A group whose application is busy for long (a minute per assignment here) holds up
/// neither the node's other groups nor their wake-ups: a node renewing every 5 s hands half of
/// `quick` to a joiner within 250 ms, while its `slow` application is still on its first
/// assignment.
#[tokio::test(start_paused = true)]
async fn a_busy_group_does_not_hold_up_another_groups_wake_ups() {
    const SLOW_RENEW: Duration = Duration::from_secs(5);
    const SLOW_TTL: Duration = Duration::from_secs(16);
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let start = |store: MemoryLeaseStore| {
        LeaseNode::builder()
            .ttl(SLOW_TTL)
            .renew_interval(SLOW_RENEW)
            .build()
            .expect("config")
            .start(store)
            .expect("start")
    };
    let x = start(store.clone());
    let (h, _x_events) = event_channel(16);
    let quick = x.add_group(name("quick"), n(4), h).await.expect("quick");
    until("x owning quick", SLOW_RENEW, || {
        quick.owned().borrow().len() == 4
    })
    .await;
    let begun = Arc::new(AtomicUsize::new(0));
    let slow = x
        .add_group(
            name("slow"),
            n(4),
            Slow(Duration::from_secs(60), begun.clone()),
        )
        .await
        .expect("slow");
    until(
        "slow's application on its first assignment",
        SLOW_RENEW,
        || begun.load(Ordering::SeqCst) == 1,
    )
    .await;
    assert!(slow.owned().borrow().is_empty());
    let y = start(store.clone());
    let (h, _y_events) = event_channel(16);
    let joined = Instant::now();
    let y_quick = y
        .add_group(name("quick"), n(4), h)
        .await
        .expect("y in quick");
    until(
        "the joiner's half of quick, by wake-ups",
        Duration::from_millis(250),
        || y_quick.owned().borrow().len() == 2 && quick.owned().borrow().len() == 2,
    )
    .await;
    eprintln!("handed over in {:?}", joined.elapsed());
    assert!(
        slow.owned().borrow().is_empty(),
        "slow finished an assignment"
    );
    assert_eq!(
        begun.load(Ordering::SeqCst),
        1,
        "slow's application began another assignment"
    );
    y.abort();
    x.abort();
}

/// A handler that owns nothing it is not told of and counts the store's refusals of its node
/// id (another live process holds it).
struct Refused(Arc<AtomicUsize>);

#[async_trait::async_trait]
impl lease_worker::OwnershipHandler for Refused {
    async fn on_assigned(&self, _: lease_core::Assignment) {}

    async fn on_revoked(
        &self,
        _: lease_core::Bucket,
        _: lease_core::FencingToken,
        _: RevokeReason,
    ) {
    }

    async fn on_error(&self, error: &lease_worker::WorkerError) {
        if let lease_worker::WorkerError::Store { source, .. } = error
            && source.kind() == lease_core::ErrorKind::NodeIdInUse
        {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A second process with a live node's id is refused by the store, and changes nothing: the
/// weight it is given (7, then 0) is applied only under a session of its own, after its join,
/// which it never gets. The live node keeps its weight (1) and every bucket, across several
/// of the duplicate's refused heartbeats and several of its own renewals.
#[tokio::test(start_paused = true)]
async fn a_refused_duplicate_writes_no_weight() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let id = lease_core::NodeId::new();
    let config = || {
        LeaseNode::builder()
            .node_id(id)
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .expect("config")
    };
    let live = config().start(store.clone()).expect("start");
    let (h, _events) = event_channel(16);
    let orders = live
        .add_group(name("orders"), n(4), h)
        .await
        .expect("added");
    until("orders owned", RENEW * 3, || {
        orders.owned().borrow().len() == 4
    })
    .await;
    // The live node's weight and the time of its last renewal, as the store has them.
    let member = || async {
        let snap = store.snapshot(&name("orders")).await.expect("snapshot");
        snap.members
            .iter()
            .find(|m| m.worker == id)
            .map(|m| (m.weight, m.heartbeat_at))
            .expect("the live node is a member")
    };
    assert_eq!(member().await.0, 1);
    for w in [7, 0] {
        let refusals = Arc::new(AtomicUsize::new(0));
        let duplicate = config()
            .start(store.clone())
            .expect("a configuration of its own");
        let group = duplicate
            .add_group(name("orders"), n(4), Refused(refusals.clone()))
            .await
            .expect("added: the store refuses the session, not the group");
        group
            .set_weight(lease_core::Weight::new(w).expect("a weight"))
            .await
            .expect("kept for the join");
        // Long enough for the duplicate to be refused a few times and for the live node to
        // renew twice (and plan on whatever weight the store has).
        let (_, set_at) = member().await;
        let limit = Instant::now() + RENEW * 10;
        loop {
            let (_, renewed) = member().await;
            if refusals.load(Ordering::SeqCst) >= 3 && renewed >= set_at + RENEW * 2 {
                break;
            }
            assert!(Instant::now() < limit, "no refusals or no renewals");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            member().await.0,
            1,
            "the duplicate's weight {w} was written"
        );
        assert_eq!(
            orders.owned().borrow().len(),
            4,
            "the live node gave buckets up for the duplicate's weight {w}"
        );
        duplicate.abort();
    }
    live.shutdown().await.expect("a clean stop");
}

/// The weight a node is given reaches the store under its own session: given right after the
/// group is added (its join still to come or under way), it is applied once the node joins;
/// given to a member, at once.
#[tokio::test(start_paused = true)]
async fn a_weight_is_set_once_the_node_is_a_member() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let node = node(store.clone());
    let (h, _events) = event_channel(16);
    let orders = node
        .add_group(name("orders"), n(4), h)
        .await
        .expect("added");
    orders
        .set_weight(lease_core::Weight::new(3).expect("a weight"))
        .await
        .expect("kept for the join");
    let weight = || async {
        let snap = store.snapshot(&name("orders")).await.expect("snapshot");
        snap.members
            .iter()
            .find(|m| m.worker == node.node_id())
            .map(|m| m.weight)
    };
    let limit = Instant::now() + RENEW * 3;
    while weight().await != Some(3) {
        assert!(
            Instant::now() < limit,
            "the weight was not applied after the join"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    orders
        .set_weight(lease_core::Weight::new(2).expect("a weight"))
        .await
        .expect("set");
    assert_eq!(weight().await, Some(2), "set on a member at once");
    node.shutdown().await.expect("a clean stop");
}
