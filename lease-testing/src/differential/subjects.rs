//! The stores under test: what each one's processes were told, the invariants checked on it
//! after every step, and the [`Differential`] test that runs them in lockstep with the model.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use proptest::test_runner::Config;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use tokio::runtime::Runtime;

use lease_core::{Bucket, Clock, Lease, LeaseStore, ManualClock, NodeId, ShardCount, Timestamp};

use super::{
    GROUPS, KEYS, Op, Outcome, PROCESSES, Reference, ReferenceModel, SessionNames, Sessions, Views,
    WORKERS, apply_to_store, group, group_index, op_group, shards, won, worker,
};
use crate::model::Model;

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
                }
                | Op::ClaimBuckets {
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
                | Op::ClaimBuckets { .. }
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
