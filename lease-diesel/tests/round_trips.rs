//! What a steady-state heartbeat costs on Postgres: statements sent (counted by diesel's
//! instrumentation on every pooled connection), statements prepared, and rows written (rows
//! whose `xmin` is newer than a transaction id taken just before).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use diesel::QueryableByName;
use diesel::connection::{Instrumentation, InstrumentationEvent};
use diesel::sql_types::BigInt;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncConnection, AsyncPgConnection};
mod support;

use lease_core::{
    Bucket, GroupName, LeaseStore, MemberMetadata, ShardCount, Takeover, Ttl, WorkerId,
};
use lease_diesel::PgLeaseStore;
use support::process;

#[derive(Default)]
struct Counts {
    queries: AtomicUsize,
    prepared: AtomicUsize,
}

struct Counting(Arc<Counts>);

impl Instrumentation for Counting {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartQuery { .. } => {
                self.0.queries.fetch_add(1, Ordering::SeqCst);
            }
            InstrumentationEvent::CacheQuery { .. } => {
                self.0.prepared.fetch_add(1, Ordering::SeqCst);
            }
            _ => {}
        }
    }
}

/// A store whose every connection reports to `counts`.
fn counted_store(url: String, counts: Arc<Counts>) -> PgLeaseStore {
    let mut config = ManagerConfig::<AsyncPgConnection>::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = Box::new(move |url| {
        let counts = counts.clone();
        let url = url.to_owned();
        Box::pin(async move {
            let mut conn = AsyncPgConnection::establish(&url).await?;
            conn.set_instrumentation(Counting(counts));
            Ok(conn)
        })
    });
    let manager = AsyncDieselConnectionManager::new_with_config(url, config);
    let pool = Pool::builder(manager).max_size(4).build().expect("a pool");
    PgLeaseStore::from_pool(pool)
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    // Scoped: its blanket `load` would shadow the atomics' `load` elsewhere in this file.
    use diesel_async::RunQueryDsl;
    diesel::sql_query(sql)
        .get_result::<Count>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

fn snapshot(counts: &Counts) -> (usize, usize) {
    (
        counts.queries.load(Ordering::SeqCst),
        counts.prepared.load(Ordering::SeqCst),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_heartbeat_is_one_statement_writing_one_row() {
    let db = lease_testdb::database().await;
    let counts = Arc::new(Counts::default());
    let store = counted_store(db.url.clone(), counts.clone());
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    let group = GroupName::new("orders").expect("name");
    let ttl = Ttl::from_secs(60).expect("ttl");
    let meta = MemberMetadata::empty();
    store
        .ensure_group(&group, ShardCount::new(1024).expect("count"))
        .await
        .expect("ensure");

    // Eight workers split 1,024 buckets; `me` holds 128 of them.
    let workers: Vec<WorkerId> = (0..8).map(|_| WorkerId::new()).collect();
    for &w in &workers {
        let joined = store
            .heartbeat(&group, w, process(w), ttl, &meta)
            .await
            .expect("join");
        let won = store
            .claim(&group, w, joined.session, 128, Takeover::Allowed)
            .await;
        assert_eq!(won.expect("claim").len(), 128);
    }
    let me = workers[0];

    // Warm every pooled connection so each has prepared the heartbeat once.
    for _ in 0..8 {
        store
            .heartbeat(&group, me, process(me), ttl, &meta)
            .await
            .expect("warm-up");
    }

    assert!(
        snapshot(&counts).1 > 0,
        "the heartbeat statement was never cached"
    );
    let before = snapshot(&counts);
    let heartbeats = 20;
    for _ in 0..heartbeats {
        let beat = store
            .heartbeat(&group, me, process(me), ttl, &meta)
            .await
            .expect("heartbeat");
        assert!(!beat.new_session);
        assert_eq!(beat.owned.len(), 128);
        assert_eq!(beat.view.members.len(), 8);
    }
    let after = snapshot(&counts);
    assert_eq!(
        after.0 - before.0,
        heartbeats,
        "statements sent for {heartbeats} heartbeats"
    );
    assert_eq!(
        after.1 - before.1,
        0,
        "a steady heartbeat prepared a statement"
    );

    // Rows written by one heartbeat: only the worker's member row, though it holds 128 buckets.
    let xid = scalar(&mut admin, "SELECT txid_current() AS n").await;
    store
        .heartbeat(&group, me, process(me), ttl, &meta)
        .await
        .expect("heartbeat");
    let members_written = scalar(
        &mut admin,
        &format!("SELECT count(*) AS n FROM lease.members WHERE xmin::text::bigint > {xid}"),
    )
    .await;
    let shards_written = scalar(
        &mut admin,
        &format!("SELECT count(*) AS n FROM lease.shards WHERE xmin::text::bigint > {xid}"),
    )
    .await;
    // The server's timeline is recorded once; in steady state the heartbeat's insert finds
    // it and writes nothing.
    let epochs_written = scalar(
        &mut admin,
        &format!("SELECT count(*) AS n FROM lease.server_epochs WHERE xmin::text::bigint > {xid}"),
    )
    .await;
    assert_eq!(
        (members_written, shards_written, epochs_written),
        (1, 0, 0),
        "rows written by one heartbeat"
    );
    eprintln!(
        "steady heartbeat holding 128 of 1,024 buckets: {} statement(s), {} prepare(s), \
         {members_written} member row and {shards_written} bucket rows written",
        (after.0 - before.0) / heartbeats,
        after.1 - before.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_is_one_statement() {
    let db = lease_testdb::database().await;
    let counts = Arc::new(Counts::default());
    let store = counted_store(db.url.clone(), counts.clone());
    let group = GroupName::new("orders").expect("name");
    let ttl = Ttl::from_secs(60).expect("ttl");
    let meta = MemberMetadata::empty();
    let me = WorkerId::new();
    store
        .ensure_group(&group, ShardCount::new(16).expect("count"))
        .await
        .expect("ensure");
    // Run each operation twice (the first call on a connection prepares), then count a third.
    for round in 0..3 {
        let before = snapshot(&counts);
        let beat = store
            .heartbeat(&group, me, process(me), ttl, &meta)
            .await
            .expect("heartbeat");
        let mid = snapshot(&counts);
        let won = store
            .claim(&group, me, beat.session, 4, Takeover::Allowed)
            .await
            .expect("claim");
        let after_claim = snapshot(&counts);
        store
            .release(&group, me, beat.session, &[won[0].bucket, Bucket(15)])
            .await
            .expect("release");
        let after_release = snapshot(&counts);
        store
            .leave(&group, me, Some(beat.session))
            .await
            .expect("leave");
        let after_leave = snapshot(&counts);
        if round == 0 {
            // Statements are cached: the first use on a connection prepares them (an uncached
            // statement would be re-parsed on every call and never reported here).
            assert!(
                after_leave.1 - before.1 >= 4,
                "the statements were not cached"
            );
        }
        if round == 2 {
            assert_eq!(mid.0 - before.0, 1, "heartbeat statements");
            assert_eq!(after_claim.0 - mid.0, 1, "claim statements");
            assert_eq!(after_release.0 - after_claim.0, 1, "release statements");
            assert_eq!(after_leave.0 - after_release.0, 1, "leave statements");
            assert_eq!(after_leave.1 - before.1, 0, "statements prepared again");
        }
    }
}
