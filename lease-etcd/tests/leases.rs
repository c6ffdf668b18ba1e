//! Production mode's own rules (sessions on etcd leases), beyond what the runtime suite
//! covers: a node that leaves its last group has no session any more; a session ends when
//! etcd expires its lease, not before, even for a ttl that is not a whole number of seconds;
//! a session is live exactly while its liveness key is on a lease (renewed past the expiry
//! its record was written with, it lives; its lease revoked, it is over at once); a
//! successor's session is on a lease of its own ttl; a mass death is cleaned up in batches.

mod support;

use std::time::{Duration, Instant};

use lease_core::{
    AdminStore, GroupName, GroupStamp, Incarnation, MemberMetadata, NodeId, ShardCount, Takeover,
    Ttl, WorkerStore,
};
use lease_etcd::EtcdUrl;

fn g() -> GroupName {
    GroupName::new("leases").expect("a group name")
}

/// Every test's start: a store on etcd leases, on a prefix of its own on the shared cluster,
/// holding the group [`g`] of `shards` buckets; and its URL, for a plain [`client`].
async fn with_group(shards: u32) -> (EtcdUrl, lease_etcd::EtcdLeaseStore) {
    let url = support::url();
    let store = lease_etcd::EtcdLeaseStore::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    store
        .ensure_group(&g(), ShardCount::new(shards).expect("a count"))
        .await
        .expect("a group");
    (url, store)
}

/// A plain client of the shared cluster, to look at what the store wrote.
async fn client(url: &EtcdUrl) -> etcd_client::Client {
    etcd_client::Client::connect(&url.endpoints, None)
        .await
        .expect("a client")
}

/// The etcd lease `node`'s liveness key is attached to.
async fn live_lease(client: &mut etcd_client::Client, url: &EtcdUrl, node: NodeId) -> i64 {
    let key = lease_etcd::keys::Keys::new(&url.prefix).live(node);
    let read = client.get(key, None).await.expect("a read");
    read.kvs()
        .first()
        .map(etcd_client::KeyValue::lease)
        .expect("the liveness key")
}

/// How long after a lease's end etcd may take to revoke it: its lessor looks for expired
/// leases every 500 ms and revokes them through Raft; the rest is for a loaded machine.
const REVOKE_SLACK: Duration = Duration::from_secs(2);

/// `b` claims both buckets of the group every 50 ms until it takes them from a session on a
/// lease of `granted` seconds granted after `sent`: what it took, and when (since `sent`).
/// Fails once that lease should have been revoked for [`REVOKE_SLACK`].
async fn taken_from_a_lease_of(
    store: &lease_etcd::EtcdLeaseStore,
    (b, sb): (NodeId, lease_core::SessionId),
    sent: Instant,
    granted: i64,
) -> (Vec<lease_core::Lease>, Duration) {
    let limit = Duration::from_secs(u64::try_from(granted).expect("a ttl")) + REVOKE_SLACK;
    loop {
        let won = store
            .claim(&g(), b, sb, 2, Takeover::Allowed)
            .await
            .expect("a claim");
        if !won.is_empty() {
            return (won, sent.elapsed());
        }
        assert!(
            sent.elapsed() < limit,
            "the session outlived its lease of {granted} s by {REVOKE_SLACK:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ttl etcd granted `lease`, in seconds.
async fn granted(client: &mut etcd_client::Client, lease: i64) -> i64 {
    client
        .lease_time_to_live(lease, None)
        .await
        .expect("a lease")
        .granted_ttl()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leaving_the_last_group_ends_the_session() {
    let (url, store) = with_group(4).await;
    let (node, process) = (NodeId::new(), Incarnation::new());
    let ttl = Ttl::from_secs(30).expect("a ttl");
    let none = MemberMetadata::empty();
    let first = store
        .heartbeat(node, process, ttl, &none, &[])
        .await
        .expect("a heartbeat");
    store.join(&g(), node, first.session).await.expect("a join");
    store
        .leave(&g(), node, first.session)
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
    let mut client = client(&url).await;
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
    let (url, store) = with_group(2).await;
    let none = MemberMetadata::empty();
    // Above etcd's shortest lease (1.5 election timeouts: 1.5 s on the shared cluster), so
    // the lease is the ttl rounded up, not etcd's minimum.
    let ttl = Ttl::from_secs(3).expect("a ttl");
    let (a, b) = (NodeId::new(), NodeId::new());
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
    let mut client = client(&url).await;
    let lease = live_lease(&mut client, &url, a).await;
    let granted = granted(&mut client, lease).await;
    assert_eq!(granted, 3);
    // a stops renewing. Its lease lasts at least its ttl from the grant, and etcd's lessor
    // checks expiries every 500 ms: b takes the buckets between 3 s and about 4 s.
    let taken = taken_from_a_lease_of(&store, (b, sb), sent, granted).await;
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

/// A ttl of 2.5 s is an etcd lease of 3 s, never 2 (which etcd would end while the worker
/// still trusts its session, for up to half a second): the session is not taken before its
/// ttl has run from the moment its heartbeat was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fractional_ttl_is_a_lease_of_the_next_whole_second() {
    let (url, store) = with_group(2).await;
    let none = MemberMetadata::empty();
    // Above etcd's shortest lease on the shared cluster (2 s), so truncating it would give
    // 2 s, not etcd's minimum.
    let ttl = Ttl::new(Duration::from_millis(2_500)).expect("a ttl");
    let (a, b) = (NodeId::new(), NodeId::new());
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
    let mut client = client(&url).await;
    let lease = live_lease(&mut client, &url, a).await;
    assert_eq!(granted(&mut client, lease).await, 3, "2.5 s rounded up");

    let long = Ttl::from_secs(30).expect("a ttl");
    let sb = store
        .heartbeat(b, Incarnation::new(), long, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), b, sb).await.expect("a join");
    // a stops renewing: b takes its buckets once etcd ends the 3 s lease (its lessor looks
    // every 500 ms), never before a's ttl has run.
    let (_, taken) = taken_from_a_lease_of(&store, (b, sb), sent, 3).await;
    assert!(
        taken >= ttl.as_duration(),
        "taken {taken:?} after a's heartbeat was sent, before its ttl of {ttl:?}"
    );
}

/// Liveness is the liveness key, not the expiry the record was written with: a session
/// renewed for longer than its ttl keeps its buckets (the record is not written on renewal,
/// so its stored expiry is long past); a session whose lease is revoked (what etcd does when
/// it expires) is over at once, however long its ttl; a key naming another session is not
/// its liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_live_exactly_while_its_liveness_key_is_on_a_lease() {
    let (url, store) = with_group(2).await;
    let none = MemberMetadata::empty();
    let ttl = Ttl::from_secs(2).expect("a ttl");
    let (a, b) = (NodeId::new(), NodeId::new());
    let a_process = Incarnation::new();
    let started = Instant::now();
    let sa = store
        .heartbeat(a, a_process, ttl, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), a, sa).await.expect("a join");
    let held = store
        .claim(&g(), a, sa, 2, Takeover::Allowed)
        .await
        .expect("a claim");
    assert_eq!(held.len(), 2);
    let long = Ttl::from_secs(30).expect("a ttl");
    let sb = store
        .heartbeat(b, Incarnation::new(), long, &none, &[])
        .await
        .expect("a heartbeat")
        .session;
    store.join(&g(), b, sb).await.expect("a join");

    // a renews every 500 ms until its session has lasted twice its ttl; b tries to take its
    // buckets all along.
    while started.elapsed() < ttl.as_duration() * 2 {
        let beat = store
            .heartbeat(a, a_process, ttl, &none, &[])
            .await
            .expect("a renewal");
        assert_eq!(
            (beat.session, beat.new_session),
            (sa, false),
            "renewed at {:?}",
            started.elapsed()
        );
        let taken = store
            .claim(&g(), b, sb, 2, Takeover::Allowed)
            .await
            .expect("a claim");
        assert!(
            taken.is_empty(),
            "b took {taken:?} from a renewed session at {:?}",
            started.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for l in &held {
        assert!(
            store
                .is_current(&g(), l.bucket, a, l.token)
                .await
                .expect("a check"),
            "{l:?} past the session's first ttl"
        );
    }

    // b's session is long; its lease is revoked, as etcd revokes one that expired.
    let mut client = client(&url).await;
    let lease = live_lease(&mut client, &url, b).await;
    client.lease_revoke(lease).await.expect("a revoke");
    let snap = store.snapshot(&g()).await.expect("a snapshot");
    let b_row = snap
        .members
        .iter()
        .find(|m| m.worker == b)
        .expect("b is still a member");
    assert!(!b_row.live, "a session without its liveness key is over");
    // A liveness key naming another session (not one this store writes: left by another
    // writer, say) keeps nothing alive either.
    let stray = client.lease_grant(30, None).await.expect("a lease").id();
    let key = lease_etcd::keys::Keys::new(&url.prefix).live(b);
    let options = etcd_client::PutOptions::new().with_lease(stray);
    client
        .put(key, uuid::Uuid::new_v4().to_string(), Some(options))
        .await
        .expect("a put");
    let snap = store.snapshot(&g()).await.expect("a snapshot");
    assert!(
        snap.members.iter().any(|m| m.worker == b && !m.live),
        "a liveness key naming another session keeps b's alive"
    );
    let beat = store
        .heartbeat(b, Incarnation::new(), long, &none, &[])
        .await
        .expect("a heartbeat");
    assert!(
        beat.new_session,
        "the next heartbeat starts a new session, even from another process"
    );
}

/// 140 nodes of a group die at once (more than etcd's 128 operations per transaction): the
/// survivor's heartbeats remove them a batch at a time instead of failing, and are not
/// answered unchanged while any is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_death_is_cleaned_up_in_batches() {
    let (_, store) = with_group(4).await;
    let none = MemberMetadata::empty();
    let short = Ttl::from_secs(2).expect("a ttl");
    for _ in 0..140 {
        let node = NodeId::new();
        let session = store
            .heartbeat(node, Incarnation::new(), short, &none, &[])
            .await
            .expect("a heartbeat")
            .session;
        store.join(&g(), node, session).await.expect("a join");
    }
    let (survivor, process) = (NodeId::new(), Incarnation::new());
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
    let (url, store) = with_group(2).await;
    let none = MemberMetadata::empty();
    let node = NodeId::new();
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
    // Neither is a whole number of seconds: each lease is rounded up.
    let keep = Ttl::new(Duration::from_millis(4_500)).expect("a keep");
    store
        .hand_over(node, first, keep)
        .await
        .expect("a hand-over")
        .expect("handed over");
    let mut client = client(&url).await;
    let keep_lease = live_lease(&mut client, &url, node).await;
    assert_eq!(
        granted(&mut client, keep_lease).await,
        5,
        "handed over onto a lease of keep, rounded up"
    );

    let successor_ttl = Ttl::new(Duration::from_millis(29_500)).expect("a ttl");
    let successor = store
        .heartbeat(node, Incarnation::new(), successor_ttl, &none, &[])
        .await
        .expect("the successor's heartbeat");
    assert!(!successor.new_session);
    assert_eq!(successor.session, session);
    let own = live_lease(&mut client, &url, node).await;
    assert_ne!(own, keep_lease);
    assert_eq!(
        granted(&mut client, own).await,
        30,
        "taken over onto a lease of the successor's ttl, rounded up"
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
