//! The load-aware policy over many ticks (`balance_sim`, deterministic): with static loads it
//! reaches a quiet state within a few ticks and then never moves again, never moves more than
//! its budget in a tick, leaves no bucket unowned at a tick's end, and once quiet is within the
//! band of the lower bound (with 16 buckets a member or more; with fewer, buckets are too
//! coarse for that, and it is within the band plus one bucket).

use lease_core::balance::BalanceConfig;
use lease_testing::balance_sim::{Rule, Sim, zipf};
use proptest::prelude::*;

/// The ticks a run is watched for.
const TICKS: u32 = 40;
/// The ticks by which every run must be quiet for good.
const QUIET_BY: u32 = 12;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48)
    ))]

    #[test]
    fn static_loads_converge_then_never_move(
        n in 8u32..600,
        w in 2usize..12,
        s in 0.0f64..1.4,
        seed in 0u64..1_000,
    ) {
        let config = BalanceConfig::default();
        let mut sim = Sim::new(Rule::Ours(config), w, zipf(n, s, seed), seed + 1);
        let bound = sim.bound();
        // A tick is two planning rounds (the heartbeat's, and the one after the claims).
        let budget = 2 * (n * config.budget_percent / 100).max(1);
        let mut last_move = 0;
        for t in 1..=TICKS {
            let o = sim.tick();
            prop_assert_eq!(o.unowned, 0, "tick {}: a bucket left unowned", t);
            prop_assert!(o.moves <= budget, "tick {}: {} moves, budget {}", t, o.moves, budget);
            if o.moves > 0 {
                last_move = t;
            }
        }
        prop_assert!(
            last_move <= QUIET_BY,
            "still moving at tick {} (n {}, w {}, s {:.2})", last_move, n, w, s
        );
        let band = 1.0 + f64::from(config.band_percent) / 100.0;
        let total: f64 = sim.base().iter().sum();
        let hottest = sim.base().iter().copied().fold(0.0, f64::max);
        // One bucket, as a share of the mean member's load.
        let coarse = if n as usize >= 16 * w { 0.0 } else { hottest * w as f64 / total };
        prop_assert!(
            sim.max_over_mean() <= band * bound + coarse + 1e-9,
            "quiet at max/mean {:.3}, bound {:.3}", sim.max_over_mean(), bound
        );
    }
}
