//! What a resize's drain costs the statements that run during it, and what an operation its
//! caller gave up on leaves running on the server (docs/postgres.md, "Changing the
//! shard count on Postgres" and "Connections").
//!
//! A merge from many buckets to a few leaves every worker's old buckets in the draining
//! generation until it releases them, and a stopped worker's until its session ends. Work per
//! old bucket in a statement every worker runs (a claim judging each old bucket's owner, a
//! heartbeat counting them, a release matching each of its rows against the whole list it
//! was given) made each call of a 65,536 -> 4 merge take seconds; calls past the worker's
//! deadline were abandoned but ran on, holding the node row the next heartbeat needed. The
//! costs here are counted by the server, in the transaction that runs the statement
//! (`pg_stat_get_xact_*`), never timed: a count does not depend on the machine's load.

mod support;

use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::BigInt;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_core::{
    AdminStore, Bucket, GroupName, MemberMetadata, NodeId, SessionId, ShardCount, Takeover, Ttl,
    WorkerStore,
};
use lease_diesel::{PgLeaseStore, ops};
use support::process;

/// The old generation's size: enough that a cost per old bucket stands out.
const OLD: u32 = 4096;
const NEW: u32 = 4;

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

/// Calls of `lease.owner_is_dead` in the current transaction (the session tracks PL/pgSQL
/// functions: `SET track_functions = 'pl'`).
async fn owner_judgements(conn: &mut AsyncPgConnection) -> i64 {
    scalar(
        conn,
        "SELECT COALESCE(pg_stat_get_xact_function_calls(
                             'lease.owner_is_dead(text, uuid, uuid, timestamptz)'::regprocedure),
                         0) AS n",
    )
    .await
}

/// Index entries and heap rows (sequential scans) of `lease.<table>` read so far in the
/// current transaction.
async fn rows_read(conn: &mut AsyncPgConnection, table: &str) -> i64 {
    scalar(
        conn,
        &format!(
            "SELECT (pg_stat_get_xact_tuples_returned('lease.{table}'::regclass)
                     + (SELECT COALESCE(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)
                          FROM pg_index i WHERE i.indrelid = 'lease.{table}'::regclass))::bigint
                    AS n"
        ),
    )
    .await
}

/// A group of [`OLD`] buckets held by three live nodes (a third each), resized to [`NEW`]:
/// every old bucket drains, held live. Returns the database's URL, the store, the group, the
/// holders with their sessions, and a fourth live member that holds nothing.
async fn a_merge_held_by_three() -> (
    String,
    PgLeaseStore,
    GroupName,
    Vec<(NodeId, SessionId)>,
    (NodeId, SessionId),
) {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(4)
        .build()
        .expect("a store");
    let g = GroupName::new("merged").expect("name");
    store
        .ensure_group(&g, ShardCount::new(OLD).expect("count"))
        .await
        .expect("ensure");
    let ttl = Ttl::from_secs(600).expect("ttl");
    let meta = MemberMetadata::empty();
    let mut nodes = Vec::new();
    for _ in 0..4 {
        let w = NodeId::new();
        let beat = support::beat(&store, &g, w, ttl, &meta)
            .await
            .expect("a member");
        nodes.push((w, beat.session));
    }
    let idle = nodes.pop().expect("four nodes");
    let mut held = 0;
    for (i, &(w, s)) in nodes.iter().enumerate() {
        let share = if i == 2 { OLD - held } else { OLD / 3 };
        let won = store
            .claim(&g, w, s, share, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), share as usize);
        held += share;
    }
    store
        .resize(
            &g,
            ShardCount::new(OLD).expect("count"),
            ShardCount::new(NEW).expect("count"),
        )
        .await
        .expect("resize");
    (db.url, store, g, nodes, idle)
}

/// A claim while a merge drains judges each old owner's session once (three calls of
/// `lease.owner_is_dead`), never each old bucket (4,096 calls: about 30 µs each, 2 s for a
/// merge from 65,536); so does a resize refused while the drain lasts. Nothing is claimable
/// (every new bucket waits for live owners' old buckets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_during_a_drain_judges_each_old_owner_once() {
    let (url, _store, g, holders, (idle, idle_session)) = a_merge_held_by_three().await;
    let mut conn = connect(&url).await;
    exec(&mut conn, "SET track_functions = 'pl'").await;
    exec(&mut conn, "BEGIN").await;
    let before = owner_judgements(&mut conn).await;
    let won = ops::claim(
        &mut conn,
        None,
        &g,
        idle,
        idle_session,
        NEW,
        Takeover::Allowed,
    )
    .await
    .expect("claim");
    assert!(won.is_empty(), "every new bucket waits: {won:?}");
    let judged = owner_judgements(&mut conn).await - before;
    exec(&mut conn, "ROLLBACK").await;
    assert_eq!(
        judged,
        holders.len() as i64,
        "owners judged by one claim while {OLD} old buckets of {} owners drain",
        holders.len()
    );

    exec(&mut conn, "BEGIN").await;
    let before = owner_judgements(&mut conn).await;
    let refused = ops::resize(
        &mut conn,
        None,
        &g,
        ShardCount::new(NEW).expect("count"),
        ShardCount::new(8).expect("count"),
    )
    .await;
    assert_eq!(
        refused.map_err(|e| e.kind()).err(),
        Some(lease_core::ErrorKind::ResizeInProgress)
    );
    let judged = owner_judgements(&mut conn).await - before;
    exec(&mut conn, "ROLLBACK").await;
    assert_eq!(judged, holders.len() as i64, "owners judged by the resize");
}

/// A heartbeat giving the view of a group whose old generation is held by other members reads
/// none of the old buckets but one (whether there are any): the view's count of them is the
/// member rows' (4,096 index entries read on every such heartbeat before). The count is right all along the
/// drain: after a release of old buckets, and once the drain is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_during_a_drain_reads_no_old_bucket_of_the_others() {
    let (url, store, g, holders, (idle, _)) = a_merge_held_by_three().await;
    let ttl = Ttl::from_secs(600).expect("ttl");
    let meta = MemberMetadata::empty();
    let mut conn = connect(&url).await;
    let view_of_idle = async |conn: &mut AsyncPgConnection| {
        exec(conn, "BEGIN").await;
        let before = rows_read(conn, "draining_shards").await;
        let beat = ops::heartbeat(conn, None, idle, process(idle), ttl, &meta, &[])
            .await
            .expect("heartbeat");
        let read = rows_read(conn, "draining_shards").await - before;
        exec(conn, "COMMIT").await;
        let view = beat.group(&g).expect("a view").view.clone();
        (view.draining, read)
    };
    // One probe: whether the group has old rows at all.
    let (draining, read) = view_of_idle(&mut conn).await;
    assert_eq!(draining, OLD);
    assert!(
        read <= 4,
        "a heartbeat of a member holding no old bucket read {read} old rows"
    );
    let (first, first_session) = holders[0];
    let beat = support::beat(&store, &g, first, ttl, &meta)
        .await
        .expect("heartbeat");
    let old: Vec<Bucket> = beat.owned.iter().map(|l| l.bucket).collect();
    assert_eq!(old.len(), (OLD / 3) as usize);
    let released = store
        .release(&g, first, first_session, &old[..10])
        .await
        .expect("release");
    assert_eq!(released.len(), 10);
    let (draining, read) = view_of_idle(&mut conn).await;
    assert_eq!(draining, OLD - 10, "after a release of 10 old buckets");
    assert!(read <= 4, "{read} old rows read");
    for &(w, s) in &holders {
        let beat = support::beat(&store, &g, w, ttl, &meta)
            .await
            .expect("heartbeat");
        let old: Vec<Bucket> = beat.owned.iter().map(|l| l.bucket).collect();
        store.release(&g, w, s, &old).await.expect("release");
    }
    assert_eq!(view_of_idle(&mut conn).await.0, 0, "the drain is over");
}

/// A release costs what it asks for: releasing one old bucket of a session that holds 1,365
/// reads a handful of index entries (each bucket asked for is looked up by its number), not
/// every bucket the session holds, which it then matched against the whole list it was given
/// (`= ANY` of a parameter: a linear scan of the list per row, so releasing everything took
/// time quadratic in the count: 4 s for 21,846 old buckets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_reads_the_buckets_it_asks_for() {
    let (url, store, g, holders, _) = a_merge_held_by_three().await;
    let (w, s) = holders[0];
    let ttl = Ttl::from_secs(600).expect("ttl");
    let beat = support::beat(&store, &g, w, ttl, &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    let one = beat.owned[0].bucket;
    let mut conn = connect(&url).await;
    // As a worker's pooled connection runs it once the statement has been prepared a few
    // times: with a plan made without the parameters' values.
    exec(&mut conn, "SET plan_cache_mode = force_generic_plan").await;
    exec(&mut conn, "BEGIN").await;
    let before = rows_read(&mut conn, "draining_shards").await;
    let released = ops::release(&mut conn, None, &g, w, s, &[one])
        .await
        .expect("release");
    let read = rows_read(&mut conn, "draining_shards").await - before;
    exec(&mut conn, "COMMIT").await;
    assert_eq!(released, [one]);
    assert!(
        read <= 4,
        "a release of one old bucket read {read} old rows of a session holding {}",
        beat.owned.len()
    );
}

/// A call its caller gave up on (a worker's deadline drops the future) is cancelled on the
/// server: closing the connection alone leaves the statement running (here a claim waiting
/// for its node row, which an open transaction holds) until the statement timeout, holding
/// what it locked. Within a few seconds the statement is gone from `pg_stat_activity`, while
/// the lock it waited for is still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_its_caller_gave_up_on_stops_on_the_server() {
    let db = lease_testdb::database().await;
    // A statement timeout far beyond the test: only a cancel ends the claim early.
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(2)
        .statement_timeout(Duration::from_secs(120))
        .build()
        .expect("a store");
    let g = GroupName::new("abandoned").expect("name");
    store
        .ensure_group(&g, ShardCount::new(8).expect("count"))
        .await
        .expect("ensure");
    let w = NodeId::new();
    let ttl = Ttl::from_secs(600).expect("ttl");
    let beat = support::beat(&store, &g, w, ttl, &MemberMetadata::empty())
        .await
        .expect("a member");
    let mut holder = connect(&db.url).await;
    exec(&mut holder, "BEGIN").await;
    exec(
        &mut holder,
        &format!(
            "SELECT 1 FROM lease.nodes WHERE node_id = '{}' FOR UPDATE",
            w.as_uuid()
        ),
    )
    .await;
    let mut admin = connect(&db.url).await;
    let waiting = format!(
        "SELECT count(*) AS n FROM pg_stat_activity
          WHERE datname = '{}' AND state = 'active' AND query LIKE '%WITH RECURSIVE me AS%'
            AND pid <> pg_backend_pid()",
        db.name
    );
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        store.claim(&g, w, beat.session, 8, Takeover::Allowed),
    )
    .await;
    assert!(gave_up.is_err(), "the claim did not wait: {gave_up:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let running = scalar(&mut admin, &waiting).await;
        if running == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the abandoned claim still runs on the server 5 s after its caller gave up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    exec(&mut holder, "ROLLBACK").await;
    let won = store
        .claim(&g, w, beat.session, 8, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 8, "the abandoned claim committed nothing");
}
