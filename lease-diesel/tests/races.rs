//! Deterministic interleavings of renewals, claims, joins and views on Postgres, with the
//! server's clock, one connection per side, for each concurrency rule in docs/postgres.md.
//! Each step waits for a condition the server reports (a backend blocked on a lock, the server
//! clock past an expiry), never for a guessed time. In every interleaving of a renewal and a
//! claim exactly one side owns the buckets.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Integer, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_core::{
    Bucket, BucketState, ErrorKind, FencingToken, GroupName, GroupStamp, Heartbeat, Incarnation,
    Lease, MemberMetadata, NodeId, NodesSnapshot, SessionId, ShardCount, StoreError, Takeover,
    Timestamp, Ttl,
};
use lease_diesel::ops;

const SHARDS: u32 = 4;

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)
        .await
        .expect("pg_backend_pid")
        .pid
}

async fn flag(conn: &mut AsyncPgConnection, sql: &str, t: Option<Timestamp>) -> bool {
    let q = diesel::sql_query(sql).bind::<diesel::sql_types::Nullable<Timestamptz>, _>(t);
    q.get_result::<Flag>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .yes
}

/// Poll until `cond` holds (as the server reports it), failing after 20 s.
async fn wait_for(admin: &mut AsyncPgConnection, what: &str, sql: &str, t: Option<Timestamp>) {
    for _ in 0..2_000 {
        if flag(admin, sql, t).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

async fn wait_blocked_on_lock(admin: &mut AsyncPgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
         WHERE pid = {pid} AND wait_event_type = 'Lock') AS yes"
    );
    wait_for(admin, "the backend to block on a lock", &sql, None).await;
}

/// Poll until backend `pid` waits for a lock backend `holder` holds.
async fn wait_blocked_by(admin: &mut AsyncPgConnection, pid: i32, holder: i32) {
    let sql = format!("SELECT {holder} = ANY (pg_blocking_pids({pid})) AS yes");
    wait_for(admin, "the backend to wait for the holder", &sql, None).await;
}

async fn wait_server_past(admin: &mut AsyncPgConnection, t: Timestamp) {
    wait_for(
        admin,
        "the server clock to pass the expiry",
        "SELECT clock_timestamp() >= $1 AS yes",
        Some(t),
    )
    .await;
}

/// A node's heartbeat on `conn`, on the server clock, as the incarnation derived from its id,
/// handing in `seen`; panics with `what` on failure.
async fn renew(
    conn: &mut AsyncPgConnection,
    worker: NodeId,
    ttl: Ttl,
    seen: &[GroupStamp],
    what: &str,
) -> Heartbeat {
    let process = Incarnation::from_uuid(worker.as_uuid());
    ops::heartbeat(
        conn,
        None,
        worker,
        process,
        ttl,
        &MemberMetadata::empty(),
        seen,
    )
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// What a heartbeat says of `group`: the node's session and its leases there.
struct Beat {
    session: SessionId,
    new_session: bool,
    observed_at: Timestamp,
    expires_at: Timestamp,
    /// The node's leases in the group (none when it is no member).
    owned: Vec<Lease>,
}

impl Beat {
    fn of(beat: &Heartbeat, group: &GroupName) -> Self {
        Self {
            session: beat.session,
            new_session: beat.new_session,
            observed_at: beat.observed_at,
            expires_at: beat.expires_at,
            owned: beat
                .group(group)
                .map(|g| g.owned.clone())
                .unwrap_or_default(),
        }
    }
}

/// A heartbeat of `worker` and what it says of `group` (no stamps: views given).
async fn beat(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    worker: NodeId,
    ttl: Ttl,
    what: &str,
) -> Beat {
    Beat::of(&renew(conn, worker, ttl, &[], what).await, group)
}

/// `worker` heartbeats and joins `group` if it is not a member: a live member afterwards.
async fn member(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    worker: NodeId,
    ttl: Ttl,
    what: &str,
) -> Beat {
    let first = renew(conn, worker, ttl, &[], what).await;
    if first.group(group).is_some() {
        return Beat::of(&first, group);
    }
    ops::join(conn, None, group, worker, first.session)
        .await
        .unwrap_or_else(|e| panic!("{what}: joining: {e}"));
    let mut joined = Beat::of(&renew(conn, worker, ttl, &[], what).await, group);
    joined.new_session = first.new_session;
    joined
}

/// The stamps to hand in next: every group of `beat`, given or unchanged.
fn stamps(beat: &Heartbeat) -> Vec<GroupStamp> {
    beat.groups
        .iter()
        .map(|g| GroupStamp {
            group: g.group.clone(),
            stamp: g.stamp,
        })
        .chain(beat.unchanged.iter().cloned())
        .collect()
}

struct Setup {
    url: String,
    group: GroupName,
    a: NodeId,
    b: NodeId,
    /// a's leases on every bucket.
    leases: Vec<Lease>,
    first: Beat,
    /// b's session.
    b_session: SessionId,
}

/// A fresh database where worker `a` holds every bucket under a session of `ttl`, and worker
/// `b` is a live, idle member.
async fn setup(ttl: Ttl) -> Setup {
    setup_with(ttl, |_| async {}).await
}

/// [`setup`], running `right_after` as soon as `a` holds the buckets.
async fn setup_with<F, Fut>(ttl: Ttl, right_after: F) -> Setup
where
    F: FnOnce(&str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    let mut ids = [NodeId::new(), NodeId::new()];
    ids.sort();
    let [a, b] = ids;
    ops::ensure_group(
        &mut conn,
        None,
        &group,
        ShardCount::new(SHARDS).expect("count"),
    )
    .await
    .expect("ensure");
    let first = member(&mut conn, &group, a, ttl, "a joins").await;
    let leases = ops::claim(
        &mut conn,
        None,
        &group,
        a,
        first.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(leases.len(), SHARDS as usize);
    // b is a live member before a's session ends, as a claimer racing a renewal is: a member
    // that joins later would, on joining, delete a's dead row (H3) and so skip the race.
    let b_join = member(&mut conn, &group, b, long(), "b joins").await;
    assert!(
        b_join.observed_at < first.expires_at,
        "b joined after a's session ended; the race was not set up"
    );
    right_after(&db.url).await;
    Setup {
        url: db.url,
        group,
        a,
        b,
        leases,
        first,
        b_session: b_join.session,
    }
}

fn long() -> Ttl {
    Ttl::from_secs(60).expect("ttl")
}

fn short() -> Ttl {
    Ttl::from_secs(1).expect("ttl")
}

/// Exactly one worker owns every bucket, and the other's fencing tokens fail.
async fn assert_sole_owner(s: &Setup, winner: NodeId) {
    let loser = if winner == s.a { s.b } else { s.a };
    let mut conn = connect(&s.url).await;
    let snap = ops::snapshot(&mut conn, None, &s.group)
        .await
        .expect("snapshot");
    for b in &snap.buckets {
        assert_eq!(
            b.state,
            BucketState::Live,
            "bucket {} is not owned",
            b.bucket
        );
        assert_eq!(
            b.owner,
            Some(winner),
            "bucket {} has the wrong owner",
            b.bucket
        );
        assert!(
            ops::is_current(&mut conn, None, &s.group, b.bucket, winner, b.token)
                .await
                .expect("is_current")
        );
        for t in 0..=b.token.0 {
            assert!(
                !ops::is_current(&mut conn, None, &s.group, b.bucket, loser, FencingToken(t))
                    .await
                    .expect("is_current"),
                "the loser passes the fencing check on bucket {}",
                b.bucket
            );
        }
    }
}

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
    let late = tokio::spawn(async move {
        let beat = beat(&mut renewal, &group, a, long(), "a's renewal").await;
        (beat, renewal)
    });
    wait_blocked_on_lock(&mut admin, renewal_pid).await;
    exec(&mut claimer, "COMMIT").await;
    let (late, _renewal) = late.await.expect("the renewal task");
    assert!(
        late.new_session,
        "a renewal extended a session a committed claim judged dead"
    );
    assert!(late.owned.is_empty());
    assert_sole_owner(&s, s.b).await;
}

/// A bucket claimed by a brand-new session after a claimer's statement took its snapshot
/// must not look claimable to that claimer when it finally locks the row: Postgres re-checks
/// the locked row's new version against the old snapshot, in which the new owner's session
/// does not exist yet. `lease.owner_is_dead` decides on the latest committed state instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_takes_a_bucket_claimed_after_its_snapshot() {
    let s = setup(short()).await;
    let c = NodeId::new();
    let mut admin = connect(&s.url).await;
    let mut gate = connect(&s.url).await;
    let mut late_claimer = connect(&s.url).await;
    let mut other = connect(&s.url).await;

    wait_server_past(&mut admin, s.first.expires_at).await;

    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    exec(
        &mut gate,
        &format!(
            "BEGIN; SELECT 1 FROM lease.members WHERE node_id = '{}' FOR UPDATE",
            s.b
        ),
    )
    .await;
    let b_pid = backend_pid(&mut late_claimer).await;
    let (group, b, b_session) = (s.group.clone(), s.b, s.b_session);
    let blocked = tokio::spawn(async move {
        ops::claim(
            &mut late_claimer,
            None,
            &group,
            b,
            b_session,
            SHARDS,
            Takeover::Allowed,
        )
        .await
        .expect("b's claim")
    });
    wait_blocked_on_lock(&mut admin, b_pid).await;

    // Meanwhile c joins (a session b's snapshot cannot see) and takes every bucket.
    let c_session = member(&mut other, &s.group, c, long(), "c joins")
        .await
        .session;
    let c_won = ops::claim(
        &mut other,
        None,
        &s.group,
        c,
        c_session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("c claims");
    assert_eq!(c_won.len(), SHARDS as usize);

    exec(&mut gate, "COMMIT").await;
    let b_won = blocked.await.expect("the claim task");
    assert!(
        b_won.is_empty(),
        "b stole buckets c had claimed after b's snapshot: {b_won:?}"
    );
    let mut conn = connect(&s.url).await;
    let snap = ops::snapshot(&mut conn, None, &s.group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.owner == Some(c) && x.state == BucketState::Live)
    );
    for lease in &c_won {
        assert!(
            ops::is_current(&mut conn, None, &s.group, lease.bucket, c, lease.token)
                .await
                .expect("is_current")
        );
    }
}

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

/// A claim that had to wait for its own node row, locked by a claimer judging the session
/// dead, until after the session expired, claims nothing: liveness is judged again once the
/// row is locked (a locking condition is not re-tested when the row did not change).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_that_waited_past_its_expiry_claims_nothing() {
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let mut judge = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    let b = NodeId::new();
    ops::ensure_group(
        &mut conn,
        None,
        &group,
        ShardCount::new(SHARDS).expect("count"),
    )
    .await
    .expect("ensure");
    let joined = member(&mut conn, &group, b, short(), "b joins").await;
    exec(
        &mut judge,
        &format!("BEGIN; SELECT 1 FROM lease.nodes WHERE node_id = '{b}' FOR UPDATE"),
    )
    .await;
    let pid = backend_pid(&mut conn).await;
    let (g, session) = (group.clone(), joined.session);
    let claim = tokio::spawn(async move {
        let result = ops::claim(&mut conn, None, &g, b, session, SHARDS, Takeover::Allowed).await;
        (result, conn)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    wait_server_past(&mut admin, joined.expires_at).await;
    exec(&mut judge, "COMMIT").await;
    let (result, mut conn) = claim.await.expect("the claim task");
    match result {
        Err(e) => assert_eq!(e.kind(), lease_core::ErrorKind::SessionExpired, "{e:?}"),
        Ok(won) => panic!("a dead session claimed {won:?}"),
    }
    let snap = ops::snapshot(&mut conn, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.state == BucketState::Unowned && x.token.0 == 0),
        "the expired claim wrote: {:?}",
        snap.buckets
    );
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

/// Two processes started at once with one node id: the first one's heartbeat inserted the node
/// row (not committed yet); the second waits for it (its insert conflicts), then judges the
/// committed row under its lock, finds a live session of another incarnation and is refused,
/// writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_process_with_one_node_id_waits_then_is_refused() {
    let db = lease_testdb::database().await;
    let mut first = connect(&db.url).await;
    let mut second = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    let w = NodeId::new();
    ops::ensure_group(
        &mut first,
        None,
        &group,
        ShardCount::new(SHARDS).expect("count"),
    )
    .await
    .expect("ensure");
    let meta = MemberMetadata::empty();
    exec(&mut first, "BEGIN").await;
    let started = ops::heartbeat(&mut first, None, w, Incarnation::new(), long(), &meta, &[])
        .await
        .expect("the first process starts a session");
    assert!(started.new_session);
    let pid = backend_pid(&mut second).await;
    let g = group.clone();
    let refused = tokio::spawn(async move {
        let result =
            ops::heartbeat(&mut second, None, w, Incarnation::new(), long(), &meta, &[]).await;
        (result, second, g)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    exec(&mut first, "COMMIT").await;
    let (result, mut second, group) = refused.await.expect("the second heartbeat");
    match result {
        Err(StoreError::NodeIdInUse { expires_at, .. }) => {
            assert_eq!(expires_at, started.expires_at);
        }
        other => panic!("the second process was not refused: {other:?}"),
    }
    let nodes = ops::nodes(&mut second, None).await.expect("nodes");
    assert_eq!(nodes.nodes.len(), 1);
    assert_eq!(
        nodes.nodes[0].session, started.session,
        "the session was replaced"
    );
    assert_eq!(
        nodes.nodes[0].expires_at, started.expires_at,
        "the refusal renewed it"
    );
    // The second process cannot act under the session either.
    let claim = ops::claim(
        &mut second,
        None,
        &group,
        w,
        SessionId::new(),
        SHARDS,
        Takeover::Allowed,
    )
    .await;
    assert_eq!(
        claim.map_err(|e| e.kind()).err(),
        Some(ErrorKind::SessionExpired)
    );
}

/// A worker whose claims start at bucket 0, like every worker of this test.
fn seeded_at_zero() -> NodeId {
    NodeId::from_uuid(uuid::Uuid::from_u128(
        NodeId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
    ))
}

/// Two claims at once, both starting at bucket 0: the second walks past the rows the first
/// holds (not committed yet), without waiting for them, and takes the next claimable ones,
/// both among unowned buckets and among a dead session's; then it waits only for the group's
/// change counter, which every claim that took something moves last. A claim that waited for
/// the rows, or gave up at the first locked one, would fail this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_claims_walk_past_each_others_rows() {
    let db = lease_testdb::database().await;
    let mut first = connect(&db.url).await;
    let mut second = connect(&db.url).await;
    let mut admin = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, ShardCount::new(8).expect("count"))
        .await
        .expect("ensure");
    // A dead worker held buckets 4..8 under a session of one second.
    let dead = seeded_at_zero();
    let gone = member(&mut admin, &group, dead, short(), "the doomed worker joins").await;
    exec(&mut admin, "BEGIN").await;
    let held = ops::claim(
        &mut admin,
        None,
        &group,
        dead,
        gone.session,
        8,
        Takeover::Allowed,
    )
    .await
    .expect("the doomed worker claims");
    assert_eq!(held.len(), 8);
    exec(&mut admin, "COMMIT").await;
    let released = ops::release(
        &mut admin,
        None,
        &group,
        dead,
        gone.session,
        &[Bucket(0), Bucket(1), Bucket(2), Bucket(3)],
    )
    .await
    .expect("release");
    assert_eq!(released.len(), 4);
    let (a, b) = (seeded_at_zero(), seeded_at_zero());
    let sa = member(&mut first, &group, a, long(), "a joins")
        .await
        .session;
    let sb = member(&mut second, &group, b, long(), "b joins")
        .await
        .session;
    wait_server_past(&mut admin, gone.expires_at).await;

    let b_pid = backend_pid(&mut second).await;
    for (round, (want_a, expect_b)) in [(2, vec![2, 3]), (2, vec![6, 7])].into_iter().enumerate() {
        exec(&mut first, "BEGIN").await;
        let taken_a = ops::claim(&mut first, None, &group, a, sa, want_a, Takeover::Allowed)
            .await
            .expect("a claims");
        assert_eq!(taken_a.len(), 2, "round {round}: {taken_a:?}");
        let g = group.clone();
        let b_claims = tokio::spawn(async move {
            let taken = ops::claim(&mut second, None, &g, b, sb, 2, Takeover::Allowed).await;
            (taken, second)
        });
        // b took its buckets past the rows a holds, and then waits for the one row every claim
        // that took something updates last: the group's change counter, which a holds until
        // it commits. A claim that waited for a's bucket rows would wait on lease.shards.
        wait_blocked_on_lock(&mut admin, b_pid).await;
        assert_eq!(
            row_waited_for(&mut admin, b_pid).await,
            "lease.group_changes",
            "round {round}: b waits for another row than the change counter"
        );
        exec(&mut first, "COMMIT").await;
        let (taken_b, back) = b_claims.await.expect("b's claim task");
        second = back;
        let got: Vec<u32> = taken_b
            .expect("b claims")
            .iter()
            .map(|l| l.bucket.0)
            .collect();
        assert_eq!(got, expect_b, "round {round}: b did not walk past a's rows");
    }
}

/// The table of the row backend `pid` waits for: a backend waiting for a row holds that row's
/// tuple lock while it waits for the transaction that holds the row.
async fn row_waited_for(admin: &mut AsyncPgConnection, pid: i32) -> String {
    #[derive(QueryableByName)]
    struct Relation {
        #[diesel(sql_type = diesel::sql_types::Text)]
        name: String,
    }
    diesel::sql_query(format!(
        "SELECT l.relation::regclass::text AS name FROM pg_locks l \
          WHERE l.pid = {pid} AND l.locktype = 'tuple' AND l.granted"
    ))
    .get_result::<Relation>(admin)
    .await
    .expect("the row the backend waits for")
    .name
}

/// A fresh database with a group of `shards` buckets and two live, idle members `a` and `b`
/// (sessions of `ttl` and a long one).
async fn two_members(shards: u32, ttl: Ttl) -> (String, GroupName, [(NodeId, Beat); 2]) {
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let group = GroupName::new("resize-race").expect("name");
    let mut ids = [NodeId::new(), NodeId::new()];
    ids.sort();
    let [a, b] = ids;
    ops::ensure_group(
        &mut conn,
        None,
        &group,
        ShardCount::new(shards).expect("count"),
    )
    .await
    .expect("ensure");
    let a_beat = member(&mut conn, &group, a, ttl, "a joins").await;
    let b_beat = member(&mut conn, &group, b, long(), "b joins").await;
    (db.url, group, [(a, a_beat), (b, b_beat)])
}

fn count(n: u32) -> ShardCount {
    ShardCount::new(n).expect("count")
}

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
        tokio::spawn(
            async move { ops::resize(&mut resizer, None, &group, count(2), count(4)).await },
        )
    };
    wait_blocked_on_lock(&mut admin, resizer_pid).await;
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
    exec(
        &mut gate,
        &format!(
            "BEGIN; SELECT 1 FROM lease.nodes WHERE node_id = '{}' FOR SHARE",
            s.a
        ),
    )
    .await;
    let pid = backend_pid(&mut renewal).await;
    let (group, a) = (s.group.clone(), s.a);
    let late = tokio::spawn(async move {
        let beat = Beat::of(
            &renew(&mut renewal, a, long(), &seen, "a's renewal").await,
            &group,
        );
        (beat, renewal)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
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

/// A join under a live session, not committed yet, and a heartbeat of the same node after the
/// session's expiry: the heartbeat's new session waits for the join (the join holds the node
/// row), and then removes the member row the join committed, reading the members with a
/// snapshot taken once it holds the lock: a new session is a member of no group (H2). A
/// removal on the heartbeat's first snapshot would miss the row, and the new session would be
/// a member of a group it never joined, counted in its fair share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_racing_a_new_session_does_not_survive_it() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut joiner = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, count(SHARDS))
        .await
        .expect("ensure");
    let a = NodeId::new();
    let first = renew(
        &mut admin,
        a,
        Ttl::from_secs(2).expect("ttl"),
        &[],
        "a starts",
    )
    .await;
    exec(&mut joiner, "BEGIN").await;
    ops::join(&mut joiner, None, &group, a, first.session)
        .await
        .expect("a joins, not committed yet");
    wait_server_past(&mut admin, first.expires_at).await;
    let pid = backend_pid(&mut heart).await;
    let renewal = tokio::spawn(async move {
        let beat = renew(&mut heart, a, long(), &[], "a's next heartbeat").await;
        (beat, heart)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    exec(&mut joiner, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session);
    assert!(
        beat.groups.is_empty() && beat.unchanged.is_empty(),
        "the new session is a member of {:?} {:?}",
        beat.groups,
        beat.unchanged
    );
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.members.is_empty(),
        "the join survived the new session: {:?}",
        snap.members
    );
    let next = renew(&mut admin, a, long(), &[], "a renews").await;
    assert!(next.groups.is_empty(), "{:?}", next.groups);
}

/// A node's own weight (K4) is written under its live session and ordered before any next
/// session of the node: the write share-locks the node row and `lease.control` key-share locks
/// the member row, so a heartbeat that starts a new session once the old one expired (locking
/// the node row, deleting the member rows) waits for it; a weight judged under the old session
/// never commits after the new one began.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_written_under_a_session_is_ordered_before_the_next_session() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut writer = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let group = GroupName::new("race").expect("name");
    ops::ensure_group(&mut admin, None, &group, count(SHARDS))
        .await
        .expect("ensure");
    let a = NodeId::new();
    let first = renew(
        &mut admin,
        a,
        Ttl::from_secs(2).expect("ttl"),
        &[],
        "a starts",
    )
    .await;
    ops::join(&mut admin, None, &group, a, first.session)
        .await
        .expect("a joins");
    exec(&mut writer, "BEGIN").await;
    let weight = lease_core::Weight::new(5).expect("weight");
    assert!(
        ops::set_weight(&mut writer, None, &group, a, first.session, weight)
            .await
            .expect("a sets its weight, not committed yet"),
        "the weight changed"
    );
    wait_server_past(&mut admin, first.expires_at).await;
    let pid = backend_pid(&mut heart).await;
    let renewal = tokio::spawn(async move {
        let beat = renew(&mut heart, a, long(), &[], "a's next heartbeat").await;
        (beat, heart)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    exec(&mut writer, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session, "the session had expired");
    assert_ne!(beat.session, first.session);
    // The old session is over: its id writes nothing now.
    let late = ops::set_weight(&mut admin, None, &group, a, first.session, weight).await;
    assert!(
        matches!(late, Err(lease_core::StoreError::SessionExpired { .. })),
        "{late:?}"
    );
}

/// A claim not committed yet while a node heartbeats is not in the view it is given (nor in
/// an "unchanged" answer); once the claim commits, the node's next heartbeat, handing in the
/// stamps it was given, gets the view with it: the claim moved the group's change counter, and
/// the heartbeat reads the counter with the same snapshot as whatever it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_between_two_heartbeats_is_never_answered_unchanged() {
    let (url, group, [(a, _), (c, c_beat)]) = two_members(8, long()).await;
    let mut hearts = connect(&url).await;
    let mut claimer = connect(&url).await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert_eq!(view.view.claimable, 8);
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        c,
        c_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("c claims");
    assert_eq!(won.len(), 2);
    let during = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a during the claim",
    )
    .await;
    assert!(
        during.groups.is_empty(),
        "nothing committed changed: {:?}",
        during.groups
    );
    exec(&mut claimer, "COMMIT").await;
    let after = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&during),
        "a after the claim",
    )
    .await;
    let view = after.group(&group).unwrap_or_else(|| {
        panic!(
            "a committed claim was answered unchanged: {:?}",
            after.unchanged
        )
    });
    assert_eq!(view.view.claimable, 6);
    assert_eq!(
        view.view
            .members
            .iter()
            .find(|m| m.worker == c)
            .map(|m| m.owned),
        Some(2)
    );
}

/// A heartbeat that removes a dead member (H3) moves the group's change counter; a claim that
/// commits after the view's snapshot and before that move (it holds the counter's lock: the
/// heartbeat's move waits for it) moved it too. The view given does not show the claim, so its
/// stamp must not be the counter the heartbeat moved it to (two above the view's): it is one
/// no counter matches, and the next heartbeat gives the view again, with the claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_committed_while_a_view_is_built_is_never_answered_unchanged() {
    let (url, group, [(a, _), (c, c_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    let mut claimer = connect(&url).await;
    // d: a member whose session ends, owning nothing (a claim of its buckets would lock its
    // node row and keep the heartbeat from removing it).
    let d = NodeId::new();
    let d_beat = member(&mut admin, &group, d, short(), "d joins").await;
    wait_server_past(&mut admin, d_beat.expires_at).await;
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        c,
        c_beat.session,
        2,
        Takeover::Deferred,
    )
    .await
    .expect("c claims");
    assert_eq!(won.len(), 2);
    let pid = backend_pid(&mut hearts).await;
    let first = tokio::spawn(async move {
        let beat = renew(&mut hearts, a, long(), &[], "a's views").await;
        (beat, hearts)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    exec(&mut claimer, "COMMIT").await;
    let (first, mut hearts) = first.await.expect("the heartbeat task");
    let view = first.group(&group).expect("a's view");
    assert!(
        view.view.members.iter().all(|m| m.worker != d),
        "d is dead: {:?}",
        view.view.members
    );
    assert_eq!(
        view.view.claimable, 8,
        "the view's snapshot predates the claim"
    );
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a's next heartbeat",
    )
    .await;
    let view = next.group(&group).unwrap_or_else(|| {
        panic!(
            "a claim committed while the view was built was answered unchanged: {:?}",
            next.unchanged
        )
    });
    assert_eq!(view.view.claimable, 6);
}

/// A member whose renewal is in flight when another node's view is built looks dead to the
/// view's snapshot (its committed expiry has passed), so the view leaves it out; the heartbeat
/// cannot remove it (its node row is locked by the renewal), so the stamp it gives is one no
/// counter matches: once the renewal commits, the next heartbeat gives the view again, with the
/// member. A stamp at the counter would make every later answer "unchanged" while the member
/// lives, its load missing from every fair share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_renewing_while_a_view_is_built_is_not_left_out() {
    let (url, group, [(a, _), (b, b_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    let mut renewal = connect(&url).await;
    // b's session is short; it renews just in time, and the renewal stays uncommitted.
    ops::leave(&mut admin, None, &group, b, b_beat.session)
        .await
        .expect("b leaves its long session");
    let b_beat = member(
        &mut admin,
        &group,
        b,
        Ttl::from_secs(2).expect("ttl"),
        "b joins",
    )
    .await;
    exec(&mut renewal, "BEGIN").await;
    let renewed = renew(&mut renewal, b, long(), &[], "b renews").await;
    assert!(
        !renewed.new_session,
        "b renewed too late; the race was not set up"
    );
    wait_server_past(&mut admin, b_beat.expires_at).await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert!(
        view.view.members.iter().all(|m| m.worker != b),
        "the view's snapshot sees b's old expiry: {:?}",
        view.view.members
    );
    exec(&mut renewal, "COMMIT").await;
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&first),
        "a's next heartbeat",
    )
    .await;
    let view = next.group(&group).unwrap_or_else(|| {
        panic!(
            "a member the view left out while it renewed was answered unchanged: {:?}",
            next.unchanged
        )
    });
    assert!(
        view.view.members.iter().any(|m| m.worker == b),
        "{:?}",
        view.view.members
    );
}

/// A member whose session ends moves no counter by itself: the stamp carries the earliest
/// expiry among the other members, and past it the heartbeat looks again (without building the
/// view if no member died). Here b dies: a's stamp, past its `until`, gets the view without b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_session_ended_is_never_answered_unchanged() {
    let (url, group, [(a, _), (b, b_beat)]) = two_members(8, long()).await;
    let mut admin = connect(&url).await;
    let mut hearts = connect(&url).await;
    ops::leave(&mut admin, None, &group, b, b_beat.session)
        .await
        .expect("b leaves its long session");
    let b_beat = member(
        &mut admin,
        &group,
        b,
        Ttl::from_secs(2).expect("ttl"),
        "b joins",
    )
    .await;
    let first = renew(&mut hearts, a, long(), &[], "a's views").await;
    let view = first.group(&group).expect("a's view");
    assert!(view.view.members.iter().any(|m| m.worker == b));
    assert_eq!(view.stamp.until(), Some(b_beat.expires_at));
    // Before b's expiry the group is unchanged; after it, it is not.
    let steady = renew(&mut hearts, a, long(), &stamps(&first), "a renews").await;
    if steady.observed_at < b_beat.expires_at {
        assert!(steady.groups.is_empty(), "{:?}", steady.groups);
    }
    wait_server_past(&mut admin, b_beat.expires_at).await;
    let next = renew(
        &mut hearts,
        a,
        long(),
        &stamps(&steady),
        "a after b's expiry",
    )
    .await;
    let view = next
        .group(&group)
        .unwrap_or_else(|| panic!("a dead member was answered unchanged: {:?}", next.unchanged));
    assert!(
        view.view.members.iter().all(|m| m.worker != b),
        "{:?}",
        view.view.members
    );
}

/// A new session moves the change counters of every group the node was in; another node's
/// heartbeat moves them one by one, by bytes, as it removes dead members group after group. The
/// new session takes the counters in that same order, so the two never deadlock: here a
/// transaction holds the first counter (as a heartbeat that moved it would) while the new
/// session waits for it, then takes the second, which the new session must not hold yet. The
/// groups' rows are stored in the other order (made last-first), and the new session's
/// connection plans without index scans, so an unordered update would take the second first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_takes_its_groups_counters_in_the_heartbeats_order() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut holder = connect(&db.url).await;
    let mut heart = connect(&db.url).await;
    let (first_group, second_group) = (
        GroupName::new("a-first").expect("name"),
        GroupName::new("z-second").expect("name"),
    );
    for g in [&second_group, &first_group] {
        ops::ensure_group(&mut admin, None, g, count(SHARDS))
            .await
            .expect("ensure");
    }
    let a = NodeId::new();
    let short = Ttl::from_secs(2).expect("ttl");
    let first = renew(&mut admin, a, short, &[], "a starts").await;
    for g in [&second_group, &first_group] {
        ops::join(&mut admin, None, g, a, first.session)
            .await
            .expect("a joins");
    }
    wait_server_past(&mut admin, first.expires_at).await;
    exec(
        &mut holder,
        "BEGIN; UPDATE lease.group_changes SET version = version WHERE group_name = 'a-first'",
    )
    .await;
    exec(
        &mut heart,
        "SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off",
    )
    .await;
    let pid = backend_pid(&mut heart).await;
    let renewal = tokio::spawn(async move {
        let beat = renew(&mut heart, a, long(), &[], "a's new session").await;
        (beat, heart)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    // Waiting for the first counter, the new session holds the second: this waits for it, and
    // the server (deadlock_timeout) aborts one of the two.
    exec(
        &mut holder,
        "SET LOCAL lock_timeout = '5s'; \
         UPDATE lease.group_changes SET version = version WHERE group_name = 'z-second'",
    )
    .await;
    exec(&mut holder, "COMMIT").await;
    let (beat, _heart) = renewal.await.expect("the heartbeat task");
    assert!(beat.new_session, "a's heartbeat after its expiry");
    let snap = ops::snapshot(&mut admin, None, &second_group)
        .await
        .expect("snapshot");
    assert!(snap.members.is_empty(), "{:?}", snap.members);
}

/// H9: a new session removes dead nodes in no group, skipping a row another transaction holds
/// (here as a claimer judging that node's buckets does): it neither waits for the holder nor
/// removes the row under it, and a later new session removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_session_skips_a_dead_node_row_another_transaction_holds() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let mut holder = connect(&db.url).await;
    let mut starter = connect(&db.url).await;
    let gone = NodeId::new();
    let first = renew(
        &mut admin,
        gone,
        Ttl::from_secs(1).expect("ttl"),
        &[],
        "a node",
    )
    .await;
    wait_server_past(&mut admin, first.expires_at).await;
    exec(
        &mut holder,
        &format!("BEGIN; SELECT 1 FROM lease.nodes WHERE node_id = '{gone}' FOR SHARE"),
    )
    .await;
    exec(&mut starter, "SET lock_timeout = '5s'").await;
    let started = renew(&mut starter, NodeId::new(), long(), &[], "a new node").await;
    assert!(started.new_session);
    let listed = |s: &NodesSnapshot| s.nodes.iter().any(|n| n.node == gone);
    assert!(
        listed(&ops::nodes(&mut admin, None).await.expect("nodes")),
        "a held row was removed"
    );
    exec(&mut holder, "COMMIT").await;
    renew(&mut starter, NodeId::new(), long(), &[], "another new node").await;
    assert!(
        !listed(&ops::nodes(&mut admin, None).await.expect("nodes")),
        "a dead node in no group outlived a new session"
    );
}

// ---- operators' controls (migration 8) -----------------------------------------------------

fn quarantine_for(secs: u64) -> Option<lease_core::QuarantineFor> {
    Some(lease_core::QuarantineFor::new(Duration::from_secs(secs)).expect("a quarantine"))
}

fn weight(w: u32) -> lease_core::MemberControl {
    lease_core::MemberControl::Weight(lease_core::Weight::new(w).expect("a weight"))
}

fn mode(m: lease_core::MemberMode) -> lease_core::MemberControl {
    lease_core::MemberControl::Mode(m)
}

/// C10 against a claim's snapshot: a bucket quarantined after a claim's statement took its
/// snapshot (here while the claim waits for its own member row) is never taken by it.
/// `lease.quarantine` writes the bucket row's `quarantined_until` and claims test that
/// column, so the claim's walk, finding the row changed since its snapshot, re-checks the new
/// version and skips it; a quarantine still in flight holds the row, and the walk skips it
/// without waiting (the claim then waits only for the change counter that quarantine moved).
/// Measured with the claims checking `lease.quarantines` instead (in the statement's
/// snapshot, which lacks the quarantine): b's claim took buckets 0, 1 and 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_never_takes_a_bucket_quarantined_after_its_snapshot() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut claimer = connect(&url).await;
    let operator_pid = backend_pid(&mut operator).await;

    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    exec(
        &mut gate,
        &format!("BEGIN; SELECT 1 FROM lease.members WHERE node_id = '{b}' FOR UPDATE"),
    )
    .await;
    let pid = backend_pid(&mut claimer).await;
    let claim = {
        let group = group.clone();
        tokio::spawn(async move {
            let won = ops::claim(
                &mut claimer,
                None,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, claimer)
        })
    };
    wait_blocked_on_lock(&mut admin, pid).await;
    // Meanwhile bucket 1 goes under quarantine (committed), and bucket 2's quarantine is in
    // flight when the claim walks.
    assert!(
        ops::quarantine(&mut operator, None, &group, Bucket(1), quarantine_for(60))
            .await
            .expect("quarantine bucket 1")
    );
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::quarantine(&mut operator, None, &group, Bucket(2), quarantine_for(60))
            .await
            .expect("quarantine bucket 2")
    );
    exec(&mut gate, "COMMIT").await;
    // The claim walks past bucket 2 and then waits for the group's change counter, which the
    // quarantine in flight moved: let it commit then.
    wait_blocked_by(&mut admin, pid, operator_pid).await;
    exec(&mut operator, "COMMIT").await;
    let (won, _claimer) = claim.await.expect("the claim task");
    let taken: Vec<u32> = won.iter().map(|l| l.bucket.0).collect();
    assert!(
        !taken.contains(&1),
        "b took bucket 1, quarantined after its claim's snapshot: {taken:?}"
    );
    assert!(
        !taken.contains(&2),
        "b took bucket 2 while its quarantine was in flight: {taken:?}"
    );
    assert_eq!(taken, [0, 3], "the other buckets are taken");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    for q in [1, 2] {
        let info = &snap.buckets[q];
        assert_eq!(
            (info.owner, info.quarantined_until.is_some()),
            (None, true),
            "bucket {q}: {info:?}"
        );
    }
}

/// C11 and a control of the claimer's member serialize on its member row: `lease.control`
/// share-locks it (`FOR KEY SHARE`) and a claim holds it (`FOR UPDATE`) to its commit, judging
/// its mode once it holds the row on the latest committed state (`lease.may_claim`). So a
/// claim waiting for a cordon's transaction takes nothing once the cordon commits, and a
/// cordon waiting for a claim's transaction lets it keep what it took, then stops the next
/// claim: once a cordon returns, no claim of that member commits having taken something.
/// Measured without each rule: with the mode read in the claim's snapshot (no
/// `lease.may_claim`), the waiting claim took all four buckets after the cordon committed;
/// without the control's lock on the member row, the claim judged its mode before the cordon
/// committed and waited only at the change counter the cordon had moved: it took all four
/// buckets too, committing after the cordon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_a_cordon_of_its_member_serialize() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut claimer = connect(&url).await;
    let claimer_pid = backend_pid(&mut claimer).await;
    let operator_pid = backend_pid(&mut operator).await;

    // A cordon in flight; b's claim waits for it, and once it commits takes nothing.
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::control(
            &mut operator,
            &group,
            b,
            mode(lease_core::MemberMode::Cordoned)
        )
        .await
        .expect("cordon")
    );
    let claim = {
        let group = group.clone();
        tokio::spawn(async move {
            let won = ops::claim(
                &mut claimer,
                None,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, claimer)
        })
    };
    wait_blocked_on_lock(&mut admin, claimer_pid).await;
    exec(&mut operator, "COMMIT").await;
    let (won, mut claimer) = claim.await.expect("the claim task");
    assert!(
        won.is_empty(),
        "a claim that waited for a cordon took {won:?} after it committed"
    );

    // Uncordoned. A claim in flight (it took two buckets); a cordon waits for it.
    ops::control(&mut admin, &group, b, mode(lease_core::MemberMode::Active))
        .await
        .expect("uncordon");
    exec(&mut claimer, "BEGIN").await;
    let won = ops::claim(
        &mut claimer,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b's claim");
    assert_eq!(won.len(), 2);
    let cordon = {
        let group = group.clone();
        tokio::spawn(async move {
            ops::control(
                &mut operator,
                &group,
                b,
                mode(lease_core::MemberMode::Cordoned),
            )
            .await
            .expect("cordon")
        })
    };
    wait_blocked_on_lock(&mut admin, operator_pid).await;
    exec(&mut claimer, "COMMIT").await;
    assert!(
        cordon.await.expect("the cordon task"),
        "the cordon changed nothing"
    );
    let again = ops::claim(
        &mut claimer,
        None,
        &group,
        b,
        b_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("b's next claim");
    assert!(again.is_empty(), "a cordoned member claimed {again:?}");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    let member = snap.members.iter().find(|m| m.worker == b).expect("b");
    assert_eq!(
        (member.owned, member.mode),
        (2, lease_core::MemberMode::Cordoned),
        "b keeps what it claimed before the cordon"
    );
}

/// K3 under concurrency: two controls of one member, one setting its weight and one its mode,
/// both take effect, whether the second finds no control row yet (it waits for the first's
/// insert, then changes the row the first inserted), or a row (it waits for the row's lock and
/// changes the latest committed value), in round 3 a row just set back to weight 1 (it stays,
/// K2). `lease.control` reads the stored value under the row's lock and
/// writes from it. Measured without the lock (the value read in the statement's snapshot): the
/// second round lost the first control's weight (5), leaving weight 3 and draining.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_controls_of_one_member_both_take_effect() {
    let (url, group, [_, (b, _)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut first = connect(&url).await;
    let mut second = connect(&url).await;
    let second_pid = backend_pid(&mut second).await;
    use lease_core::MemberMode::{Active, Cordoned, Draining};
    // (the first control, the second one, what b ends with)
    let rounds = [
        (weight(3), mode(Cordoned), (3, Cordoned)),
        (weight(5), mode(Draining), (5, Draining)),
        (mode(Active), weight(4), (4, Active)),
    ];
    for ((one, two, expected), round) in rounds.into_iter().zip(1..) {
        if round == 3 {
            // Weight 1 before round 3 (the row stays, at weight 1 and draining).
            ops::control(&mut admin, &group, b, weight(1))
                .await
                .expect("weight 1");
        }
        exec(&mut first, "BEGIN").await;
        assert!(
            ops::control(&mut first, &group, b, one)
                .await
                .expect("the first control")
        );
        let concurrent = {
            let group = group.clone();
            tokio::spawn(async move {
                let changed = ops::control(&mut second, &group, b, two)
                    .await
                    .expect("the second control");
                (changed, second)
            })
        };
        wait_blocked_on_lock(&mut admin, second_pid).await;
        exec(&mut first, "COMMIT").await;
        let (changed, back) = concurrent.await.expect("the second control's task");
        second = back;
        assert!(changed, "round {round}: the second control changed nothing");
        let snap = ops::snapshot(&mut admin, None, &group)
            .await
            .expect("snapshot");
        let member = snap.members.iter().find(|m| m.worker == b).expect("b");
        assert_eq!(
            (member.weight, member.mode),
            expected,
            "round {round}: a control was lost"
        );
    }
}

/// A quarantine and a resize of its group: each lands in one generation. A quarantine in
/// flight holds its row, and the resize (which deletes the group's quarantines before it moves
/// the bucket rows, in the order a quarantine locks them) waits, then lifts it (Q4). A
/// quarantine made while a resize is in flight waits for it (its row's foreign-key check
/// share-locks the group's row, which the resize holds) and then writes the new generation's
/// bucket row, in a statement of its own: the quarantine and the bucket row agree. One whose
/// bucket is out of the new count finds no bucket row to write: it undoes its row and is out
/// of range, nothing written. Measured without the undo: the shrinking round's quarantine of
/// bucket 12 succeeded (`Ok(true)`) and left its row in a group of 4 buckets. (The order of
/// the locks, which keeps a quarantine and a resize out of a deadlock, is not tested here: it
/// would take each statement stopped between two of its row locks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_racing_a_resize_lands_in_one_generation() {
    let (url, group, _) = two_members(4, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut resizer = connect(&url).await;
    let mut gate = connect(&url).await;
    let operator_pid = backend_pid(&mut operator).await;
    let resizer_pid = backend_pid(&mut resizer).await;
    let rows = "SELECT (SELECT count(*) FROM lease.quarantines q WHERE q.group_name = g.name)
                     = (SELECT count(*) FROM lease.shards s
                         WHERE s.group_name = g.name AND s.quarantined_until IS NOT NULL)
                   AS yes
              FROM lease.groups g";

    // A quarantine in flight; the resize waits for it, then lifts it.
    exec(&mut operator, "BEGIN").await;
    ops::quarantine(&mut operator, None, &group, Bucket(1), quarantine_for(60))
        .await
        .expect("quarantine");
    let resize = {
        let group = group.clone();
        tokio::spawn(async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(4), count(8))
                .await
                .expect("resize 4 -> 8");
            (outcome, resizer)
        })
    };
    wait_blocked_on_lock(&mut admin, resizer_pid).await;
    exec(&mut operator, "COMMIT").await;
    let (_, mut resizer) = resize.await.expect("the resize task");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert!(
        snap.buckets.iter().all(|b| b.quarantined_until.is_none()),
        "a quarantine outlived the resize"
    );
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );

    // A resize in flight (held at its last statement, which waits for the change counter); a
    // quarantine of bucket 2 waits for it, then quarantines the new generation's bucket 2.
    exec(
        &mut gate,
        &format!(
            "BEGIN; SELECT 1 FROM lease.group_changes WHERE group_name = '{}' FOR UPDATE",
            group.as_str()
        ),
    )
    .await;
    let resize = {
        let group = group.clone();
        tokio::spawn(async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(8), count(16))
                .await
                .expect("resize 8 -> 16");
            (outcome, resizer)
        })
    };
    wait_blocked_on_lock(&mut admin, resizer_pid).await;
    let quarantine = {
        let group = group.clone();
        tokio::spawn(async move {
            let result =
                ops::quarantine(&mut operator, None, &group, Bucket(2), quarantine_for(60)).await;
            (result, operator)
        })
    };
    wait_blocked_on_lock(&mut admin, operator_pid).await;
    exec(&mut gate, "COMMIT").await;
    let (_, mut resizer) = resize.await.expect("the resize task");
    let (result, mut operator) = quarantine.await.expect("the quarantine task");
    assert!(result.expect("the quarantine"), "it changed nothing");
    let snap = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot");
    assert_eq!(snap.shard_count, count(16));
    let quarantined: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.quarantined_until.is_some())
        .map(|b| b.bucket.0)
        .collect();
    assert_eq!(quarantined, [2], "the new generation's bucket 2");
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );

    // A shrinking resize in flight; a quarantine of bucket 12 (in range when it reads the
    // count) finds no bucket 12 once the resize commits.
    exec(
        &mut gate,
        &format!(
            "BEGIN; SELECT 1 FROM lease.group_changes WHERE group_name = '{}' FOR UPDATE",
            group.as_str()
        ),
    )
    .await;
    let resize = {
        let group = group.clone();
        tokio::spawn(async move {
            ops::resize(&mut resizer, None, &group, count(16), count(4))
                .await
                .expect("resize 16 -> 4")
        })
    };
    wait_blocked_on_lock(&mut admin, resizer_pid).await;
    let quarantine = {
        let group = group.clone();
        tokio::spawn(async move {
            ops::quarantine(&mut operator, None, &group, Bucket(12), quarantine_for(60)).await
        })
    };
    wait_blocked_on_lock(&mut admin, operator_pid).await;
    exec(&mut gate, "COMMIT").await;
    resize.await.expect("the resize task");
    match quarantine.await.expect("the quarantine task") {
        Err(StoreError::BucketOutOfRange {
            bucket,
            shard_count,
            ..
        }) => assert_eq!((bucket, shard_count), (Bucket(12), count(4))),
        other => panic!("a quarantine of bucket 12 of 4: {other:?}"),
    }
    assert!(
        flag(
            &mut admin,
            "SELECT NOT EXISTS (SELECT 1 FROM lease.quarantines) AS yes",
            None
        )
        .await,
        "a quarantine of a bucket out of range was kept"
    );
    assert!(
        flag(&mut admin, rows, None).await,
        "rows and buckets differ"
    );
}

/// Q3 when a quarantine ends and is then lifted: a stamp whose view counted the quarantine is
/// never answered "unchanged" once it ended, even when a lift came in between. The look at a
/// group past a stamp's `until` (the counter unchanged) finds the quarantine rows that ended
/// since that `until`, and lifting a quarantine that has ended writes nothing and leaves its
/// row for that look. Measured with the lift deleting the ended row (without moving the
/// counter, since nothing visible changed): the heartbeat answered "unchanged" to the view
/// that still counted the quarantine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_that_ended_and_was_lifted_is_never_answered_unchanged() {
    let (url, group, [(a, _), _]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut conn = connect(&url).await;
    let first = renew(&mut conn, a, long(), &[], "a's view").await;
    assert!(
        ops::quarantine(
            &mut admin,
            None,
            &group,
            Bucket(1),
            Some(lease_core::QuarantineFor::new(Duration::from_millis(500)).expect("duration"))
        )
        .await
        .expect("quarantine")
    );
    let counted = renew(&mut conn, a, long(), &stamps(&first), "a's view again").await;
    let view = &counted.group(&group).expect("the view is given").view;
    assert_eq!(view.quarantined, 1);
    let end = ops::snapshot(&mut admin, None, &group)
        .await
        .expect("snapshot")
        .buckets[1]
        .quarantined_until
        .expect("bucket 1's quarantine");
    wait_server_past(&mut admin, end).await;
    assert!(
        !ops::quarantine(&mut admin, None, &group, Bucket(1), None)
            .await
            .expect("lift"),
        "lifting a quarantine that ended wrote"
    );
    let after = renew(&mut conn, a, long(), &stamps(&counted), "a's heartbeat").await;
    let given = after
        .group(&group)
        .unwrap_or_else(|| panic!("answered unchanged: {:?}", after.unchanged));
    assert_eq!(given.view.quarantined, 0);
}

// ---- hand-over (HO1-HO3) -----------------------------------------------------------------

/// The incarnation [`renew`] heartbeats `worker` as: the process holding its session.
fn process_of(worker: NodeId) -> Incarnation {
    Incarnation::from_uuid(worker.as_uuid())
}

/// `node`'s row as `nodes()` lists it.
async fn node_info(conn: &mut AsyncPgConnection, node: NodeId) -> lease_core::NodeInfo {
    let listed: NodesSnapshot = ops::nodes(conn, None).await.expect("nodes");
    listed
        .nodes
        .into_iter()
        .find(|n| n.node == node)
        .expect("the node is listed")
}

/// A hand-over that waited for the node row (which a claimer's share lock does not hold off)
/// until past the session's expiry, while a claimer judged the session dead and took its
/// buckets, must hand nothing over (HO1: only a live session): `lease.hand_over` reads the
/// clock once it holds the row's lock. On a clock read before the wait it would mark a
/// session handed over, live to `nodes()` and to its successor, whose buckets another node
/// now holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_that_waited_for_the_node_row_past_its_expiry_hands_nothing_over() {
    let s = setup(Ttl::from_secs(3).expect("ttl")).await;
    let mut admin = connect(&s.url).await;
    let mut gate = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut claimer = connect(&s.url).await;
    exec(
        &mut gate,
        &format!(
            "BEGIN; SELECT 1 FROM lease.nodes WHERE node_id = '{}' FOR SHARE",
            s.a
        ),
    )
    .await;
    let pid = backend_pid(&mut handing).await;
    let a = s.a;
    let hand_over = tokio::spawn(async move {
        let kept = ops::hand_over(&mut handing, None, a, process_of(a), long()).await;
        (kept, handing)
    });
    wait_blocked_on_lock(&mut admin, pid).await;
    // The precondition of the race: the hand-over began before the expiry.
    assert!(
        flag(
            &mut admin,
            "SELECT clock_timestamp() < $1 AS yes",
            Some(s.first.expires_at)
        )
        .await,
        "the hand-over started after the expiry; the race was not set up"
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
    assert_eq!(taken.len(), SHARDS as usize, "b did not take a's buckets");
    exec(&mut gate, "COMMIT").await;
    let (kept, mut handing) = hand_over.await.expect("the hand-over task");
    assert_eq!(
        kept.expect("the hand-over"),
        None,
        "a session dead before the hand-over held its row was handed over"
    );
    let info = node_info(&mut handing, s.a).await;
    assert!(!info.handed_over && !info.live, "{info:?}");
    // Its successor starts afresh, owning nothing.
    let next = ops::heartbeat(
        &mut handing,
        None,
        s.a,
        Incarnation::new(),
        long(),
        &MemberMetadata::empty(),
        &[],
    )
    .await
    .expect("the successor's heartbeat");
    assert!(next.new_session, "the successor took over a dead session");
    assert_sole_owner(&s, s.b).await;
}

/// The process that handed its session over renews it (a retried heartbeat) while the
/// hand-over's transaction holds the node row: the renewal waits, and once the hand-over
/// commits it takes the session over as any heartbeat after a hand-over does (HO3): the same
/// session, no longer handed over, expiring a ttl after the renewal. The renewal read the
/// node's groups and counters before it waited (the hand-over moved them), so only
/// `NOT n.handed_over`, checked again on the row's new version, sends it to the take-over;
/// without it the renewal would extend the session and leave it marked handed over, which no
/// order of the two calls gives (another process could then take over a session its holder
/// just renewed). Here the steady renewal (`STEADY_RENEWAL`, stamps handed in), which finds
/// nothing to renew and falls to `lease.heartbeat`, whose renewal must skip the row too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_renewal_waiting_for_a_hand_over_takes_the_session_over() {
    renewal_waits_for_a_hand_over(true).await;
}

/// The same race for the full heartbeat's renewal (`lease.heartbeat`, no stamps handed in).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_waiting_for_a_hand_over_takes_the_session_over() {
    renewal_waits_for_a_hand_over(false).await;
}

async fn renewal_waits_for_a_hand_over(steady: bool) {
    let s = setup(long()).await;
    let mut admin = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut renewal = connect(&s.url).await;
    let seen = if steady {
        stamps(&renew(&mut renewal, s.a, long(), &[], "a's views").await)
    } else {
        Vec::new()
    };
    exec(&mut handing, "BEGIN").await;
    let kept = ops::hand_over(&mut handing, None, s.a, process_of(s.a), short())
        .await
        .expect("the hand-over")
        .expect("a's live session is handed over");
    let (handing_pid, renewal_pid) = (
        backend_pid(&mut handing).await,
        backend_pid(&mut renewal).await,
    );
    let (group, a) = (s.group.clone(), s.a);
    let late = tokio::spawn(async move {
        let beat = renew(&mut renewal, a, long(), &seen, "a's renewal").await;
        (beat, renewal)
    });
    wait_blocked_by(&mut admin, renewal_pid, handing_pid).await;
    exec(&mut handing, "COMMIT").await;
    let (beat, mut renewal) = late.await.expect("the renewal task");
    assert!(!beat.new_session, "the session handed over was not kept");
    assert_eq!(beat.session, s.first.session);
    assert!(
        beat.expires_at > kept,
        "the renewal kept the hand-over's expiry"
    );
    let info = node_info(&mut renewal, s.a).await;
    assert!(
        !info.handed_over,
        "a session renewed after its hand-over is still marked handed over: {info:?}"
    );
    assert_eq!(info.expires_at, beat.expires_at);
    assert_eq!(Beat::of(&beat, &group).owned.len(), SHARDS as usize);
    // It is the renewing process's again: another process is refused (H7).
    let second = ops::heartbeat(
        &mut renewal,
        None,
        s.a,
        Incarnation::new(),
        long(),
        &MemberMetadata::empty(),
        &[],
    )
    .await;
    assert_eq!(
        second.map(|b| b.session).map_err(|e| e.kind()),
        Err(ErrorKind::NodeIdInUse),
        "another process took over a session its holder had renewed"
    );
    assert_sole_owner(&s, s.a).await;
}

/// The next process's first heartbeat while the hand-over's transaction holds the node row:
/// it waits, and takes the session over with its buckets once the hand-over commits (HO3),
/// because the slow path judges the row it locked (`FOR UPDATE`), the hand-over's. Judged on
/// the version its snapshot saw (another incarnation's live session, not handed over) it would
/// be refused with `NodeIdInUse` for a session meant for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_waiting_for_a_hand_over_takes_the_session_over() {
    let s = setup(long()).await;
    let mut admin = connect(&s.url).await;
    let mut handing = connect(&s.url).await;
    let mut successor = connect(&s.url).await;
    exec(&mut handing, "BEGIN").await;
    ops::hand_over(&mut handing, None, s.a, process_of(s.a), long())
        .await
        .expect("the hand-over")
        .expect("a's live session is handed over");
    let (handing_pid, successor_pid) = (
        backend_pid(&mut handing).await,
        backend_pid(&mut successor).await,
    );
    let (group, a) = (s.group.clone(), s.a);
    let next = Incarnation::new();
    let late = tokio::spawn(async move {
        let beat = ops::heartbeat(
            &mut successor,
            None,
            a,
            next,
            long(),
            &MemberMetadata::empty(),
            &[],
        )
        .await;
        (beat, successor)
    });
    // It waits for the hand-over's lock, or (judging an older version of the row) answers
    // at once: then the check below says what it answered.
    let blocked = format!("SELECT {handing_pid} = ANY (pg_blocking_pids({successor_pid})) AS yes");
    for _ in 0..2_000 {
        if late.is_finished() || flag(&mut admin, &blocked, None).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    exec(&mut handing, "COMMIT").await;
    let (beat, mut successor) = late.await.expect("the successor's task");
    let beat = beat.unwrap_or_else(|e| panic!("the successor was not let take over: {e}"));
    assert!(!beat.new_session);
    assert_eq!(beat.session, s.first.session);
    let owned = Beat::of(&beat, &group).owned;
    assert_eq!(
        owned
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>(),
        s.leases
            .iter()
            .map(|l| (l.bucket, l.token))
            .collect::<Vec<_>>()
    );
    let info = node_info(&mut successor, s.a).await;
    assert!(!info.handed_over && info.live, "{info:?}");
    assert_sole_owner(&s, s.a).await;
}

// ---- a bucket's history (T1-T5, migration 9) ------------------------------------------------

/// Each tenure of `bucket` as (owner, token, how it ended).
async fn tenures(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    bucket: Bucket,
) -> Vec<(NodeId, i64, Option<lease_core::EndReason>)> {
    ops::history(conn, group, bucket)
        .await
        .expect("history")
        .iter()
        .map(|t| (t.owner, t.token.0, t.ended.map(|e| e.reason)))
        .collect()
}

/// T4 against a release in flight: a resize clears the tenure a release ended while the resize
/// waited for that release's bucket row. The resize deletes the group's tenures in a statement
/// after the one that moves the bucket rows (RESIZE_OPEN), whose snapshot is taken once the
/// move has waited for every transaction holding a bucket row, so it sees the ends they wrote.
/// With the delete before the move (in RESIZE_DROP_OLD, whose snapshot lacks the release's
/// uncommitted ring row) the new generation's bucket of that number would show a's released
/// tenure of the old one. (Before the open tenure moved to the bucket row, this test held a
/// claim in flight: a claim of a free bucket now writes no ring row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_clears_the_tenure_a_concurrent_release_ended() {
    let (url, group, [(a, a_beat), _]) = two_members(2, long()).await;
    let mut admin = connect(&url).await;
    let mut releaser = connect(&url).await;
    let mut resizer = connect(&url).await;
    let (releaser_pid, resizer_pid) = (
        backend_pid(&mut releaser).await,
        backend_pid(&mut resizer).await,
    );

    let won = ops::claim(
        &mut releaser,
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
    exec(&mut releaser, "BEGIN").await;
    let released = ops::release(
        &mut releaser,
        None,
        &group,
        a,
        a_beat.session,
        &[won[0].bucket],
    )
    .await
    .expect("a releases");
    assert_eq!(released, [won[0].bucket]);
    let resize = {
        let group = group.clone();
        tokio::spawn(
            async move { ops::resize(&mut resizer, None, &group, count(2), count(4)).await },
        )
    };
    wait_blocked_by(&mut admin, resizer_pid, releaser_pid).await;
    exec(&mut releaser, "COMMIT").await;
    resize
        .await
        .expect("the resize task")
        .expect("the resize succeeds");
    for b in 0..4 {
        assert_eq!(
            tenures(&mut admin, &group, Bucket(b)).await,
            [],
            "bucket {b} of the new generation shows a tenure of the old one (a released old \
             bucket {})",
            won[0].bucket.0
        );
    }
}

/// T1, T3 against a claim's snapshot: a claim that takes a dead session's bucket numbers the
/// tenure it ends (expired) from the bucket row's count of ended tenures as its UPDATE leaves
/// it, the row's latest version, so a tenure ended after the claim's snapshot (here while the
/// claim waits for its own member row) keeps its ring slot. a holds every bucket when b's
/// claim takes its snapshot; meanwhile a releases them (ended tenure 1) and claims them again
/// with the same session (its open tenure, no ring row), then its session runs out; b's claim
/// then takes them from a's dead session and ends a's second tenure as expired, ended tenure 2.
/// With the number read in the claim's snapshot (the count 0, before a's release), a's expired
/// tenure would take the slot of its released one, and the history would lose that holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_numbers_the_tenure_it_ends_after_one_ended_since_its_snapshot() {
    use lease_core::EndReason::{Expired, Released};
    // a's session lasts 1 s, b's 60 s; every call runs at a client time, a's before its
    // session's end, b's claim after it.
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(SHARDS, short()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut claimer = connect(&url).await;
    let pid = backend_pid(&mut claimer).await;
    let base = a_beat.observed_at;
    let at = move |ms: i64| Some(base + chrono::Duration::milliseconds(ms));
    let every: Vec<Bucket> = (0..SHARDS).map(Bucket).collect();

    let first = ops::claim(
        &mut admin,
        at(100),
        &group,
        a,
        a_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(first.len(), SHARDS as usize);
    // Hold b's member row, so b's claim takes its snapshot and then waits for the row lock.
    exec(
        &mut gate,
        &format!("BEGIN; SELECT 1 FROM lease.members WHERE node_id = '{b}' FOR UPDATE"),
    )
    .await;
    let b_at = at(2_000);
    let claim = {
        let group = group.clone();
        tokio::spawn(async move {
            ops::claim(
                &mut claimer,
                b_at,
                &group,
                b,
                b_beat.session,
                SHARDS,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim")
        })
    };
    wait_blocked_on_lock(&mut admin, pid).await;
    let released = ops::release(&mut admin, at(200), &group, a, a_beat.session, &every)
        .await
        .expect("a releases");
    assert_eq!(released, every);
    let again = ops::claim(
        &mut admin,
        at(300),
        &group,
        a,
        a_beat.session,
        SHARDS,
        Takeover::Allowed,
    )
    .await
    .expect("a claims again");
    assert_eq!(again.len(), SHARDS as usize);
    exec(&mut gate, "COMMIT").await;
    let taken = claim.await.expect("the claim task");
    assert_eq!(taken.len(), SHARDS as usize, "b takes every bucket");
    for bucket in every {
        let (t1, t2) = (
            first
                .iter()
                .find(|l| l.bucket == bucket)
                .expect("first")
                .token
                .0,
            again
                .iter()
                .find(|l| l.bucket == bucket)
                .expect("again")
                .token
                .0,
        );
        let t3 = taken
            .iter()
            .find(|l| l.bucket == bucket)
            .expect("taken")
            .token
            .0;
        assert_eq!(
            tenures(&mut admin, &group, bucket).await,
            [
                (a, t1, Some(Released)),
                (a, t2, Some(Expired)),
                (b, t3, None)
            ],
            "bucket {}",
            bucket.0
        );
    }
}

/// T2 and a drain of the releasing member: a release judges its owner's mode once it holds
/// its member row, on the latest committed state (`lease.mode_of`); `lease.control` share-locks
/// that row, so a release that waited for a drain's transaction ends its tenures as drained.
/// Measured with the mode read in the release's snapshot (the control row, inserted after it,
/// missing): the tenures ended as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_waiting_for_a_drain_ends_its_tenures_as_drained() {
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut operator = connect(&url).await;
    let mut releaser = connect(&url).await;
    let (operator_pid, releaser_pid) = (
        backend_pid(&mut operator).await,
        backend_pid(&mut releaser).await,
    );
    let won = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    let held: Vec<Bucket> = won.iter().map(|l| l.bucket).collect();

    // A drain in flight; b's release waits for it.
    exec(&mut operator, "BEGIN").await;
    assert!(
        ops::control(
            &mut operator,
            &group,
            b,
            mode(lease_core::MemberMode::Draining)
        )
        .await
        .expect("drain")
    );
    let release = {
        let (group, held) = (group.clone(), held.clone());
        tokio::spawn(async move {
            ops::release(&mut releaser, None, &group, b, b_beat.session, &held)
                .await
                .expect("b's release")
        })
    };
    wait_blocked_by(&mut admin, releaser_pid, operator_pid).await;
    exec(&mut operator, "COMMIT").await;
    assert_eq!(release.await.expect("the release task"), held);
    for l in &won {
        assert_eq!(
            tenures(&mut admin, &group, l.bucket).await,
            [(b, l.token.0, Some(lease_core::EndReason::Drained))],
            "bucket {}",
            l.bucket.0
        );
    }
}

/// T2 against a release's snapshot: a bucket quarantined after a release's statement took its
/// snapshot (here while the release waits for its member row) ends its tenure as
/// quarantined. The release judges the quarantine on the bucket row it updates, whose
/// `quarantined_until` `lease.quarantine` writes: Postgres updates the row's latest version.
/// Measured with the quarantine looked up in `lease.quarantines` (in the release's snapshot,
/// which lacks it): the quarantined bucket's tenure ended as released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_ends_as_quarantined_a_bucket_quarantined_after_its_snapshot() {
    use lease_core::EndReason::{Quarantined, Released};
    let (url, group, [_, (b, b_beat)]) = two_members(SHARDS, long()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut releaser = connect(&url).await;
    let pid = backend_pid(&mut releaser).await;
    let won = ops::claim(
        &mut admin,
        None,
        &group,
        b,
        b_beat.session,
        2,
        Takeover::Allowed,
    )
    .await
    .expect("b claims");
    let held: Vec<Bucket> = won.iter().map(|l| l.bucket).collect();

    exec(
        &mut gate,
        &format!("BEGIN; SELECT 1 FROM lease.members WHERE node_id = '{b}' FOR UPDATE"),
    )
    .await;
    let release = {
        let (group, held) = (group.clone(), held.clone());
        tokio::spawn(async move {
            ops::release(&mut releaser, None, &group, b, b_beat.session, &held)
                .await
                .expect("b's release")
        })
    };
    wait_blocked_on_lock(&mut admin, pid).await;
    assert!(
        ops::quarantine(&mut admin, None, &group, held[1], quarantine_for(60))
            .await
            .expect("quarantine")
    );
    exec(&mut gate, "COMMIT").await;
    assert_eq!(release.await.expect("the release task"), held);
    assert_eq!(
        tenures(&mut admin, &group, held[0]).await,
        [(b, won[0].token.0, Some(Released))]
    );
    assert_eq!(
        tenures(&mut admin, &group, held[1]).await,
        [(b, won[1].token.0, Some(Quarantined))],
        "bucket {} was quarantined before the release updated its row",
        held[1].0
    );
}

/// A statement ending a tenure never waits for its group's row, which a resize locks first
/// (RESIZE_LOCK) and holds while it waits for bucket rows (RESIZE_MOVE): lease.tenures has no
/// foreign key to lease.groups, whose check would share-lock the group's row after the
/// statement has locked its bucket rows. So a release made while a resize holds the group's
/// row commits, and the resize waits for it and then clears the tenure it ended (T4). With
/// the foreign key (`ON DELETE CASCADE`) the release's ring insert would wait for the group's
/// row, the resize for the release's bucket row: a deadlock, which Postgres breaks by failing
/// one of them. (Before the open tenure moved to the bucket row, a claim's ring insert showed
/// it: measured then, "deadlock detected", the claim failed. A claim of a free bucket now
/// writes no ring row.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_ending_a_tenure_never_waits_for_the_groups_row() {
    let (url, group, [(a, a_beat), _]) = two_members(2, long()).await;
    let mut admin = connect(&url).await;
    let mut claimer = connect(&url).await;
    let mut resizer = connect(&url).await;
    let (claimer_pid, resizer_pid) = (
        backend_pid(&mut claimer).await,
        backend_pid(&mut resizer).await,
    );
    let held = ops::claim(
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
    assert_eq!(held.len(), 1);
    let bucket = held[0].bucket;
    // The resize's first lock, in a transaction the resize below continues.
    exec(
        &mut resizer,
        &format!("BEGIN; SELECT 1 FROM lease.groups WHERE name = '{group}' FOR UPDATE"),
    )
    .await;
    exec(&mut claimer, "BEGIN").await;
    let claim = {
        let group = group.clone();
        tokio::spawn(async move {
            let released =
                ops::release(&mut claimer, None, &group, a, a_beat.session, &[bucket]).await;
            (released, claimer)
        })
    };
    // The release returns, or waits for a lock: then the resize below would meet it.
    let blocked = format!("SELECT {resizer_pid} = ANY (pg_blocking_pids({claimer_pid})) AS yes");
    for _ in 0..2_000 {
        if claim.is_finished() || flag(&mut admin, &blocked, None).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let resize = {
        let group = group.clone();
        tokio::spawn(async move {
            let outcome = ops::resize(&mut resizer, None, &group, count(2), count(4)).await;
            (outcome, resizer)
        })
    };
    let (released, mut claimer) = claim.await.expect("the release task");
    let released = released.expect("a's release while a resize holds the group's row");
    assert_eq!(released, [bucket]);
    wait_blocked_by(&mut admin, resizer_pid, claimer_pid).await;
    exec(&mut claimer, "COMMIT").await;
    let (outcome, mut resizer) = resize.await.expect("the resize task");
    outcome.expect("the resize after the claim");
    exec(&mut resizer, "COMMIT").await;
    for b in 0..4 {
        assert_eq!(
            tenures(&mut admin, &group, Bucket(b)).await,
            [],
            "bucket {b}"
        );
    }
}

/// Whether `group`'s change counter is free: locked `NOWAIT` in a transaction rolled back.
async fn counter_free(admin: &mut AsyncPgConnection, group: &GroupName) -> bool {
    exec(admin, "BEGIN").await;
    let free = admin
        .batch_execute(&format!(
            "SELECT 1 FROM lease.group_changes WHERE group_name = '{group}' FOR UPDATE NOWAIT"
        ))
        .await
        .is_ok();
    exec(admin, "ROLLBACK").await;
    free
}

/// The group's change counter is the last lock a claim or a release takes, after its tenure
/// writes: `bumped` counts the rows `expired` (`ended` in a release) return, which runs them to
/// completion first. Postgres runs the data-modifying CTEs the main query does not read in the
/// reverse of their order in the `WITH`, so without that `bumped` ran first and every claim,
/// release and join of the group waited for the counter while one statement wrote its
/// tenures. Here a tenure write is held up (the ring slot the end goes to, inserted by a
/// transaction left open), and the counter must be free meanwhile: first a claim taking a
/// dead session's bucket (the expired end), then a release. Measured without the counts
/// (before the open tenure moved to the bucket row, with a claim's begun tenure held up): the
/// counter was locked while the claim waited for the slot (the 50-worker cold start of
/// `pg_scale` went from 4-6 s to 20-52 s, its claims and heartbeats waiting for the counter).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_and_a_release_take_the_counter_after_their_tenure_writes() {
    use lease_core::EndReason::{Expired, Released};
    // a's session lasts 1 s; calls at client times, b's after a's session ended.
    let (url, group, [(a, a_beat), (b, b_beat)]) = two_members(1, short()).await;
    let mut admin = connect(&url).await;
    let mut gate = connect(&url).await;
    let mut worker = connect(&url).await;
    let (gate_pid, worker_pid) = (backend_pid(&mut gate).await, backend_pid(&mut worker).await);
    let base = a_beat.observed_at;
    let at = move |ms: i64| Some(base + chrono::Duration::milliseconds(ms));
    let held = ops::claim(
        &mut admin,
        at(100),
        &group,
        a,
        a_beat.session,
        1,
        Takeover::Allowed,
    )
    .await
    .expect("a claims");
    assert_eq!(held.len(), 1);

    // The slot a's tenure ends in (ended tenure 1), inserted by a transaction left open.
    let hold_slot = |slot: i32| {
        format!(
            "BEGIN; INSERT INTO lease.tenures (group_name, bucket, slot, seq, token, owner_node, \
             began_at, ended_at, reason) VALUES ('{group}', 0, {slot}, {slot}, 1, '{b}', \
             clock_timestamp(), clock_timestamp(), 'released')"
        )
    };
    exec(&mut gate, &hold_slot(1)).await;
    let claim = {
        let group = group.clone();
        let b_at = at(2_000);
        tokio::spawn(async move {
            let won = ops::claim(
                &mut worker,
                b_at,
                &group,
                b,
                b_beat.session,
                1,
                Takeover::Allowed,
            )
            .await
            .expect("b's claim");
            (won, worker)
        })
    };
    wait_blocked_by(&mut admin, worker_pid, gate_pid).await;
    let free_while_claiming = counter_free(&mut admin, &group).await;
    exec(&mut gate, "ROLLBACK").await;
    let (won, mut worker) = claim.await.expect("the claim task");
    assert!(
        free_while_claiming,
        "the claim held the group's counter while it wrote its tenures"
    );
    assert_eq!(won.len(), 1, "b takes a's bucket");

    // The slot b's tenure ends in (ended tenure 2), likewise.
    exec(&mut gate, &hold_slot(2)).await;
    let release = {
        let group = group.clone();
        tokio::spawn(async move {
            ops::release(
                &mut worker,
                at(2_100),
                &group,
                b,
                b_beat.session,
                &[Bucket(0)],
            )
            .await
            .expect("b's release")
        })
    };
    wait_blocked_by(&mut admin, worker_pid, gate_pid).await;
    let free_while_releasing = counter_free(&mut admin, &group).await;
    exec(&mut gate, "ROLLBACK").await;
    assert_eq!(release.await.expect("the release task"), [Bucket(0)]);
    assert!(
        free_while_releasing,
        "the release held the group's counter while it ended its tenures"
    );
    assert_eq!(
        tenures(&mut admin, &group, Bucket(0)).await,
        [
            (a, held[0].token.0, Some(Expired)),
            (b, won[0].token.0, Some(Released))
        ]
    );
}
