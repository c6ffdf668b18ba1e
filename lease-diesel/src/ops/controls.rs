//! The operators' and the node's controls on a connection: modes and weights, evictions,
//! quarantines, the hand-over of a session, and resizes.

use super::*;

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
