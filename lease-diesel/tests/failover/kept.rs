//! V4: a session is kept across a failover when the bound of its writes it hands in is at or
//! before the promoted server's switch point, and ends otherwise. These tests run on the
//! servers' own clocks (no client clock): the switch point is trusted only against the old
//! primary's heartbeats as its clock wrote them.

use lease_core::{
    AdminStore, BucketState, GroupStamp, Heartbeat, LogPosition, SessionBound, SessionId,
};

use super::*;

/// A store reaching whichever of the two servers takes writes, on the servers' clock.
fn store_on_both_servers(primary: &Cluster, standby: &Cluster) -> PgLeaseStore {
    let url = Cluster::multi_host_url(
        &[standby, primary],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
}

/// Poll `sql` on `cluster` until it answers `t`, at most 10 s.
fn wait_until(cluster: &Cluster, what: &str, sql: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while cluster.psql_in(DB, sql).as_deref() != Ok("t") {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The standby's clock more than a second past its start: a switch point is trusted only if
/// the promoted server ran before the old primary's last heartbeat it replayed, with a
/// second's margin for the two clocks (here one).
fn wait_past_start(standby: &Cluster) {
    wait_until(
        standby,
        "the standby running for over a second",
        "SELECT clock_timestamp() > pg_postmaster_start_time() + interval '1.2 seconds'",
    );
}

/// The standby has replayed the WAL up to `offset`.
fn wait_replayed(standby: &Cluster, offset: u64) {
    wait_until(
        standby,
        "the standby replaying the bounds",
        &format!("SELECT pg_last_wal_replay_lsn() - '0/0'::pg_lsn >= {offset}"),
    );
}

/// How node `w`'s session fared on its first heartbeat after the failover.
fn crossed(cluster: &Cluster, w: NodeId) -> String {
    cluster
        .psql_in(
            DB,
            &format!(
                "SELECT COALESCE(crossed, '') FROM lease.nodes WHERE node_id = '{}'",
                w.as_uuid()
            ),
        )
        .expect("reading the node row")
}

/// A node of the test: its id and session, the leases it won, and its bound.
struct Node {
    id: NodeId,
    session: SessionId,
    won: Vec<(u32, i64)>,
    bound: SessionBound,
}

/// Node `w` joins and claims `want` buckets, then heartbeats: that heartbeat's position is the
/// first after its last write, its bound.
async fn joined_with(store: &PgLeaseStore, g: &GroupName, want: u32) -> Node {
    let w = worker();
    let empty = MemberMetadata::empty();
    let beat = support::beat_as(store, g, w, process(w), ttl(), &empty)
        .await
        .expect("a heartbeat and a join");
    let won = store
        .claim(g, w, beat.session, want, Takeover::Allowed)
        .await
        .expect("a claim");
    Node {
        id: w,
        session: beat.session,
        won: tokens(&won),
        bound: bound_now(store, w, beat.session).await,
    }
}

/// A heartbeat of `w`, and its position as the bound of `session`'s writes so far.
async fn bound_now(store: &PgLeaseStore, w: NodeId, session: SessionId) -> SessionBound {
    let beat = store
        .heartbeat(w, process(w), ttl(), &MemberMetadata::empty(), &[])
        .await
        .expect("a heartbeat");
    assert_eq!(beat.session, session);
    SessionBound {
        session,
        position: beat.position.expect("Postgres gives a position"),
    }
}

/// `w`'s first heartbeat on the promoted server, handing in `bound`.
async fn beat_after(store: &PgLeaseStore, w: NodeId, bound: SessionBound) -> Heartbeat {
    let empty = MemberMetadata::empty();
    until_ok("a heartbeat on the promoted server", || {
        store.heartbeat_with_bound(
            w,
            process(w),
            ttl(),
            &empty,
            &[] as &[GroupStamp],
            Some(bound),
        )
    })
    .await
}

fn owned_in(beat: &Heartbeat, g: &GroupName) -> Vec<(u32, i64)> {
    beat.group(g).map(|v| tokens(&v.owned)).unwrap_or_default()
}

/// A planned switchover (the primary stopped cleanly, the standby promoted): every session
/// that hands in its bound is kept, with its buckets and tokens, and the group keeps every
/// bucket owned; a bound of another session, or on a timeline the new one did not branch
/// from, keeps nothing (V4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_keeps_every_session_that_hands_in_its_bound() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    wait_past_start(&standby);
    let store = store_on_both_servers(&primary, &standby);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = joined_with(&store, &g, 4).await;
    let b = joined_with(&store, &g, 4).await;
    let d = joined_with(&store, &g, 0).await;
    let e = joined_with(&store, &g, 0).await;
    let f = joined_with(&store, &g, 0).await;
    // x: a session of a second that will have expired on the promoted server.
    let x = worker();
    let short = Ttl::from_secs(1).expect("a ttl");
    let empty = MemberMetadata::empty();
    let x_session = support::beat_as(&store, &g, x, process(x), short, &empty)
        .await
        .expect("x joins")
        .session;
    let x_bound = store
        .heartbeat(x, process(x), short, &empty, &[])
        .await
        .expect("x's heartbeat")
        .position
        .map(|position| SessionBound {
            session: x_session,
            position,
        })
        .expect("a position");
    assert_eq!(a.won, [(0, 1), (1, 1), (2, 1), (3, 1)]);
    assert_eq!(b.won, [(4, 1), (5, 1), (6, 1), (7, 1)]);
    assert_eq!(a.bound.position.timeline, 1);

    primary.stop().expect("stopping the primary cleanly");
    standby.promote().expect("promoting the standby");

    // A bound on the new timeline itself: the writes it bounds are not of the parent's
    // history the switch point is on. d's is the first heartbeat there: it records the
    // timeline (and removes no member row: it ends d's session, so it gives no view).
    let wrong_timeline = SessionBound {
        position: LogPosition {
            timeline: 2,
            ..d.bound.position
        },
        ..d.bound
    };
    let after = beat_after(&store, d.id, wrong_timeline).await;
    assert!(after.new_session, "kept on a bound of another timeline");
    assert_eq!(
        crossed(&standby, d.id),
        "ended: its writes were on timeline 2"
    );
    // x, once its session expired there more than its ttl after that first heartbeat: it may
    // have expired on the old primary too, and nothing says its holder still trusts it.
    wait_until(
        &standby,
        "x's session expiring a ttl after the timeline's first heartbeat",
        &format!(
            "SELECT clock_timestamp() > greatest(n.expires_at, e.first_seen + interval '1 second') \
               FROM lease.nodes n, lease.server_epochs e \
              WHERE n.node_id = '{}' AND e.timeline = lease.timeline()",
            x.as_uuid()
        ),
    );
    let after = until_ok("x's heartbeat on the promoted server", || {
        store.heartbeat_with_bound(x, process(x), short, &empty, &[], Some(x_bound))
    })
    .await;
    assert!(after.new_session, "an expired session was kept: {after:?}");
    assert_eq!(crossed(&standby, x), "ended: expired");
    // Another process with f's node id, handing in f's bound.
    let other = Incarnation::new();
    let after = until_ok("a second process's heartbeat", || {
        store.heartbeat_with_bound(f.id, other, ttl(), &empty, &[], Some(f.bound))
    })
    .await;
    assert!(
        after.new_session && after.session != f.session,
        "another process kept f's session: {after:?}"
    );
    assert_eq!(crossed(&standby, f.id), "ended: another process");

    for n in [&a, &b] {
        let after = beat_after(&store, n.id, n.bound).await;
        assert!(
            !after.new_session && after.session == n.session,
            "a session whose writes are all before the switch point ended: {after:?}"
        );
        assert_eq!(owned_in(&after, &g), n.won, "its buckets and tokens");
        assert_eq!(after.position.map(|p| p.timeline), Some(2));
        assert_eq!(crossed(&standby, n.id), "kept");
    }
    // A bound of another session.
    let other = SessionBound {
        session: SessionId::new(),
        ..e.bound
    };
    let after = beat_after(&store, e.id, other).await;
    assert!(after.new_session, "kept on another session's bound");
    assert_eq!(
        crossed(&standby, e.id),
        "ended: the bound was of another session"
    );

    let snapshot = store.snapshot(&g).await.expect("a snapshot");
    let owners: Vec<_> = snapshot
        .buckets
        .iter()
        .map(|i| (i.bucket.0, i.owner, i.token.0, i.state))
        .collect();
    let mut expected: Vec<_> = a
        .won
        .iter()
        .map(|&(bucket, token)| (bucket, Some(a.id), token, BucketState::Live))
        .collect();
    expected.extend(
        b.won
            .iter()
            .map(|&(bucket, token)| (bucket, Some(b.id), token, BucketState::Live)),
    );
    assert_eq!(
        owners, expected,
        "every bucket owned throughout, tokens unchanged"
    );
}

/// Asynchronous replication cut, then writes on the primary alone: a session whose bound is
/// after the promoted server's switch point (it claimed a bucket the standby never received)
/// ends, while one whose writes all reached the standby is kept with its buckets (V4). The
/// lost claim's bucket is unowned on the new server, and claims wait out the quiet period
/// (V2) as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_wrote_after_the_switch_point_ends_and_one_that_did_not_is_kept() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    wait_past_start(&standby);
    let store = store_on_both_servers(&primary, &standby);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = joined_with(&store, &g, 4).await;
    let b = joined_with(&store, &g, 2).await;
    wait_replayed(
        &standby,
        a.bound.position.offset.max(b.bound.position.offset),
    );
    standby.cut_replication().expect("cutting replication");

    // On the primary only: a claims one more bucket, and its next heartbeat bounds it.
    let more = store
        .claim(&g, a.id, a.session, 1, Takeover::Allowed)
        .await
        .expect("a claims on the primary alone");
    assert_eq!(tokens(&more), [(6, 1)]);
    let a_bound = bound_now(&store, a.id, a.session).await;
    assert!(a_bound.position.offset > a.bound.position.offset);

    fail_over(&primary, &standby);

    let a_after = beat_after(&store, a.id, a_bound).await;
    assert!(
        a_after.new_session && a_after.session != a.session,
        "a session with a write after the switch point was kept: {a_after:?}"
    );
    assert_eq!(
        crossed(&standby, a.id),
        "ended: writes after the switch point"
    );
    let b_after = beat_after(&store, b.id, b.bound).await;
    assert!(
        !b_after.new_session && b_after.session == b.session,
        "a session whose writes all reached the standby ended: {b_after:?}"
    );
    assert_eq!(owned_in(&b_after, &g), b.won);
    assert_eq!(crossed(&standby, b.id), "kept");
}

/// A session whose row expired on the promoted server during the promotion, handed in with
/// its bound (by a holder that still trusts it) less than its ttl after the timeline's first
/// heartbeat, is kept with its buckets; the first heartbeat, another node's, left its member
/// row in place though its session looked dead (V4, H3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_expired_during_the_promotion_is_kept() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    wait_past_start(&standby);
    let store = store_on_both_servers(&primary, &standby);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = joined_with(&store, &g, 4).await;
    // r: a member on a 1 s ttl, with a bucket.
    let r = worker();
    let short = Ttl::from_secs(1).expect("a ttl");
    let empty = MemberMetadata::empty();
    let r_session = support::beat_as(&store, &g, r, process(r), short, &empty)
        .await
        .expect("r joins")
        .session;
    let r_won = store
        .claim(&g, r, r_session, 1, Takeover::Allowed)
        .await
        .expect("r claims");
    let r_bound = SessionBound {
        session: r_session,
        position: store
            .heartbeat(r, process(r), short, &empty, &[])
            .await
            .expect("r's heartbeat")
            .position
            .expect("a position"),
    };
    fail_over(&primary, &standby);
    wait_until(
        &standby,
        "r's session expiring on the promoted server",
        &format!(
            "SELECT clock_timestamp() > expires_at FROM lease.nodes WHERE node_id = '{}'",
            r.as_uuid()
        ),
    );
    // a's heartbeat is the first there; it gives a's view, which would remove a dead member.
    let a_after = beat_after(&store, a.id, a.bound).await;
    assert!(!a_after.new_session, "a kept");
    let r_after = store
        .heartbeat_with_bound(r, process(r), short, &empty, &[], Some(r_bound))
        .await
        .expect("r's heartbeat");
    assert!(
        !r_after.new_session && r_after.session == r_session,
        "a session expired during the promotion ended: {r_after:?}"
    );
    assert_eq!(
        owned_in(&r_after, &g),
        tokens(&r_won),
        "its membership and bucket"
    );
    assert_eq!(crossed(&standby, r), "kept");
}

/// A promoted server that crashed and restarted before any heartbeat ran on it answers
/// `pg_last_wal_replay_lsn()` with the end of its crash recovery, past the switch point: the
/// switch point is not trusted, and no session is kept (V4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_server_restarted_before_its_first_heartbeat_keeps_no_session() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    wait_past_start(&standby);
    let store = store_on_both_servers(&primary, &standby);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = joined_with(&store, &g, 4).await;

    fail_over(&primary, &standby);
    // Writes on the new timeline that crash recovery will replay, then the crash.
    standby
        .psql_in(DB, "CREATE TABLE written_after_promotion AS SELECT 1 AS x")
        .expect("a write on the promoted server");
    standby.kill().expect("crashing the promoted server");
    standby.resume().expect("starting it again");

    let after = beat_after(&store, a.id, a.bound).await;
    assert!(
        after.new_session,
        "kept on a switch point read after a restart: {after:?}"
    );
    assert_eq!(crossed(&standby, a.id), "ended: switch point unknown");
    assert_eq!(
        standby
            .psql_in(
                DB,
                "SELECT switch_offset IS NULL FROM lease.server_epochs \
                 WHERE timeline = lease.timeline()"
            )
            .as_deref(),
        Ok("t")
    );
}
