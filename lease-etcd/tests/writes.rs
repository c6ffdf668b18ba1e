//! Calls the contract says write nothing write nothing on etcd either: the store writes back
//! whatever the rule changed, so a rule that tidies its state before deciding there is
//! nothing to do would write (and wake every watcher).

mod support;

use std::time::Duration;

use lease_core::{
    AdminStore, Bucket, GroupName, ManualClock, QuarantineFor, ShardCount, WorkerStore,
};
use lease_etcd::keys::Keys;

/// Q3: lifting a bucket not under quarantine writes nothing, also when another bucket's
/// quarantine has ended meanwhile (the rule drops ended quarantines when it writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifting_a_bucket_not_under_quarantine_writes_nothing() {
    let url = support::url();
    let clock = ManualClock::new();
    let store = lease_etcd::EtcdLeaseStore::connect_with_clock(&url, clock.clone())
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let group = GroupName::new("writes").expect("a group name");
    store
        .ensure_group(&group, ShardCount::new(4).expect("a count"))
        .await
        .expect("a group");
    let second = QuarantineFor::new(Duration::from_secs(1)).expect("a duration");
    store
        .quarantine(&group, Bucket(0), Some(second))
        .await
        .expect("a quarantine");
    clock.advance(Duration::from_secs(2));

    let mut client = etcd_client::Client::connect(&url.endpoints, None)
        .await
        .expect("a client");
    let doc = Keys::new(&url.prefix).doc(&group);
    let revision = |resp: etcd_client::GetResponse| resp.kvs().first().map(|kv| kv.mod_revision());
    let before = revision(client.get(doc.clone(), None).await.expect("a read"));
    store
        .quarantine(&group, Bucket(1), None)
        .await
        .expect("a lift of nothing");
    let after = revision(client.get(doc, None).await.expect("a read"));
    assert!(before.is_some());
    assert_eq!(before, after, "the group's document was written");
}
