//! Nodes driven through their machines alone, with no driver: the loop in [`Cluster`] is all a
//! driver is (make each call the machine asks for as it is, hand back the answer, tell the
//! application, wake the machine when it says), on the memory store with a manual clock that
//! moves with the machines' time. The library's driver adds only tasks, channels and metrics
//! around the same loop.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lease_core::{
    AdminStore, Bucket, FencingToken, GroupName, Incarnation, ManualClock, MemberMetadata, NodeId,
    ShardCount, Ttl,
};
use lease_memory::MemoryLeaseStore;
use lease_worker::WorkerFailed;
use lease_worker::machine::{Delivery, Input, Machine, Output, Rules};

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

fn name(g: &str) -> GroupName {
    GroupName::new(g).expect("a group name")
}

fn rules(node: NodeId) -> Rules {
    Rules {
        node,
        incarnation: Incarnation::new(),
        metadata: MemberMetadata::new("alone").expect("metadata"),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: Duration::from_millis(500),
        wake_debounce: Duration::from_millis(10),
        call_timeout: Duration::from_millis(1500),
        ack_limit: Some(Duration::from_secs(2)),
        keep_on_stop: None,
        loads: Default::default(),
    }
}

/// One node: its machine, what its applications hold, and how its groups and itself ended.
struct Node {
    m: Machine,
    held: BTreeMap<(GroupName, Bucket), FencingToken>,
    groups_ended: BTreeMap<GroupName, Result<(), WorkerFailed>>,
    ended: Option<Result<(), WorkerFailed>>,
}

/// Nodes on one memory store whose clock moves with the machines' time.
struct Cluster {
    store: MemoryLeaseStore,
    clock: ManualClock,
    now: Instant,
    nodes: Vec<Node>,
}

impl Cluster {
    fn new(nodes: usize) -> Self {
        let clock = ManualClock::new();
        let now = Instant::now();
        Self {
            store: MemoryLeaseStore::with_clock(clock.clone()),
            clock,
            now,
            nodes: (0..nodes)
                .map(|_| Node {
                    m: Machine::new(rules(NodeId::new()), now),
                    held: BTreeMap::new(),
                    groups_ended: BTreeMap::new(),
                    ended: None,
                })
                .collect(),
        }
    }

    /// Let node `i` do all it can at the current instant: each output performed as a driver
    /// would, a delivery heard by the application at once.
    async fn settle(&mut self, i: usize) {
        let now = self.now;
        self.nodes[i].m.handle_timeout(now);
        while let Some(out) = self.nodes[i].m.poll(now) {
            match out {
                Output::Call(call) => {
                    // The feed a subscription gives is dropped: the machines re-plan on their
                    // renew interval alone here.
                    let answered = call.execute(&self.store).await;
                    self.nodes[i].m.handle(now, answered.input);
                }
                Output::Deliver(group, d) => {
                    self.deliver(i, &group, d);
                    self.nodes[i].m.handle(now, Input::Delivered(group.clone()));
                    if let Delivery::Revoke { bucket, .. } = d {
                        self.nodes[i].m.handle(now, Input::Acked(group, bucket));
                    }
                }
                Output::Report(_) => {}
                Output::GroupFinished(group, ended) => {
                    self.nodes[i].groups_ended.insert(group, ended);
                }
                Output::Finished(ended) => self.nodes[i].ended = Some(ended),
            }
        }
    }

    /// Node `i`'s application hears `d`; no bucket is ever held by two applications at once.
    fn deliver(&mut self, i: usize, group: &GroupName, d: Delivery) {
        match d {
            Delivery::Assign { bucket, token } => {
                for (j, other) in self.nodes.iter().enumerate() {
                    assert!(
                        j == i || !other.held.contains_key(&(group.clone(), bucket)),
                        "{group}/{bucket} assigned to node {i} while node {j} holds it"
                    );
                }
                self.nodes[i].held.insert((group.clone(), bucket), token);
            }
            Delivery::Revoke { bucket, token, .. } => {
                let had = self.nodes[i].held.remove(&(group.clone(), bucket));
                assert_eq!(
                    had,
                    Some(token),
                    "{group}/{bucket} revoked with another token"
                );
            }
        }
    }

    /// Run every node until `done`, moving time (the machines' and the store's together) to
    /// the earliest instant some machine asked to be woken at; panics after a minute of it.
    async fn run_until(&mut self, what: &str, done: impl Fn(&Self) -> bool) {
        let limit = self.now + Duration::from_secs(60);
        loop {
            for i in 0..self.nodes.len() {
                self.settle(i).await;
            }
            if done(self) {
                return;
            }
            let next = self
                .nodes
                .iter()
                .filter_map(|n| n.m.poll_timeout())
                .min()
                .unwrap_or(self.now + RENEW)
                .max(self.now);
            assert!(next <= limit, "{what}: not within a minute");
            self.clock.advance(next - self.now);
            self.now = next;
        }
    }

    fn held_in(&self, i: usize, group: &str) -> usize {
        let group = name(group);
        self.nodes[i]
            .held
            .keys()
            .filter(|(g, _)| g == &group)
            .count()
    }
}

/// Two nodes, two groups: both groups are shared evenly, each application holds exactly what
/// the store says its node owns, and a graceful stop of one node (revoke, leave each group,
/// finish) hands every bucket to the other; all through the machines' own calls.
#[tokio::test]
async fn nodes_share_groups_and_stop_gracefully_through_their_machines_alone() {
    let mut c = Cluster::new(2);
    for node in &mut c.nodes {
        assert!(
            node.m
                .add_group(name("orders"), ShardCount::new(8).expect("8"))
        );
        assert!(
            node.m
                .add_group(name("billing"), ShardCount::new(4).expect("4"))
        );
    }
    c.run_until("an even share", |c| {
        (0..2).all(|i| c.held_in(i, "orders") == 4 && c.held_in(i, "billing") == 2)
    })
    .await;

    // What the applications hold is what the store says each node owns, token for token.
    for group in ["orders", "billing"] {
        let snapshot = c.store.snapshot(&name(group)).await.expect("a snapshot");
        for b in &snapshot.buckets {
            let holder = c
                .nodes
                .iter()
                .find(|n| n.held.contains_key(&(name(group), b.bucket)))
                .expect("every bucket held by an application");
            assert_eq!(b.owner, Some(holder.m.rules().node), "{group}/{}", b.bucket);
            assert_eq!(
                holder.held[&(name(group), b.bucket)],
                b.token,
                "{group}/{}",
                b.bucket
            );
        }
    }

    // A graceful stop of node 0: its groups end cleanly, it finishes, and node 1 (woken by
    // nothing but its renew interval) takes every bucket.
    let now = c.now;
    c.nodes[0].m.handle(now, Input::Stop);
    c.run_until("the stop and the takeover", |c| {
        c.nodes[0].ended.is_some() && c.held_in(1, "orders") == 8 && c.held_in(1, "billing") == 4
    })
    .await;
    let stopped = &c.nodes[0];
    assert!(matches!(stopped.ended, Some(Ok(()))), "{:?}", stopped.ended);
    assert!(stopped.held.is_empty(), "{:?}", stopped.held);
    assert_eq!(stopped.groups_ended.len(), 2, "{:?}", stopped.groups_ended);
    assert!(stopped.groups_ended.values().all(Result::is_ok));
    // It left both groups: neither lists it as a member any more.
    let gone = stopped.m.rules().node;
    for group in ["orders", "billing"] {
        let snapshot = c.store.snapshot(&name(group)).await.expect("a snapshot");
        assert!(
            snapshot.members.iter().all(|m| m.worker != gone),
            "{group} still lists the stopped node"
        );
    }
}
