//! The whole conformance suite on etcd (a three-member cluster), each case its own test, and
//! the resize contract's cases. Liveness is judged on the suite's manual clock (the store's
//! test mode), so expiry can be stepped through exactly as on the other backends. The cases
//! that never read the suite's clock run again in production mode (`leases`), on sessions
//! that are etcd leases.

mod support;

use lease_core::ManualClock;

lease_testing::conformance_suite!(|clock: ManualClock| support::on_clock(clock));

mod resize {
    use super::*;

    lease_testing::resize_suite!(|clock: ManualClock| support::on_clock(clock));
}

/// Production mode (`EtcdLeaseStore::connect`): a session is live while its liveness key is
/// on an etcd lease, and the store reads the system clock, so the suite's manual clock means
/// nothing to it. Every case that ignores that clock runs here; the others are listed in
/// `EXCLUDED` with the reason, and a test checks that the two lists are the suite's cases.
mod leases {
    use super::*;

    lease_testing::conformance_cases!(|_clock: ManualClock| support::on_leases();
        ensure_creates_unowned_buckets,
        unknown_group_fails_every_operation,
        names_are_plain_data,
        operations_act_only_under_the_named_session,
        heartbeat_lists_idle_members_with_zero,
        heartbeat_returns_exactly_own_leases,
        claim_respects_want,
        claim_takes_lowest_claimable_first,
        claims_follow_the_worker_s_order,
        claim_excludes_another_worker,
        concurrent_claims_never_overlap,
        claim_increments_tokens,
        release_only_touches_own_buckets,
        release_keeps_tokens,
        release_out_of_range_writes_nothing,
        leave_releases_everything_and_removes_membership,
        leaving_the_last_group_ends_the_session,
        is_current_accepts_the_current_owner,
        is_current_rejects_stale_tokens_and_other_owners,
        changes_report_joins_releases_and_leaves,
        claims_and_releases_need_membership,
        leaving_one_group_keeps_the_session_and_the_others,
        controls_show_in_views_and_snapshots,
        cordoned_and_draining_members_claim_nothing,
        the_owner_keeps_a_quarantined_bucket_until_it_releases,
        quarantine_is_checked_and_lifted_by_resizes,
        controls_wake_the_group,
        history_keeps_the_last_tenures,
        history_is_checked_and_cleared_by_resizes,
        an_eviction_releases_the_node_s_buckets_whatever_its_session,
        named_claims_take_only_the_named_claimable_buckets,
        published_loads_are_recorded_on_owned_buckets_and_shown,
    );

    /// Why a case cannot run in production mode.
    #[derive(Clone, Copy, Debug)]
    enum Why {
        /// It steps the suite's clock (to end or age a session, a quarantine): etcd ends a
        /// session by its own clock, which a test cannot step.
        StepsTheClock,
        /// It compares the store's times with the suite's clock: the store reads the system's.
        ReadsTheSuiteClock,
        /// It compares two snapshots whole, times included: each is observed at its own
        /// instant, with expiries read off etcd's lease ttls then.
        ComparesWholeSnapshots,
    }

    use Why::*;

    /// The cases that do not run in production mode, each with its reason.
    const EXCLUDED: &[(&str, Why)] = &[
        ("ensure_is_idempotent", ComparesWholeSnapshots),
        ("ensure_mismatch_writes_nothing", ComparesWholeSnapshots),
        ("groups_are_independent", StepsTheClock),
        ("first_heartbeat_starts_a_session", ReadsTheSuiteClock),
        ("heartbeat_extends_a_live_session", StepsTheClock),
        ("expired_session_is_never_renewed", StepsTheClock),
        ("old_session_buckets_are_claimable_by_anyone", StepsTheClock),
        (
            "a_worker_reclaims_its_old_buckets_with_new_tokens",
            StepsTheClock,
        ),
        ("heartbeats_remove_dead_members", StepsTheClock),
        ("a_node_id_in_use_is_refused", StepsTheClock),
        ("heartbeat_omits_expired_members", StepsTheClock),
        ("heartbeat_counts_claimable_buckets", StepsTheClock),
        ("lost_bucket_disappears_from_heartbeat", StepsTheClock),
        ("heartbeat_changes_no_bucket", StepsTheClock),
        ("claim_needs_a_live_session", StepsTheClock),
        ("claim_never_takes_a_live_lease", StepsTheClock),
        ("claim_takes_expired_leases", StepsTheClock),
        ("a_deferred_claim_takes_only_unowned_buckets", StepsTheClock),
        (
            "a_takeover_within_a_bound_checks_the_store_clock",
            StepsTheClock,
        ),
        ("claim_does_not_extend_the_session", StepsTheClock),
        ("renewal_keeps_tokens", StepsTheClock),
        (
            "release_without_live_session_releases_nothing",
            StepsTheClock,
        ),
        ("leave_is_idempotent", StepsTheClock),
        ("tokens_strictly_increase_across_owners", StepsTheClock),
        (
            "is_current_rejects_dead_sessions_and_released_buckets",
            StepsTheClock,
        ),
        ("snapshot_reports_states_and_expiries", StepsTheClock),
        ("snapshot_lists_every_member", StepsTheClock),
        ("a_node_renews_every_group_in_one_heartbeat", StepsTheClock),
        ("a_new_session_is_a_member_of_no_group", StepsTheClock),
        ("join_needs_a_live_session", StepsTheClock),
        (
            "join_is_idempotent_and_touches_no_other_group",
            StepsTheClock,
        ),
        (
            "unchanged_is_answered_only_when_nothing_changed",
            StepsTheClock,
        ),
        ("nodes_lists_every_node_with_its_groups", StepsTheClock),
        (
            "a_new_session_removes_dead_nodes_in_no_group",
            StepsTheClock,
        ),
        ("controls_outlive_sessions", StepsTheClock),
        ("quarantined_buckets_are_not_claimable", StepsTheClock),
        ("claims_take_the_buckets_last_held_first", StepsTheClock),
        (
            "a_handed_over_session_is_taken_over_with_its_buckets",
            StepsTheClock,
        ),
        (
            "a_handed_over_session_without_successor_expires",
            StepsTheClock,
        ),
        (
            "history_records_each_tenure_and_how_it_ended",
            StepsTheClock,
        ),
        (
            "every_kind_of_claimable_bucket_under_quarantine_is_skipped",
            StepsTheClock,
        ),
        (
            "every_kind_of_new_bucket_waits_for_the_old_ones",
            StepsTheClock,
        ),
        (
            "is_current_fails_on_an_old_bucket_once_its_owner_expired",
            StepsTheClock,
        ),
        (
            "a_node_sets_its_own_weight_only_under_its_live_session",
            StepsTheClock,
        ),
        (
            "the_walks_over_dead_sessions_take_only_their_buckets",
            StepsTheClock,
        ),
        (
            "a_view_that_counted_a_quarantine_is_given_again_once_it_ends",
            StepsTheClock,
        ),
        ("a_quarantine_keeps_its_reason_while_it_runs", StepsTheClock),
        (
            "a_bucket_keeps_its_load_until_its_next_owner_records_one",
            StepsTheClock,
        ),
    ];

    /// A case added to the suite is run here or excluded with its reason, never missed.
    #[test]
    fn every_case_runs_in_lease_mode_or_is_excluded_with_its_reason() {
        let cases = lease_testing::conformance::CASES;
        let accounted: Vec<&str> = CONFORMANCE_CASES_RUN
            .iter()
            .copied()
            .chain(EXCLUDED.iter().map(|&(case, _)| case))
            .collect();
        let missing: Vec<&&str> = cases.iter().filter(|c| !accounted.contains(c)).collect();
        let unknown: Vec<&&str> = accounted.iter().filter(|c| !cases.contains(c)).collect();
        let twice: Vec<&&str> = accounted
            .iter()
            .enumerate()
            .filter(|&(i, c)| accounted[..i].contains(c))
            .map(|(_, c)| c)
            .collect();
        assert!(
            missing.is_empty() && unknown.is_empty() && twice.is_empty(),
            "cases neither run in lease mode nor excluded: {missing:?}; not in the suite: \
             {unknown:?}; run or excluded twice: {twice:?}"
        );
        eprintln!(
            "{} cases run in lease mode, {} excluded",
            CONFORMANCE_CASES_RUN.len(),
            EXCLUDED.len()
        );
    }
}
