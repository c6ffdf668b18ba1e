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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use lease_core::LeaseStore;
use lease_core::{
    Bucket, FencingToken, GroupName, Incarnation, MemberMetadata, SessionId, ShardCount, Takeover,
    WorkerId,
};
use lease_core::{BucketState, GroupStamp, GroupView, Heartbeat, Lease};
use lease_core::{Change, ChangeFeed};
use lease_core::{Clock, ManualClock, Ttl};
use lease_core::{ErrorKind, StoreError};
use lease_core::{Generation, ResizeOutcome};
use lease_core::{MemberControl, QuarantineFor, Weight};

mod controls;
mod history;
mod members;
mod walks;
pub use controls::*;
pub use history::*;
pub use members::*;
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
    "a_worker_id_in_use_is_refused",
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
    "a_node_sets_its_own_weight_only_under_its_live_session",
    "an_eviction_releases_the_node_s_buckets_whatever_its_session",
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
            a_worker_id_in_use_is_refused,
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
            a_node_sets_its_own_weight_only_under_its_live_session,
            an_eviction_releases_the_node_s_buckets_whatever_its_session,
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
fn workers(k: usize) -> Vec<WorkerId> {
    let mut ws: Vec<WorkerId> = (0..k)
        .map(|_| {
            WorkerId::from_uuid(uuid::Uuid::from_u128(
                WorkerId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
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
fn inc(w: WorkerId) -> Incarnation {
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
    w: WorkerId,
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

async fn beat<S: LeaseStore>(store: &S, g: &GroupName, w: WorkerId) -> Beat {
    beat_as(store, g, w, inc(w), ttl(), &MemberMetadata::empty())
        .await
        .expect("heartbeat succeeds")
}

/// The session `w`'s member row holds (live or not), as a worker that remembers its last
/// heartbeat knows it; a never-used id when it has no member row (or there is no such group).
async fn session<S: LeaseStore + ?Sized>(store: &S, g: &GroupName, w: WorkerId) -> SessionId {
    store
        .snapshot(g)
        .await
        .ok()
        .and_then(|snap| snap.members.into_iter().find(|m| m.worker == w))
        .map_or_else(SessionId::new, |m| m.session)
}

async fn claim<S: LeaseStore>(store: &S, g: &GroupName, w: WorkerId, want: u32) -> Vec<Lease> {
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
async fn live_owners<S: LeaseStore>(store: &S, g: &GroupName) -> BTreeMap<u32, WorkerId> {
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

/// E1: a new group has every bucket, unowned, token 0, and no members.
pub async fn ensure_creates_unowned_buckets<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 5).await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.group, g);
    assert_eq!(snap.shard_count, shards(5));
    assert_eq!(
        snap.buckets.iter().map(|b| b.bucket.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    for b in &snap.buckets {
        assert_eq!(b.owner, None);
        assert_eq!(b.session, None);
        assert_eq!(b.token, FencingToken(0));
        assert_eq!(b.expires_at, None);
        assert_eq!(b.state, BucketState::Unowned);
    }
    assert!(snap.members.is_empty());
}

/// E2: ensuring again with the same count changes nothing.
pub async fn ensure_is_idempotent<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    store
        .ensure_group(&g, shards(4))
        .await
        .expect("second ensure with the same count succeeds");
    let after = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(before, after, "a repeated ensure_group changed the group");
    assert_eq!(nums(&won), vec![0, 1]);
}

/// E3: another count fails with the stored count and writes nothing.
pub async fn ensure_mismatch_writes_nothing<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    for other in [3, 5, 64] {
        match store.ensure_group(&g, shards(other)).await {
            Err(StoreError::ShardCountMismatch {
                group: eg,
                configured,
                found,
            }) => {
                assert_eq!(eg, g);
                assert_eq!(configured, shards(other));
                assert_eq!(found, shards(4));
            }
            other => panic!("expected ShardCountMismatch, got {other:?}"),
        }
    }
    let after = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(before, after, "a mismatched ensure_group wrote something");
    assert_eq!(after.buckets.len(), 4);
}

/// G5: every operation on an unknown group fails with GroupNotFound; the fencing check says
/// false.
pub async fn unknown_group_fails_every_operation<S: LeaseStore>(store: S, _clock: ManualClock) {
    setup(&store, "known", 2).await;
    let g = group("unknown");
    let [a] = workers(1)[..] else { unreachable!() };
    let nf = ErrorKind::GroupNotFound;
    let hb = store
        .heartbeat(a, inc(a), ttl(), &MemberMetadata::empty(), &[])
        .await
        .expect("a node heartbeat names no group");
    assert_kind(store.join(&g, a, hb.session).await, nf, "join");
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        nf,
        "claim",
    );
    assert_kind(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0]))
            .await,
        nf,
        "release",
    );
    assert_kind(store.evict(&g, a).await, nf, "leave");
    assert_kind(store.snapshot(&g).await, nf, "snapshot");
    match store.snapshot(&g).await {
        Err(StoreError::GroupNotFound { group: eg }) => assert_eq!(eg, g),
        other => panic!("expected GroupNotFound naming the group, got {other:?}"),
    }
    assert!(
        !store
            .is_current(&g, Bucket(0), a, FencingToken(1))
            .await
            .expect("is_current on an unknown group answers")
    );
    assert!(
        store.changes(&g).await.is_ok(),
        "subscribing to a group not created yet is allowed"
    );
}

/// G7: groups are independent: same worker, same bucket numbers, separate state.
pub async fn groups_are_independent<S: LeaseStore>(store: S, clock: ManualClock) {
    let g1 = setup(&store, "one", 3).await;
    let g2 = setup(&store, "two", 5).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g1, a).await;
    assert_eq!(nums(&claim(&store, &g1, a, 3).await), vec![0, 1, 2]);
    // a has no session in g2 yet.
    assert_kind(
        store
            .claim(&g2, a, session(&store, &g2, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim in a group not joined",
    );
    beat(&store, &g2, b).await;
    assert_eq!(nums(&claim(&store, &g2, b, 5).await), vec![0, 1, 2, 3, 4]);
    let hb = beat(&store, &g2, a).await;
    assert_eq!(hb.view.shard_count, shards(5));
    assert_eq!(hb.view.claimable, 0);
    assert!(hb.owned.is_empty());
    // a leaves g1 without touching g2.
    clock.advance(secs(1));
    let left = store
        .leave(&g1, a, session(&store, &g2, a).await)
        .await
        .expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1, 2]);
    let hb1 = beat(&store, &g1, b).await;
    assert_eq!(hb1.view.claimable, 3, "a's g1 buckets are free");
    assert_eq!(live_owners(&store, &g2).await.len(), 5, "g2 is untouched");
    assert_eq!(tokens(&store, &g1).await, vec![1, 1, 1]);
    assert_eq!(tokens(&store, &g2).await, vec![1, 1, 1, 1, 1]);
    // Leaving g2 does not release g1.
    store.evict(&g2, b).await.expect("leave");
    assert_eq!(nums(&claim(&store, &g1, b, 3).await), vec![0, 1, 2]);
    assert_eq!(live_owners(&store, &g1).await.len(), 3);
}

/// G6: names with quotes, unicode and SQL are plain data.
pub async fn names_are_plain_data<S: LeaseStore>(store: S, _clock: ManualClock) {
    let names = [
        "it's",
        "\"quoted\"",
        "'; DROP TABLE lease.shards; --",
        "x' OR '1'='1",
        "Überweisung-処理-🦀",
        "back\\slash $1 %s",
        " leading and trailing ",
    ];
    let [a] = workers(1)[..] else { unreachable!() };
    let metadata = MemberMetadata::new("host='db'; pid=\"7\" -- ☃").expect("valid metadata");
    for (i, name) in names.iter().enumerate() {
        let g = setup(&store, name, i as u32 + 1).await;
        let hb = beat_as(&store, &g, a, inc(a), ttl(), &metadata)
            .await
            .expect("heartbeat");
        assert_eq!(hb.view.shard_count, shards(i as u32 + 1));
        claim(&store, &g, a, 1).await;
    }
    for (i, name) in names.iter().enumerate() {
        let snap = store.snapshot(&group(name)).await.expect("snapshot");
        assert_eq!(snap.group.as_str(), *name);
        assert_eq!(snap.buckets.len(), i + 1);
        assert_eq!(snap.members.len(), 1);
        assert_eq!(snap.members[0].metadata, metadata);
        assert_eq!(snap.live_leases().len(), 1);
    }
    // A name that is a prefix or a LIKE pattern of another is a different group.
    assert_kind(
        store.snapshot(&group("it%")).await,
        ErrorKind::GroupNotFound,
        "a LIKE pattern is not a name",
    );
}

// ---- heartbeat -----------------------------------------------------------------------------

/// H2, H4: the first heartbeat starts a session that expires after the ttl.
pub async fn first_heartbeat_starts_a_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert_eq!(hb.observed_at, clock.now());
    assert_eq!(hb.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(hb.view.shard_count, shards(3));
    assert_eq!(hb.view.members.len(), 1);
    assert_eq!(hb.view.members[0].worker, a);
    assert_eq!(hb.view.members[0].owned, 0);
    assert_eq!(hb.view.claimable, 3);
    assert!(hb.owned.is_empty());
}

/// H1: a heartbeat before expiry extends the same session.
pub async fn heartbeat_extends_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    let second = beat(&store, &g, a).await;
    assert!(!second.new_session);
    assert_eq!(second.session, first.session);
    assert_eq!(second.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(nums(&second.owned), vec![0, 1]);
    assert!(
        second
            .owned
            .iter()
            .all(|l| l.expires_at == second.expires_at)
    );
    // A shorter ttl shortens the session.
    let short = Ttl::from_secs(1).expect("valid ttl");
    let third = beat_as(&store, &g, a, inc(a), short, &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    assert_eq!(third.session, first.session);
    assert_eq!(third.expires_at, clock.now() + short.as_chrono());
}

/// H2, G1, G2: at the instant of expiry the session is dead; the next heartbeat starts a new
/// session and reports nothing owned.
pub async fn expired_session_is_never_renewed<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    let second = beat(&store, &g, a).await;
    assert!(
        second.new_session,
        "a heartbeat at expiry renewed a dead session"
    );
    assert_ne!(second.session, first.session);
    assert!(second.owned.is_empty());
    assert_eq!(second.view.members[0].owned, 0);
    assert_eq!(second.view.claimable, 3);
    // The session started now: renewing it right away keeps it.
    let third = beat(&store, &g, a).await;
    assert!(!third.new_session);
    assert_eq!(third.session, second.session);
}

/// H2: the dead session's buckets are claimable by another worker, with new tokens.
pub async fn old_session_buckets_are_claimable_by_anyone<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 4).await;
    clock.advance(secs(TTL_SECS));
    beat(&store, &g, a).await; // a is back, under a new session
    beat(&store, &g, b).await;
    let taken = claim(&store, &g, b, 4).await;
    assert_eq!(nums(&taken), vec![0, 1, 2, 3]);
    for (new, old) in taken.iter().zip(&old) {
        assert_eq!(new.token.0, old.token.0 + 1);
        assert_eq!(new.owner, b);
    }
    assert!(beat(&store, &g, a).await.owned.is_empty());
}

/// H2, G4: a worker whose session expired may claim its old buckets back, with new tokens.
pub async fn a_worker_reclaims_its_old_buckets_with_new_tokens<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 2).await;
    clock.advance(secs(TTL_SECS + 5));
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert_eq!(hb.view.claimable, 2);
    let again = claim(&store, &g, a, 2).await;
    assert_eq!(nums(&again), vec![0, 1]);
    assert!(
        again
            .iter()
            .zip(&old)
            .all(|(n, o)| n.token.0 == o.token.0 + 1)
    );
    assert!(
        !store
            .is_current(&g, old[0].bucket, a, old[0].token)
            .await
            .expect("is_current"),
        "the old session's token still passes the fencing check"
    );
    let hb = beat(&store, &g, a).await;
    assert_eq!(
        hb.owned,
        again
            .iter()
            .map(|l| Lease {
                expires_at: hb.expires_at,
                ..*l
            })
            .collect::<Vec<_>>()
    );
}

/// H3: any heartbeat, a renewal included, removes the dead member rows of the group; their
/// buckets stay claimable.
pub async fn heartbeats_remove_dead_members<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    beat(&store, &g, b).await;
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, b).await; // b stays live, a does not
    clock.advance(secs(TTL_SECS / 2));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.members.len(), 2, "a snapshot removes nothing");
    assert!(
        !snap
            .members
            .iter()
            .find(|m| m.worker == a)
            .expect("a's row")
            .live
    );
    // A renewal in a stable pool removes the dead row: dead members do not linger.
    let renewal = beat(&store, &g, b).await;
    assert!(!renewal.new_session);
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b],
        "a dead member's row outlived a renewal of the group"
    );
    assert_eq!(snap.buckets[0].owner, Some(a));
    assert_eq!(snap.buckets[0].state, BucketState::Expired);
    assert_eq!(
        snap.buckets[0].expires_at, None,
        "the owner's session is gone"
    );
    assert_eq!(renewal.view.claimable, 4);
    let hb = beat(&store, &g, c).await;
    assert!(hb.new_session);
    assert_eq!(hb.view.claimable, 4);
    assert_eq!(nums(&claim(&store, &g, c, 4).await), vec![0, 1, 2, 3]);
}

/// H7: a second incarnation of a worker id is refused while the first one's session lives,
/// without writing anything; once that session ends it starts a session of its own, and the
/// first incarnation is refused in turn and can no longer act under its old session.
pub async fn a_worker_id_in_use_is_refused<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let (first, second) = (Incarnation::new(), Incarnation::new());
    let meta = MemberMetadata::new("first").expect("metadata");
    let hb = beat_as(&store, &g, a, first, ttl(), &meta)
        .await
        .expect("first heartbeat");
    let won = store
        .claim(&g, a, hb.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 2);
    clock.advance(secs(1));
    let before = store.snapshot(&g).await.expect("snapshot");
    let refused = store
        .heartbeat(
            a,
            second,
            ttl(),
            &MemberMetadata::new("second").expect("metadata"),
            &[],
        )
        .await;
    match refused {
        Err(StoreError::WorkerIdInUse { worker, expires_at }) => {
            assert_eq!(worker, a);
            assert_eq!(expires_at, hb.expires_at, "the live session's expiry");
        }
        other => panic!("a second incarnation was not refused: {other:?}"),
    }
    let mut after = store.snapshot(&g).await.expect("snapshot");
    after.observed_at = before.observed_at;
    assert_eq!(after, before, "a refused heartbeat wrote something");
    // The first incarnation renews as before: same session, its buckets intact.
    let renewed = beat_as(&store, &g, a, first, ttl(), &meta)
        .await
        .expect("renewal");
    assert!(!renewed.new_session);
    assert_eq!(renewed.session, hb.session);
    assert_eq!(renewed.owned.len(), 2);
    // Once that session has expired, the second incarnation starts its own.
    clock.advance(secs(TTL_SECS));
    let taken = beat_as(&store, &g, a, second, ttl(), &meta)
        .await
        .expect("the second incarnation after expiry");
    assert!(taken.new_session);
    assert_ne!(taken.session, hb.session);
    assert!(
        taken.owned.is_empty(),
        "the old session's buckets came back"
    );
    assert_eq!(taken.view.claimable, 4);
    // The first incarnation is refused now, and its old session is void everywhere.
    assert_kind(
        store.heartbeat(a, first, ttl(), &meta, &[]).await,
        ErrorKind::WorkerIdInUse,
        "the first incarnation after the second took over",
    );
    assert_kind(
        store.claim(&g, a, hb.session, 4, Takeover::Allowed).await,
        ErrorKind::SessionExpired,
        "a claim under the replaced session",
    );
    assert!(
        store
            .release(&g, a, hb.session, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert!(
        store
            .leave(&g, a, hb.session)
            .await
            .expect("leave")
            .is_empty()
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.len(),
        1,
        "a leave under an old session removed the row"
    );
    assert_eq!(snap.members[0].session, taken.session);
    let mine = store
        .claim(&g, a, taken.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(mine.len(), 4);
}

/// C1, R2, L1, L2: claim, release and leave act only under the session they name.
pub async fn operations_act_only_under_the_named_session<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    let stranger = SessionId::new();
    assert_kind(
        store.claim(&g, a, stranger, 2, Takeover::Allowed).await,
        ErrorKind::SessionExpired,
        "a claim under a session the worker does not hold",
    );
    assert_eq!(hb.view.claimable, 4);
    let won = store
        .claim(&g, a, hb.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 1]);
    assert!(
        store
            .release(&g, a, stranger, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert!(
        store
            .leave(&g, a, stranger)
            .await
            .expect("leave")
            .is_empty()
    );
    assert_eq!(
        live_owners(&store, &g).await.len(),
        2,
        "something was released"
    );
    // A node leaving its last group under its own session frees the node id at once (L3).
    let left = store.leave(&g, a, hb.session).await.expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1]);
    let next = beat_as(
        &store,
        &g,
        a,
        Incarnation::new(),
        ttl(),
        &MemberMetadata::empty(),
    )
    .await
    .expect("a new incarnation after a graceful leave");
    assert!(next.new_session);
}

/// H4: idle members are listed with zero buckets, sorted by worker id.
pub async fn heartbeat_lists_idle_members_with_zero<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let ws = workers(3);
    for &w in &ws {
        beat(&store, &g, w).await;
    }
    claim(&store, &g, ws[1], 4).await;
    let hb = beat(&store, &g, ws[2]).await;
    let loads: Vec<(WorkerId, u32)> = hb
        .view
        .members
        .iter()
        .map(|m| (m.worker, m.owned))
        .collect();
    assert_eq!(loads, vec![(ws[0], 0), (ws[1], 4), (ws[2], 0)]);
    assert_eq!(hb.view.claimable, 2);
}

/// H4: members whose sessions expired are not in the view.
pub async fn heartbeat_omits_expired_members<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    beat(&store, &g, b).await;
    clock.advance(secs(TTL_SECS - 1));
    let hb = beat(&store, &g, b).await;
    assert_eq!(
        hb.view.members.len(),
        2,
        "a is still live one second before expiry"
    );
    assert_eq!(hb.view.claimable, 1);
    clock.advance(secs(1));
    let hb = beat(&store, &g, b).await;
    assert_eq!(
        hb.view.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b]
    );
    assert_eq!(
        hb.view.claimable, 4,
        "a dead session's buckets are claimable"
    );
}

/// H4: `claimable` counts unowned buckets and buckets of dead sessions, not live ones.
pub async fn heartbeat_counts_claimable_buckets<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 10).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    beat(&store, &g, b).await;
    claim(&store, &g, b, 4).await;
    assert_eq!(beat(&store, &g, c).await.view.claimable, 3);
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, b).await;
    beat(&store, &g, c).await;
    clock.advance(secs(TTL_SECS / 2));
    // a died; its 3 are claimable again alongside the 3 never owned.
    assert_eq!(beat(&store, &g, c).await.view.claimable, 6);
    store
        .release(&g, b, session(&store, &g, b).await, &bs(&[3]))
        .await
        .expect("release");
    assert_eq!(beat(&store, &g, c).await.view.claimable, 7);
}

/// H4: `owned` is exactly the worker's leases, with tokens, expiring with the session.
pub async fn heartbeat_returns_exactly_own_leases<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 3).await;
    claim(&store, &g, b, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[1]))
        .await
        .expect("release");
    let again = claim(&store, &g, a, 1).await;
    assert_eq!(nums(&again), vec![1]);
    let hb = beat(&store, &g, a).await;
    assert_eq!(nums(&hb.owned), vec![0, 1, 2]);
    assert_eq!(
        hb.owned.iter().map(|l| l.token.0).collect::<Vec<_>>(),
        vec![1, 2, 1]
    );
    assert!(
        hb.owned
            .iter()
            .all(|l| l.owner == a && l.expires_at == hb.expires_at)
    );
    let hb = beat(&store, &g, b).await;
    assert_eq!(nums(&hb.owned), vec![3, 4]);
}

/// H4: a bucket taken over by another worker is gone from the old owner's heartbeat.
pub async fn lost_bucket_disappears_from_heartbeat<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, b, 2).await), vec![0, 1]);
    let hb = beat(&store, &g, a).await;
    assert!(hb.new_session);
    assert!(
        hb.owned.is_empty(),
        "a still sees buckets it lost: {:?}",
        hb.owned
    );
    // The one nobody took is not a's either: its session died.
    assert_eq!(hb.view.claimable, 1);
}

/// H5: heartbeats never change a bucket or a token.
pub async fn heartbeat_changes_no_bucket<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot").buckets;
    for _ in 0..3 {
        clock.advance(secs(1));
        beat(&store, &g, a).await;
        beat(&store, &g, b).await;
    }
    clock.advance(secs(TTL_SECS * 2));
    beat(&store, &g, a).await; // a new session
    let after = store.snapshot(&g).await.expect("snapshot").buckets;
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(
            (x.bucket, x.owner, x.session, x.token),
            (y.bucket, y.owner, y.session, y.token)
        );
    }
}

// ---- claim ---------------------------------------------------------------------------------

/// C1: claiming needs a live session.
pub async fn claim_needs_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    match store
        .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
        .await
    {
        Err(StoreError::SessionExpired { group: eg, worker }) => {
            assert_eq!((eg, worker), (g.clone(), a));
        }
        other => panic!("claim without a session: expected SessionExpired, got {other:?}"),
    }
    beat(&store, &g, a).await;
    clock.advance(secs(TTL_SECS));
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim at the instant of expiry",
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|b| b.state == BucketState::Unowned && b.token.0 == 0)
    );
}

/// C3: at most `want` buckets are taken; zero takes none.
pub async fn claim_respects_want<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 10).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    assert!(claim(&store, &g, a, 0).await.is_empty());
    assert_eq!(claim(&store, &g, a, 3).await.len(), 3);
    assert_eq!(claim(&store, &g, a, 4).await.len(), 4);
    assert_eq!(claim(&store, &g, a, 100).await.len(), 3, "only 3 were left");
    assert!(claim(&store, &g, a, 5).await.is_empty());
    assert_eq!(beat(&store, &g, a).await.owned.len(), 10);
}

/// C3, C4: a worker whose claims start at bucket 0 takes the lowest claimable buckets first;
/// the result is sorted.
pub async fn claim_takes_lowest_claimable_first<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 5).await), vec![0, 1, 2, 3, 4]);
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[3, 1]))
        .await
        .expect("release");
    assert_eq!(nums(&claim(&store, &g, b, 3).await), vec![1, 3, 5]);
}

/// C3: a worker's claims start at its claim start (its id's low 32 bits modulo the shard
/// count) and wrap around to 0; the result is sorted by bucket.
pub async fn claims_follow_the_worker_s_order<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 8).await;
    let [a] = workers(1)[..] else { unreachable!() };
    // b starts at bucket 13 % 8 = 5.
    let b = WorkerId::from_uuid(uuid::Uuid::from_u128(
        WorkerId::new().as_uuid().as_u128() & !0xFFFF_FFFF | 13,
    ));
    assert_eq!(shards(8).claim_start(b), Bucket(5));
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![0]);
    assert_eq!(nums(&claim(&store, &g, b, 2).await), vec![5, 6]);
    // Past the top it wraps around to 0, skipping what is not claimable (a holds 0).
    assert_eq!(nums(&claim(&store, &g, b, 3).await), vec![1, 2, 7]);
    assert_eq!(nums(&claim(&store, &g, a, 8).await), vec![3, 4]);
}

/// C2, G1: a live lease is never taken, not even a microsecond before it expires.
pub async fn claim_never_takes_a_live_lease<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    beat(&store, &g, b).await;
    assert!(claim(&store, &g, b, 3).await.is_empty());
    // The owner cannot take its own live buckets twice either.
    assert!(claim(&store, &g, a, 3).await.is_empty());
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1]);
}

/// C2, G1: at the instant a session expires, its buckets are claimable.
pub async fn claim_takes_expired_leases<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(1));
    beat(&store, &g, b).await;
    // The instant a's session expires; b's, started a second later, is live.
    clock.advance(secs(TTL_SECS - 1));
    let taken = claim(&store, &g, b, 3).await;
    assert_eq!(nums(&taken), vec![0, 1, 2]);
    assert!(taken.iter().all(|l| l.token.0 == 2));
}

/// C7: a deferred claim leaves a dead session's buckets alone and takes unowned (released)
/// ones; an allowed claim then takes the dead session's.
pub async fn a_deferred_claim_takes_only_unowned_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let held = claim(&store, &g, a, 4).await;
    let a_session = session(&store, &g, a).await;
    let released = store
        .release(&g, a, a_session, &[Bucket(1)])
        .await
        .expect("release");
    assert_eq!(released, vec![Bucket(1)]);
    assert_eq!(held.len(), 4);
    clock.advance(secs(TTL_SECS));
    let hb = beat(&store, &g, b).await;
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Deferred)
        .await
        .expect("deferred claim");
    assert_eq!(nums(&won), vec![1], "only the released bucket");
    assert_eq!(won[0].token.0, 2);
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Deferred)
        .await
        .expect("deferred claim");
    assert!(won.is_empty(), "a dead session's buckets taken: {won:?}");
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 2, 3]);
    assert!(won.iter().all(|l| l.token.0 == 2), "{won:?}");
}

/// C7: `AllowedWithin(d)` takes a dead session's buckets only while the store's time is at
/// most `d` after the caller's last renewal; beyond, it takes only unowned buckets.
pub async fn a_takeover_within_a_bound_checks_the_store_clock<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 4).await;
    let a_session = session(&store, &g, a).await;
    store
        .release(&g, a, a_session, &[Bucket(1)])
        .await
        .expect("release");
    clock.advance(secs(TTL_SECS));
    let hb = beat(&store, &g, b).await;
    // Two seconds after b's renewal: more than a one-second bound allows.
    clock.advance(secs(2));
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::AllowedWithin(secs(1)))
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![1], "only the released bucket");
    let won = store
        .claim(&g, b, hb.session, 4, Takeover::AllowedWithin(secs(3)))
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 2, 3], "within the bound");
}

/// C2, G3: what one worker holds, another cannot claim.
pub async fn claim_excludes_another_worker<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let mine = claim(&store, &g, a, 4).await;
    let theirs = claim(&store, &g, b, 6).await;
    assert_eq!(nums(&mine), vec![0, 1, 2, 3]);
    assert_eq!(nums(&theirs), vec![4, 5]);
    assert!(claim(&store, &g, a, 6).await.is_empty());
    let owners = live_owners(&store, &g).await;
    assert_eq!(owners.values().filter(|&&w| w == a).count(), 4);
    assert_eq!(owners.values().filter(|&&w| w == b).count(), 2);
}

/// C5: many concurrent claims never win the same bucket twice.
pub async fn concurrent_claims_never_overlap<S: LeaseStore + 'static>(
    store: S,
    _clock: ManualClock,
) {
    let store = Arc::new(store);
    let g = setup(&*store, "orders", 64).await;
    let ws = workers(8);
    for &w in &ws {
        beat(&*store, &g, w).await;
    }
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for &w in &ws {
            let (store, g) = (store.clone(), g.clone());
            tasks.spawn(async move {
                (
                    w,
                    store
                        .claim(&g, w, session(&store, &g, w).await, 64, Takeover::Allowed)
                        .await,
                )
            });
        }
        let mut seen: BTreeMap<u32, WorkerId> = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            let (w, result) = joined.expect("claim task did not panic");
            for lease in result.expect("claim succeeds") {
                if let Some(other) = seen.insert(lease.bucket.0, w) {
                    panic!(
                        "round {round}: bucket {} won by {other} and {w}",
                        lease.bucket
                    );
                }
            }
        }
        assert_eq!(seen.len(), 64, "round {round}: every bucket was claimable");
        assert_eq!(live_owners(&*store, &g).await, seen);
        assert!(tokens(&*store, &g).await.iter().all(|&t| t == round + 1));
        for &w in &ws {
            let mine: Vec<Bucket> = seen
                .iter()
                .filter(|(_, o)| **o == w)
                .map(|(&b, _)| Bucket(b))
                .collect();
            let released = store
                .release(&g, w, session(&store, &g, w).await, &mine)
                .await
                .expect("release");
            assert_eq!(released, mine);
        }
    }
}

/// C4, G4: each claim raises the token by exactly one.
pub async fn claim_increments_tokens<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let expected_tokens = [1, 2, 3, 4, 5];
    for (i, &expected) in expected_tokens.iter().enumerate() {
        let w = if i % 2 == 0 { a } else { b };
        let won = claim(&store, &g, w, 1).await;
        assert_eq!(nums(&won), vec![0]);
        assert_eq!(won[0].token, FencingToken(expected));
        assert_eq!(won[0].owner, w);
        store
            .release(&g, w, session(&store, &g, w).await, &bs(&[0]))
            .await
            .expect("release");
    }
    assert_eq!(tokens(&store, &g).await, vec![5, 0]);
}

/// C6: a claim does not move the session's expiry.
pub async fn claim_does_not_extend_the_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &g, a).await;
    clock.advance(secs(TTL_SECS - 1));
    let won = claim(&store, &g, a, 2).await;
    assert!(won.iter().all(|l| l.expires_at == hb.expires_at));
    clock.advance(secs(1));
    assert!(
        beat(&store, &g, a).await.new_session,
        "the claim extended the session"
    );
}

/// G4: renewing never changes a token.
pub async fn renewal_keeps_tokens<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 3).await;
    for _ in 0..5 {
        clock.advance(secs(TTL_SECS / 2));
        let hb = beat(&store, &g, a).await;
        assert!(!hb.new_session);
        assert_eq!(
            hb.owned.iter().map(|l| l.token).collect::<Vec<_>>(),
            won.iter().map(|l| l.token).collect::<Vec<_>>()
        );
    }
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1]);
}

// ---- release -------------------------------------------------------------------------------

/// R2: release touches only the caller's own buckets and reports what it released.
pub async fn release_only_touches_own_buckets<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 6).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await; // 0, 1
    claim(&store, &g, b, 2).await; // 2, 3
    let released = store
        .release(
            &g,
            a,
            session(&store, &g, a).await,
            &bs(&[3, 1, 2, 4, 1, 0]),
        )
        .await
        .expect("release");
    assert_eq!(bucket_nums(&released), vec![0, 1]);
    let owners = live_owners(&store, &g).await;
    assert_eq!(owners, BTreeMap::from([(2, b), (3, b)]));
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &[])
            .await
            .expect("empty release")
            .is_empty()
    );
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1]))
            .await
            .expect("again")
            .is_empty()
    );
}

/// R3: release keeps tokens; the next claim gets token + 1.
pub async fn release_keeps_tokens<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1]))
        .await
        .expect("release");
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.token.0 == 1 && x.state == BucketState::Unowned)
    );
    let won = claim(&store, &g, b, 2).await;
    assert!(won.iter().all(|l| l.token.0 == 2));
}

/// R1: a bucket out of range fails the whole call and releases nothing.
pub async fn release_out_of_range_writes_nothing<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 4).await;
    match store
        .release(&g, a, session(&store, &g, a).await, &bs(&[0, 4]))
        .await
    {
        Err(StoreError::BucketOutOfRange {
            group: eg,
            bucket,
            shard_count,
        }) => {
            assert_eq!((eg, bucket, shard_count), (g.clone(), Bucket(4), shards(4)));
        }
        other => panic!("expected BucketOutOfRange, got {other:?}"),
    }
    assert_kind(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[u32::MAX]))
            .await,
        ErrorKind::BucketOutOfRange,
        "release of bucket u32::MAX",
    );
    assert_eq!(
        live_owners(&store, &g).await.len(),
        4,
        "bucket 0 was released"
    );
}

/// R2: a worker without a live session releases nothing, even buckets it held.
pub async fn release_without_live_session_releases_nothing<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0]))
            .await
            .expect("release")
            .is_empty()
    );
    beat(&store, &g, a).await;
    claim(&store, &g, a, 3).await;
    clock.advance(secs(TTL_SECS));
    assert!(
        store
            .release(&g, a, session(&store, &g, a).await, &bs(&[0, 1, 2]))
            .await
            .expect("release")
            .is_empty()
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|b| b.state == BucketState::Expired && b.owner == Some(a))
    );
}

// ---- leave ---------------------------------------------------------------------------------

/// L1: leave releases every bucket, keeps tokens and removes the member row.
pub async fn leave_releases_everything_and_removes_membership<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 5).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 3).await;
    claim(&store, &g, b, 1).await;
    let released = store.evict(&g, a).await.expect("leave");
    assert_eq!(bucket_nums(&released), vec![0, 1, 2]);
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.members.iter().map(|m| m.worker).collect::<Vec<_>>(),
        vec![b]
    );
    assert_eq!(live_owners(&store, &g).await, BTreeMap::from([(3, b)]));
    assert_eq!(tokens(&store, &g).await, vec![1, 1, 1, 1, 0]);
    let hb = beat(&store, &g, b).await;
    assert_eq!(hb.view.members.len(), 1);
    assert_eq!(hb.view.claimable, 4);
}

/// L2: leaving when not a member succeeds and changes nothing; a dead member's row goes.
pub async fn leave_is_idempotent<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    assert!(store.evict(&g, a).await.expect("leave").is_empty());
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, b, 2).await;
    assert!(store.evict(&g, a).await.expect("leave").is_empty());
    assert!(store.evict(&g, a).await.expect("leave again").is_empty());
    // b dies; leaving removes its dead row but releases nothing (it owned nothing live).
    clock.advance(secs(TTL_SECS));
    assert!(store.evict(&g, b).await.expect("leave").is_empty());
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.members.is_empty());
    assert!(snap.buckets.iter().all(|x| x.state == BucketState::Expired));
}

/// L3: after leaving, the next heartbeat starts a new session.
pub async fn leaving_the_last_group_ends_the_session<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let first = beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    store.evict(&g, a).await.expect("leave");
    assert_kind(
        store
            .claim(&g, a, session(&store, &g, a).await, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "claim after leave",
    );
    let second = beat(&store, &g, a).await;
    assert!(second.new_session);
    assert_ne!(second.session, first.session);
    assert!(second.owned.is_empty());
    assert_eq!(second.view.claimable, 2);
}

/// G4: across owners, releases and expiries, each bucket's tokens strictly increase.
pub async fn tokens_strictly_increase_across_owners<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 1).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let mut seen = Vec::new();
    for step in 0..6 {
        let w = if step % 2 == 0 { a } else { b };
        beat(&store, &g, w).await;
        let won = claim(&store, &g, w, 1).await;
        assert_eq!(won.len(), 1, "step {step}: bucket 0 was claimable");
        seen.push(won[0].token.0);
        if step % 3 == 0 {
            store
                .release(&g, w, session(&store, &g, w).await, &bs(&[0]))
                .await
                .expect("release");
        } else if step % 3 == 1 {
            clock.advance(secs(TTL_SECS));
        } else {
            store.evict(&g, w).await.expect("leave");
        }
    }
    assert_eq!(seen, vec![1, 2, 3, 4, 5, 6]);
}

// ---- fencing -------------------------------------------------------------------------------

/// F1: the current owner with its current token passes.
pub async fn is_current_accepts_the_current_owner<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 3).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    for lease in claim(&store, &g, a, 3).await {
        assert!(
            store
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current")
        );
    }
}

/// F1: a stale token, a wrong token, another worker, a bucket out of range all fail.
pub async fn is_current_rejects_stale_tokens_and_other_owners<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    let first = claim(&store, &g, a, 1).await[0];
    store
        .release(&g, a, session(&store, &g, a).await, &[first.bucket])
        .await
        .expect("release");
    let second = claim(&store, &g, b, 1).await[0];
    assert_eq!(second.bucket, first.bucket);
    let check = |w: WorkerId, t: i64| {
        let store = &store;
        let g = &g;
        async move {
            store
                .is_current(g, first.bucket, w, FencingToken(t))
                .await
                .expect("is_current")
        }
    };
    assert!(check(b, second.token.0).await);
    assert!(
        !check(a, first.token.0).await,
        "stale token of the old owner"
    );
    assert!(
        !check(a, second.token.0).await,
        "current token, wrong worker"
    );
    assert!(!check(b, first.token.0).await, "right worker, stale token");
    assert!(!check(b, second.token.0 + 1).await, "a future token");
    assert!(
        !store
            .is_current(&g, Bucket(2), b, second.token)
            .await
            .expect("is_current"),
        "bucket out of range"
    );
}

/// F1: a dead session's token and a released bucket's token fail.
pub async fn is_current_rejects_dead_sessions_and_released_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    let won = claim(&store, &g, a, 2).await;
    store
        .release(&g, a, session(&store, &g, a).await, &[won[1].bucket])
        .await
        .expect("release");
    assert!(
        !store
            .is_current(&g, won[1].bucket, a, won[1].token)
            .await
            .expect("is_current")
    );
    clock.advance(Duration::from_micros(TTL_SECS * 1_000_000 - 1));
    assert!(
        store
            .is_current(&g, won[0].bucket, a, won[0].token)
            .await
            .expect("is_current")
    );
    clock.advance(Duration::from_micros(1));
    assert!(
        !store
            .is_current(&g, won[0].bucket, a, won[0].token)
            .await
            .expect("is_current"),
        "a dead session's lease passed the fencing check"
    );
}

// ---- snapshot ------------------------------------------------------------------------------

/// S1, S3: a snapshot shows live, expired and unowned buckets with their expiries, and
/// writes nothing.
pub async fn snapshot_reports_states_and_expiries<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let hba = beat(&store, &g, a).await;
    claim(&store, &g, a, 1).await; // 0: a, dies
    clock.advance(secs(1));
    let hbb = beat(&store, &g, b).await;
    claim(&store, &g, b, 2).await; // 1, 2: b, live
    clock.advance(secs(TTL_SECS - 1));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.observed_at, clock.now());
    let states: Vec<BucketState> = snap.buckets.iter().map(|x| x.state).collect();
    assert_eq!(
        states,
        vec![
            BucketState::Expired,
            BucketState::Live,
            BucketState::Live,
            BucketState::Unowned
        ]
    );
    assert_eq!(snap.buckets[0].owner, Some(a));
    assert_eq!(snap.buckets[0].session, Some(hba.session));
    assert_eq!(snap.buckets[0].expires_at, Some(hba.expires_at));
    assert_eq!(snap.buckets[1].owner, Some(b));
    assert_eq!(snap.buckets[1].session, Some(hbb.session));
    assert_eq!(snap.buckets[1].expires_at, Some(hbb.expires_at));
    assert_eq!(snap.buckets[3].owner, None);
    assert_eq!(snap.live_leases().len(), 2);
    assert_eq!(snap.view().claimable, 2);
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot"),
        snap,
        "a snapshot wrote"
    );
}

/// S2: a snapshot lists every member row, live or dead, with metadata and live load.
pub async fn snapshot_lists_every_member<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let meta_a = MemberMetadata::new("host=a pid=1").expect("valid");
    let meta_b = MemberMetadata::new("host=b pid=2").expect("valid");
    beat_as(&store, &g, a, inc(a), ttl(), &meta_a)
        .await
        .expect("heartbeat");
    claim(&store, &g, a, 3).await;
    clock.advance(secs(2));
    let t_b = clock.now();
    let hb = beat_as(&store, &g, b, inc(b), ttl(), &meta_b)
        .await
        .expect("heartbeat");
    claim(&store, &g, b, 1).await;
    clock.advance(secs(3));
    let renewed_at = clock.now();
    beat_as(&store, &g, b, inc(b), ttl(), &meta_a)
        .await
        .expect("heartbeat");
    clock.advance(secs(TTL_SECS - 2 - 3));
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.members.len(), 2);
    let (ma, mb) = (&snap.members[0], &snap.members[1]);
    assert_eq!((ma.worker, ma.live, ma.owned), (a, false, 0));
    assert_eq!(ma.metadata, meta_a);
    assert_eq!((mb.worker, mb.live, mb.owned), (b, true, 1));
    assert_eq!(mb.session, hb.session);
    assert_eq!(mb.joined_at, t_b);
    assert_eq!(mb.heartbeat_at, renewed_at);
    assert_eq!(mb.expires_at, renewed_at + ttl().as_chrono());
    assert_eq!(mb.metadata, meta_a, "metadata is replaced on renewal");
    assert_eq!(snap.live_members().len(), 1);
}

// ---- changes -------------------------------------------------------------------------------

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

/// W1, H6, R4, L4: joins, releases and leaves reach a feed opened before them, in order; a
/// renewal and an empty release send nothing.
pub async fn changes_report_joins_releases_and_leaves<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let other = setup(&store, "other", 4).await;
    let mut feed = feed(&store, &g).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    assert_eq!(next_change(&mut feed, "join").await, Change::Joined(a));
    beat(&store, &g, a).await; // renewal: nothing
    claim(&store, &g, a, 2).await; // claim: nothing
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[3]))
        .await
        .expect("release"); // releases nothing: nothing
    beat(&store, &other, b).await; // another group: nothing here
    store
        .release(&g, a, session(&store, &g, a).await, &bs(&[1]))
        .await
        .expect("release");
    assert_eq!(next_change(&mut feed, "release").await, Change::Released(a));
    store.evict(&g, a).await.expect("leave");
    assert_eq!(next_change(&mut feed, "leave").await, Change::Left(a));
    beat(&store, &g, b).await;
    assert_eq!(
        next_change(&mut feed, "second join").await,
        Change::Joined(b)
    );
    let mut seen = BTreeSet::new();
    while let Some(extra) = feed.try_recv() {
        seen.insert(format!("{extra:?}"));
    }
    assert!(seen.is_empty(), "unexpected changes: {seen:?}");
}

// ---- nodes ---------------------------------------------------------------------------------

/// One heartbeat of `w` (its own incarnation, the suite's ttl, no metadata) handing in `seen`.
async fn node_beat<S: LeaseStore>(store: &S, w: WorkerId, seen: &[GroupStamp]) -> Heartbeat {
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

/// H1, H4, G7: a node in two groups renews one session with one heartbeat, which gives each
/// group's view and the node's leases in it, sorted by group name.
pub async fn a_node_renews_every_group_in_one_heartbeat<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let billing = setup(&store, "billing", 8).await;
    let orders = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let first = beat(&store, &orders, a).await;
    let second = beat(&store, &billing, a).await;
    assert_eq!(first.session, second.session, "one session for both groups");
    assert!(!second.new_session);
    beat(&store, &orders, b).await;
    claim(&store, &orders, a, 2).await;
    claim(&store, &billing, a, 5).await;
    clock.advance(secs(1));
    let hb = node_beat(&store, a, &[]).await;
    assert!(!hb.new_session);
    assert_eq!(hb.session, first.session);
    assert_eq!(hb.expires_at, clock.now() + ttl().as_chrono());
    assert_eq!(
        names(&hb),
        (vec!["billing".to_owned(), "orders".to_owned()], vec![])
    );
    let (gb, go) = (&hb.groups[0], &hb.groups[1]);
    assert_eq!(gb.view.shard_count, shards(8));
    assert_eq!(nums(&gb.owned), vec![0, 1, 2, 3, 4]);
    assert_eq!(gb.view.claimable, 3);
    assert_eq!(go.view.shard_count, shards(4));
    assert_eq!(nums(&go.owned), vec![0, 1]);
    assert_eq!(
        go.view
            .members
            .iter()
            .map(|m| (m.worker, m.owned))
            .collect::<Vec<_>>(),
        vec![(a, 2), (b, 0)]
    );
    assert!(
        hb.groups
            .iter()
            .flat_map(|g| &g.owned)
            .all(|l| l.expires_at == hb.expires_at),
        "every lease of the node expires with its session"
    );
    // Both groups see the one session, renewed.
    for g in [&billing, &orders] {
        let snap = store.snapshot(g).await.expect("snapshot");
        let me = snap.members.iter().find(|m| m.worker == a).expect("a");
        assert_eq!((me.session, me.expires_at), (hb.session, hb.expires_at));
    }
}

/// H2: a node whose session expired starts a new one that is a member of no group: its old
/// memberships are gone (each group hears it left), its buckets are claimable, and it claims
/// again only after joining.
pub async fn a_new_session_is_a_member_of_no_group<S: LeaseStore>(store: S, clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &orders, a).await;
    beat(&store, &billing, a).await;
    claim(&store, &orders, a, 4).await;
    let mut feed = feed(&store, &orders).await;
    clock.advance(secs(TTL_SECS));
    let hb = node_beat(&store, a, &[]).await;
    assert!(hb.new_session);
    assert!(hb.groups.is_empty() && hb.unchanged.is_empty(), "{hb:?}");
    assert_eq!(
        next_change(&mut feed, "a new session").await,
        Change::Left(a)
    );
    for g in [&orders, &billing] {
        let snap = store.snapshot(g).await.expect("snapshot");
        assert!(snap.members.is_empty(), "{g:?}: {:?}", snap.members);
    }
    assert_kind(
        store
            .claim(&orders, a, hb.session, 4, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "a claim before joining",
    );
    store.join(&orders, a, hb.session).await.expect("join");
    let won = store
        .claim(&orders, a, hb.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(nums(&won), vec![0, 1, 2, 3]);
    assert!(won.iter().all(|l| l.token == FencingToken(2)));
}

/// J1: a join needs the node's live session; an unknown group fails; nothing is written.
pub async fn join_needs_a_live_session<S: LeaseStore>(store: S, clock: ManualClock) {
    let g = setup(&store, "orders", 2).await;
    let [a] = workers(1)[..] else { unreachable!() };
    assert_kind(
        store.join(&g, a, SessionId::new()).await,
        ErrorKind::SessionExpired,
        "a join of a node with no session",
    );
    let hb = node_beat(&store, a, &[]).await;
    assert_kind(
        store.join(&g, a, SessionId::new()).await,
        ErrorKind::SessionExpired,
        "a join under a session the node does not hold",
    );
    assert_kind(
        store.join(&group("unknown"), a, hb.session).await,
        ErrorKind::GroupNotFound,
        "a join of an unknown group",
    );
    clock.advance(secs(TTL_SECS));
    assert_kind(
        store.join(&g, a, hb.session).await,
        ErrorKind::SessionExpired,
        "a join under an expired session",
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(snap.members.is_empty(), "a refused join wrote a member");
}

/// J2, J3: joining twice makes one member (joined at the first) and one wake-up; the node's
/// other groups do not change.
pub async fn join_is_idempotent_and_touches_no_other_group<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &billing, a).await;
    claim(&store, &billing, a, 2).await;
    let before = store.snapshot(&billing).await.expect("snapshot");
    let mut feed = feed(&store, &orders).await;
    let session = session(&store, &billing, a).await;
    let joined_at = clock.now();
    store.join(&orders, a, session).await.expect("join");
    clock.advance(secs(1));
    store.join(&orders, a, session).await.expect("join again");
    assert_eq!(next_change(&mut feed, "join").await, Change::Joined(a));
    assert!(feed.try_recv().is_none(), "a second join sent a change");
    let snap = store.snapshot(&orders).await.expect("snapshot");
    assert_eq!(snap.members.len(), 1);
    assert_eq!(snap.members[0].joined_at, joined_at);
    let mut after = store.snapshot(&billing).await.expect("snapshot");
    after.observed_at = before.observed_at;
    assert_eq!(after, before, "joining orders changed billing");
}

/// C1, R2: a node with a live session claims and releases only in groups it is a member of.
pub async fn claims_and_releases_need_membership<S: LeaseStore>(store: S, _clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let hb = beat(&store, &orders, a).await;
    claim(&store, &orders, a, 2).await;
    assert_kind(
        store
            .claim(&billing, a, hb.session, 1, Takeover::Allowed)
            .await,
        ErrorKind::SessionExpired,
        "a claim in a group the node is not a member of",
    );
    // b, a member of billing only, names buckets of orders that a holds: nothing moves.
    let sb = beat(&store, &billing, b).await.session;
    assert!(
        store
            .release(&orders, b, sb, &bs(&[0, 1]))
            .await
            .expect("release")
            .is_empty()
    );
    assert_eq!(live_owners(&store, &orders).await.len(), 2);
    assert!(
        store
            .snapshot(&billing)
            .await
            .expect("snapshot")
            .live_leases()
            .is_empty()
    );
}

/// L3: leaving one group releases its buckets only; the session lives on, renewed by the next
/// heartbeat, which no longer lists the group; the node's other group keeps its buckets.
pub async fn leaving_one_group_keeps_the_session_and_the_others<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    let hb = beat(&store, &orders, a).await;
    beat(&store, &billing, a).await;
    claim(&store, &orders, a, 2).await;
    let kept = claim(&store, &billing, a, 3).await;
    let left = store.leave(&orders, a, hb.session).await.expect("leave");
    assert_eq!(bucket_nums(&left), vec![0, 1]);
    let next = node_beat(&store, a, &[]).await;
    assert!(!next.new_session, "leaving one group ended the session");
    assert_eq!(next.session, hb.session);
    assert_eq!(names(&next), (vec!["billing".to_owned()], vec![]));
    assert_eq!(
        next.groups[0]
            .owned
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>(),
        kept.iter().map(|l| (l.bucket, l.token)).collect::<Vec<_>>()
    );
    assert!(
        store
            .is_current(&billing, kept[0].bucket, a, kept[0].token)
            .await
            .expect("is_current")
    );
}

/// H8: a group may be answered unchanged only while nothing a view shows changed since the
/// stamp handed in; after a claim, a release, a join, a leave, a resize or a member's session
/// ending, the view is given.
pub async fn unchanged_is_answered_only_when_nothing_changed<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 8).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    claim(&store, &g, a, 2).await;
    // a's last view, and the stamp to hand in.
    let mut last = node_beat(&store, a, &[]).await.groups.remove(0);
    // Judge one heartbeat of a's: unchanged only if the view would be the same.
    async fn judge<S: LeaseStore>(
        store: &S,
        a: WorkerId,
        last: &mut lease_core::GroupBeat,
        changed: bool,
        what: &str,
    ) {
        let seen = [GroupStamp {
            group: last.group.clone(),
            stamp: last.stamp,
        }];
        let hb = node_beat(store, a, &seen).await;
        match (hb.groups.first(), hb.unchanged.first()) {
            (Some(given), None) => {
                if !changed {
                    let mut expected = last.clone();
                    expected.stamp = given.stamp;
                    for l in &mut expected.owned {
                        l.expires_at = hb.expires_at;
                    }
                    assert_eq!(given, &expected, "{what}: the view given differs");
                }
                *last = given.clone();
            }
            (None, Some(u)) => {
                assert!(!changed, "{what}: answered unchanged after a change");
                last.stamp = u.stamp;
            }
            other => panic!("{what}: not one answer for the group: {other:?}"),
        }
    }
    judge(&store, a, &mut last, false, "a renewal").await;
    clock.advance(secs(1));
    judge(&store, a, &mut last, false, "a renewal a second later").await;
    claim(&store, &g, b, 1).await;
    judge(&store, a, &mut last, true, "b claimed").await;
    release(&store, &g, b, &[2]).await;
    judge(&store, a, &mut last, true, "b released").await;
    beat(&store, &g, c).await;
    judge(&store, a, &mut last, true, "c joined").await;
    store.evict(&g, c).await.expect("leave");
    judge(&store, a, &mut last, true, "c left").await;
    resize(&store, &g, 8, 16).await;
    judge(&store, a, &mut last, true, "resized").await;
    release(&store, &g, a, &[0, 1]).await;
    judge(&store, a, &mut last, true, "a released (the drain ended)").await;
    judge(&store, a, &mut last, false, "a renewal after the drain").await;
    // b (last renewed a second after the start) stops renewing: once its session ends, a's
    // view changes.
    clock.advance(secs(TTL_SECS - 2));
    judge(&store, a, &mut last, false, "just before b's session ends").await;
    clock.advance(secs(1));
    judge(&store, a, &mut last, true, "b's session ended").await;
    assert_eq!(last.view.members.len(), 1, "{:?}", last.view.members);
    // K3: a control moves the counter, unless it sets the value stored.
    let two = MemberControl::Weight(Weight::new(2).expect("weight"));
    store.control(&g, a, two).await.expect("control");
    judge(&store, a, &mut last, true, "a's weight set").await;
    store.control(&g, a, two).await.expect("control");
    judge(&store, a, &mut last, false, "a's weight set to the same").await;
    // Q3: so do setting and lifting a quarantine, and its end.
    let five = QuarantineFor::new(secs(5)).ok();
    store
        .quarantine(&g, Bucket(9), five)
        .await
        .expect("quarantine");
    judge(&store, a, &mut last, true, "a quarantine set").await;
    judge(&store, a, &mut last, false, "a renewal under quarantine").await;
    clock.advance(secs(5));
    judge(&store, a, &mut last, true, "the quarantine ended").await;
    store.quarantine(&g, Bucket(9), None).await.expect("lift");
    judge(&store, a, &mut last, false, "no quarantine to lift").await;
    store
        .quarantine(&g, Bucket(9), five)
        .await
        .expect("quarantine");
    judge(&store, a, &mut last, true, "a quarantine set again").await;
    store.quarantine(&g, Bucket(9), None).await.expect("lift");
    judge(&store, a, &mut last, true, "the quarantine lifted").await;
}

/// N1, N2, H3: `nodes` lists every node row with its session, liveness, metadata and groups;
/// a dead node goes once a heartbeat removed its last membership.
pub async fn nodes_lists_every_node_with_its_groups<S: LeaseStore>(store: S, clock: ManualClock) {
    let orders = setup(&store, "orders", 4).await;
    let billing = setup(&store, "billing", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    let meta = MemberMetadata::new("host=a").expect("metadata");
    let started = clock.now();
    beat_as(&store, &orders, a, inc(a), ttl(), &meta)
        .await
        .expect("heartbeat");
    beat_as(&store, &billing, a, inc(a), ttl(), &meta)
        .await
        .expect("heartbeat");
    clock.advance(secs(1));
    let hb_b = beat(&store, &orders, b).await;
    let listing = store.nodes().await.expect("nodes");
    assert_eq!(listing.observed_at, clock.now());
    assert_eq!(
        listing.nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
        vec![a, b]
    );
    let na = &listing.nodes[0];
    assert_eq!(na.started_at, started);
    assert_eq!(na.expires_at, started + ttl().as_chrono());
    assert!(na.live);
    assert_eq!(na.metadata, meta);
    assert_eq!(na.groups, vec![billing.clone(), orders.clone()]);
    assert_eq!(listing.nodes[1].session, hb_b.session);
    assert_eq!(listing.nodes[1].groups, vec![orders.clone()]);
    assert_eq!(
        store.nodes().await.expect("nodes").nodes,
        listing.nodes,
        "listing wrote something"
    );
    // a's session ends; b's heartbeat removes a from orders, which is not a's last group.
    clock.advance(secs(TTL_SECS - 1));
    beat(&store, &orders, b).await;
    let listing = store.nodes().await.expect("nodes");
    let na = listing
        .nodes
        .iter()
        .find(|n| n.node == a)
        .expect("a is still a member of billing");
    assert!(!na.live);
    assert_eq!(na.groups, vec![billing.clone()]);
    // b joins billing: its heartbeat removes a's last membership, and a's node row with it.
    beat(&store, &billing, b).await;
    let listing = store.nodes().await.expect("nodes");
    assert_eq!(
        listing.nodes.iter().map(|n| n.node).collect::<Vec<_>>(),
        vec![b]
    );
}

// ---- resize (run by `resize_suite!`) -----------------------------------------------------

async fn resize<S: LeaseStore>(store: &S, g: &GroupName, from: u32, to: u32) -> ResizeOutcome {
    store
        .resize(g, shards(from), shards(to))
        .await
        .expect("resize succeeds")
}

async fn release<S: LeaseStore>(store: &S, g: &GroupName, w: WorkerId, ns: &[u32]) -> Vec<u32> {
    let s = session(store, g, w).await;
    let released = store.release(g, w, s, &bs(ns)).await.expect("release");
    bucket_nums(&released)
}

/// Every lease live now in either generation, as `(shard count, bucket, owner)`.
async fn live_in_both<S: LeaseStore>(store: &S, g: &GroupName) -> Vec<(u32, u32, WorkerId)> {
    let snap = store.snapshot(g).await.expect("snapshot");
    snap.live_leases()
        .into_iter()
        .chain(snap.draining_leases())
        .map(|l| (l.shards.get(), l.bucket.0, l.owner))
        .collect()
}

/// G9: no key (hash `0..lcm`) lies in two buckets owned live, across generations.
async fn assert_keys_held_once<S: LeaseStore>(store: &S, g: &GroupName, what: &str) {
    let leases = live_in_both(store, g).await;
    for key in 0..720u64 {
        let holders: Vec<_> = leases
            .iter()
            .filter(|(n, b, _)| shards(*n).bucket_of(key) == Bucket(*b))
            .collect();
        assert!(holders.len() <= 1, "{what}: key {key} held by {holders:?}");
    }
}

/// Z1, Z2, Z3, Z4, C8, H4, F1, R2, L1: a split `4 -> 8`. Old buckets keep their owners and
/// tokens; each new bucket waits for its one parent (`b' mod 4`) only; its first token is above
/// the parent's; `is_current` answers for both generations; once every old bucket is released
/// the old generation is gone.
pub async fn resize_splits_with_one_parent_per_bucket<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b] = workers(2)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    let old = claim(&store, &g, a, 4).await;
    assert_eq!(
        resize(&store, &g, 4, 8).await,
        ResizeOutcome::Started {
            generation: Generation(1)
        }
    );
    let hb = beat(&store, &g, a).await;
    assert_eq!(hb.view.shard_count, shards(8));
    assert_eq!(hb.view.generation, Generation(1));
    assert_eq!(hb.view.previous, Some(shards(4)));
    assert_eq!(hb.view.draining, 4);
    assert_eq!(hb.view.claimable, 8);
    assert_eq!(
        hb.view.members[0].owned, 0,
        "loads count the new generation"
    );
    assert_eq!(nums(&hb.owned), vec![0, 1, 2, 3]);
    assert!(hb.owned.iter().all(|l| l.shards == shards(4)));
    assert_eq!(bucket_nums(&hb.draining_buckets()), vec![0, 1, 2, 3]);
    assert!(hb.owned_buckets().is_empty());
    assert!(
        store
            .is_current(&g, Bucket(2), a, old[2].token)
            .await
            .expect("is_current"),
        "an old bucket not retired is current for its owner"
    );

    beat(&store, &g, b).await;
    assert!(claim(&store, &g, b, 8).await.is_empty(), "all wait");
    assert_eq!(release(&store, &g, a, &[1]).await, vec![1]);
    let won = claim(&store, &g, b, 8).await;
    assert_eq!(
        nums(&won),
        vec![1, 5],
        "the children of old 1, nothing else"
    );
    assert!(won.iter().all(|l| l.shards == shards(8)));
    assert!(won.iter().all(|l| l.token > old[1].token), "Z4: {won:?}");
    assert!(
        store
            .is_current(&g, Bucket(1), b, won[0].token)
            .await
            .expect("is_current")
    );
    assert!(
        !store
            .is_current(&g, Bucket(1), a, old[1].token)
            .await
            .expect("is_current")
    );
    assert_keys_held_once(&store, &g, "after one release").await;
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(snap.draining.len(), 4);
    assert_eq!(snap.view().draining, 3);
    assert_eq!(
        snap.waiting(),
        vec![
            (Bucket(0), bs(&[0])),
            (Bucket(2), bs(&[2])),
            (Bucket(3), bs(&[3])),
            (Bucket(4), bs(&[0])),
            (Bucket(6), bs(&[2])),
            (Bucket(7), bs(&[3])),
        ]
    );

    // a holds old 0, 2, 3; it takes new ones as they free up, then leaves with both kinds.
    assert_eq!(release(&store, &g, a, &[2]).await, vec![2]);
    assert_eq!(nums(&claim(&store, &g, a, 1).await), vec![2]);
    let hb = beat(&store, &g, a).await;
    assert_eq!(
        hb.owned
            .iter()
            .map(|l| (l.bucket.0, l.shards.get()))
            .collect::<Vec<_>>(),
        vec![(0, 4), (2, 8), (3, 4)]
    );
    assert_eq!(
        bucket_nums(&store.evict(&g, a).await.expect("leave")),
        vec![0, 2, 3]
    );
    let snap = store.snapshot(&g).await.expect("snapshot");
    assert!(
        snap.draining.is_empty(),
        "every old bucket retired: the generation is gone"
    );
    assert!(snap.waiting().is_empty());
    assert_eq!(
        (snap.shard_count, snap.generation),
        (shards(8), Generation(1))
    );
    assert_eq!(nums(&claim(&store, &g, b, 8).await), vec![0, 2, 3, 4, 6, 7]);
    assert_eq!(
        store
            .release(&g, b, session(&store, &g, b).await, &bs(&[8]))
            .await
            .map_err(|e| e.kind())
            .err(),
        Some(ErrorKind::BucketOutOfRange),
    );
}

/// C8, Z4: a merge `8 -> 4`: each new bucket waits for both its parents (`b'` and `b' + 4`),
/// and starts above the higher of their tokens.
pub async fn resize_merges_with_two_parents_per_bucket<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 8).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, b).await;
    assert_eq!(nums(&claim(&store, &g, a, 4).await), vec![0, 1, 2, 3]);
    assert_eq!(nums(&claim(&store, &g, b, 4).await), vec![4, 5, 6, 7]);
    // Old 5 changes hands twice more: token 3.
    release(&store, &g, b, &[5]).await;
    claim(&store, &g, b, 1).await;
    release(&store, &g, b, &[5]).await;
    claim(&store, &g, b, 1).await;
    resize(&store, &g, 8, 4).await;
    beat(&store, &g, c).await;
    release(&store, &g, a, &[1]).await;
    assert!(
        claim(&store, &g, c, 4).await.is_empty(),
        "new 1 still waits for old 5"
    );
    release(&store, &g, b, &[5]).await;
    let won = claim(&store, &g, c, 4).await;
    assert_eq!(nums(&won), vec![1]);
    assert_eq!(won[0].token, FencingToken(4), "above old 5's token 3");
    assert_keys_held_once(&store, &g, "merge").await;
}

/// C8: changes that are not splits or merges: `16 -> 24` (gcd 8: each new bucket waits for
/// two old ones) and `16 -> 17` (gcd 1: one old bucket holds back every new one).
pub async fn resize_to_a_non_divisor_count<S: LeaseStore>(store: S, _clock: ManualClock) {
    for (to, expect_free) in [(24u32, 21usize), (17, 0)] {
        let g = setup(&store, &format!("orders-{to}"), 16).await;
        let [a, c] = workers(2)[..] else {
            unreachable!()
        };
        beat(&store, &g, a).await;
        claim(&store, &g, a, 16).await;
        let all: Vec<u32> = (0..16).filter(|&b| b != 3).collect();
        release(&store, &g, a, &all).await;
        resize(&store, &g, 16, to).await;
        beat(&store, &g, c).await;
        let won = claim(&store, &g, c, 100).await;
        assert_eq!(won.len(), expect_free, "16 -> {to}: {:?}", nums(&won));
        assert!(
            won.iter().all(|l| l.bucket.0 % 8 != 3),
            "16 -> {to}: {won:?}"
        );
        assert_keys_held_once(&store, &g, "while old 3 is held").await;
        release(&store, &g, a, &[3]).await;
        let rest = claim(&store, &g, c, 100).await;
        assert_eq!(rest.len() + won.len(), to as usize, "16 -> {to}");
        assert!(
            store
                .snapshot(&g)
                .await
                .expect("snapshot")
                .draining
                .is_empty()
        );
    }
}

/// Z1: a resize while another drains is refused with `ResizeInProgress` (transient), one from
/// a count the group no longer has with `ResizeFromMismatch`; both write nothing. Once the
/// drain ends the next resize opens generation 2.
pub async fn resize_during_a_resize_is_refused<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 1).await;
    resize(&store, &g, 4, 8).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    let busy = store.resize(&g, shards(8), shards(16)).await;
    assert!(
        busy.as_ref().is_err_and(StoreError::is_transient),
        "{busy:?}"
    );
    assert_kind(busy, ErrorKind::ResizeInProgress, "resize while draining");
    let stale = store.resize(&g, shards(4), shards(8)).await;
    assert!(
        stale.as_ref().is_err_and(|e| !e.is_transient()),
        "{stale:?}"
    );
    assert_kind(
        stale,
        ErrorKind::ResizeFromMismatch,
        "resize from the old count",
    );
    assert_eq!(store.snapshot(&g).await.expect("snapshot"), before);
    release(&store, &g, a, &[0]).await;
    assert_eq!(
        resize(&store, &g, 8, 16).await,
        ResizeOutcome::Started {
            generation: Generation(2)
        }
    );
    assert_eq!(
        store.snapshot(&g).await.expect("snapshot").previous,
        Some(shards(8))
    );
}

/// G5, Z1: resizing a group never created fails with `GroupNotFound` and creates nothing.
pub async fn resize_of_an_unknown_group_fails<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = group("unknown");
    assert_kind(
        store.resize(&g, shards(4), shards(8)).await,
        ErrorKind::GroupNotFound,
        "resize",
    );
    assert_kind(
        store.snapshot(&g).await,
        ErrorKind::GroupNotFound,
        "snapshot",
    );
}

/// Z1: `from == to` (the group's count) is a no-op answering `Unchanged`; `from` that is not
/// the group's count is a mismatch even when `from == to`.
pub async fn resize_to_the_same_count_changes_nothing<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a] = workers(1)[..] else { unreachable!() };
    beat(&store, &g, a).await;
    claim(&store, &g, a, 2).await;
    let before = store.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        resize(&store, &g, 4, 4).await,
        ResizeOutcome::Unchanged {
            generation: Generation(0)
        }
    );
    assert_eq!(store.snapshot(&g).await.expect("snapshot"), before);
    assert_kind(
        store.resize(&g, shards(5), shards(5)).await,
        ErrorKind::ResizeFromMismatch,
        "same count, but not the group's",
    );
}

/// Z3, C7, C8: an owner whose session dies during the drain retires its old buckets: with
/// takeovers allowed their children are claimable (tokens still above), with takeovers
/// deferred they are not (for a deferred claim only a release retires a bucket). Never-owned
/// old buckets are retired from the start. The drain ends when the last live owner releases.
pub async fn owners_dead_during_the_drain_retire_their_buckets<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    let [a, b, c] = workers(3)[..] else {
        unreachable!()
    };
    beat(&store, &g, a).await;
    beat(&store, &g, c).await;
    let old = claim(&store, &g, a, 2).await;
    assert_eq!(nums(&old), vec![0, 1]);
    assert_eq!(nums(&claim(&store, &g, c, 1).await), vec![2]);
    resize(&store, &g, 4, 8).await;
    clock.advance(secs(TTL_SECS / 2));
    beat(&store, &g, c).await;
    clock.advance(secs(TTL_SECS / 2));
    let hb = beat(&store, &g, b).await;
    assert_eq!(hb.view.draining, 1, "a is dead: only c's old 2 drains");
    let deferred = store
        .claim(&g, b, hb.session, 8, Takeover::Deferred)
        .await
        .expect("claim");
    assert_eq!(
        nums(&deferred),
        vec![3, 7],
        "children of the never-owned old 3 only"
    );
    let won = claim(&store, &g, b, 8).await;
    assert_eq!(nums(&won), vec![0, 1, 4, 5], "children of a's dead buckets");
    let old_max = old.iter().map(|l| l.token).max().expect("two leases");
    assert!(won.iter().all(|l| l.token > old_max), "{won:?}");
    assert_keys_held_once(&store, &g, "one owner dead").await;
    assert_kind(
        store.resize(&g, shards(8), shards(2)).await,
        ErrorKind::ResizeInProgress,
        "c still holds old 2",
    );
    release(&store, &g, c, &[2]).await;
    assert_eq!(nums(&claim(&store, &g, b, 8).await), vec![2, 6]);
    assert!(
        store
            .snapshot(&g)
            .await
            .expect("snapshot")
            .draining
            .is_empty()
    );
    resize(&store, &g, 8, 2).await;
}

/// E3, Z3: after a resize `4 -> 8`, `ensure_group` accepts 8 and the 4 it was resized from
/// (a worker configured before the resize adopts the stored count), and refuses any other.
pub async fn ensure_group_accepts_the_count_resized_from<S: LeaseStore>(
    store: S,
    _clock: ManualClock,
) {
    let g = setup(&store, "orders", 4).await;
    resize(&store, &g, 4, 8).await;
    store
        .ensure_group(&g, shards(4))
        .await
        .expect("the old count");
    store
        .ensure_group(&g, shards(8))
        .await
        .expect("the new count");
    match store.ensure_group(&g, shards(16)).await {
        Err(StoreError::ShardCountMismatch {
            configured, found, ..
        }) => assert_eq!((configured, found), (shards(16), shards(8))),
        other => panic!("expected a mismatch, got {other:?}"),
    }
}

/// W1, Z2: a resize reaches a feed opened before it.
pub async fn resize_sends_a_change<S: LeaseStore>(store: S, _clock: ManualClock) {
    let g = setup(&store, "orders", 4).await;
    let mut feed = feed(&store, &g).await;
    resize(&store, &g, 4, 6).await;
    assert_eq!(next_change(&mut feed, "resize").await, Change::Resized);
}

/// H9: a heartbeat that starts a session removes the rows of other nodes that are dead and in
/// no group, and no other: a dead node still a member of a group stays (H3 removes it from
/// there), as does a live node in no group, and nothing else starts a removal.
pub async fn a_new_session_removes_dead_nodes_in_no_group<S: LeaseStore>(
    store: S,
    clock: ManualClock,
) {
    let orders = setup(&store, "orders", 2).await;
    let [never_joined, member, idle, newcomer] = workers(4)[..] else {
        unreachable!()
    };
    let empty = MemberMetadata::empty();
    // A process that died before it joined anything, a member, and a live node in no group
    // that outlives them (its session starts while the others are live: nothing removed).
    store
        .heartbeat(never_joined, inc(never_joined), ttl(), &empty, &[])
        .await
        .expect("heartbeat");
    beat(&store, &orders, member).await;
    let long = Ttl::from_secs(3 * TTL_SECS).expect("ttl");
    store
        .heartbeat(idle, inc(idle), long, &empty, &[])
        .await
        .expect("heartbeat");
    let listed = |l: &lease_core::NodesSnapshot| l.nodes.iter().map(|n| n.node).collect::<Vec<_>>();
    let mut all = vec![never_joined, member, idle];
    all.sort();
    clock.advance(secs(TTL_SECS));
    // A renewal removes nothing.
    let renewed = store
        .heartbeat(idle, inc(idle), long, &empty, &[])
        .await
        .expect("heartbeat");
    assert!(!renewed.new_session);
    assert_eq!(
        listed(&store.nodes().await.expect("nodes")),
        all,
        "a renewal removed a node"
    );
    // A new session: the dead node in no group goes; the dead member and the live idle node
    // stay.
    let started = store
        .heartbeat(newcomer, inc(newcomer), ttl(), &empty, &[])
        .await
        .expect("heartbeat");
    assert!(started.new_session);
    let mut want = vec![member, idle, newcomer];
    want.sort();
    assert_eq!(listed(&store.nodes().await.expect("nodes")), want);
}
