//! Loads on Postgres (rules P1-P5): a worker's publication of its buckets' loads and of its
//! work, one statement. The heartbeat reads them back (see `statements::HEARTBEAT`).

use diesel::OptionalExtension;
use diesel::QueryableByName;
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use lease_core::{Bucket, GroupName, Load, NodeId, Operation, SessionId, StoreError, Timestamp};

use crate::error::from_diesel;
use crate::ops::{not_found, shard_count};
use crate::prepared::Prepared;

/// Record loads `$6` on buckets `$5` (parallel; for a bucket listed twice, the last) of those
/// node `$2`'s live session `$3` owns in group `$1`, the node a member (P1, P2), then the
/// member's work from the loads on every bucket it owns (P3), and move the group's change
/// counter if a load or the work changed (P5). `$4` client time. Nothing is written when a
/// listed bucket is out of range (the caller tells it by the shard count returned). No row: no
/// such group; `live` false: not the node's live session, or not a member (nothing written).
///
/// Locks as a claim takes them, in its order: the node row shared (a renewal, or a claimer
/// ending the session, waits), the member row, the owned bucket rows (a claim's walks skip
/// none of them: a live session's rows are no candidates), the counter last. Liveness is
/// judged again once the rows are locked, as a claim does. The cost follows the buckets the
/// node owns in the group, never the shard count.
const PUBLISH: &str = r#"
WITH me AS (
    SELECT n.session_id, n.expires_at
      FROM lease.nodes n JOIN lease.members m ON m.group_name = $1 AND m.node_id = n.node_id
     WHERE n.node_id = $2 AND n.session_id = $3
       AND n.expires_at > COALESCE($4, clock_timestamp())
       FOR SHARE OF n FOR UPDATE OF m
), mine AS (
    SELECT me.session_id FROM me WHERE me.expires_at > COALESCE($4, clock_timestamp())
), in_range AS (
    SELECT 1 FROM lease.groups g
     WHERE g.name = $1
       AND NOT EXISTS (SELECT 1 FROM unnest($5::int[]) AS a(bucket)
                        WHERE a.bucket < 0 OR a.bucket >= g.shard_count)
), asked AS (
    SELECT DISTINCT ON (a.bucket) a.bucket, a.load
      FROM unnest($5::int[], $6::bigint[]) WITH ORDINALITY AS a(bucket, load, i)
     ORDER BY a.bucket, a.i DESC
), held AS (
    SELECT s.bucket, s.load FROM lease.shards s, mine, in_range
     WHERE s.group_name = $1 AND s.owner_node = $2 AND s.owner_session = mine.session_id
       FOR UPDATE OF s
), recorded AS (
    UPDATE lease.shards s SET load = a.load
      FROM asked a JOIN held h ON h.bucket = a.bucket
     WHERE s.group_name = $1 AND s.bucket = a.bucket AND s.load <> a.load
    RETURNING s.bucket
), work AS (
    SELECT COALESCE(sum(COALESCE(a.load, h.load)), 0)::bigint AS load,
           COALESCE(max(COALESCE(a.load, h.load)), 0)::bigint AS hottest
      FROM held h LEFT JOIN asked a ON a.bucket = h.bucket
), member AS (
    UPDATE lease.members m SET load = w.load, hottest = w.hottest
      FROM work w, mine, in_range
     WHERE m.group_name = $1 AND m.node_id = $2
       AND (m.load, m.hottest) IS DISTINCT FROM (w.load, w.hottest)
    RETURNING m.node_id
), bumped AS (
    UPDATE lease.group_changes c SET version = c.version + 1
     WHERE c.group_name = $1
       AND (EXISTS (SELECT 1 FROM recorded) OR EXISTS (SELECT 1 FROM member))
    RETURNING c.version
)
SELECT g.shard_count, EXISTS (SELECT 1 FROM mine) AS live,
       (SELECT count(*) FROM held h JOIN asked a ON a.bucket = h.bucket) AS recorded,
       (SELECT count(*) FROM bumped) AS bumped
  FROM lease.groups g
 WHERE g.name = $1
"#;

/// Row of [`PUBLISH`].
#[derive(QueryableByName, Debug)]
struct PublishRow {
    #[diesel(sql_type = Integer)]
    shard_count: i32,
    #[diesel(sql_type = Bool)]
    live: bool,
    #[diesel(sql_type = BigInt)]
    recorded: i64,
    /// Whether the counter moved (read so that the statement runs its updates in order).
    #[diesel(sql_type = BigInt)]
    #[allow(dead_code)]
    bumped: i64,
}

/// [`WorkerStore::publish_loads`](lease_core::WorkerStore::publish_loads) on `conn`: one
/// statement.
pub async fn publish_loads(
    conn: &mut AsyncPgConnection,
    at: Option<Timestamp>,
    group: &GroupName,
    worker: NodeId,
    session: SessionId,
    loads: &[(Bucket, Load)],
) -> Result<u32, StoreError> {
    let op = Operation::PublishLoads;
    // Out of i32, a bucket is out of every range: -1 says so to the statement (P2).
    let buckets: Vec<i32> = loads
        .iter()
        .map(|(b, _)| i32::try_from(b.0).unwrap_or(-1))
        .collect();
    // Load::MAX is far below i64::MAX.
    let values: Vec<i64> = loads
        .iter()
        .map(|(_, l)| i64::try_from(l.micros()).unwrap_or(i64::MAX))
        .collect();
    let row: Option<PublishRow> = Prepared(
        diesel::sql_query(PUBLISH)
            .bind::<Text, _>(group.as_str())
            .bind::<SqlUuid, _>(worker.as_uuid())
            .bind::<SqlUuid, _>(session.as_uuid())
            .bind::<Nullable<Timestamptz>, _>(at)
            .bind::<Array<Integer>, _>(&buckets)
            .bind::<Array<BigInt>, _>(&values),
    )
    .get_result(conn)
    .await
    .optional()
    .map_err(|e| from_diesel(op, e))?;
    let row = row.ok_or_else(|| not_found(group))?;
    let shards = shard_count(op, group, row.shard_count)?;
    if let Some(&(bucket, _)) = loads.iter().find(|(b, _)| b.0 >= shards.get()) {
        return Err(StoreError::BucketOutOfRange {
            group: group.clone(),
            bucket,
            shard_count: shards,
        });
    }
    if !row.live {
        return Err(StoreError::SessionExpired {
            group: group.clone(),
            worker,
        });
    }
    Ok(u32::try_from(row.recorded).unwrap_or(u32::MAX))
}
