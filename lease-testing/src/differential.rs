//! Differential property testing: the same random operation sequence runs on the reference
//! [`Model`] and on every store under test, in lockstep, comparing every result and checking
//! the invariants after every step.
//!
//! A backend plugs in with a [`StoreFactory`] and proptest-state-machine's macro:
//!
//! ```ignore
//! struct Memory;
//! impl StoreFactory for Memory {
//!     fn stores(_rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
//!         vec![("memory".into(), Box::new(MemoryLeaseStore::with_clock(clock.clone())))]
//!     }
//! }
//! proptest_state_machine::prop_state_machine! {
//!     #![proptest_config(lease_testing::differential::config(64))]
//!     #[test]
//!     fn memory_matches_the_model(sequential 1..40 => Differential<Memory>);
//! }
//! ```
//!
//! The generator aims at the states where stores go wrong: both groups exist from the start
//! (with a generated shard count each), buckets are drawn below the shard count (now and then
//! one past it), tokens among those already issued, and a [`Op::Tick`] (a heartbeat, then a
//! claim under the session it returned, as the worker runtime does) is the most frequent
//! operation. Each node id is run by up to [`PROCESSES`] processes ([`Incarnation`]s), so a
//! second process with the same node id is exercised too. [`Reach`] counts how often a
//! sequence gets to each risky state; `the_generator_reaches_the_risky_states` in
//! `lease-memory` holds it to a floor.
//!
//! Checked after every step, on every store:
//! - every result equals the model's, errors included with all their fields (session ids
//!   compared by order of appearance);
//! - no bucket is believed held by two processes at once: each process's leases, as the
//!   results of its own calls told it, are disjoint from every other process's until they
//!   expire;
//! - fencing tokens never decrease, and each claim returns a token above every one seen;
//! - across resizes ([`Op::Resize`]), per key (hashes `0..KEYS`, routed by
//!   [`ShardCount::bucket_of`]): no key lies in buckets of either generation held by two live
//!   processes (as they believe) or two live sessions (as the store's snapshot says), and
//!   every claim of a bucket returns a token above every token seen for each of its keys;
//! - every recorded owner is one of the workers of the test, and every live lease is known to
//!   exactly the process that holds it, with its token.
//! - after an operation that can begin or end a tenure, every bucket's history in its group
//!   equals the model's (T1-T4).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::runtime::Runtime;
use uuid::Uuid;

mod reach;
pub use reach::{REACH_CASES, REACH_SEED, Reached, reach_of_seed, reach_table, run};

use crate::model::{Model, ModelStore};
use futures_util::FutureExt;
use lease_core::LeaseStore;
use lease_core::StoreError;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionId, ShardCount,
    Takeover,
};
use lease_core::{
    BucketState, GroupBeat, GroupSnapshot, GroupStamp, Heartbeat, Lease, NodesSnapshot,
    ResizeOutcome, ViewStamp,
};
use lease_core::{Clock, ManualClock, Timestamp, Ttl};
use lease_core::{EndReason, MemberControl, MemberMode, QuarantineFor, Tenure, Weight};

/// The groups operations pick from: a plain name and one full of quotes and SQL.
pub const GROUPS: [&str; 2] = ["orders", "it's \"odd\"; DROP TABLE lease.shards; --"];

/// How many workers operations pick from.
pub const WORKERS: usize = 3;

/// How many processes may run each node id (process 0 is the usual one; process 1 is a
/// second process started with the same id).
pub const PROCESSES: usize = 2;

/// The shard counts groups are created with.
const SHARD_COUNTS: [u32; 5] = [1, 2, 3, 5, 8];

/// The shard counts resizes go to: splits, merges, and counts sharing no factor.
const RESIZE_COUNTS: [u32; 7] = [1, 2, 3, 4, 5, 6, 8];

/// The key hashes the per-key checks look at: `0..KEYS` covers every pair of buckets of any
/// two of the shard counts groups are created and resized with (a multiple of their lcm, 120).
pub const KEYS: u64 = 120;

/// The group named by index `i` of [`GROUPS`].
pub fn group(i: usize) -> GroupName {
    GroupName::new(GROUPS[i % GROUPS.len()]).expect("the test group names are valid")
}

/// The index in [`GROUPS`] of a group's name.
fn group_index(name: &GroupName) -> usize {
    GROUPS
        .iter()
        .position(|g| *g == name.as_str())
        .expect("only the test's groups exist")
}

/// Worker `i` of the test: fixed ids, so runs are repeatable.
pub fn worker(i: usize) -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(0xA000 + i as u128))
}

/// Process `p` of worker `w`: fixed ids, so runs are repeatable.
pub fn incarnation(w: usize, p: usize) -> Incarnation {
    Incarnation::from_uuid(Uuid::from_u128(0xB000 + (w * PROCESSES + p) as u128))
}

/// One operation of a sequence. `process` picks which process of the node id acts; joins,
/// claims, releases and leaves name the session that process last got from a heartbeat (a
/// never-used id if it has none), as a real process would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `ensure_group(group, shards)`: both groups exist already, so this checks E2 or E3.
    Ensure {
        /// Index into [`GROUPS`].
        group: usize,
        /// Shard count.
        shards: u32,
    },
    /// `heartbeat(worker, incarnation, ttl, seen)`, handing in the stamps of the views the
    /// process was last given.
    Heartbeat {
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Ttl in milliseconds.
        ttl_ms: u64,
    },
    /// `join(group, worker, session)`.
    Join {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
    },
    /// `nodes()`.
    Nodes,
    /// A node's tick in one group: a heartbeat, a join if the heartbeat does not list the
    /// group, then, if those succeeded, a claim of `want` under the session.
    Tick {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Ttl in milliseconds.
        ttl_ms: u64,
        /// How many to claim.
        want: u32,
    },
    /// `claim(group, worker, session, want, takeover)`.
    Claim {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// How many to claim.
        want: u32,
        /// Which claimable buckets it may take (C7).
        takeover: Takeover,
    },
    /// `release(group, worker, session, buckets)`.
    Release {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Buckets (some may be out of range).
        buckets: Vec<u32>,
    },
    /// `leave(group, worker, session)`: the session of `process`, or any session (an
    /// operator's eviction) when `None`.
    Leave {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index, `None` for an eviction.
        process: Option<usize>,
    },
    /// `snapshot(group)`.
    Snapshot {
        /// Index into [`GROUPS`].
        group: usize,
    },
    /// `is_current(group, bucket, worker, token)`.
    IsCurrent {
        /// Index into [`GROUPS`].
        group: usize,
        /// Bucket.
        bucket: u32,
        /// Worker index.
        worker: usize,
        /// Token.
        token: i64,
    },
    /// `resize(group, from, to)`.
    Resize {
        /// Index into [`GROUPS`].
        group: usize,
        /// The count the caller believes the group has.
        from: u32,
        /// The new count.
        to: u32,
    },
    /// Move the shared clock forward.
    Advance {
        /// Milliseconds.
        ms: u64,
    },
    /// `control(group, worker, control)`: a weight (`Some`) or a mode.
    Control {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// The weight to set, or `None` to set `mode`.
        weight: Option<u32>,
        /// The mode to set when `weight` is `None`.
        mode: MemberMode,
    },
    /// `hand_over(worker, incarnation, keep)`: the process stops, keeping its session for a
    /// successor for `keep_ms`.
    HandOver {
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// How long the session is kept, in milliseconds.
        keep_ms: u64,
    },
    /// `quarantine(group, bucket, duration)`: for `ms` milliseconds, or lift (`None`).
    Quarantine {
        /// Index into [`GROUPS`].
        group: usize,
        /// Bucket (now and then one past the count).
        bucket: u32,
        /// Milliseconds, `None` to lift.
        ms: Option<u64>,
    },
    /// `history(group, bucket)`.
    History {
        /// Index into [`GROUPS`].
        group: usize,
        /// Bucket (now and then one past the count).
        bucket: u32,
    },
}

impl Op {
    /// The control a [`Op::Control`] sets.
    fn member_control(weight: Option<u32>, mode: MemberMode) -> MemberControl {
        match weight.map(Weight::new) {
            Some(Ok(w)) => MemberControl::Weight(w),
            _ => MemberControl::Mode(mode),
        }
    }

    /// The duration a [`Op::Quarantine`] sets.
    fn quarantine_for(ms: Option<u64>) -> Option<QuarantineFor> {
        ms.and_then(|ms| QuarantineFor::new(Duration::from_millis(ms)).ok())
    }
}

/// The result of one operation, in a form two stores can be compared by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The operation succeeded with nothing to report (ensure, advance).
    Done,
    /// A heartbeat's result, every group's view given (stamps cleared: they are the store's).
    Heartbeat(Heartbeat),
    /// A tick: the heartbeat's outcome, the join's if one was made, and the claim's if the
    /// node got that far.
    Tick(Box<Outcome>, Option<Box<Outcome>>, Option<Box<Outcome>>),
    /// A listing of the nodes.
    Nodes(NodesSnapshot),
    /// A claim's leases.
    Leases(Vec<Lease>),
    /// Released buckets.
    Buckets(Vec<Bucket>),
    /// A snapshot.
    Snapshot(GroupSnapshot),
    /// A fencing check.
    Bool(bool),
    /// A resize's outcome.
    Resized(ResizeOutcome),
    /// A hand-over's outcome: the session's new expiry, if it was handed over.
    HandedOver(Option<Timestamp>),
    /// A bucket's history.
    History(Vec<Tenure>),
    /// A failure, with every field: the error as it displays (a contract error shows all its
    /// fields, so two stores agree on it only if they agree on each).
    Failed(String),
}

/// Renames session ids to their order of first appearance, so two stores that mint different
/// ids can be compared.
#[derive(Clone, Debug, Default)]
pub struct SessionNames(HashMap<SessionId, u128>);

impl SessionNames {
    fn name(&mut self, s: &mut SessionId) {
        let next = self.0.len() as u128 + 1;
        let n = *self.0.entry(*s).or_insert(next);
        *s = SessionId::from_uuid(Uuid::from_u128(n));
    }

    /// Rewrite every session id in `outcome`.
    pub fn normalize(&mut self, outcome: &mut Outcome) {
        match outcome {
            Outcome::Heartbeat(hb) => self.name(&mut hb.session),
            Outcome::Tick(beat, join, claim) => {
                self.normalize(beat);
                for part in [join, claim].into_iter().flatten() {
                    self.normalize(part);
                }
            }
            Outcome::Nodes(listing) => {
                for n in &mut listing.nodes {
                    self.name(&mut n.session);
                }
            }
            Outcome::Snapshot(snap) => {
                for m in &mut snap.members {
                    self.name(&mut m.session);
                }
                for b in snap.buckets.iter_mut().chain(&mut snap.draining) {
                    if let Some(s) = &mut b.session {
                        self.name(s);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The session each process last got from a heartbeat: what it names in joins, claims,
/// releases and leaves.
#[derive(Clone, Debug, Default)]
pub struct Sessions(BTreeMap<(usize, usize), SessionId>);

impl Sessions {
    /// The session of `process` of `worker`, or a never-used id if it has none.
    fn of(&self, worker: usize, process: usize) -> SessionId {
        self.0
            .get(&(worker, process))
            .copied()
            .unwrap_or_else(|| SessionId::from_uuid(Uuid::nil()))
    }

    fn learn(&mut self, worker: usize, process: usize, session: SessionId) {
        self.0.insert((worker, process), session);
    }

    /// The process handed its session over (HO1): it makes no more calls under it.
    fn forget(&mut self, worker: usize, process: usize) {
        self.0.remove(&(worker, process));
    }
}

/// The views each process was last given, per group, with their stamps: handed in with its
/// next heartbeat, and what an `unchanged` answer stands for.
#[derive(Clone, Debug, Default)]
pub struct Views(BTreeMap<(usize, usize), BTreeMap<GroupName, GroupBeat>>);

impl Views {
    /// The stamps `process` of `worker` hands in.
    fn seen(&self, worker: usize, process: usize) -> Vec<GroupStamp> {
        self.0
            .get(&(worker, process))
            .map(|views| {
                views
                    .values()
                    .map(|v| GroupStamp {
                        group: v.group.clone(),
                        stamp: v.stamp,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Make `hb` whole: each group answered unchanged gets the view last given (its leases
    /// now expiring with the session); remember every view given. Stamps are then cleared,
    /// as they are the store's own. Panics on an `unchanged` for a view never given.
    fn expand(&mut self, worker: usize, process: usize, hb: &mut Heartbeat) {
        let views = self.0.entry((worker, process)).or_default();
        if hb.new_session {
            views.clear();
        }
        let mut whole: BTreeMap<GroupName, GroupBeat> = BTreeMap::new();
        for given in &hb.groups {
            whole.insert(given.group.clone(), given.clone());
        }
        for u in &hb.unchanged {
            let mut last = views.get(&u.group).cloned().unwrap_or_else(|| {
                panic!("{:?} answered unchanged but never given before", u.group)
            });
            for l in &mut last.owned {
                l.expires_at = hb.expires_at;
            }
            last.stamp = u.stamp;
            whole.insert(u.group.clone(), last);
        }
        *views = whole.clone();
        hb.groups = whole
            .into_values()
            .map(|mut g| {
                g.stamp = ViewStamp::default();
                g
            })
            .collect();
        hb.unchanged.clear();
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).expect("generated ttls are valid")
}

fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("generated shard counts are valid")
}

fn failed(e: &StoreError) -> Outcome {
    Outcome::Failed(format!("{:?}: {e}", e.kind()))
}

fn outcome<T>(r: Result<T, StoreError>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => failed(&e),
    }
}

/// Apply `op` to a store (clock moves are the caller's business); `sessions` and `views` are
/// the processes' memory of their sessions and views on this store. A heartbeat's outcome is
/// made whole: each group answered unchanged counts as the view [`Views`] last recorded for
/// that process, so a wrong "unchanged" differs from the model.
pub async fn apply_to_store(
    store: &dyn LeaseStore,
    sessions: &mut Sessions,
    views: &mut Views,
    op: &Op,
) -> Outcome {
    let meta = MemberMetadata::empty();
    match *op {
        Op::Ensure {
            group: g,
            shards: n,
        } => outcome(store.ensure_group(&group(g), shards(n)).await, |()| {
            Outcome::Done
        }),
        Op::Heartbeat {
            worker: w,
            process: p,
            ttl_ms,
        } => {
            let seen = views.seen(w, p);
            let mut r = store
                .heartbeat(worker(w), incarnation(w, p), ttl(ttl_ms), &meta, &seen)
                .await;
            if let Ok(hb) = &mut r {
                sessions.learn(w, p, hb.session);
                views.expand(w, p, hb);
            }
            outcome(r, Outcome::Heartbeat)
        }
        Op::Join {
            group: g,
            worker: w,
            process: p,
        } => outcome(
            store.join(&group(g), worker(w), sessions.of(w, p)).await,
            |()| Outcome::Done,
        ),
        Op::Nodes => outcome(store.nodes().await, Outcome::Nodes),
        Op::Tick {
            group: g,
            worker: w,
            process: p,
            ttl_ms,
            want,
        } => {
            let beat = Box::pin(apply_to_store(
                store,
                sessions,
                views,
                &Op::Heartbeat {
                    worker: w,
                    process: p,
                    ttl_ms,
                },
            ))
            .await;
            let join = match &beat {
                Outcome::Heartbeat(hb) if !hb.is_member(&group(g)) => Some(Box::new(
                    Box::pin(apply_to_store(
                        store,
                        sessions,
                        views,
                        &Op::Join {
                            group: g,
                            worker: w,
                            process: p,
                        },
                    ))
                    .await,
                )),
                _ => None,
            };
            let joined = matches!(beat, Outcome::Heartbeat(_))
                && join.as_deref().is_none_or(|j| *j == Outcome::Done);
            let claim = if joined {
                let session = sessions.of(w, p);
                Some(Box::new(outcome(
                    store
                        .claim(&group(g), worker(w), session, want, Takeover::Allowed)
                        .await,
                    Outcome::Leases,
                )))
            } else {
                None
            };
            Outcome::Tick(Box::new(beat), join, claim)
        }
        Op::Claim {
            group: g,
            worker: w,
            process: p,
            want,
            takeover,
        } => outcome(
            store
                .claim(&group(g), worker(w), sessions.of(w, p), want, takeover)
                .await,
            Outcome::Leases,
        ),
        Op::Release {
            group: g,
            worker: w,
            process: p,
            ref buckets,
        } => {
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            outcome(
                store
                    .release(&group(g), worker(w), sessions.of(w, p), &bs)
                    .await,
                Outcome::Buckets,
            )
        }
        Op::Leave {
            group: g,
            worker: w,
            process,
        } => {
            let left = match process.map(|p| sessions.of(w, p)) {
                Some(session) => store.leave(&group(g), worker(w), session).await,
                None => store.evict(&group(g), worker(w)).await,
            };
            outcome(left, Outcome::Buckets)
        }
        Op::Snapshot { group: g } => outcome(store.snapshot(&group(g)).await, Outcome::Snapshot),
        Op::IsCurrent {
            group: g,
            bucket,
            worker: w,
            token,
        } => outcome(
            store
                .is_current(&group(g), Bucket(bucket), worker(w), FencingToken(token))
                .await,
            Outcome::Bool,
        ),
        Op::Resize { group: g, from, to } => outcome(
            store.resize(&group(g), shards(from), shards(to)).await,
            Outcome::Resized,
        ),
        Op::Advance { .. } => Outcome::Done,
        Op::Control {
            group: g,
            worker: w,
            weight,
            mode,
        } => outcome(
            store
                .control(&group(g), worker(w), Op::member_control(weight, mode))
                .await,
            |()| Outcome::Done,
        ),
        Op::Quarantine {
            group: g,
            bucket,
            ms,
        } => outcome(
            store
                .quarantine(&group(g), Bucket(bucket), Op::quarantine_for(ms))
                .await,
            |()| Outcome::Done,
        ),
        Op::History { group: g, bucket } => outcome(
            store.history(&group(g), Bucket(bucket)).await,
            Outcome::History,
        ),
        Op::HandOver {
            worker: w,
            process: p,
            keep_ms,
        } => {
            let r = store
                .hand_over(worker(w), incarnation(w, p), ttl(keep_ms))
                .await;
            if matches!(r, Ok(Some(_))) {
                sessions.forget(w, p);
            }
            outcome(r, Outcome::HandedOver)
        }
    }
}

/// A process to act: process 0 four times in five, so most sequences are about sessions that
/// live and die, and a second process of one node id shows up in many of them.
fn process() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize)]
}

/// Claim scopes: mostly allowed, some deferred, some bounded by how far the store's clock
/// moved since the claimer's renewal (the generated clock moves make both outcomes happen).
fn takeovers() -> impl Strategy<Value = Takeover> {
    prop_oneof![
        5 => Just(Takeover::Allowed),
        2 => Just(Takeover::Deferred),
        2 => (0u64..4_000).prop_map(|ms| Takeover::AllowedWithin(Duration::from_millis(ms))),
    ]
}

/// A strategy for one operation in `state`: buckets below the shard count of the group they
/// name (now and then one past it), tokens among those issued.
pub fn op_strategy(state: &Reference) -> BoxedStrategy<Op> {
    let g = 0..GROUPS.len();
    let w = 0..WORKERS;
    let counts = state.shard_counts;
    let issued: Vec<(usize, u32, i64, usize)> = state.issued.clone();
    // Controls half the time name a worker that was issued a lease in the group, so that a
    // drained worker's releases (T2: `drained`) happen.
    let controlled = if issued.is_empty() {
        (g.clone(), w.clone()).boxed()
    } else {
        prop_oneof![
            1 => (g.clone(), w.clone()),
            1 => prop::sample::select(issued.clone()).prop_map(|(group, _, _, owner)| (group, owner)),
        ]
        .boxed()
    };
    let ttls = prop::sample::select(vec![1_000u64, 3_000]);
    let bucket_in = move |group: usize| {
        let n = counts[group];
        prop_oneof![9 => 0..n, 1 => Just(n)]
    };
    let buckets = (g.clone())
        .prop_flat_map(move |group| (Just(group), prop::collection::vec(bucket_in(group), 0..4)));
    // Fencing checks and releases mostly name a lease some claim issued (to the worker it was
    // issued to, with its token, or one below), so that they can succeed.
    let (is_current, owned_release) = if issued.is_empty() {
        let check = (g.clone(), 0u32..9, w.clone(), 0i64..3)
            .prop_map(|(group, bucket, worker, token)| Op::IsCurrent {
                group,
                bucket,
                worker,
                token,
            })
            .boxed();
        (check.clone(), check)
    } else {
        let check = (
            prop::sample::select(issued.clone()),
            prop_oneof![3 => Just(None), 1 => w.clone().prop_map(Some)],
            prop_oneof![3 => Just(0i64), 1 => Just(-1i64)],
        )
            .prop_map(
                |((group, bucket, token, owner), other, delta)| Op::IsCurrent {
                    group,
                    bucket,
                    worker: other.unwrap_or(owner),
                    token: token + delta,
                },
            )
            .boxed();
        let release = (prop::sample::select(issued), process(), 0u32..3)
            .prop_map(|((group, bucket, _, worker), process, extra)| Op::Release {
                group,
                worker,
                process,
                buckets: (0..=extra).map(|k| bucket + k).collect(),
            })
            .boxed();
        (check, release)
    };
    prop_oneof![
        1 => (g.clone(), prop::sample::select(SHARD_COUNTS.to_vec()))
            .prop_map(|(group, shards)| Op::Ensure { group, shards }),
        3 => (w.clone(), process(), ttls.clone())
            .prop_map(|(worker, process, ttl_ms)| Op::Heartbeat { worker, process, ttl_ms }),
        2 => (g.clone(), w.clone(), process())
            .prop_map(|(group, worker, process)| Op::Join { group, worker, process }),
        1 => Just(Op::Nodes),
        8 => (prop_oneof![3 => Just(0usize), 1 => Just(1usize)], w.clone(), process(), ttls, 1u32..6)
            .prop_map(|(group, worker, process, ttl_ms, want)| Op::Tick { group, worker, process, ttl_ms, want }),
        2 => (g.clone(), w.clone(), process(), 0u32..6, takeovers())
            .prop_map(|(group, worker, process, want, takeover)| Op::Claim { group, worker, process, want, takeover }),
        1 => (buckets, w.clone(), process())
            .prop_map(|((group, buckets), worker, process)| Op::Release { group, worker, process, buckets }),
        3 => owned_release,
        2 => (g.clone(), w.clone(), prop_oneof![3 => process().prop_map(Some), 1 => Just(None)])
            .prop_map(|(group, worker, process)| Op::Leave { group, worker, process }),
        1 => g.clone().prop_map(|group| Op::Snapshot { group }),
        3 => is_current,
        3 => prop::sample::select(vec![1u64, 500, 1_000, 2_999, 3_000, 7_000])
            .prop_map(|ms| Op::Advance { ms }),
        2 => (controlled, prop_oneof![2 => (0u32..4).prop_map(Some), 3 => Just(None)],
              prop::sample::select(vec![MemberMode::Active, MemberMode::Cordoned, MemberMode::Draining]))
            .prop_map(|((group, worker), weight, mode)| Op::Control { group, worker, weight, mode }),
        2 => (g.clone().prop_flat_map(move |group| (Just(group), bucket_in(group))),
              prop_oneof![3 => prop::sample::select(vec![500u64, 3_000]).prop_map(Some), 1 => Just(None)])
            .prop_map(|((group, bucket), ms)| Op::Quarantine { group, bucket, ms }),
        2 => g.clone().prop_flat_map(move |group| (Just(group), bucket_in(group)))
            .prop_map(|(group, bucket)| Op::History { group, bucket }),
        1 => (w.clone(), process(), prop::sample::select(vec![1_000u64, 3_000]))
            .prop_map(|(worker, process, keep_ms)| Op::HandOver { worker, process, keep_ms }),
        // Mostly from the group's count (a resize that can start), now and then from another.
        3 => (g.clone(), prop::bool::weighted(0.85), prop::sample::select(RESIZE_COUNTS.to_vec()), prop::sample::select(RESIZE_COUNTS.to_vec()))
            .prop_map(move |(group, current, other, to)| Op::Resize {
                group,
                from: if current { counts[group] } else { other },
                to,
            }),
    ]
    .boxed()
}

/// Which risky states a sequence reached: each field counts the operations that got there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reach {
    /// A claim won a bucket another worker held under a session now dead.
    pub takeover: u32,
    /// A claim won back a bucket the same worker held under an older, dead session.
    pub reclaim: u32,
    /// A release released something.
    pub release: u32,
    /// A fencing check answered true.
    pub is_current: u32,
    /// A heartbeat was refused because another process holds the node id's session.
    pub in_use: u32,
    /// A claim named a session that is not live (expired or replaced).
    pub stale_claim: u32,
    /// An operator's eviction removed a member.
    pub evicted: u32,
    /// A resize opened a generation while an old bucket was owned live (so it drains).
    pub resize: u32,
    /// A claim won a bucket of a generation whose predecessor was still draining.
    pub drain_claim: u32,
    /// A heartbeat renewed a node that is a member of both groups.
    pub two_groups: u32,
    /// A node left one group while staying a member of the other.
    pub leave_one: u32,
    /// A claim by a live member an operator had cordoned or drained (C11).
    pub cordoned_claim: u32,
    /// A claim while a bucket of the group was under quarantine (C10).
    pub quarantine_claim: u32,
    /// A heartbeat took over a session another process handed over (HO3).
    pub taken_over: u32,
    /// A history showed a tenure that ended otherwise than by a plain release (T2).
    pub history_ends: u32,
    /// A release released a bucket of a member an operator had draining (T2: `drained`).
    pub drained_release: u32,
}

impl Reach {
    /// The names and counts, in a fixed order.
    pub fn fields(&self) -> [(&'static str, u32); 16] {
        [
            (
                "claim takes over another worker's dead lease",
                self.takeover,
            ),
            ("claim takes back its own dead lease", self.reclaim),
            ("release releases something", self.release),
            ("is_current answers true", self.is_current),
            ("heartbeat refused: node id in use", self.in_use),
            ("claim under a dead or replaced session", self.stale_claim),
            ("eviction removes a member", self.evicted),
            ("resize with live owners to drain", self.resize),
            ("claim while a drain runs", self.drain_claim),
            ("heartbeat of a node in both groups", self.two_groups),
            ("leave one group, keep the other", self.leave_one),
            (
                "claim by a cordoned or draining member",
                self.cordoned_claim,
            ),
            (
                "claim while a bucket is under quarantine",
                self.quarantine_claim,
            ),
            (
                "heartbeat takes over a handed-over session",
                self.taken_over,
            ),
            (
                "history shows an end other than a release",
                self.history_ends,
            ),
            ("release by a draining member", self.drained_release),
        ]
    }

    fn count(&mut self, before: &Model, op: &Op, out: &Outcome, now: Timestamp) {
        match (op, out) {
            (
                Op::Tick {
                    group, worker: w, ..
                },
                Outcome::Tick(_, _, Some(claim)),
            ) => {
                self.count_claim(before, *group, *w, claim, now);
            }
            (
                Op::Claim {
                    group, worker: w, ..
                },
                claim,
            ) => {
                self.count_claim(before, *group, *w, claim, now);
            }
            (Op::Release { group: g, .. }, Outcome::Buckets(b)) if !b.is_empty() => {
                self.release += 1;
                let draining = before.snapshot(&group(*g), now).is_ok_and(|s| {
                    s.members.iter().any(|m| {
                        m.worker == worker(op_worker(op)) && m.mode == MemberMode::Draining
                    })
                });
                if draining {
                    self.drained_release += 1;
                }
            }
            (Op::Resize { group: g, .. }, Outcome::Resized(ResizeOutcome::Started { .. }))
                if before
                    .snapshot(&group(*g), now)
                    .is_ok_and(|s| !s.live_leases().is_empty()) =>
            {
                self.resize += 1;
            }
            (Op::IsCurrent { .. }, Outcome::Bool(true)) => self.is_current += 1,
            (Op::History { .. }, Outcome::History(h))
                if h.iter()
                    .any(|t| t.ended.is_some_and(|e| e.reason != EndReason::Released)) =>
            {
                self.history_ends += 1;
            }
            (Op::Heartbeat { worker: w, .. }, Outcome::Heartbeat(hb))
                if !hb.new_session
                    && before
                        .nodes(now)
                        .nodes
                        .iter()
                        .any(|n| n.node == worker(*w) && n.handed_over && n.live) =>
            {
                self.taken_over += 1;
            }
            (Op::Heartbeat { .. }, Outcome::Heartbeat(hb)) if hb.groups.len() == GROUPS.len() => {
                self.two_groups += 1;
            }
            (Op::Tick { .. }, Outcome::Tick(beat, _, _)) if matches!(&**beat, Outcome::Heartbeat(hb) if hb.groups.len() == GROUPS.len()) =>
            {
                self.two_groups += 1;
            }
            (Op::Leave { group: g, .. }, Outcome::Buckets(_))
                if (0..GROUPS.len()).filter(|&i| i != *g).any(|other| {
                    before
                        .snapshot(&group(other), now)
                        .is_ok_and(|s| s.members.iter().any(|m| m.worker == worker(op_worker(op))))
                }) && before
                    .snapshot(&group(*g), now)
                    .is_ok_and(|s| s.members.iter().any(|m| m.worker == worker(op_worker(op)))) =>
            {
                self.leave_one += 1;
            }
            (Op::Leave { process: None, .. }, Outcome::Buckets(_)) => {
                let member = |m: &Model| {
                    m.snapshot(&group(op_group(op)), now)
                        .is_ok_and(|s| s.members.iter().any(|x| x.worker == worker(op_worker(op))))
                };
                if member(before) {
                    self.evicted += 1;
                }
            }
            _ => {}
        }
        let refused = match out {
            Outcome::Failed(e) => Some(e),
            Outcome::Tick(beat, _, None) => match &**beat {
                Outcome::Failed(e) => Some(e),
                _ => None,
            },
            _ => None,
        };
        if refused.is_some_and(|e| e.starts_with("NodeIdInUse")) {
            self.in_use += 1;
        }
    }

    fn count_claim(&mut self, before: &Model, g: usize, w: usize, claim: &Outcome, now: Timestamp) {
        match claim {
            Outcome::Leases(won) => {
                let Ok(snap) = before.snapshot(&group(g), now) else {
                    return;
                };
                if snap
                    .members
                    .iter()
                    .any(|m| m.worker == worker(w) && m.live && m.mode != MemberMode::Active)
                {
                    self.cordoned_claim += 1;
                }
                if snap.buckets.iter().any(|b| b.quarantined_until.is_some()) {
                    self.quarantine_claim += 1;
                }
                if !won.is_empty() && !snap.draining.is_empty() {
                    self.drain_claim += 1;
                }
                for lease in won {
                    let prior = &snap.buckets[lease.bucket.0 as usize];
                    match prior.owner {
                        Some(o) if prior.state != BucketState::Live && o == worker(w) => {
                            self.reclaim += 1;
                        }
                        Some(_) if prior.state != BucketState::Live => self.takeover += 1,
                        _ => {}
                    }
                }
            }
            Outcome::Failed(e) if e.starts_with("SessionExpired") => self.stale_claim += 1,
            _ => {}
        }
    }
}

fn op_group(op: &Op) -> usize {
    match *op {
        Op::Ensure { group, .. }
        | Op::Join { group, .. }
        | Op::Tick { group, .. }
        | Op::Claim { group, .. }
        | Op::Release { group, .. }
        | Op::Leave { group, .. }
        | Op::Snapshot { group }
        | Op::IsCurrent { group, .. }
        | Op::Resize { group, .. }
        | Op::Control { group, .. }
        | Op::Quarantine { group, .. }
        | Op::History { group, .. } => group,
        Op::Advance { .. } | Op::Heartbeat { .. } | Op::Nodes | Op::HandOver { .. } => 0,
    }
}

fn op_worker(op: &Op) -> usize {
    match *op {
        Op::Heartbeat { worker, .. }
        | Op::Join { worker, .. }
        | Op::Tick { worker, .. }
        | Op::Claim { worker, .. }
        | Op::Release { worker, .. }
        | Op::Leave { worker, .. }
        | Op::IsCurrent { worker, .. } => worker,
        _ => 0,
    }
}

/// The reference side: the model (with its clock) and the outcome of the last operation.
#[derive(Clone)]
pub struct Reference {
    /// The model, as a store, at its clock's time.
    pub model: ModelStore,
    /// The shard count of each group of [`GROUPS`], created before the first operation.
    pub shard_counts: [u32; 2],
    /// The last operation's outcome, normalized.
    pub last: Option<Outcome>,
    /// The risky states the sequence reached so far.
    pub reach: Reach,
    /// Every `(group, bucket, token, worker)` a claim has issued.
    issued: Vec<(usize, u32, i64, usize)>,
    sessions: Sessions,
    views: Views,
    names: SessionNames,
}

impl Reference {
    /// The model's time.
    pub fn now(&self) -> Timestamp {
        self.model.clock().now()
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shrunk failures print the op sequence; the model's internals would only bury it.
        f.debug_struct("Reference")
            .field("now", &self.now())
            .field("shard_counts", &self.shard_counts)
            .finish()
    }
}

/// The leases an outcome says a claim won.
fn won(out: &Outcome) -> &[Lease] {
    match out {
        Outcome::Leases(won) => won,
        Outcome::Tick(_, _, Some(claim)) => won(claim),
        _ => &[],
    }
}

/// The reference state machine of the differential test.
pub struct ReferenceModel;

impl ReferenceStateMachine for ReferenceModel {
    type State = Reference;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Reference> {
        let count = prop::sample::select(SHARD_COUNTS.to_vec());
        (count.clone(), count)
            .prop_map(|(a, b)| {
                let mut model = Model::new();
                for (i, n) in [a, b].into_iter().enumerate() {
                    model
                        .ensure_group(&group(i), shards(n))
                        .expect("a new group is created");
                }
                Reference {
                    model: ModelStore::new(model, ManualClock::new()),
                    shard_counts: [a, b],
                    last: None,
                    reach: Reach::default(),
                    issued: Vec::new(),
                    sessions: Sessions::default(),
                    views: Views::default(),
                    names: SessionNames::default(),
                }
            })
            .boxed()
    }

    fn transitions(state: &Reference) -> BoxedStrategy<Op> {
        op_strategy(state)
    }

    fn apply(mut state: Reference, op: &Op) -> Reference {
        if let Op::Advance { ms } = op {
            state.model.clock().advance(Duration::from_millis(*ms));
        }
        let before = state.model.model();
        let mut out = apply_to_store(&state.model, &mut state.sessions, &mut state.views, op)
            .now_or_never()
            .expect("the model answers at once");
        state.reach.count(&before, op, &out, state.now());
        if let (Op::Resize { group, to, .. }, Outcome::Resized(ResizeOutcome::Started { .. })) =
            (op, &out)
        {
            state.shard_counts[*group] = *to;
        }
        if let Op::Tick { group, worker, .. } | Op::Claim { group, worker, .. } = op {
            let (g, w) = (*group, *worker);
            state
                .issued
                .extend(won(&out).iter().map(|l| (g, l.bucket.0, l.token.0, w)));
        }
        state.names.normalize(&mut out);
        state.last = Some(out);
        state
    }
}

/// Builds the stores a differential test compares with the model.
pub trait StoreFactory: 'static {
    /// Fresh, empty stores that all decide expiry by `clock`. Runs on the test thread;
    /// async set-up can `rt.block_on(..)`.
    fn stores(rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)>;
}

/// One store under test and what its processes have been told.
pub struct Subject {
    name: String,
    store: Box<dyn LeaseStore>,
    names: SessionNames,
    sessions: Sessions,
    views: Views,
    /// Per (group, worker, process): the leases its own calls say it holds.
    beliefs: BTreeMap<(usize, usize, usize), BTreeMap<u32, Lease>>,
    /// Per (group, key hash): the highest token seen of a bucket containing the key.
    max_token: BTreeMap<(usize, u64), i64>,
    /// Workers whose session was handed over (HO1) and not taken over yet: their live
    /// leases are believed by no process until a successor's heartbeat.
    handed_over: std::collections::BTreeSet<usize>,
}

/// The keys (hashes `0..KEYS`) in bucket `bucket` of a generation of `shards` buckets.
fn keys_of(shards: ShardCount, bucket: Bucket) -> impl Iterator<Item = u64> {
    (0..KEYS).filter(move |&k| shards.bucket_of(k) == bucket)
}

/// The system under test: the stores, their shared clock and a runtime to drive them.
pub struct Subjects {
    rt: Runtime,
    clock: ManualClock,
    subjects: Vec<Subject>,
}

/// The differential test for the stores `F` builds, with the operations `R` generates
/// ([`ReferenceModel`]: all of them).
pub struct Differential<F, R = ReferenceModel>(PhantomData<(F, R)>);

/// A proptest config with `default_cases` cases unless `PROPTEST_CASES` says otherwise, and
/// no failure persistence files (shrunk failures are printed instead).
pub fn config(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

impl Subject {
    fn believe_claim(&mut self, key: (usize, usize, usize), won: &[Lease]) {
        for l in won {
            for k in keys_of(l.shards, l.bucket) {
                let seen = self.max_token.entry((key.0, k)).or_insert(0);
                assert!(
                    l.token.0 > *seen,
                    "{}: claim of bucket {} of {} returned token {} but key {k} had {} before",
                    self.name,
                    l.bucket,
                    l.shards,
                    l.token,
                    seen
                );
                *seen = l.token.0;
            }
            self.beliefs.entry(key).or_default().insert(l.bucket.0, *l);
        }
    }

    fn record(&mut self, op: &Op, out: &Outcome, now: Timestamp) {
        match (op, out) {
            (
                Op::Heartbeat {
                    worker, process, ..
                }
                | Op::Tick {
                    worker, process, ..
                },
                Outcome::Heartbeat(hb),
            ) => {
                // What the node holds is what the heartbeat says, in each group it lists; in
                // any other group it holds nothing (it left, was evicted, or its session is
                // new).
                let (w, p) = (*worker, *process);
                self.handed_over.remove(&w);
                self.beliefs.retain(|&(_, bw, bp), _| (bw, bp) != (w, p));
                for g in &hb.groups {
                    self.beliefs.insert(
                        (group_index(&g.group), w, p),
                        g.owned.iter().map(|l| (l.bucket.0, *l)).collect(),
                    );
                }
            }
            (
                Op::Tick {
                    group,
                    worker,
                    process,
                    ..
                },
                Outcome::Tick(beat, _, claim),
            ) => {
                self.record(op, beat, now);
                if let Some(claim) = claim {
                    self.believe_claim((*group, *worker, *process), won(claim));
                }
            }
            (
                Op::Claim {
                    group,
                    worker,
                    process,
                    ..
                },
                Outcome::Leases(won),
            ) => self.believe_claim((*group, *worker, *process), won),
            (
                Op::Release {
                    group,
                    worker,
                    process,
                    ..
                },
                Outcome::Buckets(released),
            ) => {
                if let Some(held) = self.beliefs.get_mut(&(*group, *worker, *process)) {
                    for b in released {
                        held.remove(&b.0);
                    }
                }
            }
            (
                Op::Leave {
                    group,
                    worker,
                    process,
                },
                Outcome::Buckets(_),
            ) => {
                // An evicted worker stops at its next heartbeat; the test lets it know at
                // once, or its stale beliefs would overlap the next owners'.
                self.beliefs.retain(|&(g, w, p), _| {
                    !(g == *group && w == *worker && process.is_none_or(|q| q == p))
                });
            }
            (
                Op::HandOver {
                    worker, process, ..
                },
                Outcome::HandedOver(Some(_)),
            ) => {
                // HO: the process stopped working on its buckets before handing them over.
                self.beliefs
                    .retain(|&(_, w, p), _| !(w == *worker && p == *process));
                self.handed_over.insert(*worker);
            }
            _ => {}
        }
        // Beliefs past their expiry are void; drop them so they cannot mask a real overlap.
        for held in self.beliefs.values_mut() {
            held.retain(|_, l| l.expires_at > now);
        }
    }

    /// Per key, across generations: no two processes believe they hold a bucket containing
    /// it (this covers "no bucket held twice" too).
    fn check_disjoint(&self) {
        let mut holder: BTreeMap<(usize, u64), (usize, usize, Lease)> = BTreeMap::new();
        for (&(g, w, p), held) in &self.beliefs {
            for l in held.values() {
                for k in keys_of(l.shards, l.bucket) {
                    if let Some(other) = holder.insert((g, k), (w, p, *l)) {
                        panic!(
                            "{}: key {k} of group {g} is held by (worker, process, lease) \
                             {other:?} and {:?} at once",
                            self.name,
                            (w, p, l)
                        );
                    }
                }
            }
        }
    }

    /// After an operation that can begin or end tenures, every bucket's history in its group
    /// equals the model's: the ends a release, a leave or a takeover wrote are compared where
    /// they happen, not only when a generated `History` happens to ask.
    async fn check_histories(&self, model: &Model, op: &Op, now: Timestamp) {
        if !matches!(
            op,
            Op::Tick { .. }
                | Op::Claim { .. }
                | Op::Release { .. }
                | Op::Leave { .. }
                | Op::Resize { .. }
        ) {
            return;
        }
        let g = group(op_group(op));
        let Ok(snap) = model.snapshot(&g, now) else {
            return;
        };
        for b in snap.buckets.iter().map(|b| b.bucket) {
            let want = model.history(&g, b).map_err(|e| e.to_string());
            let got = self.store.history(&g, b).await.map_err(|e| e.to_string());
            assert_eq!(
                got, want,
                "{}: the history of bucket {b} of group {g:?} after {op:?}",
                self.name
            );
        }
    }

    async fn check_snapshots(&mut self) {
        let known: Vec<NodeId> = (0..WORKERS).map(worker).collect();
        for g in 0..GROUPS.len() {
            let snap = match self.store.snapshot(&group(g)).await {
                Ok(snap) => snap,
                Err(e) => panic!("{}: snapshot of group {g} failed: {e}", self.name),
            };
            for b in &snap.buckets {
                if let Some(owner) = b.owner {
                    assert!(
                        known.contains(&owner),
                        "{}: bucket {} owned by unknown worker {owner}",
                        self.name,
                        b.bucket
                    );
                }
                for k in keys_of(snap.shard_count, b.bucket) {
                    let seen = self.max_token.entry((g, k)).or_insert(0);
                    assert!(
                        b.token.0 >= *seen,
                        "{}: bucket {} of {} has token {} below {} seen for its key {k}",
                        self.name,
                        b.bucket,
                        snap.shard_count,
                        b.token,
                        seen
                    );
                    *seen = b.token.0;
                }
            }
            // The store's own word, per key across generations: one live session at most.
            let live: Vec<Lease> = snap
                .live_leases()
                .into_iter()
                .chain(snap.draining_leases())
                .collect();
            for k in 0..KEYS {
                let holders: Vec<&Lease> = live
                    .iter()
                    .filter(|l| l.shards.bucket_of(k) == l.bucket)
                    .collect();
                assert!(
                    holders.len() <= 1,
                    "{}: key {k} of group {g} lies in buckets held live by {holders:?}",
                    self.name
                );
            }
            // The snapshot's live owners agree with what exactly one process believes it holds.
            for lease in live {
                let w = known
                    .iter()
                    .position(|&k| k == lease.owner)
                    .expect("checked above");
                let believers: Vec<(usize, i64)> = (0..PROCESSES)
                    .filter_map(|p| {
                        let l = self.beliefs.get(&(g, w, p))?.get(&lease.bucket.0)?;
                        (l.shards == lease.shards).then_some((p, l.token.0))
                    })
                    .collect();
                if believers.is_empty() && self.handed_over.contains(&w) {
                    continue;
                }
                assert!(
                    believers.len() == 1 && believers[0].1 == lease.token.0,
                    "{}: store says worker {w} owns bucket {} with token {}; processes that \
                     believe they hold it (process, token): {believers:?}",
                    self.name,
                    lease.bucket,
                    lease.token
                );
            }
        }
    }
}

impl<F, R> StateMachineTest for Differential<F, R>
where
    F: StoreFactory,
    R: ReferenceStateMachine<State = Reference, Transition = Op>,
{
    type SystemUnderTest = Subjects;
    type Reference = R;

    fn init_test(ref_state: &Reference) -> Subjects {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the stores under test");
        let clock = ManualClock::new();
        let subjects = F::stores(&rt, &clock)
            .into_iter()
            .map(|(name, store)| {
                for (i, &n) in ref_state.shard_counts.iter().enumerate() {
                    if let Err(e) = rt.block_on(store.ensure_group(&group(i), shards(n))) {
                        panic!("{name}: creating group {i}: {e}");
                    }
                }
                Subject {
                    name,
                    store,
                    names: SessionNames::default(),
                    sessions: Sessions::default(),
                    views: Views::default(),
                    beliefs: BTreeMap::new(),
                    max_token: BTreeMap::new(),
                    handed_over: std::collections::BTreeSet::new(),
                }
            })
            .collect();
        Subjects {
            rt,
            clock,
            subjects,
        }
    }

    fn apply(mut sut: Subjects, ref_state: &Reference, op: Op) -> Subjects {
        if let Op::Advance { ms } = op {
            sut.clock.advance(Duration::from_millis(ms));
        }
        let expected = ref_state
            .last
            .as_ref()
            .expect("the reference applied the op");
        let now = sut.clock.now();
        assert_eq!(now, ref_state.now(), "the clocks drifted apart");
        for s in &mut sut.subjects {
            let mut got = sut.rt.block_on(apply_to_store(
                &*s.store,
                &mut s.sessions,
                &mut s.views,
                &op,
            ));
            s.names.normalize(&mut got);
            assert_eq!(
                &got, expected,
                "{} disagrees with the model on {op:?}",
                s.name
            );
            s.record(&op, &got, now);
            s.check_disjoint();
            sut.rt.block_on(s.check_snapshots());
            sut.rt
                .block_on(s.check_histories(&ref_state.model.model(), &op, now));
        }
        sut
    }
}
