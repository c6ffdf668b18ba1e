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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use futures_util::StreamExt;
use lease_core::{
    AdminStore, BackendFailure, Bucket, Change, ChangeFeed, Clock, FencingToken, GroupName,
    GroupSnapshot, GroupStamp, Heartbeat, Incarnation, Lease, MemberControl, MemberMetadata,
    NodeId, NodesSnapshot, Operation, QuarantineFor, ResizeOutcome, SessionId, ShardCount,
    StoreError, SystemClock, Takeover, Tenure, Timestamp, Ttl, Weight, WorkerStore,
    store_precision,
};
use lease_rules::{BucketRow, GroupState, NodeRow, State};

use crate::codec::{self, NodeExtra};
use crate::error::classify;
use crate::keys::{Keys, range_end};
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

/// How often a request that never reached a member is sent again at once before the call
/// fails (the client picked a member that is down; the next pick is likely another).
const UNSENT_RETRIES: usize = 6;

/// Which failed requests are sent again: a write only when it cannot have been applied, a
/// repeatable request (a read) whenever a member was unavailable.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// A write: only when nothing can have been applied.
    IfUnapplied,
    /// A read, a keep-alive, a revoke: whenever a member was unavailable.
    Repeatable,
}

/// Whether a failed request may be sent again, and after how long.
fn resend(error: &etcd_client::Error, kind: Resend, tries: usize) -> Option<Duration> {
    let backoff = Duration::from_millis(25 << tries.min(4));
    match error {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            let message = status.message();
            let from_etcd = message.starts_with("etcdserver:");
            if !from_etcd
                && (message == "tcp connect error" || message.contains("error trying to connect"))
            {
                // The client could not reach the member it picked: nothing was sent, and the
                // next pick is likely a live member. (Not etcd's "request timed out, possibly
                // due to connection lost": that request was proposed and may be applied.)
                Some(Duration::ZERO)
            } else if (from_etcd && message.contains("no leader")) || kind == Resend::Repeatable {
                // `require_leader`: a member without a leader refuses before proposing
                // anything. Or a read during an election.
                Some(backoff)
            } else {
                None
            }
        }
        etcd_client::Error::TransportError(_) => Some(Duration::ZERO),
        _ => None,
    }
}

/// Run the request `f` makes; again (at most [`UNSENT_RETRIES`] times) while [`resend`] says
/// it may be.
async fn send<T, Fut>(
    op: Operation,
    kind: Resend,
    mut f: impl FnMut() -> Fut,
) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => match resend(&e, kind, tries) {
                Some(wait) if tries < UNSENT_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(classify(op, e)),
            },
        }
    }
}

/// [`ATTEMPTS`] races lost in a row: transient, the caller's next tick tries again.
fn lost_races(op: Operation) -> StoreError {
    StoreError::backend_detail(
        op,
        BackendFailure::Conflict,
        format!("lost the race to other writers {ATTEMPTS} times in a row"),
    )
}

/// A ttl in whole seconds of an etcd lease, rounded up (a lease outlives the worker's trust,
/// never the reverse), at least 1.
fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
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

    /// One transaction, sent again as [`resend`] allows for its `kind`.
    async fn txn(
        &self,
        op: Operation,
        kind: Resend,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        send(op, kind, || {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
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

    /// Read what `scope` needs, as of one revision: with `pages` false, the groups'
    /// documents only (their buckets read as unowned: see `beat`).
    async fn load(
        &self,
        op: Operation,
        scope: &Scope<'_>,
        now: Timestamp,
        pages: bool,
    ) -> Result<Loaded, StoreError> {
        let group_get = |g: &GroupName, revision: Option<i64>| {
            let options = GetOptions::new();
            let options = match revision {
                Some(r) => options.with_revision(r),
                None => options,
            };
            if pages {
                TxnOp::get(self.keys.group(g), Some(options.with_prefix()))
            } else {
                TxnOp::get(self.keys.doc(g), Some(options))
            }
        };
        let prefix = || Some(GetOptions::new().with_prefix());
        let mut gets = vec![TxnOp::get(self.keys.nodes(), prefix())];
        if self.leases() {
            gets.push(TxnOp::get(self.keys.lives(), prefix()));
        }
        let mut groups: Vec<GroupName> = match scope {
            Scope::Group(g) => vec![(*g).clone()],
            Scope::Node(_, seen) => seen.iter().map(|s| s.group.clone()).collect(),
            Scope::Nodes => Vec::new(),
        };
        groups.sort();
        groups.dedup();
        for g in &groups {
            gets.push(group_get(g, None));
        }
        let resp = self
            .txn(op, Resend::Repeatable, Txn::new().and_then(gets))
            .await?;
        let revision = resp.header().map(|h| h.revision()).unwrap_or_default();
        let mut responses = resp.op_responses().into_iter();
        let mut loaded = Loaded::default();
        let mut next = || match responses.next() {
            Some(TxnOpResponse::Get(get)) => Ok(get),
            _ => Err(corrupt(op, "etcd answered a read with something else")),
        };
        let nodes = next()?;
        let lives = if self.leases() { Some(next()?) } else { None };
        for kv in nodes.kvs() {
            let key = kv.key_str().map_err(|e| corrupt(op, e))?;
            let Some(w) = self.keys.node_of(key) else {
                continue;
            };
            let (row, extra) = codec::decode_node(kv.value()).map_err(|e| corrupt(op, e))?;
            loaded.state.nodes.insert(w, row);
            loaded.node_revs.insert(w, kv.mod_revision());
            loaded.extras.insert(w, extra);
        }
        if let Some(lives) = lives {
            for kv in lives.kvs() {
                let key = kv.key_str().map_err(|e| corrupt(op, e))?;
                let Some(w) = self.keys.live_of(key) else {
                    continue;
                };
                let session = kv
                    .value_str()
                    .ok()
                    .and_then(|v| v.parse::<uuid::Uuid>().ok())
                    .ok_or_else(|| corrupt(op, format!("liveness key {key}: not a session id")))?;
                loaded.lives.insert(
                    w,
                    (SessionId::from_uuid(session), kv.mod_revision(), kv.lease()),
                );
            }
        }
        for g in &groups {
            let get = next()?;
            self.take_group(op, &mut loaded, g, get.kvs(), pages)?;
        }
        // A node's groups not read yet (its index names more than `seen`): read them as of
        // the same revision.
        if let Scope::Node(w, _) = scope {
            let missing: Vec<GroupName> = loaded
                .state
                .groups_of(*w)
                .into_iter()
                .filter(|g| !loaded.doc_revs.contains_key(g))
                .collect();
            if !missing.is_empty() {
                let gets: Vec<TxnOp> = missing
                    .iter()
                    .map(|g| group_get(g, Some(revision)))
                    .collect();
                let resp = self
                    .txn(op, Resend::Repeatable, Txn::new().and_then(gets))
                    .await?;
                for (g, r) in missing.iter().zip(resp.op_responses()) {
                    let TxnOpResponse::Get(get) = r else {
                        return Err(corrupt(op, "etcd answered a read with something else"));
                    };
                    self.take_group(op, &mut loaded, g, get.kvs(), pages)?;
                }
            }
        }
        self.judge_liveness(&mut loaded, now);
        loaded.state.removal_budget = Some(REMOVALS_PER_WRITE);
        Ok(loaded)
    }

    /// Lease mode: a node's session is live while its liveness key names it; the rows are
    /// given expiries that say so at `now` (the rules judge `now < expires_at`).
    fn judge_liveness(&self, loaded: &mut Loaded, now: Timestamp) {
        if !self.leases() {
            return;
        }
        for (w, row) in loaded.state.nodes.iter_mut() {
            let live = loaded
                .lives
                .get(w)
                .is_some_and(|(session, _, _)| *session == row.session);
            if live {
                // The latest it can end: etcd knows when exactly, and the rules only ask
                // whether it is live now.
                let ttl = loaded.extras.get(w).and_then(|e| e.ttl).unwrap_or(0);
                row.expires_at = now + chrono::TimeDelta::microseconds(ttl.max(1));
            } else {
                row.expires_at = row.expires_at.min(now);
            }
        }
    }

    fn take_group(
        &self,
        op: Operation,
        loaded: &mut Loaded,
        group: &GroupName,
        kvs: &[etcd_client::KeyValue],
        pages_read: bool,
    ) -> Result<(), StoreError> {
        let doc_key = self.keys.doc(group);
        let mut head = None;
        let mut pages: Vec<(u64, usize, Vec<BucketRow>)> = Vec::new();
        let mut gens = BTreeSet::new();
        let mut doc_rev = 0;
        for kv in kvs {
            let key = kv.key_str().map_err(|e| corrupt(op, e))?;
            if key == doc_key {
                head = Some(codec::decode_group(kv.value()).map_err(|e| corrupt(op, e))?);
                doc_rev = kv.mod_revision();
            } else if let Some((generation, page)) = self.keys.page_of(group, key) {
                gens.insert(generation);
                let rows = codec::decode_page(kv.value()).map_err(|e| corrupt(op, e))?;
                pages.push((generation, page, rows));
            }
        }
        loaded.doc_revs.insert(group.clone(), doc_rev);
        loaded.page_gens.insert(group.clone(), gens);
        let Some(head) = head else {
            return Ok(());
        };
        let mut g = head.state;
        let current = g.generation.get();
        for (generation, page, rows) in pages {
            let target = if generation == current {
                &mut g.buckets
            } else if head.old && generation + 1 == current {
                &mut g.old
            } else {
                continue;
            };
            for (i, row) in rows.into_iter().enumerate() {
                if let Some(slot) = target.get_mut(page * PAGE_ROWS + i) {
                    *slot = row;
                }
            }
        }
        if !pages_read {
            // Stand-ins from the document: each bucket a member holds is recorded under its
            // node's session (a member row exists only under the current session), so
            // ownership, loads, claimable counts and the drain read as from the pages; tokens
            // and histories are 0 and empty (see `beat` for why they are never used).
            for (w, m) in &g.members {
                let Some(session) = loaded.state.nodes.get(w).map(|n| n.session) else {
                    continue;
                };
                for (held, rows) in [(&m.held, &mut g.buckets), (&m.held_old, &mut g.old)] {
                    for b in held {
                        if let Some(row) = rows.get_mut(b.0 as usize) {
                            row.owner = Some((*w, session));
                        }
                    }
                }
            }
        }
        loaded.state.groups.insert(group.clone(), g);
        Ok(())
    }

    /// Write `after` where it differs from `before`, on condition that what `before` read is
    /// unchanged. `Ok(false)`: another process wrote first.
    async fn store(
        &self,
        op: Operation,
        before: &Loaded,
        after: &State,
        extras: &BTreeMap<NodeId, NodeExtra>,
        lives: &LivePuts,
    ) -> Result<bool, StoreError> {
        let mut when: Vec<Compare> = Vec::new();
        let mut then: Vec<TxnOp> = Vec::new();
        let leases = self.leases();
        let workers: BTreeSet<NodeId> = before
            .state
            .nodes
            .keys()
            .chain(after.nodes.keys())
            .copied()
            .collect();
        for w in workers {
            let key = self.keys.node(w);
            let rev = before.node_revs.get(&w).copied().unwrap_or(0);
            let extra = extras.get(&w).copied().unwrap_or_default();
            match (before.state.nodes.get(&w), after.nodes.get(&w)) {
                (Some(b), Some(a)) => {
                    let changed = node_changed(b, a, leases)
                        || before.extras.get(&w).copied().unwrap_or_default() != extra;
                    if changed {
                        then.push(TxnOp::put(key.clone(), codec::encode_node(a, extra), None));
                    }
                    if changed || !leases {
                        when.push(Compare::mod_revision(key, CompareOp::Equal, rev));
                    }
                }
                (Some(_), None) => {
                    when.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
                    then.push(TxnOp::delete(key, None));
                    // L3: a node that left its last group has no session any more (its lease
                    // then keeps nothing alive and runs out).
                    if leases && before.lives.contains_key(&w) {
                        then.push(TxnOp::delete(self.keys.live(w), None));
                    }
                }
                (None, Some(a)) => {
                    when.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    then.push(TxnOp::put(key, codec::encode_node(a, extra), None));
                }
                (None, None) => {}
            }
        }
        for &(w, session, lease, rev) in lives {
            let key = self.keys.live(w);
            when.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
            then.push(TxnOp::put(
                key,
                session.as_uuid().to_string(),
                Some(PutOptions::new().with_lease(lease)),
            ));
        }
        let mut outbox: BTreeMap<&GroupName, Vec<Change>> = BTreeMap::new();
        for (g, change) in &after.outbox {
            outbox.entry(g).or_default().push(*change);
        }
        let mut unwritten: BTreeSet<&GroupName> = before.doc_revs.keys().collect();
        for (name, a) in &after.groups {
            let b = before.state.groups.get(name);
            let pages = self.page_writes(name, b, a, before.page_gens.get(name));
            let changes = outbox.remove(name).unwrap_or_default();
            if b == Some(a) && pages.is_empty() && changes.is_empty() {
                continue;
            }
            unwritten.remove(name);
            if a.shards.get() > MAX_SHARDS {
                return Err(too_large(op, name, a.shards));
            }
            let key = self.keys.doc(name);
            let rev = before.doc_revs.get(name).copied().unwrap_or(0);
            when.push(Compare::mod_revision(key.clone(), CompareOp::Equal, rev));
            then.push(TxnOp::put(key, codec::encode_group(a, &changes), None));
            then.extend(pages);
        }
        if then.is_empty() {
            return Ok(true);
        }
        // Clock mode: a renewal judged live at its own time must not land after a claim took
        // the session's buckets at a later time (the claim writes the group, not the record).
        if !leases {
            for name in unwritten {
                let rev = before.doc_revs.get(name).copied().unwrap_or(0);
                when.push(Compare::mod_revision(
                    self.keys.doc(name),
                    CompareOp::Equal,
                    rev,
                ));
            }
        }
        let resp = self
            .txn(
                op,
                Resend::IfUnapplied,
                Txn::new().when(when).and_then(then),
            )
            .await?;
        Ok(resp.succeeded())
    }

    /// The page writes and deletes that take `group` from `before` to `after`.
    fn page_writes(
        &self,
        name: &GroupName,
        before: Option<&GroupState>,
        after: &GroupState,
        stored: Option<&BTreeSet<u64>>,
    ) -> Vec<TxnOp> {
        let gens = |g: &GroupState| {
            let mut m: BTreeMap<u64, Vec<BucketRow>> = BTreeMap::new();
            m.insert(g.generation.get(), g.buckets.clone());
            if !g.old.is_empty() {
                m.insert(g.generation.get().saturating_sub(1), g.old.clone());
            }
            m
        };
        let before_gens = before.map(gens).unwrap_or_default();
        let after_gens = gens(after);
        let mut ops = Vec::new();
        for (&generation, rows) in &after_gens {
            // A draining generation's history is never read again (T4): not a change.
            let current = generation == after.generation.get();
            let same = |a: &BucketRow, b: &BucketRow| {
                if current {
                    a == b
                } else {
                    a.owner == b.owner && a.token == b.token && a.last_node == b.last_node
                }
            };
            let prev = before_gens
                .get(&generation)
                .filter(|p| p.len() == rows.len());
            for (page, chunk) in rows.chunks(PAGE_ROWS).enumerate() {
                let unchanged = match prev {
                    Some(p) => chunk
                        .iter()
                        .zip(&p[page * PAGE_ROWS..])
                        .all(|(a, b)| same(a, b)),
                    None => chunk.iter().all(|r| same(r, &BucketRow::default())),
                };
                if !unchanged {
                    ops.push(TxnOp::put(
                        self.keys.page(name, generation, page),
                        codec::encode_page(chunk),
                        None,
                    ));
                }
            }
        }
        let gone: BTreeSet<u64> = before_gens
            .keys()
            .copied()
            .chain(stored.into_iter().flatten().copied())
            .filter(|g| !after_gens.contains_key(g))
            .collect();
        for generation in gone {
            let prefix = self.keys.pages(name, generation);
            ops.push(TxnOp::delete(
                prefix.clone(),
                Some(DeleteOptions::new().with_range(range_end(&prefix))),
            ));
        }
        ops
    }

    /// Read, run `rule`, write back; again while another process wins the race.
    async fn run<T>(
        &self,
        op: Operation,
        scope: Scope<'_>,
        writes: bool,
        mut rule: impl FnMut(&mut State, Timestamp) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        for _ in 0..ATTEMPTS {
            let now = self.now();
            let loaded = self.load(op, &scope, now, true).await?;
            let mut state = loaded.state.clone();
            let result = rule(&mut state, now);
            if !writes || result.is_err() {
                return result;
            }
            if self
                .store(op, &loaded, &state, &loaded.extras, &Vec::new())
                .await?
            {
                return result;
            }
        }
        Err(lost_races(op))
    }

    /// Keep `lease` alive; whether it still was.
    async fn keep_alive(&self, op: Operation, lease: i64) -> Result<bool, StoreError> {
        let answer = send(op, Resend::Repeatable, || {
            let mut leases = self.client.lease_client();
            async move {
                let (mut keeper, mut answers) = leases.keep_alive(lease).await?;
                keeper.keep_alive().await?;
                match answers.message().await {
                    // etcd answers a lease that ran out with a ttl of 0; the client turns that
                    // into this error.
                    Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => {
                        Ok(None)
                    }
                    answer => answer,
                }
            }
        })
        .await?;
        Ok(answer.is_some_and(|a| a.ttl() > 0))
    }

    fn renewing(&self) -> std::sync::MutexGuard<'_, BTreeMap<(NodeId, Incarnation), i64>> {
        self.renewing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn renewing_lease(&self, process: (NodeId, Incarnation)) -> Option<i64> {
        self.renewing().get(&process).copied()
    }

    fn remember_lease(&self, process: (NodeId, Incarnation), lease: i64) {
        self.renewing().insert(process, lease);
    }

    fn forget_lease(&self, process: (NodeId, Incarnation)) {
        self.renewing().remove(&process);
    }

    /// A new etcd lease for a session of `ttl`.
    async fn grant(
        &self,
        op: Operation,
        ttl: Ttl,
    ) -> Result<etcd_client::LeaseGrantResponse, StoreError> {
        send(op, Resend::IfUnapplied, || {
            let mut leases = self.client.lease_client();
            async move { leases.grant(lease_secs(ttl.as_duration()), None).await }
        })
        .await
    }

    /// Revoke a lease no session uses (any more). A failure is left alone: the lease runs
    /// out by itself and keeps nothing alive meanwhile.
    async fn revoke(&self, lease: i64) {
        send(Operation::Heartbeat, Resend::Repeatable, || {
            let mut leases = self.client.lease_client();
            async move { leases.revoke(lease).await }
        })
        .await
        .ok();
    }

    /// Lease mode: when each live session was last renewed and when it ends, as etcd says
    /// (its time-to-live is in whole seconds, so an expiry is told up to a second early; the
    /// rules judge liveness by the liveness keys, not by these).
    async fn lease_times(
        &self,
        op: Operation,
        loaded: &Loaded,
        now: Timestamp,
        wanted: impl Fn(NodeId) -> bool,
    ) -> Result<BTreeMap<NodeId, (Timestamp, Timestamp)>, StoreError> {
        let asked = loaded
            .lives
            .iter()
            .filter(|&(&w, &(session, _, _))| {
                wanted(w)
                    && loaded
                        .state
                        .nodes
                        .get(&w)
                        .is_some_and(|r| r.session == session)
            })
            .map(|(&w, &(_, _, lease))| async move {
                let answer = send(op, Resend::Repeatable, || {
                    let mut leases = self.client.lease_client();
                    async move { leases.time_to_live(lease, None).await }
                })
                .await?;
                let (left, granted) = (answer.ttl(), answer.granted_ttl());
                // Still live with less than a second left: it ends after now.
                let expires = if left > 0 {
                    now + chrono::TimeDelta::seconds(left)
                } else {
                    now + chrono::TimeDelta::microseconds(1)
                };
                let renewed = expires - chrono::TimeDelta::seconds(granted.max(left));
                Ok::<_, StoreError>((w, (renewed.min(now), expires)))
            });
        // One request per session, all at once: a snapshot waits for one round trip.
        Ok(futures_util::future::try_join_all(asked)
            .await?
            .into_iter()
            .collect())
    }

    /// The heartbeat: the rule run first on the groups' documents alone, and only if that
    /// cannot answer (a group changed, or the rule would write to a group) again on the whole
    /// groups. In lease mode, around the rule, the session's etcd lease is kept alive, or one
    /// is granted for a new (or taken over) session.
    ///
    /// Why the documents alone can answer: a group the rule answers unchanged (H8) is
    /// answered by its stamp, made of the document's change counter and the members'
    /// expiries and quarantine ends, never of its buckets; the stand-in buckets (see
    /// `take_group`) give ownership, loads and the drain as the pages would; and if the rule
    /// would change a group (H2, H3, the end of a drain), that group differs from what was
    /// read and the whole read is done instead. Node records are read whole either way.
    async fn beat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        let op = Operation::Heartbeat;
        let scope = Scope::Node(node, seen);
        let process = (node, incarnation);
        for _ in 0..ATTEMPTS {
            let now = self.now();
            // A lease this process holds is kept alive while the read runs: one round trip.
            // Extending it early is what the renewal below would do; if the read shows the
            // session is not this process's to renew any more (handed over and taken over),
            // its lease was moved off and revoked, and the keep-alive finds nothing.
            let early = self.renewing_lease(process);
            let (loaded, kept) = match early {
                Some(held) => {
                    let (loaded, kept) =
                        tokio::join!(self.load(op, &scope, now, false), self.keep_alive(op, held));
                    // A lease that ran out may be refused with an error rather than a ttl of
                    // 0: then the renewal below asks again, if the read says to.
                    (loaded?, kept.ok().map(|kept| (held, kept)))
                }
                None => (self.load(op, &scope, now, false).await?, None),
            };
            let mine = loaded.state.nodes.get(&node).filter(|r| r.is_live(now));
            let lease = loaded.extras.get(&node).and_then(|e| e.lease);
            // Renewal: the lease must still be there when the keep-alive reaches the leader;
            // if it is not, the session is over (read again: a new one starts).
            if let (true, Some(row), Some(lease)) = (self.leases(), mine, lease)
                && row.incarnation == incarnation
                && !row.handed_over
            {
                let alive = match kept {
                    Some((held, alive)) if held == lease => alive,
                    _ => self.keep_alive(op, lease).await?,
                };
                if !alive {
                    // Expired between the read and the keep-alive.
                    self.forget_lease(process);
                    continue;
                }
                self.remember_lease(process, lease);
            }
            let mut state = loaded.state.clone();
            let mut result = state.heartbeat(now, node, incarnation, ttl, metadata, seen);
            let quiet = result.as_ref().is_ok_and(|b| b.groups.is_empty())
                && state.groups == loaded.state.groups
                && state.outbox.is_empty();
            let loaded = if quiet {
                loaded
            } else {
                let whole = self.load(op, &scope, now, true).await?;
                state = whole.state.clone();
                result = state.heartbeat(now, node, incarnation, ttl, metadata, seen);
                whole
            };
            let beat = match result {
                Ok(beat) => beat,
                // H7: say when the other process's session ends as etcd knows it.
                Err(StoreError::NodeIdInUse { worker, expires_at }) => {
                    // The refusal matters more than the exactness of its time.
                    let told = self
                        .lease_times(op, &loaded, now, |w| w == worker)
                        .await
                        .ok()
                        .and_then(|times| times.get(&worker).map(|t| t.1));
                    return Err(StoreError::NodeIdInUse {
                        worker,
                        expires_at: told.unwrap_or(expires_at),
                    });
                }
                Err(e) => return Err(e),
            };
            // What the lease must do is decided on the read the rule last ran on (a hand-over
            // may have landed between the two reads): a session this process takes over
            // (HO3) moves to a lease of its own ttl, off the predecessor's short one.
            let before = loaded.state.nodes.get(&node);
            let takes_over = !beat.new_session
                && before.is_some_and(|r| r.handed_over || r.incarnation != incarnation);
            let old_lease = loaded.extras.get(&node).and_then(|e| e.lease);
            let mut extras = loaded.extras.clone();
            let mut lives: LivePuts = Vec::new();
            let mut granted = None;
            if self.leases() && (beat.new_session || takes_over) {
                let grant = self.grant(op, ttl).await?;
                granted = Some(grant.id());
                let rev = loaded.lives.get(&node).map_or(0, |l| l.1);
                lives.push((node, beat.session, grant.id(), rev));
                extras.insert(
                    node,
                    NodeExtra {
                        lease: Some(grant.id()),
                        ttl: Some(ttl.as_micros()),
                    },
                );
            }
            let stored = self.store(op, &loaded, &state, &extras, &lives).await;
            match (stored, granted) {
                (Ok(true), _) => {
                    if let Some(new) = granted {
                        self.remember_lease(process, new);
                    }
                    // The old lease (a handed-over session's) is not needed any more; if this
                    // fails it runs out by itself.
                    if let (true, Some(old)) = (takes_over, old_lease) {
                        self.revoke(old).await;
                    }
                    return Ok(beat);
                }
                (outcome, Some(new)) => {
                    // Not written: the lease granted for it would keep nothing alive.
                    self.revoke(new).await;
                    outcome?;
                }
                (outcome, None) => {
                    outcome?;
                }
            }
        }
        Err(lost_races(op))
    }
}

/// Whether a node's record must be written: in lease mode a live session's expiry and
/// renewal time are not stored on every heartbeat (etcd holds the expiry).
fn node_changed(before: &NodeRow, after: &NodeRow, leases: bool) -> bool {
    if leases && before.session == after.session && !after.handed_over {
        let mut a = after.clone();
        a.expires_at = before.expires_at;
        a.heartbeat_at = before.heartbeat_at;
        a != *before
    } else {
        before != after
    }
}

#[async_trait]
impl WorkerStore for EtcdLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        if shards.get() > MAX_SHARDS {
            return Err(too_large(Operation::EnsureGroup, group, shards));
        }
        self.run(Operation::EnsureGroup, Scope::Group(group), true, |s, _| {
            s.ensure_group(group, shards)
        })
        .await
    }

    async fn heartbeat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        self.beat(node, incarnation, ttl, metadata, seen).await
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        self.run(Operation::Join, Scope::Group(group), true, |s, now| {
            s.join(now, group, node, session)
        })
        .await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        // Lease mode: etcd ended every dead session by its own timers (a new leader extends
        // every lease), so a session it calls dead is one whose holder's trust ran out.
        let takeover = match (self.leases(), takeover) {
            (true, Takeover::AllowedWithin(_)) => Takeover::Allowed,
            (_, t) => t,
        };
        self.run(Operation::Claim, Scope::Group(group), true, |s, now| {
            s.claim(now, group, worker, session, want, takeover)
        })
        .await
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Release, Scope::Group(group), true, |s, now| {
            s.release(now, group, worker, session, buckets)
        })
        .await
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Leave, Scope::Group(group), true, |s, now| {
            s.leave(now, group, node, Some(session))
        })
        .await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        self.run(
            Operation::IsCurrent,
            Scope::Group(group),
            false,
            |s, now| s.is_current(now, group, bucket, worker, token),
        )
        .await
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        keep: Ttl,
    ) -> Result<Option<Timestamp>, StoreError> {
        let op = Operation::HandOver;
        if !self.leases() {
            return self
                .run(op, Scope::Node(node, &[]), true, |s, now| {
                    s.hand_over(now, node, incarnation, keep)
                })
                .await;
        }
        // Lease mode: the session's liveness key moves to a lease of `keep`.
        for _ in 0..ATTEMPTS {
            let now = self.now();
            let loaded = self.load(op, &Scope::Node(node, &[]), now, true).await?;
            let mut state = loaded.state.clone();
            let Some(expires_at) = state.hand_over(now, node, incarnation, keep)? else {
                return Ok(None);
            };
            let old = loaded.extras.get(&node).and_then(|e| e.lease);
            let grant = self.grant(op, keep).await?;
            let mut extras = loaded.extras.clone();
            extras.insert(
                node,
                NodeExtra {
                    lease: Some(grant.id()),
                    ttl: Some(keep.as_micros()),
                },
            );
            let rev = loaded.lives.get(&node).map_or(0, |l| l.1);
            let session = state.nodes.get(&node).map(|r| r.session);
            let lives: LivePuts = session
                .map(|s| vec![(node, s, grant.id(), rev)])
                .unwrap_or_default();
            match self.store(op, &loaded, &state, &extras, &lives).await {
                Ok(true) => {
                    self.forget_lease((node, incarnation));
                    if let Some(old) = old {
                        self.revoke(old).await;
                    }
                    return Ok(Some(expires_at));
                }
                outcome => {
                    self.revoke(grant.id()).await;
                    outcome?;
                }
            }
        }
        Err(lost_races(op))
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        let key = self.keys.doc(group);
        // Returns once etcd confirmed the watch: every later write is seen (W1).
        let (watcher, stream) = send(Operation::Changes, Resend::Repeatable, || {
            let mut watch = self.client.watch_client();
            let key = key.clone();
            async move { watch.watch(key, None).await }
        })
        .await?;
        let changes = futures_util::stream::unfold(Some((watcher, stream)), |open| async move {
            let (watcher, mut stream) = open?;
            match stream.message().await {
                Ok(Some(resp)) => {
                    let changes: Vec<Change> = if resp.canceled() {
                        vec![Change::Missed]
                    } else {
                        resp.events()
                            .iter()
                            .filter_map(|e| e.kv())
                            .flat_map(|kv| codec::changes_of(kv.value()))
                            .collect()
                    };
                    let next = (!resp.canceled()).then_some((watcher, stream));
                    Some((futures_util::stream::iter(changes), next))
                }
                // The watch broke: say so once; the worker re-plans and polls.
                Ok(None) | Err(_) => Some((futures_util::stream::iter(vec![Change::Missed]), None)),
            }
        })
        .flatten();
        Ok(Some(ChangeFeed::new(changes)))
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        self.run(Operation::SetWeight, Scope::Group(group), true, |s, now| {
            s.set_weight(now, group, node, session, weight)
        })
        .await
    }
}

#[async_trait]
impl AdminStore for EtcdLeaseStore {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        let op = Operation::Snapshot;
        let now = self.now();
        let loaded = self.load(op, &Scope::Group(group), now, true).await?;
        let mut snap = loaded.state.clone().snapshot(now, group)?;
        if self.leases() {
            let shown: BTreeSet<NodeId> = snap
                .members
                .iter()
                .map(|m| m.worker)
                .chain(snap.buckets.iter().filter_map(|b| b.owner))
                .chain(snap.draining.iter().filter_map(|b| b.owner))
                .collect();
            let times = self
                .lease_times(op, &loaded, now, |w| shown.contains(&w))
                .await?;
            for m in &mut snap.members {
                if let Some(&(renewed, expires)) = times.get(&m.worker) {
                    (m.heartbeat_at, m.expires_at) = (renewed, expires);
                }
            }
            for b in snap.buckets.iter_mut().chain(snap.draining.iter_mut()) {
                if let (Some(owner), Some(expires)) = (b.owner, b.expires_at.as_mut())
                    && let Some(&(_, at)) = times.get(&owner)
                {
                    *expires = at;
                }
            }
        }
        Ok(snap)
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        let op = Operation::Nodes;
        let now = self.now();
        let loaded = self.load(op, &Scope::Nodes, now, true).await?;
        let mut nodes = loaded.state.clone().nodes(now)?;
        if self.leases() {
            let times = self.lease_times(op, &loaded, now, |_| true).await?;
            for n in &mut nodes.nodes {
                if let Some(&(renewed, expires)) = times.get(&n.node) {
                    (n.heartbeat_at, n.expires_at) = (renewed, expires);
                }
            }
        }
        Ok(nodes)
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        self.run(Operation::Resize, Scope::Group(group), true, |s, now| {
            // Z1's refusals come first; only a resize that would start is too large.
            let outcome = s.resize(now, group, from, to)?;
            if to.get() > MAX_SHARDS && matches!(outcome, ResizeOutcome::Started { .. }) {
                return Err(too_large(Operation::Resize, group, to));
            }
            Ok(outcome)
        })
        .await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.run(Operation::Control, Scope::Group(group), true, |s, _| {
            s.control(group, node, control)
        })
        .await
    }

    async fn quarantine(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
    ) -> Result<(), StoreError> {
        self.run(
            Operation::Quarantine,
            Scope::Group(group),
            true,
            |s, now| s.quarantine(now, group, bucket, duration),
        )
        .await
    }

    async fn history(&self, group: &GroupName, bucket: Bucket) -> Result<Vec<Tenure>, StoreError> {
        self.run(Operation::History, Scope::Group(group), false, |s, _| {
            s.history(group, bucket)
        })
        .await
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        self.run(Operation::Evict, Scope::Group(group), true, |s, now| {
            s.leave(now, group, node, None)
        })
        .await
    }
}

#[cfg(test)]
mod resending {
    use super::*;

    fn unavailable(message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::unavailable(message))
    }

    #[test]
    fn writes_are_sent_again_only_when_nothing_was_applied() {
        let w = Resend::IfUnapplied;
        assert_eq!(
            resend(&unavailable("tcp connect error"), w, 0),
            Some(Duration::ZERO)
        );
        assert!(resend(&unavailable("etcdserver: no leader"), w, 0).is_some());
        // Proposed, then the leader changed or the connection was lost: it may have been
        // applied.
        let lost = "etcdserver: request timed out, possibly due to connection lost";
        assert_eq!(resend(&unavailable(lost), w, 0), None);
        assert_eq!(
            resend(&unavailable("etcdserver: leader changed"), w, 0),
            None
        );
        let timeout = etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("x"));
        assert_eq!(resend(&timeout, w, 0), None);
    }

    #[test]
    fn reads_are_sent_again_whenever_a_member_was_unavailable_with_a_growing_wait() {
        let r = Resend::Repeatable;
        let changed = unavailable("etcdserver: leader changed");
        assert_eq!(resend(&changed, r, 0), Some(Duration::from_millis(25)));
        assert_eq!(resend(&changed, r, 2), Some(Duration::from_millis(100)));
        assert_eq!(resend(&changed, r, 9), Some(Duration::from_millis(400)));
        let denied = etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("x"));
        assert_eq!(resend(&denied, r, 0), None);
    }
}

/// The compare rules, each as a deterministic race: one operation reads, another writes, then
/// the first writes what it decided. Each test fails when its compare is removed.
#[cfg(test)]
mod races;
