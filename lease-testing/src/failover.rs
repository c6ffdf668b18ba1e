//! The contract's "Failover" rules (V1-V4) on a store that a test can fail over to a copy of
//! itself: the memory store and the model (Postgres runs the same rules on real standbys, in
//! `lease-diesel/tests/failover/`). A copy taken before a write and promoted after it is a
//! failover that lost the write; one taken just before the promotion lost nothing.
//!
//! Run it with [`failover_suite!`](crate::failover_suite).

use std::time::Duration;

use lease_core::{
    Clock, GroupName, Heartbeat, Incarnation, LeaseStore, LogPosition, ManualClock, MemberMetadata,
    NodeId, SessionBound, SessionId, ShardCount, Takeover, Ttl,
};

/// How a test fails a store over.
pub trait Failovers<S> {
    /// A copy of the store as a standby has it.
    type Standby;
    /// The store as a standby has it when its replication stops now.
    fn standby(&self, store: &S) -> Self::Standby;
    /// `standby` promoted: the store's state on the next timeline, what was done since the
    /// copy lost.
    fn fail_over(&self, store: &S, standby: Self::Standby);
}

/// The cases [`failover_suite!`](crate::failover_suite) runs, in order.
pub const CASES: &[&str] = &[
    "a_session_without_a_bound_ends",
    "claims_wait_the_longest_ttl_then_take_above_the_floor",
    "a_session_bounded_before_the_copy_is_kept",
    "a_session_that_wrote_after_the_copy_ends",
    "a_bound_keeps_only_its_own_live_session",
    "a_session_expired_during_the_promotion_is_kept",
    "another_process_is_not_refused_across_a_failover",
];

const SHARDS: u32 = 4;
/// The floor of tokens on the first timeline after the base.
const FLOOR: i64 = (1 << 32) + 1;

fn ttl() -> Ttl {
    Ttl::from_secs(3).expect("a ttl")
}

fn group() -> GroupName {
    GroupName::new("failover").expect("a group name")
}

fn inc(w: NodeId) -> Incarnation {
    Incarnation::from_uuid(w.as_uuid())
}

/// A node of a case: its session and its bound so far.
struct Node {
    id: NodeId,
    session: SessionId,
    bound: Option<SessionBound>,
}

async fn beat<S: LeaseStore>(store: &S, w: NodeId, bound: Option<SessionBound>) -> Heartbeat {
    store
        .heartbeat_with_bound(w, inc(w), ttl(), &MemberMetadata::empty(), &[], bound)
        .await
        .expect("a heartbeat")
}

/// `w`'s position now, as the bound of every write its session made before.
async fn bounded<S: LeaseStore>(store: &S, n: &mut Node) {
    let b = beat(store, n.id, None).await;
    assert_eq!(b.session, n.session, "renewed");
    let position = b
        .position
        .expect("a store that fails over answers positions (H10)");
    n.bound = Some(SessionBound {
        session: n.session,
        position,
    });
}

/// A node that joined the group and claimed `want` buckets, and its bound.
async fn joined<S: LeaseStore>(store: &S, want: u32) -> (Node, Vec<(u32, i64)>) {
    let w = NodeId::new();
    let session = beat(store, w, None).await.session;
    store.join(&group(), w, session).await.expect("a join");
    let won = store
        .claim(&group(), w, session, want, Takeover::Allowed)
        .await
        .expect("a claim");
    let mut n = Node {
        id: w,
        session,
        bound: None,
    };
    bounded(store, &mut n).await;
    (n, won.iter().map(|l| (l.bucket.0, l.token.0)).collect())
}

fn owned(beat: &Heartbeat) -> Vec<(u32, i64)> {
    beat.group(&group())
        .map(|g| g.owned.iter().map(|l| (l.bucket.0, l.token.0)).collect())
        .unwrap_or_default()
}

async fn crossed<S: LeaseStore>(store: &S, w: NodeId) -> Option<String> {
    store
        .nodes()
        .await
        .expect("nodes")
        .nodes
        .into_iter()
        .find(|n| n.node == w)
        .and_then(|n| n.crossed)
}

async fn ensure<S: LeaseStore>(store: &S) {
    store
        .ensure_group(&group(), ShardCount::new(SHARDS).expect("shards"))
        .await
        .expect("ensure_group");
}

/// V1: a heartbeat handing in no bound on a store that failed over starts a new session,
/// however live the old one looks there.
pub async fn a_session_without_a_bound_ends<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, _) = joined(&store, SHARDS).await;
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    clock.advance(Duration::from_millis(100));
    let after = beat(&store, a.id, None).await;
    assert!(after.new_session && after.session != a.session, "{after:?}");
    assert!(
        !after.is_member(&group()),
        "a new session is a member of no group"
    );
    assert_eq!(
        crossed(&store, a.id).await.as_deref(),
        Some("ended: its writes had no bound")
    );
}

/// V2, V3: no claim takes anything before a heartbeat ran on the new timeline, nor until the
/// longest ttl of the group's members has passed since; then claims take what is claimable
/// with tokens at or above the timeline's floor.
pub async fn claims_wait_the_longest_ttl_then_take_above_the_floor<
    S: LeaseStore,
    F: Failovers<S>,
>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, _) = joined(&store, 1).await;
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    let take = |s: SessionId| {
        let store = &store;
        async move {
            store
                .claim(&group(), a.id, s, SHARDS, Takeover::Allowed)
                .await
                .expect("a claim")
        }
    };
    assert!(
        take(a.session).await.is_empty(),
        "before any heartbeat there"
    );
    let kept = beat(&store, a.id, a.bound).await;
    assert_eq!(kept.session, a.session, "kept (V4)");
    let first_seen = clock.now();
    clock.set(first_seen + chrono::Duration::milliseconds(2_999));
    beat(&store, a.id, None).await;
    assert!(take(a.session).await.is_empty(), "within the quiet period");
    clock.set(first_seen + chrono::Duration::milliseconds(3_000));
    beat(&store, a.id, None).await;
    let won = take(a.session).await;
    assert_eq!(
        won.len(),
        SHARDS as usize - 1,
        "the rest, once the ttl passed"
    );
    assert!(won.iter().all(|l| l.token.0 >= FLOOR), "{won:?}");
}

/// V4: a session whose writes were all in the copy the store failed over to is kept, with
/// its memberships, buckets and tokens.
pub async fn a_session_bounded_before_the_copy_is_kept<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, won) = joined(&store, 2).await;
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    clock.advance(Duration::from_millis(100));
    let after = beat(&store, a.id, a.bound).await;
    assert!(
        !after.new_session && after.session == a.session,
        "{after:?}"
    );
    assert_eq!(owned(&after), won, "its buckets and tokens");
    assert_eq!(crossed(&store, a.id).await.as_deref(), Some("kept"));
    let position = after.position.expect("a position");
    assert!(position.timeline > a.bound.map_or(0, |b| b.position.timeline));
    // Renewed on the new timeline from now on, as any session.
    let next = beat(&store, a.id, None).await;
    assert!(!next.new_session && next.session == a.session);
}

/// V4: a session that wrote after the copy was taken (a claim the new store lacks), handing in
/// the bound of that write, ends; its lost claim's bucket is unowned there.
pub async fn a_session_that_wrote_after_the_copy_ends<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (mut a, _) = joined(&store, 1).await;
    let (b, b_won) = joined(&store, 1).await;
    let copy = f.standby(&store);
    let lost = store
        .claim(&group(), a.id, a.session, 1, Takeover::Allowed)
        .await
        .expect("a claim the copy lacks");
    assert_eq!(lost.len(), 1);
    bounded(&store, &mut a).await;
    f.fail_over(&store, copy);
    clock.advance(Duration::from_millis(100));
    let a_after = beat(&store, a.id, a.bound).await;
    assert!(
        a_after.new_session,
        "kept with a write after the switch point"
    );
    assert_eq!(
        crossed(&store, a.id).await.as_deref(),
        Some("ended: writes after the switch point")
    );
    let b_after = beat(&store, b.id, b.bound).await;
    assert!(!b_after.new_session, "b wrote nothing after the copy");
    assert_eq!(owned(&b_after), b_won);
    let snap = store.snapshot(&group()).await.expect("a snapshot");
    let lost_bucket = snap.buckets[lost[0].bucket.0 as usize].owner;
    assert_eq!(lost_bucket, None, "the lost claim's bucket");
}

/// V4: the bound keeps only the session it names, of the caller's incarnation, live (or
/// expired less than its ttl after the timeline's first heartbeat), with a position on the
/// timeline the store was promoted from.
pub async fn a_bound_keeps_only_its_own_live_session<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, _) = joined(&store, 0).await;
    let (b, _) = joined(&store, 0).await;
    let (c, _) = joined(&store, 0).await;
    // d's session runs on a short ttl and expires more than its ttl after the first heartbeat
    // on the new timeline (a's, below).
    let short = Ttl::from_millis(500).expect("a ttl");
    let none = MemberMetadata::empty();
    let d = short_lived(&store, short).await;
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    let bound = |n: &Node| n.bound.expect("a bound");
    let other_session = SessionBound {
        session: SessionId::new(),
        ..bound(&a)
    };
    assert!(beat(&store, a.id, Some(other_session)).await.new_session);
    clock.advance(Duration::from_millis(500));
    let d_after = store
        .heartbeat_with_bound(d.id, inc(d.id), short, &none, &[], d.bound)
        .await
        .expect("d's heartbeat");
    assert!(
        d_after.new_session,
        "a session expired past its ttl after the failover kept"
    );
    assert_eq!(
        crossed(&store, d.id).await.as_deref(),
        Some("ended: expired")
    );
    assert_eq!(
        crossed(&store, a.id).await.as_deref(),
        Some("ended: the bound was of another session")
    );
    let on_the_new_timeline = SessionBound {
        position: LogPosition {
            timeline: bound(&b).position.timeline + 1,
            ..bound(&b).position
        },
        ..bound(&b)
    };
    assert!(
        beat(&store, b.id, Some(on_the_new_timeline))
            .await
            .new_session
    );
    assert!(
        crossed(&store, b.id)
            .await
            .is_some_and(|c| c.starts_with("ended: its writes were on timeline")),
    );
    let other_process = store
        .heartbeat_with_bound(c.id, Incarnation::new(), ttl(), &none, &[], c.bound)
        .await
        .expect("another process's heartbeat");
    assert!(
        other_process.new_session,
        "another process kept c's session"
    );
    assert_eq!(
        crossed(&store, c.id).await.as_deref(),
        Some("ended: another process")
    );
}

/// A member of the group on a short ttl, and its bound.
async fn short_lived<S: LeaseStore>(store: &S, short: Ttl) -> Node {
    let w = NodeId::new();
    let none = MemberMetadata::empty();
    let session = store
        .heartbeat(w, inc(w), short, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&group(), w, session).await.expect("a join");
    let position = store
        .heartbeat(w, inc(w), short, &none, &[])
        .await
        .expect("a heartbeat")
        .position
        .expect("a position");
    Node {
        id: w,
        session,
        bound: Some(SessionBound { session, position }),
    }
}

/// V4: a session that expired on the new store during the promotion, less than its ttl
/// before the timeline's first heartbeat there, is kept when its holder hands in its bound
/// (which a holder does only while it trusts its session): it outlived the old store, and no
/// claim takes anything before the quiet period is over. Meanwhile other nodes' heartbeats
/// do not remove its memberships (H3).
pub async fn a_session_expired_during_the_promotion_is_kept<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, _) = joined(&store, 1).await;
    let short = Ttl::from_millis(500).expect("a ttl");
    let mut d = short_lived(&store, short).await;
    let won = store
        .claim(&group(), d.id, d.session, 1, Takeover::Allowed)
        .await
        .expect("d claims");
    let position = store
        .heartbeat(d.id, inc(d.id), short, &MemberMetadata::empty(), &[])
        .await
        .expect("d's heartbeat")
        .position
        .expect("a position");
    d.bound = Some(SessionBound {
        session: d.session,
        position,
    });
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    clock.advance(Duration::from_millis(600));
    // a's heartbeat on the new timeline: the first; d is dead by its row, and stays a member.
    let a_after = beat(&store, a.id, a.bound).await;
    assert!(!a_after.new_session);
    clock.advance(Duration::from_millis(100));
    let a_again = beat(&store, a.id, None).await;
    assert!(!a_again.new_session);
    let d_after = store
        .heartbeat_with_bound(
            d.id,
            inc(d.id),
            short,
            &MemberMetadata::empty(),
            &[],
            d.bound,
        )
        .await
        .expect("d's heartbeat");
    assert!(
        !d_after.new_session && d_after.session == d.session,
        "a session expired during the promotion ended: {d_after:?}"
    );
    assert_eq!(
        owned(&d_after),
        won.iter()
            .map(|l| (l.bucket.0, l.token.0))
            .collect::<Vec<_>>(),
        "its memberships and buckets"
    );
    assert_eq!(crossed(&store, d.id).await.as_deref(), Some("kept"));
}

/// H7 holds on one timeline: another process with a node id whose live session is of an
/// earlier timeline starts a new session (V1) instead of being refused.
pub async fn another_process_is_not_refused_across_a_failover<S: LeaseStore, F: Failovers<S>>(
    store: S,
    clock: ManualClock,
    f: F,
) {
    ensure(&store).await;
    let (a, _) = joined(&store, 1).await;
    let none = MemberMetadata::empty();
    let refused = store
        .heartbeat(a.id, Incarnation::new(), ttl(), &none, &[])
        .await;
    assert!(refused.is_err(), "H7 on one timeline");
    let copy = f.standby(&store);
    f.fail_over(&store, copy);
    clock.advance(Duration::from_millis(100));
    let after = store
        .heartbeat(a.id, Incarnation::new(), ttl(), &none, &[])
        .await
        .expect("another process's heartbeat after the failover");
    assert!(after.new_session);
}

/// Run every case of [`CASES`] against a store built by `$make` (as for
/// [`conformance_suite!`](crate::conformance_suite)) and failed over by `$failovers`, an
/// expression of a type implementing [`Failovers`] for the store.
#[macro_export]
macro_rules! failover_suite {
    ($make:expr, $failovers:expr) => {
        $crate::__failover_tests!($make, $failovers;
            a_session_without_a_bound_ends,
            claims_wait_the_longest_ttl_then_take_above_the_floor,
            a_session_bounded_before_the_copy_is_kept,
            a_session_that_wrote_after_the_copy_ends,
            a_bound_keeps_only_its_own_live_session,
            a_session_expired_during_the_promotion_is_kept,
            another_process_is_not_refused_across_a_failover,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __failover_tests {
    ($make:expr, $failovers:expr; $($case:ident),+ $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let clock = $crate::__private::ManualClock::new();
                let store = ($make)(clock.clone()).await;
                $crate::failover::$case(store, clock, $failovers).await;
            }
        )+

        #[test]
        fn failover_suite_runs_every_case() {
            let generated: &[&str] = &[$(stringify!($case)),+];
            assert_eq!(generated, $crate::failover::CASES);
        }
    };
}
