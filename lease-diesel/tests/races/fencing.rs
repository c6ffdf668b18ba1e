//! The fencing check (`lease.is_current`) inside an application's transaction: it holds off a
//! takeover of the bucket, and the owner's release skips the bucket instead of waiting.

use std::time::Duration;

use lease_core::Takeover;
use lease_diesel::ops;

use crate::duel::{connect, exec, wait_server_past};
use crate::members::{SHARDS, assert_sole_owner, beat, long, setup, short};

/// The fencing check inside an application's transaction holds off a takeover until that
/// transaction ends, even once the owner's session has expired: a write fenced by
/// `lease.is_current` can never land after another worker owns the bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_holds_off_a_takeover() {
    let s = setup(short()).await;
    let mut admin = connect(&s.url).await;
    let mut app = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
    let lease = s.leases[0];

    exec(&mut app, "BEGIN").await;
    assert!(
        ops::is_current(&mut app, None, &s.group, lease.bucket, s.a, lease.token)
            .await
            .expect("is_current"),
        "the owner's own fencing check failed"
    );
    wait_server_past(&mut admin, s.first.expires_at).await;
    let taken = ops::claim(
        &mut claimer,
        None,
        &s.group,
        s.b,
        s.b_session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    assert_eq!(
        taken.len(),
        SHARDS as usize - 1,
        "b took the bucket being written"
    );
    assert!(taken.iter().all(|l| l.bucket != lease.bucket));
    exec(&mut app, "COMMIT").await;

    let taken = ops::claim(
        &mut claimer,
        None,
        &s.group,
        s.b,
        s.b_session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("b claims again");
    assert_eq!(
        taken.iter().map(|l| l.bucket).collect::<Vec<_>>(),
        vec![lease.bucket]
    );
    assert_sole_owner(&s, s.b).await;
}

/// An application's fencing checks and the owner's release never deadlock: the release skips
/// a bucket row the application's transaction holds, releases the rest at once, and releases
/// the skipped one on a later call, after that transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_skips_buckets_a_fenced_transaction_holds() {
    let s = setup(long()).await;
    let (b0, b1) = (s.leases[0], s.leases[1]);
    let mut app = connect(&s.url).await;
    let mut worker = connect(&s.url).await;
    exec(&mut app, "BEGIN").await;
    assert!(
        ops::is_current(&mut app, None, &s.group, b1.bucket, s.a, b1.token)
            .await
            .expect("is_current")
    );
    let released = tokio::time::timeout(
        Duration::from_secs(5),
        ops::release(
            &mut worker,
            None,
            &s.group,
            s.a,
            s.first.session,
            &[b0.bucket, b1.bucket],
        ),
    )
    .await
    .expect("the release waited for the application's transaction")
    .expect("release");
    assert_eq!(
        released,
        vec![b0.bucket],
        "only the unheld bucket is released"
    );
    // The application's next check in the same transaction does not deadlock either.
    assert!(
        !ops::is_current(&mut app, None, &s.group, b0.bucket, s.a, b0.token)
            .await
            .expect("is_current"),
        "a released bucket passed the fencing check"
    );
    exec(&mut app, "COMMIT").await;
    let released = ops::release(
        &mut worker,
        None,
        &s.group,
        s.a,
        s.first.session,
        &[b1.bucket],
    )
    .await
    .expect("release again");
    assert_eq!(released, vec![b1.bucket]);
    let beat = beat(&mut worker, &s.group, s.a, long(), "heartbeat").await;
    assert_eq!(beat.owned.len(), SHARDS as usize - 2);
    // The store's per-session counter (what others see as a's load) followed both releases.
    let snap = ops::snapshot(&mut worker, None, &s.group)
        .await
        .expect("snapshot");
    let me = snap.members.iter().find(|m| m.worker == s.a).expect("a");
    assert_eq!(me.owned, SHARDS - 2, "the owned counter drifted");
}
