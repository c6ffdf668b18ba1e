//! The in-memory backend against the reference model, on random operation sequences.

use lease_core::LeaseStore;
use lease_core::ManualClock;
use lease_memory::MemoryLeaseStore;
use lease_testing::differential::{StoreFactory, run};
use tokio::runtime::Runtime;

struct Memory;

impl StoreFactory for Memory {
    fn stores(_rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
        vec![(
            "memory".to_owned(),
            Box::new(MemoryLeaseStore::with_clock(clock.clone())),
        )]
    }
}

/// The checked sequences (every risky state reached), then 256 random ones.
#[test]
fn memory_matches_the_model() {
    run::<Memory>(256);
}

/// How often the generator reaches the risky states, over many sequences of the lengths the
/// differential tests run: the share of sequences in which each state happens at least once
/// is printed, and held to a floor, so a change to the generator cannot quietly stop
/// exercising takeovers, releases, fencing checks or a node id in use.
#[test]
fn the_generator_reaches_the_risky_states() {
    use lease_testing::differential::{Reach, ReferenceModel};
    use proptest::strategy::{Strategy, ValueTree};
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    use proptest_state_machine::ReferenceStateMachine;

    const SEQUENCES: usize = 2_000;
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let strategy = ReferenceModel::sequential_strategy(1..40);
    let mut reached = [0usize; 16];
    for _ in 0..SEQUENCES {
        let (mut state, ops, _) = strategy
            .new_tree(&mut runner)
            .expect("a sequence")
            .current();
        for op in &ops {
            state = ReferenceModel::apply(state, op);
        }
        for (i, (_, n)) in state.reach.fields().iter().enumerate() {
            reached[i] += usize::from(*n > 0);
        }
    }
    // Floors: about half of what this generator reached when it was last changed (node
    // sessions: heartbeats per node, joins and listings share the operations; operators'
    // controls and hand-overs, which thin out the drains a little), see the table.
    let floors = [
        0.10, 0.07, 0.18, 0.19, 0.26, 0.29, 0.03, 0.19, 0.005, 0.037, 0.044, 0.009, 0.11, 0.009,
        0.02, 0.005,
    ];
    let mut table = String::from("| state | sequences reaching it | floor |\n|---|---:|---:|\n");
    let mut low = Vec::new();
    for ((name, _), (&n, &floor)) in Reach::default()
        .fields()
        .iter()
        .zip(reached.iter().zip(&floors))
    {
        let share = n as f64 / SEQUENCES as f64;
        table.push_str(&format!(
            "| {name} | {:.1} % | {:.0} % |\n",
            share * 100.0,
            floor * 100.0
        ));
        if share < floor {
            low.push(*name);
        }
    }
    eprintln!("reach over {SEQUENCES} sequences of 1 to 39 operations:\n{table}");
    assert!(
        low.is_empty(),
        "the generator rarely reaches: {low:?}\n{table}"
    );
}
