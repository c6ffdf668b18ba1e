//! The runtime suite: worker-level scenarios (cold start, join, graceful stop, crash, fencing,
//! errors, misbehaving applications) and node-level ones (a node in several groups, groups
//! added and removed at run time, a node cut off fencing in every group) written once and run
//! on every backend.
//!
//! Each case gets an [`Env`]: a fresh, empty store, the clock its expiries are on, and whether
//! tokio's clock is paused. It starts real workers ([`LeaseWorker`](lease_worker::LeaseWorker),
//! a node of one group) or nodes ([`LeaseNode`](lease_worker::LeaseNode)) on that store, each
//! behind a [`FaultyStore`](crate::FaultyStore), records what their applications are told in
//! an [`OwnershipLog`](lease_core::ownership_log::OwnershipLog) per group, and panics on a
//! violation. Every case ends by checking the logs: no bucket held by two workers at once,
//! assignment before revocation, tokens only growing.
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
//!
//! The cases live in one file per rule family (`balance`, `stops`, `crashes`, `fencing`,
//! `errors`, `resizes`, `groups`, `loads`, and `controls` for the operators' controls and hand-overs
//! between processes); the harnesses several families start their workers with live apart
//! (`pool` for workers of one group, `nodes` for nodes in several groups). This file holds the
//! list, the macros, the bounds and the application handler they share.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use lease_core::{Assignment, Bucket, Clock, ErrorKind, FencingToken, RevokeReason};
use lease_worker::{OwnershipHandler, WorkerError};

use crate::RecordingHandler;

mod balance;
mod controls;
mod crashes;
mod errors;
mod fencing;
mod groups;
mod loads;
mod nodes;
mod pool;
mod resizes;
mod stops;
pub use balance::*;
pub use controls::*;
pub use crashes::*;
pub use errors::*;
pub use fencing::*;
pub use groups::*;
pub use loads::*;
pub use resizes::*;
pub use stops::*;

use nodes::Nodes;
use pool::Pool;

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
    "reported_loads_share_the_work_not_the_bucket_count",
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
            reported_loads_share_the_work_not_the_bucket_count,
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

/// A span between two events' timestamps in whole milliseconds, as the cases print and bound it.
fn ms(d: chrono::TimeDelta) -> i64 {
    d.num_milliseconds()
}
