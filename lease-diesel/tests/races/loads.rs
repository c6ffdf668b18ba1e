//! Races of the loads' publication (P1): it locks the node row as a claim does, and judges
//! the session again once the row is locked.

use lease_core::{Bucket, GroupName, Load, NodeId, ShardCount, Takeover};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, hold_row, wait_server_past};
use crate::members::{SHARDS, member, short};

/// A publication that had to wait for its node row, locked by a claimer judging the session
/// dead, until after the session expired, records nothing: liveness is judged again once the
/// row is locked (a locking condition is not re-tested when the row did not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publication_that_waited_past_its_expiry_records_nothing() {
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
    let won = ops::claim(
        &mut conn,
        None,
        &group,
        b,
        joined.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("claim");
    assert_eq!(won.len(), 2, "{won:?}");
    hold_row(&mut judge, "lease.nodes", "node_id", b, "FOR UPDATE").await;
    let pid = backend_pid(&mut conn).await;
    let (g, session) = (group.clone(), joined.session);
    let loads: Vec<(Bucket, Load)> = won
        .iter()
        .map(|l| (l.bucket, Load::new(5.0).expect("a load")))
        .collect();
    let publication = blocked(&mut admin, pid, async move {
        let result = ops::publish_loads(&mut conn, None, &g, b, session, &loads).await;
        (result, conn)
    })
    .await;
    wait_server_past(&mut admin, joined.expires_at).await;
    exec(&mut judge, "COMMIT").await;
    let (result, mut conn) = publication.await.expect("the publication task");
    match result {
        Err(e) => assert_eq!(e.kind(), lease_core::ErrorKind::SessionExpired, "{e:?}"),
        Ok(n) => panic!("a dead session recorded {n} loads"),
    }
    let snap = ops::snapshot(&mut conn, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets.iter().all(|x| x.load == Load::ZERO),
        "the expired publication wrote: {:?}",
        snap.buckets.iter().map(|x| x.load).collect::<Vec<_>>()
    );
    assert!(
        snap.members.iter().all(|m| m.load == 0),
        "the expired publication wrote the member's work"
    );
}
