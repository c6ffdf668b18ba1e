//! `lease-diesel`: the Postgres backend of the lease engine, on diesel + diesel-async
//! (tokio-postgres underneath: no libpq).
//!
//! [`PgLeaseStore`] implements the [`LeaseStore`] contract with one SQL statement per
//! operation: a steady-state heartbeat is one round trip that rewrites one row, whatever the
//! worker holds. The database server's clock decides expiry unless a client clock is given
//! (tests). Wake-ups travel over `LISTEN/NOTIFY`. The schema lives in its own `lease` schema,
//! created by the embedded migrations ([`PgLeaseStore::migrate`] or `leasectl migrate`).
//!
//! ```no_run
//! use lease_core::{GroupName, LeaseStore, MemberMetadata, ShardCount, Ttl, WorkerId};
//! use lease_diesel::PgLeaseStore;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = PgLeaseStore::connect("postgres://app@db/app")?;
//! store.migrate().await?;
//! let group = GroupName::new("orders")?;
//! store.ensure_group(&group, ShardCount::new(64)?).await?;
//! let me = WorkerId::new();
//! let beat = store.heartbeat(&group, me, Ttl::from_secs(30)?, &MemberMetadata::empty()).await?;
//! let won = store.claim(&group, me, beat.view.claimable.min(8)).await?;
//! # Ok(()) }
//! ```
//!
//! An application fences its own writes in its own transaction with
//! `SELECT lease.is_current(group, bucket, worker, token)`: while the transaction holds the
//! answer `true`, the bucket row is share-locked and no claim can take the bucket.

#![warn(missing_docs)]

mod error;
mod feed;
mod prepared;
mod schema;
mod statements;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use diesel::OptionalExtension;
use diesel::pg::data_types::PgInterval;
use diesel::prelude::*;
use diesel::sql_types::{
    Array, BigInt, Integer, Interval, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};
use lease_core::{
    Bucket, BucketInfo, BucketState, ChangeFeed, Clock, FencingToken, GroupName, GroupSnapshot,
    GroupView, Heartbeat, Lease, LeaseStore, MemberInfo, MemberLoad, MemberMetadata, SessionId,
    ShardCount, StoreError, Ttl, WorkerId, store_precision,
};
use uuid::Uuid;

pub use error::PgSetupError;

use crate::error::{corrupt, from_diesel, from_pool};
use crate::feed::Notifier;
use crate::prepared::Prepared;
use crate::statements as sql;

/// The migrations of the `lease` schema, embedded at build time from `migrations/`.
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../migrations");

/// The pool type the store runs on.
pub type PgPool = Pool<AsyncPgConnection>;

/// Serializes concurrent `migrate` calls from many processes (an arbitrary, fixed key).
const MIGRATION_LOCK_KEY: i64 = 0x6c65_6173_655f_6d69; // "lease_mi"

/// Options of a [`PgLeaseStore`] built from a URL.
#[derive(Debug, Clone)]
pub struct PgLeaseStoreBuilder {
    url: String,
    max_connections: usize,
    timeout: Duration,
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

    /// Build the store. No connection is made until the first operation.
    pub fn build(self) -> Result<PgLeaseStore, PgSetupError> {
        let mut config = ManagerConfig::default();
        // A broken connection is detected by its closed socket; the default recycling check
        // would add a `SELECT 1` round trip to every operation.
        config.recycling_method = RecyclingMethod::Fast;
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
        Ok(PgLeaseStore::from_pool(pool))
    }
}

/// The Postgres [`LeaseStore`]. Cheap to clone: clones share the pool and the change feed.
#[derive(Clone)]
pub struct PgLeaseStore {
    pool: PgPool,
    clock: Option<Arc<dyn Clock>>,
    notifier: Arc<Notifier>,
}

impl std::fmt::Debug for PgLeaseStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLeaseStore")
            .field("pool", &self.pool.status())
            .field("client_clock", &self.clock)
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
        }
    }

    /// A store on the database at `url` with default options.
    pub fn connect(url: impl Into<String>) -> Result<Self, PgSetupError> {
        Self::builder(url).build()
    }

    /// A store on an existing pool. Connections should not be checked by a query on recycle
    /// if one round trip per heartbeat matters to you (see [`RecyclingMethod::Fast`]).
    pub fn from_pool(pool: PgPool) -> Self {
        Self {
            pool,
            clock: None,
            notifier: Arc::new(Notifier::default()),
        }
    }

    /// Decide expiry by `clock` instead of the database server's clock. For tests and
    /// differential runs; in production the server's clock is the only one that should decide.
    pub fn with_client_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// The connection pool.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Apply the embedded migrations that are not applied yet; returns the versions applied.
    /// Safe to run from many processes at once (an advisory lock serializes them).
    pub async fn migrate(&self) -> Result<Vec<String>, PgSetupError> {
        let conn = self.pool.get().await.map_err(|e| PgSetupError::Connect {
            message: e.to_string(),
            source: Some(Box::new(e)),
        })?;
        let conn = Object::take(conn);
        // diesel's migration harness is synchronous: run it on a blocking thread, driving the
        // async connection from there.
        tokio::task::spawn_blocking(move || {
            let mut conn = diesel_async::async_connection_wrapper::AsyncConnectionWrapper::<
                AsyncPgConnection,
            >::from(conn);
            let lock = format!("SELECT pg_advisory_lock({MIGRATION_LOCK_KEY})");
            diesel::connection::SimpleConnection::batch_execute(&mut conn, &lock).map_err(|e| {
                PgSetupError::Migration {
                    message: format!("taking the migration lock: {e}"),
                }
            })?;
            let applied = conn
                .run_pending_migrations(MIGRATIONS)
                .map(|versions| versions.iter().map(ToString::to_string).collect())
                .map_err(|e| PgSetupError::Migration {
                    message: e.to_string(),
                });
            let unlock = format!("SELECT pg_advisory_unlock({MIGRATION_LOCK_KEY})");
            // The lock also ends with the connection, which is dropped right after.
            diesel::connection::SimpleConnection::batch_execute(&mut conn, &unlock).ok();
            applied
        })
        .await
        .map_err(|e| PgSetupError::Migration {
            message: format!("the migration task failed: {e}"),
        })?
    }

    /// Check that the database is reachable and has every migration this build needs.
    pub async fn check_schema(&self) -> Result<(), PgSetupError> {
        let conn = self.pool.get().await.map_err(|e| PgSetupError::Connect {
            message: e.to_string(),
            source: Some(Box::new(e)),
        })?;
        let conn = Object::take(conn);
        let missing = tokio::task::spawn_blocking(move || {
            let mut conn = diesel_async::async_connection_wrapper::AsyncConnectionWrapper::<
                AsyncPgConnection,
            >::from(conn);
            conn.pending_migrations(MIGRATIONS)
                .map(|pending| {
                    pending
                        .iter()
                        .map(|m| m.name().version().to_string())
                        .collect::<Vec<_>>()
                })
                .map_err(|e| PgSetupError::Migration {
                    message: e.to_string(),
                })
        })
        .await
        .map_err(|e| PgSetupError::Migration {
            message: format!("the schema check failed: {e}"),
        })??;
        if missing.is_empty() {
            Ok(())
        } else {
            Err(PgSetupError::SchemaMissing { missing })
        }
    }

    async fn conn(&self) -> Result<Object<AsyncPgConnection>, StoreError> {
        self.pool.get().await.map_err(from_pool)
    }

    /// The client clock's time, if one decides.
    fn at(&self) -> Option<DateTime<Utc>> {
        self.clock.as_ref().map(|c| store_precision(c.now()))
    }
}

fn shard_count(group: &GroupName, n: i32) -> Result<ShardCount, StoreError> {
    ShardCount::try_from_i64(i64::from(n))
        .map_err(|_| corrupt(format!("group {group:?} has shard count {n}")))
}

fn bucket(n: i32) -> Result<Bucket, StoreError> {
    u32::try_from(n)
        .map(Bucket)
        .map_err(|_| corrupt(format!("bucket number {n}")))
}

fn count(n: i32) -> Result<u32, StoreError> {
    u32::try_from(n).map_err(|_| corrupt(format!("owned count {n}")))
}

fn not_found(group: &GroupName) -> StoreError {
    StoreError::GroupNotFound {
        group: group.clone(),
    }
}

fn leases(
    owner: WorkerId,
    buckets: &[i32],
    tokens: &[i64],
    expires_at: DateTime<Utc>,
) -> Result<Vec<Lease>, StoreError> {
    if buckets.len() != tokens.len() {
        return Err(corrupt("bucket and token lists differ in length".into()));
    }
    buckets
        .iter()
        .zip(tokens)
        .map(|(&b, &t)| {
            Ok(Lease {
                bucket: bucket(b)?,
                owner,
                token: FencingToken(t),
                expires_at,
            })
        })
        .collect()
}

fn bucket_list(buckets: &[i32]) -> Result<Vec<Bucket>, StoreError> {
    buckets.iter().map(|&b| bucket(b)).collect()
}

#[async_trait]
impl LeaseStore for PgLeaseStore {
    async fn ensure_group(&self, group: &GroupName, shards: ShardCount) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        let created: Option<sql::ShardCountRow> = Prepared(
            diesel::sql_query(sql::ENSURE_GROUP)
                .bind::<Text, _>(group.as_str())
                .bind::<Integer, _>(shards.get() as i32)
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .optional()
        .map_err(|e| from_diesel("ensure_group", e))?;
        if created.is_some() {
            return Ok(());
        }
        // The name was taken (perhaps by a concurrent call, now committed): compare counts in
        // a statement with a fresh snapshot.
        let found: sql::ShardCountRow =
            Prepared(diesel::sql_query(sql::GROUP_SHARD_COUNT).bind::<Text, _>(group.as_str()))
                .get_result(&mut conn)
                .await
                .map_err(|e| from_diesel("ensure_group", e))?;
        let found = shard_count(group, found.shard_count)?;
        if found == shards {
            Ok(())
        } else {
            Err(StoreError::ShardCountMismatch {
                group: group.clone(),
                configured: shards,
                found,
            })
        }
    }

    async fn heartbeat(
        &self,
        group: &GroupName,
        worker: WorkerId,
        ttl: Ttl,
        metadata: &MemberMetadata,
    ) -> Result<Heartbeat, StoreError> {
        let mut conn = self.conn().await?;
        let row: Option<sql::HeartbeatRow> = Prepared(
            diesel::sql_query(sql::HEARTBEAT)
                .bind::<Text, _>(group.as_str())
                .bind::<SqlUuid, _>(worker.as_uuid())
                .bind::<SqlUuid, _>(SessionId::new().as_uuid())
                .bind::<Interval, _>(PgInterval::from_microseconds(ttl.as_micros()))
                .bind::<Text, _>(metadata.as_str())
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .optional()
        .map_err(|e| from_diesel("heartbeat", e))?;
        let row = row.ok_or_else(|| not_found(group))?;
        let shard_count = shard_count(group, row.shard_count)?;
        let owned = leases(worker, &row.buckets, &row.tokens, row.expires_at)?;
        if row.other_workers.len() != row.other_owned.len() {
            return Err(corrupt("member and load lists differ in length".into()));
        }
        let mut members = vec![MemberLoad {
            worker,
            owned: owned.len() as u32,
        }];
        for (&w, &n) in row.other_workers.iter().zip(&row.other_owned) {
            members.push(MemberLoad {
                worker: WorkerId::from_uuid(w),
                owned: count(n)?,
            });
        }
        members.sort_by_key(|m| m.worker);
        let held: u32 = members.iter().map(|m| m.owned).sum();
        Ok(Heartbeat {
            session: SessionId::from_uuid(row.session_id),
            new_session: row.started,
            observed_at: row.heartbeat_at,
            expires_at: row.expires_at,
            view: GroupView {
                shard_count,
                members,
                claimable: shard_count.get().saturating_sub(held),
            },
            owned,
        })
    }

    async fn claim(
        &self,
        group: &GroupName,
        worker: WorkerId,
        want: u32,
    ) -> Result<Vec<Lease>, StoreError> {
        let mut conn = self.conn().await?;
        let row: Option<sql::ClaimRow> = Prepared(
            diesel::sql_query(sql::CLAIM)
                .bind::<Text, _>(group.as_str())
                .bind::<SqlUuid, _>(worker.as_uuid())
                .bind::<BigInt, _>(i64::from(want))
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .optional()
        .map_err(|e| from_diesel("claim", e))?;
        let row = row.ok_or_else(|| not_found(group))?;
        let (Some(_session), Some(expires_at)) = (row.session_id, row.expires_at) else {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker,
            });
        };
        leases(worker, &row.buckets, &row.tokens, expires_at)
    }

    async fn release(
        &self,
        group: &GroupName,
        worker: WorkerId,
        buckets: &[Bucket],
    ) -> Result<Vec<Bucket>, StoreError> {
        let mut conn = self.conn().await?;
        let requested: Vec<i64> = buckets.iter().map(|b| i64::from(b.0)).collect();
        let row: Option<sql::ReleasedRow> = Prepared(
            diesel::sql_query(sql::RELEASE)
                .bind::<Text, _>(group.as_str())
                .bind::<SqlUuid, _>(worker.as_uuid())
                .bind::<Array<BigInt>, _>(&requested)
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .optional()
        .map_err(|e| from_diesel("release", e))?;
        let row = row.ok_or_else(|| not_found(group))?;
        let shards = shard_count(group, row.shard_count)?;
        if let Some(&bucket) = buckets.iter().find(|&&b| !shards.contains(b)) {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: shards,
            });
        }
        bucket_list(&row.buckets)
    }

    async fn leave(&self, group: &GroupName, worker: WorkerId) -> Result<Vec<Bucket>, StoreError> {
        let mut conn = self.conn().await?;
        let row: Option<sql::ReleasedRow> = Prepared(
            diesel::sql_query(sql::LEAVE)
                .bind::<Text, _>(group.as_str())
                .bind::<SqlUuid, _>(worker.as_uuid())
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .optional()
        .map_err(|e| from_diesel("leave", e))?;
        let row = row.ok_or_else(|| not_found(group))?;
        bucket_list(&row.buckets)
    }

    async fn snapshot(&self, group: &GroupName) -> Result<GroupSnapshot, StoreError> {
        use crate::schema::{groups, members, shards};
        type MemberRow = (
            Uuid,
            Uuid,
            DateTime<Utc>,
            DateTime<Utc>,
            DateTime<Utc>,
            i32,
            String,
        );
        type ShardRow = (i32, Option<Uuid>, Option<Uuid>, i64);

        let mut conn = self.conn().await?;
        let at = self.at();
        let name = group.as_str().to_owned();
        // One consistent view: the three reads share a repeatable-read snapshot.
        let (now, stored_count, member_rows, shard_rows) = conn
            .build_transaction()
            .repeatable_read()
            .read_only()
            .run(async |conn| {
                let now: sql::NowRow =
                    Prepared(diesel::sql_query(sql::NOW).bind::<Nullable<Timestamptz>, _>(at))
                        .get_result(conn)
                        .await?;
                let count: Option<i32> = groups::table
                    .find(&name)
                    .select(groups::shard_count)
                    .first(conn)
                    .await
                    .optional()?;
                let member_rows: Vec<MemberRow> = members::table
                    .filter(members::group_name.eq(&name))
                    .order(members::worker_id)
                    .select((
                        members::worker_id,
                        members::session_id,
                        members::joined_at,
                        members::heartbeat_at,
                        members::expires_at,
                        members::owned,
                        members::metadata,
                    ))
                    .load(conn)
                    .await?;
                let shard_rows: Vec<ShardRow> = shards::table
                    .filter(shards::group_name.eq(&name))
                    .order(shards::bucket)
                    .select((
                        shards::bucket,
                        shards::owner_worker,
                        shards::owner_session,
                        shards::token,
                    ))
                    .load(conn)
                    .await?;
                Ok::<_, diesel::result::Error>((now.now, count, member_rows, shard_rows))
            })
            .await
            .map_err(|e| from_diesel("snapshot", e))?;
        let shard_count = shard_count(group, stored_count.ok_or_else(|| not_found(group))?)?;
        let mut sessions: HashMap<(Uuid, Uuid), DateTime<Utc>> = HashMap::new();
        let mut members = Vec::with_capacity(member_rows.len());
        for (worker, session, joined_at, heartbeat_at, expires_at, owned, metadata) in member_rows {
            sessions.insert((worker, session), expires_at);
            let live = now < expires_at;
            members.push(MemberInfo {
                worker: WorkerId::from_uuid(worker),
                session: SessionId::from_uuid(session),
                joined_at,
                heartbeat_at,
                expires_at,
                live,
                owned: if live { count(owned)? } else { 0 },
                metadata: MemberMetadata::new(metadata)
                    .map_err(|e| corrupt(format!("member metadata: {e}")))?,
            });
        }
        let buckets = shard_rows
            .into_iter()
            .map(|(b, owner, session, token)| {
                let expires_at = owner
                    .zip(session)
                    .and_then(|key| sessions.get(&key).copied());
                let state = match (owner, expires_at) {
                    (None, _) => BucketState::Unowned,
                    (Some(_), Some(e)) if now < e => BucketState::Live,
                    (Some(_), _) => BucketState::Expired,
                };
                Ok(BucketInfo {
                    bucket: bucket(b)?,
                    owner: owner.map(WorkerId::from_uuid),
                    session: session.map(SessionId::from_uuid),
                    token: FencingToken(token),
                    expires_at,
                    state,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        Ok(GroupSnapshot {
            group: group.clone(),
            shard_count,
            observed_at: now,
            members,
            buckets,
        })
    }

    async fn is_current(
        &self,
        group: &GroupName,
        bucket: Bucket,
        worker: WorkerId,
        token: FencingToken,
    ) -> Result<bool, StoreError> {
        let mut conn = self.conn().await?;
        let row: sql::IsCurrentRow = Prepared(
            diesel::sql_query(sql::IS_CURRENT)
                .bind::<Text, _>(group.as_str())
                .bind::<BigInt, _>(i64::from(bucket.0))
                .bind::<SqlUuid, _>(worker.as_uuid())
                .bind::<BigInt, _>(token.0)
                .bind::<Nullable<Timestamptz>, _>(self.at()),
        )
        .get_result(&mut conn)
        .await
        .map_err(|e| from_diesel("is_current", e))?;
        Ok(row.current)
    }

    async fn changes(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        let mut conn = self.conn().await?;
        let row: sql::ChannelRow =
            Prepared(diesel::sql_query(sql::CHANNEL).bind::<Text, _>(group.as_str()))
                .get_result(&mut conn)
                .await
                .map_err(|e| from_diesel("changes", e))?;
        drop(conn);
        self.notifier
            .subscribe(&self.pool, row.channel)
            .await
            .map(Some)
    }
}
