//! `lease-diesel`: the Postgres backend of the lease engine, on diesel + diesel-async
//! (tokio-postgres underneath: no libpq).
//!
//! [`PgLeaseStore`] implements the [`LeaseStore`](lease_core::LeaseStore) contract with one SQL statement per
//! operation: a steady-state heartbeat is one round trip that rewrites one row (the node's),
//! whatever the node holds and however many groups it is in. The database server's clock
//! decides expiry unless a client clock is given (tests). Wake-ups travel over `LISTEN/NOTIFY`.
//!
//! Behind a transaction-pooling connection pooler (PgBouncer in `pool_mode = transaction`),
//! turn on [`PgLeaseStoreBuilder::transaction_pooler`] (or `transaction_pooler=true` in the
//! URL): each operation becomes one self-contained transaction with no named statement kept
//! between transactions. Give a [`direct_url`](PgLeaseStoreBuilder::direct_url) to the server
//! itself for `LISTEN` (session state, which such a pooler does not keep) and for
//! [`PgLeaseStore::migrate`]; without one there are no wake-ups and workers re-plan at their
//! renew interval.
//!
//! The tables live in a schema of their own, always named `lease` (the name is fixed), created
//! by [`PgLeaseStore::migrate`] (or `leasectl migrate`), which applies the embedded
//! [`MIGRATIONS`] and records their versions in `lease.engine_migrations`, not in the
//! application's diesel migrations table. It refuses a `lease` schema it did not create.
//! [`PgLeaseStore::check_schema`] only reads: workers and monitoring need no right to create
//! anything, and work against a hot standby. [`privileges`] lists what each kind of role needs
//! (the GRANT statements `leasectl grant` prints), and checks what a role lacks.
//!
//! ```no_run
//! use lease_core::{
//!     GroupName, Incarnation, MemberMetadata, ShardCount, Takeover, Ttl, NodeId, WorkerStore,
//! };
//! use lease_diesel::PgLeaseStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgLeaseStore::connect("postgres://app@db/app")?;
//! store.migrate().await?;
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(64)?).await?;
//! let (me, process) = (NodeId::new(), Incarnation::new());
//! let (ttl, none) = (Ttl::from_secs(30)?, MemberMetadata::empty());
//! let session = store.heartbeat(me, process, ttl, &none, &[]).await?.session;
//! store.join(&group, me, session).await?;
//! let beat = store.heartbeat(me, process, ttl, &none, &[]).await?;
//! let claimable = beat.group(&group).map_or(0, |g| g.view.claimable);
//! let won = store.claim(&group, me, session, claimable.min(8), Takeover::Allowed).await?;
//! # Ok(()) }
//! ```
//!
//! An application fences its own writes in its own transaction with
//! `SELECT lease.is_current(group, bucket, worker, token)` (its role needs `USAGE` on schema
//! `lease` and `EXECUTE` on the function, no table privilege): while the transaction holds
//! the answer `true`, the bucket row is share-locked and no claim can take the bucket, even
//! past the lease's expiry. Keep such transactions short.

#![warn(missing_docs)]

mod checkout;
mod connect;
mod conninfo;
pub mod diagnose;
mod error;
mod feed;
mod loads;
mod migrate;
pub mod ops;
mod prepared;
pub mod privileges;
mod schema;
mod statements;
mod tls;

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use diesel::sql_types::Text;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AnsiTransactionManager, AsyncPgConnection, RunQueryDsl, TransactionManager};
use lease_core::{AdminStore, Load, MemberControl, QuarantineFor, QuarantineReason, Weight};
use lease_core::{
    BackendFailure, Bucket, ChangeFeed, Clock, FencingToken, GroupName, GroupSnapshot, GroupStamp,
    Heartbeat, Incarnation, Lease, MemberMetadata, NodeId, NodesSnapshot, Operation, ResizeOutcome,
    SessionBound, SessionId, ShardCount, StoreError, Takeover, Ttl, WorkerStore, store_precision,
};

pub use error::PgSetupError;
pub use migrate::{Compatibility, ExtraMigration, MIGRATIONS, SchemaStatus};
pub use tls::{TlsMode, TlsSummary, Verification};

use crate::checkout::{Canceller, Checkout};
use crate::connect::Connector;
use crate::error::{from_diesel, from_pool, from_pool_setup};
use crate::feed::{Notifier, Source};
use crate::prepared::Prepared;
use crate::statements as sql;

/// The pool type the store runs on.
pub type PgPool = Pool<AsyncPgConnection>;

/// How long an operation waits for the server's answer on a store built from a pool
/// ([`PgLeaseStore::from_pool`]); a store built from a URL uses its statement timeout plus its
/// connection timeout.
const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// How often the wake-up connection is checked, by default.
const DEFAULT_LISTEN_CHECK: Duration = Duration::from_secs(5);

/// Options of a [`PgLeaseStore`] built from a URL.
#[derive(Debug, Clone)]
pub struct PgLeaseStoreBuilder {
    url: String,
    max_connections: usize,
    timeout: Duration,
    statement_timeout: Duration,
    listen_check: Duration,
    transaction_pooler: Option<bool>,
    direct_url: Option<String>,
}

impl PgLeaseStoreBuilder {
    /// At most this many connections (default 16).
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// How long to wait for a connection, to connect, or to recycle one (default 5 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The longest any statement may run on the server before it is cancelled with an error
    /// (default 10 s): a lock held by someone else's transaction cannot hang an operation. Set
    /// on each connection when it is opened (behind a
    /// [`transaction_pooler`](Self::transaction_pooler): with `SET LOCAL` in each operation's
    /// transaction). A server that stops answering altogether (a
    /// frozen process, a cut network) is covered on the client: an operation that has no
    /// answer after the statement timeout plus [`timeout`](Self::timeout) fails, and its
    /// connection is closed, never reused. Connections also get TCP keepalives (probes after
    /// 5 s idle) and a 10 s `tcp_user_timeout` unless the URL sets its own.
    pub fn statement_timeout(mut self, timeout: Duration) -> Self {
        self.statement_timeout = timeout;
        self
    }

    /// How often the connection that listens for wake-ups is checked with a trivial query
    /// (default 5 s); without an answer within as long again it is replaced, and the workers
    /// are told that wake-ups may have been missed. A listening connection only reads, so
    /// nothing else would notice a server process that stopped answering.
    pub fn listen_check_interval(mut self, every: Duration) -> Self {
        self.listen_check = every.max(Duration::from_millis(1));
        self
    }

    /// The URL reaches the server through a connection pooler in transaction pooling mode
    /// (PgBouncer with `pool_mode = transaction`, such as Debian's PgBouncer 1.18, which does
    /// not support protocol-level prepared statements), which may hand each transaction a
    /// different server connection. Default: off, unless the URL says
    /// `transaction_pooler=true` (a key of the engine's, taken out before the URL is parsed;
    /// `transaction_pooler=false` there contradicting `true` here is refused).
    ///
    /// When on, nothing is kept on a connection between transactions: no statement is kept
    /// prepared, and every operation runs in a transaction of its own that sets its statement
    /// timeout with `SET LOCAL`, so each statement is prepared, run and closed on one server
    /// connection. A steady heartbeat then takes 4 round trips instead of 1 (`BEGIN` with the
    /// timeout, prepare, execute, `COMMIT`).
    ///
    /// `LISTEN` and [`PgLeaseStore::migrate`]'s advisory lock need a session: they use the
    /// [`direct_url`](Self::direct_url). Without one, the store offers no change feed
    /// ([`WorkerStore::changes`] answers `None`, with a warning logged once), so workers re-plan
    /// at their renew interval, and `migrate` is refused
    /// ([`PgSetupError::DirectConnectionRequired`]).
    pub fn transaction_pooler(mut self, on: bool) -> Self {
        self.transaction_pooler = Some(on);
        self
    }

    /// A URL that reaches the server itself, not through a pooler, for what needs a session:
    /// the connection that `LISTEN`s for wake-ups, and [`PgLeaseStore::migrate`] (its advisory
    /// lock). Used whether or not [`transaction_pooler`](Self::transaction_pooler) is on; it
    /// takes the same keys as the main URL (TLS included) except `transaction_pooler`.
    pub fn direct_url(mut self, url: impl Into<String>) -> Self {
        self.direct_url = Some(url.into());
        self
    }

    /// Build the store. No connection is made until the first operation.
    pub fn build(self) -> Result<PgLeaseStore, PgSetupError> {
        let (url, url_pooler) = conninfo::split_engine_keys(&self.url)?;
        let transaction_pooler = match (self.transaction_pooler, url_pooler) {
            (Some(given), Some(in_url)) if given != in_url => {
                return Err(PgSetupError::InvalidUrl {
                    message: format!(
                        "the URL says transaction_pooler={in_url}, the store's options \
                         transaction_pooler({given}): say it once"
                    ),
                });
            }
            (given, in_url) => given.or(in_url).unwrap_or(false),
        };
        let connector = connector_for(&url, self.statement_timeout, transaction_pooler)?;
        let direct = match &self.direct_url {
            None => None,
            Some(direct) => {
                let (direct, pooler) = conninfo::split_engine_keys(direct)?;
                if pooler == Some(true) {
                    return Err(PgSetupError::InvalidUrl {
                        message: "the direct URL is for reaching the server itself, not \
                                  through a pooler: it cannot say transaction_pooler=true"
                            .to_owned(),
                    });
                }
                Some(Arc::new(
                    connector_for(&direct, self.statement_timeout, false).map_err(|e| match e {
                        PgSetupError::InvalidUrl { message } => PgSetupError::InvalidUrl {
                            message: format!("the direct URL: {message}"),
                        },
                        other => other,
                    })?,
                ))
            }
        };
        let tls = connector.tls().clone();
        let canceller = Canceller {
            tls: connector.tls_connector(),
        };
        let mut config = ManagerConfig::default();
        // A broken connection is detected by its closed socket; the default recycling check
        // would add a `SELECT 1` round trip to every operation.
        config.recycling_method = RecyclingMethod::Fast;
        config.custom_setup = Box::new(move |_url| {
            let connector = connector.clone();
            Box::pin(async move { connector.connect().await })
        });
        let manager =
            AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(self.url, config);
        let pool = Pool::builder(manager)
            .max_size(self.max_connections)
            .wait_timeout(Some(self.timeout))
            .create_timeout(Some(self.timeout))
            .recycle_timeout(Some(self.timeout))
            .runtime(deadpool::Runtime::Tokio1)
            .build()
            .map_err(PgSetupError::Pool)?;
        let source = match &direct {
            Some(direct) => Some(Source::Direct {
                connector: direct.clone(),
                timeout: self.timeout,
            }),
            None if transaction_pooler => None,
            None => Some(Source::Pool(pool.clone())),
        };
        let mut store = PgLeaseStore::from_pool(pool);
        store.call_timeout = self.statement_timeout + self.timeout;
        store.notifier = Arc::new(Notifier::new(self.listen_check, source));
        store.tls = Some(tls);
        store.canceller = canceller;
        store.pooler = transaction_pooler.then(|| Arc::new(PoolerTx::new(self.statement_timeout)));
        store.direct = direct.map(|connector| (connector, self.timeout));
        Ok(store)
    }
}

/// How to open connections to `url` (its engine keys already taken out).
fn connector_for(
    url: &str,
    statement_timeout: Duration,
    transaction_pooler: bool,
) -> Result<Connector, PgSetupError> {
    let (url, tls) = tls::split(url)?;
    let parsed = url
        .parse::<tokio_postgres::Config>()
        .map_err(|e| PgSetupError::InvalidUrl {
            message: error::chain(&e),
        })?;
    Ok(Connector::new(
        parsed,
        &url,
        tls.build()?,
        statement_timeout,
        transaction_pooler,
    ))
}

/// How each operation runs behind a transaction pooler: in a transaction of its own that sets
/// its statement timeout (session settings would stay on whichever server connection the
/// pooler used, and be missing from the next).
#[derive(Debug)]
struct PoolerTx {
    /// Begins a read-write transaction.
    begin: String,
    /// Begins the snapshot's read-only, repeatable-read transaction.
    begin_snapshot: String,
    /// Whether the store said, once, that it has no change feed.
    warned: std::sync::atomic::AtomicBool,
}

impl PoolerTx {
    fn new(statement_timeout: Duration) -> Self {
        let set = format!(
            "SET LOCAL statement_timeout = {}",
            statement_timeout.as_millis().max(1)
        );
        Self {
            begin: format!("BEGIN; {set}"),
            begin_snapshot: format!("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; {set}"),
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

/// The Postgres [`LeaseStore`](lease_core::LeaseStore). Cheap to clone: clones share the pool and the change feed.
#[derive(Clone)]
pub struct PgLeaseStore {
    pool: PgPool,
    clock: Option<Arc<dyn Clock>>,
    notifier: Arc<Notifier>,
    /// How long an operation may wait for the server's answer.
    call_timeout: Duration,
    /// The TLS settings its connections use (unknown for a pool built elsewhere).
    tls: Option<TlsSummary>,
    /// How an abandoned operation's statement is cancelled on the server.
    canceller: Canceller,
    /// Set when the URL goes through a transaction pooler.
    pooler: Option<Arc<PoolerTx>>,
    /// Connections to the server itself (the direct URL), with their timeout, for `migrate`.
    direct: Option<(Arc<Connector>, Duration)>,
    /// The server timeline the last heartbeat ran on (0: none yet), to report a failover once.
    timeline: Arc<AtomicI64>,
}

impl std::fmt::Debug for PgLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeaseStore")
            .field("pool", &self.pool.status())
            .field("client_clock", &self.clock)
            .field("transaction_pooler", &self.pooler.is_some())
            .finish_non_exhaustive()
    }
}

impl PgLeaseStore {
    /// A builder for a store on the database at `url` (`postgres://user:pass@host:port/db`;
    /// `host=/path/to/socket/dir` for a unix socket).
    pub fn builder(url: impl Into<String>) -> PgLeaseStoreBuilder {
        PgLeaseStoreBuilder {
            url: url.into(),
            max_connections: 16,
            timeout: Duration::from_secs(5),
            statement_timeout: Duration::from_secs(10),
            listen_check: DEFAULT_LISTEN_CHECK,
            transaction_pooler: None,
            direct_url: None,
        }
    }

    /// A store on the database at `url` with default options.
    pub fn connect(url: impl Into<String>) -> Result<Self, PgSetupError> {
        Self::builder(url).build()
    }

    /// A store on an existing pool. Connections should not be checked by a query on recycle
    /// if one round trip per heartbeat matters to you (see [`RecyclingMethod::Fast`]). The
    /// pool is taken to reach the server directly, not through a transaction pooler (for
    /// that, build the store from a URL with [`PgLeaseStoreBuilder::transaction_pooler`]).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            notifier: Arc::new(Notifier::new(
                DEFAULT_LISTEN_CHECK,
                Some(Source::Pool(pool.clone())),
            )),
            pool,
            clock: None,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            tls: None,
            canceller: Canceller::default(),
            pooler: None,
            direct: None,
            timeline: Arc::new(AtomicI64::new(0)),
        }
    }

    /// Whether it reaches the server through a transaction pooler
    /// ([`PgLeaseStoreBuilder::transaction_pooler`]).
    pub fn transaction_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// Whether it can push wake-ups ([`WorkerStore::changes`] gives feeds): false behind a
    /// transaction pooler without a [`direct_url`](PgLeaseStoreBuilder::direct_url).
    pub fn pushes_wakeups(&self) -> bool {
        self.notifier.can_listen()
    }

    /// Decide expiry by `clock` instead of the database server's clock. For tests and
    /// differential runs; in production the server's clock is the only one that should decide.
    pub fn with_client_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The TLS settings its connections use, as the URL gave them (`None` for a store made
    /// [`from_pool`](Self::from_pool)). Whether a connection actually uses TLS under
    /// `sslmode=prefer` depends on the server: `leasectl doctor` asks it.
    pub fn tls(&self) -> Option<&TlsSummary> {
        self.tls.as_ref()
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Apply the embedded [`MIGRATIONS`] not applied yet, in version order; returns the
    /// versions applied (empty: the schema was up to date).
    ///
    /// On a database without schema `lease`, creates it (the role needs `CREATE` on the
    /// database) with its version table `lease.engine_migrations`. Refuses, writing nothing,
    /// a `lease` schema the engine did not create ([`PgSetupError::ForeignSchema`]), and one
    /// with a breaking migration newer than this build (newer additive ones are left as they
    /// are: this build works with them). Adopts a deployment made by an earlier release,
    /// which recorded its versions in the application's `__diesel_schema_migrations`: those
    /// rows move to `lease.engine_migrations`; nothing else of the application's is touched.
    /// Safe to run from many processes at once: an advisory lock, taken before anything is
    /// read, serializes them. Each migration runs in a transaction of its own, unless its
    /// `metadata.toml` says `run_in_transaction = false` (for `CREATE INDEX CONCURRENTLY`).
    ///
    /// The lock belongs to the session, so migrating needs a connection to the server itself:
    /// it runs on the [`direct_url`](PgLeaseStoreBuilder::direct_url) when one is given, and
    /// behind a [`transaction_pooler`](PgLeaseStoreBuilder::transaction_pooler) without one it
    /// is refused ([`PgSetupError::DirectConnectionRequired`]), connecting nowhere.
    pub async fn migrate(&self) -> Result<Vec<String>, PgSetupError> {
        self.migrate_with(&[]).await
    }

    /// Check that the database is reachable and its `lease` schema is the engine's, with
    /// every migration of this build and no breaking one it does not know (newer additive
    /// ones are accepted: see [`schema_status`](Self::schema_status)): a typed error says
    /// what is wrong and whether retrying can help ([`PgSetupError::is_transient`]).
    ///
    /// Read-only: it reads the catalogs and `lease.engine_migrations` and never creates
    /// anything, so it works on a hot standby, in a read-only transaction, and for a role with
    /// `USAGE` on schema `lease` and no other right. Its reads share one transaction, so it
    /// works through a transaction pooler too.
    pub async fn check_schema(&self) -> Result<(), PgSetupError> {
        self.schema_status().await.map(drop)
    }

    /// A connection of its own for a setup call, out of the pool for good.
    async fn setup_connection(&self) -> Result<AsyncPgConnection, PgSetupError> {
        let conn = self.pool.get().await.map_err(from_pool_setup)?;
        Ok(Object::take(conn))
    }

    /// Run `op` on a pooled connection, within the call timeout. The connection goes back to
    /// the pool only if `op` finished with an answer from the server: one whose operation was
    /// abandoned (timed out here, or its future dropped by a caller's own deadline) may have a
    /// statement in flight on a server process that stopped answering, and one that failed
    /// may be broken; both are closed, so the next operation gets a working connection.
    async fn with_conn<T>(
        &self,
        operation: Operation,
        op: impl AsyncFnOnce(&mut AsyncPgConnection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pooled = self.pool.get().await.map_err(|e| from_pool(operation, e))?;
        let mut checkout = Checkout::new(pooled, &self.canceller);
        let conn: &mut AsyncPgConnection = checkout.conn(operation)?;
        let run = async {
            match &self.pooler {
                None => op(conn).await,
                Some(pooler) => {
                    let begin = if operation == Operation::Snapshot {
                        &pooler.begin_snapshot
                    } else {
                        &pooler.begin
                    };
                    in_transaction(conn, operation, begin, op).await
                }
            }
        };
        // Timed out here, or dropped by the caller before this returns: `checkout` cancels
        // the statement on the server as it closes the connection (see `checkout`).
        let result = tokio::time::timeout(self.call_timeout, run)
            .await
            .map_err(|_| {
                StoreError::backend_detail(
                    operation,
                    BackendFailure::Timeout,
                    format!("no answer from the server within {:?}", self.call_timeout),
                )
            })?;
        checkout.finished();
        if !matches!(result, Err(StoreError::Backend { .. })) {
            checkout.keep();
        }
        result
    }

    /// Say once, in a warning, that the server runs on a timeline other than the one this
    /// store saw last (or one no heartbeat had run on): a failover happened; and, on a node's
    /// first heartbeat there, whether its session was kept (V4) or why it ended.
    fn saw_timeline(&self, node: NodeId, timeline: &ops::Timeline) {
        let previous = self.timeline.swap(timeline.id, Ordering::Relaxed);
        let crossed = timeline.crossed.as_deref();
        if previous != timeline.id && (previous != 0 || timeline.recorded) {
            tracing::warn!(
                timeline = timeline.id,
                previous = (previous != 0).then_some(previous),
                node = %node,
                session = crossed.unwrap_or("new"),
                "the database server runs on a new timeline: a standby was promoted (a \
                 failover) or a backup restored; a session that lost no write is kept, the \
                 others end; claims take nothing until one ttl after the timeline was first \
                 seen, so that every worker of the old primary has fenced itself, and tokens \
                 issued from now on exceed every earlier one"
            );
        } else if let Some(crossed) = crossed {
            // Another node of this process, on the timeline this store already reported.
            tracing::warn!(node = %node, timeline = timeline.id, session = crossed,
                "a node's session after the failover");
        }
    }

    /// The client clock's time, if one decides.
    fn at(&self) -> Option<DateTime<Utc>> {
        self.clock.as_ref().map(|c| store_precision(c.now()))
    }
}

/// Run `op` in a transaction begun with `begin` (`BEGIN` and the statement timeout, sent as
/// one round trip), committed unless `op` failed in the backend: such a connection is closed
/// rather than reused (see `with_conn`), which ends the transaction without a `ROLLBACK`.
/// Committed too after the contract's refusals (`NodeIdInUse`, `SessionExpired`...): their
/// statement ran and wrote what it writes, as it would have in autocommit mode.
async fn in_transaction<T>(
    conn: &mut AsyncPgConnection,
    operation: Operation,
    begin: &str,
    op: impl AsyncFnOnce(&mut AsyncPgConnection) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    AnsiTransactionManager::begin_transaction_sql(conn, begin)
        .await
        .map_err(|e| from_diesel(operation, e))?;
    let result = op(conn).await;
    if !matches!(result, Err(StoreError::Backend { .. })) {
        AnsiTransactionManager::commit_transaction(conn)
            .await
            .map_err(|e| from_diesel(operation, e))?;
    }
    result
}

#[async_trait]
impl WorkerStore for PgLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        let at = self.at();
        self.with_conn(Operation::EnsureGroup, async |c| {
            ops::ensure_group(c, at, group, shards).await
        })
        .await
    }

    async fn heartbeat_with_bound(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
        bound: Option<SessionBound>,
    ) -> Result<Heartbeat, StoreError> {
        let at = self.at();
        let (beat, timeline) = self
            .with_conn(Operation::Heartbeat, async |c| {
                ops::heartbeat_on_timeline(c, at, node, incarnation, ttl, metadata, seen, bound)
                    .await
            })
            .await?;
        self.saw_timeline(node, &timeline);
        Ok(beat)
    }

    async fn join(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<(), StoreError> {
        let at = self.at();
        self.with_conn(Operation::Join, async |c| {
            ops::join(c, at, group, node, session).await
        })
        .await
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        want: u32,
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Claim, async |c| {
            ops::claim(c, at, group, worker, session, want, takeover).await
        })
        .await
    }

    async fn claim_buckets(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
    ) -> Result<Vec<Lease>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::ClaimBuckets, async |c| {
            ops::claim_buckets(c, at, group, worker, session, buckets, takeover).await
        })
        .await
    }

    async fn publish_loads(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
    ) -> Result<u32, StoreError> {
        let at = self.at();
        self.with_conn(Operation::PublishLoads, async |c| {
            loads::publish_loads(c, at, group, worker, session, loads).await
        })
        .await
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Release, async |c| {
            ops::release(c, at, group, worker, session, buckets).await
        })
        .await
    }

    async fn leave(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
    ) -> Result<Vec<Bucket>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Leave, async |c| {
            ops::leave(c, at, group, node, session).await
        })
        .await
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: NodeId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let at = self.at();
        self.with_conn(Operation::IsCurrent, async |c| {
            ops::is_current(c, at, group, bucket, worker, token).await
        })
        .await
    }

    async fn hand_over(
        &self,
        node: NodeId,
        incarnation: lease_core::Incarnation,
        keep: Ttl,
    ) -> Result<Option<lease_core::Timestamp>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::HandOver, async |c| {
            ops::hand_over(c, at, node, incarnation, keep).await
        })
        .await
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        if !self.notifier.can_listen() {
            if let Some(pooler) = &self.pooler
                && !pooler
                    .warned
                    .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::warn!(
                    "through a transaction pooler without a direct URL there is no LISTEN: \
                     no wake-ups are pushed, workers re-plan at their renew interval (for \
                     prompt wake-ups give a direct URL to the server: \
                     PgLeaseStoreBuilder::direct_url, leasectl --direct-url)"
                );
            }
            return Ok(None);
        }
        let row: sql::ChannelRow = self
            .with_conn(Operation::Changes, async |c| {
                Prepared(diesel::sql_query(sql::CHANNEL).bind::<Text, _>(group.as_str()))
                    .get_result(c)
                    .await
                    .map_err(|e| from_diesel(Operation::Changes, e))
            })
            .await?;
        self.notifier.subscribe(row.channel).await
    }

    async fn set_weight(
        &self,
        group: &GroupName,
        node: NodeId,
        session: SessionId,
        weight: Weight,
    ) -> Result<(), StoreError> {
        let at = self.at();
        self.with_conn(Operation::SetWeight, async |c| {
            ops::set_weight(c, at, group, node, session, weight)
                .await
                .map(drop)
        })
        .await
    }
}

#[async_trait]
impl AdminStore for PgLeaseStore {
    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Snapshot, async |c| {
            ops::snapshot(c, at, group).await
        })
        .await
    }

    async fn nodes(&self) -> Result<NodesSnapshot, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Nodes, async |c| ops::nodes(c, at).await)
            .await
    }

    async fn resize(
        &self,
        group: &GroupName,
        from: ShardCount,
        to: ShardCount,
    ) -> Result<ResizeOutcome, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Resize, async |c| {
            ops::resize(c, at, group, from, to).await
        })
        .await
    }

    async fn control(
        &self,
        group: &GroupName,
        node: NodeId,
        control: MemberControl,
    ) -> Result<(), StoreError> {
        self.with_conn(Operation::Control, async |c| {
            ops::control(c, group, node, control).await.map(drop)
        })
        .await
    }

    async fn quarantine_with_reason(
        &self,
        group: &GroupName,
        bucket: Bucket,
        duration: Option<QuarantineFor>,
        reason: Option<QuarantineReason>,
    ) -> Result<(), StoreError> {
        let at = self.at();
        self.with_conn(Operation::Quarantine, async |c| {
            ops::quarantine(c, at, group, bucket, duration, reason.as_ref())
                .await
                .map(drop)
        })
        .await
    }

    async fn history(
        &self,
        group: &GroupName,
        bucket: Bucket,
    ) -> Result<Vec<lease_core::Tenure>, StoreError> {
        self.with_conn(Operation::History, async |c| {
            ops::history(c, group, bucket).await
        })
        .await
    }

    async fn evict(&self, group: &GroupName, node: NodeId) -> Result<Vec<Bucket>, StoreError> {
        let at = self.at();
        self.with_conn(Operation::Evict, async |c| {
            ops::evict(c, at, group, node).await
        })
        .await
    }
}
