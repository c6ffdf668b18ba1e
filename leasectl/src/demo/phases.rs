//! The story, one phase per fifth of its length. Each phase changes the pool once, waits
//! until the workers are balanced again (or the phase is over) and returns what it measured.

use std::time::{Duration, Instant};

use lease::store::{AdminStore, BucketState, Chain, Clock, GroupSnapshot, SystemClock, Timestamp};
use lease::{Bucket, NodeId};
use tokio::task::JoinHandle;

use super::screen::render;
use super::story::{Story, lock};
use crate::output;
use crate::output::Failure;

/// How long the pool took to balance after a change; `None` if not within the phase.
pub type Took = Option<Duration>;

/// `workers` start at once; the first fifth ends at `fifth`.
pub async fn cold_start(story: &mut Story, workers: u32, fifth: Duration) -> Result<Took, Failure> {
    story.phase(format!("cold start: {workers} workers"))?;
    let since = Instant::now();
    for _ in 0..workers {
        story.start_worker().await?;
    }
    let end = story.started + fifth;
    let took = story.until_balanced(since, end).await?;
    story.until(end).await?;
    Ok(took)
}

/// A worker joins and gets its share at once.
pub async fn join(story: &mut Story, end: Duration) -> Result<(char, Took), Failure> {
    let since = Instant::now();
    let joiner = story.start_worker().await?;
    story.phase(format!("{joiner} joins"))?;
    let end = story.started + end;
    let took = story.until_balanced(since, end).await?;
    story.until(end).await?;
    Ok((joiner, took))
}

/// What the crash phase saw.
pub struct Crash {
    /// The crashed worker's letter.
    pub letter: char,
    /// The buckets it held when it crashed.
    pub buckets: Vec<Bucket>,
    /// When it crashed, on the store's clock.
    pub at: Timestamp,
    /// When its session expired, as the store said before the crash.
    pub expiry: Timestamp,
    /// How long until the others held its buckets and were balanced.
    pub took: Took,
}

/// The first worker's task is aborted: no revoke, no leave. Its buckets move only once its
/// lease expires.
pub async fn crash(story: &mut Story, end: Duration) -> Result<Crash, Failure> {
    let letter = story.first_worker()?;
    let snap = story
        .store
        .snapshot(&story.group)
        .await
        .map_err(|e| Failure::Runtime(Chain(&e).to_string()))?;
    let victim = story.workers[&letter].node_id();
    let expiry = session_expiry(&snap, victim)?;
    let buckets: Vec<Bucket> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(victim) && b.state == BucketState::Live)
        .map(|b| b.bucket)
        .collect();
    let since = Instant::now();
    if let Some(handle) = story.workers.remove(&letter) {
        handle.abort();
    }
    let at = SystemClock.now();
    lock(&story.log).crashed(victim, at);
    lock(&story.screen).crashed.push(letter);
    story.phase(format!(
        "{letter} crashes holding {} buckets: they move only once its lease expires",
        buckets.len()
    ))?;
    let end = story.started + end;
    let took = story.until_balanced(since, end).await?;
    story.until(end).await?;
    Ok(Crash {
        letter,
        buckets,
        at,
        expiry,
        took,
    })
}

/// The first worker stops gracefully: it revokes everything and leaves, and the others take
/// its buckets at once.
pub async fn graceful_stop(story: &mut Story, end: Duration) -> Result<(char, Took), Failure> {
    let letter = story.first_worker()?;
    let since = Instant::now();
    story.phase(format!("{letter} stops gracefully"))?;
    story.stop_worker(letter).await?;
    lock(&story.screen).stopped.push(letter);
    let end = story.started + end;
    let took = story.until_balanced(since, end).await?;
    story.until(end).await?;
    Ok((letter, took))
}

/// Bucket 0 runs hot: every worker's application reports it at ten times each other
/// bucket's load (a sample every 100 ms). Alone above a fair share, it ends up alone on its
/// worker (with at most one cold bucket, within the band), and the others share the cold
/// buckets: the load-aware policy, with no leader.
pub async fn hot_bucket(story: &mut Story, end: Duration) -> Result<Took, Failure> {
    story.phase(
        "bucket 0 runs hot (10x each other bucket): its worker keeps it alone, the others \
         share the rest"
            .into(),
    )?;
    let since = Instant::now();
    let end = story.started + end;
    let mut took = None;
    while Instant::now() < end {
        story.report_loads();
        story.refresh();
        if took.is_none() && story.hot_bucket_alone() {
            took = Some(since.elapsed());
        }
        story
            .pause(Duration::from_millis(100).min(end.saturating_duration_since(Instant::now())))
            .await?;
    }
    Ok(took)
}

/// Every worker stops; the last frame is drawn below the live screen, if there was one.
pub async fn the_end(story: &mut Story, renderer: Option<JoinHandle<()>>) -> Result<(), Failure> {
    story.phase("the end: every worker stops".into())?;
    let rest: Vec<char> = story.workers.keys().copied().collect();
    for letter in rest {
        story.stop_worker(letter).await?;
    }
    if let Some(r) = renderer {
        r.abort();
        // Let the aborted renderer go before printing below it.
        tokio::task::yield_now().await;
        let snap = story.store.snapshot(&story.group).await.ok();
        story.refresh();
        output::line(format!(
            "\x1b[H\x1b[2J{}",
            render(&lock(&story.screen), snap.as_ref(), story.started.elapsed())
        ))?;
    }
    story.out.check()
}

/// When the victim's session expires, as the store's snapshot taken before the crash says;
/// without it, whether its buckets moved early cannot be judged, which is a failure, not a 0.
pub fn session_expiry(snap: &GroupSnapshot, victim: NodeId) -> Result<Timestamp, Failure> {
    snap.members
        .iter()
        .find(|m| m.worker == victim)
        .map(|m| m.expires_at)
        .ok_or_else(|| {
            Failure::Runtime(format!(
                "worker {victim} has no member row in the store before its crash, so whether \
                 its buckets moved before its lease expired cannot be checked"
            ))
        })
}
