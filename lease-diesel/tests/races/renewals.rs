//! A renewal against a claim judging its session dead: the session is extended only by a
//! renewal that holds the node row before its expiry, on the clock read under that lock.

use std::time::Duration;

use lease_core::{Takeover, Ttl};
use lease_diesel::ops;

use crate::duel::{backend_pid, blocked, connect, exec, flag, hold_row, wait_server_past};
use crate::members::{
    Beat, SHARDS, assert_sole_owner, beat, long, renew, setup, setup_with, short, stamps,
};

/// A renewal whose transaction began before the session expired, executed after a claimer
/// took the buckets, must not extend the session (it would if expiry were judged by `now()`,
/// the transaction's start): it starts a new session, a member of no group, owning nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_begun_before_expiry_cannot_revive_the_session() {
    let mut renewal_conn = None;
    let s = setup_with(Ttl::from_secs(2).expect("ttl"), |url| {
        let url = url.to_owned();
        let slot = &mut renewal_conn;
        async move {
            let mut conn = connect(&url).await;
            exec(&mut conn, "BEGIN").await;
            *slot = Some(conn);
        }
    })
    .await;
    let mut renewal = renewal_conn.expect("the renewal connection");
    // The precondition of the race: the renewal's transaction began before the expiry.
    assert!(
        flag(
            &mut renewal,
            "SELECT now() < $1 AS yes",
            Some(s.first.expires_at)
        )
        .await,
        "the renewal transaction began after the expiry; the race was not set up"
    );
    let mut admin = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
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
        SHARDS as usize,
        "a's dead session kept buckets"
    );
    assert!(
        flag(
            &mut renewal,
            "SELECT now() < $1 AS yes",
            Some(s.first.expires_at)
        )
        .await,
        "the renewal transaction is no longer the one begun before the expiry"
    );

    let late = beat(&mut renewal, &s.group, s.a, long(), "a's late renewal").await;
    exec(&mut renewal, "COMMIT").await;
    assert!(
        late.new_session,
        "a renewal after expiry extended a dead session"
    );
    assert_ne!(late.session, s.first.session);
    assert!(
        late.owned.is_empty(),
        "a still sees buckets b took: {:?}",
        late.owned
    );
    assert_sole_owner(&s, s.b).await;
    for (new, old) in taken.iter().zip(&s.leases) {
        assert!(new.token > old.token);
    }
}

/// A renewal that holds the node row's lock (committed or not yet) wins over a claim made
/// after the old expiry: the claimer skips a locked owner row and takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_skips_an_owner_whose_renewal_holds_the_lock() {
    let s = setup(short()).await;
    let mut admin = connect(&s.url).await;
    let mut renewal = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;

    // a renews in time, but its transaction stays open, holding the row lock...
    exec(&mut renewal, "BEGIN").await;
    let renewed = beat(&mut renewal, &s.group, s.a, long(), "a renews").await;
    assert!(!renewed.new_session);
    // ...past the session's old expiry: to a claimer's snapshot a looks dead.
    wait_server_past(&mut admin, s.first.expires_at).await;
    // A claimer that waited for the renewal's lock instead would never end (the renewal
    // commits after it): a failure, not a hang.
    let taken = tokio::time::timeout(
        Duration::from_secs(10),
        ops::claim(
            &mut claimer,
            None,
            &s.group,
            s.b,
            s.b_session,
            SHARDS,
            Takeover::Allowed,
        ),
    )
    .await
    .expect("b's claim waited for the renewal's lock")
    .expect("b claims");
    assert!(
        taken.is_empty(),
        "b took buckets of a session being renewed: {taken:?}"
    );
    exec(&mut renewal, "COMMIT").await;

    // Once committed the renewal is visible: still nothing to take.
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
    assert!(taken.is_empty());
    let beat = beat(&mut renewal, &s.group, s.a, long(), "a renews again").await;
    assert_eq!(beat.session, s.first.session);
    assert_eq!(beat.owned.len(), SHARDS as usize);
    assert_sole_owner(&s, s.a).await;
}

/// A claim that judged an owner dead holds the owner's node row share-locked until it commits;
/// a renewal arriving meanwhile waits, then finds the session expired and starts a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_waits_for_a_claim_that_judged_it_dead() {
    let s = setup(short()).await;
    let mut admin = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
    let mut renewal = connect(&s.url).await;
    wait_server_past(&mut admin, s.first.expires_at).await;

    exec(&mut claimer, "BEGIN").await;
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
    assert_eq!(taken.len(), SHARDS as usize);

    let renewal_pid = backend_pid(&mut renewal).await;
    let (group, a) = (s.group.clone(), s.a);
    let late = blocked(&mut admin, renewal_pid, async move {
        let beat = beat(&mut renewal, &group, a, long(), "a's renewal").await;
        (beat, renewal)
    })
    .await;
    exec(&mut claimer, "COMMIT").await;
    let (late, _renewal) = late.await.expect("the renewal task");
    assert!(
        late.new_session,
        "a renewal extended a session a committed claim judged dead"
    );
    assert!(late.owned.is_empty());
    assert_sole_owner(&s, s.b).await;
}

/// The renewal is a plain `UPDATE`, which reads its clock before it waits for a lock and does
/// not read it again if the holder did not change the row: a renewal that began before the
/// session's expiry and waited for the node row (here a transaction holding it as a claim of
/// the node's own does) until past the expiry, while a claimer judged the session dead and
/// took its buckets, must not extend the session. It reads the clock again once it holds the
/// lock, finds the session expired, and starts a new one owning nothing. Here the renewal is
/// the full heartbeat's (no stamps handed in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_that_waited_for_the_node_row_past_its_expiry_starts_a_new_session() {
    renewal_waits_past_the_expiry(false).await;
}

/// The same race for the steady renewal (`STEADY_RENEWAL`, a node handing in the stamps of
/// its views): the plain statement's second clock reading, in its RETURNING, fails it through
/// `lease.renewal_too_late()`, which undoes the renewal, and the full heartbeat starts a new
/// session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_renewal_that_waited_for_the_node_row_past_its_expiry_starts_a_new_session() {
    renewal_waits_past_the_expiry(true).await;
}

async fn renewal_waits_past_the_expiry(steady: bool) {
    let s = setup(Ttl::from_secs(3).expect("ttl")).await;
    let mut admin = connect(&s.url).await;
    let mut gate = connect(&s.url).await;
    let mut renewal = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
    // With stamps: the views a's node was last given, renewing it for the same ttl.
    let (seen, expires_at) = if steady {
        let view = renew(
            &mut renewal,
            s.a,
            Ttl::from_secs(3).expect("ttl"),
            &[],
            "a's views",
        )
        .await;
        (stamps(&view), view.expires_at)
    } else {
        (Vec::new(), s.first.expires_at)
    };
    hold_row(&mut gate, "lease.nodes", "node_id", s.a, "FOR SHARE").await;
    let pid = backend_pid(&mut renewal).await;
    let (group, a) = (s.group.clone(), s.a);
    let late = blocked(&mut admin, pid, async move {
        let beat = Beat::of(
            &renew(&mut renewal, a, long(), &seen, "a's renewal").await,
            &group,
        );
        (beat, renewal)
    })
    .await;
    // The precondition of the race: the renewal read its clock before the expiry (it was
    // already waiting for the lock then).
    assert!(
        flag(
            &mut admin,
            "SELECT clock_timestamp() < $1 AS yes",
            Some(expires_at)
        )
        .await,
        "the renewal started after the expiry; the race was not set up"
    );
    wait_server_past(&mut admin, expires_at).await;
    // The session is dead by the clock; a claimer may judge it so (the row's only holder shares
    // its lock) and take its buckets while the renewal waits.
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
    assert_eq!(taken.len(), SHARDS as usize, "b did not take a's buckets");
    exec(&mut gate, "COMMIT").await;
    let (late, _renewal) = late.await.expect("the renewal task");
    assert!(
        late.new_session,
        "a renewal that waited past the expiry extended the session"
    );
    assert_ne!(late.session, s.first.session);
    assert!(late.owned.is_empty(), "{:?}", late.owned);
    assert_sole_owner(&s, s.b).await;
}
