//! The conformance suite: one async function per behaviour of the [`LeaseStore`] contract.
//!
//! Each case takes a fresh, empty store whose clock is the given [`ManualClock`], and panics
//! on a violation. Backends run all of them, each as its own test, with
//! [`conformance_suite!`](crate::conformance_suite):
//!
//! ```ignore
//! lease_testing::conformance_suite!(|clock: lease_core::ManualClock| async move {
//!     lease_memory::MemoryLeaseStore::with_clock(clock)
//! });
//! ```
//!
//! The macro also generates `conformance_suite_runs_every_case`, which fails if the macro's
//! list and [`CASES`] ever differ, so no backend can miss a case.
//!
//! The cases live in one file per rule family (`groups`, `sessions`, `claims`, `releases`,
//! `fencing`, `views`, `resizes`, `controls`, `history`, `members`, `loads`, and `walks` for
//! the ways a claim finds its buckets); this file holds the lists, the macros and the helpers they share.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseStore;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, NodeId, SessionId, ShardCount,
    Takeover,
};
use lease_core::{BucketState, GroupStamp, GroupView, Heartbeat, Lease};
use lease_core::{Change, ChangeFeed};
use lease_core::{Clock, ManualClock, Ttl};
use lease_core::{ErrorKind, StoreError};
use lease_core::{Generation, ResizeOutcome};
use lease_core::{MemberControl, QuarantineFor, Weight};

mod claims;
mod controls;
mod fencing;
mod groups;
mod history;
mod loads;
mod members;
mod releases;
mod resizes;
mod sessions;
mod views;
mod walks;
pub use claims::*;
pub use controls::*;
pub use fencing::*;
pub use groups::*;
pub use history::*;
pub use loads::*;
pub use members::*;
pub use releases::*;
pub use resizes::*;
pub use sessions::*;
pub use views::*;
pub use walks::*;

/// The name of every case, in the order the macro runs them.
pub const CASES: &[&str] = &[
    "ensure_creates_unowned_buckets",
    "ensure_is_idempotent",
    "ensure_mismatch_writes_nothing",
    "unknown_group_fails_every_operation",
    "groups_are_independent",
    "names_are_plain_data",
    "first_heartbeat_starts_a_session",
    "heartbeat_extends_a_live_session",
    "expired_session_is_never_renewed",
    "old_session_buckets_are_claimable_by_anyone",
    "a_worker_reclaims_its_old_buckets_with_new_tokens",
    "heartbeats_remove_dead_members",
    "a_node_id_in_use_is_refused",
    "operations_act_only_under_the_named_session",
    "heartbeat_lists_idle_members_with_zero",
    "heartbeat_omits_expired_members",
    "heartbeat_counts_claimable_buckets",
    "heartbeat_returns_exactly_own_leases",
    "lost_bucket_disappears_from_heartbeat",
    "heartbeat_changes_no_bucket",
    "claim_needs_a_live_session",
    "claim_respects_want",
    "claim_takes_lowest_claimable_first",
    "claims_follow_the_worker_s_order",
    "claim_never_takes_a_live_lease",
    "claim_takes_expired_leases",
    "a_deferred_claim_takes_only_unowned_buckets",
    "a_takeover_within_a_bound_checks_the_store_clock",
    "claim_excludes_another_worker",
    "concurrent_claims_never_overlap",
    "claim_increments_tokens",
    "claim_does_not_extend_the_session",
    "renewal_keeps_tokens",
    "release_only_touches_own_buckets",
    "release_keeps_tokens",
    "release_out_of_range_writes_nothing",
    "release_without_live_session_releases_nothing",
    "leave_releases_everything_and_removes_membership",
    "leave_is_idempotent",
    "leaving_the_last_group_ends_the_session",
    "tokens_strictly_increase_across_owners",
    "is_current_accepts_the_current_owner",
    "is_current_rejects_stale_tokens_and_other_owners",
    "is_current_rejects_dead_sessions_and_released_buckets",
    "snapshot_reports_states_and_expiries",
    "snapshot_lists_every_member",
    "changes_report_joins_releases_and_leaves",
    "a_node_renews_every_group_in_one_heartbeat",
    "a_new_session_is_a_member_of_no_group",
    "join_needs_a_live_session",
    "join_is_idempotent_and_touches_no_other_group",
    "claims_and_releases_need_membership",
    "leaving_one_group_keeps_the_session_and_the_others",
    "unchanged_is_answered_only_when_nothing_changed",
    "nodes_lists_every_node_with_its_groups",
    "a_new_session_removes_dead_nodes_in_no_group",
    "controls_show_in_views_and_snapshots",
    "controls_outlive_sessions",
    "cordoned_and_draining_members_claim_nothing",
    "quarantined_buckets_are_not_claimable",
    "the_owner_keeps_a_quarantined_bucket_until_it_releases",
    "quarantine_is_checked_and_lifted_by_resizes",
    "a_quarantine_keeps_its_reason_while_it_runs",
    "claims_take_the_buckets_last_held_first",
    "a_handed_over_session_is_taken_over_with_its_buckets",
    "a_handed_over_session_without_successor_expires",
    "controls_wake_the_group",
    "history_records_each_tenure_and_how_it_ended",
    "history_keeps_the_last_tenures",
    "history_is_checked_and_cleared_by_resizes",
    "every_kind_of_claimable_bucket_under_quarantine_is_skipped",
    "every_kind_of_new_bucket_waits_for_the_old_ones",
    "is_current_fails_on_an_old_bucket_once_its_owner_expired",
    "the_walks_over_dead_sessions_take_only_their_buckets",
    "a_view_that_counted_a_quarantine_is_given_again_once_it_ends",
    "a_node_sets_its_own_weight_only_under_its_live_session",
    "an_eviction_releases_the_node_s_buckets_whatever_its_session",
    "named_claims_take_only_the_named_claimable_buckets",
    "published_loads_are_recorded_on_owned_buckets_and_shown",
    "a_bucket_keeps_its_load_until_its_next_owner_records_one",
];

/// The name of every case of the resize contract (Z1-Z5 and what they change in the other
/// rules), in the order [`resize_suite!`](crate::resize_suite) runs them.
pub const RESIZE_CASES: &[&str] = &[
    "resize_splits_with_one_parent_per_bucket",
    "resize_merges_with_two_parents_per_bucket",
    "resize_to_a_non_divisor_count",
    "resize_during_a_resize_is_refused",
    "resize_of_an_unknown_group_fails",
    "resize_to_the_same_count_changes_nothing",
    "owners_dead_during_the_drain_retire_their_buckets",
    "ensure_group_accepts_the_count_resized_from",
    "resize_sends_a_change",
];

/// Run every case of the resize contract ([`RESIZE_CASES`]) against a store built by `$make`,
/// as [`conformance_suite!`](crate::conformance_suite) does; it also generates
/// `resize_suite_runs_every_case`.
#[macro_export]
macro_rules! resize_suite {
    ($make:expr) => {
        $crate::__resize_tests!($make;
            resize_splits_with_one_parent_per_bucket,
            resize_merges_with_two_parents_per_bucket,
            resize_to_a_non_divisor_count,
            resize_during_a_resize_is_refused,
            resize_of_an_unknown_group_fails,
            resize_to_the_same_count_changes_nothing,
            owners_dead_during_the_drain_retire_their_buckets,
            ensure_group_accepts_the_count_resized_from,
            resize_sends_a_change,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __resize_tests {
    ($make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let clock = $crate::__private::ManualClock::new();
                let store = ($make)(clock.clone()).await;
                $crate::conformance::$case(store, clock).await;
            }
        )+

        #[test]
        fn resize_suite_runs_every_case() {
            let generated: &[&str] = &[$(stringify!($case)),+];
            assert_eq!(generated, $crate::conformance::RESIZE_CASES);
        }
    };
}

/// Run every case against a store built by `$make`, an expression callable as
/// `$make(clock: ManualClock) -> impl Future<Output = impl LeaseStore + 'static>`. Each case
/// becomes its own `#[tokio::test]` (multi-thread runtime; the calling crate needs `tokio`
/// with the `macros` and `rt-multi-thread` features).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::__conformance_tests!($make;
            ensure_creates_unowned_buckets,
            ensure_is_idempotent,
            ensure_mismatch_writes_nothing,
            unknown_group_fails_every_operation,
            groups_are_independent,
            names_are_plain_data,
            first_heartbeat_starts_a_session,
            heartbeat_extends_a_live_session,
            expired_session_is_never_renewed,
            old_session_buckets_are_claimable_by_anyone,
            a_worker_reclaims_its_old_buckets_with_new_tokens,
            heartbeats_remove_dead_members,
            a_node_id_in_use_is_refused,
            operations_act_only_under_the_named_session,
            heartbeat_lists_idle_members_with_zero,
            heartbeat_omits_expired_members,
            heartbeat_counts_claimable_buckets,
            heartbeat_returns_exactly_own_leases,
            lost_bucket_disappears_from_heartbeat,
            heartbeat_changes_no_bucket,
            claim_needs_a_live_session,
            claim_respects_want,
            claim_takes_lowest_claimable_first,
            claims_follow_the_worker_s_order,
            claim_never_takes_a_live_lease,
            claim_takes_expired_leases,
            a_deferred_claim_takes_only_unowned_buckets,
            a_takeover_within_a_bound_checks_the_store_clock,
            claim_excludes_another_worker,
            concurrent_claims_never_overlap,
            claim_increments_tokens,
            claim_does_not_extend_the_session,
            renewal_keeps_tokens,
            release_only_touches_own_buckets,
            release_keeps_tokens,
            release_out_of_range_writes_nothing,
            release_without_live_session_releases_nothing,
            leave_releases_everything_and_removes_membership,
            leave_is_idempotent,
            leaving_the_last_group_ends_the_session,
            tokens_strictly_increase_across_owners,
            is_current_accepts_the_current_owner,
            is_current_rejects_stale_tokens_and_other_owners,
            is_current_rejects_dead_sessions_and_released_buckets,
            snapshot_reports_states_and_expiries,
            snapshot_lists_every_member,
            changes_report_joins_releases_and_leaves,
            a_node_renews_every_group_in_one_heartbeat,
            a_new_session_is_a_member_of_no_group,
            join_needs_a_live_session,
            join_is_idempotent_and_touches_no_other_group,
            claims_and_releases_need_membership,
            leaving_one_group_keeps_the_session_and_the_others,
            unchanged_is_answered_only_when_nothing_changed,
            nodes_lists_every_node_with_its_groups,
            a_new_session_removes_dead_nodes_in_no_group,
            controls_show_in_views_and_snapshots,
            controls_outlive_sessions,
            cordoned_and_draining_members_claim_nothing,
            quarantined_buckets_are_not_claimable,
            the_owner_keeps_a_quarantined_bucket_until_it_releases,
            quarantine_is_checked_and_lifted_by_resizes,
            a_quarantine_keeps_its_reason_while_it_runs,
            claims_take_the_buckets_last_held_first,
            a_handed_over_session_is_taken_over_with_its_buckets,
            a_handed_over_session_without_successor_expires,
            controls_wake_the_group,
            history_records_each_tenure_and_how_it_ended,
            history_keeps_the_last_tenures,
            history_is_checked_and_cleared_by_resizes,
            every_kind_of_claimable_bucket_under_quarantine_is_skipped,
            every_kind_of_new_bucket_waits_for_the_old_ones,
            is_current_fails_on_an_old_bucket_once_its_owner_expired,
            the_walks_over_dead_sessions_take_only_their_buckets,
            a_view_that_counted_a_quarantine_is_given_again_once_it_ends,
            a_node_sets_its_own_weight_only_under_its_live_session,
            an_eviction_releases_the_node_s_buckets_whatever_its_session,
            named_claims_take_only_the_named_claimable_buckets,
            published_loads_are_recorded_on_owned_buckets_and_shown,
            a_bucket_keeps_its_load_until_its_next_owner_records_one,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let clock = $crate::__private::ManualClock::new();
                let store = ($make)(clock.clone()).await;
                $crate::conformance::$case(store, clock).await;
            }
        )+

        #[test]
        fn conformance_suite_runs_every_case() {
            let generated: &[&str] = &[$(stringify!($case)),+];
            assert_eq!(generated, $crate::conformance::CASES);
        }
    };
}

/// Run the named cases of the suite (some of [`CASES`]) against a store built by `$make`, as
/// [`conformance_suite!`](crate::conformance_suite) does, for a store that can run only some
/// of them: etcd's production mode, whose sessions end by etcd's clock, not the suite's. It
/// does not check that every case runs; it generates `CONFORMANCE_CASES_RUN`, the names it
/// ran, so the caller can account for every other case of [`CASES`] (and fail on a new one).
#[macro_export]
macro_rules! conformance_cases {
    ($make:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let clock = $crate::__private::ManualClock::new();
                let store = ($make)(clock.clone()).await;
                $crate::conformance::$case(store, clock).await;
            }
        )+

        /// The cases this module runs, in order.
        const CONFORMANCE_CASES_RUN: &[&str] = &[$(stringify!($case)),+];
    };
}

// ---- helpers -------------------------------------------------------------------------------

const TTL_SECS: u64 = 10;

fn ttl() -> Ttl {
    Ttl::from_secs(TTL_SECS).expect("10 s is a valid ttl")
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn group(name: &str) -> GroupName {
    GroupName::new(name).expect("test group names are valid")
}

fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("test shard counts are valid")
}

/// `k` fresh workers, sorted by id, so member lists have a known order.
/// Their claim seeds are 0, so their claims start at bucket 0 and take the lowest claimable
/// buckets first (C3), which keeps expectations readable; `claims_follow_the_worker_s_order`
/// checks other starting points.
fn workers(k: usize) -> Vec<NodeId> {
    let mut ws: Vec<NodeId> = (0..k)
        .map(|_| {
            NodeId::from_uuid(uuid::Uuid::from_u128(
                NodeId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
            ))
        })
        .collect();
    ws.sort();
    ws
}

fn nums(leases: &[Lease]) -> Vec<u32> {
    leases.iter().map(|l| l.bucket.0).collect()
}

fn bucket_nums(buckets: &[Bucket]) -> Vec<u32> {
    buckets.iter().map(|b| b.0).collect()
}

fn bs(ns: &[u32]) -> Vec<Bucket> {
    ns.iter().copied().map(Bucket).collect()
}

async fn setup<S: LeaseStore>(store: &S, name: &str, n: u32) -> GroupName {
    let g = group(name);
    store
        .ensure_group(&g, shards(n))
        .await
        .expect("ensure_group on a new group succeeds");
    g
}

/// The incarnation a test worker heartbeats as, unless a case says otherwise: one per worker,
/// derived from its id, as if each worker were one process.
fn inc(w: NodeId) -> Incarnation {
    Incarnation::from_uuid(w.as_uuid())
}

/// What a node's heartbeat says of one group, as the per-group cases read it.
#[derive(Clone, Debug)]
struct Beat {
    session: SessionId,
    /// Whether the heartbeat (the first, when it had to join) started the session.
    new_session: bool,
    observed_at: lease_core::Timestamp,
    expires_at: lease_core::Timestamp,
    view: GroupView,
    owned: Vec<Lease>,
}

/// Heartbeat as node `w` (as `incarnation`, with `ttl` and `metadata`), joining `g` first if
/// the node is not a member (a new session, say), and return what the heartbeat says of `g`.
async fn beat_as<S: LeaseStore + ?Sized>(
    store: &S,
    g: &GroupName,
    w: NodeId,
    incarnation: Incarnation,
    ttl: Ttl,
    metadata: &MemberMetadata,
) -> Result<Beat, StoreError> {
    let first = store.heartbeat(w, incarnation, ttl, metadata, &[]).await?;
    let hb: Heartbeat = if first.group(g).is_some() {
        first.clone()
    } else {
        store.join(g, w, first.session).await?;
        store.heartbeat(w, incarnation, ttl, metadata, &[]).await?
    };
    let mine = hb
        .group(g)
        .unwrap_or_else(|| panic!("a heartbeat after joining {g:?} gave no view of it"))
        .clone();
    Ok(Beat {
        session: hb.session,
        new_session: first.new_session || hb.new_session,
        observed_at: hb.observed_at,
        expires_at: hb.expires_at,
        view: mine.view,
        owned: mine.owned,
    })
}

impl Beat {
    fn owned_buckets(&self) -> Vec<Bucket> {
        self.owned
            .iter()
            .filter(|l| l.shards == self.view.shard_count)
            .map(|l| l.bucket)
            .collect()
    }

    fn draining_buckets(&self) -> Vec<Bucket> {
        self.owned
            .iter()
            .filter(|l| l.shards != self.view.shard_count)
            .map(|l| l.bucket)
            .collect()
    }
}

async fn beat<S: LeaseStore>(store: &S, g: &GroupName, w: NodeId) -> Beat {
    beat_as(store, g, w, inc(w), ttl(), &MemberMetadata::empty())
        .await
        .expect("heartbeat succeeds")
}

/// The session `w`'s member row holds (live or not), as a worker that remembers its last
/// heartbeat knows it; a never-used id when it has no member row (or there is no such group).
async fn session<S: LeaseStore + ?Sized>(store: &S, g: &GroupName, w: NodeId) -> SessionId {
    store
        .snapshot(g)
        .await
        .ok()
        .and_then(|snap| snap.members.into_iter().find(|m| m.worker == w))
        .map_or_else(SessionId::new, |m| m.session)
}

async fn claim<S: LeaseStore>(store: &S, g: &GroupName, w: NodeId, want: u32) -> Vec<Lease> {
    let s = session(store, g, w).await;
    store
        .claim(g, w, s, want, Takeover::Allowed)
        .await
        .expect("claim succeeds")
}

/// Every bucket's token, in order.
async fn tokens<S: LeaseStore>(store: &S, g: &GroupName) -> Vec<i64> {
    let snap = store.snapshot(g).await.expect("snapshot succeeds");
    snap.buckets.iter().map(|b| b.token.0).collect()
}

/// Owner of every bucket that is live right now.
async fn live_owners<S: LeaseStore>(store: &S, g: &GroupName) -> BTreeMap<u32, NodeId> {
    let snap = store.snapshot(g).await.expect("snapshot succeeds");
    snap.live_leases()
        .into_iter()
        .map(|l| (l.bucket.0, l.owner))
        .collect()
}

fn assert_kind<T: std::fmt::Debug>(result: Result<T, StoreError>, kind: ErrorKind, what: &str) {
    match result {
        Err(e) => assert_eq!(e.kind(), kind, "{what}: wrong error {e:?}"),
        Ok(v) => panic!("{what}: expected {kind:?}, got Ok({v:?})"),
    }
}

// ---- ensure_group --------------------------------------------------------------------------

async fn resize<S: LeaseStore>(store: &S, g: &GroupName, from: u32, to: u32) -> ResizeOutcome {
    store
        .resize(g, shards(from), shards(to))
        .await
        .expect("resize succeeds")
}

async fn release<S: LeaseStore>(store: &S, g: &GroupName, w: NodeId, ns: &[u32]) -> Vec<u32> {
    let s = session(store, g, w).await;
    let released = store.release(g, w, s, &bs(ns)).await.expect("release");
    bucket_nums(&released)
}

/// The group's change feed, which this suite expects every store to have.
async fn feed<S: LeaseStore + ?Sized>(store: &S, g: &GroupName) -> ChangeFeed {
    store
        .changes(g)
        .await
        .expect("changes")
        .expect("this suite expects a store with a change feed")
}

async fn next_change(feed: &mut ChangeFeed, what: &str) -> Change {
    // A real-time bound on a notification that should arrive at once; it fails loudly
    // rather than hanging the suite.
    match tokio::time::timeout(Duration::from_secs(10), feed.recv()).await {
        Ok(Some(change)) => change,
        Ok(None) => panic!("{what}: the change feed closed"),
        Err(_) => panic!("{what}: no change arrived within 10 s"),
    }
}

/// One heartbeat of `w` (its own incarnation, the suite's ttl, no metadata) handing in `seen`.
async fn node_beat<S: LeaseStore>(store: &S, w: NodeId, seen: &[GroupStamp]) -> Heartbeat {
    store
        .heartbeat(w, inc(w), ttl(), &MemberMetadata::empty(), seen)
        .await
        .expect("heartbeat succeeds")
}

/// Every group of a heartbeat, given or unchanged, by name.
fn names(hb: &Heartbeat) -> (Vec<String>, Vec<String>) {
    (
        hb.groups.iter().map(|g| g.group.to_string()).collect(),
        hb.unchanged.iter().map(|u| u.group.to_string()).collect(),
    )
}
