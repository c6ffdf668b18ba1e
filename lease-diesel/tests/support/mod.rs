//! Small helpers shared by the Postgres test files.

#![allow(dead_code)] // each test binary uses its own subset

use std::fmt::Debug;

use lease_core::{
    ErrorKind, GroupName, GroupView, Incarnation, Lease, LeaseStore, MemberMetadata, NodeId,
    SessionId, StoreError, Timestamp, Ttl,
};

/// A fresh worker whose claims start at bucket 0 (its claim seed is 0), so it claims the
/// lowest claimable buckets first and expectations can name them.
pub fn worker() -> NodeId {
    NodeId::from_uuid(uuid::Uuid::from_u128(
        NodeId::new().as_uuid().as_u128() & !0xFFFF_FFFF,
    ))
}

/// The incarnation worker `w` heartbeats as: one process per worker, derived from its id.
pub fn process(w: NodeId) -> Incarnation {
    Incarnation::from_uuid(w.as_uuid())
}

/// `(bucket, token)` of each lease, to compare ownership at a glance.
pub fn tokens(leases: &[Lease]) -> Vec<(u32, i64)> {
    leases.iter().map(|l| (l.bucket.0, l.token.0)).collect()
}

/// `result` is a `Backend` error; returns its message.
#[track_caller]
pub fn expect_backend<T: Debug>(what: &str, result: Result<T, StoreError>) -> String {
    match result {
        Err(e) if e.kind() == ErrorKind::Backend => lease_core::Chain(&e).to_string(),
        other => panic!("{what}: expected a Backend error, got {other:?}"),
    }
}

/// `result` is `Ok` or a `Backend` error: what an operation racing a lost connection may give.
#[track_caller]
pub fn ok_or_backend<T: Debug>(what: &str, result: &Result<T, StoreError>) -> bool {
    match result {
        Ok(_) => true,
        Err(e) if e.kind() == ErrorKind::Backend => false,
        Err(e) => panic!("{what}: expected success or a Backend error, got {e:?}"),
    }
}

/// What a node's heartbeat says of one group it is a member of, as these tests read it.
#[derive(Clone, Debug)]
pub struct Beat {
    /// The node's session.
    pub session: SessionId,
    /// The first heartbeat of [`beat_as`] started the session.
    pub new_session: bool,
    /// The store's time of the (last) heartbeat.
    pub observed_at: Timestamp,
    /// When the session expires unless renewed.
    pub expires_at: Timestamp,
    /// The group's view.
    pub view: GroupView,
    /// The node's leases in the group.
    pub owned: Vec<Lease>,
}

/// [`beat_as`] for the incarnation [`process`] derives from `w`.
pub async fn beat<S: LeaseStore + ?Sized>(
    store: &S,
    group: &GroupName,
    w: NodeId,
    ttl: Ttl,
    meta: &MemberMetadata,
) -> Result<Beat, StoreError> {
    beat_as(store, group, w, process(w), ttl, meta).await
}

/// Node `w` heartbeats as `incarnation` (no stamps handed in: every view is given) and, if it
/// is not a member of `group` yet, joins it and heartbeats again: one round trip for a member,
/// three for a node joining.
pub async fn beat_as<S: LeaseStore + ?Sized>(
    store: &S,
    group: &GroupName,
    w: NodeId,
    incarnation: Incarnation,
    ttl: Ttl,
    meta: &MemberMetadata,
) -> Result<Beat, StoreError> {
    let first = store.heartbeat(w, incarnation, ttl, meta, &[]).await?;
    let new_session = first.new_session;
    let beat = match first.group(group) {
        Some(_) => first,
        None => {
            store.join(group, w, first.session).await?;
            store.heartbeat(w, incarnation, ttl, meta, &[]).await?
        }
    };
    let g = beat
        .group(group)
        .cloned()
        .ok_or_else(|| StoreError::SessionExpired {
            group: group.clone(),
            worker: w,
        })?;
    Ok(Beat {
        session: beat.session,
        new_session,
        observed_at: beat.observed_at,
        expires_at: beat.expires_at,
        view: g.view,
        owned: g.owned,
    })
}
