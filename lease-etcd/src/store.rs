//! [`EtcdLeaseStore`]: the contract's rules (the memory store's [`State`] functions) run on
//! what an operation reads from etcd, written back by one transaction that holds only if
//! nothing it relied on changed meanwhile.
//!
//! An operation reads, in one transaction (one revision), every node record, every liveness
//! key (lease mode) and the keys of the groups it names; decodes them into a [`State`]; runs
//! the rule; and writes what changed in one transaction comparing the `mod_revision` of every
//! document it writes or deletes (a group's document is written with any of its pages, so
//! two writers of one group never both succeed) and, in clock mode, of every node record it
//! read (liveness was judged on them). A failed comparison means another process wrote
//! first: the operation reads again and reruns the rule, so concurrent operations are
//! serialized per group and per node like the memory store's mutex serializes them.

mod admin;
mod feed;
mod send;
mod sessions;
mod transaction;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::Client;
use lease_core::{
    BackendFailure, Clock, GroupName, GroupStamp, Incarnation, NodeId, Operation, SessionId,
    ShardCount, StoreError, SystemClock, Timestamp, store_precision,
};
use lease_rules::State;

use crate::codec::NodeExtra;
use crate::keys::Keys;
use crate::url::EtcdUrl;

/// Buckets per page: a claim or release writes the pages its buckets are on.
pub const PAGE_ROWS: usize = 64;

/// The largest group the store holds: its pages fit one transaction under etcd's default
/// `--max-txn-ops` (128) and its request size limit (1.5 MiB) with every bucket's history
/// full.
pub const MAX_SHARDS: u32 = 1024;

/// How many dead nodes' rows one heartbeat removes at most (H3, H9): with a put or delete and
/// a compare each, a thousand nodes dying at once must not make a heartbeat's transaction
/// exceed etcd's `--max-txn-ops` (128 by default), which would stop every worker.
const REMOVALS_PER_WRITE: usize = 32;

/// How often an operation reruns after losing a race before it gives up with
/// [`BackendFailure::Conflict`] (transient: the caller's next tick tries again).
const ATTEMPTS: usize = 64;

/// The client could not be set up for the URL's members.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to etcd at {endpoints}: {source}")]
pub struct ConnectError {
    /// The members tried.
    pub endpoints: String,
    /// What the client said.
    #[source]
    pub source: etcd_client::Error,
}

/// Who decides that a session is over.
#[derive(Clone)]
enum Liveness {
    /// Production: a session is an etcd lease, granted with the ttl and kept alive by the
    /// heartbeat; the etcd leader expires it (G1: never a worker's clock).
    Leases,
    /// Tests: a session ends when `clock` reaches the expiry its record holds, as in the
    /// memory store, so the conformance and differential suites can run on a manual clock.
    Clock(Arc<dyn Clock>),
}

/// The lease store on etcd. Cheap to clone: clones share the client's channel.
#[derive(Clone)]
pub struct EtcdLeaseStore {
    client: Client,
    keys: Keys,
    liveness: Liveness,
    /// The etcd lease each (node, process) last kept alive or was granted: its next heartbeat
    /// sends the keep-alive at once, alongside its read, instead of after it.
    renewing: Arc<std::sync::Mutex<BTreeMap<(NodeId, Incarnation), i64>>>,
}

impl std::fmt::Debug for EtcdLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdLeaseStore")
            .field("keys", &self.keys)
            .field(
                "liveness",
                &match self.liveness {
                    Liveness::Leases => "etcd leases",
                    Liveness::Clock(_) => "clock",
                },
            )
            .finish()
    }
}

/// What an operation read: the state and the revisions its write must find unchanged.
#[derive(Clone, Default)]
struct Loaded {
    state: State,
    /// The node records' `mod_revision`s.
    node_revs: BTreeMap<NodeId, i64>,
    /// What the records hold besides the rows.
    extras: BTreeMap<NodeId, NodeExtra>,
    /// Liveness keys (lease mode): the session each names, its `mod_revision` and lease.
    lives: BTreeMap<NodeId, (SessionId, i64, i64)>,
    /// The groups' documents' `mod_revision`s (absent: not read; 0: read and not there).
    doc_revs: BTreeMap<GroupName, i64>,
    /// Generations with pages stored, by group.
    page_gens: BTreeMap<GroupName, BTreeSet<u64>>,
}

/// What an operation reads besides the nodes.
enum Scope<'a> {
    /// One group.
    Group(&'a GroupName),
    /// A node's groups (its record's index; `seen` names the groups to read at once).
    Node(NodeId, &'a [GroupStamp]),
    /// Nothing else.
    Nodes,
}

/// The liveness keys to write with a state (lease mode): the key's new lease, and the
/// revision it must have now (0: absent).
type LivePuts = Vec<(NodeId, SessionId, i64, i64)>;

fn corrupt(op: Operation, detail: impl std::fmt::Display) -> StoreError {
    StoreError::backend_detail(op, BackendFailure::Corrupt, detail.to_string())
}

fn too_large(op: Operation, group: &GroupName, shards: ShardCount) -> StoreError {
    StoreError::backend_detail(
        op,
        BackendFailure::Misconfigured,
        format!(
            "group {group} would have {shards} buckets; the etcd store holds groups of up to \
             {MAX_SHARDS}"
        ),
    )
}

/// [`ATTEMPTS`] races lost in a row: transient, the caller's next tick tries again.
fn lost_races(op: Operation) -> StoreError {
    StoreError::backend_detail(
        op,
        BackendFailure::Conflict,
        format!("lost the race to other writers {ATTEMPTS} times in a row"),
    )
}

impl EtcdLeaseStore {
    /// Connect to the members `url` names; sessions are etcd leases.
    pub async fn connect(url: &EtcdUrl) -> Result<Self, ConnectError> {
        Self::open(url, Liveness::Leases).await
    }

    /// Connect with liveness judged on `clock` instead of etcd leases: for tests that drive
    /// time by hand (the conformance and differential suites). Not for production: a
    /// session's end is then a worker's clock reading.
    pub async fn connect_with_clock(
        url: &EtcdUrl,
        clock: impl Clock + 'static,
    ) -> Result<Self, ConnectError> {
        Self::open(url, Liveness::Clock(Arc::new(clock))).await
    }

    async fn open(url: &EtcdUrl, liveness: Liveness) -> Result<Self, ConnectError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            // A member cut off from the leader answers "no leader" at once instead of
            // serving what it last knew.
            .with_require_leader(true);
        let client = Client::connect(&url.endpoints, Some(options))
            .await
            .map_err(|source| ConnectError {
                endpoints: url.endpoints.join(","),
                source,
            })?;
        Ok(Self {
            client,
            keys: Keys::new(&url.prefix),
            liveness,
            renewing: Arc::default(),
        })
    }

    fn leases(&self) -> bool {
        matches!(self.liveness, Liveness::Leases)
    }

    fn now(&self) -> Timestamp {
        store_precision(match &self.liveness {
            Liveness::Leases => SystemClock.now(),
            Liveness::Clock(clock) => clock.now(),
        })
    }
}

/// The compare rules, each as a deterministic race: one operation reads, another writes, then
/// the first writes what it decided. Each test fails when its compare is removed.
#[cfg(test)]
mod races;
