//! What a node's steady heartbeat costs on Postgres: statements sent (counted by diesel's
//! instrumentation on every pooled connection), statements prepared, and rows written (rows
//! whose `xmin` is newer than a transaction id taken just before), for a node in 1, 10 and
//! 100 groups.

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
    AdminStore, Bucket, GroupName, GroupStamp, Heartbeat, MemberMetadata, NodeId, ShardCount,
    Takeover, Ttl, WorkerStore,
};
use lease_core::{MemberControl, QuarantineFor, Weight};
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

/// The stamps to hand in next: every group of `beat`, given or unchanged.
fn stamps(beat: &Heartbeat) -> Vec<GroupStamp> {
    beat.groups
        .iter()
        .map(|g| GroupStamp {
            group: g.group.clone(),
            stamp: g.stamp,
        })
        .chain(beat.unchanged.iter().cloned())
        .collect()
}

/// Rows of `table` written since transaction `xid`.
async fn written(admin: &mut AsyncPgConnection, table: &str, xid: i64) -> i64 {
    scalar(
        admin,
        &format!("SELECT count(*) AS n FROM lease.{table} WHERE xmin::text::bigint > {xid}"),
    )
    .await
}

/// A node in `groups` groups of 64 buckets, holding 8 buckets in each, with 3 other live nodes
/// in each group holding 8 each, a weight of its own and a bucket under quarantine in each
/// group: its steady heartbeat (every stamp handed in, nothing changed) is one statement,
/// prepares nothing, and writes one row, the node's, whatever `groups` is.
async fn steady_heartbeat_in(groups: usize) {
    let db = lease_testdb::database().await;
    let counts = Arc::new(Counts::default());
    let store = counted_store(db.url.clone(), counts.clone());
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    // Long enough that no stamp's `until` passes during the test.
    let ttl = Ttl::from_secs(600).expect("ttl");
    let meta = MemberMetadata::empty();
    let names: Vec<GroupName> = (0..groups)
        .map(|i| GroupName::new(format!("orders-{i:03}")).expect("name"))
        .collect();
    let nodes: Vec<NodeId> = (0..4).map(|_| NodeId::new()).collect();
    let mut sessions = Vec::new();
    for &w in &nodes {
        let beat = store
            .heartbeat(w, process(w), ttl, &meta, &[])
            .await
            .expect("a session");
        sessions.push(beat.session);
    }
    for g in &names {
        store
            .ensure_group(g, ShardCount::new(64).expect("count"))
            .await
            .expect("ensure");
        for (&w, &session) in nodes.iter().zip(&sessions) {
            store.join(g, w, session).await.expect("join");
            let won = store
                .claim(g, w, session, 8, Takeover::Allowed)
                .await
                .expect("claim");
            assert_eq!(won.len(), 8);
        }
    }
    let me = nodes[0];
    // Operators' controls, which views show: a weight for `me` and a quarantine (longer than
    // the test) in every group.
    let hour = QuarantineFor::new(std::time::Duration::from_secs(3600)).expect("duration");
    for g in &names {
        store
            .control(
                g,
                me,
                MemberControl::Weight(Weight::new(2).expect("weight")),
            )
            .await
            .expect("control");
        store
            .quarantine(g, Bucket(63), Some(hour))
            .await
            .expect("quarantine");
    }
    // The other nodes renew, so that every stamp's `until` is a full ttl ahead.
    for &w in &nodes[1..] {
        store
            .heartbeat(w, process(w), ttl, &meta, &[])
            .await
            .expect("renewal");
    }
    // The first heartbeat gives every view; warm every pooled connection with steady ones.
    let mut beat = store
        .heartbeat(me, process(me), ttl, &meta, &[])
        .await
        .expect("views");
    assert_eq!(beat.groups.len(), groups, "every view is given once");
    assert!(beat.groups.iter().all(|g| g.owned.len() == 8));
    assert!(beat.groups.iter().all(|g| {
        g.view.quarantined == 1
            && g.view
                .members
                .iter()
                .any(|m| m.worker == me && m.weight == 2)
    }));
    for _ in 0..8 {
        beat = store
            .heartbeat(me, process(me), ttl, &meta, &stamps(&beat))
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
        beat = store
            .heartbeat(me, process(me), ttl, &meta, &stamps(&beat))
            .await
            .expect("heartbeat");
        assert!(!beat.new_session);
        assert!(
            beat.groups.is_empty(),
            "a view was given: {:?}",
            beat.groups
        );
        assert_eq!(beat.unchanged.len(), groups, "every group is answered");
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

    // Rows written by one steady heartbeat: only the node's row, however many groups it is in
    // and whatever it holds in them. The server's timeline was recorded once; only a new
    // session records a new one.
    let xid = scalar(&mut admin, "SELECT txid_current() AS n").await;
    let beat = store
        .heartbeat(me, process(me), ttl, &meta, &stamps(&beat))
        .await
        .expect("heartbeat");
    assert!(beat.groups.is_empty());
    let mut rows = Vec::new();
    for table in [
        "nodes",
        "members",
        "group_changes",
        "groups",
        "shards",
        "draining_shards",
        "server_epochs",
        "member_controls",
        "quarantines",
        "tenures",
    ] {
        rows.push((table, written(&mut admin, table, xid).await));
    }
    assert_eq!(
        rows,
        [
            ("nodes", 1),
            ("members", 0),
            ("group_changes", 0),
            ("groups", 0),
            ("shards", 0),
            ("draining_shards", 0),
            ("server_epochs", 0),
            ("member_controls", 0),
            ("quarantines", 0),
            ("tenures", 0)
        ],
        "rows written by one steady heartbeat in {groups} group(s)"
    );
    eprintln!(
        "steady heartbeat of a node in {groups} group(s) holding {} buckets: {} statement(s), \
         {} prepare(s), 1 node row written, nothing else",
        8 * groups,
        (after.0 - before.0) / heartbeats,
        after.1 - before.1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_heartbeat_in_one_group_is_one_statement_writing_one_row() {
    steady_heartbeat_in(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_heartbeat_in_ten_groups_is_one_statement_writing_one_row() {
    steady_heartbeat_in(10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_heartbeat_in_a_hundred_groups_is_one_statement_writing_one_row() {
    steady_heartbeat_in(100).await;
}

/// A heartbeat that gives views (no stamps handed in, as after a restart of the process) is
/// one statement too, and writes only the node's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_giving_every_view_is_one_statement_writing_one_row() {
    let db = lease_testdb::database().await;
    let counts = Arc::new(Counts::default());
    let store = counted_store(db.url.clone(), counts.clone());
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    let ttl = Ttl::from_secs(60).expect("ttl");
    let meta = MemberMetadata::empty();
    let group = GroupName::new("orders").expect("name");
    store
        .ensure_group(&group, ShardCount::new(1024).expect("count"))
        .await
        .expect("ensure");
    // Eight nodes split 1,024 buckets; `me` holds 128 of them.
    let nodes: Vec<NodeId> = (0..8).map(|_| NodeId::new()).collect();
    for &w in &nodes {
        let session = store
            .heartbeat(w, process(w), ttl, &meta, &[])
            .await
            .expect("a session")
            .session;
        store.join(&group, w, session).await.expect("join");
        let won = store
            .claim(&group, w, session, 128, Takeover::Allowed)
            .await;
        assert_eq!(won.expect("claim").len(), 128);
    }
    let me = nodes[0];
    for _ in 0..8 {
        store
            .heartbeat(me, process(me), ttl, &meta, &[])
            .await
            .expect("warm-up");
    }
    let before = snapshot(&counts);
    let xid = scalar(&mut admin, "SELECT txid_current() AS n").await;
    let beat = store
        .heartbeat(me, process(me), ttl, &meta, &[])
        .await
        .expect("heartbeat");
    let after = snapshot(&counts);
    let view = beat.group(&group).expect("the view");
    assert_eq!(view.owned.len(), 128);
    assert_eq!(view.view.members.len(), 8);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 0));
    let mut rows = Vec::new();
    for table in [
        "nodes",
        "members",
        "group_changes",
        "shards",
        "server_epochs",
    ] {
        rows.push(written(&mut admin, table, xid).await);
    }
    assert_eq!(
        rows,
        [1, 0, 0, 0, 0],
        "rows written by a heartbeat giving views"
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
    let me = NodeId::new();
    store
        .ensure_group(&group, ShardCount::new(16).expect("count"))
        .await
        .expect("ensure");
    // Run each operation twice (the first call on a connection prepares), then count a third.
    // Leaving the only group ends the session, so each round starts one.
    for round in 0..3 {
        let before = snapshot(&counts);
        let beat = store
            .heartbeat(me, process(me), ttl, &meta, &[])
            .await
            .expect("heartbeat");
        let after_beat = snapshot(&counts);
        store.join(&group, me, beat.session).await.expect("join");
        let after_join = snapshot(&counts);
        // An operator's controls of the member and of a bucket: set and back, each one
        // statement.
        let weight = |w| MemberControl::Weight(Weight::new(w).expect("weight"));
        store.control(&group, me, weight(2)).await.expect("control");
        store.control(&group, me, weight(1)).await.expect("control");
        let after_control = snapshot(&counts);
        let minute = QuarantineFor::new(std::time::Duration::from_secs(60)).ok();
        store
            .quarantine(&group, Bucket(3), minute)
            .await
            .expect("quarantine");
        store
            .quarantine(&group, Bucket(3), None)
            .await
            .expect("lift");
        let after_quarantine = snapshot(&counts);
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
        store.leave(&group, me, beat.session).await.expect("leave");
        let after_leave = snapshot(&counts);
        store.nodes().await.expect("nodes");
        let after_nodes = snapshot(&counts);
        let history = store.history(&group, won[0].bucket).await.expect("history");
        assert_eq!(history.len(), round + 1, "a tenure per round");
        let after_history = snapshot(&counts);
        if round == 0 {
            // Statements are cached: the first use on a connection prepares them (an uncached
            // statement would be re-parsed on every call and never reported here).
            assert!(
                after_leave.1 - before.1 >= 7,
                "the statements were not cached"
            );
        }
        if round == 2 {
            assert_eq!(after_beat.0 - before.0, 1, "heartbeat statements");
            assert_eq!(after_join.0 - after_beat.0, 1, "join statements");
            assert_eq!(after_control.0 - after_join.0, 2, "control statements");
            assert_eq!(
                after_quarantine.0 - after_control.0,
                2,
                "quarantine statements"
            );
            assert_eq!(after_claim.0 - after_quarantine.0, 1, "claim statements");
            assert_eq!(after_release.0 - after_claim.0, 1, "release statements");
            assert_eq!(after_leave.0 - after_release.0, 1, "leave statements");
            assert_eq!(after_nodes.0 - after_leave.0, 1, "nodes statements");
            assert_eq!(after_history.0 - after_nodes.0, 1, "history statements");
            assert_eq!(after_history.1 - before.1, 0, "statements prepared again");
        }
    }
}
