//! The operations on a connection you hold, for running them inside your own transaction or
//! interleaving them step by step (the race tests do). [`PgLeaseStore`](crate::PgLeaseStore)
//! runs each on a pooled connection in autocommit mode, or, behind a transaction pooler, in a
//! transaction of its own.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use diesel::OptionalExtension;
use diesel::pg::data_types::PgInterval;
use diesel::prelude::*;
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Interval, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, RunQueryDsl, TransactionManager,
};
use lease_core::{
    Bucket, BucketInfo, BucketState, FencingToken, Generation, GroupBeat, GroupName, GroupSnapshot,
    GroupStamp, GroupView, Heartbeat, Incarnation, Lease, Load, MemberInfo, MemberLoad,
    MemberMetadata, MemberMode, NodeId, NodeInfo, NodesSnapshot, Operation, ResizeOutcome,
    SessionId, ShardCount, StoreError, Takeover, Timestamp, Ttl, ViewStamp,
};
use lease_core::{EndReason, Tenure, TenureEnd};
use lease_core::{
    LogPosition, MemberControl, QuarantineFor, QuarantineReason, SessionBound, Weight,
};
use uuid::Uuid;

use crate::error::{corrupt, from_diesel};
use crate::prepared::Prepared;
use crate::statements as sql;

mod controls;
mod reads;
mod views;

pub use controls::{control, evict, hand_over, quarantine, resize, set_weight};
pub use reads::{history, nodes, snapshot};
pub use views::heartbeat;
pub(crate) use views::{Timeline, heartbeat_on_timeline};

fn shard_count_of(op: Operation, group: &GroupName, n: i32) -> Result<ShardCount, StoreError> {
    shard_count(op, group, n)
}

pub(crate) fn shard_count(
    op: Operation,
    group: &GroupName,
    n: i32,
) -> Result<ShardCount, StoreError> {
    ShardCount::try_from_i64(i64::from(n))
        .map_err(|_| corrupt(op, format!("group {group:?} has shard count {n}")))
}

fn bucket(op: Operation, n: i32) -> Result<Bucket, StoreError> {
    u32::try_from(n)
        .map(Bucket)
        .map_err(|_| corrupt(op, format!("bucket number {n}")))
}

fn count(op: Operation, n: i32) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| corrupt(op, format!("owned count {n}")))
}

/// A load as stored (P2, P3): whole millionths, never negative (the columns' CHECK).
pub(crate) fn load(op: Operation, n: i64) -> Result<Load, StoreError> {
    u64::try_from(n)
        .ok()
        .filter(|&m| m <= Load::MAX.micros())
        .map(Load::from_micros)
        .ok_or_else(|| corrupt(op, format!("load {n}")))
}

/// A member's work as stored (P3): a sum of loads.
fn work(op: Operation, n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| corrupt(op, format!("member load {n}")))
}

/// A member's weight as stored (K1).
fn weight(op: Operation, n: i32) -> Result<u32, StoreError> {
    u32::try_from(n)
        .ok()
        .and_then(|w| Weight::new(w).ok())
        .map(Weight::get)
        .ok_or_else(|| corrupt(op, format!("weight {n}")))
}

/// A member's mode as stored (K1).
fn mode(op: Operation, name: &str) -> Result<MemberMode, StoreError> {
    MemberMode::from_name(name).ok_or_else(|| corrupt(op, format!("member mode {name:?}")))
}

pub(crate) fn not_found(group: &GroupName) -> StoreError {
    StoreError::GroupNotFound {
        group: group.clone(),
    }
}

fn leases(
    op: Operation,
    owner: NodeId,
    shards: ShardCount,
    buckets: &[i32],
    tokens: &[i64],
    expires_at: DateTime<Utc>,
) -> Result<Vec<Lease>, StoreError> {
    if buckets.len() != tokens.len() {
        return Err(corrupt(
            op,
            "bucket and token lists differ in length".into(),
        ));
    }
    buckets
        .iter()
        .zip(tokens)
        .map(|(&b, &t)| {
            Ok(Lease {
                bucket: bucket(op, b)?,
                shards,
                owner,
                token: FencingToken(t),
                expires_at,
            })
        })
        .collect()
}

fn generation(op: Operation, n: i64) -> Result<Generation, StoreError> {
    u64::try_from(n)
        .map(Generation)
        .map_err(|_| corrupt(op, format!("generation {n}")))
}

fn group_name(op: Operation, name: String) -> Result<GroupName, StoreError> {
    GroupName::new(name).map_err(|e| corrupt(op, format!("group name: {e}")))
}

fn bucket_list(op: Operation, buckets: &[i32]) -> Result<Vec<Bucket>, StoreError> {
    buckets.iter().map(|&b| bucket(op, b)).collect()
}

/// [`WorkerStore::ensure_group`](lease_core::WorkerStore::ensure_group) on `conn`; `at` is the client clock's time (`None`: the server's).
pub async fn ensure_group(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    shards: ShardCount,
) -> Result<(), StoreError> {
    let created: Option<sql::ShardCountRow> = Prepared(
        diesel::sql_query(sql::ENSURE_GROUP)
            .bind::<Text, _>(group.as_str())
            .bind::<Integer, _>(shards.get() as i32)
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(Operation::EnsureGroup, e))?;
    if created.is_some_and(|row| row.shard_count == shards.get() as i32) {
        return Ok(());
    }
    // The name was taken (perhaps by a concurrent call, now committed): compare counts in
    // a statement with a fresh snapshot. The count the group was last resized from is
    // accepted too (E3): the caller adopts the stored count.
    let found: sql::GroupCountsRow =
        Prepared(diesel::sql_query(sql::GROUP_SHARD_COUNT).bind::<Text, _>(group.as_str()))
            .get_result(conn)
            .await
            .map_err(|e| from_diesel(Operation::EnsureGroup, e))?;
    let previous = found.previous_count;
    let found = shard_count(Operation::EnsureGroup, group, found.shard_count)?;
    if found == shards || previous == Some(shards.get() as i32) {
        Ok(())
    } else {
        Err(StoreError::ShardCountMismatch {
            group: group.clone(),
            configured: shards,
            found,
        })
    }
}

/// [`WorkerStore::publish_loads`](lease_core::WorkerStore::publish_loads) on a connection:
/// one statement (in its own module, beside its SQL).
pub use crate::loads::publish_loads;

/// [`WorkerStore::join`](lease_core::WorkerStore::join) on `conn`: one statement.
pub async fn join(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    node: NodeId,
    session: SessionId,
) -> Result<(), StoreError> {
    let row: Option<sql::JoinRow> = Prepared(
        diesel::sql_query(sql::JOIN)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<SqlUuid, _>(session.as_uuid())
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(Operation::Join, e))?;
    match row {
        None => Err(not_found(group)),
        Some(row) if !row.live => Err(StoreError::SessionExpired {
            group: group.clone(),
            worker: node,
        }),
        Some(_) => Ok(()),
    }
}

/// [`WorkerStore::claim`](lease_core::WorkerStore::claim) on `conn`: one statement.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    worker: NodeId,
    session: SessionId,
    want: u32,
    takeover: Takeover,
) -> Result<Vec<Lease>, StoreError> {
    take(conn, at, group, worker, session, want, None, takeover).await
}

/// [`WorkerStore::claim_buckets`](lease_core::WorkerStore::claim_buckets) on `conn`: one
/// statement, [`claim`]'s, with the buckets named.
pub async fn claim_buckets(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    worker: NodeId,
    session: SessionId,
    buckets: &[Bucket],
    takeover: Takeover,
) -> Result<Vec<Lease>, StoreError> {
    let mut named = buckets.to_vec();
    named.sort_unstable();
    named.dedup();
    let want = named.len() as u32;
    take(
        conn,
        at,
        group,
        worker,
        session,
        want,
        Some(&named),
        takeover,
    )
    .await
}

/// A claim of the first `want` claimable buckets, or of those of `named` (then `want` is
/// their number).
#[allow(clippy::too_many_arguments)]
async fn take(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    worker: NodeId,
    session: SessionId,
    want: u32,
    named: Option<&[Bucket]>,
    takeover: Takeover,
) -> Result<Vec<Lease>, StoreError> {
    // Out of i32, a bucket is out of every range: -1 says so to the statement (C13).
    let op = match named {
        Some(_) => Operation::ClaimBuckets,
        None => Operation::Claim,
    };
    let numbers: Option<Vec<i32>> =
        named.map(|n| n.iter().map(|b| i32::try_from(b.0).unwrap_or(-1)).collect());
    let row: Option<sql::ClaimRow> = Prepared(
        diesel::sql_query(sql::CLAIM.as_str())
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(worker.as_uuid())
            .bind::<BigInt, _>(i64::from(want))
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<SqlUuid, _>(session.as_uuid())
            .bind::<BigInt, _>(i64::from(worker.claim_seed()))
            .bind::<Bool, _>(!matches!(takeover, Takeover::Deferred))
            .bind::<Nullable<Interval>, _>(match takeover {
                Takeover::AllowedWithin(d) => Some(PgInterval::from_microseconds(
                    i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
                )),
                _ => None,
            })
            .bind::<Nullable<Array<Integer>>, _>(numbers.as_deref()),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(op, e))?;
    let row = row.ok_or_else(|| not_found(group))?;
    // C13: a named bucket out of range took nothing.
    let range = u32::try_from(row.shard_count).unwrap_or(0);
    if let Some(&bucket) = named.and_then(|n| n.iter().find(|b| b.0 >= range)) {
        return Err(StoreError::BucketOutOfRange {
            group: group.clone(),
            bucket,
            shard_count: shard_count(op, group, row.shard_count)?,
        });
    }
    let (Some(_session), Some(expires_at)) = (row.session_id, row.expires_at) else {
        return Err(StoreError::SessionExpired {
            group: group.clone(),
            worker,
        });
    };
    leases(
        op,
        worker,
        shard_count(op, group, row.shard_count)?,
        &row.buckets,
        &row.tokens,
        expires_at,
    )
}

/// [`WorkerStore::release`](lease_core::WorkerStore::release) on `conn`: one statement.
pub async fn release(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    worker: NodeId,
    session: SessionId,
    buckets: &[Bucket],
) -> Result<Vec<Bucket>, StoreError> {
    let requested: Vec<i64> = buckets.iter().map(|b| i64::from(b.0)).collect();
    let row: Option<sql::ReleaseRow> = Prepared(
        diesel::sql_query(sql::RELEASE)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(worker.as_uuid())
            .bind::<Array<BigInt>, _>(&requested)
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<SqlUuid, _>(session.as_uuid()),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(Operation::Release, e))?;
    let row = row.ok_or_else(|| not_found(group))?;
    let shards = shard_count(Operation::Release, group, row.shard_count)?;
    // While a resize drains, the old generation's numbers are in range too (R1).
    let range = u32::try_from(row.range).unwrap_or(0);
    if let Some(&bucket) = buckets.iter().find(|&&b| b.0 >= range) {
        return Err(StoreError::BucketOutOfRange {
            group: group.clone(),
            bucket,
            shard_count: shards,
        });
    }
    bucket_list(Operation::Release, &row.buckets)
}

/// [`WorkerStore::leave`](lease_core::WorkerStore::leave) on `conn`: one statement.
pub async fn leave(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    node: NodeId,
    session: SessionId,
) -> Result<Vec<Bucket>, StoreError> {
    leave_as(conn, at, group, node, Some(session), Operation::Leave).await
}

/// `lease.leave` under `session`, or under whatever session the node holds (`None`).
async fn leave_as(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    node: NodeId,
    session: Option<SessionId>,
    op: Operation,
) -> Result<Vec<Bucket>, StoreError> {
    let row: sql::LeaveRow = Prepared(
        diesel::sql_query(sql::LEAVE)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<Nullable<SqlUuid>, _>(session.map(|s| s.as_uuid()))
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .map_err(|e| from_diesel(op, e))?;
    let buckets = row.buckets.ok_or_else(|| not_found(group))?;
    bucket_list(op, &buckets)
}

/// [`WorkerStore::is_current`](lease_core::WorkerStore::is_current) on `conn`: one statement. Inside your own transaction, a `true`
/// answer keeps the bucket row share-locked until that transaction ends.
pub async fn is_current(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    bucket: Bucket,
    worker: NodeId,
    token: FencingToken,
) -> Result<bool, StoreError> {
    let row: sql::IsCurrentRow = Prepared(
        diesel::sql_query(sql::IS_CURRENT)
            .bind::<Text, _>(group.as_str())
            .bind::<BigInt, _>(i64::from(bucket.0))
            .bind::<SqlUuid, _>(worker.as_uuid())
            .bind::<BigInt, _>(token.0)
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .map_err(|e| from_diesel(Operation::IsCurrent, e))?;
    Ok(row.current)
}
