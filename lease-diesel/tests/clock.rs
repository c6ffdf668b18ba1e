//! The database's clock decides expiry (G1; docs/rules.md, "Data model and session rules"),
//! which is what makes a worker's skewed clock harmless.
//!
//! The first test injects a client clock an hour ahead and shows what trusting such a clock
//! would do: it takes live leases. That proves the skew is real and documents the danger the
//! default mode avoids. The second shows the default mode at work: with the server's clock
//! deciding, a second worker cannot take another's live lease nor pass the fencing check for
//! it. It injects no skew, as there is no worker clock to skew in that mode: every statement
//! decides liveness with `COALESCE($t, clock_timestamp())`, `$t` being NULL, so the worker's
//! clock never reaches the decision. That is a property of the statements, which this test
//! relies on but does not observe.

mod support;

use support::{process, tokens};

use std::time::Duration;

use lease_core::{
    AdminStore, Bucket, BucketState, FencingToken, GroupName, Lease, ManualClock, MemberMetadata,
    NodeId, ShardCount, Takeover, Ttl, WorkerStore,
};
use lease_diesel::PgLeaseStore;

const SHARDS: u32 = 8;

fn group() -> GroupName {
    GroupName::new("clock").expect("a valid group name")
}

fn ttl() -> Ttl {
    Ttl::from_secs(30).expect("a valid ttl")
}

/// A store on `url` that decides expiry by the database server's clock (the default).
fn server_clock_store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store on the test database")
}

/// Worker A, on the server's clock, heartbeats (ttl 30 s) and claims all of the group.
async fn a_owns_everything(store: &PgLeaseStore, a: NodeId) -> Vec<Lease> {
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("a valid shard count"))
        .await
        .expect("ensure_group");
    let beat = support::beat_as(store, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("A's heartbeat");
    assert!(beat.new_session);
    let won = store
        .claim(&g, a, beat.session, SHARDS, Takeover::Allowed)
        .await
        .expect("A's claim");
    let expected: Vec<(u32, i64)> = (0..SHARDS).map(|b| (b, 1)).collect();
    assert_eq!(tokens(&won), expected, "A owns every bucket with token 1");
    won
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_client_clock_an_hour_ahead_steals_live_leases() {
    let db = lease_testdb::database().await;
    let g = group();
    let a = NodeId::new();
    let b = NodeId::new();
    let store_a = server_clock_store(&db.url);
    let a_leases = a_owns_everything(&store_a, a).await;

    // B's store is told to trust B's clock, which runs an hour ahead. By that clock A's
    // session (30 s on the server's clock) ended long ago.
    let skew = chrono::Duration::hours(1);
    let store_b = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .build()
        .expect("a store on the test database")
        .with_client_clock(ManualClock::starting_at(chrono::Utc::now() + skew));
    let beat_b = support::beat_as(&store_b, &g, b, process(b), ttl(), &MemberMetadata::empty())
        .await
        .expect("B's heartbeat");
    // The skew is real: B's session was stamped with B's clock, an hour ahead of A's.
    let a_expiry = a_leases[0].expires_at;
    assert!(
        beat_b.expires_at - a_expiry > skew - chrono::Duration::minutes(1),
        "B's session expires at {}, A's at {a_expiry}: the skew did not reach the store",
        beat_b.expires_at
    );
    assert_eq!(beat_b.view.claimable, SHARDS, "to B, A's leases look dead");
    let stolen = store_b
        .claim(&g, b, beat_b.session, SHARDS, Takeover::Allowed)
        .await
        .expect("B's claim");
    let expected: Vec<(u32, i64)> = (0..SHARDS).map(|b| (b, 2)).collect();
    assert_eq!(
        tokens(&stolen),
        expected,
        "trusting a clock an hour ahead, B takes every one of A's live leases"
    );

    // The damage, seen on the server's clock, where A's session still had 30 s to run: B's
    // new session also removed A's member row as dead (H3, judged by B's clock), every bucket
    // is B's, and A's next heartbeat finds its session gone and starts over with nothing.
    let snap = store_a.snapshot(&g).await.expect("snapshot");
    let members: Vec<NodeId> = snap.members.iter().map(|m| m.worker).collect();
    assert_eq!(members, vec![b], "A's membership was removed");
    assert!(
        snap.buckets
            .iter()
            .all(|i| i.owner == Some(b) && i.state == BucketState::Live),
        "every bucket is B's: {:?}",
        snap.buckets
    );
    let beat_a = support::beat_as(&store_a, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("A's renewal");
    assert!(beat_a.new_session, "A's live session was lost");
    assert!(beat_a.owned.is_empty(), "A owns nothing any more");
    for lease in &a_leases {
        assert!(
            !store_a
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current")
        );
    }
}

/// On the server's clock (the default), worker B, through a store and pool of its own, sees A's
/// leases live: it claims none of them, fails the fencing check for each, and A keeps them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_server_clock_a_second_worker_cannot_take_a_live_lease() {
    let db = lease_testdb::database().await;
    let g = group();
    let a = NodeId::new();
    let b = NodeId::new();
    let store_a = server_clock_store(&db.url);
    let a_leases = a_owns_everything(&store_a, a).await;

    // B: another process, another pool, the server's clock.
    let store_b = server_clock_store(&db.url);
    let beat_b = support::beat_as(&store_b, &g, b, process(b), ttl(), &MemberMetadata::empty())
        .await
        .expect("B's heartbeat");
    assert!(beat_b.new_session);
    assert_eq!(
        beat_b.view.claimable, 0,
        "nothing is claimable: A's leases are live"
    );
    let a_load: Vec<(NodeId, u32)> = beat_b
        .view
        .members
        .iter()
        .map(|m| (m.worker, m.owned))
        .collect();
    let mut expected_load = vec![(a, SHARDS), (b, 0)];
    expected_load.sort();
    assert_eq!(a_load, expected_load, "B sees A owning everything");

    let taken = store_b
        .claim(&g, b, beat_b.session, SHARDS, Takeover::Allowed)
        .await
        .expect("B's claim");
    assert!(taken.is_empty(), "B took live leases: {taken:?}");

    for lease in &a_leases {
        assert!(
            store_a
                .is_current(&g, lease.bucket, a, lease.token)
                .await
                .expect("is_current"),
            "A's lease on bucket {} is current",
            lease.bucket
        );
        // And B cannot pass the fencing check for them, with any token.
        for token in [lease.token, FencingToken(lease.token.0 + 1)] {
            assert!(
                !store_b
                    .is_current(&g, lease.bucket, b, token)
                    .await
                    .expect("is_current")
            );
        }
    }
    let beat_a = support::beat_as(&store_a, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("A's renewal");
    assert!(!beat_a.new_session);
    assert_eq!(
        tokens(&beat_a.owned),
        tokens(&a_leases),
        "A keeps everything"
    );

    let snap = store_b.snapshot(&g).await.expect("snapshot");
    for info in &snap.buckets {
        assert_eq!(info.state, BucketState::Live, "{info:?}");
        assert_eq!(info.owner, Some(a), "{info:?}");
        assert_eq!(info.token, FencingToken(1), "{info:?}");
    }
    assert!(
        snap.buckets
            .iter()
            .map(|i| i.bucket)
            .eq((0..SHARDS).map(Bucket))
    );
}
