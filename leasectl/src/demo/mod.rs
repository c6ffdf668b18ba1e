//! `leasectl demo`: a scripted story with real workers on the in-memory store.
//!
//! A cold start, a worker joining, one crashing (its task aborted: no revoke, no leave), one
//! stopping gracefully, and a bucket running hot (the load-aware policy). The ownership table is redrawn live on a terminal (plain lines
//! otherwise); the summary gives the time to balance after each event, the handoffs, and the
//! overlaps the ownership log found, which must be 0.
//!
//! [`story`] holds the cast (the store, the workers, the ownership log), [`screen`] draws it,
//! [`phases`] plays the story one phase per fifth of its length, and [`summary`] judges it.

mod phases;
mod screen;
mod story;
mod summary;

use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use lease::ShardCount;

use crate::output::Failure;
use story::Story;

/// How long a demo worker's session lives after a heartbeat.
const TTL: Duration = Duration::from_secs(2);
/// How often a demo worker heartbeats.
const RENEW: Duration = Duration::from_millis(500);

/// `leasectl demo`'s arguments.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Workers at the start (2 to 25); one more joins during the story.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Buckets to share (1 to 256).
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// How long the story runs, in seconds (10 to 3600).
    #[arg(long, default_value_t = 25)]
    seconds: u64,
}

fn validate(args: &DemoArgs) -> Result<ShardCount, Failure> {
    // Workers are lettered A to Z, the joiner included.
    if !(2..=25).contains(&args.workers) {
        return Err(Failure::Usage(format!(
            "--workers {}: the story needs 2 to 25 workers (one more joins, and each has a \
             letter of its own)",
            args.workers
        )));
    }
    if !(1..=256).contains(&args.shards) {
        return Err(Failure::Usage(format!(
            "--shards {}: the demo shows 1 to 256 buckets",
            args.shards
        )));
    }
    if !(10..=3_600).contains(&args.seconds) {
        return Err(Failure::Usage(format!(
            "--seconds {}: the story needs 10 to 3600 seconds (a crash takes a ttl of {}s to \
             recover)",
            args.seconds,
            TTL.as_secs()
        )));
    }
    ShardCount::new(args.shards).map_err(|e| Failure::Usage(format!("--shards: {e}")))
}

/// Play the story and print its summary; fails if the ownership log found an overlap or a
/// crashed worker's bucket moved before its lease expired.
pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    let shards = validate(&args)?;
    let terminal = std::io::stdout().is_terminal();
    let mut story = Story::new(shards, !terminal)?;
    let renderer = terminal.then(|| story::spawn_renderer(&story));
    // Stdout failing stops the story wherever it is (`?`): the workers stop as their handles
    // drop.
    let fifth = Duration::from_secs(args.seconds) / 5;
    let cold = phases::cold_start(&mut story, args.workers, fifth).await?;
    let join = phases::join(&mut story, fifth * 2).await?;
    let crash = phases::crash(&mut story, fifth * 3).await?;
    let stop = phases::graceful_stop(&mut story, fifth * 4).await?;
    let hot = phases::hot_bucket(&mut story, fifth * 5).await?;
    phases::the_end(&mut story, renderer).await?;
    summary::print(
        &story,
        &summary::Outcome {
            workers: args.workers,
            cold,
            join,
            crash,
            stop,
            hot,
        },
    )
}
