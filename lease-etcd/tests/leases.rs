//! Production mode's own rules (sessions on etcd leases), beyond what the runtime suite
//! covers: a node that leaves its last group has no session any more, and a session ends when
//! etcd expires its lease, not before.

mod support;

use std::time::{Duration, Instant};

use lease_core::{
    GroupName, Incarnation, LeaseStore, MemberMetadata, ShardCount, Takeover, Ttl, WorkerId,
};

fn g() -> GroupName {
    GroupName::new("leases").expect("a group name")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_last_group_ends_the_session() {
    let url = support::url();
    let store = lease_etcd::EtcdLeaseStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .ensure_group(&g(), ShardCount::new(4).expect("a count"))
        .await
        .expect("a group");
    let (node, process) = (WorkerId::new(), Incarnation::new());
    let ttl = Ttl::from_secs(30).expect("a ttl");
    let none = MemberMetadata::empty();
    let first = store
        .heartbeat(node, process, ttl, &none, &[])
        .await
        .expect("a heartbeat");
    store.join(&g(), node, first.session).await.expect("a join");
    store
        .leave(&g(), node, Some(first.session))
        .await
        .expect("a leave");
    assert!(
        store
            .nodes()
            .await
            .expect("nodes")
            .nodes
            .iter()
            .all(|n| n.node != node),
        "the node's record is gone"
    );
    // Its liveness key went with it (not left on the 30 s lease until it runs out)...
    let mut client = etcd_client::Client::connect(&url.endpoints, None)
        .await
        .expect("a client");
    let live = client
        .get(lease_etcd::keys::Keys::new(&url.prefix).live(node), None)
        .await
        .expect("a read");
    assert!(live.kvs().is_empty(), "the liveness key is deleted");
    // ...and the same process's next heartbeat starts a new session.
    let next = store
        .heartbeat(node, process, ttl, &none, &[])
        .await
        .expect("a heartbeat");
    assert!(next.new_session);
    assert_ne!(next.session, first.session);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_etcd_expires_its_lease() {
    let store = support::on_leases().await;
    store
        .ensure_group(&g(), ShardCount::new(2).expect("a count"))
        .await
        .expect("a group");
    let none = MemberMetadata::empty();
    let ttl = Ttl::from_secs(1).expect("a ttl");
    let (a, b) = (WorkerId::new(), WorkerId::new());
    let sa = store
        .heartbeat(a, Incarnation::new(), ttl, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), a, sa).await.expect("a join");
    let held = store
        .claim(&g(), a, sa, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    assert_eq!(held.len(), 2);
    let last_renewal = Instant::now();

    let b_process = Incarnation::new();
    let long = Ttl::from_secs(30).expect("a ttl");
    let sb = store
        .heartbeat(b, b_process, long, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), b, sb).await.expect("a join");
    // a stops renewing. Its lease lasts at least its ttl from the keep-alive's arrival, and
    // etcd's lessor checks expiries every 500 ms: b takes the buckets between 1 s and 3 s.
    let taken = loop {
        let won = store
            .claim(&g(), b, sb, 2, Takeover::Allowed)
            .await
            .expect("a claim");
        if !won.is_empty() {
            break (won, last_renewal.elapsed());
        }
        assert!(
            last_renewal.elapsed() < Duration::from_secs(5),
            "a's session outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(taken.0.len(), 2);
    assert!(
        taken.1 >= Duration::from_secs(1),
        "taken {:?} after a's last renewal, before its ttl",
        taken.1
    );
    assert!(taken.0.iter().zip(&held).all(|(t, h)| t.token > h.token));
    assert!(
        !store
            .is_current(&g(), held[0].bucket, a, held[0].token)
            .await
            .expect("a check")
    );
}
