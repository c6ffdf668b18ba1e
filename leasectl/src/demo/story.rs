//! The cast of the demo: the in-memory store, the running workers by letter, the ownership
//! log every event goes into, and the pacing helpers the phases use.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lease::audit::OwnershipLog;
use lease::memory::MemoryLeaseStore;
use lease::store::{AdminStore, Chain, Clock, SystemClock, Timestamp};
use lease::{
    Assignment, Bucket, FencingToken, GroupName, LeaseWorker, Load, NodeId, OwnershipEvent,
    OwnershipHandler, RevokeReason, ShardCount, WorkerHandle,
};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::screen::{FRAME, Screen, render};
use super::{RENEW, TTL};
use crate::output::Failure;
use crate::output::SharedOutput;

/// State the story, the handlers and the renderer share.
pub type Shared<T> = Arc<Mutex<T>>;

/// Lock `m`, whatever a panicking holder left behind: the demo only reads and appends.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Records every event in the ownership log and on the screen.
struct DemoHandler {
    worker: NodeId,
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
            OwnershipEvent::Assigned(a) => format!(
                "{} assigned bucket {} (token {})",
                self.letter, a.bucket, a.token
            ),
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
        lock(&self.screen).push_event(line);
    }
}

#[async_trait]
impl OwnershipHandler for DemoHandler {
    async fn on_assigned(&self, assignment: Assignment) {
        self.note(OwnershipEvent::Assigned(assignment));
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.note(OwnershipEvent::Revoked {
            bucket,
            token,
            reason,
        });
    }
}

/// The demo's world.
pub struct Story {
    pub store: MemoryLeaseStore,
    pub group: GroupName,
    pub shards: ShardCount,
    pub log: Shared<OwnershipLog<Timestamp>>,
    pub screen: Shared<Screen>,
    /// Running workers by letter.
    pub workers: BTreeMap<char, WorkerHandle>,
    next_letter: u8,
    /// When the story began.
    pub started: Instant,
    pub out: SharedOutput,
    /// No terminal: print events and phases as lines instead of redrawing a screen.
    plain: bool,
}

impl Story {
    /// An empty story over `shards` buckets; `plain` prints lines instead of a screen.
    pub fn new(shards: ShardCount, plain: bool) -> Result<Self, Failure> {
        Ok(Self {
            store: MemoryLeaseStore::new(),
            group: GroupName::new("demo").map_err(|e| Failure::Runtime(e.to_string()))?,
            shards,
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            screen: Arc::new(Mutex::new(Screen::default())),
            workers: BTreeMap::new(),
            next_letter: 0,
            started: Instant::now(),
            out: SharedOutput::new(CancellationToken::new()),
            plain,
        })
    }

    /// Start the next lettered worker.
    pub async fn start_worker(&mut self) -> Result<char, Failure> {
        let letter = char::from(b'A' + self.next_letter);
        self.next_letter += 1;
        let config = LeaseWorker::builder(self.group.clone(), self.shards)
            .ttl(TTL)
            .renew_interval(RENEW)
            .build()
            .map_err(|e| Failure::Runtime(format!("demo worker config: {e}")))?;
        let worker = config.node_id();
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

    /// The first running worker, by letter.
    pub fn first_worker(&self) -> Result<char, Failure> {
        self.workers
            .keys()
            .next()
            .copied()
            .ok_or_else(|| Failure::Runtime("no worker is running".into()))
    }

    /// Stop `letter` gracefully: revoke everything, leave the group.
    pub async fn stop_worker(&mut self, letter: char) -> Result<(), Failure> {
        if let Some(handle) = self.workers.remove(&letter) {
            handle
                .shutdown()
                .await
                .map_err(|e| Failure::Runtime(format!("worker {letter}: {}", Chain(&e))))?;
        }
        Ok(())
    }

    /// Copy each running worker's load onto the screen.
    pub fn refresh(&self) {
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

    /// Each running worker's application reports the loads of the buckets it owns: bucket 0
    /// weighs ten units, every other bucket one.
    pub fn report_loads(&self) {
        for handle in self.workers.values() {
            let owned: Vec<Bucket> = handle.owned().borrow().keys().copied().collect();
            for bucket in owned {
                let units = if bucket == Bucket(0) { 10.0 } else { 1.0 };
                if let Ok(load) = Load::new(units) {
                    // A worker that ended takes no report; the phase's check says so.
                    handle.report_load(bucket, load).ok();
                }
            }
        }
    }

    /// Every bucket owned, and bucket 0's worker holding it with at most one cold bucket (10
    /// units and 1 more are within the 10 % band of its target of 10: the policy moves
    /// nothing for that one).
    pub fn hot_bucket_alone(&self) -> bool {
        let owned: Vec<Vec<Bucket>> = self
            .workers
            .values()
            .map(|h| h.owned().borrow().keys().copied().collect())
            .collect();
        owned.iter().map(Vec::len).sum::<usize>() == self.shards.get() as usize
            && owned.iter().any(|o| o.contains(&Bucket(0)) && o.len() <= 2)
    }

    /// Show the story's next phase; fails once stdout did, so the story stops early.
    pub fn phase(&self, text: String) -> Result<(), Failure> {
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
    pub async fn pause(&self, d: Duration) -> Result<(), Failure> {
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.out.stopped().cancelled() => {}
        }
        self.out.check()
    }

    /// Wait until balanced (polling every 5 ms), at most until `deadline`; how long it took
    /// since `since`.
    pub async fn until_balanced(
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

    /// Keep the screen fresh until `at`.
    pub async fn until(&self, at: Instant) -> Result<(), Failure> {
        while Instant::now() < at {
            self.refresh();
            self.pause(Duration::from_millis(20).min(at - Instant::now()))
                .await?;
        }
        Ok(())
    }
}

/// A task redrawing the story's screen every frame until aborted or stdout fails.
pub fn spawn_renderer(story: &Story) -> JoinHandle<()> {
    let (screen, store, group, out, started) = (
        story.screen.clone(),
        story.store.clone(),
        story.group.clone(),
        story.out.clone(),
        story.started,
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
}
