//! `leasectl worker --weight` as a user runs it, on Postgres: the weight is written under the
//! process's own session, and a process refused its `--node-id` writes nothing.

mod support;

use std::time::Duration;

use lease::GroupName;
use lease::store::LeaseStore;
use support::{WorkerProcess, wait_for};

/// The weight the store has for `worker` in `group`.
async fn weight_of(store: &dyn LeaseStore, group: &str, worker: lease::NodeId) -> Option<u32> {
    let group = GroupName::new(group).expect("a group name");
    let snap = store.snapshot(&group).await.expect("a snapshot");
    snap.members
        .iter()
        .find(|m| m.worker == worker)
        .map(|m| m.weight)
}

/// A second `leasectl worker` given a live worker's `--node-id` and `--weight 0` is refused
/// (an error event says the id is in use) and changes nothing: the live worker keeps weight 1
/// and all its buckets while the second is refused again and again. Once the first stops, the
/// second gets a session of its own, joins, and its weight is written then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_worker_writes_no_weight() {
    let db = lease_testdb::database().await;
    let store = lease::postgres::PgLeaseStore::builder(db.url.clone())
        .build()
        .expect("a store");
    let id = lease::NodeId::new();
    let id_text = id.to_string();
    let mut first = WorkerProcess::spawn_with(
        "first",
        &db.url,
        "orders",
        4,
        "3s",
        "1s",
        &["--node-id", &id_text],
    );
    wait_for(
        "the first worker's buckets",
        Duration::from_secs(20),
        || first.owned().len() == 4,
    );
    assert_eq!(weight_of(&store, "orders", id).await, Some(1));
    let mut second = WorkerProcess::spawn_with(
        "second",
        &db.url,
        "orders",
        4,
        "3s",
        "1s",
        &["--node-id", &id_text, "--weight", "0"],
    );
    let refusals = |w: &WorkerProcess| {
        w.events()
            .iter()
            .filter(|e| e.event == "error")
            .filter(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("is in use"))
            })
            .count()
    };
    // Three refusals take more than two of the first worker's renewals (1 s each): with weight
    // 0 in the store it would have shed by then.
    wait_for(
        "three refusals of the second worker",
        Duration::from_secs(20),
        || refusals(&second) >= 3,
    );
    assert_eq!(
        weight_of(&store, "orders", id).await,
        Some(1),
        "the refused worker wrote its weight"
    );
    assert_eq!(first.owned().len(), 4, "the live worker gave buckets up");
    assert!(
        !first.events().iter().any(|e| e.event == "revoked"),
        "the live worker revoked a bucket"
    );

    first.signal("TERM");
    assert!(first.wait(Duration::from_secs(10)).success());
    wait_for(
        "the second worker's weight, once it has a session",
        Duration::from_secs(20),
        || {
            let weight = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(weight_of(&store, "orders", id))
            });
            weight == Some(0)
        },
    );
    assert!(
        second.owned().is_empty(),
        "a worker of weight 0 alone in its group took buckets"
    );
    second.signal("TERM");
    assert!(second.wait(Duration::from_secs(10)).success());
}
