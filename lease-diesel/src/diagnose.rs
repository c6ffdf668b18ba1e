//! What a deployment looks like from a worker's seat: the facts `leasectl doctor` judges, read
//! over the store's own connections (so through the same TLS settings, pooler and role a
//! worker would use).

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{Bool, Nullable, Text, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use futures_util::StreamExt;

use crate::error::{self, PgSetupError};
use crate::{PgLeaseStore, TlsSummary};

/// How long the LISTEN check waits for its own notification.
const LISTEN_WAIT: Duration = Duration::from_secs(2);

/// The facts about a deployment that decide whether workers can run on it, and how safely.
#[derive(Debug)]
#[non_exhaustive]
pub struct Diagnosis {
    /// `server_version`, e.g. `15.10 (Debian 15.10-0+deb12u1)`.
    pub server_version: String,
    /// `server_version_num`, e.g. `150010`.
    pub server_version_num: u32,
    /// The role connected as.
    pub role: String,
    /// The database connected to.
    pub database: String,
    /// The connection is over a unix socket (where TLS is never used).
    pub over_socket: bool,
    /// TLS on the connection, as the server sees it.
    pub tls: TlsState,
    /// The server is a standby (in recovery): it accepts no writes.
    pub in_recovery: bool,
    /// The connection is read-only (a standby, or `default_transaction_read_only`).
    pub read_only: bool,
    /// The start-up check of the `lease` schema: `Ok`, or why workers would refuse to start.
    pub schema: Result<(), PgSetupError>,
    /// The server's clock against this host's.
    pub clock: ClockReading,
    /// Replication as the server reports it.
    pub replication: Replication,
    /// Whether `LISTEN/NOTIFY` reaches this client over the store's URL (it does not through
    /// a transaction pooler).
    pub listen: ListenCheck,
    /// The same over the direct URL, when the store has one (its wake-ups then come that way).
    pub direct_listen: Option<ListenCheck>,
    /// The store was built for a transaction pooler.
    pub transaction_pooler: bool,
}

/// TLS on the diagnosed connection.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TlsState {
    /// The server reports this connection as TLS (`pg_stat_ssl`). Behind a pooler this is the
    /// pooler's connection to the server, not this host's to the pooler.
    pub in_use: bool,
    /// The protocol version, when in use (`TLSv1.3`).
    pub version: Option<String>,
    /// The settings the store was built with (`None` for a store made from a pool).
    pub settings: Option<TlsSummary>,
}

/// The server's clock compared with this host's, over one round trip.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClockReading {
    /// The server's time minus this host's at the middle of the round trip (positive: the
    /// server is ahead).
    pub skew: chrono::Duration,
    /// The round trip the reading took; the skew is known to within half of it.
    pub round_trip: Duration,
}

/// Replication, as far as the role may see it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Replication {
    /// `synchronous_commit` for this session.
    pub synchronous_commit: String,
    /// `synchronous_standby_names` (empty: no synchronous standby).
    pub synchronous_standby_names: String,
    /// The standbys streaming from this server (`pg_stat_replication`).
    pub standbys: Vec<Standby>,
}

/// One standby streaming from the diagnosed server.
#[derive(Debug, Clone, QueryableByName)]
#[non_exhaustive]
pub struct Standby {
    /// Its `application_name`.
    #[diesel(sql_type = Text)]
    pub name: String,
    /// `streaming`, `catchup`... (`None` if the role may not see it).
    #[diesel(sql_type = Nullable<Text>)]
    pub state: Option<String>,
    /// `sync`, `quorum`, `potential` or `async` (`None` if the role may not see it).
    #[diesel(sql_type = Nullable<Text>)]
    pub sync_state: Option<String>,
}

impl Replication {
    /// Whether a commit the server acknowledges is on at least one standby too: a
    /// synchronous standby is streaming and `synchronous_commit` waits for it.
    pub fn commits_wait_for_a_standby(&self) -> bool {
        self.configured_synchronous()
            && self
                .standbys
                .iter()
                .any(|s| matches!(s.sync_state.as_deref(), Some("sync" | "quorum")))
    }

    /// The settings make commits wait for a standby (`synchronous_commit` of `on`,
    /// `remote_write` or `remote_apply` with `synchronous_standby_names` set), whether or not
    /// this role may see which standby is in sync. While no named standby is connected,
    /// commits wait rather than being acknowledged unreplicated.
    pub fn configured_synchronous(&self) -> bool {
        matches!(
            self.synchronous_commit.as_str(),
            "on" | "remote_write" | "remote_apply"
        ) && !self.synchronous_standby_names.trim().is_empty()
    }
}

/// The `LISTEN/NOTIFY` round trip.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ListenCheck {
    /// A notification sent from a second connection reached the listening one.
    pub works: bool,
    /// How long it took, or how long was waited in vain.
    pub waited: Duration,
}

#[derive(QueryableByName)]
struct Settings {
    #[diesel(sql_type = Text)]
    server_version: String,
    #[diesel(sql_type = Text)]
    server_version_num: String,
    #[diesel(sql_type = Text)]
    role: String,
    #[diesel(sql_type = Text)]
    database: String,
    #[diesel(sql_type = Bool)]
    over_socket: bool,
    #[diesel(sql_type = Bool)]
    in_recovery: bool,
    #[diesel(sql_type = Text)]
    read_only: String,
    #[diesel(sql_type = Text)]
    synchronous_commit: String,
    #[diesel(sql_type = Text)]
    synchronous_standby_names: String,
    #[diesel(sql_type = Nullable<Bool>)]
    ssl: Option<bool>,
    #[diesel(sql_type = Nullable<Text>)]
    ssl_version: Option<String>,
}

#[derive(QueryableByName)]
struct ServerTime {
    #[diesel(sql_type = Timestamptz)]
    now: DateTime<Utc>,
}

fn failed(what: &str, e: &diesel::result::Error) -> PgSetupError {
    PgSetupError::SchemaCheck {
        message: format!("{what}: {}", error::chain(e)),
    }
}

impl PgLeaseStore {
    /// Read what decides whether workers can run here and how safely (see [`Diagnosis`]).
    /// Fails only if the server cannot be reached or answered none of it; every other
    /// finding is in the result.
    ///
    /// # Errors
    ///
    /// The failure to connect, classified as [`check_schema`](Self::check_schema) classifies
    /// it.
    pub async fn diagnose(&self) -> Result<Diagnosis, PgSetupError> {
        let mut conn = self.pool.get().await.map_err(error::from_pool_setup)?;
        // Behind a transaction pooler every statement must run in a transaction, where the
        // pooler keeps one server connection for it.
        if self.pooler.is_some() {
            // Not READ ONLY: that would make the read-only finding below always true.
            conn.batch_execute("BEGIN")
                .await
                .map_err(|e| failed("BEGIN", &e))?;
        }
        let settings: Settings = diesel::sql_query(
            "SELECT current_setting('server_version') AS server_version, \
                    current_setting('server_version_num') AS server_version_num, \
                    current_user::text AS role, current_database()::text AS database, \
                    inet_server_addr() IS NULL AS over_socket, \
                    pg_is_in_recovery() AS in_recovery, \
                    current_setting('transaction_read_only') AS read_only, \
                    current_setting('synchronous_commit') AS synchronous_commit, \
                    current_setting('synchronous_standby_names') AS synchronous_standby_names, \
                    (SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()) AS ssl, \
                    (SELECT version FROM pg_stat_ssl WHERE pid = pg_backend_pid()) AS ssl_version",
        )
        .get_result(&mut *conn)
        .await
        .map_err(|e| failed("reading the server's settings", &e))?;
        let clock = read_clock(&mut conn).await?;
        let standbys: Vec<Standby> = diesel::sql_query(
            "SELECT COALESCE(application_name, '') AS name, state, sync_state \
               FROM pg_stat_replication ORDER BY 1",
        )
        .load(&mut *conn)
        .await
        .map_err(|e| failed("reading pg_stat_replication", &e))?;
        if self.pooler.is_some() {
            conn.batch_execute("COMMIT")
                .await
                .map_err(|e| failed("COMMIT", &e))?;
        }
        drop(conn);
        let schema = self.check_schema().await;
        let listen = self.listen_round_trip(false).await?;
        let direct_listen = match self.direct {
            Some(_) => Some(self.listen_round_trip(true).await?),
            None => None,
        };
        Ok(Diagnosis {
            server_version: settings.server_version,
            server_version_num: settings.server_version_num.parse().unwrap_or(0),
            role: settings.role,
            database: settings.database,
            over_socket: settings.over_socket,
            tls: TlsState {
                in_use: settings.ssl.unwrap_or(false),
                version: settings.ssl_version,
                settings: self.tls().cloned(),
            },
            in_recovery: settings.in_recovery,
            read_only: settings.read_only == "on",
            schema,
            clock,
            replication: Replication {
                synchronous_commit: settings.synchronous_commit,
                synchronous_standby_names: settings.synchronous_standby_names,
                standbys,
            },
            listen,
            direct_listen,
            transaction_pooler: self.pooler.is_some(),
        })
    }

    /// `LISTEN` on one connection, `NOTIFY` from another, and wait for the notification;
    /// listening on the direct URL's connection if `direct`, else on a pooled one.
    async fn listen_round_trip(&self, direct: bool) -> Result<ListenCheck, PgSetupError> {
        let channel = format!("lease_doctor_{}", uuid::Uuid::new_v4().simple());
        let mut own;
        let mut pooled;
        let listener: &mut AsyncPgConnection = match (&self.direct, direct) {
            (Some((connector, _)), true) => {
                own = connector
                    .connect()
                    .await
                    .map_err(error::from_connection_setup)?;
                &mut own
            }
            _ => {
                pooled = self.pool.get().await.map_err(error::from_pool_setup)?;
                &mut pooled
            }
        };
        listener
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(|e| failed("LISTEN", &e))?;
        let mut sender = self.pool.get().await.map_err(error::from_pool_setup)?;
        let started = Instant::now();
        sender
            .batch_execute(&format!("NOTIFY {channel}, 'doctor'"))
            .await
            .map_err(|e| failed("NOTIFY", &e))?;
        drop(sender);
        let heard = {
            let mut notes = std::pin::pin!(listener.notifications_stream());
            tokio::time::timeout(LISTEN_WAIT, async {
                while let Some(note) = notes.next().await {
                    if note.is_ok_and(|n| n.channel == channel) {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false)
        };
        let waited = started.elapsed();
        // A pooled connection goes back listening to nothing.
        listener
            .batch_execute("UNLISTEN *")
            .await
            .map_err(|e| failed("UNLISTEN", &e))?;
        Ok(ListenCheck {
            works: heard,
            waited,
        })
    }
}

async fn read_clock(conn: &mut AsyncPgConnection) -> Result<ClockReading, PgSetupError> {
    let before = Utc::now();
    let started = Instant::now();
    let server: ServerTime = diesel::sql_query("SELECT clock_timestamp() AS now")
        .get_result(conn)
        .await
        .map_err(|e| failed("reading the server's clock", &e))?;
    let round_trip = started.elapsed();
    let middle = before
        + chrono::Duration::from_std(round_trip / 2).unwrap_or_else(|_| chrono::Duration::zero());
    Ok(ClockReading {
        skew: server.now - middle,
        round_trip,
    })
}
