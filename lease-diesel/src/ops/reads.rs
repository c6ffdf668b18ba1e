//! The operators' reads on a connection: a group's snapshot, the nodes, a bucket's history.

use super::*;

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
