//! The harness of the cases on nodes: [`Nodes`] starts nodes on one store, each behind fault
//! switches of its own and in any of a set of groups, with one ownership log per group. The
//! groups family and the hand-over cases of the controls use it, so it lives apart from both.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease_core::ownership_log::{OwnershipLog, Summary};
use lease_core::{Clock, GroupName, LeaseStore, NodeId, OwnershipEvent, ShardCount, Timestamp};
use lease_worker::{GroupHandle, LeaseNode, NodeHandle};

use super::{Env, RENEW, Reported, Slow, SlowHandler, TTL, balanced, lock, until};
use crate::{Faults, FaultyStore, RecordingHandler};

/// An ownership log the applications of a group record into.
type Log = Arc<Mutex<OwnershipLog<Timestamp>>>;

/// A running node of a [`Nodes`] pool: its handle, its fault switches, its groups.
pub(super) struct NodeRun {
    pub(super) handle: NodeHandle,
    faults: Arc<Faults>,
    groups: BTreeMap<GroupName, GroupHandle>,
}

/// Nodes on one store, each behind its own fault switches, in any of a set of groups; each
/// group's applications record into that group's ownership log (bucket numbers repeat across
/// groups).
pub(super) struct Nodes<S> {
    pub(super) store: S,
    pub(super) clock: Arc<dyn Clock>,
    /// Each group's shard count and ownership log.
    pub(super) groups: BTreeMap<GroupName, (u32, Log)>,
    events: Arc<AtomicUsize>,
    pub(super) nodes: BTreeMap<NodeId, NodeRun>,
}

impl<S: LeaseStore + Clone + 'static> Nodes<S> {
    /// A pool of nodes ([`RENEW`], [`TTL`], with wake-ups) for groups of these names and
    /// shard counts.
    pub(super) fn new(env: &Env<S>, groups: &[(&str, u32)]) -> Self {
        Self {
            store: env.store.clone(),
            clock: env.clock.clone(),
            groups: groups
                .iter()
                .map(|&(name, shards)| {
                    (
                        GroupName::new(name).expect("a group name"),
                        (shards, Arc::new(Mutex::new(OwnershipLog::new()))),
                    )
                })
                .collect(),
            events: Arc::new(AtomicUsize::new(0)),
            nodes: BTreeMap::new(),
        }
    }

    pub(super) fn group(name: &str) -> GroupName {
        GroupName::new(name).expect("a group name")
    }

    /// Start a node in these groups (added one after another, as an application would).
    pub(super) async fn start(&mut self, groups: &[&str]) -> NodeId {
        self.start_with(groups, |b| b).await
    }

    /// [`start`](Self::start), the node's configuration changed by `configure`.
    pub(super) async fn start_with(
        &mut self,
        groups: &[&str],
        configure: impl FnOnce(lease_worker::LeaseNodeBuilder) -> lease_worker::LeaseNodeBuilder,
    ) -> NodeId {
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        let handle = configure(LeaseNode::builder().ttl(TTL).renew_interval(RENEW))
            .build()
            .expect("a valid configuration")
            .start(store)
            .expect("the node starts");
        let id = handle.node_id();
        self.nodes.insert(
            id,
            NodeRun {
                handle,
                faults,
                groups: BTreeMap::new(),
            },
        );
        for g in groups {
            self.add(id, g).await;
        }
        id
    }

    /// Add group `name` to node `id`.
    pub(super) async fn add(&mut self, id: NodeId, name: &str) {
        self.add_slow(id, name, Slow::default()).await;
    }

    /// Add group `name` to node `id`, its application as slow as `slow` says.
    pub(super) async fn add_slow(&mut self, id: NodeId, name: &str, slow: Slow) {
        let group = Self::group(name);
        let (shards, log) = self.groups[&group].clone();
        let handler = SlowHandler {
            inner: RecordingHandler::new(id, log, self.clock.clone()),
            slow,
            assigned: AtomicUsize::new(0),
            events: self.events.clone(),
            errors: Reported::default(),
        };
        let node = self.nodes.get_mut(&id).expect("a running node");
        let handle = node
            .handle
            .add_group(
                group.clone(),
                ShardCount::new(shards).expect("a shard count"),
                handler,
            )
            .await
            .expect("the group is added");
        node.groups.insert(group, handle);
    }

    /// Remove group `name` from node `id`, through the node's handle, and wait for it.
    pub(super) async fn remove(&mut self, id: NodeId, name: &str) {
        let group = Self::group(name);
        let node = self.nodes.get_mut(&id).expect("a running node");
        let handle = node.groups.remove(&group).expect("a group of the node");
        node.handle
            .remove_group(&group)
            .await
            .expect("the group is removed and left");
        assert!(
            handle.owned().borrow().is_empty(),
            "the removed group's owned set kept buckets"
        );
    }

    pub(super) fn faults(&self, id: NodeId) -> Arc<Faults> {
        self.nodes[&id].faults.clone()
    }

    /// What each node's application of group `name` owns, for the nodes in it.
    pub(super) fn owned(&self, name: &str) -> BTreeMap<NodeId, usize> {
        let group = Self::group(name);
        self.nodes
            .iter()
            .filter_map(|(&id, n)| n.groups.get(&group).map(|h| (id, h.owned().borrow().len())))
            .collect()
    }

    pub(super) fn balanced(&self, name: &str) -> bool {
        let shards = self.groups[&Self::group(name)].0;
        balanced(self.owned(name).into_values(), shards)
    }

    /// Wait until every group in `names` is balanced among its nodes; how long it took.
    pub(super) async fn until_balanced(
        &self,
        names: &[&str],
        limit: Duration,
        what: &str,
    ) -> Duration {
        until(
            limit,
            what,
            || names.iter().all(|g| self.balanced(g)),
            || {
                names
                    .iter()
                    .map(|g| (*g, self.owned(g)))
                    .collect::<Vec<_>>()
            },
        )
        .await
    }

    /// What node `id`'s application of group `name` heard, when.
    pub(super) fn events_of(&self, id: NodeId, name: &str) -> Vec<(Timestamp, OwnershipEvent)> {
        lock(&self.groups[&Self::group(name)].1)
            .entries()
            .iter()
            .filter(|e| e.worker == id)
            .map(|e| (e.at, e.event))
            .collect()
    }

    /// The expiry of node `id`'s session as the store lists it now, if it lists the node live.
    pub(super) async fn session_expiry(&self, id: NodeId) -> Option<Timestamp> {
        self.store
            .nodes()
            .await
            .expect("nodes")
            .nodes
            .iter()
            .find(|n| n.node == id && n.live)
            .map(|n| n.expires_at)
    }

    /// Check every group's ownership log.
    pub(super) fn check(&self) -> Vec<Summary> {
        self.groups
            .iter()
            .map(|(group, (_, log))| {
                lock(log)
                    .check()
                    .unwrap_or_else(|e| panic!("ownership log of {group}: {e}"))
            })
            .collect()
    }

    /// Stop node `id` gracefully and wait for it.
    pub(super) async fn stop(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("a running node");
        node.handle.shutdown().await.expect("a clean stop");
    }

    /// Stop every node gracefully and check the logs.
    pub(super) async fn shutdown(mut self) -> Vec<Summary> {
        for (_, node) in std::mem::take(&mut self.nodes) {
            node.handle.shutdown().await.expect("a clean stop");
        }
        self.check()
    }
}
