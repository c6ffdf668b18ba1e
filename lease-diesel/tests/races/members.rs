//! The group the races run in and its members: heartbeats on the server's clock, the usual
//! set-ups (worker `a` holding every bucket while `b` idles; two idle members), operators'
//! controls, and the check that exactly one side owns the buckets.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use lease_core::{
    BucketState, FencingToken, GroupName, GroupStamp, Heartbeat, Incarnation, Lease,
    MemberMetadata, NodeId, SessionId, ShardCount, Takeover, Timestamp, Ttl,
};
use lease_diesel::ops;

use crate::duel::connect;

pub const SHARDS: u32 = 4;

/// A node's heartbeat on `conn`, on the server clock, as the incarnation derived from its id,
/// handing in `seen`; panics with `what` on failure.
pub async fn renew(
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
pub struct Beat {
    pub session: SessionId,
    pub new_session: bool,
    pub observed_at: Timestamp,
    pub expires_at: Timestamp,
    /// The node's leases in the group (none when it is no member).
    pub owned: Vec<Lease>,
}

impl Beat {
    pub fn of(beat: &Heartbeat, group: &GroupName) -> Self {
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
pub async fn beat(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    worker: NodeId,
    ttl: Ttl,
    what: &str,
) -> Beat {
    Beat::of(&renew(conn, worker, ttl, &[], what).await, group)
}

/// `worker` heartbeats and joins `group` if it is not a member: a live member afterwards.
pub async fn member(
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
pub fn stamps(beat: &Heartbeat) -> Vec<GroupStamp> {
    beat.groups
        .iter()
        .map(|g| GroupStamp {
            group: g.group.clone(),
            stamp: g.stamp,
        })
        .chain(beat.unchanged.iter().cloned())
        .collect()
}

pub struct Setup {
    pub url: String,
    pub group: GroupName,
    pub a: NodeId,
    pub b: NodeId,
    /// a's leases on every bucket.
    pub leases: Vec<Lease>,
    pub first: Beat,
    /// b's session.
    pub b_session: SessionId,
}

/// A fresh database where worker `a` holds every bucket under a session of `ttl`, and worker
/// `b` is a live, idle member.
pub async fn setup(ttl: Ttl) -> Setup {
    setup_with(ttl, |_| async {}).await
}

/// [`setup`], running `right_after` as soon as `a` holds the buckets.
pub async fn setup_with<F, Fut>(ttl: Ttl, right_after: F) -> Setup
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

pub fn long() -> Ttl {
    Ttl::from_secs(60).expect("ttl")
}

pub fn short() -> Ttl {
    Ttl::from_secs(1).expect("ttl")
}

/// A fresh database with a group of `shards` buckets and two live, idle members `a` and `b`
/// (sessions of `ttl` and a long one).
pub async fn two_members(shards: u32, ttl: Ttl) -> (String, GroupName, [(NodeId, Beat); 2]) {
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

pub fn count(n: u32) -> ShardCount {
    ShardCount::new(n).expect("count")
}

pub fn quarantine_for(secs: u64) -> Option<lease_core::QuarantineFor> {
    Some(lease_core::QuarantineFor::new(Duration::from_secs(secs)).expect("a quarantine"))
}

pub fn mode(m: lease_core::MemberMode) -> lease_core::MemberControl {
    lease_core::MemberControl::Mode(m)
}

/// Exactly one worker owns every bucket, and the other's fencing tokens fail.
pub async fn assert_sole_owner(s: &Setup, winner: NodeId) {
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
