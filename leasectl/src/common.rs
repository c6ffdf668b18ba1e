//! What the subcommands share: where the store is (a Postgres database, or with the `etcd`
//! feature an etcd cluster) and how to reach it (one retry loop), how a failure ends the
//! command (a [`Failure`]), and how store errors read on the command line.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use clap::Args;
use lease::postgres::{PgLeaseStore, PgSetupError};
use lease::store::{Chain, LeaseStore, Timestamp};
use lease::{GroupName, StoreError};
#[cfg(feature = "etcd")]
use lease_etcd::{EtcdLeaseStore, EtcdUrl};

use crate::output::Failure;

/// A store the commands that only use the lease contract work on, whatever its backend.
pub type Store = Arc<dyn LeaseStore>;

/// What an `etcd://` URL gets from a leasectl built without the `etcd` feature.
#[cfg(not(feature = "etcd"))]
pub const NO_ETCD: &str = "this leasectl was built without etcd support: rebuild with \
     --features etcd (cargo build -p leasectl --features etcd; needs protoc, Debian package \
     protobuf-compiler)";

/// What `--database-url` names, not connected yet.
#[derive(Debug)]
pub enum Backend {
    /// A Postgres database.
    Postgres(PgLeaseStore),
    /// An etcd cluster and the key prefix the store lives under.
    #[cfg(feature = "etcd")]
    Etcd(EtcdUrl),
}

/// Whether `url` is meant for etcd (`etcd://`, or `etcds://` which the etcd store refuses
/// with its own message).
fn is_etcd(url: &str) -> bool {
    let url = url.trim_start().to_ascii_lowercase();
    url.starts_with("etcd://") || url.starts_with("etcds://")
}

/// Where the store is, and how it is reached.
#[derive(Args, Debug, Clone)]
pub struct DbArgs {
    /// Postgres connection URL, e.g. postgres://user:pass@host:5432/db or
    /// "host=/var/run/postgresql user=app dbname=app". `transaction_pooler=true` in it is
    /// --transaction-pooler. Or an etcd URL, etcd://host:2379,host:2380/prefix (members, and
    /// the key prefix the store lives under, default `lease`), if this leasectl was built with
    /// --features etcd.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The URL goes through a connection pooler in transaction pooling mode (PgBouncer with
    /// pool_mode = transaction): no prepared statement is kept between transactions and every
    /// operation is a transaction of its own. Give --direct-url too for prompt wake-ups and
    /// for migrate.
    #[arg(long, env = "LEASE_TRANSACTION_POOLER")]
    transaction_pooler: bool,
    /// A URL to the Postgres server itself, not through a pooler, for what needs a session:
    /// LISTEN for wake-ups, and migrate's lock. Behind a transaction pooler without it, workers
    /// re-plan at their renew interval (a warning says so once) and migrate is refused.
    #[arg(long, env = "LEASE_DIRECT_URL", hide_env_values = true)]
    direct_url: Option<String>,
}

impl DbArgs {
    fn url(&self) -> Result<&str, Failure> {
        self.database_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| {
                Failure::Usage(
                    "--database-url is required (or set DATABASE_URL), e.g. \
                     postgres://user:pass@localhost:5432/app"
                        .into(),
                )
            })
    }

    fn direct_url(&self) -> Option<&str> {
        self.direct_url.as_deref().filter(|u| !u.trim().is_empty())
    }

    /// What the URL names: a Postgres store (nothing connected yet) or an etcd cluster. An
    /// etcd URL is a usage error without the `etcd` feature, and with Postgres-only flags.
    pub fn backend(&self) -> Result<Backend, Failure> {
        let url = self.url()?;
        if !is_etcd(url) {
            return self.postgres().map(Backend::Postgres);
        }
        #[cfg(not(feature = "etcd"))]
        return Err(Failure::Usage(format!("--database-url: {NO_ETCD}")));
        #[cfg(feature = "etcd")]
        {
            if self.transaction_pooler || self.direct_url().is_some() {
                return Err(Failure::Usage(
                    "--transaction-pooler and --direct-url (LEASE_TRANSACTION_POOLER, \
                     LEASE_DIRECT_URL) are for Postgres; the --database-url is an etcd URL"
                        .into(),
                ));
            }
            EtcdUrl::parse(url.trim())
                .map(Backend::Etcd)
                .map_err(|e| Failure::Usage(format!("--database-url: {e}")))
        }
    }

    /// A Postgres store on this database for `command`, which works on Postgres only;
    /// nothing is connected yet.
    pub fn postgres_only(&self, command: &str) -> Result<PgLeaseStore, Failure> {
        if self.url().is_ok_and(is_etcd) {
            return Err(Failure::Usage(format!(
                "--database-url: {command} works on Postgres only, not on etcd (which has no \
                 roles nor privileges to grant)"
            )));
        }
        self.postgres()
    }

    /// A Postgres store on this database; nothing is connected yet.
    fn postgres(&self) -> Result<PgLeaseStore, Failure> {
        let mut builder = PgLeaseStore::builder(self.url()?)
            .max_connections(8)
            .timeout(Duration::from_secs(3));
        if self.transaction_pooler {
            builder = builder.transaction_pooler(true);
        }
        if let Some(direct) = self.direct_url() {
            // Alone first, so that what is wrong with it is said of --direct-url.
            PgLeaseStore::builder(direct)
                .build()
                .map_err(|e| Failure::Usage(format!("--direct-url: {e}")))?;
            builder = builder.direct_url(direct);
        }
        builder
            .build()
            .map_err(|e| Failure::Usage(format!("--database-url: {e}")))
    }

    /// `store` (of [`backend`](Self::backend)) to migrate with: behind a transaction pooler,
    /// only with a direct URL (the migration lock belongs to the session).
    pub fn store_to_migrate(&self, store: PgLeaseStore) -> Result<PgLeaseStore, Failure> {
        if store.transaction_pooler() && self.direct_url().is_none() {
            return Err(Failure::Usage(
                "migrating through a transaction pooler needs --direct-url (or \
                 LEASE_DIRECT_URL), a URL to the server itself: the migration lock belongs to \
                 the session, which the pooler does not keep"
                    .into(),
            ));
        }
        Ok(store)
    }

    /// A store on what the URL names, ready for the lease contract's operations: on
    /// Postgres, see [`open_postgres`](Self::open_postgres); on etcd, a client on its members
    /// (which connects at the first operation).
    pub async fn open(&self) -> Result<Store, Failure> {
        match self.backend()? {
            Backend::Postgres(store) => Ok(Arc::new(open_postgres(store).await?)),
            #[cfg(feature = "etcd")]
            Backend::Etcd(url) => Ok(Arc::new(connect_etcd(&url).await?)),
        }
    }

    /// A Postgres store on this database whose schema serves this build, for `command`, which
    /// works on Postgres only; see [`open_postgres`].
    pub async fn open_postgres(&self, command: &str) -> Result<PgLeaseStore, Failure> {
        open_postgres(self.postgres_only(command)?).await
    }
}

/// `store` once its schema serves this build, retrying while the database is unreachable. A
/// schema with migrations of a newer release that are all additive serves it: that is said on
/// stderr (a warning), and the command goes on.
async fn open_postgres(store: PgLeaseStore) -> Result<PgLeaseStore, Failure> {
    let status = retry_while_unreachable(|| store.schema_status()).await?;
    if !status.newer_additive.is_empty() {
        tracing::warn!(
            migrations = %status.newer_additive.join(", "),
            "the lease schema has migrations of a newer release, all additive: this leasectl \
             works with them; upgrade it when convenient"
        );
    }
    Ok(store)
}

/// A client on the etcd members `url` names (the store under its prefix).
#[cfg(feature = "etcd")]
pub async fn connect_etcd(url: &EtcdUrl) -> Result<EtcdLeaseStore, Failure> {
    EtcdLeaseStore::connect(url)
        .await
        .map_err(|e| Failure::Runtime(Chain(&e).to_string()))
}

/// Attempts at an operation on a database that cannot be reached before giving up.
const ATTEMPTS: u32 = 5;

/// Run `operation` until it answers, retrying (250 ms, doubling, [`ATTEMPTS`] in all) while
/// the server cannot be reached or cannot take connections yet. A wrong password, a missing
/// database or schema, a missing privilege are reported at once: waiting does not fix them.
pub async fn retry_while_unreachable<T, F, Fut>(mut operation: F) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, PgSetupError>>,
{
    let mut pause = Duration::from_millis(250);
    let mut attempt = 1;
    loop {
        match operation().await {
            Ok(answer) => return Ok(answer),
            Err(e) if e.is_transient() && attempt < ATTEMPTS => {
                tracing::warn!(attempt, error = %Chain(&e), "database unreachable; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            Err(e) if e.is_transient() => {
                return Err(Failure::Runtime(format!(
                    "database unreachable after {attempt} attempts: {}",
                    Chain(&e)
                )));
            }
            Err(e) => return Err(Failure::Runtime(Chain(&e).to_string())),
        }
    }
}

/// A store failure as a runtime failure, or as a usage error for contract refusals that come
/// from the command line (unknown group, shard-count mismatch).
pub fn store_failure(e: StoreError) -> Failure {
    match e {
        StoreError::GroupNotFound { group } => Failure::Usage(format!(
            "--group: group {group:?} does not exist (a worker creates it when it starts)"
        )),
        StoreError::ShardCountMismatch {
            group,
            configured,
            found,
        } => Failure::Usage(format!(
            "--shards: group {group:?} exists with {found} shards, not {configured}; \
             a group's shard count changes only with leasectl resize"
        )),
        StoreError::NotAMember { group, worker } => Failure::Usage(format!(
            "--worker: worker {worker} is not a member of group {group:?} (`leasectl status \
             --group {group}` lists the members); nothing was changed"
        )),
        StoreError::BucketOutOfRange {
            group,
            bucket,
            shard_count,
        } => Failure::Usage(format!(
            "--bucket: group {group:?} has buckets 0 to {}, not {bucket}; nothing was changed",
            shard_count.get() - 1
        )),
        other => Failure::Runtime(Chain(&other).to_string()),
    }
}

/// `--group`, validated.
pub fn group_arg(name: &str) -> Result<GroupName, Failure> {
    GroupName::new(name).map_err(|e| Failure::Usage(format!("--group: {e}")))
}

/// A time the way every subcommand prints it (RFC 3339, microseconds, UTC).
pub fn rfc3339(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Now on the local clock, formatted like the JSON events' times.
pub fn now_rfc3339() -> String {
    rfc3339(Utc::now())
}
