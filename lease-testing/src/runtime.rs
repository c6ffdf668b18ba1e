//! The runtime suite: worker-level scenarios (cold start, join, graceful stop, crash, fencing,
//! errors, misbehaving applications) and node-level ones (a node in several groups, groups
//! added and removed at run time, a node cut off fencing in every group) written once and run
//! on every backend.
//!
//! Each case gets an [`Env`]: a fresh, empty store, the clock its expiries are on, and whether
//! tokio's clock is paused. It starts real workers ([`LeaseWorker`], a node of one group) or
//! nodes ([`LeaseNode`]) on that store, each behind a [`FaultyStore`], records what their
//! applications are told in an [`OwnershipLog`] per group, and panics on a violation. Every
//! case ends by checking the logs: no bucket held by two workers at once, assignment before
//! revocation, tokens only growing.
//!
//! Time: every wait polls with a deadline on tokio's clock, so it is exact on the paused clock
//! (in-memory store on a [`TokioClock`](crate::TokioClock)) and real on a server. Bounds are in
//! renew intervals ([`RENEW`] 1 s, [`TTL`] 3 s) plus [`Env::slack`]: 50 ms on the paused clock,
//! where only the wake-up debounce takes time, and [`REAL_SLACK`] on real time, where worker
//! starts, store round trips and scheduling on a loaded machine do. A case that asserts an
//! exact tick count on the paused clock and a looser bound on real time says so. Cases that
//! judge wake-ups run their workers on [`SLOW_RENEW`] (5 s) instead, so that only a wake-up
//! can explain a handoff within [`WAKE_UP_BOUND`].
//!
//! Backends run every case, each as its own test, with
//! [`runtime_suite!`](crate::runtime_suite):
//!
//! ```ignore
//! lease_testing::runtime_suite!(paused_clock: || async {
//!     let clock = lease_testing::TokioClock::new();
//!     (lease_memory::MemoryLeaseStore::with_clock(clock.clone()), clock)
//! });
//! ```
//!
//! The macro also generates `runtime_suite_runs_every_case`, which fails if the macro's list
//! and [`CASES`] ever differ, so no backend can miss a case.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use lease_core::ownership_log::{OwnershipLog, Summary};
use lease_core::{
    Assignment, Bucket, BucketState, Clock, ErrorKind, FencingToken, GroupName, LeaseStore, NodeId,
    Operation, OwnershipEvent, RevokeReason, ShardCount, Timestamp,
};
use lease_worker::{
    GroupHandle, LeaseNode, LeaseWorker, NodeHandle, OwnershipHandler, StartError, WorkerError,
    WorkerFailed, WorkerHandle,
};

use crate::{Counters, Faults, FaultyStore, RecordingHandler};

mod controls;
pub use controls::*;

/// The name of every case, in the order the macro runs them.
pub const CASES: &[&str] = &[
    "cold_start_of_eight_workers_balances_within_three_ticks",
    "a_joiner_gets_its_share_within_two_ticks",
    "a_graceful_stop_hands_over_without_overlap",
    "a_slow_graceful_stop_renews_until_it_leaves",
    "a_crashed_workers_buckets_move_only_after_its_lease_expires",
    "a_worker_that_cannot_renew_fences_itself_before_anyone_takes_over",
    "a_worker_cut_off_mid_call_fences_while_the_call_hangs",
    "a_new_session_revokes_everything_before_claiming_again",
    "store_errors_are_reported_and_retried_without_stopping",
    "a_permanent_store_error_stops_the_worker",
    "a_worker_that_cannot_leave_the_group_says_so_on_shutdown",
    "several_groups_share_one_store_without_interfering",
    "a_shard_count_mismatch_refuses_to_start",
    "starting_a_running_configuration_again_is_refused",
    "slow_handlers_do_not_starve_renewals",
    "a_panicking_handler_stops_the_worker_visibly",
    "two_processes_with_one_node_id_never_share_a_session",
    "a_shed_bucket_is_released_only_after_its_revoke_returns",
    "a_resize_is_followed_on_wake_ups_without_restarting",
    "a_worker_configured_before_a_resize_follows_it",
    "an_owner_dead_during_a_resize_holds_back_only_its_keys",
    "a_node_in_three_groups_shares_each_by_its_own_count",
    "groups_added_and_removed_at_run_time_leave_the_others_alone",
    "a_paused_node_fences_in_every_group_before_any_bucket_is_taken",
    "a_drained_worker_hands_everything_over_and_returns_on_uncordon",
    "a_cordoned_worker_keeps_its_buckets_and_takes_no_more",
    "weights_split_a_group_in_proportion",
    "a_quarantined_bucket_is_revoked_and_stays_unowned_until_lifted",
    "a_rolling_restart_with_hand_over_moves_nothing",
    "a_stop_with_a_stuck_bucket_does_not_hand_over",
    "a_failed_hand_over_ends_the_node_with_its_error",
    "a_successor_leaves_the_groups_it_does_not_run",
    "a_hand_over_after_the_session_ended_fails",
];

/// Run every case against a store built by `$make`, an expression callable as
/// `$make() -> impl Future<Output = (S, C)>`: a fresh, empty store `S: LeaseStore + Clone +
/// 'static` and the [`Clock`](lease_core::Clock) `C` its expiries are on (events are stamped
/// with it too). Each case becomes its own `#[tokio::test]`:
///
/// - `runtime_suite!(paused_clock: $make)`: on tokio's paused clock (`start_paused = true`,
///   a current-thread runtime; the calling crate needs tokio's `test-util` feature). The
///   store's clock must follow tokio's ([`TokioClock`](crate::TokioClock)).
/// - `runtime_suite!(real_clock: $make)`: on real time, on a multi-thread runtime of two
///   workers (tokio's `rt-multi-thread` feature).
#[macro_export]
macro_rules! runtime_suite {
    (paused_clock: $make:expr) => {
        $crate::__runtime_cases!((start_paused = true), true, $make);
    };
    (real_clock: $make:expr) => {
        $crate::__runtime_cases!((flavor = "multi_thread", worker_threads = 2), false, $make);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __runtime_cases {
    ($attr:tt, $paused:expr, $make:expr) => {
        $crate::__runtime_tests!($attr, $paused, $make;
            cold_start_of_eight_workers_balances_within_three_ticks,
            a_joiner_gets_its_share_within_two_ticks,
            a_graceful_stop_hands_over_without_overlap,
            a_slow_graceful_stop_renews_until_it_leaves,
            a_crashed_workers_buckets_move_only_after_its_lease_expires,
            a_worker_that_cannot_renew_fences_itself_before_anyone_takes_over,
            a_worker_cut_off_mid_call_fences_while_the_call_hangs,
            a_new_session_revokes_everything_before_claiming_again,
            store_errors_are_reported_and_retried_without_stopping,
            a_permanent_store_error_stops_the_worker,
            a_worker_that_cannot_leave_the_group_says_so_on_shutdown,
            several_groups_share_one_store_without_interfering,
            a_shard_count_mismatch_refuses_to_start,
            starting_a_running_configuration_again_is_refused,
            slow_handlers_do_not_starve_renewals,
            a_panicking_handler_stops_the_worker_visibly,
            two_processes_with_one_node_id_never_share_a_session,
            a_shed_bucket_is_released_only_after_its_revoke_returns,
            a_resize_is_followed_on_wake_ups_without_restarting,
            a_worker_configured_before_a_resize_follows_it,
            an_owner_dead_during_a_resize_holds_back_only_its_keys,
            a_node_in_three_groups_shares_each_by_its_own_count,
            groups_added_and_removed_at_run_time_leave_the_others_alone,
            a_paused_node_fences_in_every_group_before_any_bucket_is_taken,
            a_drained_worker_hands_everything_over_and_returns_on_uncordon,
            a_cordoned_worker_keeps_its_buckets_and_takes_no_more,
            weights_split_a_group_in_proportion,
            a_quarantined_bucket_is_revoked_and_stays_unowned_until_lifted,
            a_rolling_restart_with_hand_over_moves_nothing,
            a_stop_with_a_stuck_bucket_does_not_hand_over,
            a_failed_hand_over_ends_the_node_with_its_error,
            a_successor_leaves_the_groups_it_does_not_run,
            a_hand_over_after_the_session_ended_fails,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __runtime_tests {
    ($attr:tt, $paused:expr, $make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test $attr]
            async fn $case() {
                let (store, clock) = ($make)().await;
                $crate::runtime::$case($crate::runtime::Env::new(store, clock, $paused)).await;
            }
        )+

        #[test]
        fn runtime_suite_runs_every_case() {
            let generated: &[&str] = &[$(stringify!($case)),+];
            assert_eq!(generated, $crate::runtime::CASES);
        }
    };
}

/// The renew interval of the suite's workers.
pub const RENEW: Duration = Duration::from_secs(1);
/// The session ttl of the suite's workers (their leases are trusted for 2.5 s after a
/// heartbeat is sent: the default margin is a sixth of the ttl).
pub const TTL: Duration = Duration::from_secs(3);
/// The slack added to bounds on real time: worker starts, a few store round trips and
/// scheduling on a machine shared with builds.
pub const REAL_SLACK: Duration = Duration::from_millis(500);
/// The slack added to bounds on the paused clock: the wake-up debounce (10 ms) and the poll
/// step, with room to spare; nothing else takes time there.
const PAUSED_SLACK: Duration = Duration::from_millis(50);
/// How often waits look.
const POLL: Duration = Duration::from_millis(5);
/// The renew interval of workers in cases that judge wake-ups: long, so that no tick on the
/// interval can explain a handoff within [`WAKE_UP_BOUND`].
pub const SLOW_RENEW: Duration = Duration::from_secs(5);
/// The session ttl that goes with [`SLOW_RENEW`].
pub const SLOW_TTL: Duration = Duration::from_secs(16);
/// What a wake-up must achieve within (a join served, a stop handed over): a twentieth of
/// [`SLOW_RENEW`], a quarter of [`RENEW`].
pub const WAKE_UP_BOUND: Duration = Duration::from_millis(250);

/// What a case runs on.
pub struct Env<S> {
    /// A fresh, empty store.
    pub store: S,
    /// The clock the store's expiries are on, also stamping the applications' events.
    pub clock: Arc<dyn Clock>,
    /// Whether tokio's clock is paused (then every instant is exact).
    pub paused: bool,
}

impl<S> Env<S> {
    /// An environment of `store`, whose expiries are on `clock`.
    pub fn new(store: S, clock: impl Clock + 'static, paused: bool) -> Self {
        Self {
            store,
            clock: Arc::new(clock),
            paused,
        }
    }

    /// What bounds add for the time work takes: [`REAL_SLACK`] on real time, 50 ms on the
    /// paused clock.
    pub fn slack(&self) -> Duration {
        if self.paused {
            PAUSED_SLACK
        } else {
            REAL_SLACK
        }
    }
}

/// Whether workers with these loads own every one of `shards` buckets between them, evenly
/// (loads within one of each other). Whether any bucket is owned twice is the ownership log's
/// to judge.
pub fn balanced(loads: impl IntoIterator<Item = usize>, shards: u32) -> bool {
    let (mut total, mut min, mut max) = (0, usize::MAX, 0);
    for load in loads {
        total += load;
        min = min.min(load);
        max = max.max(load);
    }
    total == shards as usize && min <= max && max - min <= 1
}

/// Poll `done` until it holds; how long that took on tokio's clock. Panics after `limit`,
/// saying `what` was awaited and what `state` shows.
async fn until<T: std::fmt::Debug>(
    limit: Duration,
    what: &str,
    mut done: impl FnMut() -> bool,
    state: impl Fn() -> T,
) -> Duration {
    let start = Instant::now();
    loop {
        if done() {
            return start.elapsed();
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed < limit,
            "{what}: not within {limit:?}; {:?}",
            state()
        );
        tokio::time::sleep(POLL.min(limit - elapsed)).await;
    }
}

/// How a test application misbehaves.
#[derive(Clone, Copy, Default)]
struct Slow {
    /// Time taken by each assignment, before it is recorded.
    assign: Duration,
    /// Time taken by each revocation before it returns; it is recorded on return, when the
    /// application has stopped working on the bucket.
    revoke: Duration,
    /// The assignment (1 for the first) that panics.
    panic_on: Option<usize>,
}

/// More events than any case's applications hear: a worker past it is looping (assigning and
/// revoking a bucket over and over, say). On the paused clock such a loop never lets time
/// advance, so no deadline of the case would end it: the handler panics instead, which stops
/// the worker and fails the case.
const RUNAWAY: usize = 20_000;

/// What a handler's `on_error` heard: the store error's kind, `None` for a timeout.
type Reported = Arc<Mutex<Vec<Option<ErrorKind>>>>;

/// A handler that takes its time, or panics, then records like [`RecordingHandler`]; it also
/// keeps the kinds of the errors the worker reported.
struct SlowHandler {
    inner: RecordingHandler,
    slow: Slow,
    assigned: AtomicUsize,
    /// Events heard by the pool's applications, all workers together.
    events: Arc<AtomicUsize>,
    errors: Reported,
}

impl SlowHandler {
    fn count_event(&self) {
        let n = self.events.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(
            n <= RUNAWAY,
            "runaway: {n} ownership events; a worker is looping"
        );
    }
}

#[async_trait]
impl OwnershipHandler for SlowHandler {
    async fn on_assigned(&self, assignment: Assignment) {
        self.count_event();
        tokio::time::sleep(self.slow.assign).await;
        let nth = self.assigned.fetch_add(1, Ordering::SeqCst) + 1;
        assert_ne!(
            Some(nth),
            self.slow.panic_on,
            "the application's handler failed"
        );
        self.inner.on_assigned(assignment).await;
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.count_event();
        tokio::time::sleep(self.slow.revoke).await;
        self.inner.on_revoked(bucket, token, reason).await;
    }

    async fn on_error(&self, error: &WorkerError) {
        let kind = match error {
            WorkerError::Store { source, .. } => Some(source.kind()),
            _ => None,
        };
        lock(&self.errors).push(kind);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Workers of one group on one store, each behind its own fault switches, recording into one
/// ownership log.
struct Pool<S> {
    store: S,
    clock: Arc<dyn Clock>,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
    events: Arc<AtomicUsize>,
    group: GroupName,
    shards: u32,
    wakeups: bool,
    /// The workers' renew interval and ttl.
    renew: Duration,
    ttl: Duration,
    workers: BTreeMap<NodeId, (WorkerHandle, Arc<Faults>)>,
    errors: BTreeMap<NodeId, Reported>,
}

impl<S: LeaseStore + Clone + 'static> Pool<S> {
    /// A pool of `group` (`shards` buckets) whose workers ([`RENEW`], [`TTL`]) get wake-ups
    /// from the store's change feed or, with `wakeups` false, only tick on the renew interval.
    fn new(env: &Env<S>, group: &str, shards: u32, wakeups: bool) -> Self {
        Self {
            store: env.store.clone(),
            clock: env.clock.clone(),
            log: Arc::new(Mutex::new(OwnershipLog::new())),
            events: Arc::new(AtomicUsize::new(0)),
            group: GroupName::new(group).expect("a group name"),
            shards,
            wakeups,
            renew: RENEW,
            ttl: TTL,
            workers: BTreeMap::new(),
            errors: BTreeMap::new(),
        }
    }

    /// The same pool, its workers on [`SLOW_RENEW`] and [`SLOW_TTL`].
    fn slow_ticks(self) -> Self {
        Self {
            renew: SLOW_RENEW,
            ttl: SLOW_TTL,
            ..self
        }
    }

    fn config(&self, id: Option<NodeId>) -> LeaseWorker {
        let mut builder = LeaseWorker::builder(
            self.group.clone(),
            ShardCount::new(self.shards).expect("a shard count"),
        )
        .ttl(self.ttl)
        .renew_interval(self.renew);
        if let Some(id) = id {
            builder = builder.node_id(id);
        }
        builder.build().expect("a valid configuration")
    }

    async fn start(&mut self) -> NodeId {
        self.launch(None, Slow::default()).await
    }

    /// Start a worker with the application `slow`.
    async fn start_slow(&mut self, slow: Slow) -> NodeId {
        self.launch(None, slow).await
    }

    /// Start a worker that uses the node id `id` in the store, as a second process started
    /// with the id of another would; it is told apart in this pool (and in the ownership log)
    /// by the id returned.
    async fn start_as(&mut self, id: NodeId) -> NodeId {
        self.launch(Some(id), Slow::default()).await
    }

    async fn launch(&mut self, id: Option<NodeId>, slow: Slow) -> NodeId {
        let config = self.config(id);
        let label = if id.is_some() {
            NodeId::new()
        } else {
            config.node_id()
        };
        let (handle, faults) = self
            .launch_config(config, label, slow)
            .await
            .expect("the worker starts");
        self.workers.insert(label, (handle, faults));
        label
    }

    /// Start `config` behind fault switches of its own, recording as `label`.
    async fn launch_config(
        &mut self,
        config: LeaseWorker,
        label: NodeId,
        slow: Slow,
    ) -> Result<(WorkerHandle, Arc<Faults>), StartError> {
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        faults.no_feed.store(!self.wakeups, Ordering::SeqCst);
        let errors = self.errors.entry(label).or_default().clone();
        let handler = SlowHandler {
            inner: RecordingHandler::new(label, self.log.clone(), self.clock.clone()),
            slow,
            assigned: AtomicUsize::new(0),
            events: self.events.clone(),
            errors,
        };
        let handle = config.start(store, handler).await?;
        Ok((handle, faults))
    }

    fn faults(&self, w: NodeId) -> Arc<Faults> {
        self.workers[&w].1.clone()
    }

    async fn stop(&mut self, w: NodeId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.shutdown().await.expect("a clean stop");
    }

    /// Stop `w` at once, without revoking or leaving: a crash, to the others.
    fn crash(&mut self, w: NodeId) {
        let (handle, _) = self.workers.remove(&w).expect("a running worker");
        handle.abort();
        lock(&self.log).crashed(w, self.clock.now());
    }

    /// What each running worker's application owns.
    fn owned(&self) -> BTreeMap<NodeId, usize> {
        self.workers
            .iter()
            .map(|(&w, (h, _))| (w, h.owned().borrow().len()))
            .collect()
    }

    fn balanced(&self) -> bool {
        balanced(self.owned().into_values(), self.shards)
    }

    /// Wait until balanced; how long it took. Panics after `limit`.
    async fn until_balanced(&self, limit: Duration, what: &str) -> Duration {
        until(limit, what, || self.balanced(), || self.owned()).await
    }

    /// Wait until `w`'s application owns `n` buckets. Panics after `limit`.
    async fn until_owns(&self, w: NodeId, n: usize, limit: Duration) -> Duration {
        let what = format!("worker {w} owning {n}");
        until(
            limit,
            &what,
            || self.owned().get(&w) == Some(&n),
            || self.owned(),
        )
        .await
    }

    /// When `w`'s application heard each revocation with `reason`.
    fn revoked_at(&self, w: NodeId, reason: RevokeReason) -> Vec<Timestamp> {
        self.events_of(w)
            .into_iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Revoked { reason: r, .. } if *r == reason))
            .map(|(t, _)| t)
            .collect()
    }

    /// When `w`'s application was assigned each bucket.
    fn assigned_at(&self, w: NodeId) -> Vec<Timestamp> {
        self.events_of(w)
            .into_iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .map(|(t, _)| t)
            .collect()
    }

    fn events_of(&self, w: NodeId) -> Vec<(Timestamp, OwnershipEvent)> {
        lock(&self.log)
            .entries()
            .iter()
            .filter(|e| e.worker == w)
            .map(|e| (e.at, e.event))
            .collect()
    }

    /// The expiry of `w`'s session as the store holds it now, if it holds one.
    async fn session_expiry(&self, w: NodeId) -> Option<Timestamp> {
        self.store
            .snapshot(&self.group)
            .await
            .expect("snapshot")
            .members
            .iter()
            .find(|m| m.worker == w)
            .map(|m| m.expires_at)
    }

    /// Wait until `done` holds, meanwhile following the expiry of `w`'s session in the store:
    /// the latest one seen. A heartbeat already sent when `w` was cut off may still renew it,
    /// so the expiry read before could be one renewal short; the store keeps the member until
    /// some time after it expired, so polling sees the last one.
    async fn until_following_expiry(
        &self,
        w: NodeId,
        limit: Duration,
        what: &str,
        mut done: impl FnMut() -> bool,
    ) -> Timestamp {
        let start = Instant::now();
        let mut expiry = None;
        loop {
            if let Some(e) = self.session_expiry(w).await {
                expiry = expiry.max(Some(e));
            }
            if done() {
                return expiry.expect("the worker's session was seen in the store");
            }
            let elapsed = start.elapsed();
            assert!(
                elapsed < limit,
                "{what}: not within {limit:?}; {:?}",
                self.owned()
            );
            tokio::time::sleep(POLL.min(limit - elapsed)).await;
        }
    }

    /// The kinds of the errors `w` reported, in order (`None`: a timeout).
    fn errors_of(&self, w: NodeId) -> Vec<Option<ErrorKind>> {
        lock(&self.errors[&w]).clone()
    }

    fn check(&self) -> Summary {
        lock(&self.log)
            .check()
            .unwrap_or_else(|e| panic!("ownership log of {}: {e}", self.group))
    }

    /// Resize the group from the count the pool's workers have to `to`; from now on the pool
    /// judges balance by `to`.
    async fn resize(&mut self, to: u32) {
        let (from, to) = (
            ShardCount::new(self.shards).expect("a shard count"),
            ShardCount::new(to).expect("a shard count"),
        );
        let outcome = self
            .store
            .resize(&self.group, from, to)
            .await
            .expect("the resize");
        assert!(
            matches!(outcome, lease_core::ResizeOutcome::Started { .. }),
            "{outcome:?}"
        );
        self.shards = to.get();
    }

    /// Wait until the resize is over (no old bucket left in the store) and the workers own
    /// every new bucket evenly; how long that took. Panics after `limit`.
    async fn until_resized(&self, limit: Duration, what: &str) -> Duration {
        let start = Instant::now();
        loop {
            if self.balanced() {
                let snap = self.store.snapshot(&self.group).await.expect("snapshot");
                if snap.draining.is_empty() && snap.shard_count.get() == self.shards {
                    return start.elapsed();
                }
            }
            let elapsed = start.elapsed();
            assert!(
                elapsed < limit,
                "{what}: not within {limit:?}; {:?}",
                self.owned()
            );
            tokio::time::sleep(POLL.min(limit - elapsed)).await;
        }
    }

    /// Start a worker configured with the pool's count and check that it is refused with the
    /// typed mismatch.
    async fn refused_for_its_count(&self) {
        let err = self
            .config(None)
            .start(self.store.clone(), lease_worker::event_channel(8).0)
            .await
            .expect_err("a worker configured with another count started");
        assert_eq!(
            err.store_error().map(lease_core::StoreError::kind),
            Some(ErrorKind::ShardCountMismatch)
        );
    }

    /// Every assignment `w`'s application heard of a bucket of `shards` buckets.
    fn assignments_of(&self, w: NodeId, shards: u32) -> Vec<Assignment> {
        self.events_of(w)
            .into_iter()
            .filter_map(|(_, e)| match e {
                OwnershipEvent::Assigned(a) if a.shards.get() == shards => Some(a),
                _ => None,
            })
            .collect()
    }

    /// Stop every worker gracefully and check the ownership log.
    async fn shutdown(mut self) -> Summary {
        let ids: Vec<NodeId> = self.workers.keys().copied().collect();
        for w in ids {
            self.stop(w).await;
        }
        self.check()
    }
}

fn ms(d: chrono::TimeDelta) -> i64 {
    d.num_milliseconds()
}

/// Eight workers starting together on 64 buckets own 8 each within three ticks, with and
/// without wake-ups: by their third tick, 2 renew intervals after they start. On the paused
/// clock that is exact (balanced at 2.005 s without wake-ups, bound 2.05 s); on real time the
/// bound counts from before the first worker starts and adds [`REAL_SLACK`] for the eight
/// starts and the round trips, still short of a fourth tick.
pub async fn cold_start_of_eight_workers_balances_within_three_ticks<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 64, wakeups);
        let started = Instant::now();
        for _ in 0..8 {
            pool.start().await;
        }
        let limit = (2 * RENEW + env.slack()).saturating_sub(started.elapsed());
        pool.until_balanced(limit, "cold start of 8 workers").await;
        eprintln!(
            "cold start, 8 workers x 64 buckets, wake-ups {wakeups}: balanced in {:?}",
            started.elapsed()
        );
        assert!(pool.owned().values().all(|&n| n == 8), "{:?}", pool.owned());
        pool.shutdown().await;
    }
}

/// A fourth worker joining three on 64 buckets gets its 16 within two ticks (its own first
/// and the next: one renew interval), or within 250 ms with wake-ups, and only those 16 move
/// (each shed exactly once, from the others' excess). Without wake-ups (renew 1 s) the
/// two-tick bound is exact on the paused clock (1.000 s, bound 1.05 s) and a renew interval
/// plus [`REAL_SLACK`] on real time, still short of a third tick. With wake-ups the workers
/// renew every 5 s ([`SLOW_RENEW`]), so only wake-ups can serve the joiner within 250 ms, the
/// same bound on both clocks.
pub async fn a_joiner_gets_its_share_within_two_ticks<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 64, wakeups);
        if wakeups {
            pool = pool.slow_ticks();
        }
        let started = Instant::now();
        for _ in 0..3 {
            pool.start().await;
        }
        pool.until_balanced(5 * pool.renew, "cold start").await;
        eprintln!(
            "cold start, 3 workers x 64 buckets, wake-ups {wakeups}, renew {:?}: balanced in \
             {:?}",
            pool.renew,
            started.elapsed()
        );
        let start = pool.clock.now();
        let joiner = pool.start().await;
        pool.until_balanced(pool.renew + env.slack(), "the joiner's share")
            .await;
        assert_eq!(pool.owned()[&joiner], 16);
        let at = pool
            .assigned_at(joiner)
            .into_iter()
            .max()
            .expect("the joiner was assigned buckets");
        let took = ms(at - start);
        eprintln!(
            "join, 3 -> 4 workers x 64 buckets, wake-ups {wakeups}, renew {:?}: share complete \
             {took} ms after joining",
            pool.renew
        );
        if wakeups {
            assert!(
                took < WAKE_UP_BOUND.as_millis() as i64,
                "with wake-ups the joiner waited {took} ms"
            );
        }
        let moved = lock(&pool.log)
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

/// One of three workers stopping gracefully has its 4 buckets revoked (shutdown), and the
/// others own them within two ticks (a renew interval), or within 250 ms with wake-ups, with
/// no overlap. As for a join, the two-tick bound (renew 1 s) is exact on the paused clock
/// (1.05 s) and a renew interval plus [`REAL_SLACK`] on real time; with wake-ups the workers
/// renew every 5 s ([`SLOW_RENEW`]) and the 250 ms bound is the same on both clocks.
pub async fn a_graceful_stop_hands_over_without_overlap<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    for wakeups in [false, true] {
        let mut pool = Pool::new(&env, if wakeups { "woken" } else { "ticking" }, 12, wakeups);
        if wakeups {
            pool = pool.slow_ticks();
        }
        let mut ids = Vec::new();
        for _ in 0..3 {
            ids.push(pool.start().await);
        }
        pool.until_balanced(5 * pool.renew, "cold start").await;
        let stopped_at = pool.clock.now();
        pool.stop(ids[0]).await;
        pool.until_balanced(
            pool.renew + env.slack(),
            "the stopped worker's buckets re-owned",
        )
        .await;
        let last_assigned = [ids[1], ids[2]]
            .iter()
            .flat_map(|&w| pool.assigned_at(w))
            .max()
            .expect("assignments");
        let took = ms(last_assigned - stopped_at);
        eprintln!(
            "graceful stop of 1 of 3 (12 buckets), wake-ups {wakeups}, renew {:?}: re-owned in \
             {took} ms",
            pool.renew
        );
        if wakeups {
            assert!(
                took < WAKE_UP_BOUND.as_millis() as i64,
                "with wake-ups the handoff took {took} ms"
            );
        }
        assert_eq!(
            pool.revoked_at(ids[0], RevokeReason::Shutdown).len(),
            4,
            "the stopped worker's application was not told"
        );
        let summary = pool.shutdown().await;
        assert!(summary.handoffs >= 4);
    }
}

/// A graceful stop whose application takes longer than a ttl over its revocations (1 s each, 4
/// buckets: 4 s, against a ttl of 3 s) keeps its session: the worker renews while it revokes
/// and leaves at the end, so the other worker is assigned those buckets only after the last
/// revocation returned, and the ownership log shows no bucket held twice. Without renewals
/// during the stop the session expired 3 s into it, and the other worker took the last bucket
/// while the stopping application still worked on it.
pub async fn a_slow_graceful_stop_renews_until_it_leaves<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let slow = pool
        .start_slow(Slow {
            revoke: Duration::from_secs(1),
            ..Slow::default()
        })
        .await;
    let other = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let stopped_at = pool.clock.now();
    pool.stop(slow).await;
    let revoked = pool.revoked_at(slow, RevokeReason::Shutdown);
    assert_eq!(
        revoked.len(),
        4,
        "the stopping application heard 4 shutdowns"
    );
    let last_revoked = revoked.iter().max().copied().expect("revocations");
    assert!(
        last_revoked - stopped_at >= chrono::TimeDelta::from_std(TTL).expect("a ttl"),
        "the stop lasted {} ms, less than a ttl",
        ms(last_revoked - stopped_at)
    );
    pool.until_owns(other, 8, RENEW + env.slack()).await;
    let taken: Vec<Timestamp> = pool
        .assigned_at(other)
        .into_iter()
        .filter(|&t| t > stopped_at)
        .collect();
    assert_eq!(
        taken.len(),
        4,
        "the other worker took the stopped one's buckets"
    );
    let first_taken = taken.iter().min().copied().expect("assignments");
    assert!(
        first_taken >= last_revoked,
        "a bucket was assigned {} ms before the stopping application's last revocation returned",
        ms(last_revoked - first_taken)
    );
    let summary = pool.shutdown().await;
    assert!(summary.handoffs >= 4);
}

/// A crashed worker's 4 buckets move only after its session expired in the store, and within
/// a renew interval (plus 250 ms) of it: the others find them claimable at their next tick.
pub async fn a_crashed_workers_buckets_move_only_after_its_lease_expires<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 12, true);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(pool.start().await);
    }
    pool.until_balanced(5 * RENEW, "cold start").await;
    let victim = ids[0];
    pool.crash(victim);
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let held: Vec<Bucket> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(victim) && b.state == BucketState::Live)
        .map(|b| b.bucket)
        .collect();
    assert_eq!(held.len(), 4);
    let expires = pool
        .until_following_expiry(
            victim,
            TTL + RENEW + env.slack(),
            "the crashed worker's buckets re-owned",
            || pool.balanced(),
        )
        .await;
    let log = lock(&pool.log).clone();
    let holdings = log.holdings().expect("holdings");
    for b in &held {
        // Buckets move during the cold start: the holding that counts is the one after the
        // crashed worker's.
        let list = &holdings[b];
        let last = list
            .iter()
            .rposition(|h| h.worker == victim)
            .expect("held by the crashed worker");
        let next = list.get(last + 1).expect("re-owned");
        assert!(
            next.from >= expires,
            "bucket {b} re-assigned at {} before the crashed lease expired at {expires}",
            next.from
        );
        let late = (next.from - expires).to_std().expect("after expiry");
        assert!(
            late <= RENEW + WAKE_UP_BOUND,
            "bucket {b} re-owned {late:?} after expiry, more than a renew interval"
        );
    }
    pool.shutdown().await;
}

/// A worker whose heartbeats fail revokes its 4 buckets (expired) before its session expires
/// in the store, so before anyone can take them; the other then owns all 8. Healed, it starts
/// a new session and gets its share back.
pub async fn a_worker_that_cannot_renew_fences_itself_before_anyone_takes_over<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.fail_heartbeats.store(true, Ordering::SeqCst);
    let latest_expiry = pool
        .until_following_expiry(a, TTL + RENEW + env.slack(), "b taking over", || {
            pool.owned()[&b] == 8
        })
        .await;
    let fenced = pool.revoked_at(a, RevokeReason::Fenced);
    assert_eq!(
        fenced.len(),
        4,
        "a did not revoke its four buckets: {:?}",
        pool.events_of(a)
    );
    for t in &fenced {
        assert!(
            *t < latest_expiry,
            "a fenced at {t}, after its session expired at {latest_expiry}"
        );
    }
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.fail_heartbeats.store(false, Ordering::SeqCst);
    // Only that it recovers matters here, not how fast.
    pool.until_balanced(5 * RENEW, "a's share back").await;
    let summary = pool.shutdown().await;
    assert_eq!(summary.revocations.get("fenced"), Some(&4));
}

/// A worker whose store calls hang, as over a cut network (no error ever comes back), revokes
/// its 4 buckets at its trust deadline while the call hangs, before its session expires; the
/// other worker owns all 8 after that. Healed, it gets its share back.
pub async fn a_worker_cut_off_mid_call_fences_while_the_call_hangs<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.hang.store(true, Ordering::SeqCst);
    let expiry = pool
        .until_following_expiry(a, TTL + RENEW + env.slack(), "b taking over", || {
            pool.owned()[&b] == 8
        })
        .await;
    let fenced = pool.revoked_at(a, RevokeReason::Fenced);
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
    assert!(
        fenced.iter().all(|t| *t < expiry),
        "fenced at {fenced:?}, expiry {expiry}"
    );
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.hang.store(false, Ordering::SeqCst);
    pool.until_balanced(5 * RENEW, "a's share back").await;
    pool.shutdown().await;
}

/// A worker whose session was ended behind its back (an operator's forced release) revokes
/// everything it held (expired) before it is assigned anything under its new session, at its
/// next tick.
pub async fn a_new_session_revokes_everything_before_claiming_again<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, false);
    let a = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let before = pool.events_of(a).len();
    pool.store.evict(&pool.group, a).await.expect("leave");
    let reclaimed = || {
        let events = pool.events_of(a);
        let after = &events[before..];
        let revoked = after
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Expired,
                        ..
                    }
                )
            })
            .count();
        let assigned = after
            .iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
            .count();
        revoked == 4 && assigned == 4
    };
    until(
        RENEW + env.slack(),
        "a revoking its 4 buckets (expired) and claiming them again",
        reclaimed,
        || pool.events_of(a),
    )
    .await;
    let events = pool.events_of(a);
    let first_assigned = events[before..]
        .iter()
        .position(|(_, e)| matches!(e, OwnershipEvent::Assigned { .. }))
        .expect("assigned again");
    let last_revoked = events[before..]
        .iter()
        .rposition(|(_, e)| matches!(e, OwnershipEvent::Revoked { .. }))
        .expect("revoked");
    assert!(
        last_revoked < first_assigned,
        "assigned under the new session before every old bucket was revoked: {:?}",
        &events[before..]
    );
    // The application's events are logged as it is told; its owned set is published once
    // the worker sees the call return: wait for that, not for the next instant.
    pool.until_balanced(env.slack(), "a holding its 4 buckets again")
        .await;
    pool.shutdown().await;
}

/// While every store call fails (transiently), the worker keeps retrying (at least 10 attempts,
/// with backoff) and does not end; each failed call is reported once to `on_error`, with the
/// store's error, and counted in `lease_store_errors_total`. Healed, it recovers and reports
/// nothing more.
///
/// The metric is read from a recorder installed for this case's thread only
/// (`metrics::set_default_local_recorder`), so cases running in parallel do not count into it:
/// the worker registers its metrics inside `start`, on the thread awaiting it, which is the
/// test's own thread on both runtimes (a `#[tokio::test]` body runs in `block_on`). The handles
/// it gets then count from any thread.
pub async fn store_errors_are_reported_and_retried_without_stopping<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let counters = Counters::default();
    let recorder = metrics::set_default_local_recorder(&counters);
    let errors_counted = || counters.get(r#"lease_store_errors_total{group="orders"}"#);
    let mut pool = Pool::new(&env, "orders", 4, false);
    let a = pool.start().await;
    drop(recorder);
    pool.until_balanced(5 * RENEW, "cold start").await;
    assert!(pool.errors_of(a).is_empty() && errors_counted() == 0);
    let faults = pool.faults(a);
    faults.fail_all.store(true, Ordering::SeqCst);
    // Backoff from 100 ms doubling to the renew interval: 10 attempts in 7.5 s.
    until(
        10 * RENEW,
        "10 failed attempts reported",
        || pool.errors_of(a).len() >= 10,
        || pool.errors_of(a),
    )
    .await;
    assert!(
        !pool.workers[&a].0.is_finished(),
        "a transient store error ended the worker"
    );
    faults.fail_all.store(false, Ordering::SeqCst);
    pool.until_balanced(5 * RENEW, "recovered").await;
    // Calls are made one at a time, and a tick succeeded since: every failed one was reported.
    let injected = faults.injected.load(Ordering::SeqCst);
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
    pool.shutdown().await;
}

/// A store error retrying cannot fix (permission denied) stops the worker, where a transient
/// one (unavailable) is retried: the worker revokes everything, ends, and `wait` returns the
/// store's error, not transient. The worker cannot leave the group either (the store refuses
/// every call of that worker), so the store still lists its session until it expires: the
/// other worker takes its buckets only then.
pub async fn a_permanent_store_error_stops_the_worker<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.fail_all.store(true, Ordering::SeqCst);
    until(
        5 * RENEW,
        "3 transient failures reported",
        || pool.errors_of(a).len() >= 3,
        || pool.errors_of(a),
    )
    .await;
    assert!(
        !pool.workers[&a].0.is_finished(),
        "a transient store error ended the worker"
    );
    // One switch on before the other goes off: no call gets through in between.
    faults.fail_permanently.store(true, Ordering::SeqCst);
    faults.fail_all.store(false, Ordering::SeqCst);
    let (mut handle, _) = pool.workers.remove(&a).expect("a");
    let owned = handle.owned();
    let ended = tokio::time::timeout(TTL + env.slack(), handle.wait())
        .await
        .expect("the worker kept running on a permanent error");
    match &ended {
        Err(WorkerFailed::Store(e)) => {
            assert!(!e.is_transient(), "ended on a transient error: {e:?}")
        }
        other => panic!("the worker ended with {other:?}"),
    }
    let ended_at = pool.clock.now();
    assert!(owned.borrow().is_empty(), "{:?}", owned.borrow());
    let held = lock(&pool.log)
        .holdings()
        .expect("holdings")
        .values()
        .flatten()
        .filter(|h| h.worker == a)
        .filter(|h| h.until.is_none())
        .count();
    assert_eq!(held, 0, "a's application still holds buckets");
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let member = snap
        .members
        .iter()
        .find(|m| m.worker == a)
        .expect("a's session, which it could not leave");
    assert!(member.live && member.expires_at > ended_at);
    let expiry = member.expires_at;
    pool.until_owns(b, 8, TTL + RENEW + env.slack()).await;
    let taken = pool.assigned_at(b).into_iter().max().expect("assignments");
    assert!(
        taken >= expiry,
        "b was assigned a's buckets at {taken}, before a's session expired at {expiry}"
    );
    pool.shutdown().await;
}

/// A worker that cannot leave the group when stopped says so: `shutdown` fails with
/// `LeaveFailed` naming the leave's error, whether the store fails or does not answer, the
/// failure is reported to `on_error` too, and the store keeps the worker's session until it
/// expires (the others must wait for that).
pub async fn a_worker_that_cannot_leave_the_group_says_so_on_shutdown<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    for hang in [false, true] {
        let mut pool = Pool::new(&env, if hang { "hanging" } else { "failing" }, 4, false);
        let a = pool.start().await;
        pool.until_balanced(5 * RENEW, "cold start").await;
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
                    (Operation::Leave, ErrorKind::Backend)
                );
            }
            Err(WorkerFailed::LeaveFailed {
                source: WorkerError::Timeout { operation, .. },
            }) if hang => assert_eq!(*operation, Operation::Leave),
            other => panic!("hang {hang}: the failed leave was not reported: {other:?}"),
        }
        assert_eq!(
            pool.errors_of(a).len(),
            1,
            "the failed leave is also reported to on_error"
        );
        switch.store(false, Ordering::SeqCst);
        // The session stays until it expires: a leave given up on must not happen later.
        let mut expiry = pool
            .session_expiry(a)
            .await
            .unwrap_or_else(|| panic!("hang {hang}: the session is gone without a leave"));
        let start = Instant::now();
        loop {
            let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
            let now = pool.clock.now();
            match snap.members.iter().find(|m| m.worker == a) {
                Some(m) if m.live => expiry = m.expires_at,
                Some(_) => break,
                None => {
                    assert!(
                        now >= expiry,
                        "hang {hang}: the session left at {now}, before its expiry {expiry}"
                    );
                    break;
                }
            }
            assert!(
                start.elapsed() < TTL + env.slack(),
                "the session never expired"
            );
            tokio::time::sleep(POLL).await;
        }
        pool.check();
    }
}

/// Two groups on one store, of different sizes, balance independently.
pub async fn several_groups_share_one_store_without_interfering<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut orders = Pool::new(&env, "orders", 16, true);
    // Bucket numbers repeat across groups: each group is checked on a log of its own.
    let mut invoices = Pool::new(&env, "invoices", 5, true);
    for _ in 0..2 {
        orders.start().await;
        invoices.start().await;
    }
    invoices.start().await;
    orders.until_balanced(5 * RENEW, "orders").await;
    invoices.until_balanced(5 * RENEW, "invoices").await;
    assert!(orders.owned().values().all(|&n| n == 8));
    let mut split: Vec<usize> = invoices.owned().values().copied().collect();
    split.sort_unstable();
    assert_eq!(split, vec![1, 2, 2]);
    orders.shutdown().await;
    invoices.shutdown().await;
}

/// A worker configured with 8 buckets for a group the store holds with 4 is refused at start
/// with the typed mismatch, and nothing runs.
pub async fn a_shard_count_mismatch_refuses_to_start<S: LeaseStore + Clone + 'static>(env: Env<S>) {
    let pool = Pool::new(&env, "orders", 8, false);
    pool.store
        .ensure_group(&pool.group, ShardCount::new(4).expect("n"))
        .await
        .expect("ensure");
    pool.refused_for_its_count().await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    assert!(snap.members.is_empty(), "{:?}", snap.members);
    pool.check();
}

/// A configuration runs as one task at a time: a clone started while the original runs is
/// refused (`AlreadyRunning`, before touching the store); once the original stopped, the
/// clone starts and owns every bucket.
pub async fn starting_a_running_configuration_again_is_refused<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, true);
    let config = pool.config(None);
    let id = config.node_id();
    let (first, _) = pool
        .launch_config(config.clone(), id, Slow::default())
        .await
        .expect("the first start");
    until(
        5 * RENEW,
        "the first run owning 4",
        || first.owned().borrow().len() == 4,
        || first.owned().borrow().len(),
    )
    .await;
    match pool
        .launch_config(config.clone(), id, Slow::default())
        .await
    {
        Err(StartError::AlreadyRunning { group, worker }) => {
            assert_eq!((group, worker), (pool.group.clone(), id));
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a running configuration started twice"),
    }
    assert_eq!(
        first.owned().borrow().len(),
        4,
        "the refused start disturbed the first"
    );
    first.shutdown().await.expect("a clean stop");
    let (second, faults) = pool
        .launch_config(config, id, Slow::default())
        .await
        .expect("the configuration starts again once stopped");
    pool.workers.insert(id, (second, faults));
    pool.until_owns(id, 4, RENEW + env.slack()).await;
    pool.shutdown().await;
}

/// Slow handlers cannot starve the renewals: a worker assigning 40 buckets at 200 ms each
/// (8 s, past the 2.5 s trust window) interleaves renewals and never fences on the way. A store
/// stall of 2.8 s then makes it fence exactly once (40 revocations), and it gets all 40 back
/// without flapping; a joiner then gets half.
pub async fn slow_handlers_do_not_starve_renewals<S: LeaseStore + Clone + 'static>(env: Env<S>) {
    let mut pool = Pool::new(&env, "orders", 40, true);
    let a = pool
        .start_slow(Slow {
            assign: Duration::from_millis(200),
            ..Slow::default()
        })
        .await;
    // 8 s of handler time, a renewal every second between assignments.
    pool.until_owns(a, 40, 12 * RENEW).await;
    assert_eq!(
        pool.revoked_at(a, RevokeReason::Fenced).len(),
        0,
        "a fenced itself while assigning"
    );
    let faults = pool.faults(a);
    faults.hang.store(true, Ordering::SeqCst);
    // The stall is the fault's length, past the 2.5 s trust window.
    tokio::time::sleep(Duration::from_millis(2_800)).await;
    faults.hang.store(false, Ordering::SeqCst);
    // Fenced (at the trust deadline, during the stall), then all 40 back.
    until(
        20 * RENEW,
        "a fenced and owning 40 again",
        || pool.revoked_at(a, RevokeReason::Fenced).len() >= 40 && pool.owned()[&a] == 40,
        || pool.owned(),
    )
    .await;
    let b = pool.start().await;
    pool.until_balanced(20 * RENEW, "b's half").await;
    assert_eq!(pool.owned()[&b], 20);
    // Counted after b's half, so that a fence after the recovery would show too.
    let fenced = pool.revoked_at(a, RevokeReason::Fenced).len();
    assert_eq!(
        fenced, 40,
        "a did not fence exactly once ({fenced} revocations)"
    );
    pool.shutdown().await;
}

/// A panicking handler stops the worker visibly: `wait` reports the panic with its message,
/// and the owned set, which held the bucket assigned before, empties. Its session then expires
/// and another worker takes over.
pub async fn a_panicking_handler_stops_the_worker_visibly<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, true);
    // Alone, it claims all 4 at its first tick; the second assignment panics.
    let a = pool
        .start_slow(Slow {
            panic_on: Some(2),
            ..Slow::default()
        })
        .await;
    let (mut handle, _) = pool.workers.remove(&a).expect("a");
    let owned = handle.owned();
    let failure = tokio::time::timeout(RENEW + env.slack(), handle.wait())
        .await
        .expect("the worker did not end")
        .expect_err("the worker survived its handler's panic");
    assert!(
        matches!(&failure, WorkerFailed::HandlerPanicked { message }
            if message.contains("the application's handler failed")),
        "{failure}"
    );
    assert_eq!(pool.assigned_at(a).len(), 1, "the first assignment");
    assert!(
        owned.borrow().is_empty(),
        "the owned set kept buckets: {:?}",
        owned.borrow()
    );
    lock(&pool.log).crashed(a, pool.clock.now());
    let b = pool.start().await;
    pool.until_owns(b, 4, TTL + RENEW + env.slack()).await;
    pool.shutdown().await;
}

/// Two processes started with one node id never share its session: the second is refused
/// (`NodeIdInUse`, reported at each attempt) and owns nothing while the first runs; once the
/// first stops gracefully the second starts a session of its own and takes every bucket, and
/// the ownership log shows no bucket held by both.
pub async fn two_processes_with_one_node_id_never_share_a_session<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let first = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let second = pool.start_as(first).await;
    until(
        5 * RENEW,
        "the second process refused 5 times",
        || pool.errors_of(second).len() >= 5,
        || pool.errors_of(second),
    )
    .await;
    assert_eq!(pool.owned()[&first], 8, "the first process lost buckets");
    assert_eq!(
        pool.owned()[&second],
        0,
        "the second process was given buckets of the first one's session"
    );
    let refused = pool.errors_of(second);
    assert!(
        refused.iter().all(|k| *k == Some(ErrorKind::NodeIdInUse)),
        "the second process did not report the id in use at each attempt: {refused:?}"
    );
    let stopped_at = pool.clock.now();
    pool.stop(first).await;
    pool.until_owns(second, 8, 2 * RENEW + env.slack()).await;
    assert!(pool.assigned_at(second).iter().all(|t| *t >= stopped_at));
    let summary = pool.shutdown().await;
    assert_eq!(summary.handoffs, 8);
}

/// Revoke before release, the rule a graceful handoff rests on: a worker shedding 4 buckets to
/// a joiner releases each one only after its application acknowledged the revocation (the
/// handler returned, 200 ms each here), so the joiner, woken by the release, is assigned it
/// only after that, as the ownership log shows (a revocation is recorded when the handler
/// returns). The workers renew every 5 s ([`SLOW_RENEW`]): only wake-ups can complete the
/// handoff within the four revocations plus [`WAKE_UP_BOUND`] (and the slack).
pub async fn a_shed_bucket_is_released_only_after_its_revoke_returns<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const REVOKE: Duration = Duration::from_millis(200);
    let mut pool = Pool::new(&env, "orders", 8, true).slow_ticks();
    let a = pool
        .start_slow(Slow {
            revoke: REVOKE,
            ..Slow::default()
        })
        .await;
    pool.until_owns(a, 8, 5 * RENEW).await;
    let b = pool.start().await;
    let took = pool
        .until_balanced(
            4 * REVOKE + WAKE_UP_BOUND + env.slack(),
            "the joiner's half, by wake-ups",
        )
        .await;
    eprintln!("shed 4 of 8 to a joiner, 200 ms per revocation: handed over in {took:?}");
    assert_eq!(pool.owned()[&b], 4);
    assert_eq!(pool.revoked_at(a, RevokeReason::Shed).len(), 4);
    // Checked here, before the workers stop (stopping hands buckets over again).
    assert_eq!(pool.check().handoffs, 4, "the shed buckets went to b");
    pool.shutdown().await;
}

/// Three workers on 12 buckets, renewing every 5 s, follow a split to 24 and then a change to
/// 18 (each new bucket waiting for four old ones held by different workers) without restarting:
/// each revokes its old buckets (reason `resharded`), releases them once the handler returned,
/// and the new generation is owned evenly within [`WAKE_UP_BOUND`] of each resize, which only
/// wake-ups can explain. Every assignment names its shard count and parents, and the ownership
/// log finds no key in two buckets held at once across the generations.
pub async fn a_resize_is_followed_on_wake_ups_without_restarting<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 12, true).slow_ticks();
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(pool.start().await);
    }
    pool.until_balanced(5 * pool.renew, "cold start").await;
    for (from, to) in [(12, 24), (24, 18)] {
        pool.resize(to).await;
        let took = pool
            .until_resized(
                WAKE_UP_BOUND + env.slack(),
                &format!("the resize from {from} to {to} followed by wake-ups"),
            )
            .await;
        eprintln!("resize {from} -> {to} with 3 live workers: followed in {took:?}");
        let (from_n, to_n) = (
            ShardCount::new(from).expect("n"),
            ShardCount::new(to).expect("n"),
        );
        for &w in &ids {
            for a in pool.assignments_of(w, to) {
                assert_eq!(a.resized_from, Some(from_n), "{a:?}");
                assert_eq!(
                    a.parents(),
                    lease_core::resize::parents(from_n, to_n, a.bucket)
                );
            }
        }
    }
    let resharded: usize = ids
        .iter()
        .map(|&w| pool.revoked_at(w, RevokeReason::Resharded).len())
        .sum();
    assert_eq!(resharded, 12 + 24, "every old bucket revoked as resharded");
    let summary = pool.check();
    assert!(summary.key_pairs > 0, "{summary:?}");
    pool.shutdown().await;
}

/// A worker configured with the count a group was resized from starts (contract rule E3)
/// and follows the group's count, owning every new bucket; one configured with any other
/// count is refused with the typed mismatch.
pub async fn a_worker_configured_before_a_resize_follows_it<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 8, true);
    pool.store
        .ensure_group(&pool.group, ShardCount::new(8).expect("n"))
        .await
        .expect("ensure");
    pool.resize(16).await;
    // The workers' configuration still says 8.
    pool.shards = 8;
    let w = pool.start().await;
    pool.shards = 16;
    pool.until_owns(w, 16, 2 * RENEW + env.slack()).await;
    let assigned = pool.assignments_of(w, 16);
    assert_eq!(assigned.len(), 16, "{assigned:?}");
    pool.shards = 12;
    pool.refused_for_its_count().await;
    pool.shards = 16;
    pool.shutdown().await;
}

/// A worker crashes holding half of 8 buckets, and the group splits to 16 at once: the
/// survivor's old buckets retire by release and their new buckets are owned within
/// [`WAKE_UP_BOUND`]; the crashed worker's retire only when its session expires, and the new
/// buckets sharing their keys are assigned no earlier. In the end the survivor owns all 16.
pub async fn an_owner_dead_during_a_resize_holds_back_only_its_keys<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "resized", 8, true);
    let (live, dead) = (pool.start().await, pool.start().await);
    pool.until_balanced(5 * RENEW, "cold start").await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let dead_held: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(dead) && b.state == BucketState::Live)
        .map(|b| b.bucket.get())
        .collect();
    assert_eq!(dead_held.len(), 4);
    pool.crash(dead);
    pool.resize(16).await;
    pool.until_owns(live, 8, WAKE_UP_BOUND + env.slack()).await;
    let expires = pool
        .until_following_expiry(
            dead,
            TTL + RENEW + env.slack(),
            "the dead worker's keys",
            || pool.owned().get(&live) == Some(&16),
        )
        .await;
    for a in pool.assignments_of(live, 16) {
        let held_by_dead = dead_held.contains(&(a.bucket.get() % 8));
        let at = pool
            .events_of(live)
            .into_iter()
            .find(|(_, e)| *e == OwnershipEvent::Assigned(a))
            .map(|(t, _)| t)
            .expect("the assignment's time");
        assert_eq!(
            at >= expires,
            held_by_dead,
            "new bucket {} assigned at {at}, the dead session expired at {expires}",
            a.bucket
        );
    }
    pool.until_resized(RENEW + env.slack(), "the drain over")
        .await;
    pool.shutdown().await;
}

/// An ownership log the applications of a group record into.
type Log = Arc<Mutex<OwnershipLog<Timestamp>>>;

/// A running node of a [`Nodes`] pool: its handle, its fault switches, its groups.
struct NodeRun {
    handle: NodeHandle,
    faults: Arc<Faults>,
    groups: BTreeMap<GroupName, GroupHandle>,
}

/// Nodes on one store, each behind its own fault switches, in any of a set of groups; each
/// group's applications record into that group's ownership log (bucket numbers repeat across
/// groups).
struct Nodes<S> {
    store: S,
    clock: Arc<dyn Clock>,
    /// Each group's shard count and ownership log.
    groups: BTreeMap<GroupName, (u32, Log)>,
    events: Arc<AtomicUsize>,
    nodes: BTreeMap<NodeId, NodeRun>,
}

impl<S: LeaseStore + Clone + 'static> Nodes<S> {
    /// A pool of nodes ([`RENEW`], [`TTL`], with wake-ups) for groups of these names and
    /// shard counts.
    fn new(env: &Env<S>, groups: &[(&str, u32)]) -> Self {
        Self {
            store: env.store.clone(),
            clock: env.clock.clone(),
            groups: groups
                .iter()
                .map(|&(name, shards)| {
                    (
                        GroupName::new(name).expect("a group name"),
                        (shards, Arc::new(Mutex::new(OwnershipLog::new()))),
                    )
                })
                .collect(),
            events: Arc::new(AtomicUsize::new(0)),
            nodes: BTreeMap::new(),
        }
    }

    fn group(name: &str) -> GroupName {
        GroupName::new(name).expect("a group name")
    }

    /// Start a node in these groups (added one after another, as an application would).
    async fn start(&mut self, groups: &[&str]) -> NodeId {
        self.start_with(groups, |b| b).await
    }

    /// [`start`](Self::start), the node's configuration changed by `configure`.
    async fn start_with(
        &mut self,
        groups: &[&str],
        configure: impl FnOnce(lease_worker::LeaseNodeBuilder) -> lease_worker::LeaseNodeBuilder,
    ) -> NodeId {
        let store = FaultyStore::new(self.store.clone());
        let faults = store.faults();
        let handle = configure(LeaseNode::builder().ttl(TTL).renew_interval(RENEW))
            .build()
            .expect("a valid configuration")
            .start(store)
            .expect("the node starts");
        let id = handle.node_id();
        self.nodes.insert(
            id,
            NodeRun {
                handle,
                faults,
                groups: BTreeMap::new(),
            },
        );
        for g in groups {
            self.add(id, g).await;
        }
        id
    }

    /// Add group `name` to node `id`.
    async fn add(&mut self, id: NodeId, name: &str) {
        self.add_slow(id, name, Slow::default()).await;
    }

    /// Add group `name` to node `id`, its application as slow as `slow` says.
    async fn add_slow(&mut self, id: NodeId, name: &str, slow: Slow) {
        let group = Self::group(name);
        let (shards, log) = self.groups[&group].clone();
        let handler = SlowHandler {
            inner: RecordingHandler::new(id, log, self.clock.clone()),
            slow,
            assigned: AtomicUsize::new(0),
            events: self.events.clone(),
            errors: Reported::default(),
        };
        let node = self.nodes.get_mut(&id).expect("a running node");
        let handle = node
            .handle
            .add_group(
                group.clone(),
                ShardCount::new(shards).expect("a shard count"),
                handler,
            )
            .await
            .expect("the group is added");
        node.groups.insert(group, handle);
    }

    /// Remove group `name` from node `id`, through the node's handle, and wait for it.
    async fn remove(&mut self, id: NodeId, name: &str) {
        let group = Self::group(name);
        let node = self.nodes.get_mut(&id).expect("a running node");
        let handle = node.groups.remove(&group).expect("a group of the node");
        node.handle
            .remove_group(&group)
            .await
            .expect("the group is removed and left");
        assert!(
            handle.owned().borrow().is_empty(),
            "the removed group's owned set kept buckets"
        );
    }

    fn faults(&self, id: NodeId) -> Arc<Faults> {
        self.nodes[&id].faults.clone()
    }

    /// What each node's application of group `name` owns, for the nodes in it.
    fn owned(&self, name: &str) -> BTreeMap<NodeId, usize> {
        let group = Self::group(name);
        self.nodes
            .iter()
            .filter_map(|(&id, n)| n.groups.get(&group).map(|h| (id, h.owned().borrow().len())))
            .collect()
    }

    fn balanced(&self, name: &str) -> bool {
        let shards = self.groups[&Self::group(name)].0;
        balanced(self.owned(name).into_values(), shards)
    }

    /// Wait until every group in `names` is balanced among its nodes; how long it took.
    async fn until_balanced(&self, names: &[&str], limit: Duration, what: &str) -> Duration {
        until(
            limit,
            what,
            || names.iter().all(|g| self.balanced(g)),
            || {
                names
                    .iter()
                    .map(|g| (*g, self.owned(g)))
                    .collect::<Vec<_>>()
            },
        )
        .await
    }

    /// What node `id`'s application of group `name` heard, when.
    fn events_of(&self, id: NodeId, name: &str) -> Vec<(Timestamp, OwnershipEvent)> {
        lock(&self.groups[&Self::group(name)].1)
            .entries()
            .iter()
            .filter(|e| e.worker == id)
            .map(|e| (e.at, e.event))
            .collect()
    }

    /// The expiry of node `id`'s session as the store lists it now, if it lists the node live.
    async fn session_expiry(&self, id: NodeId) -> Option<Timestamp> {
        self.store
            .nodes()
            .await
            .expect("nodes")
            .nodes
            .iter()
            .find(|n| n.node == id && n.live)
            .map(|n| n.expires_at)
    }

    /// Check every group's ownership log.
    fn check(&self) -> Vec<Summary> {
        self.groups
            .iter()
            .map(|(group, (_, log))| {
                lock(log)
                    .check()
                    .unwrap_or_else(|e| panic!("ownership log of {group}: {e}"))
            })
            .collect()
    }

    /// Stop node `id` gracefully and wait for it.
    async fn stop(&mut self, id: NodeId) {
        let node = self.nodes.remove(&id).expect("a running node");
        node.handle.shutdown().await.expect("a clean stop");
    }

    /// Stop every node gracefully and check the logs.
    async fn shutdown(mut self) -> Vec<Summary> {
        for (_, node) in std::mem::take(&mut self.nodes) {
            node.handle.shutdown().await.expect("a clean stop");
        }
        self.check()
    }
}

/// Three nodes, each in three groups of different shard counts (`orders` 16, `billing` 64,
/// `audit` 5), share each group evenly by its own count, in one heartbeat per node per tick
/// whatever its groups: exactly one per renew interval on the paused clock, within one of it on
/// real time. The first node is also alone in `solo` (4). An operator evicting it from `solo`
/// makes it revoke its `solo` buckets (lost), join again and own them again; its other
/// groups' applications hear nothing of it. (Evicted from a group with other members, its
/// buckets there are taken by them as soon as the eviction wakes them, racing the evicted
/// node's own wake-up: an operator's eviction frees the buckets at once, and only the
/// fencing tokens keep the evicted node's late writes out. So the case evicts from a group no
/// one else can take over.)
pub async fn a_node_in_three_groups_shares_each_by_its_own_count<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const GROUPS: [&str; 3] = ["orders", "billing", "audit"];
    let mut nodes = Nodes::new(
        &env,
        &[("orders", 16), ("billing", 64), ("audit", 5), ("solo", 4)],
    );
    let mut ids = vec![nodes.start(&["orders", "billing", "audit", "solo"]).await];
    for _ in 0..2 {
        ids.push(nodes.start(&GROUPS).await);
    }
    let took = nodes
        .until_balanced(
            &["orders", "billing", "audit", "solo"],
            5 * RENEW,
            "three groups over three nodes, and solo",
        )
        .await;
    eprintln!("3 nodes x 3 groups (16, 64, 5 buckets): balanced in {took:?}");
    for (g, loads) in [
        ("orders", [5, 5, 6]),
        ("billing", [21, 21, 22]),
        ("audit", [1, 2, 2]),
    ] {
        let mut owned: Vec<usize> = nodes.owned(g).into_values().collect();
        owned.sort_unstable();
        assert_eq!(owned, loads, "{g}");
    }
    // Steady state: one heartbeat per node per tick, for its three groups.
    let before: Vec<u64> = ids
        .iter()
        .map(|&id| nodes.faults(id).heartbeats.load(Ordering::SeqCst))
        .collect();
    tokio::time::sleep(5 * RENEW).await;
    for (i, &id) in ids.iter().enumerate() {
        let beats = nodes.faults(id).heartbeats.load(Ordering::SeqCst) - before[i];
        if env.paused {
            assert_eq!(
                beats, 5,
                "heartbeats of a node in 3 groups in 5 renew intervals"
            );
        } else {
            assert!(
                (4..=6).contains(&beats),
                "{beats} heartbeats of a node in 3 groups in 5 renew intervals"
            );
        }
    }
    // An operator evicts the first node from solo (its other groups keep its session).
    let evicted = ids[0];
    let seen: BTreeMap<&str, usize> = ["orders", "billing", "audit", "solo"]
        .iter()
        .map(|&g| (g, nodes.events_of(evicted, g).len()))
        .collect();
    nodes
        .store
        .evict(&Nodes::<S>::group("solo"), evicted)
        .await
        .expect("evict");
    let lost = |nodes: &Nodes<S>| {
        nodes.events_of(evicted, "solo")[seen["solo"]..]
            .iter()
            .filter(|(_, e)| {
                matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Lost,
                        ..
                    }
                )
            })
            .count()
    };
    until(
        RENEW + env.slack(),
        "the evicted node revoking its solo buckets (lost) and owning them again",
        || lost(&nodes) == 4 && nodes.owned("solo")[&evicted] == 4,
        || nodes.events_of(evicted, "solo"),
    )
    .await;
    let listed = nodes.store.nodes().await.expect("nodes");
    let row = listed
        .nodes
        .iter()
        .find(|n| n.node == evicted)
        .expect("the evicted node is listed");
    assert_eq!(row.groups.len(), 4, "{row:?}");
    for g in GROUPS {
        assert_eq!(
            nodes.events_of(evicted, g).len(),
            seen[g],
            "the node's {g} application heard of the eviction from solo"
        );
    }
    nodes.until_balanced(&GROUPS, RENEW, "still balanced").await;
    nodes.shutdown().await;
}

/// Groups come and go on running nodes without disturbing the others: two nodes share
/// `orders` (12); `billing` (8) added to both at run time is shared evenly while `orders`
/// moves nothing. Removing `orders` from the first node revokes its 6 (shutdown) and the
/// second owns all 12 at once (the leave wakes it), the first node's `billing` untouched and
/// its session kept. Removing its last group ends its session (the store lists it no more);
/// added again, `orders` is shared again under a new session.
pub async fn groups_added_and_removed_at_run_time_leave_the_others_alone<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut nodes = Nodes::new(&env, &[("orders", 12), ("billing", 8)]);
    let a = nodes.start(&["orders"]).await;
    let b = nodes.start(&["orders"]).await;
    nodes
        .until_balanced(&["orders"], 5 * RENEW, "orders over two nodes")
        .await;
    let orders_events =
        |nodes: &Nodes<S>| nodes.events_of(a, "orders").len() + nodes.events_of(b, "orders").len();
    let quiet = orders_events(&nodes);
    nodes.add(a, "billing").await;
    nodes.add(b, "billing").await;
    nodes
        .until_balanced(&["billing"], 2 * RENEW + env.slack(), "billing added")
        .await;
    assert_eq!(orders_events(&nodes), quiet, "orders moved as billing came");
    assert!(nodes.balanced("orders"));

    // Removing one group of two keeps the node's session and its other group.
    let billing_seen = nodes.events_of(a, "billing").len();
    let session = nodes.session_expiry(a).await;
    assert!(session.is_some(), "a's session is not live");
    let removed_at = nodes.clock.now();
    nodes.remove(a, "orders").await;
    let shutdown = nodes
        .events_of(a, "orders")
        .iter()
        .filter(|(t, e)| {
            *t >= removed_at
                && matches!(
                    e,
                    OwnershipEvent::Revoked {
                        reason: RevokeReason::Shutdown,
                        ..
                    }
                )
        })
        .count();
    assert_eq!(shutdown, 6, "a's orders buckets revoked (shutdown)");
    let took = nodes
        .until_balanced(
            &["orders"],
            WAKE_UP_BOUND + env.slack(),
            "b taking all of orders",
        )
        .await;
    eprintln!("a group removed from a node: its 6 buckets re-owned in {took:?}");
    assert_eq!(nodes.owned("orders")[&b], 12);
    assert_eq!(
        nodes.events_of(a, "billing").len(),
        billing_seen,
        "removing orders touched a's billing"
    );
    let listed = nodes.store.nodes().await.expect("nodes");
    let a_row = listed
        .nodes
        .iter()
        .find(|n| n.node == a)
        .expect("a is listed");
    assert!(a_row.live, "removing one of two groups ended a's session");
    assert_eq!(a_row.groups, vec![Nodes::<S>::group("billing")]);

    // Removing the last group ends the session (contract rule L3).
    nodes.remove(a, "billing").await;
    nodes
        .until_balanced(
            &["billing"],
            WAKE_UP_BOUND + env.slack(),
            "b taking all of billing",
        )
        .await;
    let listed = nodes.store.nodes().await.expect("nodes");
    assert!(
        listed.nodes.iter().all(|n| n.node != a),
        "a node in no group is still listed: {:?}",
        listed.nodes
    );
    // Back in orders, under a new session.
    nodes.add(a, "orders").await;
    nodes
        .until_balanced(
            &["orders", "billing"],
            2 * RENEW + env.slack(),
            "a back in orders",
        )
        .await;
    assert_eq!(nodes.owned("orders")[&a], 6);
    nodes.shutdown().await;
}

/// A node cut off from the store (every call hangs, as over a cut network or from a process
/// that stopped being scheduled) in three groups revokes its buckets of every group (expired)
/// at its one trust deadline, before its session expires: the other node is assigned none of
/// them before that, and all of them after the session expired. Healed, the node gets its
/// share of every group back.
pub async fn a_paused_node_fences_in_every_group_before_any_bucket_is_taken<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    const GROUPS: [&str; 3] = ["orders", "billing", "audit"];
    let mut nodes = Nodes::new(&env, &[("orders", 8), ("billing", 12), ("audit", 3)]);
    let a = nodes.start(&GROUPS).await;
    let b = nodes.start(&GROUPS).await;
    nodes.until_balanced(&GROUPS, 5 * RENEW, "cold start").await;
    let held: BTreeMap<&str, usize> = GROUPS.iter().map(|&g| (g, nodes.owned(g)[&a])).collect();
    let seen: BTreeMap<&str, usize> = GROUPS
        .iter()
        .map(|&g| (g, nodes.events_of(b, g).len()))
        .collect();
    let faults = nodes.faults(a);
    let cut_at = nodes.clock.now();
    faults.hang.store(true, Ordering::SeqCst);
    // Follow a's session's expiry: a heartbeat already sent when it was cut off may still
    // renew it.
    let start = Instant::now();
    let limit = TTL + RENEW + env.slack();
    let mut expiry = None;
    loop {
        if let Some(e) = nodes.session_expiry(a).await {
            expiry = expiry.max(Some(e));
        }
        if GROUPS
            .iter()
            .all(|g| nodes.owned(g)[&b] == nodes.groups[&Nodes::<S>::group(g)].0 as usize)
        {
            break;
        }
        let elapsed = start.elapsed();
        assert!(
            elapsed < limit,
            "b taking every group: not within {limit:?}; {:?}",
            GROUPS
                .iter()
                .map(|g| (*g, nodes.owned(g)))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(POLL.min(limit - elapsed)).await;
    }
    let expiry = expiry.expect("a's session was seen in the store");
    let mut last_fence = None;
    for g in GROUPS {
        let fenced: Vec<Timestamp> = nodes
            .events_of(a, g)
            .into_iter()
            .filter(|(t, e)| {
                *t >= cut_at
                    && matches!(
                        e,
                        OwnershipEvent::Revoked {
                            reason: RevokeReason::Fenced,
                            ..
                        }
                    )
            })
            .map(|(t, _)| t)
            .collect();
        assert_eq!(fenced.len(), held[g], "a did not fence every bucket of {g}");
        last_fence = last_fence.max(fenced.iter().max().copied());
    }
    let last_fence = last_fence.expect("a fenced");
    assert!(
        last_fence < expiry,
        "a fenced its last bucket at {last_fence}, its session expired at {expiry}"
    );
    for g in GROUPS {
        let taken: Vec<Timestamp> = nodes.events_of(b, g)[seen[g]..]
            .iter()
            .filter(|(_, e)| matches!(e, OwnershipEvent::Assigned(_)))
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(taken.len(), held[g], "b took a's buckets of {g}");
        for t in taken {
            assert!(
                t >= expiry && t > last_fence,
                "b was assigned a bucket of {g} at {t}: a fenced its last at {last_fence}, its \
                 session expired at {expiry}"
            );
        }
    }
    if env.paused {
        // One trust deadline for the node: every group fenced at the same instant.
        let first_fence = GROUPS
            .iter()
            .flat_map(|&g| nodes.events_of(a, g))
            .filter(|(t, e)| {
                *t >= cut_at
                    && matches!(
                        e,
                        OwnershipEvent::Revoked {
                            reason: RevokeReason::Fenced,
                            ..
                        }
                    )
            })
            .map(|(t, _)| t)
            .min()
            .expect("a fenced");
        assert_eq!(
            first_fence, last_fence,
            "the groups fenced at different times"
        );
    }
    assert!(faults.injected.load(Ordering::SeqCst) > 0);
    faults.hang.store(false, Ordering::SeqCst);
    nodes
        .until_balanced(&GROUPS, 5 * RENEW, "a's shares back")
        .await;
    nodes.shutdown().await;
}
