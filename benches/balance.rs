//! Load-aware balance: how fast, and with how many moves, a pool sharing Zipf-skewed loads
//! gets its busiest member down to the lower bound, under three rules: ours
//! (`lease::balance::plan_loads`), the count-fair policy, and a rule written after KCL 3.x's (a
//! leader, every third tick, moves 60 % of the excess of every worker above the mean when one
//! leaves a +-10 % band). Deterministic: ticks, a seeded generator, no clock.
//!
//! Each scenario starts count-fair (contiguous blocks, every load known), then:
//! 1. **static**: 20 ticks with the true loads;
//! 2. **noise**: 20 more ticks, every sample multiplied by a factor uniform in 1 +- 10 %;
//! 3. **unfiltered noise**: 20 more, every change of a smoothed load published (threshold 0),
//!    so that the noise reaches the rule (bounded noise of +-10 % never moves a smoothed load
//!    by 10 %, so the default threshold filters all of it);
//! 4. **shift**: the hottest bucket's load swaps with another bucket's (a hot key moving),
//!    noise still on, 20 more ticks.
//!
//! "Converged" means max/mean of the members' true loads at most 1.05 x the lower bound
//! max(1, W x the hottest bucket's share). The simulation is `lease::testing::balance_sim`.
//!
//! Run: `cargo bench --bench balance`.

use lease::balance::BalanceConfig;
use lease::testing::balance_sim::{Rule, Sim, zipf};

const PHASE: u32 = 20;

struct Phase {
    /// First tick (1-based) at the end of which the pool was converged, if any.
    converged: Option<u32>,
    /// Moves up to and including that tick (or in the whole phase).
    moves_to_converge: u32,
    /// Moves in the whole phase.
    moves: u32,
    /// Max/mean at the phase's end.
    last: f64,
    /// Published rows per member per tick.
    rows: f64,
}

fn phase(sim: &mut Sim, members: usize) -> Phase {
    let goal = sim.bound() * 1.05;
    let mut out = Phase {
        converged: None,
        moves_to_converge: 0,
        moves: 0,
        last: 0.0,
        rows: 0.0,
    };
    let mut rows = 0u64;
    for t in 1..=PHASE {
        let o = sim.tick();
        assert_eq!(o.unowned, 0, "a bucket was left unowned at tick {t}");
        out.moves += o.moves;
        rows += u64::from(o.published);
        out.last = o.max_over_mean;
        if out.converged.is_none() {
            out.moves_to_converge += o.moves;
            if o.max_over_mean <= goal {
                out.converged = Some(t);
            }
        }
    }
    out.rows = rows as f64 / f64::from(PHASE) / members as f64;
    out
}

fn ticks(p: &Phase) -> String {
    p.converged.map_or("never".into(), |t| t.to_string())
}

fn main() {
    let scenarios = [
        (256u32, 8usize, 1.0f64),
        (256, 8, 1.1),
        (4096, 64, 1.0),
        (4096, 64, 1.1),
    ];
    println!(
        "| buckets x workers | Zipf | rule | start max/mean | bound | ticks to 1.05 x bound | moves then (% of buckets) | max/mean after 20 | moves in 20 static | moves in 20 noisy | published rows per member per noisy tick | moves in 20 noisy, every change published | ticks to re-converge after the shift | moves then |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (n, w, s) in scenarios {
        for (name, rule) in [
            ("ours", Rule::Ours(BalanceConfig::default())),
            ("count-fair", Rule::CountFair),
            ("KCL-3.x-like", Rule::KclLike),
        ] {
            let loads = zipf(n, s, 7);
            let mut sim = Sim::new(rule, w, loads, 11);
            let start = sim.max_over_mean();
            let bound = sim.bound();
            let fixed = phase(&mut sim, w);
            sim.set_noise(0.1);
            let noisy = phase(&mut sim, w);
            sim.set_threshold(0);
            let raw = phase(&mut sim, w);
            sim.set_threshold(10);
            let hottest = (0..n as usize)
                .max_by(|&a, &b| sim.base()[a].total_cmp(&sim.base()[b]))
                .unwrap_or(0);
            // The hot key moves to the bucket in the middle of the ranking.
            let mut ranked: Vec<usize> = (0..n as usize).collect();
            ranked.sort_by(|&a, &b| sim.base()[b].total_cmp(&sim.base()[a]));
            sim.swap_loads(hottest, ranked[ranked.len() / 2]);
            let shifted = phase(&mut sim, w);
            println!(
                "| {n} x {w} | {s} | {name} | {start:.2} | {bound:.2} | {} | {} ({:.1} %) | {:.2} | {} | {} | {:.3} | {} | {} | {} |",
                ticks(&fixed),
                fixed.moves_to_converge,
                100.0 * f64::from(fixed.moves_to_converge) / f64::from(n),
                fixed.last,
                fixed.moves,
                noisy.moves,
                noisy.rows,
                raw.moves,
                ticks(&shifted),
                shifted.moves_to_converge,
            );
        }
    }
}
