//! The driver against a mock store: what a tick costs.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::*;
use crate::LeaseNode;
use crate::event_channel;
use lease_core::MockWorkerStore;
use lease_core::{Bucket, FencingToken, GroupName, NodeId, RevokeReason, ShardCount};
use lease_core::{Clock, ManualClock};
use lease_core::{GroupBeat, GroupView, Heartbeat, Lease, MemberLoad, SessionId, ViewStamp};

/// Counts of each store call the mock saw.
#[derive(Default)]
struct Calls {
    ensure: AtomicUsize,
    changes: AtomicUsize,
    heartbeat: AtomicUsize,
    join: AtomicUsize,
    claim: AtomicUsize,
    release: AtomicUsize,
    leave: AtomicUsize,
    joined: Mutex<BTreeSet<GroupName>>,
}

impl Calls {
    fn get(n: &AtomicUsize) -> usize {
        n.load(Ordering::SeqCst)
    }

    fn count(n: &AtomicUsize) -> usize {
        n.fetch_add(1, Ordering::SeqCst)
    }
}

/// In steady state (the node holds its fair share of each of its two groups, nothing
/// claimable) a tick is one heartbeat for both groups and nothing else. Every call is
/// counted by the mock and the counts are checked here, after the node stopped: an
/// expectation checked when the mock drops inside the node task would only be logged.
#[tokio::test(start_paused = true)]
async fn a_steady_tick_is_one_heartbeat_for_every_group() {
    let me = NodeId::new();
    let other = NodeId::new();
    let session = SessionId::new();
    let now = ManualClock::new().now();
    let shards = ShardCount::new(8).unwrap();
    let calls = Arc::new(Calls::default());
    let mut store = MockWorkerStore::new();
    let c = calls.clone();
    store.expect_ensure_group().returning(move |_, _| {
        Calls::count(&c.ensure);
        Ok(())
    });
    let c = calls.clone();
    store.expect_changes().returning(move |_| {
        Calls::count(&c.changes);
        Ok(None)
    });
    let c = calls.clone();
    store.expect_join().returning(move |group, _, joined| {
        assert_eq!(joined, session, "joined under another session");
        Calls::count(&c.join);
        c.joined.lock().unwrap().insert(group.clone());
        Ok(())
    });
    let c = calls.clone();
    store
        .expect_heartbeat_with_bound()
        .returning(move |node, _, _, _, _, _| {
            let first = Calls::count(&c.heartbeat) == 0;
            let groups = c
                .joined
                .lock()
                .unwrap()
                .iter()
                .map(|group| {
                    let owned: Vec<Lease> = (0..4)
                        .map(|b| Lease {
                            bucket: Bucket(b),
                            shards,
                            owner: node,
                            token: FencingToken(1),
                            expires_at: now,
                        })
                        .collect();
                    let mut members = vec![MemberLoad::new(node, 4), MemberLoad::new(other, 4)];
                    members.sort_by_key(|m| m.worker);
                    GroupBeat {
                        group: group.clone(),
                        view: GroupView::new(shards, members, 0),
                        owned,
                        stamp: ViewStamp::default(),
                        quarantined: Vec::new(),
                    }
                })
                .collect();
            Ok(Heartbeat {
                session,
                new_session: first,
                observed_at: now,
                expires_at: now,
                groups,
                unchanged: Vec::new(),
                position: None,
            })
        });
    let c = calls.clone();
    store.expect_claim().returning(move |_, _, _, _, _| {
        Calls::count(&c.claim);
        Ok(Vec::new())
    });
    let c = calls.clone();
    store.expect_release().returning(move |_, _, _, _| {
        Calls::count(&c.release);
        Ok(Vec::new())
    });
    let c = calls.clone();
    store.expect_leave().returning(move |_, _, left| {
        assert_eq!(left, session, "the node left under another session");
        Calls::count(&c.leave);
        Ok(Vec::new())
    });

    let node = LeaseNode::builder()
        .node_id(me)
        .ttl(Duration::from_secs(3))
        .renew_interval(Duration::from_secs(1))
        .build()
        .unwrap()
        .start(store)
        .unwrap();
    let mut events = Vec::new();
    let mut handles = Vec::new();
    for name in ["orders", "billing"] {
        let (handler, rx) = event_channel(64);
        events.push(rx);
        handles.push(
            node.add_group(GroupName::new(name).unwrap(), shards, handler)
                .await
                .unwrap(),
        );
    }
    // The first tick heartbeats, joins both groups and heartbeats again for their views,
    // all at 0 s; then one heartbeat per tick for both, at 1 s, 2 s, ... 10 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Calls::get(&calls.heartbeat);
    assert!(started <= 3, "{started} heartbeats to start");
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(!node.is_finished(), "the node stopped");
    for h in &handles {
        assert_eq!(h.owned().borrow().len(), 4, "{}", h.group());
    }
    node.shutdown().await.expect("a clean stop");
    assert_eq!(Calls::get(&calls.ensure), 2, "ensure_group calls");
    assert_eq!(Calls::get(&calls.changes), 2, "changes calls");
    assert_eq!(Calls::get(&calls.join), 2, "join calls");
    assert_eq!(
        Calls::get(&calls.heartbeat) - started,
        10,
        "heartbeats in 10 s of steady state"
    );
    assert_eq!(Calls::get(&calls.claim), 0, "claims in steady state");
    assert_eq!(Calls::get(&calls.release), 0, "releases in steady state");
    assert_eq!(Calls::get(&calls.leave), 2, "leave calls");
    for (mut rx, h) in events.into_iter().zip(&handles) {
        let mut assigned = 0;
        let mut revoked = 0;
        while let Ok(e) = rx.try_recv() {
            match e {
                lease_core::OwnershipEvent::Assigned(_) => assigned += 1,
                lease_core::OwnershipEvent::Revoked { reason, .. } => {
                    assert_eq!(reason, RevokeReason::Shutdown);
                    revoked += 1;
                }
            }
        }
        assert_eq!((assigned, revoked), (4, 4), "{}", h.group());
    }
}
