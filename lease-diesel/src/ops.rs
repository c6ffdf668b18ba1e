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

/// [`WorkerStore::heartbeat`](lease_core::WorkerStore::heartbeat) on `conn`: one statement, or
/// two when the steady statement finds a group to look at.
pub async fn heartbeat(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    node: NodeId,
    incarnation: Incarnation,
    ttl: Ttl,
    metadata: &MemberMetadata,
    seen: &[GroupStamp],
) -> Result<Heartbeat, StoreError> {
    heartbeat_on_timeline(conn, at, node, incarnation, ttl, metadata, seen, None)
        .await
        .map(|(beat, _)| beat)
}

/// The server's timeline as a heartbeat saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Timeline {
    /// The server's timeline.
    pub(crate) id: i64,
    /// This heartbeat was the first on it: it recorded when the timeline was first seen.
    pub(crate) recorded: bool,
    /// The session's first heartbeat on this timeline: how it fared (V4), `kept` or `ended:`
    /// and why.
    pub(crate) crossed: Option<String>,
}

/// A WAL offset as the server gives it (a `pg_lsn` less `0/0`), on `timeline`.
fn position(op: Operation, timeline: i64, offset: i64) -> Result<LogPosition, StoreError> {
    match (u64::try_from(timeline), u64::try_from(offset)) {
        (Ok(timeline), Ok(offset)) => Ok(LogPosition { timeline, offset }),
        _ => Err(corrupt(op, format!("WAL position {timeline}:{offset}"))),
    }
}

/// A bound as `lease.heartbeat` takes it: the session, the timeline, the offset (nulls for
/// none). A value past `i64::MAX` (from another store) keeps nothing: such a timeline is
/// handed in as -1, the timeline before none, and such an offset as the largest, after every
/// switch point.
fn bound_args(bound: Option<SessionBound>) -> (Option<Uuid>, Option<i64>, Option<i64>) {
    match bound {
        None => (None, None, None),
        Some(b) => (
            Some(b.session.as_uuid()),
            Some(i64::try_from(b.position.timeline).unwrap_or(-1)),
            Some(i64::try_from(b.position.offset).unwrap_or(i64::MAX)),
        ),
    }
}

/// A stamp's version as the store keeps it: one above `i64::MAX` (from another store, or the
/// invalid stamp) can never match, and -1 never does either.
fn stored_version(version: u64) -> i64 {
    i64::try_from(version).unwrap_or(-1)
}

/// The stamp of a view whose counter is `version`; `None` (a member found dead was not
/// removed) gives a stamp no counter ever matches, so the next heartbeat gives the view again.
fn stamp(
    op: Operation,
    version: Option<i64>,
    until: Option<Timestamp>,
) -> Result<ViewStamp, StoreError> {
    match version {
        None => Ok(ViewStamp::new(u64::MAX, None)),
        Some(v) => u64::try_from(v)
            .map(|v| ViewStamp::new(v, until))
            .map_err(|_| corrupt(op, format!("change counter {v}"))),
    }
}

fn group_name(op: Operation, name: String) -> Result<GroupName, StoreError> {
    GroupName::new(name).map_err(|e| corrupt(op, format!("group name: {e}")))
}

/// [`heartbeat`] handing in `bound` (V4), and the server's timeline it ran on.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn heartbeat_on_timeline(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    node: NodeId,
    incarnation: Incarnation,
    ttl: Ttl,
    metadata: &MemberMetadata,
    seen: &[GroupStamp],
    bound: Option<SessionBound>,
) -> Result<(Heartbeat, Timeline), StoreError> {
    let op = Operation::Heartbeat;
    // The function walks the stamps beside the node's groups, both sorted by bytes (`str`'s
    // order is its bytes': the SQL sorts with COLLATE "C").
    let mut seen: Vec<&GroupStamp> = seen.iter().collect();
    seen.sort_by(|a, b| a.group.as_str().cmp(b.group.as_str()));
    let groups: Vec<&str> = seen.iter().map(|s| s.group.as_str()).collect();
    let versions: Vec<i64> = seen
        .iter()
        .map(|s| stored_version(s.stamp.version()))
        .collect();
    let untils: Vec<Option<Timestamp>> = seen.iter().map(|s| s.stamp.until()).collect();
    let earliest_until = untils.iter().flatten().min().copied();
    // A stamp whose `until` has come makes the full heartbeat look at its group again: go
    // there at once rather than renew twice. Judged on this host's clock, which decides only
    // which statement runs first, never the answer (the server judges `until` in both).
    let until_come = earliest_until.is_some_and(|u| u <= at.unwrap_or_else(Utc::now));
    if !seen.is_empty() && !until_come {
        let fast = steady_renewal(
            conn,
            at,
            node,
            incarnation,
            ttl,
            metadata,
            &groups,
            &versions,
            earliest_until,
        )
        .await?;
        if let Some(row) = fast {
            let mut unchanged: Vec<GroupStamp> = seen.into_iter().cloned().collect();
            unchanged.sort_by(|a, b| a.group.cmp(&b.group));
            let beat = Heartbeat {
                session: SessionId::from_uuid(row.session_id),
                new_session: false,
                observed_at: row.heartbeat_at,
                expires_at: row.expires_at,
                groups: Vec::new(),
                unchanged,
                position: Some(position(op, row.timeline, row.position_offset)?),
            };
            let timeline = Timeline {
                id: row.timeline,
                recorded: false,
                crossed: None,
            };
            return Ok((beat, timeline));
        }
    }
    let (bound_session, bound_timeline, bound_offset) = bound_args(bound);
    let rows: Vec<sql::HeartbeatRow> = Prepared(
        diesel::sql_query(sql::HEARTBEAT)
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<SqlUuid, _>(SessionId::new().as_uuid())
            .bind::<Interval, _>(PgInterval::from_microseconds(ttl.as_micros()))
            .bind::<Text, _>(metadata.as_str())
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<SqlUuid, _>(incarnation.as_uuid())
            .bind::<Array<Text>, _>(&groups)
            .bind::<Array<BigInt>, _>(&versions)
            .bind::<Array<Nullable<Timestamptz>>, _>(&untils)
            .bind::<Nullable<SqlUuid>, _>(bound_session)
            .bind::<Nullable<BigInt>, _>(bound_timeline)
            .bind::<Nullable<BigInt>, _>(bound_offset),
    )
    .load(conn)
    .await
    .map_err(|e| from_diesel(op, e))?;
    let first =
        <[_]>::first(&rows).ok_or_else(|| corrupt(op, "the heartbeat returned no row".into()))?;
    if !first.mine {
        return Err(StoreError::NodeIdInUse {
            worker: node,
            expires_at: first.expires_at,
        });
    }
    let (session, expires_at) = (SessionId::from_uuid(first.session_id), first.expires_at);
    let mut beat = Heartbeat {
        session,
        new_session: first.started,
        observed_at: first.heartbeat_at,
        expires_at,
        groups: Vec::new(),
        unchanged: Vec::new(),
        position: first
            .position_offset
            .map(|offset| position(op, first.timeline, offset))
            .transpose()?,
    };
    let timeline = Timeline {
        id: first.timeline,
        recorded: first.recorded,
        crossed: first.crossed.clone(),
    };
    for mut row in rows {
        match row.group_name.take() {
            Some(name) => beat
                .groups
                .push(group_beat(op, node, expires_at, name, row)?),
            None => {
                let names = row.unchanged_groups.unwrap_or_default();
                let versions = row.unchanged_versions.unwrap_or_default();
                let untils = row.unchanged_until.unwrap_or_default();
                if names.len() != versions.len() || names.len() != untils.len() {
                    return Err(corrupt(op, "unchanged lists differ in length".into()));
                }
                for ((name, version), until) in names.into_iter().zip(versions).zip(untils) {
                    beat.unchanged.push(GroupStamp {
                        group: group_name(op, name)?,
                        stamp: stamp(op, Some(version), until)?,
                    });
                }
            }
        }
    }
    beat.groups.sort_by(|a, b| a.group.cmp(&b.group));
    beat.unchanged.sort_by(|a, b| a.group.cmp(&b.group));
    Ok((beat, timeline))
}

/// [`sql::STEADY_RENEWAL`]: `Some` with the renewal if the node's live session was renewed
/// with every group unchanged; `None` (nothing written) if there was no live session, a group
/// to look at, or the session expired while the renewal waited for its row: the full
/// heartbeat decides. Only outside a transaction: its refusal is an error, which
/// would abort the caller's transaction.
#[allow(clippy::too_many_arguments)]
async fn steady_renewal(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    node: NodeId,
    incarnation: Incarnation,
    ttl: Ttl,
    metadata: &MemberMetadata,
    groups: &[&str],
    versions: &[i64],
    earliest_until: Option<Timestamp>,
) -> Result<Option<sql::SteadyRow>, StoreError> {
    let op = Operation::Heartbeat;
    let in_transaction = AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map_err(|e| from_diesel(op, e))?
        .is_some();
    if in_transaction {
        return Ok(None);
    }
    let rows: Result<Vec<sql::SteadyRow>, _> = Prepared(
        diesel::sql_query(sql::STEADY_RENEWAL)
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<SqlUuid, _>(incarnation.as_uuid())
            .bind::<Interval, _>(PgInterval::from_microseconds(ttl.as_micros()))
            .bind::<Text, _>(metadata.as_str())
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<Array<Text>, _>(groups)
            .bind::<Array<BigInt>, _>(versions)
            .bind::<Nullable<Timestamptz>, _>(earliest_until),
    )
    .load(conn)
    .await;
    match rows {
        Ok(rows) => Ok(rows.into_iter().next()),
        Err(diesel::result::Error::DatabaseError(_, info))
            if info.message().contains(sql::RENEWAL_TOO_LATE) =>
        {
            Ok(None)
        }
        Err(e) => Err(from_diesel(op, e)),
    }
}

/// A group's view and the node's leases in it, from a heartbeat row that gives it.
fn group_beat(
    op: Operation,
    node: NodeId,
    expires_at: Timestamp,
    name: String,
    row: sql::HeartbeatRow,
) -> Result<GroupBeat, StoreError> {
    let group = group_name(op, name)?;
    let missing = || corrupt(op, format!("the view of group {group:?} lacks a column"));
    let shard_count = shard_count(op, &group, row.shard_count.ok_or_else(missing)?)?;
    let previous = row
        .previous_count
        .map(|n| shard_count_of(op, &group, n))
        .transpose()?;
    let buckets = row.buckets.unwrap_or_default();
    let tokens = row.tokens.unwrap_or_default();
    let mut owned = leases(op, node, shard_count, &buckets, &tokens, expires_at)?;
    let own_load = owned.len() as u32;
    let old_buckets = row.old_buckets.unwrap_or_default();
    match previous {
        Some(from) => owned.extend(leases(
            op,
            node,
            from,
            &old_buckets,
            &row.old_tokens.unwrap_or_default(),
            expires_at,
        )?),
        None if !old_buckets.is_empty() => {
            return Err(corrupt(
                op,
                "buckets of a draining generation in a group never resized".into(),
            ));
        }
        None => {}
    }
    owned.sort_by_key(|l| l.bucket);
    let workers = row.workers.unwrap_or_default();
    let loads = row.loads.unwrap_or_default();
    let weights = row.weights.unwrap_or_default();
    let modes = row.modes.unwrap_or_default();
    let works = row.member_loads.unwrap_or_default();
    let hottest = row.member_hottest.unwrap_or_default();
    if [
        loads.len(),
        weights.len(),
        modes.len(),
        works.len(),
        hottest.len(),
    ]
    .iter()
    .any(|&n| n != workers.len())
    {
        return Err(corrupt(
            op,
            "member, count, weight, mode and load lists differ in length".into(),
        ));
    }
    let mut members = vec![MemberLoad {
        worker: node,
        owned: own_load,
        weight: weight(op, row.my_weight.ok_or_else(missing)?)?,
        mode: mode(op, &row.my_mode.ok_or_else(missing)?)?,
        load: work(op, row.my_load.ok_or_else(missing)?)?,
        hottest: load(op, row.my_hottest.ok_or_else(missing)?)?,
    }];
    for (i, &w) in workers.iter().enumerate() {
        members.push(MemberLoad {
            worker: NodeId::from_uuid(w),
            owned: count(op, loads[i])?,
            weight: weight(op, weights[i])?,
            mode: mode(op, &modes[i])?,
            load: work(op, works[i])?,
            hottest: load(op, hottest[i])?,
        });
    }
    let loaded_buckets = bucket_list(op, &row.loaded_buckets.unwrap_or_default())?;
    let loaded_loads = row.loaded_loads.unwrap_or_default();
    if loaded_buckets.len() != loaded_loads.len() {
        return Err(corrupt(
            op,
            "loaded bucket and load lists differ in length".into(),
        ));
    }
    let loaded = loaded_buckets
        .into_iter()
        .zip(loaded_loads)
        .map(|(b, l)| Ok((b, load(op, l)?)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    members.sort_by_key(|m| m.worker);
    let held: u32 = members.iter().map(|m| m.owned).sum();
    let draining = u32::try_from(row.draining.ok_or_else(missing)?)
        .map_err(|_| corrupt(op, "draining count".into()))?;
    // Q1, Q2: the group's buckets under quarantine, those of them the node holds, and how many
    // of them any live member holds (those are counted in `held` already).
    let quarantined = bucket_list(op, &row.quarantined.unwrap_or_default())?;
    let quarantined_held = u32::try_from(row.quarantined_held.ok_or_else(missing)?)
        .map_err(|_| corrupt(op, "quarantined count".into()))?;
    let own_quarantined: Vec<Bucket> = owned
        .iter()
        .filter(|l| l.shards == shard_count && quarantined.binary_search(&l.bucket).is_ok())
        .map(|l| l.bucket)
        .collect();
    let quarantined_free = (quarantined.len() as u32).saturating_sub(quarantined_held);
    Ok(GroupBeat {
        view: GroupView {
            shard_count,
            members,
            claimable: shard_count
                .get()
                .saturating_sub(held)
                .saturating_sub(quarantined_free),
            generation: generation(op, row.generation.ok_or_else(missing)?)?,
            previous,
            draining,
            quarantined: quarantined.len() as u32,
            loaded,
        },
        owned,
        stamp: stamp(op, row.stamp_version, row.until)?,
        quarantined: own_quarantined,
        group,
    })
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

/// [`AdminStore::snapshot`](lease_core::AdminStore::snapshot) on `conn`: a read-only repeatable-read transaction,
/// or, inside your own transaction, reads in that one (whose isolation level is yours).
pub async fn snapshot(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
) -> Result<GroupSnapshot, StoreError> {
    let name = group.as_str().to_owned();
    // One consistent view: the three reads share a repeatable-read snapshot, in a transaction
    // of their own, or in the caller's (the store's own, behind a transaction pooler).
    let in_transaction = AnsiTransactionManager::transaction_manager_status_mut(conn)
        .transaction_depth()
        .map_err(|e| from_diesel(Operation::Snapshot, e))?
        .is_some();
    let (now, stored, member_rows, shard_rows, old_rows) = if in_transaction {
        snapshot_reads(conn, at, &name).await
    } else {
        conn.build_transaction()
            .repeatable_read()
            .read_only()
            .run(async |conn| snapshot_reads(conn, at, &name).await)
            .await
    }
    .map_err(|e| from_diesel(Operation::Snapshot, e))?;
    let (stored_count, stored_generation, stored_previous) =
        stored.ok_or_else(|| not_found(group))?;
    let shard_count = shard_count(Operation::Snapshot, group, stored_count)?;
    let previous = stored_previous
        .map(|n| shard_count_of(Operation::Snapshot, group, n))
        .transpose()?;
    // A bucket is owned by its recorded session while that is its node's session, live, and
    // the node a member of the group: the members' nodes' sessions are the only live ones.
    let mut sessions: HashMap<(Uuid, Uuid), DateTime<Utc>> = HashMap::new();
    let mut members = Vec::with_capacity(member_rows.len());
    for m in member_rows {
        sessions.insert((m.node_id, m.session_id), m.expires_at);
        let live = now < m.expires_at;
        members.push(MemberInfo {
            worker: NodeId::from_uuid(m.node_id),
            session: SessionId::from_uuid(m.session_id),
            joined_at: m.joined_at,
            heartbeat_at: m.heartbeat_at,
            expires_at: m.expires_at,
            live,
            owned: if live {
                count(Operation::Snapshot, m.owned)?
            } else {
                0
            },
            metadata: MemberMetadata::new(m.metadata)
                .map_err(|e| corrupt(Operation::Snapshot, format!("node metadata: {e}")))?,
            weight: weight(Operation::Snapshot, m.weight)?,
            mode: mode(Operation::Snapshot, &m.mode)?,
            load: work(Operation::Snapshot, m.load)?,
            hottest: load(Operation::Snapshot, m.hottest)?,
        });
    }
    let info = |(b, owner, session, token, quarantined_until, reason, recorded): ShardRow| {
        let expires_at = owner
            .zip(session)
            .and_then(|key| sessions.get(&key).copied());
        let state = match (owner, expires_at) {
            (None, _) => BucketState::Unowned,
            (Some(_), Some(e)) if now < e => BucketState::Live,
            (Some(_), _) => BucketState::Expired,
        };
        Ok(BucketInfo {
            bucket: bucket(Operation::Snapshot, b)?,
            owner: owner.map(NodeId::from_uuid),
            session: session.map(SessionId::from_uuid),
            token: FencingToken(token),
            expires_at,
            state,
            // Q1: while it runs (a quarantine that ended keeps its value until replaced).
            quarantined_until: quarantined_until.filter(|&end| now < end),
            // Q5: the running quarantine's reason.
            quarantine_reason: match (quarantined_until.filter(|&end| now < end), reason) {
                (Some(_), Some(text)) => Some(QuarantineReason::new(text).map_err(|e| {
                    corrupt(Operation::Snapshot, format!("quarantine reason: {e}"))
                })?),
                _ => None,
            },
            // P4: the load last recorded, whoever holds the bucket now.
            load: load(Operation::Snapshot, recorded)?,
        })
    };
    let buckets = shard_rows
        .into_iter()
        .map(info)
        .collect::<Result<Vec<_>, StoreError>>()?;
    let mut draining = old_rows
        .into_iter()
        .map(|(b, owner, session, token)| info((b, owner, session, token, None, None, 0)))
        .collect::<Result<Vec<_>, StoreError>>()?;
    // Rows of a generation whose every bucket is retired wait for a claim or the next resize
    // to delete them: the drain is over (Z3), so they are not shown.
    if !draining.iter().any(|b| b.state == BucketState::Live) {
        draining.clear();
    }
    Ok(GroupSnapshot {
        group: group.clone(),
        shard_count,
        observed_at: now,
        members,
        buckets,
        generation: generation(Operation::Snapshot, stored_generation)?,
        previous,
        draining,
    })
}

/// A bucket row: bucket, owner, session, token, the end and reason of its quarantine, and
/// its load.
type ShardRow = (
    i32,
    Option<Uuid>,
    Option<Uuid>,
    i64,
    Option<Timestamp>,
    Option<String>,
    i64,
);
/// A bucket row of the draining generation: bucket, owner, session, token.
type OldRow = (i32, Option<Uuid>, Option<Uuid>, i64);
type GroupRow = (i32, i64, Option<i32>);

/// What a snapshot reads: the store's time, the group, its members, the current and the
/// draining generation's buckets.
type SnapshotReads = (
    Timestamp,
    Option<GroupRow>,
    Vec<sql::SnapshotMemberRow>,
    Vec<ShardRow>,
    Vec<OldRow>,
);

/// The snapshot's reads: the store's time, the group, its members and buckets.
async fn snapshot_reads(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    name: &str,
) -> diesel::QueryResult<SnapshotReads> {
    use crate::schema::{draining_shards, groups, shards};
    let now: sql::NowRow =
        Prepared(diesel::sql_query(sql::NOW).bind::<Nullable<Timestamptz>, _>(at))
            .get_result(conn)
            .await?;
    let count: Option<GroupRow> = groups::table
        .find(name)
        .select((
            groups::shard_count,
            groups::generation,
            groups::previous_count,
        ))
        .first(conn)
        .await
        .optional()?;
    let member_rows: Vec<sql::SnapshotMemberRow> =
        Prepared(diesel::sql_query(sql::SNAPSHOT_MEMBERS).bind::<Text, _>(name))
            .load(conn)
            .await?;
    let shard_rows: Vec<ShardRow> = shards::table
        .filter(shards::group_name.eq(name))
        .order(shards::bucket)
        .select((
            shards::bucket,
            shards::owner_node,
            shards::owner_session,
            shards::token,
            shards::quarantined_until,
            shards::quarantine_reason,
            shards::load,
        ))
        .load(conn)
        .await?;
    let old_rows: Vec<OldRow> = draining_shards::table
        .filter(draining_shards::group_name.eq(name))
        .order(draining_shards::bucket)
        .select((
            draining_shards::bucket,
            draining_shards::owner_node,
            draining_shards::owner_session,
            draining_shards::token,
        ))
        .load(conn)
        .await?;
    Ok((now.now, count, member_rows, shard_rows, old_rows))
}

/// [`AdminStore::nodes`](lease_core::AdminStore::nodes) on `conn`: one statement.
pub async fn nodes(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
) -> Result<NodesSnapshot, StoreError> {
    let op = Operation::Nodes;
    let rows: Vec<sql::NodeRow> =
        Prepared(diesel::sql_query(sql::NODES).bind::<Nullable<Timestamptz>, _>(at))
            .load(conn)
            .await
            .map_err(|e| from_diesel(op, e))?;
    let observed_at = <[_]>::first(&rows)
        .map(|r| r.now)
        .ok_or_else(|| corrupt(op, "the node listing returned no row".into()))?;
    let mut nodes = Vec::with_capacity(rows.len());
    for row in rows {
        let (
            Some(node),
            Some(session),
            Some(started_at),
            Some(heartbeat_at),
            Some(expires_at),
            Some(metadata),
            Some(handed_over),
        ) = (
            row.node_id,
            row.session_id,
            row.started_at,
            row.heartbeat_at,
            row.expires_at,
            row.metadata,
            row.handed_over,
        )
        else {
            // The clock's row alone: there is no node.
            continue;
        };
        let mut groups = row
            .groups
            .into_iter()
            .map(|g| group_name(op, g))
            .collect::<Result<Vec<_>, _>>()?;
        groups.sort();
        nodes.push(NodeInfo {
            node: NodeId::from_uuid(node),
            session: SessionId::from_uuid(session),
            started_at,
            heartbeat_at,
            expires_at,
            live: observed_at < expires_at,
            metadata: MemberMetadata::new(metadata)
                .map_err(|e| corrupt(op, format!("node metadata: {e}")))?,
            groups,
            handed_over,
            crossed: row.crossed,
        });
    }
    Ok(NodesSnapshot { observed_at, nodes })
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

/// [`AdminStore::control`](lease_core::AdminStore::control) on `conn`: one statement. `true`
/// if it changed the stored value (the group's counter moved), `false` if it was the one
/// stored (K3: nothing written).
pub async fn control(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    node: NodeId,
    control: MemberControl,
) -> Result<bool, StoreError> {
    let op = Operation::Control;
    let (weight, mode) = match control {
        MemberControl::Weight(w) => (Some(w), None),
        MemberControl::Mode(m) => (None, Some(m)),
        // A control this build does not know: refused rather than half applied.
        _ => {
            return Err(StoreError::backend_detail(
                op,
                lease_core::BackendFailure::Misconfigured,
                format!("{control:?} is not a control this store knows"),
            ));
        }
    };
    let row: sql::ControlRow = Prepared(
        diesel::sql_query(sql::CONTROL)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(node.as_uuid())
            // At most MAX_WEIGHT (1,000,000): it fits.
            .bind::<Nullable<Integer>, _>(weight.map(|w| w.get() as i32))
            .bind::<Nullable<Text>, _>(mode.map(MemberMode::as_str)),
    )
    .get_result(conn)
    .await
    .map_err(|e| from_diesel(op, e))?;
    match row.outcome {
        None => Err(not_found(group)),
        Some(outcome) => control_outcome(op, outcome, || StoreError::NotAMember {
            group: group.clone(),
            worker: node,
        }),
    }
}

/// What `lease.control` answered (migration 8): 0 it found no member row (`no_member`'s
/// error), 1 the value was the one stored (`false`: nothing written), 2 it changed the value
/// (`true`: the group's counter moved).
fn control_outcome(
    op: Operation,
    outcome: i32,
    no_member: impl FnOnce() -> StoreError,
) -> Result<bool, StoreError> {
    match outcome {
        0 => Err(no_member()),
        1 => Ok(false),
        2 => Ok(true),
        n => Err(corrupt(op, format!("lease.control answered {n}"))),
    }
}

/// [`WorkerStore::set_weight`](lease_core::WorkerStore::set_weight) on `conn`: one statement.
/// `true` if the weight changed (the group's counter moved), `false` if it was the one
/// stored. `at` is the client clock's time (`None`: the server's).
pub async fn set_weight(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    node: NodeId,
    session: SessionId,
    weight: Weight,
) -> Result<bool, StoreError> {
    let op = Operation::SetWeight;
    let row: sql::SetWeightRow = Prepared(
        diesel::sql_query(sql::SET_WEIGHT)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(node.as_uuid())
            // At most MAX_WEIGHT (1,000,000): it fits.
            .bind::<Integer, _>(weight.get() as i32)
            .bind::<SqlUuid, _>(session.as_uuid())
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .map_err(|e| from_diesel(op, e))?;
    if !row.found {
        return Err(not_found(group));
    }
    // Not the node's live session, or not a member (0: lease.control found no member row
    // after all; the session's own row was held, so only a leave of this node's own could
    // have removed it).
    let expired = || StoreError::SessionExpired {
        group: group.clone(),
        worker: node,
    };
    match row.outcome {
        None => Err(expired()),
        Some(outcome) => control_outcome(op, outcome, expired),
    }
}

/// [`AdminStore::evict`](lease_core::AdminStore::evict) on `conn`: [`leave`] under whatever
/// session the node holds.
pub async fn evict(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    node: NodeId,
) -> Result<Vec<Bucket>, StoreError> {
    leave_as(conn, at, group, node, None, Operation::Evict).await
}

/// [`AdminStore::quarantine_with_reason`](lease_core::AdminStore::quarantine_with_reason) on
/// `conn`: one statement (`lease.quarantine`, migration 12).
/// `true` if it set or lifted a quarantine (the group's counter moved), `false` if it lifted
/// a bucket not under quarantine (Q3: nothing written). `at` is the client clock's time
/// (`None`: the server's).
pub async fn quarantine(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    bucket: Bucket,
    duration: Option<QuarantineFor>,
    reason: Option<&QuarantineReason>,
) -> Result<bool, StoreError> {
    let op = Operation::Quarantine;
    let row: Option<sql::QuarantineRow> = Prepared(
        diesel::sql_query(sql::QUARANTINE)
            .bind::<Text, _>(group.as_str())
            .bind::<BigInt, _>(i64::from(bucket.0))
            .bind::<Nullable<Interval>, _>(duration.map(|d| {
                // At most a year (MAX_QUARANTINE): it fits.
                PgInterval::from_microseconds(
                    i64::try_from(d.get().as_micros()).unwrap_or(i64::MAX),
                )
            }))
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<Nullable<Text>, _>(reason.map(QuarantineReason::as_str)),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(op, e))?;
    let row = row.ok_or_else(|| not_found(group))?;
    let shards = shard_count(op, group, row.shard_count)?;
    if !shards.contains(bucket) {
        return Err(StoreError::BucketOutOfRange {
            group: group.clone(),
            bucket,
            shard_count: shards,
        });
    }
    Ok(row.changed)
}

/// [`AdminStore::history`](lease_core::AdminStore::history) on `conn`: one statement, which
/// reads only. The tenures of `bucket` of `group`'s current generation, oldest first.
pub async fn history(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    bucket: Bucket,
) -> Result<Vec<Tenure>, StoreError> {
    let op = Operation::History;
    let rows: Vec<sql::HistoryRow> = Prepared(
        diesel::sql_query(sql::HISTORY)
            .bind::<Text, _>(group.as_str())
            .bind::<BigInt, _>(i64::from(bucket.0)),
    )
    .load(conn)
    .await
    .map_err(|e| from_diesel(op, e))?;
    let first = <[_]>::first(&rows).ok_or_else(|| not_found(group))?;
    let shards = shard_count(op, group, first.shard_count)?;
    if !shards.contains(bucket) {
        return Err(StoreError::BucketOutOfRange {
            group: group.clone(),
            bucket,
            shard_count: shards,
        });
    }
    rows.into_iter()
        // The group's row alone: no tenure.
        .filter(|r| r.owner_node.is_some())
        .map(|r| tenure(op, r))
        .collect()
}

/// A row of [`sql::HISTORY`] as a tenure.
fn tenure(op: Operation, r: sql::HistoryRow) -> Result<Tenure, StoreError> {
    let (Some(owner), Some(token), Some(began_at)) = (r.owner_node, r.token, r.began_at) else {
        return Err(corrupt(
            op,
            "a tenure without its owner, token or start".into(),
        ));
    };
    let ended = match (r.ended_at, r.reason) {
        (None, None) => None,
        (Some(at), Some(name)) => Some(TenureEnd {
            at,
            reason: EndReason::from_name(&name)
                .ok_or_else(|| corrupt(op, format!("tenure end reason {name:?}")))?,
        }),
        _ => {
            return Err(corrupt(
                op,
                "a tenure end without its time or reason".into(),
            ));
        }
    };
    Ok(Tenure {
        owner: NodeId::from_uuid(owner),
        token: FencingToken(token),
        began_at,
        ended,
    })
}

/// [`WorkerStore::hand_over`](lease_core::WorkerStore::hand_over) on `conn`: one statement
/// (`lease.hand_over`). `Some` with the session's new expiry if `node`'s live session was
/// started by `incarnation` and is now handed over; `None` (nothing written) otherwise.
pub async fn hand_over(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    node: NodeId,
    incarnation: Incarnation,
    keep: Ttl,
) -> Result<Option<Timestamp>, StoreError> {
    let row: sql::HandOverRow = Prepared(
        diesel::sql_query(sql::HAND_OVER)
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<SqlUuid, _>(incarnation.as_uuid())
            .bind::<Interval, _>(PgInterval::from_microseconds(keep.as_micros()))
            .bind::<Nullable<Timestamptz>, _>(at),
    )
    .get_result(conn)
    .await
    .map_err(|e| from_diesel(Operation::HandOver, e))?;
    Ok(row.expires_at)
}

/// [`AdminStore::resize`](lease_core::AdminStore::resize) on `conn`: one transaction (a
/// savepoint inside yours) of five statements. The group's row is locked first, so resizes
/// of one group serialize and each compares the count the one before it left (Z1).
pub async fn resize(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    from: ShardCount,
    to: ShardCount,
) -> Result<ResizeOutcome, StoreError> {
    let op = Operation::Resize;
    conn.transaction::<_, Failed, _>(async |conn| {
        let row: Option<sql::ResizeLockRow> = Prepared(
            diesel::sql_query(sql::RESIZE_LOCK)
                .bind::<Text, _>(group.as_str())
                .bind::<Nullable<Timestamptz>, _>(at),
        )
        .get_result(conn)
        .await
        .optional()?;
        let row = row.ok_or_else(|| Failed::Store(not_found(group)))?;
        let found = shard_count(op, group, row.shard_count)?;
        let current = generation(op, row.generation)?;
        if found != from {
            return Err(Failed::Store(StoreError::ResizeFromMismatch {
                group: group.clone(),
                from,
                found,
            }));
        }
        if from == to {
            return Ok(ResizeOutcome::Unchanged {
                generation: current,
            });
        }
        if row.draining > 0 {
            let previous = row
                .previous_count
                .ok_or_else(|| corrupt(op, "a draining generation without its count".into()))?;
            return Err(Failed::Store(StoreError::ResizeInProgress {
                group: group.clone(),
                from: shard_count(op, group, previous)?,
                to: found,
                draining: u32::try_from(row.draining).unwrap_or(u32::MAX),
            }));
        }
        Prepared(diesel::sql_query(sql::RESIZE_DROP_OLD).bind::<Text, _>(group.as_str()))
            .execute(conn)
            .await?;
        Prepared(diesel::sql_query(sql::RESIZE_MOVE).bind::<Text, _>(group.as_str()))
            .execute(conn)
            .await?;
        let opened: sql::ResizeOpenRow = Prepared(
            diesel::sql_query(sql::RESIZE_OPEN)
                .bind::<Text, _>(group.as_str())
                .bind::<Integer, _>(from.get() as i32)
                .bind::<Integer, _>(to.get() as i32)
                .bind::<Nullable<Timestamptz>, _>(at),
        )
        .get_result(conn)
        .await?;
        Prepared(diesel::sql_query(sql::RESIZE_BUMP).bind::<Text, _>(group.as_str()))
            .execute(conn)
            .await?;
        Ok(ResizeOutcome::Started {
            generation: generation(op, opened.generation)?,
        })
    })
    .await
    .map_err(|e| match e {
        Failed::Store(e) => e,
        Failed::Diesel(e) => from_diesel(op, e),
    })
}

/// Why [`resize`]'s transaction rolled back.
enum Failed {
    Store(StoreError),
    Diesel(diesel::result::Error),
}

impl From<diesel::result::Error> for Failed {
    fn from(e: diesel::result::Error) -> Self {
        Failed::Diesel(e)
    }
}

impl From<StoreError> for Failed {
    fn from(e: StoreError) -> Self {
        Failed::Store(e)
    }
}
