//! Runs of the differential test that show what they covered, and [`Reach`], what they
//! count: the risky states each sequence got to, as the model answered it.
//!
//! A random run that never took a dead session's bucket, never saw a node id in use or
//! never claimed during a drain proves nothing about those rules, and with tens of sequences
//! (what a Postgres or etcd run can afford) the rarer risky states are missed about half the
//! time. So a backend's run has two parts: sequences drawn from [`REACH_SEED`], chosen so that
//! its first [`REACH_CASES`] sequences reach every risky state, which the run checks of the
//! sequences it actually ran (a change to the generator that stops reaching one fails here,
//! on every backend); then sequences from a fresh seed, which explore (`PROPTEST_CASES` sets
//! how many; a failure prints its shrunk sequence).

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};

use proptest::test_runner::{Config, RngSeed, TestRunner};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};

use lease_core::{BucketState, EndReason, MemberMode, ResizeOutcome, Timestamp};

use super::{
    Differential, GROUPS, Op, Outcome, ReferenceModel, StoreFactory, config, group, op_group,
    op_worker, worker,
};
use crate::model::Model;

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

    pub(super) fn count(&mut self, before: &Model, op: &Op, out: &Outcome, now: Timestamp) {
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
                }
                | Op::ClaimBuckets {
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

/// The seed of the checked part of a backend's run: the first seed whose first 48 sequences
/// reach every risky state at least once (`reach_of_seed`; chosen again whenever the generator
/// changes, as when quarantines gained reasons and loads came).
pub const REACH_SEED: u64 = 9;

/// How many sequences the checked part runs.
pub const REACH_CASES: u32 = 48;

/// How many of `sequences` reach each risky state ([`Reach::fields`], in order).
pub type Reached = [usize; 16];

fn reach_of(state: &super::Reference, reached: &mut Reached) {
    for (i, (_, n)) in state.reach.fields().iter().enumerate() {
        reached[i] += usize::from(*n > 0);
    }
}

/// The reach of the `cases` sequences a run from `seed` draws, on the model alone (the same
/// sequences [`run`]'s checked part runs).
pub fn reach_of_seed(seed: u64, cases: u32) -> Reached {
    sequences(seeded(seed, cases), |_, _, _| {})
}

/// Draw `config`'s sequences as a test run does, hand each to `test`, and count what the
/// passing ones reached.
fn sequences(
    config: Config,
    test: impl Fn(super::Reference, Vec<super::Op>, Option<Arc<AtomicUsize>>),
) -> Reached {
    let reached = Mutex::new([0; 16]);
    let mut runner = TestRunner::new(config);
    let strategy = ReferenceModel::sequential_strategy(1..40);
    let result = runner.run(&strategy, |(initial, transitions, seen)| {
        let mut state = initial.clone();
        for op in &transitions {
            state = ReferenceModel::apply(state, op);
        }
        test(initial, transitions, seen);
        // Counted once the sequence passed (a failing one is shrunk, then reported).
        reach_of(
            &state,
            &mut reached.lock().unwrap_or_else(PoisonError::into_inner),
        );
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    reached.into_inner().unwrap_or_else(PoisonError::into_inner)
}

fn seeded(seed: u64, cases: u32) -> Config {
    Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    }
}

/// A table of what `reached` covers of `sequences`.
pub fn reach_table(reached: &Reached, sequences: u32) -> String {
    let mut table = String::from("| state | sequences reaching it |\n|---|---:|\n");
    for ((name, _), n) in Reach::default().fields().iter().zip(reached) {
        table.push_str(&format!("| {name} | {n} of {sequences} |\n"));
    }
    table
}

/// Run the differential test on the stores `F` builds: [`REACH_CASES`] sequences from
/// [`REACH_SEED`], checked to reach every risky state in the run itself, then `random`
/// sequences from a fresh seed (or `PROPTEST_CASES` of them).
///
/// # Panics
///
/// On a store that disagrees with the model or breaks an invariant (with the shrunk
/// sequence), and when the checked part left a risky state unreached.
pub fn run<F: StoreFactory>(random: u32) {
    let reached = run_part::<F>(seeded(REACH_SEED, REACH_CASES));
    let table = reach_table(&reached, REACH_CASES);
    eprintln!("reach of the checked sequences:\n{table}");
    let missed: Vec<&str> = Reach::default()
        .fields()
        .iter()
        .zip(reached)
        .filter(|(_, n)| *n == 0)
        .map(|((name, _), _)| *name)
        .collect();
    assert!(
        missed.is_empty(),
        "the checked sequences never reached: {missed:?}\n{table}"
    );
    run_part::<F>(config(random));
}

fn run_part<F: StoreFactory>(config: Config) -> Reached {
    sequences(config.clone(), |initial, transitions, seen| {
        Differential::<F>::test_sequential(config.clone(), initial, transitions, seen);
    })
}
