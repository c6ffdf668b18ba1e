//! Hand-over (HO1-HO3): a hand-over against the clock, and renewals and successors waiting
//! for a hand-over's transaction.

use diesel_async::AsyncPgConnection;
use lease_core::{ErrorKind, Incarnation, MemberMetadata, NodeId, NodesSnapshot, Takeover, Ttl};
use lease_diesel::ops;

use crate::duel::{
    backend_pid, blocked, blocked_by, blocked_by_or_done, connect, exec, flag, hold_row, pids,
    wait_server_past,
};
use crate::members::{Beat, SHARDS, assert_sole_owner, long, renew, setup, short, stamps};

/// The incarnation [`renew`] heartbeats `worker` as: the process holding its session.
fn process_of(worker: NodeId) -> Incarnation {
    Incarnation::from_uuid(worker.as_uuid())
}

/// `node`'s row as `nodes()` lists it.
async fn node_info(conn: &mut AsyncPgConnection, node: NodeId) -> lease_core::NodeInfo {
    let listed: NodesSnapshot = ops::nodes(conn, None).await.expect("nodes");
    listed
        .nodes
        .into_iter()
        .find(|n| n.node == node)
        .expect("the node is listed")
}

/// A hand-over that waited for the node row (which a claimer's share lock does not hold off)
/// until past the session's expiry, while a claimer judged the session dead and took its
/// buckets, must hand nothing over (HO1: only a live session): `lease.hand_over` reads the
/// clock once it holds the row's lock. On a clock read before the wait it would mark a
/// session handed over, live to `nodes()` and to its successor, whose buckets another node
/// now holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_waited_for_the_node_row_past_its_expiry_hands_nothing_over() {
    let s = setup(Ttl::from_secs(3).expect("ttl")).await;
    let mut admin = connect(&s.url).await;
    let mut gate = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
    hold_row(&mut gate, "lease.nodes", "node_id", s.a, "FOR SHARE").await;
    let pid = backend_pid(&mut handing).await;
    let a = s.a;
    let hand_over = blocked(&mut admin, pid, async move {
        let kept = ops::hand_over(&mut handing, None, a, process_of(a), long()).await;
        (kept, handing)
    })
    .await;
    // The precondition of the race: the hand-over began before the expiry.
    assert!(
        flag(
            &mut admin,
            "SELECT clock_timestamp() < $1 AS yes",
            Some(s.first.expires_at)
        )
        .await,
        "the hand-over started after the expiry; the race was not set up"
    );
    wait_server_past(&mut admin, s.first.expires_at).await;
    let taken = ops::claim(
        &mut claimer,
        None,
        &s.group,
        s.b,
        s.b_session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    assert_eq!(taken.len(), SHARDS as usize, "b did not take a's buckets");
    exec(&mut gate, "COMMIT").await;
    let (kept, mut handing) = hand_over.await.expect("the hand-over task");
    assert_eq!(
        kept.expect("the hand-over"),
        None,
        "a session dead before the hand-over held its row was handed over"
    );
    let info = node_info(&mut handing, s.a).await;
    assert!(!info.handed_over && !info.live, "{info:?}");
    // Its successor starts afresh, owning nothing.
    let next = ops::heartbeat(
        &mut handing,
        None,
        s.a,
        Incarnation::new(),
        long(),
        &MemberMetadata::empty(),
        &[],
    )
    .await
    .expect("the successor's heartbeat");
    assert!(next.new_session, "the successor took over a dead session");
    assert_sole_owner(&s, s.b).await;
}

/// The process that handed its session over renews it (a retried heartbeat) while the
/// hand-over's transaction holds the node row: the renewal waits, and once the hand-over
/// commits it takes the session over as any heartbeat after a hand-over does (HO3): the same
/// session, no longer handed over, expiring a ttl after the renewal. The renewal read the
/// node's groups and counters before it waited (the hand-over moved them), so only
/// `NOT n.handed_over`, checked again on the row's new version, sends it to the take-over;
/// without it the renewal would extend the session and leave it marked handed over, which no
/// order of the two calls gives (another process could then take over a session its holder
/// just renewed). Here the steady renewal (`STEADY_RENEWAL`, stamps handed in), which finds
/// nothing to renew and falls to `lease.heartbeat`, whose renewal must skip the row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_renewal_waiting_for_a_hand_over_takes_the_session_over() {
    renewal_waits_for_a_hand_over(true).await;
}

/// The same race for the full heartbeat's renewal (`lease.heartbeat`, no stamps handed in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_waiting_for_a_hand_over_takes_the_session_over() {
    renewal_waits_for_a_hand_over(false).await;
}

async fn renewal_waits_for_a_hand_over(steady: bool) {
    let s = setup(long()).await;
    let mut admin = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut renewal = connect(&s.url).await;
    let seen = if steady {
        stamps(&renew(&mut renewal, s.a, long(), &[], "a's views").await)
    } else {
        Vec::new()
    };
    exec(&mut handing, "BEGIN").await;
    let kept = ops::hand_over(&mut handing, None, s.a, process_of(s.a), short())
        .await
        .expect("the hand-over")
        .expect("a's live session is handed over");
    let (handing_pid, renewal_pid) = pids(&mut handing, &mut renewal).await;
    let (group, a) = (s.group.clone(), s.a);
    let late = blocked_by(&mut admin, renewal_pid, handing_pid, async move {
        let beat = renew(&mut renewal, a, long(), &seen, "a's renewal").await;
        (beat, renewal)
    })
    .await;
    exec(&mut handing, "COMMIT").await;
    let (beat, mut renewal) = late.await.expect("the renewal task");
    assert!(!beat.new_session, "the session handed over was not kept");
    assert_eq!(beat.session, s.first.session);
    assert!(
        beat.expires_at > kept,
        "the renewal kept the hand-over's expiry"
    );
    let info = node_info(&mut renewal, s.a).await;
    assert!(
        !info.handed_over,
        "a session renewed after its hand-over is still marked handed over: {info:?}"
    );
    assert_eq!(info.expires_at, beat.expires_at);
    assert_eq!(Beat::of(&beat, &group).owned.len(), SHARDS as usize);
    // It is the renewing process's again: another process is refused (H7).
    let second = ops::heartbeat(
        &mut renewal,
        None,
        s.a,
        Incarnation::new(),
        long(),
        &MemberMetadata::empty(),
        &[],
    )
    .await;
    assert_eq!(
        second.map(|b| b.session).map_err(|e| e.kind()),
        Err(ErrorKind::NodeIdInUse),
        "another process took over a session its holder had renewed"
    );
    assert_sole_owner(&s, s.a).await;
}

/// The next process's first heartbeat while the hand-over's transaction holds the node row:
/// it waits, and takes the session over with its buckets once the hand-over commits (HO3),
/// because the slow path judges the row it locked (`FOR UPDATE`), the hand-over's. Judged on
/// the version its snapshot saw (another incarnation's live session, not handed over) it would
/// be refused with `NodeIdInUse` for a session meant for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_waiting_for_a_hand_over_takes_the_session_over() {
    let s = setup(long()).await;
    let mut admin = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut successor = connect(&s.url).await;
    exec(&mut handing, "BEGIN").await;
    ops::hand_over(&mut handing, None, s.a, process_of(s.a), long())
        .await
        .expect("the hand-over")
        .expect("a's live session is handed over");
    let (handing_pid, successor_pid) = pids(&mut handing, &mut successor).await;
    let (group, a) = (s.group.clone(), s.a);
    let next = Incarnation::new();
    // It waits for the hand-over's lock, or (judging an older version of the row) answers
    // at once: then the check below says what it answered.
    let late = blocked_by_or_done(&mut admin, successor_pid, handing_pid, async move {
        let beat = ops::heartbeat(
            &mut successor,
            None,
            a,
            next,
            long(),
            &MemberMetadata::empty(),
            &[],
        )
        .await;
        (beat, successor)
    })
    .await;
    exec(&mut handing, "COMMIT").await;
    let (beat, mut successor) = late.await.expect("the successor's task");
    let beat = beat.unwrap_or_else(|e| panic!("the successor was not let take over: {e}"));
    assert!(!beat.new_session);
    assert_eq!(beat.session, s.first.session);
    let owned = Beat::of(&beat, &group).owned;
    assert_eq!(
        owned
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>(),
        s.leases
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>()
    );
    let info = node_info(&mut successor, s.a).await;
    assert!(!info.handed_over && info.live, "{info:?}");
    assert_sole_owner(&s, s.a).await;
}
