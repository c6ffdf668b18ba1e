//! Claims against each other and against their own snapshot: a claim never takes a bucket
//! claimed after its snapshot, judges its own session again once it holds its row, and walks
//! past rows another claim holds.

use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use lease_core::{Bucket, BucketState, GroupName, NodeId, ShardCount, Takeover};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, hold_row, wait_server_past};
use crate::members::{SHARDS, long, member, setup, short};

/// A bucket claimed by a brand-new session after a claimer's statement took its snapshot
/// must not look claimable to that claimer when it finally locks the row: Postgres re-checks
/// the locked row's new version against the old snapshot, in which the new owner's session
/// does not exist yet. `lease.owner_is_dead` decides on the latest committed state instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_takes_a_bucket_claimed_after_its_snapshot() {
    let s = setup(short()).await;
    let c = NodeId::new();
    let mut admin = connect(&s.url).await;
    let mut gate = connect(&s.url).await;
    let mut late_claimer = connect(&s.url).await;
    let mut other = connect(&s.url).await;

    wait_server_past(&mut admin, s.first.expires_at).await;

    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    hold_row(&mut gate, "lease.members", "node_id", s.b, "FOR UPDATE").await;
    let b_pid = backend_pid(&mut late_claimer).await;
    let (group, b, b_session) = (s.group.clone(), s.b, s.b_session);
    let b_claim = blocked(&mut admin, b_pid, async move {
        ops::claim(
            &mut late_claimer,
            None,
            &group,
            b,
            b_session,
            SHARDS,
            Takeover::Allowed,
        )
        .await
        .expect("b's claim")
    })
    .await;

    // Meanwhile c joins (a session b's snapshot cannot see) and takes every bucket.
    let c_session = member(&mut other, &s.group, c, long(), "c joins")
        .await
        .session;
    let c_won = ops::claim(
        &mut other,
        None,
        &s.group,
        c,
        c_session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("c claims");
    assert_eq!(c_won.len(), SHARDS as usize);

    exec(&mut gate, "COMMIT").await;
    let b_won = b_claim.await.expect("the claim task");
    assert!(
        b_won.is_empty(),
        "b stole buckets c had claimed after b's snapshot: {b_won:?}"
    );
    let mut conn = connect(&s.url).await;
    let snap = ops::snapshot(&mut conn, None, &s.group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.owner == Some(c) && x.state == BucketState::Live)
    );
    for lease in &c_won {
        assert!(
            ops::is_current(&mut conn, None, &s.group, lease.bucket, c, lease.token)
                .await
                .expect("is_current")
        );
    }
}

/// A claim that had to wait for its own node row, locked by a claimer judging the session
/// dead, until after the session expired, claims nothing: liveness is judged again once the
/// row is locked (a locking condition is not re-tested when the row did not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_past_its_expiry_claims_nothing() {
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let mut judge = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    let b = NodeId::new();
    ops::ensure_group(
        &mut conn,
        None,
        &group,
        ShardCount::new(SHARDS).expect("count"),
    )
    .await
    .expect("ensure");
    let joined = member(&mut conn, &group, b, short(), "b joins").await;
    hold_row(&mut judge, "lease.nodes", "node_id", b, "FOR UPDATE").await;
    let pid = backend_pid(&mut conn).await;
    let (g, session) = (group.clone(), joined.session);
    let claim = blocked(&mut admin, pid, async move {
        let result = ops::claim(&mut conn, None, &g, b, session, SHARDS, Takeover::Allowed).await;
        (result, conn)
    })
    .await;
    wait_server_past(&mut admin, joined.expires_at).await;
    exec(&mut judge, "COMMIT").await;
    let (result, mut conn) = claim.await.expect("the claim task");
    match result {
        Err(e) => assert_eq!(e.kind(), lease_core::ErrorKind::SessionExpired, "{e:?}"),
        Ok(won) => panic!("a dead session claimed {won:?}"),
    }
    let snap = ops::snapshot(&mut conn, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.state == BucketState::Unowned && x.token.0 == 0),
        "the expired claim wrote: {:?}",
        snap.buckets
    );
}

/// A worker whose claims start at bucket 0, like every worker of this test.
fn seeded_at_zero() -> NodeId {
    NodeId::from_uuid(uuid::Uuid::from_u128(
        NodeId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
    ))
}

/// Two claims at once, both starting at bucket 0: the second walks past the rows the first
/// holds (not committed yet), without waiting for them, and takes the next claimable ones,
/// both among unowned buckets and among a dead session's; then it waits only for the group's
/// change counter, which every claim that took something moves last. A claim that waited for
/// the rows, or gave up at the first locked one, would fail this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_walk_past_each_others_rows() {
    let db = lease_testdb::database().await;
    let mut first = connect(&db.url).await;
    let mut second = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, ShardCount::new(8).expect("count"))
        .await
        .expect("ensure");
    // A dead worker held buckets 4..8 under a session of one second.
    let dead = seeded_at_zero();
    let gone = member(&mut admin, &group, dead, short(), "the doomed worker joins").await;
    exec(&mut admin, "BEGIN").await;
    let held = ops::claim(
        &mut admin,
        None,
        &group,
        dead,
        gone.session,
        8,
        Takeover::Allowed,
    )
    .await
    .expect("the doomed worker claims");
    assert_eq!(held.len(), 8);
    exec(&mut admin, "COMMIT").await;
    let released = ops::release(
        &mut admin,
        None,
        &group,
        dead,
        gone.session,
        &[Bucket(0), Bucket(1), Bucket(2), Bucket(3)],
    )
    .await
    .expect("release");
    assert_eq!(released.len(), 4);
    let (a, b) = (seeded_at_zero(), seeded_at_zero());
    let sa = member(&mut first, &group, a, long(), "a joins")
        .await
        .session;
    let sb = member(&mut second, &group, b, long(), "b joins")
        .await
        .session;
    wait_server_past(&mut admin, gone.expires_at).await;

    let b_pid = backend_pid(&mut second).await;
    for (round, (want_a, expect_b)) in [(2, vec![2, 3]), (2, vec![6, 7])].into_iter().enumerate() {
        exec(&mut first, "BEGIN").await;
        let taken_a = ops::claim(&mut first, None, &group, a, sa, want_a, Takeover::Allowed)
            .await
            .expect("a claims");
        assert_eq!(taken_a.len(), 2, "round {round}: {taken_a:?}");
        let g = group.clone();
        // b takes its buckets past the rows a holds, and then waits for the one row every claim
        // that took something updates last: the group's change counter, which a holds until
        // it commits. A claim that waited for a's bucket rows would wait on lease.shards.
        let b_claims = blocked(&mut admin, b_pid, async move {
            let taken = ops::claim(&mut second, None, &g, b, sb, 2, Takeover::Allowed).await;
            (taken, second)
        })
        .await;
        assert_eq!(
            row_waited_for(&mut admin, b_pid).await,
            "lease.group_changes",
            "round {round}: b waits for another row than the change counter"
        );
        exec(&mut first, "COMMIT").await;
        let (taken_b, back) = b_claims.await.expect("b's claim task");
        second = back;
        let got: Vec<u32> = taken_b
            .expect("b claims")
            .iter()
            .map(|l| l.bucket.0)
            .collect();
        assert_eq!(got, expect_b, "round {round}: b did not walk past a's rows");
    }
}

/// The table of the row backend `pid` waits for: a backend waiting for a row holds that row's
/// tuple lock while it waits for the transaction that holds the row.
async fn row_waited_for(admin: &mut AsyncPgConnection, pid: i32) -> String {
    #[derive(QueryableByName)]
    struct Relation {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    diesel::sql_query(format!(
        "SELECT l.relation::regclass::text AS name FROM pg_locks l \
          WHERE l.pid = {pid} AND l.locktype = 'tuple' AND l.granted"
    ))
    .get_result::<Relation>(admin)
    .await
    .expect("the row the backend waits for")
    .name
}
