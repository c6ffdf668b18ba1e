//! Runs of the differential test that show what they covered.
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

use super::{Differential, Reach, ReferenceModel, StoreFactory, config};

/// The seed of the checked part of a backend's run: among the first 400 seeds, one whose first
/// 48 sequences reach every risky state at least once (`reach_of_seed`).
pub const REACH_SEED: u64 = 282;

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
