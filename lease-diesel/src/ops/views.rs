//! The heartbeat on a connection: the steady renewal, the full heartbeat, and the views it
//! gives, loads included.

use super::*;

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
