//! The whole conformance suite on Postgres, each case on a database of its own, with the
//! suite's manual clock injected as the store's client clock, and the resize contract's cases;
//! and the wake-ups of operators' controls, which the suite does not check.

use lease_core::ManualClock;
use lease_diesel::PgLeaseStore;

lease_testing::conformance_suite!(|clock: ManualClock| async move {
    let db = lease_testdb::database().await;
    PgLeaseStore::builder(db.url)
        .max_connections(12)
        .build()
        .expect("a store on the test database")
        .with_client_clock(clock)
});

mod resize {
    use super::*;

    lease_testing::resize_suite!(|clock: ManualClock| async move {
        let db = lease_testdb::database().await;
        PgLeaseStore::builder(db.url)
            .max_connections(12)
            .build()
            .expect("a store on the test database")
            .with_client_clock(clock)
    });
}

/// K3, Q3 on Postgres's change feed (`NOTIFY 'C'`, as `Change::Controlled`): a control that
/// changed a value and a quarantine set or lifted wake the group's members; a control setting
/// the value stored and a lift of a bucket not under quarantine send nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_and_quarantines_wake_the_group() {
    use std::time::Duration;

    use lease_core::{
        AdminStore, Bucket, Change, ChangeFeed, GroupName, Incarnation, MemberControl,
        MemberMetadata, NodeId, QuarantineFor, ShardCount, Ttl, Weight, WorkerStore,
    };

    async fn next(feed: &mut ChangeFeed, what: &str) -> Change {
        tokio::time::timeout(Duration::from_secs(10), feed.recv())
            .await
            .unwrap_or_else(|_| panic!("no change after {what}"))
            .unwrap_or_else(|| panic!("the feed ended before {what}"))
    }

    let db = lease_testdb::database().await;
    let store = PgLeaseStore::connect(db.url).expect("a store");
    let g = GroupName::new("woken").expect("name");
    store
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure");
    let node = NodeId::new();
    let ttl = Ttl::from_secs(30).expect("ttl");
    let beat = store
        .heartbeat(node, Incarnation::new(), ttl, &MemberMetadata::empty(), &[])
        .await
        .expect("a session");
    store.join(&g, node, beat.session).await.expect("join");
    let mut feed = store.changes(&g).await.expect("changes").expect("a feed");
    let two = MemberControl::Weight(Weight::new(2).expect("weight"));
    store.control(&g, node, two).await.expect("control");
    assert_eq!(next(&mut feed, "a weight set").await, Change::Controlled);
    store.control(&g, node, two).await.expect("control");
    store.quarantine(&g, Bucket(0), None).await.expect("lift");
    let minute = QuarantineFor::new(Duration::from_secs(60)).ok();
    store
        .quarantine(&g, Bucket(0), minute)
        .await
        .expect("quarantine");
    assert_eq!(
        next(&mut feed, "a quarantine set").await,
        Change::Controlled
    );
    store.quarantine(&g, Bucket(0), None).await.expect("lift");
    assert_eq!(next(&mut feed, "a lift").await, Change::Controlled);
    store.evict(&g, node).await.expect("leave");
    assert_eq!(
        next(&mut feed, "a leave").await,
        Change::Left(node),
        "one change per control that changed something: the same weight and the lift of a \
         bucket not under quarantine sent nothing"
    );
}
