//! Sessions: a second process with one node id, and what a new session does to the previous
//! one's joins, weights, counters and dead node rows.

use lease_core::{
    ErrorKind, GroupName, Incarnation, MemberMetadata, NodeId, NodesSnapshot, SessionId,
    ShardCount, StoreError, Takeover, Ttl,
};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, hold_row, wait_server_past};
use crate::members::{SHARDS, count, long, renew};

/// Two processes started at once with one node id: the first one's heartbeat inserted the node
/// row (not committed yet); the second waits for it (its insert conflicts), then judges the
/// committed row under its lock, finds a live session of another incarnation and is refused,
/// writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_one_node_id_waits_then_is_refused() {
    let db = lease_testdb::database().await;
    let mut first = connect(&db.url).await;
    let mut second = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    let w = NodeId::new();
    ops::ensure_group(
        &mut first,
        None,
        &group,
        ShardCount::new(SHARDS).expect("count"),
    )
    .await
    .expect("ensure");
    let meta = MemberMetadata::empty();
    exec(&mut first, "BEGIN").await;
    let started = ops::heartbeat(&mut first, None, w, Incarnation::new(), long(), &meta, &[])
        .await
        .expect("the first process starts a session");
    assert!(started.new_session);
    let pid = backend_pid(&mut second).await;
    let g = group.clone();
    let refused = blocked(&mut admin, pid, async move {
        let result =
            ops::heartbeat(&mut second, None, w, Incarnation::new(), long(), &meta, &[]).await;
        (result, second, g)
    })
    .await;
    exec(&mut first, "COMMIT").await;
    let (result, mut second, group) = refused.await.expect("the second heartbeat");
    match result {
        Err(StoreError::NodeIdInUse { expires_at, .. }) => {
            assert_eq!(expires_at, started.expires_at);
        }
        other => panic!("the second process was not refused: {other:?}"),
    }
    let nodes = ops::nodes(&mut second, None).await.expect("nodes");
    assert_eq!(nodes.nodes.len(), 1);
    assert_eq!(
        nodes.nodes[0].session, started.session,
        "the session was replaced"
    );
    assert_eq!(
        nodes.nodes[0].expires_at, started.expires_at,
        "the refusal renewed it"
    );
    // The second process cannot act under the session either.
    let claim = ops::claim(
        &mut second,
        None,
        &group,
        w,
        SessionId::new(),
        SHARDS,
        Takeover::Allowed,
    )
    .await;
    assert_eq!(
        claim.map_err(|e| e.kind()).err(),
        Some(ErrorKind::SessionExpired)
    );
}

/// A join under a live session, not committed yet, and a heartbeat of the same node after the
/// session's expiry: the heartbeat's new session waits for the join (the join holds the node
/// row), and then removes the member row the join committed, reading the members with a
/// snapshot taken once it holds the lock: a new session is a member of no group (H2). A
/// removal on the heartbeat's first snapshot would miss the row, and the new session would be
/// a member of a group it never joined, counted in its fair share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_racing_a_new_session_does_not_survive_it() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut joiner = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, count(SHARDS))
        .await
        .expect("ensure");
    let a = NodeId::new();
    let first = renew(
        &mut admin,
        a,
        Ttl::from_secs(2).expect("ttl"),
        &[],
        "a starts",
    )
    .await;
    exec(&mut joiner, "BEGIN").await;
    ops::join(&mut joiner, None, &group, a, first.session)
        .await
        .expect("a joins, not committed yet");
    wait_server_past(&mut admin, first.expires_at).await;
    let pid = backend_pid(&mut heart).await;
    let renewal = blocked(&mut admin, pid, async move {
        let beat = renew(&mut heart, a, long(), &[], "a's next heartbeat").await;
        (beat, heart)
    })
    .await;
    exec(&mut joiner, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session);
    assert!(
        beat.groups.is_empty() && beat.unchanged.is_empty(),
        "the new session is a member of {:?} {:?}",
        beat.groups,
        beat.unchanged
    );
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.members.is_empty(),
        "the join survived the new session: {:?}",
        snap.members
    );
    let next = renew(&mut admin, a, long(), &[], "a renews").await;
    assert!(next.groups.is_empty(), "{:?}", next.groups);
}

/// A node's own weight (K4) is written under its live session and ordered before any next
/// session of the node: the write share-locks the node row and `lease.control` key-share locks
/// the member row, so a heartbeat that starts a new session once the old one expired (locking
/// the node row, deleting the member rows) waits for it; a weight judged under the old session
/// never commits after the new one began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_written_under_a_session_is_ordered_before_the_next_session() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut writer = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, count(SHARDS))
        .await
        .expect("ensure");
    let a = NodeId::new();
    let first = renew(
        &mut admin,
        a,
        Ttl::from_secs(2).expect("ttl"),
        &[],
        "a starts",
    )
    .await;
    ops::join(&mut admin, None, &group, a, first.session)
        .await
        .expect("a joins");
    exec(&mut writer, "BEGIN").await;
    let weight = lease_core::Weight::new(5).expect("weight");
    assert!(
        ops::set_weight(&mut writer, None, &group, a, first.session, weight)
            .await
            .expect("a sets its weight, not committed yet"),
        "the weight changed"
    );
    wait_server_past(&mut admin, first.expires_at).await;
    let pid = backend_pid(&mut heart).await;
    let renewal = blocked(&mut admin, pid, async move {
        let beat = renew(&mut heart, a, long(), &[], "a's next heartbeat").await;
        (beat, heart)
    })
    .await;
    exec(&mut writer, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session, "the session had expired");
    assert_ne!(beat.session, first.session);
    // The old session is over: its id writes nothing now.
    let late = ops::set_weight(&mut admin, None, &group, a, first.session, weight).await;
    assert!(
        matches!(late, Err(lease_core::StoreError::SessionExpired { .. })),
        "{late:?}"
    );
}

/// A new session moves the change counters of every group the node was in; another node's
/// heartbeat moves them one by one, by bytes, as it removes dead members group after group. The
/// new session takes the counters in that same order, so the two never deadlock: here a
/// transaction holds the first counter (as a heartbeat that moved it would) while the new
/// session waits for it, then takes the second, which the new session must not hold yet. The
/// groups' rows are stored in the other order (made last-first), and the new session's
/// connection plans without index scans, so an unordered update would take the second first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_takes_its_groups_counters_in_the_heartbeats_order() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut holder = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let (first_group, second_group) = (
        GroupName::new("a-first").expect("name"),
        GroupName::new("z-second").expect("name"),
    );
    for g in [&second_group, &first_group] {
        ops::ensure_group(&mut admin, None, g, count(SHARDS))
            .await
            .expect("ensure");
    }
    let a = NodeId::new();
    let short = Ttl::from_secs(2).expect("ttl");
    let first = renew(&mut admin, a, short, &[], "a starts").await;
    for g in [&second_group, &first_group] {
        ops::join(&mut admin, None, g, a, first.session)
            .await
            .expect("a joins");
    }
    wait_server_past(&mut admin, first.expires_at).await;
    exec(
        &mut holder,
        "BEGIN; UPDATE lease.group_changes SET version = version WHERE group_name = 'a-first'",
    )
    .await;
    exec(
        &mut heart,
        "SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off",
    )
    .await;
    let pid = backend_pid(&mut heart).await;
    let renewal = blocked(&mut admin, pid, async move {
        let beat = renew(&mut heart, a, long(), &[], "a's new session").await;
        (beat, heart)
    })
    .await;
    // Waiting for the first counter, the new session holds the second: this waits for it, and
    // the server (deadlock_timeout) aborts one of the two.
    exec(
        &mut holder,
        "SET LOCAL lock_timeout = '5s'; \
         UPDATE lease.group_changes SET version = version WHERE group_name = 'z-second'",
    )
    .await;
    exec(&mut holder, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session, "a's heartbeat after its expiry");
    let snap = ops::snapshot(&mut admin, None, &second_group)
        .await
        .expect("snapshot");
    assert!(snap.members.is_empty(), "{:?}", snap.members);
}

/// H9: a new session removes dead nodes in no group, skipping a row another transaction holds
/// (here as a claimer judging that node's buckets does): it neither waits for the holder nor
/// removes the row under it, and a later new session removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_skips_a_dead_node_row_another_transaction_holds() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut holder = connect(&db.url).await;
    let mut starter = connect(&db.url).await;
    let gone = NodeId::new();
    let first = renew(
        &mut admin,
        gone,
        Ttl::from_secs(1).expect("ttl"),
        &[],
        "a node",
    )
    .await;
    wait_server_past(&mut admin, first.expires_at).await;
    hold_row(&mut holder, "lease.nodes", "node_id", gone, "FOR SHARE").await;
    exec(&mut starter, "SET lock_timeout = '5s'").await;
    let started = renew(&mut starter, NodeId::new(), long(), &[], "a new node").await;
    assert!(started.new_session);
    let listed = |s: &NodesSnapshot| s.nodes.iter().any(|n| n.node == gone);
    assert!(
        listed(&ops::nodes(&mut admin, None).await.expect("nodes")),
        "a held row was removed"
    );
    exec(&mut holder, "COMMIT").await;
    renew(&mut starter, NodeId::new(), long(), &[], "another new node").await;
    assert!(
        !listed(&ops::nodes(&mut admin, None).await.expect("nodes")),
        "a dead node in no group outlived a new session"
    );
}
