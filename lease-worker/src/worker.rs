//! The worker task: heartbeat, plan, claim or shed, tell the application; self-fence when
//! renewals stop succeeding; stop gracefully.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::LeaseWorker;
use crate::events::{OwnershipHandler, WorkerError, WorkerFailed};
use crate::metrics::Metrics;
use lease_core::LeaseStore;
use lease_core::RevokeReason;
use lease_core::policy;
use lease_core::{Bucket, FencingToken, Incarnation, SessionId, WorkerId};
use lease_core::{Change, ChangeFeed};
use lease_core::{Operation, StoreError};

/// The buckets the application currently owns, with their tokens.
pub type Owned = BTreeMap<Bucket, FencingToken>;

/// A running worker. Dropping it stops the worker gracefully in the background; call
/// [`shutdown`](Self::shutdown) to wait for that.
#[derive(Debug)]
pub struct WorkerHandle {
    worker: WorkerId,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), WorkerFailed>>>,
    owned: watch::Receiver<Owned>,
}

impl WorkerHandle {
    /// The worker's id.
    pub fn worker_id(&self) -> WorkerId {
        self.worker
    }

    /// The buckets the application owns right now; changes as events are delivered.
    pub fn owned(&self) -> watch::Receiver<Owned> {
        self.owned.clone()
    }

    /// The token that stops the worker when cancelled.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Whether the worker task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stop gracefully (revoke everything, leave the group, wake the peers) and wait for it.
    /// Returns how the task ended: an error if it had failed before it was asked to stop, or
    /// [`WorkerFailed::LeaveFailed`] if it could not leave the group (its leases then expire
    /// after the ttl instead of passing on at once).
    pub async fn shutdown(mut self) -> Result<(), WorkerFailed> {
        self.cancel.cancel();
        self.wait().await
    }

    /// Wait until the worker task ends, without asking it to: after its token is cancelled,
    /// or because it failed (a handler panicked, or the store answered in a way retrying
    /// cannot change). A failure is an error; the owned set is empty either way.
    pub async fn wait(&mut self) -> Result<(), WorkerFailed> {
        let Some(task) = self.task.as_mut() else {
            return Ok(());
        };
        let result = task.await;
        self.task = None;
        match result {
            Ok(ended) => ended,
            Err(e) if e.is_panic() => Err(WorkerFailed::HandlerPanicked {
                message: panic_message(e.into_panic()),
            }),
            Err(_) => Err(WorkerFailed::Cancelled),
        }
    }

    /// Stop the task at once, without revoking or leaving: what a crash looks like to the
    /// other workers (tests and demos).
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The text a panic was raised with, when it was text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&'static str>().map_or_else(
            || "a panic without a message".to_owned(),
            |s| (*s).to_owned(),
        ),
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl LeaseWorker {
    /// Create the group if needed (failing on a shard-count mismatch), subscribe to its
    /// wake-ups, and start the worker task on the current tokio runtime.
    pub async fn start<S, H>(self, store: S, handler: H) -> Result<WorkerHandle, StoreError>
    where
        S: LeaseStore + 'static,
        H: OwnershipHandler,
    {
        store.ensure_group(&self.group, self.shards).await?;
        let feed = match store.changes(&self.group).await {
            Ok(feed) => feed,
            Err(e) => {
                // Wake-ups only speed things up; the worker still re-plans every interval.
                tracing::warn!(group = %self.group, error = %e, "no change feed; re-planning on the renew interval only");
                None
            }
        };
        let (tx, rx) = watch::channel(Owned::new());
        let worker = self.worker;
        let cancel = self.cancel.clone();
        let span = tracing::info_span!("lease_worker", group = %self.group, worker = %worker);
        let ttl = self.ttl.as_duration();
        let task = Task {
            metrics: Metrics::new(&self.group),
            call_timeout: self.renew_interval.max(ttl / 2),
            cfg: self,
            store: Arc::new(store),
            handler,
            feed,
            incarnation: Incarnation::new(),
            session: None,
            owned: Owned::new(),
            unreleased: BTreeSet::new(),
            trusted_until: None,
            last_sent: None,
            published: Published(tx),
        };
        let task = tokio::spawn(task.run().instrument(span));
        Ok(WorkerHandle {
            worker,
            cancel,
            task: Some(task),
            owned: rx,
        })
    }
}

struct Task<S, H> {
    cfg: LeaseWorker,
    store: Arc<S>,
    handler: H,
    feed: Option<ChangeFeed>,
    /// This start of the worker: its sessions are its own (see `LeaseStore::heartbeat`, H7).
    incarnation: Incarnation,
    /// The session the last successful heartbeat returned.
    session: Option<SessionId>,
    /// What the application has been told it owns.
    owned: Owned,
    /// Revoked for shedding, not yet confirmed released.
    unreleased: BTreeSet<Bucket>,
    /// The local instant until which the leases are trusted.
    trusted_until: Option<Instant>,
    /// When the last successful heartbeat was sent.
    last_sent: Option<Instant>,
    published: Published,
    call_timeout: Duration,
    metrics: Metrics,
}

/// The owned-set sender. However the task ends, a normal stop or a panicking handler, the
/// application's view is emptied: a worker that is gone owns nothing it can vouch for.
struct Published(watch::Sender<Owned>);

impl Drop for Published {
    fn drop(&mut self) {
        self.0.send_replace(Owned::new());
    }
}

/// The most buckets one claim asks for. A worker that needs more claims in batches, each after
/// a fresh heartbeat: a worker alone in a big group when the others are starting stops at its
/// share as soon as they show up, instead of taking (and then shedding) the whole group, and
/// no statement holds thousands of row locks at a time.
const CLAIM_BATCH: u32 = 512;

/// How a completed tick left the claims.
enum Claimed {
    /// Nothing more to claim now: next tick on the renew cadence.
    All,
    /// A full batch was claimed and the plan wants more: tick again at once.
    Batch,
}

/// Why a tick did not complete.
enum TickError {
    /// A store call failed or timed out: report it and retry with backoff.
    Retry(WorkerError),
    /// The group holds another shard count than the worker's: stop.
    ShardCountChanged {
        /// The stored count.
        found: lease_core::ShardCount,
    },
}

impl From<WorkerError> for TickError {
    fn from(e: WorkerError) -> Self {
        Self::Retry(e)
    }
}

/// Sleep until `at`, or forever if there is nothing to wait for.
async fn sleep_until_or_never(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The next wake-up; `None` once the feed closed; pending without a feed.
async fn next_change(feed: &mut Option<ChangeFeed>) -> Option<Change> {
    match feed {
        Some(feed) => feed.recv().await,
        None => std::future::pending().await,
    }
}

impl<S: LeaseStore + 'static, H: OwnershipHandler> Task<S, H> {
    async fn run(mut self) -> Result<(), WorkerFailed> {
        let mut next_tick = Instant::now();
        let mut failures: u32 = 0;
        loop {
            tokio::select! {
                biased;
                () = self.cfg.cancel.cancelled() => break,
                () = sleep_until_or_never(self.fence_at()) => {
                    self.fence().await;
                    continue;
                }
                () = sleep_until(next_tick) => {}
                woke = next_change(&mut self.feed) => {
                    let Some(change) = woke else {
                        tracing::warn!("change feed closed; re-planning on the renew interval only");
                        self.feed = None;
                        continue;
                    };
                    tracing::debug!(?change, "woken by a change");
                    tokio::time::sleep(self.cfg.wake_debounce).await;
                    if let Some(feed) = &mut self.feed {
                        while feed.try_recv().is_some() {}
                    }
                }
            }
            let started = Instant::now();
            let result = self
                .tick()
                .instrument(tracing::debug_span!("lease_tick"))
                .await;
            self.metrics.tick(started.elapsed());
            match result {
                Ok(Claimed::All) => {
                    failures = 0;
                    // Renew on a cadence counted from when the last heartbeat was sent, the
                    // instant trust is counted from: a slow tick does not push the next
                    // renewal past the trust deadline.
                    next_tick =
                        self.last_sent.unwrap_or_else(Instant::now) + self.cfg.renew_interval;
                }
                Ok(Claimed::Batch) => {
                    // More to claim: tick again at once, on a fresh view of the group.
                    failures = 0;
                    next_tick = Instant::now();
                }
                Err(TickError::ShardCountChanged { found }) => {
                    // The group was deleted and re-created with another count: the buckets this
                    // worker routes by are not the group's any more. Retrying cannot help.
                    let (group, configured) = (self.cfg.group.clone(), self.cfg.shards);
                    let mismatch = || StoreError::ShardCountMismatch {
                        group: group.clone(),
                        configured,
                        found,
                    };
                    tracing::error!(error = %mismatch(), "stopping the worker");
                    self.metrics.error();
                    let reported = WorkerError::Store {
                        operation: Operation::Heartbeat,
                        source: mismatch(),
                    };
                    self.handler.on_error(&reported).await;
                    // A failed leave is reported by `stop`; the mismatch is why the worker ended.
                    self.stop(RevokeReason::Lost).await.ok();
                    return Err(WorkerFailed::Store(mismatch()));
                }
                Err(TickError::Retry(e)) => {
                    failures = failures.saturating_add(1);
                    self.report(&e).await;
                    next_tick = Instant::now() + self.backoff(failures);
                }
            }
            self.publish();
        }
        self.stop(RevokeReason::Shutdown)
            .await
            .map_err(|source| WorkerFailed::LeaveFailed { source })
    }

    /// 100 ms, doubling per consecutive failure, capped at the renew interval.
    fn backoff(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(16);
        (Duration::from_millis(100) * 2u32.pow(exp)).min(self.cfg.renew_interval)
    }

    /// When the leases stop being trusted, if any are held.
    fn fence_at(&self) -> Option<Instant> {
        if self.owned.is_empty() {
            None
        } else {
            Some(self.trusted_until.unwrap_or_else(Instant::now))
        }
    }

    fn trusted(&self) -> bool {
        self.trusted_until.is_some_and(|t| Instant::now() < t)
    }

    async fn report(&self, e: &WorkerError) {
        tracing::warn!(error = %lease_core::Chain(e), "lease worker error; retrying");
        self.metrics.error();
        self.handler.on_error(e).await;
    }

    /// Apply one change to the published owned set: a bucket at a time, not a copy of the
    /// whole set per bucket (a worker assigned thousands of buckets would copy quadratically).
    fn publish_change(&self, change: impl FnOnce(&mut Owned)) {
        self.metrics.owned(self.owned.len());
        self.published.0.send_modify(change);
    }

    /// Make the published owned set equal to `owned` (after a tick, and on stopping).
    fn publish(&self) {
        self.metrics.owned(self.owned.len());
        self.published.0.send_if_modified(|current| {
            if *current == self.owned {
                false
            } else {
                current.clone_from(&self.owned);
                true
            }
        });
    }

    /// Whether a renewal is due: assigning more now would delay it.
    fn renewal_due(&self) -> bool {
        self.last_sent
            .is_some_and(|sent| Instant::now() >= sent + self.cfg.renew_interval)
    }

    /// Tell the application it owns `bucket`, unless the leases are no longer trusted or a
    /// renewal is due (slow handlers must not starve the heartbeat). Returns whether it did;
    /// false means stop assigning: the next tick, which starts at once, renews and resumes.
    async fn assign(&mut self, bucket: Bucket, token: FencingToken) -> bool {
        if !self.trusted() || self.renewal_due() {
            return false;
        }
        self.handler.on_assigned(bucket, token).await;
        self.owned.insert(bucket, token);
        self.publish_change(|owned| {
            owned.insert(bucket, token);
        });
        if !self.trusted() {
            // The handler outlasted the trust deadline: nothing held can be trusted now.
            self.fence().await;
            return false;
        }
        true
    }

    async fn revoke(&mut self, bucket: Bucket, reason: RevokeReason) {
        if let Some(token) = self.owned.remove(&bucket) {
            self.handler.on_revoked(bucket, token, reason).await;
            self.metrics.revoked(reason);
            self.publish_change(|owned| {
                owned.remove(&bucket);
            });
        }
    }

    async fn revoke_all(&mut self, reason: RevokeReason) {
        let buckets: Vec<Bucket> = self.owned.keys().copied().collect();
        for bucket in buckets {
            self.revoke(bucket, reason).await;
        }
    }

    /// Stop trusting every lease: the store may hand them to others from now on.
    async fn fence(&mut self) {
        tracing::warn!(
            owned = self.owned.len(),
            "renewals did not succeed in time; revoking every bucket"
        );
        self.revoke_all(RevokeReason::Expired).await;
    }

    /// Await a store call, fencing if the trust deadline passes meanwhile, and giving up after
    /// the call timeout.
    async fn call<T>(
        &mut self,
        operation: Operation,
        fut: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, WorkerError> {
        tokio::pin!(fut);
        let deadline = Instant::now() + self.call_timeout;
        loop {
            tokio::select! {
                result = &mut fut => {
                    return result.map_err(|source| WorkerError::Store { operation, source });
                }
                () = sleep_until(deadline) => {
                    return Err(WorkerError::Timeout { operation, after: self.call_timeout });
                }
                () = sleep_until_or_never(self.fence_at()) => self.fence().await,
            }
        }
    }

    /// Release the shed buckets not released yet; returns how many were. The store may skip a
    /// bucket another transaction holds: a claim re-checking a row holds it for an instant, so
    /// a few quick retries release it; an application's fencing transaction may hold it
    /// longer, so after those it stays here for the next tick (dropped if the heartbeat shows
    /// it is not held any more).
    async fn release(&mut self, session: SessionId) -> Result<u32, WorkerError> {
        const QUICK_RETRIES: u32 = 3;
        let mut total = 0u32;
        for attempt in 0..=QUICK_RETRIES {
            if self.unreleased.is_empty() {
                break;
            }
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (store, group, me) = (self.store.clone(), self.cfg.group.clone(), self.cfg.worker);
            let buckets: Vec<Bucket> = self.unreleased.iter().copied().collect();
            let released = self
                .call(Operation::Release, async move {
                    store.release(&group, me, session, &buckets).await
                })
                .await?;
            for bucket in &released {
                self.unreleased.remove(bucket);
            }
            total = total.saturating_add(u32::try_from(released.len()).unwrap_or(u32::MAX));
        }
        if !self.unreleased.is_empty() {
            tracing::debug!(
                left = self.unreleased.len(),
                "some shed buckets are held by another transaction; retrying next tick"
            );
        }
        Ok(total)
    }

    async fn tick(&mut self) -> Result<Claimed, TickError> {
        let cfg = &self.cfg;
        let (store, group, me) = (self.store.clone(), cfg.group.clone(), cfg.worker);
        let (ttl, metadata, incarnation) = (cfg.ttl, cfg.metadata.clone(), self.incarnation);
        let sent_at = Instant::now();
        let beat = self
            .call(Operation::Heartbeat, async move {
                store
                    .heartbeat(&group, me, incarnation, ttl, &metadata)
                    .await
            })
            .await?;
        self.last_sent = Some(sent_at);
        self.trusted_until = Some(sent_at + self.cfg.ttl.as_duration() - self.cfg.safety_margin());

        if beat.new_session || self.session != Some(beat.session) {
            // Nothing held under the old session is ours any more. (A session this worker did
            // not know of is also new to it: the answer that started it was lost.)
            self.revoke_all(RevokeReason::Expired).await;
            self.unreleased.clear();
        }
        self.session = Some(beat.session);
        if beat.view.shard_count != self.cfg.shards {
            self.revoke_all(RevokeReason::Lost).await;
            return Err(TickError::ShardCountChanged {
                found: beat.view.shard_count,
            });
        }
        let held: Owned = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
        let gone: Vec<Bucket> = self
            .owned
            .iter()
            .filter(|&(b, t)| held.get(b) != Some(t))
            .map(|(&b, _)| b)
            .collect();
        for bucket in gone {
            self.revoke(bucket, RevokeReason::Lost).await;
        }
        self.unreleased.retain(|b| held.contains_key(b));
        // Buckets the store says are ours that the application was not told of (a claim whose
        // answer was lost, or leases revoked by self-fencing that the store kept alive).
        for (&bucket, &token) in &held {
            if !self.owned.contains_key(&bucket)
                && !self.unreleased.contains(&bucket)
                && !self.assign(bucket, token).await
            {
                break;
            }
        }
        let retried = self.release(beat.session).await?;

        let mine: Vec<Bucket> = self.owned.keys().copied().collect();
        let mut view = beat.view;
        view.claimable += retried;
        let plan = policy::plan(&view, me, &mine);
        tracing::debug!(
            members = view.members.len(),
            claimable = view.claimable,
            owned = mine.len(),
            target = plan.target,
            claim = plan.claim,
            shed = plan.shed.len(),
            "planned"
        );

        if !plan.shed.is_empty() {
            // Revoke first, release after: the next owner can only start once we stopped.
            for &bucket in &plan.shed {
                self.revoke(bucket, RevokeReason::Shed).await;
                self.unreleased.insert(bucket);
            }
            self.release(beat.session).await?;
        }
        if plan.claim == 0 {
            return Ok(Claimed::All);
        }
        let (store, group, session) = (self.store.clone(), self.cfg.group.clone(), beat.session);
        let want = plan.claim.min(CLAIM_BATCH);
        let won = self
            .call(Operation::Claim, async move {
                store.claim(&group, me, session, want).await
            })
            .await?;
        self.metrics.claimed(won.len());
        let full = u32::try_from(won.len()).is_ok_and(|n| n == want);
        for lease in won {
            if !self.assign(lease.bucket, lease.token).await {
                // No longer trusted: the next heartbeat finds the rest held and assigns
                // them then, or starts a new session.
                break;
            }
        }
        Ok(if want < plan.claim && full {
            Claimed::Batch
        } else {
            Claimed::All
        })
    }

    /// Revoke everything with `reason`, then leave the group if this worker holds a session in
    /// it (never another process's session under the same worker id). Fails, after reporting
    /// it, if the leave failed: the caller must know its leases were not handed on.
    async fn stop(&mut self, reason: RevokeReason) -> Result<(), WorkerError> {
        self.revoke_all(reason).await;
        self.publish();
        let Some(session) = self.session else {
            return Ok(());
        };
        let (store, group, me) = (self.store.clone(), self.cfg.group.clone(), self.cfg.worker);
        match self
            .call(Operation::Leave, async move {
                store.leave(&group, me, Some(session)).await
            })
            .await
        {
            Ok(released) => {
                tracing::info!(released = released.len(), "left the group");
                Ok(())
            }
            Err(e) => {
                self.report(&e).await;
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::event_channel;
    use lease_core::MockLeaseStore;
    use lease_core::{Clock, ManualClock};
    use lease_core::{GroupName, SessionId, ShardCount};
    use lease_core::{GroupView, Heartbeat, Lease, MemberLoad};

    /// Counts of each store call the mock saw.
    #[derive(Default)]
    struct Calls {
        ensure: AtomicUsize,
        changes: AtomicUsize,
        heartbeat: AtomicUsize,
        claim: AtomicUsize,
        release: AtomicUsize,
        leave: AtomicUsize,
    }

    impl Calls {
        fn get(n: &AtomicUsize) -> usize {
            n.load(Ordering::SeqCst)
        }

        fn count(n: &AtomicUsize) -> usize {
            n.fetch_add(1, Ordering::SeqCst)
        }
    }

    /// In steady state (the worker holds its fair share, nothing claimable) a tick is one
    /// heartbeat and nothing else. Every call is counted by the mock and the counts are checked
    /// here, after the worker stopped: an expectation checked when the mock drops inside the
    /// worker task would only be logged.
    #[tokio::test(start_paused = true)]
    async fn a_steady_tick_is_one_heartbeat() {
        let me = WorkerId::new();
        let other = WorkerId::new();
        let session = SessionId::new();
        let now = ManualClock::new().now();
        let shards = ShardCount::new(8).unwrap();
        let calls = Arc::new(Calls::default());
        let mut store = MockLeaseStore::new();
        let c = calls.clone();
        store.expect_ensure_group().returning(move |_, _| {
            Calls::count(&c.ensure);
            Ok(())
        });
        let c = calls.clone();
        store.expect_changes().returning(move |_| {
            Calls::count(&c.changes);
            Ok(None)
        });
        let c = calls.clone();
        store
            .expect_heartbeat()
            .returning(move |_, worker, _, _, _| {
                let first = Calls::count(&c.heartbeat) == 0;
                let owned: Vec<Lease> = (0..4)
                    .map(|b| Lease {
                        bucket: Bucket(b),
                        owner: worker,
                        token: FencingToken(1),
                        expires_at: now,
                    })
                    .collect();
                let mut members = vec![
                    MemberLoad { worker, owned: 4 },
                    MemberLoad {
                        worker: other,
                        owned: 4,
                    },
                ];
                members.sort_by_key(|m| m.worker);
                Ok(Heartbeat {
                    session,
                    new_session: first,
                    observed_at: now,
                    expires_at: now,
                    view: GroupView {
                        shard_count: shards,
                        members,
                        claimable: 0,
                    },
                    owned,
                })
            });
        let c = calls.clone();
        store.expect_claim().returning(move |_, _, _, _| {
            Calls::count(&c.claim);
            Ok(Vec::new())
        });
        let c = calls.clone();
        store.expect_release().returning(move |_, _, _, _| {
            Calls::count(&c.release);
            Ok(Vec::new())
        });
        let c = calls.clone();
        store.expect_leave().returning(move |_, _, left| {
            assert_eq!(left, Some(session), "the worker left under another session");
            Calls::count(&c.leave);
            Ok(Vec::new())
        });

        let (handler, mut events) = event_channel(64);
        let handle = LeaseWorker::builder(GroupName::new("g").unwrap(), shards)
            .worker_id(me)
            .ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_secs(1))
            .build()
            .unwrap()
            .start(store, handler)
            .await
            .unwrap();
        // Ticks at 0 s, 1 s, ... 10 s.
        tokio::time::sleep(Duration::from_millis(10_500)).await;
        assert!(!handle.is_finished(), "the worker stopped");
        assert_eq!(handle.owned().borrow().len(), 4);
        handle.shutdown().await.expect("a clean stop");
        assert_eq!(Calls::get(&calls.ensure), 1, "ensure_group calls");
        assert_eq!(Calls::get(&calls.changes), 1, "changes calls");
        assert_eq!(Calls::get(&calls.heartbeat), 11, "heartbeats in 10.5 s");
        assert_eq!(Calls::get(&calls.claim), 0, "claims in steady state");
        assert_eq!(Calls::get(&calls.release), 0, "releases in steady state");
        assert_eq!(Calls::get(&calls.leave), 1, "leave calls");
        let mut assigned = 0;
        let mut revoked = 0;
        while let Ok(e) = events.try_recv() {
            match e {
                lease_core::OwnershipEvent::Assigned { .. } => assigned += 1,
                lease_core::OwnershipEvent::Revoked { reason, .. } => {
                    assert_eq!(reason, RevokeReason::Shutdown);
                    revoked += 1;
                }
            }
        }
        assert_eq!((assigned, revoked), (4, 4));
    }
}
