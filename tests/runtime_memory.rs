//! The worker runtime on the in-memory store, on tokio's paused clock: no real sleeps, every
//! instant exact. The store's clock follows tokio's, so expiry and self-fencing deadlines are
//! compared on one timeline. Every test ends by checking the ownership log: no bucket held by
//! two workers at once, assignment before revocation, tokens only growing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lease::memory::MemoryLeaseStore;
use lease::testing::{Faults, FaultyStore, OwnershipLog, RecordingHandler, Summary, TokioClock};
use lease::{
    BucketState, Clock, ErrorKind, GroupName, LeaseStore, LeaseWorker, OwnershipEvent,
    RevokeReason, ShardCount, Timestamp, WorkerError, WorkerFailed, WorkerHandle, WorkerId,
};

const RENEW: Duration = Duration::from_secs(1);
const TTL: Duration = Duration::from_secs(3);

/// A pool of workers on one in-memory store, each behind its own fault switches.
struct Pool {
    store: MemoryLeaseStore,
    clock: TokioClock,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    group: GroupName,
    shards: u32,
    wakeups: bool,
    workers: BTreeMap<WorkerId, (WorkerHandle, Arc<Faults>)>,
    errors: BTreeMap<WorkerId, Arc<Mutex<Vec<Option<ErrorKind>>>>>,
}

impl Pool {
    fn new(group: &str, shards: u32, wakeups: bool) -> Self {
        let clock = TokioClock::new();
        Self {
            store: MemoryLeaseStore::with_clock(clock.clone()),
            clock,
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            group: GroupName::new(group).expect("name"),
            shards,
            wakeups,
            workers: BTreeMap::new(),
            errors: BTreeMap::new(),
        }
    }

    /// A pool sharing `other`'s store, clock and log, for another group.
    fn beside(other: &Pool, group: &str, shards: u32) -> Self {
        Self {
            store: other.store.clone(),
            clock: other.clock.clone(),
            // Bucket numbers repeat across groups: each group is checked on a log of its own.
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            group: GroupName::new(group).expect("name"),
            shards,
            wakeups: other.wakeups,
            workers: BTreeMap::new(),
            errors: BTreeMap::new(),
        }
    }

    async fn start(&mut self) -> WorkerId {
        self.start_with(Duration::ZERO, None).await
    }

    fn faults(&self, w: WorkerId) -> Arc<Faults> {
        self.workers[&w].1.clone()
    }

    async fn stop(&mut self, w: WorkerId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.shutdown().await.expect("a clean stop");
    }

    fn crash(&mut self, w: WorkerId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.abort();
        self.log.lock().expect("log").crashed(w, self.clock.now());
    }

    /// What each running worker's application owns.
    fn owned(&self) -> BTreeMap<WorkerId, usize> {
        self.workers
            .iter()
            .map(|(&w, (h, _))| (w, h.owned().borrow().len()))
            .collect()
    }

    /// Every bucket owned by a running worker's application, exactly once, and the split even.
    fn balanced(&self) -> bool {
        let owned = self.owned();
        let total: usize = owned.values().sum();
        let (min, max) = (owned.values().min(), owned.values().max());
        total == self.shards as usize && matches!((min, max), (Some(a), Some(b)) if b - a <= 1)
    }

    /// When `w`'s application heard each revocation with `reason`.
    fn revoked_at(&self, w: WorkerId, reason: RevokeReason) -> Vec<Timestamp> {
        self.events_of(w)
            .into_iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Revoked { reason: r, .. } if *r == reason))
            .map(|(t, _)| t)
            .collect()
    }

    fn revocations(&self, w: WorkerId, reason: RevokeReason) -> usize {
        self.revoked_at(w, reason).len()
    }

    /// The expiry of `w`'s session as the store holds it now.
    async fn session_expiry(&self, w: WorkerId) -> Timestamp {
        self.store
            .snapshot(&self.group)
            .await
            .expect("snapshot")
            .members
            .iter()
            .find(|m| m.worker == w)
            .expect("the worker's member row")
            .expires_at
    }

    fn check(&self) -> Summary {
        self.log
            .lock()
            .expect("log")
            .check()
            .unwrap_or_else(|e| panic!("ownership log: {e}"))
    }

    fn events_of(&self, w: WorkerId) -> Vec<(Timestamp, OwnershipEvent)> {
        self.log
            .lock()
            .expect("log")
            .entries()
            .iter()
            .filter(|e| e.worker == w)
            .map(|e| (e.at, e.event))
            .collect()
    }

    async fn shutdown(mut self) -> Summary {
        let ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        for w in ids {
            self.stop(w).await;
        }
        self.check()
    }
}

/// Let every task run to a standstill at the current instant.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Advance tokio's clock by `d` (timers fire in order) and let the tasks run.
async fn run_for(d: Duration) {
    tokio::time::sleep(d).await;
    settle().await;
}

/// How many renew intervals (ticks after the first) until balanced; `None` within `limit`.
async fn ticks_until_balanced(pool: &Pool, limit: u32) -> Option<u32> {
    settle().await;
    for tick in 1..=limit {
        // Just past tick `tick` of every worker (ticks at 0, RENEW, 2 RENEW...).
        run_for(Duration::from_millis(50)).await;
        if pool.balanced() {
            return Some(tick);
        }
        run_for(RENEW - Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(start_paused = true)]
async fn cold_start_of_eight_workers_balances_within_three_ticks() {
    for wakeups in [false, true] {
        let mut pool = Pool::new("orders", 64, wakeups);
        for _ in 0..8 {
            pool.start().await;
        }
        let ticks = ticks_until_balanced(&pool, 10).await;
        eprintln!(
            "cold start, 8 workers x 64 buckets, wake-ups {wakeups}: balanced at tick {ticks:?}"
        );
        assert!(
            ticks.is_some_and(|t| t <= 3),
            "not balanced within 3 ticks (wake-ups {wakeups}): {:?}",
            pool.owned()
        );
        assert!(pool.owned().values().all(|&n| n == 8));
        pool.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_joiner_gets_its_share_within_two_ticks() {
    for wakeups in [false, true] {
        let mut pool = Pool::new("orders", 64, wakeups);
        for _ in 0..3 {
            pool.start().await;
        }
        assert!(ticks_until_balanced(&pool, 5).await.is_some());
        let start = pool.clock.now();
        let joiner = pool.start().await;
        let ticks = ticks_until_balanced(&pool, 5).await;
        let at = pool
            .events_of(joiner)
            .iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .map(|(t, _)| *t)
            .max()
            .expect("the joiner was assigned buckets");
        eprintln!(
            "join, 3 -> 4 workers x 64 buckets, wake-ups {wakeups}: balanced at tick {ticks:?}, \
             share complete {} ms after joining",
            (at - start).num_milliseconds()
        );
        assert!(
            ticks.is_some_and(|t| t <= 2),
            "joiner not served within 2 ticks"
        );
        assert_eq!(pool.owned()[&joiner], 16);
        if wakeups {
            assert!(
                (at - start).num_milliseconds() < 250,
                "with wake-ups the joiner waited {} ms",
                (at - start).num_milliseconds()
            );
        }
        // Minimal moves: the joiner's 16 came from the others' excess, nothing else moved.
        let moved = pool
            .log
            .lock()
            .expect("log")
            .entries()
            .iter()
            .filter(|e| e.at >= start)
            .filter(|e| {
                matches!(
                    e.event,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Shed,
                        ..
                    }
                )
            })
            .count();
        assert_eq!(moved, 16, "buckets shed after the join");
        pool.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_stop_hands_over_without_overlap() {
    for wakeups in [false, true] {
        let mut pool = Pool::new("orders", 12, wakeups);
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(pool.start().await);
        }
        assert!(ticks_until_balanced(&pool, 5).await.is_some());
        let stopped_at = pool.clock.now();
        pool.stop(ids[0]).await;
        let ticks = ticks_until_balanced(&pool, 5).await;
        assert!(
            ticks.is_some_and(|t| t <= 2),
            "stop not taken over in 2 ticks"
        );
        let last_assigned = pool
            .events_of(ids[1])
            .iter()
            .chain(pool.events_of(ids[2]).iter())
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .map(|(t, _)| *t)
            .max()
            .expect("assignments");
        let took = (last_assigned - stopped_at).num_milliseconds();
        eprintln!(
            "graceful stop of 1 of 3 (12 buckets), wake-ups {wakeups}: re-owned in {took} ms"
        );
        if wakeups {
            assert!(took < 250, "with wake-ups the handoff took {took} ms");
        }
        let stopped = pool.events_of(ids[0]);
        assert!(stopped.iter().any(|(_, e)| matches!(
            e,
            OwnershipEvent::Revoked {
                reason: RevokeReason::Shutdown,
                ..
            }
        )));
        let summary = pool.shutdown().await;
        assert!(summary.handoffs >= 4);
    }
}

#[tokio::test(start_paused = true)]
async fn a_crashed_workers_buckets_move_only_after_its_lease_expires() {
    let mut pool = Pool::new("orders", 12, true);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(pool.start().await);
    }
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    let victim = ids[0];
    let expires = pool.session_expiry(victim).await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let held: Vec<_> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(victim) && b.state == BucketState::Live)
        .map(|b| b.bucket)
        .collect();
    assert_eq!(held.len(), 4);
    pool.crash(victim);
    let ticks = ticks_until_balanced(&pool, 10).await;
    assert!(
        ticks.is_some(),
        "the crashed worker's buckets were never re-owned"
    );
    let log = pool.log.lock().expect("log").clone();
    let holdings = log.holdings().expect("holdings");
    for b in &held {
        let next = holdings[b]
            .iter()
            .find(|h| h.worker != victim)
            .expect("re-owned");
        assert!(
            next.from >= expires,
            "bucket {b} re-assigned at {} before the crashed lease expired at {expires}",
            next.from
        );
        let late = (next.from - expires).to_std().expect("after expiry");
        assert!(
            late <= RENEW + Duration::from_millis(250),
            "bucket {b} re-owned {late:?} after expiry, more than one renew interval"
        );
    }
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_renew_fences_itself_before_anyone_takes_over() {
    let mut pool = Pool::new("orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    // a's renewals start failing; the store keeps a's session until it expires. No heartbeat
    // of a succeeds from here on, so the expiry the store holds now is its last. (Once dead,
    // a's member row goes at b's next heartbeat.)
    pool.faults(a).fail_heartbeats.store(true, Ordering::SeqCst);
    let latest_expiry = pool.session_expiry(a).await;
    run_for(TTL * 3).await;
    let fenced = pool.revoked_at(a, RevokeReason::Expired);
    assert_eq!(
        fenced.len(),
        4,
        "a did not revoke its four buckets: {:?}",
        pool.events_of(a)
    );
    // a fenced before the store could hand its buckets to anyone.
    for t in &fenced {
        assert!(
            *t < latest_expiry,
            "a fenced at {t}, after its session expired at {latest_expiry}"
        );
    }
    assert_eq!(
        pool.owned()[&b],
        8,
        "b did not take over the fenced buckets"
    );
    assert!(pool.faults(a).injected.load(Ordering::SeqCst) > 0);
    // a heals: it starts a new session and gets its share back.
    pool.faults(a)
        .fail_heartbeats
        .store(false, Ordering::SeqCst);
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    let summary = pool.shutdown().await;
    assert_eq!(summary.revocations.get("expired"), Some(&4));
}

#[tokio::test(start_paused = true)]
async fn a_worker_cut_off_mid_call_fences_while_the_call_hangs() {
    let mut pool = Pool::new("orders", 4, true);
    let a = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    pool.faults(a).hang.store(true, Ordering::SeqCst);
    run_for(TTL).await;
    let fenced = pool.revoked_at(a, RevokeReason::Expired);
    assert_eq!(
        fenced.len(),
        4,
        "a kept trusting its leases while its store calls hung"
    );
    assert_eq!(
        pool.owned()[&a],
        0,
        "the owned set still lists buckets after fencing"
    );
    // Every call hung, so the session the store holds is the last one renewed: a fenced
    // before the store could hand its buckets to anyone.
    let expiry = pool.session_expiry(a).await;
    assert!(
        fenced.iter().all(|t| *t < expiry),
        "fenced at {fenced:?}, expiry {expiry}"
    );
    pool.faults(a).hang.store(false, Ordering::SeqCst);
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    pool.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_new_session_revokes_everything_before_claiming_again() {
    let mut pool = Pool::new("orders", 4, false);
    let a = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    // An operator force-releases a (what `leasectl release --force` does): a's next heartbeat
    // starts a new session.
    pool.store.leave(&pool.group, a, None).await.expect("leave");
    run_for(RENEW).await;
    let events = pool.events_of(a);
    let expired = events
        .iter()
        .position(|(_, e)| {
            matches!(
                e,
                OwnershipEvent::Revoked {
                    reason: RevokeReason::Expired,
                    ..
                }
            )
        })
        .expect("a revoked its buckets");
    let reassigned = events
        .iter()
        .rposition(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
        .expect("a claimed again");
    assert!(expired < reassigned);
    assert!(pool.balanced());
    pool.shutdown().await;
}

/// A metrics recorder of the tests' own: counters by name and labels, as
/// `name{label="value"}`; gauges and histograms are dropped.
#[derive(Default)]
struct Counters(Mutex<BTreeMap<String, Arc<AtomicU64>>>);

impl Counters {
    fn get(&self, series: &str) -> u64 {
        self.0
            .lock()
            .expect("counters")
            .get(series)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

impl metrics::Recorder for Counters {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={:?}", l.key(), l.value()))
            .collect();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        let counter = self
            .0
            .lock()
            .expect("counters")
            .entry(series)
            .or_default()
            .clone();
        metrics::Counter::from_arc(counter)
    }

    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Every failed store call is reported once to the handler's `on_error`, with the store's
/// error, and counted in `lease_store_errors_total`; the worker retries and recovers.
#[tokio::test(start_paused = true)]
async fn store_errors_are_reported_and_retried_without_stopping() {
    let counters = Counters::default();
    // The worker registers its metrics when it starts, on this test's one thread.
    let _recorder = metrics::set_default_local_recorder(&counters);
    let errors_counted = || counters.get(r#"lease_store_errors_total{group="orders"}"#);
    let mut pool = Pool::new("orders", 4, false);
    let a = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    assert!(pool.errors_of(a).is_empty() && errors_counted() == 0);
    pool.faults(a).fail_all.store(true, Ordering::SeqCst);
    run_for(RENEW * 10).await;
    let injected = pool.faults(a).injected.load(Ordering::SeqCst);
    assert!(
        injected >= 10,
        "the worker stopped retrying: {injected} attempts"
    );
    assert!(
        !pool.workers[&a].0.is_finished(),
        "a store error ended the worker"
    );
    let reported = pool.errors_of(a);
    assert_eq!(
        reported.len() as u64,
        injected,
        "on_error calls for {injected} failed calls"
    );
    assert!(
        reported.iter().all(|k| *k == Some(ErrorKind::Backend)),
        "{reported:?}"
    );
    assert_eq!(errors_counted(), injected, "lease_store_errors_total");
    pool.faults(a).fail_all.store(false, Ordering::SeqCst);
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    assert_eq!(
        pool.errors_of(a).len() as u64,
        injected,
        "errors after healing"
    );
    assert_eq!(errors_counted(), injected);
    pool.shutdown().await;
}

/// A worker that cannot leave the group when stopped says so: `shutdown` fails with
/// `LeaveFailed` naming the leave's error, whether the store fails or does not answer, and the
/// store still holds its session (the others must wait for it to expire).
#[tokio::test(start_paused = true)]
async fn a_worker_that_cannot_leave_the_group_says_so_on_shutdown() {
    for hang in [false, true] {
        let mut pool = Pool::new("orders", 4, false);
        let a = pool.start().await;
        assert!(ticks_until_balanced(&pool, 5).await.is_some());
        let (handle, faults) = pool.workers.remove(&a).expect("a");
        let switch = if hang { &faults.hang } else { &faults.fail_all };
        switch.store(true, Ordering::SeqCst);
        let failed = handle.shutdown().await;
        match &failed {
            Err(WorkerFailed::LeaveFailed {
                source: WorkerError::Store { operation, source },
            }) if !hang => {
                assert_eq!(
                    (*operation, source.kind()),
                    (lease::Operation::Leave, ErrorKind::Backend)
                );
            }
            Err(WorkerFailed::LeaveFailed {
                source: WorkerError::Timeout { operation, .. },
            }) if hang => assert_eq!(*operation, lease::Operation::Leave),
            other => panic!("hang {hang}: the failed leave was not reported: {other:?}"),
        }
        assert_eq!(
            pool.errors_of(a).len(),
            1,
            "the failed leave is also reported to on_error"
        );
        switch.store(false, Ordering::SeqCst);
        let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
        assert!(
            snap.members.iter().any(|m| m.worker == a && m.live),
            "hang {hang}: the worker's session is gone without a leave"
        );
        pool.check();
    }
}

#[tokio::test(start_paused = true)]
async fn several_groups_share_one_store_without_interfering() {
    let mut orders = Pool::new("orders", 16, true);
    let mut invoices = Pool::beside(&orders, "invoices", 5);
    for _ in 0..2 {
        orders.start().await;
        invoices.start().await;
    }
    invoices.start().await;
    assert!(ticks_until_balanced(&orders, 5).await.is_some());
    assert!(ticks_until_balanced(&invoices, 5).await.is_some());
    assert!(orders.owned().values().all(|&n| n == 8));
    let mut split: Vec<usize> = invoices.owned().values().copied().collect();
    split.sort_unstable();
    assert_eq!(split, vec![1, 2, 2]);
    orders.shutdown().await;
    invoices.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_shard_count_mismatch_refuses_to_start() {
    let pool = Pool::new("orders", 8, false);
    pool.store
        .ensure_group(&pool.group, ShardCount::new(4).expect("n"))
        .await
        .expect("ensure");
    let config = LeaseWorker::builder(pool.group.clone(), ShardCount::new(8).expect("n"))
        .build()
        .expect("config");
    let err = config
        .start(pool.store.clone(), lease::event_channel(8).0)
        .await
        .expect_err("a mismatched worker started");
    assert_eq!(
        err.store_error().map(lease::StoreError::kind),
        Some(lease::ErrorKind::ShardCountMismatch)
    );
}

/// How a test application's handler misbehaves.
#[derive(Clone, Copy, Default)]
struct Slow {
    /// Time taken by each assignment, before it is recorded.
    assign: Duration,
    /// Time taken by each revocation before it returns; it is recorded on return, when the
    /// application has stopped working on the bucket.
    revoke: Duration,
    /// A bucket whose assignment panics.
    panic_on: Option<u32>,
}

/// A handler that takes its time, or panics on one bucket, then records like the others; it
/// also keeps the kinds of the errors the worker reported.
#[derive(Clone)]
struct SlowHandler {
    inner: RecordingHandler,
    slow: Slow,
    errors: Arc<Mutex<Vec<Option<ErrorKind>>>>,
}

#[async_trait::async_trait]
impl lease::OwnershipHandler for SlowHandler {
    async fn on_assigned(&self, bucket: lease::Bucket, token: lease::FencingToken) {
        tokio::time::sleep(self.slow.assign).await;
        assert_ne!(
            Some(bucket.get()),
            self.slow.panic_on,
            "the application's handler failed"
        );
        self.inner.on_assigned(bucket, token).await;
    }

    async fn on_revoked(
        &self,
        bucket: lease::Bucket,
        token: lease::FencingToken,
        reason: RevokeReason,
    ) {
        tokio::time::sleep(self.slow.revoke).await;
        self.inner.on_revoked(bucket, token, reason).await;
    }

    async fn on_error(&self, error: &WorkerError) {
        let kind = match error {
            WorkerError::Store { source, .. } => Some(source.kind()),
            _ => None,
        };
        self.errors.lock().expect("errors").push(kind);
    }
}

impl Pool {
    async fn start_with(&mut self, assign_delay: Duration, panic_on: Option<u32>) -> WorkerId {
        let slow = Slow {
            assign: assign_delay,
            panic_on,
            ..Slow::default()
        };
        self.launch(None, slow).await
    }

    /// Start a worker whose application takes `delay` to stop working on a revoked bucket.
    async fn start_slow_revoker(&mut self, delay: Duration) -> WorkerId {
        let slow = Slow {
            revoke: delay,
            ..Slow::default()
        };
        self.launch(None, slow).await
    }

    /// Start a worker that uses the worker id `id` in the store, as a second process started
    /// with the id of another would; it is told apart in this pool (and in the ownership log)
    /// by the id returned.
    async fn start_as(&mut self, id: WorkerId) -> WorkerId {
        self.launch(Some(id), Slow::default()).await
    }

    async fn launch(&mut self, id: Option<WorkerId>, slow: Slow) -> WorkerId {
        let mut builder =
            LeaseWorker::builder(self.group.clone(), ShardCount::new(self.shards).expect("n"))
                .ttl(TTL)
                .renew_interval(RENEW);
        if let Some(id) = id {
            builder = builder.worker_id(id);
        }
        let config = builder.build().expect("config");
        let label = if id.is_some() {
            WorkerId::new()
        } else {
            config.worker_id()
        };
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        faults.no_feed.store(!self.wakeups, Ordering::SeqCst);
        let errors = Arc::new(Mutex::new(Vec::new()));
        self.errors.insert(label, errors.clone());
        let handler = SlowHandler {
            inner: RecordingHandler::new(label, self.log.clone(), Arc::new(self.clock.clone())),
            slow,
            errors,
        };
        let handle = config.start(store, handler).await.expect("start");
        self.workers.insert(label, (handle, faults));
        label
    }

    /// The kinds of the errors `w` reported, in order (`None`: a timeout).
    fn errors_of(&self, w: WorkerId) -> Vec<Option<ErrorKind>> {
        self.errors[&w].lock().expect("errors").clone()
    }
}

/// Slow handlers cannot starve the renewals: a worker assigning 40 buckets at 200 ms each
/// (8 s, past the 2.5 s trust window) interleaves renewals, never fences, and is never told
/// it owns a bucket after the store could give it away.
#[tokio::test(start_paused = true)]
async fn slow_handlers_do_not_starve_renewals() {
    let mut pool = Pool::new("orders", 40, true);
    let a = pool.start_with(Duration::from_millis(200), None).await;
    run_for(Duration::from_secs(12)).await;
    assert_eq!(pool.owned()[&a], 40, "a did not get all 40 buckets");
    assert_eq!(
        pool.revocations(a, RevokeReason::Expired),
        0,
        "a fenced itself"
    );
    // A store stall of 2.8 s: a fences once, then recovers without flapping.
    pool.faults(a).hang.store(true, Ordering::SeqCst);
    run_for(Duration::from_millis(2_800)).await;
    pool.faults(a).hang.store(false, Ordering::SeqCst);
    run_for(Duration::from_secs(20)).await;
    assert_eq!(pool.owned()[&a], 40);
    let fenced = pool.revocations(a, RevokeReason::Expired);
    assert_eq!(fenced, 40, "a fenced more than once ({fenced} revocations)");
    let b = pool.start().await;
    assert!(
        ticks_until_balanced(&pool, 20).await.is_some(),
        "{:?}",
        pool.owned()
    );
    assert_eq!(pool.owned()[&b], 20);
    pool.shutdown().await;
}

/// A panicking handler stops the worker visibly: `wait` reports it and the owned set empties;
/// its session then expires and the others take over.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_stops_the_worker_visibly() {
    let mut pool = Pool::new("orders", 4, true);
    let a = pool.start_with(Duration::ZERO, Some(2)).await;
    let b = pool.start().await;
    let (mut handle, _) = pool.workers.remove(&a).expect("a");
    let owned = handle.owned();
    let failure = handle
        .wait()
        .await
        .expect_err("the worker survived its handler's panic");
    assert!(
        matches!(&failure, lease::WorkerFailed::HandlerPanicked { message }
            if message.contains("the application's handler failed")),
        "{failure}"
    );
    assert!(
        owned.borrow().is_empty(),
        "the owned set kept buckets: {:?}",
        owned.borrow()
    );
    pool.log.lock().expect("log").crashed(a, pool.clock.now());
    run_for(TTL * 2).await;
    assert_eq!(pool.owned()[&b], 4);
    pool.shutdown().await;
}

/// Two processes started with one worker id never share its session: the second is refused
/// (`WorkerIdInUse`, reported as an error) and owns nothing while the first runs; once the first
/// stops gracefully the second starts a session of its own and takes every bucket, and the
/// ownership log shows no bucket held by both.
#[tokio::test(start_paused = true)]
async fn two_processes_with_one_worker_id_never_share_a_session() {
    let mut pool = Pool::new("orders", 8, true);
    let first = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    let second = pool.start_as(first).await;
    run_for(RENEW * 5).await;
    assert_eq!(pool.owned()[&first], 8, "the first process lost buckets");
    assert_eq!(
        pool.owned()[&second],
        0,
        "the second process was given buckets of the first one's session"
    );
    let refused = pool.errors_of(second);
    assert!(
        refused.len() >= 5 && refused.iter().all(|k| *k == Some(ErrorKind::WorkerIdInUse)),
        "the second process did not report the id in use at each attempt: {refused:?}"
    );
    let stopped_at = pool.clock.now();
    pool.stop(first).await;
    run_for(RENEW * 2).await;
    assert_eq!(
        pool.owned()[&second],
        8,
        "the second process did not take over"
    );
    let taken: Vec<Timestamp> = pool
        .events_of(second)
        .iter()
        .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
        .map(|(t, _)| *t)
        .collect();
    assert!(taken.iter().all(|t| *t >= stopped_at));
    let summary = pool.shutdown().await;
    assert_eq!(summary.handoffs, 8);
}

/// Revoke before release, the rule a graceful handoff rests on: the worker shedding buckets
/// releases each one only after its application acknowledged the revocation (the handler
/// returned, 200 ms each here), so the peer the release wakes up is assigned it only after
/// that, as the ownership log shows (a revocation is recorded when the handler returns).
#[tokio::test(start_paused = true)]
async fn a_shed_bucket_is_released_only_after_its_revoke_returns() {
    let mut pool = Pool::new("orders", 8, true);
    let a = pool.start_slow_revoker(Duration::from_millis(200)).await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    assert_eq!(pool.owned()[&a], 8);
    let b = pool.start().await;
    assert!(ticks_until_balanced(&pool, 5).await.is_some());
    assert_eq!(pool.owned()[&b], 4);
    let shed = pool.revoked_at(a, RevokeReason::Shed);
    assert_eq!(shed.len(), 4);
    // Checked here, before the workers stop (stopping hands buckets over again).
    assert_eq!(pool.check().handoffs, 4, "the shed buckets went to b");
    pool.shutdown().await;
}
