//! The read, rule, write loop every operation runs: one read of what the operation needs
//! as of one revision ([`EtcdLeaseStore::load`]), the rule on the decoded [`State`], and one
//! transaction that writes what changed on condition that what was read is unchanged
//! ([`EtcdLeaseStore::store`]), again while another process wins the race.

use std::collections::{BTreeMap, BTreeSet};

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use lease_core::{Change, GroupName, NodeId, Operation, SessionId, StoreError, Timestamp};
use lease_rules::{BucketRow, GroupState, NodeRow, State};

use super::send::Resend;
use super::{
    ATTEMPTS, EtcdLeaseStore, LivePuts, Loaded, MAX_SHARDS, PAGE_ROWS, REMOVALS_PER_WRITE, Scope,
    corrupt, lost_races, too_large,
};
use crate::codec::{self, NodeExtra};
use crate::keys::range_end;

impl EtcdLeaseStore {
    /// Read what `scope` needs, as of one revision: with `pages` false, the groups'
    /// documents only (their buckets read as unowned: see `beat`).
    pub(super) async fn load(
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
    pub(super) fn judge_liveness(&self, loaded: &mut Loaded, now: Timestamp) {
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

    pub(super) fn take_group(
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
    pub(super) async fn store(
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
    pub(super) fn page_writes(
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
    pub(super) async fn run<T>(
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
