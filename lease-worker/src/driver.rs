//! The tokio task that drives a worker's [`Machine`]: it makes the store calls the machine
//! asks for (each on a task of its own, so the machine can revoke at the trust deadline while a
//! call hangs, and a call it gives up on is dropped), delivers its events to the application,
//! feeds it the change feed's wake-ups and a stop request, and publishes what the application
//! owns, metrics and logs. No rule lives here.

use std::sync::Arc;

use async_trait::async_trait;
use lease_core::{
    Assignment, Bucket, Chain, ChangeFeed, FencingToken, GroupName, Incarnation, LeaseStore,
    MemberMetadata, Operation, RevokeReason, StoreError, Ttl, WorkerId,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::config::LeaseWorker;
use crate::events::{OwnershipHandler, WorkerError, WorkerFailed};
use crate::leases::{LeaseSender, Leases};
use crate::machine::{
    ClockStep, Delivery, Input, Machine, Output, Owned, Report, Rules, StoreCall,
};
use crate::metrics::Metrics;
use crate::registry::Running;

/// How the driver reaches the application: through an [`OwnershipHandler`] (each event awaited
/// in turn) or through per-bucket leases ([`LeaseSender`]).
#[async_trait]
pub(crate) trait Application: Send + 'static {
    /// Tell the application it owns a bucket.
    async fn assign(&mut self, assignment: Assignment);

    /// Tell the application it does not own `bucket` any more; returns whether it has
    /// stopped working on it already (an acknowledgement coming later otherwise).
    async fn revoke(&mut self, bucket: Bucket, token: FencingToken, reason: RevokeReason) -> bool;

    /// Report an error the worker survived.
    async fn error(&mut self, error: &WorkerError);

    /// The next revoked bucket the application stopped working on, when acknowledgements
    /// come later than [`revoke`](Self::revoke) returns; pending for ever otherwise.
    async fn next_ack(&mut self) -> Bucket {
        std::future::pending().await
    }
}

/// An [`OwnershipHandler`]: a revocation is acknowledged when `on_revoked` returns.
pub(crate) struct Handler<H>(pub(crate) H);

#[async_trait]
impl<H: OwnershipHandler> Application for Handler<H> {
    async fn assign(&mut self, assignment: Assignment) {
        self.0.on_assigned(assignment).await;
    }

    async fn revoke(&mut self, bucket: Bucket, token: FencingToken, reason: RevokeReason) -> bool {
        self.0.on_revoked(bucket, token, reason).await;
        true
    }

    async fn error(&mut self, error: &WorkerError) {
        self.0.on_error(error).await;
    }
}

/// A store call in flight: its operation, and the task making it.
struct Call {
    operation: Operation,
    task: JoinHandle<Input>,
}

/// A call nobody waits for any more is stopped, however the driver let go of it (the machine
/// gave up on it, the worker finished, the worker task ended or was aborted): a detached call
/// would still reach the store later, a leave reported failed leaving after all, and it would
/// keep a connection it may hold mid-statement.
impl Drop for Call {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Everything a worker task needs.
pub(crate) struct Driver<S, A> {
    machine: Machine,
    store: Arc<S>,
    app: A,
    feed: Option<ChangeFeed>,
    cancel: CancellationToken,
    published: Published,
    /// Until when the leases are trusted, for per-bucket leases to watch.
    trust: watch::Sender<Option<std::time::Instant>>,
    metrics: Metrics,
    call: Option<Call>,
    metadata: MemberMetadata,
    /// Held until the task ends: the worker id is running in this process meanwhile.
    _running: Running,
}

/// The owned-set sender. However the task ends, a normal stop or a panicking handler, the
/// application's view is emptied: a worker that is gone owns nothing it can vouch for.
pub(crate) struct Published(pub(crate) watch::Sender<Owned>);

impl Drop for Published {
    fn drop(&mut self) {
        self.0.send_replace(Owned::new());
    }
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// Sleep until `at`, or forever if there is nothing to wait for.
async fn sleep_until_or_never(at: Option<std::time::Instant>) {
    match at {
        Some(at) => sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The next wake-up; `None` once the feed closed; pending without a feed.
async fn next_change(feed: &mut Option<ChangeFeed>) -> Option<lease_core::Change> {
    match feed {
        Some(feed) => feed.recv().await,
        None => std::future::pending().await,
    }
}

/// The answer of a call in flight; pending without one.
async fn answer(call: &mut Option<Call>) -> Input {
    match call {
        Some(call) => {
            let result = (&mut call.task).await;
            match result {
                Ok(input) => input,
                // The call's task panicked (a store that panics) or was cancelled: a failure of
                // the operation like any other.
                Err(e) => failed(
                    call.operation,
                    format!("the store call did not finish: {e}"),
                ),
            }
        }
        None => std::future::pending().await,
    }
}

fn failed(operation: Operation, detail: String) -> Input {
    let e = StoreError::backend_detail(operation, lease_core::BackendFailure::Other, detail);
    match operation {
        Operation::Heartbeat => Input::Heartbeat(Err(e)),
        Operation::Claim => Input::Claimed(Err(e)),
        Operation::Leave => Input::Left(Err(e)),
        _ => Input::Released(Err(e)),
    }
}

impl<S: LeaseStore + 'static, A: Application> Driver<S, A> {
    pub(crate) async fn run(mut self) -> Result<(), WorkerFailed> {
        let mut stop_sent = false;
        loop {
            while let Some(out) = self.machine.poll(now()) {
                match out {
                    Output::Call(call) => self.spawn(call),
                    Output::Deliver(d) => self.deliver(d).await,
                    Output::Report(r) => self.report(r).await,
                    Output::Finished(ended) => {
                        self.publish();
                        if let Err(WorkerFailed::LeaveFailed { source }) = &ended {
                            tracing::warn!(error = %Chain(source), "could not leave the group");
                            self.metrics.error();
                            self.app.error(source).await;
                        }
                        return ended;
                    }
                }
            }
            if self.machine.awaits().is_none() {
                // The machine gave up on it (timed out): stop it.
                self.call = None;
            }
            self.publish();
            tokio::select! {
                biased;
                () = self.cancel.cancelled(), if !stop_sent => {
                    stop_sent = true;
                    self.machine.handle(now(), Input::Stop);
                }
                input = answer(&mut self.call) => {
                    self.call = None;
                    if let Input::Claimed(Ok(won)) = &input {
                        self.metrics.claimed(won.len());
                    }
                    self.machine.handle(now(), input);
                }
                () = sleep_until_or_never(self.machine.poll_timeout()) => {
                    self.machine.handle_timeout(now());
                }
                bucket = self.app.next_ack() => {
                    self.machine.handle(now(), Input::Acked(bucket));
                }
                change = next_change(&mut self.feed) => match change {
                    Some(change) => {
                        tracing::debug!(?change, "woken by a change");
                        self.machine.handle(now(), Input::Wake);
                    }
                    None => {
                        tracing::warn!("change feed closed; re-planning on the renew interval only");
                        self.feed = None;
                        self.metrics.polling(true);
                    }
                },
            }
        }
    }

    fn spawn(&mut self, call: StoreCall) {
        let store = self.store.clone();
        let rules = self.machine.rules().clone();
        let metadata = self.metadata.clone();
        let operation = call.operation();
        let task = tokio::spawn(async move {
            let (group, worker) = (&rules.group, rules.worker);
            match call {
                StoreCall::Heartbeat => Input::Heartbeat(
                    store
                        .heartbeat(group, worker, rules.incarnation, rules.ttl, &metadata)
                        .await,
                ),
                StoreCall::Claim {
                    session,
                    want,
                    takeover,
                } => Input::Claimed(store.claim(group, worker, session, want, takeover).await),
                StoreCall::Release { session, buckets } => {
                    Input::Released(store.release(group, worker, session, &buckets).await)
                }
                StoreCall::Leave { session } => {
                    Input::Left(store.leave(group, worker, Some(session)).await)
                }
            }
        });
        // A call still held here is one the machine gave up on: replacing it stops it.
        self.call = Some(Call { operation, task });
    }

    async fn deliver(&mut self, d: Delivery) {
        match d {
            Delivery::Assign { bucket, token } => {
                self.app
                    .assign(self.machine.assignment(bucket, token))
                    .await;
                self.published.0.send_modify(|owned| {
                    owned.insert(bucket, token);
                });
                self.machine.handle(now(), Input::Delivered);
            }
            Delivery::Revoke {
                bucket,
                token,
                reason,
            } => {
                self.metrics.revoked(reason);
                let acked = self.app.revoke(bucket, token, reason).await;
                self.published.0.send_modify(|owned| {
                    owned.remove(&bucket);
                });
                self.machine.handle(
                    now(),
                    if acked {
                        Input::Acked(bucket)
                    } else {
                        Input::Delivered
                    },
                );
            }
        }
        self.metrics.owned(self.machine.owned().len());
    }

    async fn report(&mut self, r: Report) {
        match r {
            Report::Error(e) => {
                tracing::warn!(error = %Chain(&e), "lease worker error; retrying");
                self.metrics.error();
                self.app.error(&e).await;
            }
            Report::Claimed(n) => tracing::debug!(claimed = n, "claimed"),
            Report::Stuck { bucket } => {
                tracing::error!(
                    %bucket,
                    "the application did not stop working on a revoked bucket in time; it is \
                     kept, not released, until the session ends"
                );
                self.metrics.stuck();
            }
            Report::Fenced { owned } => tracing::warn!(
                owned,
                "renewals did not succeed in time; revoking every bucket"
            ),
            Report::TickCompleted { took } => self.metrics.tick(took),
            Report::ClockStep(ClockStep::Forward(by)) => {
                tracing::warn!(
                    at_least = ?by,
                    "the store's clock stepped forward: taking no dead session's bucket for a \
                     ttl, until their holders have fenced"
                );
                self.metrics.clock_step(true);
            }
            Report::Resized {
                from,
                to,
                generation,
            } => tracing::warn!(
                %from,
                %to,
                %generation,
                "the group was resized from {from} to {to} shards: following it (old buckets \
                 are revoked and released, the new ones shared); configure new workers with {to}"
            ),
            Report::ClockStep(ClockStep::Backward(by)) => {
                tracing::warn!(
                    at_least = ?by,
                    "the store's clock stepped back: leases live longer by as much in the \
                     store's eyes"
                );
                self.metrics.clock_step(false);
            }
        }
    }

    /// Make the published owned set equal to the machine's (after a tick, and on stopping), and
    /// the trust deadline the leases watch.
    fn publish(&self) {
        let trusted = self
            .machine
            .trusted_until()
            .filter(|_| !self.machine.is_finished());
        self.trust.send_if_modified(|t| {
            let changed = *t != trusted;
            *t = trusted;
            changed
        });
        let owned = self.machine.owned();
        self.metrics.owned(owned.len());
        self.published.0.send_if_modified(|current| {
            if current == owned {
                false
            } else {
                current.clone_from(owned);
                true
            }
        });
    }
}

impl LeaseWorker {
    /// The machine's rules for this configuration and a fresh incarnation.
    pub(crate) fn rules(&self) -> Rules {
        let ttl: Ttl = self.ttl;
        Rules {
            group: self.group.clone(),
            shards: self.shards,
            worker: self.worker,
            incarnation: Incarnation::new(),
            ttl,
            renew_interval: self.renew_interval,
            safety_margin: self.margin,
            wake_debounce: self.wake_debounce,
            call_timeout: self.renew_interval.max(ttl.as_duration() / 2),
            ack_limit: self.ack_limit,
        }
    }
}

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

    /// The token that stops this run of the worker when cancelled (a child of the
    /// configuration's token, whose cancellation also stops it).
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

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The store refused: the group exists with another shard count, or the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// This configuration (or a clone of it) is running already: two tasks of one worker
    /// would break contract rule G8 (one caller per incarnation) and compete for its session.
    /// (A configuration built anew with the same worker id starts, and is refused by the store
    /// while the other's session lives: `StoreError::WorkerIdInUse`.)
    #[error(
        "worker {worker} of group {group:?} is running already; stop it before starting it again"
    )]
    AlreadyRunning {
        /// The group.
        group: GroupName,
        /// The worker id.
        worker: WorkerId,
    },
}

impl StartError {
    /// The store's error, if that is why.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(e) => Some(e),
            Self::AlreadyRunning { .. } => None,
        }
    }
}

impl LeaseWorker {
    /// Create the group if needed (failing on a shard-count mismatch), subscribe to its
    /// wake-ups, and start the worker task on the current tokio runtime, delivering events
    /// to `handler`. Refused if this process already runs this worker id in this group.
    pub async fn start<S, H>(self, store: S, handler: H) -> Result<WorkerHandle, StartError>
    where
        S: LeaseStore + 'static,
        H: OwnershipHandler,
    {
        let (trust, _) = watch::channel(None);
        self.launch(store, Handler(handler), trust).await
    }

    /// Like [`start`](Self::start), handing the application a [`BucketLease`](crate::BucketLease) per bucket it
    /// owns instead of calling a handler: work on a bucket until the lease's
    /// [`revoked`](crate::BucketLease::revoked) fires, then drop the lease. The worker releases a
    /// shed bucket only once its lease is dropped (see
    /// [`revoke_ack_limit`](crate::LeaseWorkerBuilder::revoke_ack_limit) for an application
    /// that does not). Up to 64 leases wait in the channel before the worker waits for the
    /// application to take them.
    pub async fn start_leases<S>(self, store: S) -> Result<(WorkerHandle, Leases), StartError>
    where
        S: LeaseStore + 'static,
    {
        let (trust, watching) = watch::channel(None);
        let (sender, leases) = LeaseSender::new(64, watching);
        let handle = self.launch(store, sender, trust).await?;
        Ok((handle, leases))
    }

    async fn launch<S, A>(
        self,
        store: S,
        app: A,
        trust: watch::Sender<Option<std::time::Instant>>,
    ) -> Result<WorkerHandle, StartError>
    where
        S: LeaseStore + 'static,
        A: Application,
    {
        let running = self.running.claim(&self.group, self.worker)?;
        store.ensure_group(&self.group, self.shards).await?;
        let feed = match store.changes(&self.group).await {
            // A store without a feed says why itself (the Postgres store logs it once).
            Ok(None) => {
                tracing::debug!(
                    group = %self.group,
                    "the store has no change feed; re-planning on the renew interval only"
                );
                None
            }
            Ok(feed) => feed,
            Err(e) => {
                // Wake-ups only speed things up; the worker still re-plans every interval.
                tracing::warn!(
                    group = %self.group,
                    error = %Chain(&e),
                    "no change feed; re-planning on the renew interval only"
                );
                None
            }
        };
        // Registered here, on the caller's task: a test's local recorder sees the series.
        let metrics = Metrics::new(&self.group);
        metrics.polling(feed.is_none());
        let (tx, rx) = watch::channel(Owned::new());
        let worker = self.worker;
        // A token of this run's own: stopping it (its handle's shutdown, or dropping the
        // handle) must not stop the configuration's later runs, while cancelling the
        // configuration's token still stops every run.
        let cancel = self.cancel.child_token();
        let span = tracing::info_span!("lease_worker", group = %self.group, worker = %worker);
        let driver = Driver {
            machine: Machine::new(self.rules(), now()),
            store: Arc::new(store),
            app,
            feed,
            cancel: cancel.clone(),
            published: Published(tx),
            trust,
            metrics,
            call: None,
            metadata: self.metadata.clone(),
            _running: running,
        };
        let task = tokio::spawn(tracing::Instrument::instrument(driver.run(), span));
        Ok(WorkerHandle {
            worker,
            cancel,
            task: Some(task),
            owned: rx,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

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
                        shards,
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
                        generation: Default::default(),
                        previous: None,
                        draining: 0,
                    },
                    owned,
                })
            });
        let c = calls.clone();
        store.expect_claim().returning(move |_, _, _, _, _| {
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
                lease_core::OwnershipEvent::Assigned(_) => assigned += 1,
                lease_core::OwnershipEvent::Revoked { reason, .. } => {
                    assert_eq!(reason, RevokeReason::Shutdown);
                    revoked += 1;
                }
            }
        }
        assert_eq!((assigned, revoked), (4, 4));
    }
}
