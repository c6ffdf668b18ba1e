//! Failover to a standby, on the wall clock: what a promotion costs the workers, in four
//! scenarios, at ttl 3 s (renew 1 s) and at the library's defaults (`LeaseNode::DEFAULT_TTL`,
//! `DEFAULT_RENEW_INTERVAL`: 30 s, 10 s).
//!
//! Each run starts a primary and a streaming standby (lease-testdb, from the system binaries;
//! fsync off), a database migrated on the primary, and 3 `LeaseWorker`s in this process, each
//! on a store of its own, reaching both servers through one multi-host URL
//! (`target_session_attrs=read-write`), on a group of 24 buckets. Once they are settled (below)
//! and, the standby having run for 1.2 s, every worker has renewed (the promoted server trusts
//! its switch point only if it ran for over a second before the last heartbeat it replayed;
//! otherwise it keeps no session, V4):
//!
//! 1. **switchover**: asynchronous replication, the primary stopped cleanly (`pg_ctl stop -m
//!    fast`, which hands the standby all of its WAL), in steady state;
//! 2. **sync kill, steady**: a synchronous standby, the primary killed (`pg_ctl stop -m
//!    immediate`) in steady state;
//! 3. **sync kill during joins**: synchronous; a fourth worker joins, and the primary is killed
//!    the moment the first revocation for a shed appears in the ownership log (releases and
//!    the joiner's claims under way);
//! 4. **async, writes lost**: replication is cut, a fourth worker joins and takes its share on
//!    the primary alone, then the primary is killed (writes lost on purpose).
//!
//! Then the standby is promoted (`pg_ctl promote -w`). Measured: the time from the promotion
//! until the workers are *settled* on the new primary (every bucket live there, held by the
//! worker it names with the token it names, every worker renewed there since the promotion,
//! loads within one; the bench fails if that takes over ttl + renew + 5 s); from the stop (or
//! kill) to the settling, the bucket-seconds without a holder and the assignments and
//! revocations, from the applications' ownership log; how each session crossed the failover
//! (`lease.nodes.crossed` on the new primary: `kept`, `ended: ...`, or none for a node row
//! the new primary did not have); and overlaps in the whole log (there must be none: the bench
//! fails after printing otherwise). `LEASE_BENCH_RUNS` runs of each (default 3); a line per
//! run (naming the workers w1-w4 in the order they started: w4 is the joiner), then a table
//! per ttl of medians with the range of the runs.
//!
//! Run: `cargo bench --bench pg_failover`.

mod fleet;
mod scenario;

use std::collections::BTreeMap;
use std::time::Duration;

use lease::LeaseNode;

use crate::fleet::{BUCKETS, Timing};
use crate::scenario::{Run, Scenario};

/// Median (min-max) of `v`, with `decimals` decimals.
fn spread(mut v: Vec<f64>, decimals: usize) -> String {
    v.sort_by(f64::total_cmp);
    let (median, min, max) = (v[v.len() / 2], v[0], v[v.len() - 1]);
    format!("{median:.decimals$} ({min:.decimals$}-{max:.decimals$})")
}

fn line(timing: Timing, scenario: Scenario, i: usize, r: &Run) -> String {
    format!(
        "ttl {:?}, {}, run {i}: promoted {:.3} s after the stop; settled {:.3} s after the \
         promotion; {:.1} bucket-s unowned; {} assignments; revocations {:?}; sessions: {}; \
         {} overlaps",
        timing.ttl,
        scenario.name(),
        r.to_promoted.as_secs_f64(),
        r.settled.as_secs_f64(),
        r.unowned,
        r.assigned,
        r.revoked,
        r.crossed
            .iter()
            .map(|(who, how)| format!("{who} {how}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.overlaps
    )
}

fn table(timing: Timing, results: &[(Scenario, Vec<Run>)]) {
    println!();
    println!(
        "ttl {:?}, renew {:?}: 3 workers (4 after the join in scenarios 3 and 4), {BUCKETS} \
         buckets; moves and unowned time from the stop (or kill) to settled",
        timing.ttl, timing.renew
    );
    println!();
    println!(
        "| scenario | runs | promotion to settled, s | bucket-s unowned | assignments | \
         revocations | sessions kept/ended | overlaps |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut reasons = Vec::new();
    for (scenario, runs) in results {
        let of = |f: fn(&Run) -> f64, decimals| spread(runs.iter().map(f).collect(), decimals);
        let crossed: Vec<&str> = runs
            .iter()
            .flat_map(|r| &r.crossed)
            .map(|(_, how)| &**how)
            .collect();
        let kept = crossed.iter().filter(|c| **c == "kept").count();
        let ended = crossed.iter().filter(|c| c.starts_with("ended")).count();
        let other = crossed.len() - kept - ended;
        let mut sessions = format!("{kept}/{ended}");
        if other > 0 {
            sessions += &format!(" (+{other} none)");
        }
        println!(
            "| {} | {} | {} | {} | {} | {} | {sessions} | {} |",
            scenario.name(),
            runs.len(),
            of(|r| r.settled.as_secs_f64(), 3),
            of(|r| r.unowned, 1),
            of(|r| r.assigned as f64, 0),
            of(|r| r.revoked.values().sum::<usize>() as f64, 0),
            runs.iter().map(|r| r.overlaps).sum::<usize>()
        );
        let mut counts = BTreeMap::<&str, usize>::new();
        for c in crossed.iter().filter(|c| **c != "kept") {
            *counts.entry(c).or_default() += 1;
        }
        if !counts.is_empty() {
            reasons.push(format!("{}: {counts:?}", scenario.name()));
        }
    }
    for r in reasons {
        println!("- sessions not kept, {r}");
    }
}

fn main() {
    let runs: usize = std::env::var("LEASE_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a runtime");
    let timings = [
        Timing {
            ttl: Duration::from_secs(3),
            renew: Duration::from_secs(1),
        },
        Timing {
            ttl: LeaseNode::DEFAULT_TTL,
            renew: LeaseNode::DEFAULT_RENEW_INTERVAL,
        },
    ];
    let mut all = Vec::new();
    for timing in timings {
        let mut results = Vec::new();
        for scenario in Scenario::ALL {
            let mut done = Vec::new();
            for i in 1..=runs {
                let r = rt.block_on(scenario::run(scenario, timing));
                println!("{}", line(timing, scenario, i, &r));
                done.push(r);
            }
            results.push((scenario, done));
        }
        all.push((timing, results));
    }
    let mut broken = Vec::new();
    for (timing, results) in &all {
        table(*timing, results);
        for (scenario, runs) in results {
            for (i, r) in runs.iter().enumerate() {
                if r.overlaps > 0 || r.check.is_some() {
                    broken.push(format!(
                        "ttl {:?}, {}, run {}: {} overlaps; check: {:?}",
                        timing.ttl,
                        scenario.name(),
                        i + 1,
                        r.overlaps,
                        r.check
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "ownership log broken: {broken:#?}");
}
