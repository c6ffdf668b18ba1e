//! The Postgres store behind a real PgBouncer in transaction pooling mode (the system's
//! `pgbouncer`, Debian's 1.18: no protocol-level prepared statements), started by the test
//! harness in front of the test server. Databases are created directly; the stores connect
//! through PgBouncer with `transaction_pooler=true`, and `LISTEN` on a direct URL where a
//! test says so.
//!
//! - the whole conformance suite through the pooler (`conformance::*`);
//! - the failure the option fixes: the same store without it loses its prepared statement as
//!   soon as PgBouncer hands it another server connection;
//! - the statement timeout holds in every transaction, and leaves nothing on the server
//!   connections;
//! - `migrate` refuses without a direct URL, and works with one;
//! - many clients at once, every operation, through a pool of server connections they share;
//! - the round trips each operation takes, direct and through the pooler, counted by a proxy;
//! - workers sharing a group through the pooler: polling at the renew interval without a
//!   direct URL (saying so once, in the log and in a gauge), and woken at once with one.
//!
//! The tests fail, never skip, when `pgbouncer` is missing (the harness names the package) or
//! when `DATABASE_URL` names a server of someone else's (PgBouncer is put in front of the
//! test process's own server).

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease_core::{
    AdminStore, BackendFailure, Bucket, Chain, GroupName, MemberMetadata, NodeId, ShardCount,
    StoreError, SystemClock, Takeover, Timestamp, Ttl, WorkerStore,
};
use lease_diesel::{PgLeaseStore, PgSetupError};
use lease_testdb::{PgBouncer, PoolMode, TestDb};
use lease_testing::{OwnershipLog, RecordingHandler};
use lease_worker::{LeaseWorker, WorkerHandle};
use support::process;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The test process's own server, which PgBouncer is put in front of.
fn cluster() -> &'static lease_testdb::Cluster {
    lease_testdb::server().own().unwrap_or_else(|| {
        panic!(
            "the PgBouncer tests put PgBouncer in front of a server of their own: unset \
             DATABASE_URL to let them start one"
        )
    })
}

/// The PgBouncer of this test process, started on first use.
fn bouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| {
        PgBouncer::start(cluster(), PoolMode::Transaction, &["postgres"])
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A second PgBouncer with 3 server connections per database, which more clients must share.
fn narrow_bouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| {
        PgBouncer::start_with_pool_size(cluster(), PoolMode::Transaction, &["postgres"], 3)
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

/// A URL for `db` through PgBouncer, with `query`.
fn through_pooler(db: &TestDb, query: &str) -> String {
    bouncer().url("postgres", &db.name, query)
}

/// Where a store behind the pooler listens for wake-ups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listen {
    /// On the direct URL to the server.
    Direct,
    /// Nowhere: no direct URL.
    Nowhere,
}

/// A store on `db` through PgBouncer in transaction mode, with the option on (from the URL).
fn pooled(db: &TestDb, listen: Listen) -> PgLeaseStore {
    let mut builder =
        PgLeaseStore::builder(through_pooler(db, "transaction_pooler=true")).max_connections(12);
    if listen == Listen::Direct {
        builder = builder.direct_url(db.url.clone());
    }
    builder.build().expect("a store through PgBouncer")
}

/// The option comes from the builder or the URL and is said once; the direct URL is parsed
/// as the main one is, and cannot itself be a pooler's. Nothing connects here.
#[tokio::test]
async fn the_option_and_the_direct_url_are_checked_when_the_store_is_built() {
    let refused = |builder: lease_diesel::PgLeaseStoreBuilder| match builder.build() {
        Ok(store) => panic!("accepted: {store:?}"),
        Err(e) => e.to_string(),
    };
    let said_twice = refused(
        PgLeaseStore::builder("postgres://h/db?transaction_pooler=false").transaction_pooler(true),
    );
    assert!(said_twice.contains("say it once"), "{said_twice}");
    let pooled_direct = refused(
        PgLeaseStore::builder("postgres://h/db")
            .direct_url("postgres://h/db?transaction_pooler=true"),
    );
    assert!(pooled_direct.contains("direct URL"), "{pooled_direct}");
    let bad_direct = refused(
        PgLeaseStore::builder("postgres://h/db").direct_url("postgres://h/db?sslmode=strict"),
    );
    assert!(
        bad_direct.contains("the direct URL") && bad_direct.contains("sslmode"),
        "{bad_direct}"
    );

    let store = PgLeaseStore::builder("host=/tmp dbname=db transaction_pooler=1")
        .build()
        .expect("the key in a key-value string");
    assert!(store.transaction_pooler() && !store.pushes_wakeups());
    let store = PgLeaseStore::builder("postgres://h/db")
        .transaction_pooler(true)
        .direct_url("postgres://h:5432/db")
        .build()
        .expect("the option from the builder, with a direct URL");
    assert!(store.transaction_pooler() && store.pushes_wakeups());
    let store = PgLeaseStore::connect("postgres://h/db?transaction_pooler=false").expect("off");
    assert!(!store.transaction_pooler() && store.pushes_wakeups());
}

mod conformance {
    //! Every contract rule through the pooler; wake-ups on the direct URL.
    use super::{Listen, pooled};

    lease_testing::conformance_suite!(|clock: lease_core::ManualClock| async move {
        let db = lease_testdb::database().await;
        pooled(&db, Listen::Direct).with_client_clock(clock)
    });
}

fn group() -> GroupName {
    GroupName::new("orders").expect("name")
}

fn ttl() -> Ttl {
    Ttl::from_secs(30).expect("ttl")
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// Server connections to `db` (read on the server itself, from another database).
async fn server_connections(db: &TestDb) -> i64 {
    // Scoped: its blanket `first` and `load` would shadow others' elsewhere in this file.
    use diesel_async::RunQueryDsl;
    let admin = lease_testdb::server().url_for("postgres");
    let mut admin = AsyncPgConnection::establish(&admin).await.expect("admin");
    diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity \
         WHERE datname = $1 AND backend_type = 'client backend'",
    )
    .bind::<Text, _>(&db.name)
    .get_result::<Count>(&mut admin)
    .await
    .expect("pg_stat_activity")
    .n
}

/// Clients of PgBouncer that each hold a server connection in an open transaction.
struct Holders(Vec<AsyncPgConnection>);

impl Holders {
    /// Hold every server connection PgBouncer has to `db` now: each new client's `BEGIN` is
    /// given an idle one while there is one.
    async fn every_server_connection(db: &TestDb) -> Self {
        let mut held = Vec::new();
        for _ in 0..server_connections(db).await {
            let mut holder = AsyncPgConnection::establish(&through_pooler(db, ""))
                .await
                .expect("a client of PgBouncer");
            holder
                .batch_execute("BEGIN; SELECT 1")
                .await
                .expect("a transaction that holds its server connection");
            held.push(holder);
        }
        Self(held)
    }

    async fn release(self) {
        for mut holder in self.0 {
            holder.batch_execute("ROLLBACK").await.expect("rollback");
        }
    }
}

/// A heartbeat, then another after PgBouncer had to give the store a server connection other
/// than the ones it used so far: the second heartbeat's answer.
async fn heartbeat_on_another_server_connection(
    store: &PgLeaseStore,
    db: &TestDb,
) -> Result<support::Beat, StoreError> {
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(4).expect("n"))
        .await
        .expect("ensure_group");
    let w = NodeId::new();
    let meta = MemberMetadata::empty();
    support::beat_as(store, &g, w, process(w), ttl(), &meta)
        .await
        .expect("the first heartbeat");
    let holders = Holders::every_server_connection(db).await;
    let second = support::beat_as(store, &g, w, process(w), ttl(), &meta).await;
    holders.release().await;
    second
}

/// Without the option, the store's cached (named) prepared statement lives on the server
/// connection that prepared it; the next transaction PgBouncer runs on another one fails, and
/// the error names the option. With the option, the same steps work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_option_a_prepared_statement_goes_missing_and_with_it_nothing_does() {
    let db = lease_testdb::database().await;
    let plain = PgLeaseStore::builder(through_pooler(&db, ""))
        .max_connections(1)
        .build()
        .expect("a store through PgBouncer, without the option");
    assert!(!plain.transaction_pooler());
    let failed = heartbeat_on_another_server_connection(&plain, &db).await;
    let Err(e @ StoreError::Backend { failure, .. }) = &failed else {
        panic!("without the option the heartbeat should fail, got {failed:?}");
    };
    let message = Chain(e).to_string();
    eprintln!("without the option: {message}");
    assert_eq!(*failure, BackendFailure::Misconfigured, "{message}");
    assert!(!e.is_transient(), "{message}");
    assert!(
        message.contains("prepared statement") && message.contains("does not exist"),
        "{message}"
    );
    assert!(message.contains("transaction_pooler"), "{message}");

    let db = lease_testdb::database().await;
    let pooled = PgLeaseStore::builder(through_pooler(&db, ""))
        .transaction_pooler(true)
        .max_connections(1)
        .build()
        .expect("a store through PgBouncer, with the option");
    assert!(pooled.transaction_pooler());
    let beat = heartbeat_on_another_server_connection(&pooled, &db)
        .await
        .expect("with the option the heartbeat works on any server connection");
    assert!(!beat.new_session, "the session was extended");
}

#[derive(QueryableByName)]
struct Setting {
    #[diesel(sql_type = Text)]
    statement_timeout: String,
}

/// The statement timeout is set in each operation's own transaction (`SET LOCAL`): a
/// heartbeat waiting for a row lock is cancelled by the server after it, through the pooler;
/// and no session setting is left on the server connections for PgBouncer's other clients.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_statement_timeout_holds_in_each_transaction_and_stays_there() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(through_pooler(&db, "transaction_pooler=true"))
        .statement_timeout(Duration::from_millis(300))
        .max_connections(2)
        .build()
        .expect("store");
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(4).expect("n"))
        .await
        .expect("ensure_group");
    let w = NodeId::new();
    let meta = MemberMetadata::empty();
    support::beat_as(&store, &g, w, process(w), ttl(), &meta)
        .await
        .expect("heartbeat");

    let mut locker = AsyncPgConnection::establish(&db.url).await.expect("direct");
    locker
        .batch_execute("BEGIN; SELECT 1 FROM lease.nodes FOR UPDATE")
        .await
        .expect("lock the node row");
    let started = Instant::now();
    let blocked = support::beat_as(&store, &g, w, process(w), ttl(), &meta).await;
    let took = started.elapsed();
    locker.batch_execute("ROLLBACK").await.expect("rollback");
    let Err(e @ StoreError::Backend { failure, .. }) = &blocked else {
        panic!("a heartbeat behind a held row lock should time out, got {blocked:?}");
    };
    let message = Chain(e).to_string();
    assert_eq!(*failure, BackendFailure::Timeout, "{message}");
    assert!(
        message.contains("statement timeout"),
        "cancelled by the server's statement timeout, not the client's deadline: {message}"
    );
    assert!(took < Duration::from_secs(3), "took {took:?}: {message}");

    support::beat_as(&store, &g, w, process(w), ttl(), &meta)
        .await
        .expect("a heartbeat once the lock is gone");
    // Any server connection PgBouncer hands a plain client has the server's default.
    let mut plain = AsyncPgConnection::establish(&through_pooler(&db, ""))
        .await
        .expect("a plain client of PgBouncer");
    let shown: Setting = plain
        .transaction(async |c| {
            use diesel_async::RunQueryDsl;
            diesel::sql_query("SHOW statement_timeout")
                .get_result(c)
                .await
        })
        .await
        .expect("SHOW statement_timeout");
    assert_eq!(shown.statement_timeout, "0", "a session setting leaked");
}

/// `migrate` needs the session its advisory lock lives in: behind the pooler it is refused
/// without a direct URL, having done nothing, and runs on the direct URL when there is one;
/// the start-up check reads through the pooler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_behind_the_pooler_needs_a_direct_url() {
    let db = lease_testdb::empty_database().await;
    let refused = pooled(&db, Listen::Nowhere).migrate().await;
    assert!(
        matches!(refused, Err(PgSetupError::DirectConnectionRequired)),
        "{refused:?}"
    );
    let checked = pooled(&db, Listen::Nowhere).check_schema().await;
    assert!(
        matches!(checked, Err(PgSetupError::NotInstalled)),
        "the refused migration did something: {checked:?}"
    );
    let store = pooled(&db, Listen::Direct);
    let applied = store.migrate().await.expect("migrate on the direct URL");
    assert!(!applied.is_empty());
    pooled(&db, Listen::Nowhere)
        .check_schema()
        .await
        .expect("the start-up check through the pooler");
}

/// A metrics recorder of the test's own: gauges by name and labels, as `name{label="value"}`.
#[derive(Default)]
struct Gauges(Mutex<BTreeMap<String, Arc<AtomicU64>>>);

impl Gauges {
    fn get(&self, series: &str) -> Option<f64> {
        self.0
            .lock()
            .expect("gauges")
            .get(series)
            .map(|g| f64::from_bits(g.load(Ordering::SeqCst)))
    }
}

impl metrics::Recorder for Gauges {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }

    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }

    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={:?}", l.key(), l.value()))
            .collect();
        let series = format!("{}{{{}}}", key.name(), labels.join(","));
        let gauge = self
            .0
            .lock()
            .expect("gauges")
            .entry(series)
            .or_default()
            .clone();
        metrics::Gauge::from_arc(gauge)
    }

    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// What was logged, as text.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log")).into_owned()
    }
}

const SHARDS: u32 = 12;

/// Three workers sharing a group of 12 buckets through one store behind the pooler.
struct Workers {
    workers: BTreeMap<NodeId, WorkerHandle>,
    log: Arc<Mutex<OwnershipLog<Timestamp>>>,
}

impl Workers {
    async fn start(store: &PgLeaseStore, ttl: Duration, renew: Duration) -> Self {
        let log = Arc::new(Mutex::new(OwnershipLog::new()));
        let mut workers = BTreeMap::new();
        for _ in 0..3 {
            let config = LeaseWorker::builder(group(), ShardCount::new(SHARDS).expect("n"))
                .ttl(ttl)
                .renew_interval(renew)
                .build()
                .expect("config");
            let id = config.node_id();
            let handler = RecordingHandler::new(id, log.clone(), Arc::new(SystemClock));
            let handle = config.start(store.clone(), handler).await.expect("start");
            workers.insert(id, handle);
        }
        Self { workers, log }
    }

    fn owned(&self) -> Vec<usize> {
        self.workers
            .values()
            .map(|h| h.owned().borrow().len())
            .collect()
    }

    /// Poll until every bucket is owned and the shares differ by at most one; how long it
    /// took, or a panic after `limit`.
    async fn until_balanced(&self, limit: Duration) -> Duration {
        let start = Instant::now();
        loop {
            let owned = self.owned();
            let total: usize = owned.iter().sum();
            let (min, max) = (owned.iter().min(), owned.iter().max());
            if total == SHARDS as usize && matches!((min, max), (Some(a), Some(b)) if b - a <= 1) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < limit,
                "not balanced within {limit:?}: {owned:?}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Stop one worker gracefully; how long until the other two own everything.
    async fn handoff(&mut self, limit: Duration) -> Duration {
        let (&gone, _) = self.workers.iter().next().expect("a worker");
        let handle = self.workers.remove(&gone).expect("worker");
        let stopped = Instant::now();
        handle.shutdown().await.expect("a graceful stop");
        self.until_balanced(limit).await;
        assert_eq!(self.owned(), [6, 6]);
        stopped.elapsed()
    }

    async fn shutdown(self) {
        for (_, handle) in self.workers {
            handle.shutdown().await.expect("a graceful stop");
        }
        let summary = self
            .log
            .lock()
            .expect("log")
            .check()
            .unwrap_or_else(|e| panic!("ownership log: {e}"));
        eprintln!("ownership log: {summary:?}");
    }
}

/// Without a direct URL there is no `LISTEN`: the store offers no feed, says so once in the
/// log however many workers ask, and each worker says so in `lease_polling_fallback`; the
/// workers still balance, and take over a stopped worker's buckets at their next renew tick.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_behind_the_pooler_without_a_direct_url_poll_at_their_renew_interval() {
    let gauges = Gauges::default();
    // The workers register their metrics and open their feeds as they start, on this thread.
    let _recorder = metrics::set_default_local_recorder(&gauges);
    let logged = Logged::default();
    let writer = logged.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish(),
    );
    let db = lease_testdb::database().await;
    let store = pooled(&db, Listen::Nowhere);
    assert!(!store.pushes_wakeups());
    let (ttl, renew) = (Duration::from_secs(3), Duration::from_secs(1));
    let mut workers = Workers::start(&store, ttl, renew).await;
    let cold = workers.until_balanced(Duration::from_secs(20)).await;
    eprintln!("polling: 3 workers x {SHARDS} buckets balanced in {cold:?} (renew {renew:?})");
    assert_eq!(
        gauges.get(r#"lease_polling_fallback{group="orders"}"#),
        Some(1.0)
    );
    let warnings = logged.text();
    assert_eq!(
        warnings.matches("no LISTEN").count(),
        1,
        "said once for three workers: {warnings}"
    );

    let handoff = workers.handoff(Duration::from_secs(20)).await;
    eprintln!("polling: a graceful stop re-owned by the other two in {handoff:?}");
    // At their next renew tick, which is at most one interval away (and some slack for a
    // loaded machine).
    assert!(handoff < renew * 3, "handoff took {handoff:?}");
    workers.shutdown().await;
    assert_eq!(logged.text().matches("no LISTEN").count(), 1);
}

/// With a direct URL the workers behind the pooler are woken by `LISTEN` on it: with a renew
/// interval of 5 s, a stopped worker's buckets are re-owned well within one interval, which
/// only a wake-up explains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_behind_the_pooler_are_woken_through_the_direct_url() {
    let gauges = Gauges::default();
    let _recorder = metrics::set_default_local_recorder(&gauges);
    let db = lease_testdb::database().await;
    let store = pooled(&db, Listen::Direct);
    assert!(store.pushes_wakeups());
    let (ttl, renew) = (Duration::from_secs(16), Duration::from_secs(5));
    let mut workers = Workers::start(&store, ttl, renew).await;
    let cold = workers.until_balanced(Duration::from_secs(30)).await;
    eprintln!("woken: 3 workers x {SHARDS} buckets balanced in {cold:?} (renew {renew:?})");
    assert_eq!(
        gauges.get(r#"lease_polling_fallback{group="orders"}"#),
        Some(0.0)
    );
    let handoff = workers.handoff(Duration::from_secs(20)).await;
    eprintln!("woken: a graceful stop re-owned by the other two in {handoff:?}");
    assert!(
        handoff < Duration::from_secs(1),
        "handoff took {handoff:?}: no wake-up arrived"
    );
    workers.shutdown().await;
}

/// Eight clients at once, each a store of its own, run every operation a worker runs through
/// three server connections they share: every operation answers (none loses a statement to
/// another server connection, none leaves a setting behind for the next client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_clients_share_three_server_connections() {
    let db = lease_testdb::database().await;
    let g = group();
    let shards = ShardCount::new(64).expect("n");
    let url = narrow_bouncer().url("postgres", &db.name, "transaction_pooler=true");
    let clients: Vec<PgLeaseStore> = (0..8)
        .map(|_| {
            PgLeaseStore::builder(url.clone())
                .max_connections(2)
                .build()
                .expect("a store through PgBouncer")
        })
        .collect();
    clients[0].ensure_group(&g, shards).await.expect("ensure");
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|store| {
            let g = g.clone();
            tokio::spawn(async move {
                let w = NodeId::new();
                let meta = MemberMetadata::empty();
                for _ in 0..15 {
                    store.ensure_group(&g, shards).await.expect("ensure_group");
                    let beat = support::beat_as(&store, &g, w, process(w), ttl(), &meta)
                        .await
                        .expect("heartbeat");
                    let won = store
                        .claim(&g, w, beat.session, 2, Takeover::Allowed)
                        .await
                        .expect("claim");
                    if let Some(lease) = won.first() {
                        assert!(
                            store
                                .is_current(&g, lease.bucket, w, lease.token)
                                .await
                                .expect("is_current")
                        );
                    }
                    let mine: Vec<Bucket> = won.iter().map(|l| l.bucket).collect();
                    store
                        .release(&g, w, beat.session, &mine)
                        .await
                        .expect("release");
                    store.snapshot(&g).await.expect("snapshot");
                }
                store.evict(&g, w).await.expect("leave");
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a client");
    }
    let servers = server_connections(&db).await;
    eprintln!("8 clients shared {servers} server connections");
    assert!(servers <= 3, "{servers} server connections");
}

/// Frontend protocol messages a proxy forwarded, by type (`Q` simple query, `P` parse, `B`
/// bind, `E` execute, `D` describe, `C` close, `S` sync).
#[derive(Default)]
struct Sent(Mutex<BTreeMap<char, usize>>);

impl Sent {
    fn take(&self) -> BTreeMap<char, usize> {
        std::mem::take(&mut *self.0.lock().expect("sent"))
    }
}

/// Where a counting proxy forwards to.
enum Upstream {
    /// PgBouncer's port on 127.0.0.1.
    Tcp(u16),
    /// The server's unix socket.
    Unix(std::path::PathBuf),
}

/// A proxy on 127.0.0.1 that forwards every connection to `upstream`, counting the messages
/// clients send (before forwarding them: by the time an answer comes back, its request is
/// counted). Its port, and the counts.
async fn counting_proxy(upstream: Upstream) -> (u16, Arc<Sent>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("address").port();
    let sent = Arc::new(Sent::default());
    let counts = sent.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let counts = counts.clone();
            match &upstream {
                Upstream::Tcp(port) => {
                    let server = tokio::net::TcpStream::connect(("127.0.0.1", *port))
                        .await
                        .expect("upstream");
                    tokio::spawn(relay(client, server, counts));
                }
                Upstream::Unix(path) => {
                    let server = tokio::net::UnixStream::connect(path)
                        .await
                        .expect("upstream");
                    tokio::spawn(relay(client, server, counts));
                }
            }
        }
    });
    (port, sent)
}

async fn relay<S>(client: tokio::net::TcpStream, server: S, sent: Arc<Sent>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = tokio::io::split(server);
    tokio::spawn(async move { tokio::io::copy(&mut from_server, &mut to_client).await });
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    // The startup packet (and an SSL or GSS request before it) has no type byte.
    let mut untyped = true;
    loop {
        let n = match from_client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&chunk[..n]);
        loop {
            let header = if untyped { 4 } else { 5 };
            if pending.len() < header {
                break;
            }
            let length =
                u32::from_be_bytes(pending[header - 4..header].try_into().expect("four bytes"))
                    as usize;
            let total = header - 4 + length;
            if pending.len() < total {
                break;
            }
            if untyped {
                let code = u32::from_be_bytes(pending[4..8].try_into().expect("four bytes"));
                untyped = matches!(code, 80_877_103 | 80_877_104);
            } else {
                *sent
                    .0
                    .lock()
                    .expect("sent")
                    .entry(char::from(pending[0]))
                    .or_default() += 1;
            }
            pending.drain(..total);
        }
        if to_server.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}

/// Round trips an operation waits for: one per `Sync` or simple `Query`, except the `Sync`
/// that follows each `Close` (sent as a statement is dropped, ahead of the next request, and
/// answered before it without being waited for).
fn round_trips(sent: &BTreeMap<char, usize>) -> usize {
    let count = |t: char| sent.get(&t).copied().unwrap_or(0);
    count('S') + count('Q') - count('C')
}

/// The round trips of each operation a worker makes, on one warm connection, straight to the
/// server and through PgBouncer with the option. Printed as a table; a steady heartbeat is 1
/// direct and 4 through the pooler (`BEGIN` with `SET LOCAL`, prepare, execute, `COMMIT`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation_direct_and_through_the_pooler() {
    let db = lease_testdb::database().await;
    let cluster = lease_testdb::server()
        .own()
        .expect("a server of this process");
    let (direct_port, direct_sent) = counting_proxy(Upstream::Unix(cluster.socket_file())).await;
    let (pooler_port, pooler_sent) = counting_proxy(Upstream::Tcp(bouncer().port())).await;
    let direct = PgLeaseStore::builder(format!(
        "postgres://postgres@127.0.0.1:{direct_port}/{}?sslmode=disable",
        db.name
    ))
    .max_connections(1)
    .build()
    .expect("direct store");
    let pooled = PgLeaseStore::builder(format!(
        "postgres://postgres@127.0.0.1:{pooler_port}/{}?sslmode=disable&transaction_pooler=true",
        db.name
    ))
    .max_connections(1)
    .build()
    .expect("store through the pooler");
    let mut table = BTreeMap::new();
    for (mode, store, sent) in [
        ("direct", &direct, &direct_sent),
        ("pooler", &pooled, &pooler_sent),
    ] {
        let g = GroupName::new(format!("rt-{mode}")).expect("name");
        let shards = ShardCount::new(8).expect("n");
        let w = NodeId::new();
        let meta = MemberMetadata::empty();
        // Three times: the first two prepare what the direct store keeps prepared (the first
        // ensure_group creates the group, the second reads it).
        for round in 0..3 {
            let mut measure = |op: &'static str| {
                let counted = sent.take();
                if round == 2 {
                    table.insert((op, mode), (round_trips(&counted), counted));
                }
            };
            sent.take();
            store.ensure_group(&g, shards).await.expect("ensure");
            measure("ensure_group");
            // Leaving its only group (below) ended the node's session: each round starts one
            // and joins.
            let beat = store
                .heartbeat(w, process(w), ttl(), &meta, &[])
                .await
                .expect("heartbeat");
            measure("heartbeat");
            store.join(&g, w, beat.session).await.expect("join");
            measure("join");
            let won = store
                .claim(&g, w, beat.session, 2, Takeover::Allowed)
                .await
                .expect("claim");
            measure("claim");
            store
                .is_current(&g, won[0].bucket, w, won[0].token)
                .await
                .expect("is_current");
            measure("is_current");
            store
                .release(&g, w, beat.session, &[won[0].bucket])
                .await
                .expect("release");
            measure("release");
            store.snapshot(&g).await.expect("snapshot");
            measure("snapshot");
            store.leave(&g, w, beat.session).await.expect("leave");
            measure("leave");
        }
    }
    eprintln!("round trips on a warm connection (messages sent):");
    for ((op, mode), (trips, sent)) in &table {
        eprintln!("  {op:<12} {mode:<6} {trips:>2}  {sent:?}");
    }
    assert_eq!(table[&("heartbeat", "direct")].0, 1);
    assert_eq!(table[&("heartbeat", "pooler")].0, 4);
    for ((op, mode), (trips, sent)) in &table {
        if *mode == "pooler" {
            assert_eq!(
                sent.get(&'P'),
                sent.get(&'C'),
                "{op}: every statement prepared through the pooler is closed in its transaction"
            );
            assert!(*trips >= 4, "{op}: {trips}");
        }
    }
}
