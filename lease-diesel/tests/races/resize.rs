//! A resize against claims and fencing: the draining generation records the old buckets as
//! concurrent claims left them, and a fenced old bucket holds off its children.

use lease_core::{BucketState, Takeover, Ttl};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, flag, wait_server_past};
use crate::members::{count, long, two_members};

/// A resize moves each bucket row as a concurrent claim left it: it waits for the claim's row
/// lock (`DELETE ... RETURNING`), so the draining generation records the claimer as the old
/// bucket's owner and the bucket's children wait for it. A resize that copied the rows as its
/// snapshot saw them would call the bucket unowned, and another worker could take its
/// children while the claimer still works the old bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_moves_a_bucket_as_a_concurrent_claim_left_it() {
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(2, long()).await;
    let mut admin = connect(&url).await;
    let mut claimer = connect(&url).await;
    let mut resizer = connect(&url).await;
    let resizer_pid = backend_pid(&mut resizer).await;

    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        a,
        a_beat.session,
        1,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(won.len(), 1);
    let old = won[0];

    let resize = {
        let group = group.clone();
        blocked(&mut admin, resizer_pid, async move {
            ops::resize(&mut resizer, None, &group, count(2), count(4)).await
        })
        .await
    };
    exec(&mut claimer, "COMMIT").await;
    resize
        .await
        .expect("the resize task")
        .expect("the resize succeeds");

    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    let recorded = snap
        .draining
        .iter()
        .find(|i| i.bucket == old.bucket)
        .map(|i| (i.owner, i.token, i.state));
    assert_eq!(
        recorded,
        Some((Some(a), old.token, BucketState::Live)),
        "the draining generation lost the claim that committed during the resize"
    );
    let taken = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        4,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    let children = lease_core::resize::children(count(2), count(4), old.bucket);
    assert!(
        taken.iter().all(|l| !children.contains(&l.bucket)),
        "b took {taken:?}, children of old bucket {} that a still holds",
        old.bucket.0
    );
    assert_eq!(
        taken.len(),
        2,
        "b takes the children of the unowned old bucket"
    );
}

/// A claim judging an old bucket's owner dead locks the old row (`FOR UPDATE SKIP LOCKED`):
/// while an application's fencing transaction on the old bucket is open (`lease.is_current`
/// share-locks the draining row), its children stay waiting, as a takeover of one bucket
/// waits for the fenced bucket row. Without the lock, a claimer could open the children while
/// the old owner's fenced writes are still to commit. Once the transaction ends, the dead
/// owner's fencing check on the old bucket fails while the old row is still there (its expiry
/// decides, not the row's absence), and the next claim opens the children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_on_an_old_bucket_holds_off_its_children() {
    // Long enough for the claim and the resize below to run before `a`'s session ends on a
    // loaded machine (with 1 s, the fencing check itself sometimes came too late), short
    // enough to wait past.
    let ttl = Ttl::from_secs(3).expect("ttl");
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(4, ttl).await;
    let mut admin = connect(&url).await;
    // A claim that waited for the fencing transaction instead would never end (the
    // transaction commits after it): make that a failure.
    exec(&mut admin, "SET statement_timeout = '10s'").await;
    let mut app = connect(&url).await;
    let leases = ops::claim(
        &mut admin,
        None,
        &group,
        a,
        a_beat.session,
        4,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(leases.len(), 4);
    let started = ops::resize(&mut admin, None, &group, count(4), count(8))
        .await
        .expect("resize");
    assert!(matches!(started, lease_core::ResizeOutcome::Started { .. }));
    let fenced = leases[0];

    exec(&mut app, "BEGIN").await;
    assert!(
        ops::is_current(&mut app, None, &group, fenced.bucket, a, fenced.token)
            .await
            .expect("is_current"),
        "the old owner's fencing check on its draining bucket failed"
    );
    wait_server_past(&mut admin, a_beat.expires_at).await;
    let children = lease_core::resize::children(count(4), count(8), fenced.bucket);
    let taken = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        8,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    assert_eq!(
        taken.len(),
        6,
        "b takes the children of the unfenced old buckets"
    );
    assert!(
        taken.iter().all(|l| !children.contains(&l.bucket)),
        "b took {taken:?} while a fenced transaction on old bucket {} is open",
        fenced.bucket.0
    );
    exec(&mut app, "COMMIT").await;
    // The fenced old row is still there, a's: the claim above could not retire it, so the
    // draining generation was not dropped. The dead owner's next fencing check fails on its
    // session's expiry alone.
    assert!(
        flag(
            &mut admin,
            &format!(
                "SELECT EXISTS (SELECT 1 FROM lease.draining_shards
                                 WHERE bucket = {} AND owner_node = '{}') AS yes",
                fenced.bucket.0,
                a.as_uuid()
            ),
            None,
        )
        .await,
        "the old row is gone: the check below would not be the expiry's"
    );
    assert!(
        !ops::is_current(&mut admin, None, &group, fenced.bucket, a, fenced.token)
            .await
            .expect("is_current"),
        "the dead old owner still passes the fencing check on its draining bucket"
    );

    let taken = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        8,
        Takeover::Allowed,
    )
    .await
    .expect("b claims again");
    assert_eq!(taken.iter().map(|l| l.bucket).collect::<Vec<_>>(), children);
    assert!(
        taken.iter().all(|l| l.token.0 > fenced.token.0),
        "a child's token is not above its parent's: {taken:?}"
    );
}
