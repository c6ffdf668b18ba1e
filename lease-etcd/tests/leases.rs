//! Production mode's own rules (sessions on etcd leases), beyond what the runtime suite
//! covers: a node that leaves its last group has no session any more; a session ends when
//! etcd expires its lease, not before; a successor's session is on a lease of its own ttl; a
//! mass death is cleaned up in batches.

mod support;

use std::time::{Duration, Instant};

use lease_core::{
    GroupName, GroupStamp, Incarnation, LeaseStore, MemberMetadata, ShardCount, Takeover, Ttl,
    WorkerId,
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
    // Above etcd's shortest lease (1.5 election timeouts: 1.5 s on the shared cluster), so
    // the lease is the ttl rounded up, not etcd's minimum.
    let ttl = Ttl::from_secs(3).expect("a ttl");
    let (a, b) = (WorkerId::new(), WorkerId::new());
    // The lease is granted after this instant: it cannot end before `sent + ttl`.
    let sent = Instant::now();
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

    let b_process = Incarnation::new();
    let long = Ttl::from_secs(30).expect("a ttl");
    let sb = store
        .heartbeat(b, b_process, long, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), b, sb).await.expect("a join");
    // a stops renewing. Its lease lasts at least its ttl from the grant, and etcd's lessor
    // checks expiries every 500 ms: b takes the buckets between 3 s and about 4 s.
    let taken = loop {
        let won = store
            .claim(&g(), b, sb, 2, Takeover::Allowed)
            .await
            .expect("a claim");
        if !won.is_empty() {
            break (won, sent.elapsed());
        }
        assert!(
            sent.elapsed() < Duration::from_secs(8),
            "a's session outlived its lease"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(taken.0.len(), 2);
    assert!(
        taken.1 >= Duration::from_secs(3),
        "taken {:?} after a's heartbeat was sent, before its ttl",
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

/// 140 nodes of a group die at once (more than etcd's 128 operations per transaction): the
/// survivor's heartbeats remove them a batch at a time instead of failing, and are not
/// answered unchanged while any is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_death_is_cleaned_up_in_batches() {
    let store = support::on_leases().await;
    store
        .ensure_group(&g(), ShardCount::new(4).expect("a count"))
        .await
        .expect("a group");
    let none = MemberMetadata::empty();
    let short = Ttl::from_secs(2).expect("a ttl");
    for _ in 0..140 {
        let node = WorkerId::new();
        let session = store
            .heartbeat(node, Incarnation::new(), short, &none, &[])
            .await
            .expect("a heartbeat")
            .session;
        store.join(&g(), node, session).await.expect("a join");
    }
    let (survivor, process) = (WorkerId::new(), Incarnation::new());
    let long = Ttl::from_secs(60).expect("a ttl");
    let session = store
        .heartbeat(survivor, process, long, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), survivor, session).await.expect("a join");
    // Every short session ends (etcd's minimum lease, 2 s here, and its lessor's checks).
    let start = Instant::now();
    loop {
        let snap = store.snapshot(&g()).await.expect("a snapshot");
        if snap.members.iter().filter(|m| m.live).count() == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the sessions end"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut beats = 0;
    let mut seen = Vec::new();
    loop {
        let beat = store
            .heartbeat(survivor, process, long, &none, &seen)
            .await
            .expect("a heartbeat after a mass death");
        beats += 1;
        assert_eq!(
            beat.groups.len(),
            1,
            "a group with dead members left is viewed, not answered unchanged"
        );
        seen = beat
            .groups
            .iter()
            .map(|b| GroupStamp {
                group: b.group.clone(),
                stamp: b.stamp,
            })
            .collect();
        let snap = store.snapshot(&g()).await.expect("a snapshot");
        if snap.members.len() == 1 {
            break;
        }
        assert!(beats < 10, "{} members left", snap.members.len());
    }
    assert!(beats >= 3, "removed in batches: {beats} heartbeats");
}

/// HO1-HO3 on etcd leases: a hand-over moves the session to a lease of `keep`; the successor
/// takes it over onto a lease of its own ttl (not the predecessor's short one, which would
/// end the session under the successor's feet) and the short one is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_s_session_is_on_a_lease_of_its_own_ttl() {
    let url = support::url();
    let store = lease_etcd::EtcdLeaseStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .ensure_group(&g(), ShardCount::new(2).expect("a count"))
        .await
        .expect("a group");
    let none = MemberMetadata::empty();
    let node = WorkerId::new();
    let ttl = Ttl::from_secs(30).expect("a ttl");
    let first = Incarnation::new();
    let session = store
        .heartbeat(node, first, ttl, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), node, session).await.expect("a join");
    let held = store
        .claim(&g(), node, session, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    let keep = Ttl::from_secs(5).expect("a keep");
    store
        .hand_over(node, first, keep)
        .await
        .expect("a hand-over")
        .expect("handed over");
    let mut client = etcd_client::Client::connect(&url.endpoints, None)
        .await
        .expect("a client");
    let live_key = lease_etcd::keys::Keys::new(&url.prefix).live(node);
    let lease_of = |kvs: &[etcd_client::KeyValue]| kvs.first().map(|kv| kv.lease());
    let keep_lease = lease_of(
        client
            .get(live_key.clone(), None)
            .await
            .expect("a read")
            .kvs(),
    )
    .expect("the liveness key");
    let granted = client
        .lease_time_to_live(keep_lease, None)
        .await
        .expect("a lease")
        .granted_ttl();
    assert_eq!(granted, 5, "handed over onto a lease of keep");

    let successor = store
        .heartbeat(node, Incarnation::new(), ttl, &none, &[])
        .await
        .expect("the successor's heartbeat");
    assert!(!successor.new_session);
    assert_eq!(successor.session, session);
    let own = lease_of(client.get(live_key, None).await.expect("a read").kvs())
        .expect("the liveness key");
    assert_ne!(own, keep_lease);
    let own_ttl = client
        .lease_time_to_live(own, None)
        .await
        .expect("a lease")
        .granted_ttl();
    assert_eq!(
        own_ttl, 30,
        "taken over onto a lease of the successor's ttl"
    );
    let old = client
        .lease_time_to_live(keep_lease, None)
        .await
        .expect("an answer")
        .ttl();
    assert!(old <= 0, "the keep lease is revoked");
    for l in &held {
        assert!(
            store
                .is_current(&g(), l.bucket, node, l.token)
                .await
                .expect("a check")
        );
    }
}
