//! Per-bucket leases on the in-memory store, on tokio's paused clock (the store's clock follows
//! it): a lease's `revoked` fires on revocation and at the trust deadline, a shed bucket moves
//! only once its lease is dropped, a lease held too long leaves the bucket stuck (kept, not
//! released) until it is dropped, and a shutdown revokes every lease.

mod support;
use support::until;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::sync::atomic::Ordering;

use lease_core::{
    AdminStore, Bucket, FencingToken, GroupName, OwnershipEvent, RevokeReason, ShardCount,
};
use lease_memory::MemoryLeaseStore;
use lease_testing::{FaultyStore, TokioClock};
use lease_worker::{BucketLease, LeaseWorker, Leases, OwnershipHandler, WorkerHandle};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

fn group() -> GroupName {
    GroupName::new("orders").expect("name")
}

fn config(shards: u32) -> lease_worker::LeaseWorkerBuilder {
    LeaseWorker::builder(group(), ShardCount::new(shards).expect("n"))
        .ttl(TTL)
        .renew_interval(RENEW)
}

/// A handler recording when each event happened.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<(Instant, OwnershipEvent)>>>);

#[async_trait::async_trait]
impl OwnershipHandler for Recorder {
    async fn on_assigned(&self, assignment: lease_core::Assignment) {
        self.0
            .lock()
            .expect("events")
            .push((Instant::now(), OwnershipEvent::Assigned(assignment)));
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.0.lock().expect("events").push((
            Instant::now(),
            OwnershipEvent::Revoked {
                bucket,
                token,
                reason,
            },
        ));
    }
}

impl Recorder {
    fn assigned(&self) -> BTreeMap<Bucket, Instant> {
        self.0
            .lock()
            .expect("events")
            .iter()
            .filter_map(|(t, e)| match e {
                OwnershipEvent::Assigned(a) => Some((a.bucket, *t)),
                OwnershipEvent::Revoked { .. } => None,
            })
            .collect()
    }
}

/// Receive `n` leases.
async fn take(leases: &mut Leases, n: usize) -> Vec<BucketLease> {
    let mut got = Vec::new();
    while got.len() < n {
        let lease = tokio::time::timeout(RENEW * 5, leases.recv())
            .await
            .expect("leases in time")
            .expect("a lease");
        got.push(lease);
    }
    got
}

/// A shed bucket moves to the joiner only once the application dropped its lease: the
/// application works on after `revoked` fired (300 ms here), and the joiner's assignment comes
/// after the drop.
#[tokio::test(start_paused = true)]
async fn a_shed_bucket_moves_only_once_its_lease_is_dropped() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let (a, mut leases) = config(4)
        .build()
        .expect("config")
        .start_leases(store.clone())
        .await
        .expect("start a");
    let held = take(&mut leases, 4).await;
    let recorder = Recorder::default();
    let b: WorkerHandle = config(4)
        .build()
        .expect("config")
        .start(store.clone(), recorder.clone())
        .await
        .expect("start b");
    // Two of a's leases are revoked (shed); a keeps working on them 300 ms after.
    let mut dropped_at: BTreeMap<Bucket, Instant> = BTreeMap::new();
    let mut kept = Vec::new();
    let mut tasks = Vec::new();
    for lease in held {
        tasks.push(tokio::spawn(async move {
            let why = tokio::time::timeout(RENEW * 5, lease.revoked()).await;
            (lease, why)
        }));
    }
    for task in tasks {
        let (lease, why) = task.await.expect("task");
        match why {
            Ok(reason) => {
                assert_eq!(reason, RevokeReason::Shed);
                tokio::time::sleep(Duration::from_millis(300)).await;
                dropped_at.insert(lease.bucket(), Instant::now());
                drop(lease);
            }
            Err(_) => kept.push(lease),
        }
    }
    assert_eq!((dropped_at.len(), kept.len()), (2, 2), "two shed, two kept");
    until("b to own two", RENEW * 3, || b.owned().borrow().len() == 2).await;
    let assigned = recorder.assigned();
    for (bucket, dropped) in &dropped_at {
        let at = assigned.get(bucket).expect("b got the shed bucket");
        assert!(
            at >= dropped,
            "bucket {bucket} assigned to b before a dropped its lease"
        );
    }
    assert!(kept.iter().all(BucketLease::is_valid));
    drop(kept);
    b.shutdown().await.expect("a clean stop");
    a.shutdown().await.expect("a clean stop");
}

/// A lease's `revoked` fires at its trust deadline when the worker cannot renew, with the
/// worker's store call hanging. (Two mechanisms meet this: the worker revokes at the deadline,
/// and the lease watches the deadline itself, for when the worker cannot get to it; this test
/// checks the deadline is met, not which of them met it.)
#[tokio::test(start_paused = true)]
async fn revoked_fires_at_the_trust_deadline() {
    let store = FaultyStore::new(MemoryLeaseStore::with_clock(TokioClock::new()));
    let (a, mut leases) = config(2)
        .build()
        .expect("config")
        .start_leases(store.clone())
        .await
        .expect("start");
    let mut held = take(&mut leases, 2).await;
    let deadline = held[0].trusted_until().expect("trusted");
    assert!(held[0].is_valid());
    store.faults().hang.store(true, Ordering::SeqCst);
    let lease = held.pop().expect("a lease");
    let why = tokio::time::timeout(TTL * 2, lease.revoked())
        .await
        .expect("revoked fired");
    assert_eq!(why, RevokeReason::Fenced);
    let late = Instant::now().saturating_duration_since(deadline);
    assert!(
        Instant::now() >= deadline && late < Duration::from_millis(50),
        "fired {late:?} after a deadline that only moves with renewals"
    );
    assert!(!lease.is_valid());
    store.faults().hang.store(false, Ordering::SeqCst);
    drop((lease, held));
    a.shutdown().await.expect("a clean stop");
}

/// A revoked lease held past the acknowledgement limit leaves its bucket stuck: not released,
/// so the joiner cannot have it, until the lease is dropped; then it moves.
#[tokio::test(start_paused = true)]
async fn a_lease_held_too_long_keeps_its_bucket_until_dropped() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let (a, mut leases) = config(2)
        .revoke_ack_limit(Duration::from_millis(500))
        .build()
        .expect("config")
        .start_leases(store.clone())
        .await
        .expect("start a");
    let held = take(&mut leases, 2).await;
    let recorder = Recorder::default();
    let b = config(2)
        .build()
        .expect("config")
        .start(store.clone(), recorder.clone())
        .await
        .expect("start b");
    // One lease is shed; the application ignores it for 5 renew intervals.
    let mut shed = None;
    for lease in held {
        if tokio::time::timeout(RENEW * 3, lease.revoked())
            .await
            .is_ok()
        {
            shed = Some(lease);
        } else {
            drop(lease);
        }
    }
    let shed = shed.expect("a lease was shed");
    let bucket = shed.bucket();
    tokio::time::sleep(RENEW * 5).await;
    assert!(
        !recorder.assigned().contains_key(&bucket),
        "the stuck bucket moved while its lease was held"
    );
    let snap = store.snapshot(&group()).await.expect("snapshot");
    assert_eq!(
        snap.buckets[bucket.get() as usize].owner,
        Some(a.node_id()),
        "the stuck bucket stays with a's session"
    );
    let dropped = Instant::now();
    drop(shed);
    until("b to get the bucket", RENEW * 2, || {
        recorder.assigned().contains_key(&bucket)
    })
    .await;
    assert!(recorder.assigned()[&bucket] >= dropped);
    b.shutdown().await.expect("a clean stop");
    a.shutdown().await.expect("a clean stop");
}

/// A graceful stop revokes every lease with `Shutdown`, waits for the leases to be dropped,
/// and ends the lease stream.
#[tokio::test(start_paused = true)]
async fn a_shutdown_revokes_every_lease() {
    let store = MemoryLeaseStore::with_clock(TokioClock::new());
    let (a, mut leases) = config(3)
        .build()
        .expect("config")
        .start_leases(store.clone())
        .await
        .expect("start");
    let held = take(&mut leases, 3).await;
    let watchers: Vec<_> = held
        .into_iter()
        .map(|lease| tokio::spawn(async move { lease.revoked().await }))
        .collect();
    a.shutdown().await.expect("a clean stop");
    for w in watchers {
        assert_eq!(w.await.expect("task"), RevokeReason::Shutdown);
    }
    assert!(leases.recv().await.is_none(), "the stream ended");
    let snap = store.snapshot(&group()).await.expect("snapshot");
    assert!(snap.members.is_empty(), "the worker left the group");
}
