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
//!     #![proptest_config(lease_core::testing::differential::config(64))]
//!     #[test]
//!     fn memory_matches_the_model(sequential 1..40 => Differential<Memory>);
//! }
//! ```
//!
//! Checked after every step, on every store:
//! - every result equals the model's (session ids compared by order of appearance);
//! - no bucket is believed held by two workers at once: each worker's leases, as the results
//!   of its own calls told it, are disjoint from every other worker's until they expire;
//! - fencing tokens never decrease, and each claim returns a token above every one seen;
//! - every recorded owner is one of the workers of the test.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::runtime::Runtime;
use uuid::Uuid;

use crate::error::ErrorKind;
use crate::ids::{
    Bucket, FencingToken, GroupName, MemberMetadata, SessionId, ShardCount, WorkerId,
};
use crate::store::LeaseStore;
use crate::testing::model::Model;
use crate::time::{Clock, ManualClock, Timestamp, Ttl};
use crate::view::{GroupSnapshot, Heartbeat, Lease};

/// The groups operations pick from: a plain name and one full of quotes and SQL.
pub const GROUPS: [&str; 2] = ["orders", "it's \"odd\"; DROP TABLE lease.shards; --"];

/// How many workers operations pick from.
pub const WORKERS: usize = 3;

/// The group named by index `i` of [`GROUPS`].
pub fn group(i: usize) -> GroupName {
    GroupName::new(GROUPS[i % GROUPS.len()]).expect("the test group names are valid")
}

/// Worker `i` of the test: fixed ids, so runs are repeatable.
pub fn worker(i: usize) -> WorkerId {
    WorkerId::from_uuid(Uuid::from_u128(0xA000 + i as u128))
}

/// One operation of a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `ensure_group(group, shards)`.
    Ensure {
        /// Index into [`GROUPS`].
        group: usize,
        /// Shard count.
        shards: u32,
    },
    /// `heartbeat(group, worker, ttl)`.
    Heartbeat {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Ttl in milliseconds.
        ttl_ms: u64,
    },
    /// `claim(group, worker, want)`.
    Claim {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// How many to claim.
        want: u32,
    },
    /// `release(group, worker, buckets)`.
    Release {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
        /// Buckets (some may be out of range).
        buckets: Vec<u32>,
    },
    /// `leave(group, worker)`.
    Leave {
        /// Index into [`GROUPS`].
        group: usize,
        /// Worker index.
        worker: usize,
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
    /// Move the shared clock forward.
    Advance {
        /// Milliseconds.
        ms: u64,
    },
}

/// The result of one operation, in a form two stores can be compared by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The operation succeeded with nothing to report (ensure, advance).
    Done,
    /// A heartbeat's result.
    Heartbeat(Heartbeat),
    /// A claim's leases.
    Leases(Vec<Lease>),
    /// Released buckets.
    Buckets(Vec<Bucket>),
    /// A snapshot.
    Snapshot(GroupSnapshot),
    /// A fencing check.
    Bool(bool),
    /// A failure, by kind.
    Failed(ErrorKind),
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
            Outcome::Snapshot(snap) => {
                for m in &mut snap.members {
                    self.name(&mut m.session);
                }
                for b in &mut snap.buckets {
                    if let Some(s) = &mut b.session {
                        self.name(s);
                    }
                }
            }
            _ => {}
        }
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).expect("generated ttls are valid")
}

fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("generated shard counts are valid")
}

fn outcome<T>(r: Result<T, crate::StoreError>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => Outcome::Failed(e.kind()),
    }
}

/// Apply `op` to the model at time `now`.
pub fn apply_to_model(model: &mut Model, op: &Op, now: Timestamp) -> Outcome {
    let meta = MemberMetadata::empty();
    match op {
        Op::Ensure {
            group: g,
            shards: n,
        } => outcome(model.ensure_group(&group(*g), shards(*n)), |_| {
            Outcome::Done
        }),
        Op::Heartbeat {
            group: g,
            worker: w,
            ttl_ms,
        } => outcome(
            model.heartbeat(&group(*g), worker(*w), ttl(*ttl_ms), &meta, now),
            Outcome::Heartbeat,
        ),
        Op::Claim {
            group: g,
            worker: w,
            want,
        } => outcome(
            model.claim(&group(*g), worker(*w), *want, now),
            Outcome::Leases,
        ),
        Op::Release {
            group: g,
            worker: w,
            buckets,
        } => {
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            outcome(
                model.release(&group(*g), worker(*w), &bs, now),
                Outcome::Buckets,
            )
        }
        Op::Leave {
            group: g,
            worker: w,
        } => outcome(model.leave(&group(*g), worker(*w), now), Outcome::Buckets),
        Op::Snapshot { group: g } => outcome(model.snapshot(&group(*g), now), Outcome::Snapshot),
        Op::IsCurrent {
            group: g,
            bucket,
            worker: w,
            token,
        } => Outcome::Bool(model.is_current(
            &group(*g),
            Bucket(*bucket),
            worker(*w),
            FencingToken(*token),
            now,
        )),
        Op::Advance { .. } => Outcome::Done,
    }
}

/// Apply `op` to a store (clock moves are the caller's business).
pub async fn apply_to_store(store: &dyn LeaseStore, op: &Op) -> Outcome {
    let meta = MemberMetadata::empty();
    match op {
        Op::Ensure {
            group: g,
            shards: n,
        } => outcome(store.ensure_group(&group(*g), shards(*n)).await, |_| {
            Outcome::Done
        }),
        Op::Heartbeat {
            group: g,
            worker: w,
            ttl_ms,
        } => outcome(
            store
                .heartbeat(&group(*g), worker(*w), ttl(*ttl_ms), &meta)
                .await,
            Outcome::Heartbeat,
        ),
        Op::Claim {
            group: g,
            worker: w,
            want,
        } => outcome(
            store.claim(&group(*g), worker(*w), *want).await,
            Outcome::Leases,
        ),
        Op::Release {
            group: g,
            worker: w,
            buckets,
        } => {
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            outcome(
                store.release(&group(*g), worker(*w), &bs).await,
                Outcome::Buckets,
            )
        }
        Op::Leave {
            group: g,
            worker: w,
        } => outcome(store.leave(&group(*g), worker(*w)).await, Outcome::Buckets),
        Op::Snapshot { group: g } => outcome(store.snapshot(&group(*g)).await, Outcome::Snapshot),
        Op::IsCurrent {
            group: g,
            bucket,
            worker: w,
            token,
        } => outcome(
            store
                .is_current(
                    &group(*g),
                    Bucket(*bucket),
                    worker(*w),
                    FencingToken(*token),
                )
                .await,
            Outcome::Bool,
        ),
        Op::Advance { .. } => Outcome::Done,
    }
}

/// A strategy for one operation.
pub fn op_strategy() -> BoxedStrategy<Op> {
    let g = 0..GROUPS.len();
    let w = 0..WORKERS;
    prop_oneof![
        2 => (g.clone(), prop::sample::select(vec![1u32, 2, 3, 5, 8]))
            .prop_map(|(group, shards)| Op::Ensure { group, shards }),
        5 => (g.clone(), w.clone(), prop::sample::select(vec![1_000u64, 3_000]))
            .prop_map(|(group, worker, ttl_ms)| Op::Heartbeat { group, worker, ttl_ms }),
        5 => (g.clone(), w.clone(), 0u32..6)
            .prop_map(|(group, worker, want)| Op::Claim { group, worker, want }),
        2 => (g.clone(), w.clone(), prop::collection::vec(0u32..9, 0..4))
            .prop_map(|(group, worker, buckets)| Op::Release { group, worker, buckets }),
        1 => (g.clone(), w.clone()).prop_map(|(group, worker)| Op::Leave { group, worker }),
        1 => g.clone().prop_map(|group| Op::Snapshot { group }),
        1 => (g, 0u32..9, w, 0i64..6)
            .prop_map(|(group, bucket, worker, token)| Op::IsCurrent { group, bucket, worker, token }),
        3 => prop::sample::select(vec![1u64, 500, 1_000, 2_999, 3_000, 7_000])
            .prop_map(|ms| Op::Advance { ms }),
    ]
    .boxed()
}

/// The reference side: the model, its clock and the outcome of the last operation.
#[derive(Clone)]
pub struct Reference {
    /// The model.
    pub model: Model,
    /// The model's time.
    pub now: Timestamp,
    /// The last operation's outcome, normalized.
    pub last: Option<Outcome>,
    names: SessionNames,
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shrunk failures print the op sequence; the model's internals would only bury it.
        f.debug_struct("Reference").field("now", &self.now).finish()
    }
}

/// The reference state machine of the differential test.
pub struct ReferenceModel;

impl ReferenceStateMachine for ReferenceModel {
    type State = Reference;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Reference> {
        Just(Reference {
            model: Model::new(),
            now: ManualClock::new().now(),
            last: None,
            names: SessionNames::default(),
        })
        .boxed()
    }

    fn transitions(_state: &Reference) -> BoxedStrategy<Op> {
        op_strategy()
    }

    fn apply(mut state: Reference, op: &Op) -> Reference {
        if let Op::Advance { ms } = op {
            state.now += chrono::Duration::milliseconds(*ms as i64);
        }
        let mut out = apply_to_model(&mut state.model, op, state.now);
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

/// One store under test and what its workers have been told.
pub struct Subject {
    name: String,
    store: Box<dyn LeaseStore>,
    names: SessionNames,
    /// Per (group, worker): the leases its own calls say it holds.
    beliefs: BTreeMap<(usize, usize), BTreeMap<u32, Lease>>,
    /// Per (group, bucket): the highest token seen.
    max_token: BTreeMap<(usize, u32), i64>,
}

/// The system under test: the stores, their shared clock and a runtime to drive them.
pub struct Subjects {
    rt: Runtime,
    clock: ManualClock,
    subjects: Vec<Subject>,
}

/// The differential test for the stores `F` builds.
pub struct Differential<F>(PhantomData<F>);

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
    fn record(&mut self, op: &Op, out: &Outcome, now: Timestamp) {
        match (op, out) {
            (Op::Heartbeat { group, worker, .. }, Outcome::Heartbeat(hb)) => {
                self.beliefs.insert(
                    (*group, *worker),
                    hb.owned.iter().map(|l| (l.bucket.0, *l)).collect(),
                );
            }
            (Op::Claim { group, worker, .. }, Outcome::Leases(won)) => {
                for l in won {
                    let seen = self.max_token.entry((*group, l.bucket.0)).or_insert(0);
                    assert!(
                        l.token.0 > *seen,
                        "{}: claim of bucket {} returned token {} but {} was seen before",
                        self.name,
                        l.bucket,
                        l.token,
                        seen
                    );
                    *seen = l.token.0;
                    self.beliefs
                        .entry((*group, *worker))
                        .or_default()
                        .insert(l.bucket.0, *l);
                }
            }
            (Op::Release { group, worker, .. }, Outcome::Buckets(released)) => {
                if let Some(held) = self.beliefs.get_mut(&(*group, *worker)) {
                    for b in released {
                        held.remove(&b.0);
                    }
                }
            }
            (Op::Leave { group, worker }, Outcome::Buckets(_)) => {
                self.beliefs.remove(&(*group, *worker));
            }
            _ => {}
        }
        // Beliefs past their expiry are void; drop them so they cannot mask a real overlap.
        for held in self.beliefs.values_mut() {
            held.retain(|_, l| l.expires_at > now);
        }
    }

    fn check_disjoint(&self) {
        let mut holder: BTreeMap<(usize, u32), usize> = BTreeMap::new();
        for (&(g, w), held) in &self.beliefs {
            for &b in held.keys() {
                if let Some(other) = holder.insert((g, b), w) {
                    panic!(
                        "{}: bucket {b} of group {g} is held by workers {other} and {w} at once",
                        self.name
                    );
                }
            }
        }
    }

    async fn check_snapshots(&mut self) {
        let known: Vec<WorkerId> = (0..WORKERS).map(worker).collect();
        for g in 0..GROUPS.len() {
            let Ok(snap) = self.store.snapshot(&group(g)).await else {
                continue;
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
                let seen = self.max_token.entry((g, b.bucket.0)).or_insert(0);
                assert!(
                    b.token.0 >= *seen,
                    "{}: bucket {} token went from {} down to {}",
                    self.name,
                    b.bucket,
                    seen,
                    b.token
                );
                *seen = b.token.0;
            }
            // The snapshot's live owners agree with what the workers believe they hold.
            for lease in snap.live_leases() {
                let w = known
                    .iter()
                    .position(|&k| k == lease.owner)
                    .expect("checked above");
                let believed = self
                    .beliefs
                    .get(&(g, w))
                    .and_then(|h| h.get(&lease.bucket.0));
                assert_eq!(
                    believed.map(|l| l.token),
                    Some(lease.token),
                    "{}: store says worker {w} owns bucket {} with token {}, the worker does not know",
                    self.name,
                    lease.bucket,
                    lease.token
                );
            }
        }
    }
}

impl<F: StoreFactory> StateMachineTest for Differential<F> {
    type SystemUnderTest = Subjects;
    type Reference = ReferenceModel;

    fn init_test(_ref_state: &Reference) -> Subjects {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a tokio runtime for the stores under test");
        let clock = ManualClock::new();
        let subjects = F::stores(&rt, &clock)
            .into_iter()
            .map(|(name, store)| Subject {
                name,
                store,
                names: SessionNames::default(),
                beliefs: BTreeMap::new(),
                max_token: BTreeMap::new(),
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
        assert_eq!(now, ref_state.now, "the clocks drifted apart");
        for s in &mut sut.subjects {
            let mut got = sut.rt.block_on(apply_to_store(&*s.store, &op));
            s.names.normalize(&mut got);
            assert_eq!(
                &got, expected,
                "{} disagrees with the model on {op:?}",
                s.name
            );
            s.record(&op, &got, now);
            s.check_disjoint();
            sut.rt.block_on(s.check_snapshots());
        }
        sut
    }
}
