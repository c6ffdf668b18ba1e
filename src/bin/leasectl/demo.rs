//! `leasectl demo`: a scripted story with real workers on the in-memory store.
//!
//! A cold start, a worker joining, one crashing (its task aborted: no revoke, no leave), one
//! stopping gracefully. The ownership table is redrawn live on a terminal (plain lines
//! otherwise); the summary gives the time to balance after each event, the handoffs, and the
//! overlaps the ownership log found, which must be 0.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::IsTerminal;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease::memory::MemoryLeaseStore;
use lease::ownership_log::OwnershipLog;
use lease::{
    Bucket, BucketState, Chain, Clock, FencingToken, GroupName, LeaseStore, LeaseWorker,
    OwnershipEvent, OwnershipHandler, RevokeReason, ShardCount, SystemClock, Timestamp,
    WorkerHandle, WorkerId,
};
use tokio_util::sync::CancellationToken;

use crate::output::{self, SharedOutput};
use crate::{DemoArgs, Failure};

const TTL: Duration = Duration::from_secs(2);
const RENEW: Duration = Duration::from_millis(500);
const FRAME: Duration = Duration::from_millis(100);

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the screen shows, shared by the story and the renderer.
#[derive(Default)]
struct Screen {
    phase: String,
    letters: HashMap<WorkerId, char>,
    /// Running workers by letter, with what each one's application owns.
    owned: BTreeMap<char, usize>,
    crashed: Vec<char>,
    stopped: Vec<char>,
    recent: VecDeque<String>,
}

/// Records every event in the ownership log and on the screen.
struct DemoHandler {
    worker: WorkerId,
    letter: char,
    log: Shared<OwnershipLog<Timestamp>>,
    screen: Shared<Screen>,
    started: Instant,
    /// Where event lines go when there is no screen to redraw.
    plain: Option<SharedOutput>,
}

impl DemoHandler {
    fn note(&self, event: OwnershipEvent) {
        lock(&self.log).record(self.worker, event, SystemClock.now());
        let line = match event {
            OwnershipEvent::Assigned { bucket, token } => {
                format!("{} assigned bucket {bucket} (token {token})", self.letter)
            }
            OwnershipEvent::Revoked {
                bucket,
                token,
                reason,
            } => format!(
                "{} revoked bucket {bucket} (token {token}): {}",
                self.letter,
                reason.as_str()
            ),
        };
        let line = format!("{:>6.2}s  {line}", self.started.elapsed().as_secs_f64());
        if let Some(out) = &self.plain {
            out.line(&line);
        }
        let mut screen = lock(&self.screen);
        screen.recent.push_back(line);
        while screen.recent.len() > 8 {
            screen.recent.pop_front();
        }
    }
}

#[async_trait]
impl OwnershipHandler for DemoHandler {
    async fn on_assigned(&self, bucket: Bucket, token: FencingToken) {
        self.note(OwnershipEvent::Assigned { bucket, token });
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.note(OwnershipEvent::Revoked {
            bucket,
            token,
            reason,
        });
    }
}

struct Story {
    store: MemoryLeaseStore,
    group: GroupName,
    shards: ShardCount,
    log: Shared<OwnershipLog<Timestamp>>,
    screen: Shared<Screen>,
    workers: BTreeMap<char, WorkerHandle>,
    next_letter: u8,
    started: Instant,
    out: SharedOutput,
    /// No terminal: print events and phases as lines instead of redrawing a screen.
    plain: bool,
}

impl Story {
    async fn start_worker(&mut self) -> Result<char, Failure> {
        let letter = char::from(b'A' + self.next_letter);
        self.next_letter += 1;
        let config = LeaseWorker::builder(self.group.clone(), self.shards)
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .map_err(|e| Failure::Runtime(format!("demo worker config: {e}")))?;
        let worker = config.worker_id();
        lock(&self.screen).letters.insert(worker, letter);
        let handler = DemoHandler {
            worker,
            letter,
            log: self.log.clone(),
            screen: self.screen.clone(),
            started: self.started,
            plain: self.plain.then(|| self.out.clone()),
        };
        let handle = config
            .start(self.store.clone(), handler)
            .await
            .map_err(|e| Failure::Runtime(format!("starting worker {letter}: {}", Chain(&e))))?;
        self.workers.insert(letter, handle);
        Ok(letter)
    }

    fn refresh(&self) {
        let mut screen = lock(&self.screen);
        screen.owned = self
            .workers
            .iter()
            .map(|(&l, h)| (l, h.owned().borrow().len()))
            .collect();
    }

    /// Every bucket owned by exactly one running worker's application, loads within one.
    fn balanced(&self) -> bool {
        let loads: Vec<usize> = self
            .workers
            .values()
            .map(|h| h.owned().borrow().len())
            .collect();
        let total: usize = loads.iter().sum();
        let spread = loads
            .iter()
            .max()
            .zip(loads.iter().min())
            .map(|(a, b)| a - b);
        total == self.shards.get() as usize && spread.is_some_and(|s| s <= 1)
    }

    /// Show the story's next phase; fails once stdout did, so the story stops early.
    fn phase(&self, text: String) -> Result<(), Failure> {
        if self.plain {
            self.out.line(format!(
                "{:>6.2}s  == {text}",
                self.started.elapsed().as_secs_f64()
            ));
        }
        lock(&self.screen).phase = text;
        self.out.check()
    }

    /// Sleep `d`, waking early if stdout fails.
    async fn pause(&self, d: Duration) -> Result<(), Failure> {
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.out.stopped().cancelled() => {}
        }
        self.out.check()
    }

    /// Wait until balanced (polling every 5 ms), at most until `deadline`; how long it took.
    async fn until_balanced(
        &self,
        since: Instant,
        deadline: Instant,
    ) -> Result<Option<Duration>, Failure> {
        loop {
            self.refresh();
            if self.balanced() {
                return Ok(Some(since.elapsed()));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            self.pause(Duration::from_millis(5)).await?;
        }
    }

    async fn until(&self, at: Instant) -> Result<(), Failure> {
        while Instant::now() < at {
            self.refresh();
            self.pause(Duration::from_millis(20).min(at - Instant::now()))
                .await?;
        }
        Ok(())
    }
}

fn render(screen: &Screen, snapshot: Option<&lease::GroupSnapshot>, elapsed: Duration) -> String {
    let mut lines = vec![
        format!(
            "leasectl demo: workers sharing buckets on the in-memory store (ttl {}s, renew {}ms)",
            TTL.as_secs(),
            RENEW.as_millis()
        ),
        format!("t = {:>5.1}s  {}", elapsed.as_secs_f64(), screen.phase),
        String::new(),
        "buckets (owner letter and fencing token; . = unowned, lower case = expired):".into(),
    ];
    if let Some(snap) = snapshot {
        let cells: Vec<String> = snap
            .buckets
            .iter()
            .map(|b| {
                let owner = b.owner.and_then(|w| screen.letters.get(&w).copied());
                let cell = match (b.state, owner) {
                    (BucketState::Live, Some(l)) => format!("{l}{}", b.token),
                    (BucketState::Expired, Some(l)) => {
                        format!("{}{}", l.to_ascii_lowercase(), b.token)
                    }
                    _ => ".".into(),
                };
                format!("{:>3}:{cell:<5}", b.bucket)
            })
            .collect();
        for row in cells.chunks(8) {
            lines.push(format!("  {}", row.join(" ")));
        }
    }
    lines.push(String::new());
    lines.push("workers (buckets their application owns):".into());
    for (letter, n) in &screen.owned {
        lines.push(format!("  {letter}  {n:>3}  {}", "#".repeat(*n)));
    }
    for letter in &screen.crashed {
        lines.push(format!("  {letter}  crashed"));
    }
    for letter in &screen.stopped {
        lines.push(format!("  {letter}  stopped"));
    }
    if let Some(snap) = snapshot {
        lines.push(String::new());
        lines.push(crate::status::balance_line(snap));
    }
    lines.push(String::new());
    lines.push("recent events:".into());
    lines.extend(screen.recent.iter().map(|l| format!("  {l}")));
    lines.join("\n")
}

fn validate(args: &DemoArgs) -> Result<(), Failure> {
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
    Ok(())
}

/// When the victim's session expires, as the store's snapshot taken before the crash says;
/// without it, whether its buckets moved early cannot be judged, which is a failure, not a 0.
fn session_expiry(snap: &lease::GroupSnapshot, victim: WorkerId) -> Result<Timestamp, Failure> {
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

/// How many holdings of the crashed worker's `buckets` began after the crash but before its
/// lease expired.
fn taken_before_expiry(
    log: &OwnershipLog<Timestamp>,
    buckets: &[Bucket],
    crashed_at: Timestamp,
    expiry: Timestamp,
) -> Result<usize, Failure> {
    let holdings = log
        .holdings()
        .map_err(|e| Failure::Runtime(format!("the ownership log is inconsistent: {e}")))?;
    Ok(buckets
        .iter()
        .filter_map(|b| holdings.get(b))
        .flat_map(|hs| {
            hs.iter()
                .filter(|h| h.from >= crashed_at && h.from < expiry)
        })
        .count())
}

fn fmt_took(took: Option<Duration>) -> String {
    took.map_or_else(
        || "not within this phase".to_owned(),
        |d| format!("{} ms", d.as_millis()),
    )
}

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    validate(&args)?;
    let terminal = std::io::stdout().is_terminal();
    let shards =
        ShardCount::new(args.shards).map_err(|e| Failure::Usage(format!("--shards: {e}")))?;
    let started = Instant::now();
    let mut story = Story {
        store: MemoryLeaseStore::new(),
        group: GroupName::new("demo").map_err(|e| Failure::Runtime(e.to_string()))?,
        shards,
        log: Arc::new(Mutex::new(OwnershipLog::new())),
        screen: Arc::new(Mutex::new(Screen::default())),
        workers: BTreeMap::new(),
        next_letter: 0,
        started,
        out: SharedOutput::new(CancellationToken::new()),
        plain: !terminal,
    };
    let quarter = Duration::from_secs(args.seconds) / 4;

    let renderer = terminal.then(|| {
        let (screen, store, group, out) = (
            story.screen.clone(),
            story.store.clone(),
            story.group.clone(),
            story.out.clone(),
        );
        tokio::spawn(async move {
            loop {
                let snap = store.snapshot(&group).await.ok();
                let frame = {
                    let screen = lock(&screen);
                    render(&screen, snap.as_ref(), started.elapsed())
                };
                // Home the cursor and clear the screen, then draw.
                if !out.line(format!("\x1b[H\x1b[2J{frame}")) {
                    return;
                }
                tokio::time::sleep(FRAME).await;
            }
        })
    });
    // Stdout failing stops the story wherever it is (`?`): the workers stop as their handles
    // drop.
    story.phase(format!("cold start: {} workers", args.workers))?;
    let t0 = Instant::now();
    for _ in 0..args.workers {
        story.start_worker().await?;
    }
    let cold = story.until_balanced(t0, started + quarter).await?;
    story.until(started + quarter).await?;

    let t1 = Instant::now();
    let joiner = story.start_worker().await?;
    story.phase(format!("{joiner} joins"))?;
    let join = story.until_balanced(t1, started + quarter * 2).await?;
    story.until(started + quarter * 2).await?;

    let victim = *story
        .workers
        .keys()
        .next()
        .ok_or_else(|| Failure::Runtime("no worker".into()))?;
    let snap = story
        .store
        .snapshot(&story.group)
        .await
        .map_err(|e| Failure::Runtime(Chain(&e).to_string()))?;
    let victim_id = story.workers[&victim].worker_id();
    let victim_expiry = session_expiry(&snap, victim_id)?;
    let victim_buckets: Vec<Bucket> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(victim_id) && b.state == BucketState::Live)
        .map(|b| b.bucket)
        .collect();
    let t2 = Instant::now();
    if let Some(handle) = story.workers.remove(&victim) {
        handle.abort();
    }
    let crashed_at = SystemClock.now();
    lock(&story.log).crashed(victim_id, crashed_at);
    lock(&story.screen).crashed.push(victim);
    story.phase(format!(
        "{victim} crashes holding {} buckets: they move only once its lease expires",
        victim_buckets.len()
    ))?;
    let crash = story.until_balanced(t2, started + quarter * 3).await?;
    story.until(started + quarter * 3).await?;

    let leaver = *story
        .workers
        .keys()
        .next()
        .ok_or_else(|| Failure::Runtime("no worker".into()))?;
    let t3 = Instant::now();
    story.phase(format!("{leaver} stops gracefully"))?;
    if let Some(handle) = story.workers.remove(&leaver) {
        handle
            .shutdown()
            .await
            .map_err(|e| Failure::Runtime(format!("worker {leaver}: {}", Chain(&e))))?;
    }
    lock(&story.screen).stopped.push(leaver);
    let stop = story.until_balanced(t3, started + quarter * 4).await?;
    story.until(started + quarter * 4).await?;

    story.phase("the end: every worker stops".into())?;
    let rest: Vec<char> = story.workers.keys().copied().collect();
    for letter in rest {
        if let Some(handle) = story.workers.remove(&letter) {
            handle
                .shutdown()
                .await
                .map_err(|e| Failure::Runtime(format!("worker {letter}: {}", Chain(&e))))?;
        }
    }
    if let Some(r) = renderer {
        r.abort();
        // Let the aborted renderer go before printing below it.
        tokio::task::yield_now().await;
        let snap = story.store.snapshot(&story.group).await.ok();
        story.refresh();
        output::line(format!(
            "\x1b[H\x1b[2J{}",
            render(&lock(&story.screen), snap.as_ref(), started.elapsed())
        ))?;
    }
    story.out.check()?;

    let log = lock(&story.log).clone();
    // The crashed worker's buckets: every holding that began after the crash must begin
    // after its lease expired.
    let early = taken_before_expiry(&log, &victim_buckets, crashed_at, victim_expiry)?;
    let checked = log.check();
    let mut summary = vec![
        String::new(),
        "summary".to_owned(),
        format!(
            "  cold start ({} workers, {} buckets): balanced after {}",
            args.workers,
            args.shards,
            fmt_took(cold)
        ),
        format!("  {joiner} joined: balanced after {}", fmt_took(join)),
        format!(
            "  {victim} crashed holding {} buckets: re-owned and balanced after {} (they \
             wait for its lease, ttl {}s, to expire); taken before expiry: {early}",
            victim_buckets.len(),
            fmt_took(crash),
            TTL.as_secs()
        ),
        format!(
            "  {leaver} stopped gracefully: its buckets re-owned and balanced after {}",
            fmt_took(stop)
        ),
    ];
    let verdict = match checked {
        Ok(checked) => {
            let reasons: Vec<String> = checked
                .revocations
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            summary.push(format!(
                "  {} assignments, {} handoffs, revocations: {}",
                checked.assignments,
                checked.handoffs,
                reasons.join(", ")
            ));
            summary.push(format!(
                "  overlaps found: 0 (no bucket held by two workers at once, over {} events)",
                log.entries().len()
            ));
            if early > 0 {
                Err(Failure::Runtime(format!(
                    "{early} of the crashed worker's buckets moved before its lease expired"
                )))
            } else {
                Ok(())
            }
        }
        Err(overlap) => {
            summary.push(format!("  overlaps found: 1 or more: {overlap}"));
            Err(Failure::Runtime(
                "the ownership log found an overlap".into(),
            ))
        }
    };
    for line in summary {
        if let Err(lost) = output::line(line) {
            // A defect found outranks a reader that went away.
            return verdict.and(Err(lost.failure()));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use lease::{GroupSnapshot, MemberInfo, MemberMetadata, SessionId};

    use super::*;

    fn snapshot_with(members: &[WorkerId]) -> GroupSnapshot {
        let now = SystemClock.now();
        GroupSnapshot {
            group: GroupName::new("demo").expect("name"),
            shard_count: ShardCount::new(4).expect("n"),
            observed_at: now,
            members: members
                .iter()
                .map(|&worker| MemberInfo {
                    worker,
                    session: SessionId::new(),
                    joined_at: now,
                    heartbeat_at: now,
                    expires_at: now + TTL,
                    live: true,
                    owned: 0,
                    metadata: MemberMetadata::empty(),
                })
                .collect(),
            buckets: Vec::new(),
        }
    }

    #[test]
    fn a_crashed_worker_without_an_expiry_is_an_error_not_zero_early() {
        let victim = WorkerId::new();
        let snap = snapshot_with(&[WorkerId::new()]);
        assert!(matches!(
            session_expiry(&snap, victim),
            Err(Failure::Runtime(message)) if message.contains("no member row")
        ));
        let snap = snapshot_with(&[victim]);
        assert_eq!(
            session_expiry(&snap, victim).ok(),
            Some(snap.members[0].expires_at)
        );
    }
}
