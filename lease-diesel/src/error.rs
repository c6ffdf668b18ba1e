//! Errors of setting the backend up, and how database failures become [`StoreError`]s.

use diesel::result::DatabaseErrorKind;
use diesel_async::pooled_connection::deadpool::PoolError;
use lease_core::{BackendFailure, Operation, StoreError};

/// Why the Postgres backend could not be set up, checked or migrated.
///
/// Each variant says whether retrying can help; [`is_transient`](Self::is_transient) gives
/// the answer to code that retries (`leasectl` retries only transient errors). Messages carry
/// their cause once, in the text: these errors have no [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgSetupError {
    /// The connection string is not a valid Postgres URL or key-value string. Permanent.
    #[error("{message}")]
    InvalidUrl {
        /// What is wrong with it.
        message: String,
    },
    /// The connection pool could not be built from the configuration. Permanent.
    #[error("invalid connection pool configuration: {0}")]
    Pool(deadpool::managed::BuildError),
    /// The pool hands out no connections at all (it was closed, or has no runtime). Permanent.
    #[error("the connection pool is unusable: {message}")]
    PoolUnusable {
        /// Why.
        message: String,
    },
    /// The server could not be reached, or does not accept connections right now: a refused
    /// or reset connection, a host name that does not resolve, a timeout, a server starting up
    /// or shutting down, too many connections, a connection lost half-way. Transient:
    /// retrying may help.
    #[error("{message}")]
    Unreachable {
        /// Where, and what failed, with its cause.
        message: String,
    },
    /// The server refused the login (SQLSTATE 28P01 or 28000: wrong password, unknown role,
    /// no `pg_hba.conf` entry), or the server asked for a password the URL does not give.
    /// Permanent: fix the credentials.
    #[error("{message}")]
    AuthenticationFailed {
        /// Where, and the server's answer.
        message: String,
    },
    /// The database named in the URL does not exist (SQLSTATE 3D000). Permanent.
    #[error("{message}")]
    DatabaseNotFound {
        /// Where, and the server's answer.
        message: String,
    },
    /// The role lacks a privilege the operation needs: to connect (SQLSTATE 42501), `USAGE` on
    /// schema `lease` for the start-up check, or the right to create or alter the schema for a
    /// migration. Permanent: grant it, or use another role.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// What is missing, and how to grant it.
        message: String,
    },
    /// TLS could not be set up: the settings are contradictory, a certificate file is
    /// missing or unreadable, the server's certificate failed verification, the server does
    /// not offer the TLS the URL requires, or the server refused the client certificate.
    /// Permanent: fix the certificates or the URL's `sslmode` / `sslrootcert`.
    #[error("{message}")]
    Tls {
        /// Where, and what failed.
        message: String,
    },
    /// The server refused the connection for another reason. Permanent.
    #[error("{message}")]
    ConnectRejected {
        /// The server's SQLSTATE, if it sent one.
        sqlstate: Option<String>,
        /// Where, and the server's answer.
        message: String,
    },
    /// A migration has work to do but the connection is read-only (a hot standby, or
    /// `default_transaction_read_only`). Permanent: migrate against the primary.
    #[error(
        "cannot migrate: the database is read-only here (a hot standby, or \
         default_transaction_read_only is on); run `leasectl migrate` against the primary"
    )]
    ReadOnly,
    /// The database has no `lease` schema. Permanent until someone migrates.
    #[error(
        "the database has no `lease` schema: run `leasectl migrate` (or \
         PgLeaseStore::migrate) against it first"
    )]
    NotInstalled,
    /// The `lease` schema lacks migrations this build needs. Permanent until someone migrates.
    #[error(
        "the lease schema is older than this build (missing migrations {}): run \
         `leasectl migrate` (or PgLeaseStore::migrate)",
        .missing.join(", ")
    )]
    SchemaOutdated {
        /// Versions not applied yet, in order.
        missing: Vec<String>,
    },
    /// The `lease` schema was installed by an earlier release, which recorded its versions in
    /// the application's `__diesel_schema_migrations` table. Permanent until someone migrates:
    /// [`PgLeaseStore::migrate`](crate::PgLeaseStore::migrate) adopts it.
    #[error(
        "the lease schema was installed by an earlier release (its versions are in the \
         application's __diesel_schema_migrations table): run `leasectl migrate` (or \
         PgLeaseStore::migrate) to adopt and upgrade it"
    )]
    LegacySchema,
    /// The `lease` schema has a breaking migration this build does not know: a newer release
    /// installed it, and binaries that do not know it must not run. (Newer migrations that are
    /// all additive are accepted.) Permanent: upgrade.
    #[error(
        "the lease schema is newer than this build: it has migrations {} that this build does \
         not know and that break it; upgrade leasectl / the lease library",
        .unknown.join(", ")
    )]
    SchemaNewer {
        /// The applied versions this build does not know that are breaking (or were recorded
        /// without saying), in order.
        unknown: Vec<String>,
    },
    /// A schema named `lease` exists that the engine did not create; the engine never moves
    /// into it (its name is fixed) and wrote nothing. Permanent: rename or drop that schema,
    /// or use another database.
    #[error(
        "schema `lease` exists but was not created by the lease engine ({found}); nothing was \
         written. The engine's schema name is fixed: rename or drop that schema, or install \
         the engine in another database"
    )]
    ForeignSchema {
        /// What the schema holds.
        found: String,
    },
    /// Migrating was asked of a store whose URL goes through a transaction pooler, and no
    /// direct URL was given: the migration lock is an advisory lock of the session, which
    /// such a pooler does not keep, and `CREATE INDEX CONCURRENTLY` cannot run in a
    /// transaction. Nothing was done. Permanent: give a direct URL
    /// ([`PgLeaseStoreBuilder::direct_url`](crate::PgLeaseStoreBuilder::direct_url),
    /// `leasectl --direct-url`), or migrate with a URL to the server itself.
    #[error(
        "migrating needs a connection to the server itself, not through a transaction pooler \
         (its lock belongs to the session, which the pooler does not keep); nothing was done: \
         give a direct URL (leasectl --direct-url, PgLeaseStoreBuilder::direct_url) or run \
         migrate with a URL to the server"
    )]
    DirectConnectionRequired,
    /// Another process held the migration lock for longer than this one waits (a minute).
    /// Transient.
    #[error("waiting for another process's migration timed out: {message}")]
    MigrationBusy {
        /// The server's answer.
        message: String,
    },
    /// A migration's SQL, or the runner's bookkeeping, failed. Permanent: the same SQL fails
    /// the same way again.
    #[error("applying the lease migrations failed: {message}")]
    Migration {
        /// Which migration, and the server's answer.
        message: String,
    },
    /// The role named to grant privileges to, or to check, does not exist. Permanent: create
    /// it first (`CREATE ROLE ... LOGIN`).
    #[error("role {role:?} does not exist: create it first (CREATE ROLE ... LOGIN)")]
    UnknownRole {
        /// The name, as given.
        role: String,
    },
    /// A query of the start-up check failed for another reason (a statement timeout, the
    /// server running out of resources). Transient.
    #[error("checking the lease schema failed: {message}")]
    SchemaCheck {
        /// The server's answer.
        message: String,
    },
}

impl PgSetupError {
    /// Whether retrying the same operation later may succeed: true for an unreachable or
    /// overloaded server and a migration lock held too long; false for bad configuration,
    /// credentials, privileges, and a schema that is missing, foreign, older or newer.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Unreachable { .. } | Self::MigrationBusy { .. } | Self::SchemaCheck { .. }
        )
    }
}

/// `e` and each of its sources, joined by `": "`: the cause chain, once.
pub(crate) fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}

/// Where a connection string points, for messages (never the password).
fn target(url: &str) -> String {
    let Ok(config) = url.parse::<tokio_postgres::Config>() else {
        return "Postgres".to_owned();
    };
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                tokio_postgres::config::Host::Tcp(name) => name.clone(),
                tokio_postgres::config::Host::Unix(dir) => dir.display().to_string(),
            };
            // One port for all hosts, or one each; 5432 when none is given.
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            format!("{host}:{port}")
        })
        .collect();
    let mut text = format!("Postgres at {}", hosts.join(","));
    if let Some(db) = config.get_dbname() {
        text.push_str(&format!(", database {db:?}"));
    }
    if let Some(user) = config.get_user() {
        text.push_str(&format!(", user {user:?}"));
    }
    text
}

/// Classify a failure to connect to `url`. By SQLSTATE when the server answered; a failure
/// below the protocol (I/O, timeout, closed) means the server could not be reached.
pub(crate) fn from_connect(
    url: &str,
    tls: Option<&crate::tls::TlsSummary>,
    e: &tokio_postgres::Error,
) -> PgSetupError {
    // A failed handshake surfaces as an I/O error: recognised first, it is not "unreachable".
    if let Some(explained) = crate::tls::explain(e, tls) {
        return PgSetupError::Tls {
            message: format!("cannot connect to {}: {explained}", target(url)),
        };
    }
    let cause = chain(e);
    let message = format!("cannot connect to {}: {cause}", target(url));
    let Some(code) = e.code() else {
        // Refused, reset, unresolvable and timed-out connections are I/O errors (a connect
        // timeout too); tokio-postgres reports a password the server asks for and the URL
        // lacks as a configuration error.
        let io = std::iter::successors(Some(e as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .any(|e| e.is::<std::io::Error>());
        return if io || e.is_closed() {
            PgSetupError::Unreachable { message }
        } else if cause.contains("password missing") {
            PgSetupError::AuthenticationFailed { message }
        } else {
            PgSetupError::ConnectRejected {
                sqlstate: None,
                message,
            }
        };
    };
    match SqlClass::of(code.code()) {
        SqlClass::Transient => PgSetupError::Unreachable { message },
        // The server's own words ("no pg_hba.conf entry ... no encryption") do not say
        // what to change on this side.
        SqlClass::Authentication if cause.contains("no encryption") => {
            PgSetupError::AuthenticationFailed {
                message: format!(
                    "{message} (the server accepts only TLS connections from here: set \
                     sslmode=require, or verify-full with sslrootcert)"
                ),
            }
        }
        SqlClass::Authentication if cause.contains("requires a valid client certificate") => {
            PgSetupError::AuthenticationFailed {
                message: format!("{message} (give one with sslcert and sslkey)"),
            }
        }
        SqlClass::Authentication => PgSetupError::AuthenticationFailed { message },
        SqlClass::NoDatabase => PgSetupError::DatabaseNotFound { message },
        SqlClass::Privilege => PgSetupError::PermissionDenied { message },
        SqlClass::Other => PgSetupError::ConnectRejected {
            sqlstate: Some(code.code().to_owned()),
            message,
        },
    }
}

/// What a SQLSTATE sent while connecting means for retrying.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum SqlClass {
    /// The server cannot take the connection now: starting up or shutting down (57P01-57P03),
    /// out of resources or connection slots (class 53), a connection exception (class 08).
    Transient,
    /// Wrong password, unknown role, no `pg_hba.conf` entry (28P01, 28000).
    Authentication,
    /// No such database (3D000).
    NoDatabase,
    /// No `CONNECT` privilege (42501).
    Privilege,
    /// Anything else: permanent.
    Other,
}

impl SqlClass {
    pub(crate) fn of(code: &str) -> Self {
        match code {
            "28P01" | "28000" => Self::Authentication,
            "3D000" => Self::NoDatabase,
            "42501" => Self::Privilege,
            "57P01" | "57P02" | "57P03" => Self::Transient,
            _ if code.starts_with("53") || code.starts_with("08") => Self::Transient,
            _ => Self::Other,
        }
    }
}

/// A classified connect failure, carried through deadpool and diesel-async to
/// [`from_pool_setup`]: `diesel::ConnectionError` holds either a string (losing the SQLSTATE
/// and the cause) or a `diesel::result::Error`, and of those only `QueryBuilderError` boxes
/// an arbitrary error that can be downcast again. The name is wrong, the content is exact.
pub(crate) fn into_connection_error(e: PgSetupError) -> diesel::ConnectionError {
    diesel::ConnectionError::CouldntSetupConfiguration(diesel::result::Error::QueryBuilderError(
        Box::new(e),
    ))
}

/// Why the pool gave no connection, for `check_schema` and `migrate`.
pub(crate) fn from_pool_setup(e: PoolError) -> PgSetupError {
    use diesel_async::pooled_connection::PoolError as Backend;
    match e {
        PoolError::Backend(Backend::ConnectionError(
            diesel::ConnectionError::CouldntSetupConfiguration(
                diesel::result::Error::QueryBuilderError(inner),
            ),
        )) => match inner.downcast::<PgSetupError>() {
            Ok(classified) => *classified,
            Err(other) => PgSetupError::ConnectRejected {
                sqlstate: None,
                message: format!("cannot connect: {other}"),
            },
        },
        // A pool built elsewhere connects through diesel-async's `establish`, which keeps
        // neither the SQLSTATE nor the cause: an error the server sent is taken as permanent,
        // anything else as unreachable.
        PoolError::Backend(Backend::ConnectionError(
            diesel::ConnectionError::CouldntSetupConfiguration(
                e @ diesel::result::Error::DatabaseError(kind, _),
            ),
        )) => {
            let message = format!("cannot connect: {e}");
            if let diesel::result::Error::DatabaseError(_, info) = &e
                && behind_a_pooler(info.message())
            {
                return PgSetupError::ConnectRejected {
                    sqlstate: None,
                    message: format!("{message} ({POOLER_HINT})"),
                };
            }
            match kind {
                DatabaseErrorKind::UnableToSendCommand | DatabaseErrorKind::ClosedConnection => {
                    PgSetupError::Unreachable { message }
                }
                _ => PgSetupError::ConnectRejected {
                    sqlstate: None,
                    message,
                },
            }
        }
        PoolError::Backend(Backend::ConnectionError(
            diesel::ConnectionError::InvalidConnectionUrl(message),
        )) => PgSetupError::InvalidUrl { message },
        PoolError::Backend(Backend::ConnectionError(other)) => PgSetupError::ConnectRejected {
            sqlstate: None,
            message: format!("cannot connect: {other}"),
        },
        // The recycling check of a pooled connection failed: the connection broke.
        PoolError::Backend(Backend::QueryError(e)) => PgSetupError::Unreachable {
            message: format!("a pooled connection broke: {e}"),
        },
        PoolError::Timeout(kind) => PgSetupError::Unreachable {
            message: format!("no database connection within the pool's timeout ({kind:?})"),
        },
        PoolError::Closed | PoolError::NoRuntimeSpecified => PgSetupError::PoolUnusable {
            message: e.to_string(),
        },
        PoolError::PostCreateHook(hook) => PgSetupError::ConnectRejected {
            sqlstate: None,
            message: format!("a new connection's setup hook failed: {hook}"),
        },
    }
}

/// Why a connection opened outside the pool (on the direct URL) failed, classified as a
/// pool's failure to connect would be.
pub(crate) fn from_connection_setup(e: diesel::ConnectionError) -> PgSetupError {
    from_pool_setup(PoolError::Backend(
        diesel_async::pooled_connection::PoolError::ConnectionError(e),
    ))
}

/// [`from_connection_setup`] as a [`StoreError::Backend`] of `op`.
pub(crate) fn from_connection(op: Operation, e: diesel::ConnectionError) -> StoreError {
    from_pool(
        op,
        PoolError::Backend(diesel_async::pooled_connection::PoolError::ConnectionError(
            e,
        )),
    )
}

/// A diesel error as a [`StoreError::Backend`], classified.
///
/// diesel-async keeps the SQLSTATE only for a few kinds (serialization failure, read-only
/// transaction...); for the others the server's message is read, in English, Postgres's
/// default. A server set to another `lc_messages` gives unrecognised messages, which count as
/// [`BackendFailure::Other`]: retried and reported, never stopping a worker.
pub(crate) fn from_diesel(op: Operation, e: diesel::result::Error) -> StoreError {
    use diesel::result::Error as E;
    if let E::DatabaseError(_, info) = &e
        && behind_a_pooler(info.message())
    {
        return StoreError::Backend {
            operation: op,
            failure: BackendFailure::Misconfigured,
            detail: Some(POOLER_HINT.to_owned()),
            source: Some(Box::new(e)),
        };
    }
    let failure = match &e {
        E::DatabaseError(kind, info) => match kind {
            DatabaseErrorKind::UnableToSendCommand
            | DatabaseErrorKind::ClosedConnection
            | DatabaseErrorKind::ReadOnlyTransaction => BackendFailure::Unavailable,
            DatabaseErrorKind::SerializationFailure => BackendFailure::Conflict,
            _ => from_message(info.message()),
        },
        E::DeserializationError(_) | E::SerializationError(_) => BackendFailure::Corrupt,
        E::BrokenTransactionManager => BackendFailure::Unavailable,
        _ => BackendFailure::Other,
    };
    StoreError::backend(op, failure, e)
}

/// What a store that reaches the server through a transaction pooler without being told so
/// hears, and what to do about it.
pub(crate) const POOLER_HINT: &str = "a prepared statement is missing from the server \
    connection, or already there: the URL reaches the server through a transaction pooler \
    (PgBouncer with pool_mode = transaction), which hands each transaction any server \
    connection; turn on transaction_pooler (transaction_pooler=true in the URL, \
    PgLeaseStoreBuilder::transaction_pooler, leasectl --transaction-pooler)";

/// Whether the server's message is what named prepared statements give through a
/// transaction pooler: `prepared statement "s3" does not exist` (the next transaction ran on
/// another server connection), `... already exists` (another client's statement of that name
/// is on this one), `unnamed prepared statement does not exist`.
fn behind_a_pooler(message: &str) -> bool {
    message.contains("prepared statement")
        && (message.contains("does not exist") || message.contains("already exists"))
}

/// What a server error's (English) message says about retrying.
fn from_message(message: &str) -> BackendFailure {
    let has = |needle: &str| message.contains(needle);
    if has("statement timeout") || has("lock timeout") {
        BackendFailure::Timeout
    } else if has("deadlock detected") || has("could not serialize") {
        BackendFailure::Conflict
    } else if has("permission denied") {
        BackendFailure::PermissionDenied
    } else if has("does not exist") {
        // A relation, function, column or schema of the engine's is missing: the schema is
        // not there, or older than this build.
        BackendFailure::SchemaMismatch
    } else if has("terminating connection")
        || has("the database system is")
        || has("connection")
        || has("read-only transaction")
        || has("recovery is in progress")
    {
        BackendFailure::Unavailable
    } else {
        BackendFailure::Other
    }
}

/// A pool failure (no connection could be had) as a [`StoreError::Backend`], classified as the
/// setup calls classify it.
pub(crate) fn from_pool(op: Operation, e: PoolError) -> StoreError {
    let setup = from_pool_setup(e);
    let failure = match &setup {
        PgSetupError::Unreachable { .. }
        | PgSetupError::MigrationBusy { .. }
        | PgSetupError::SchemaCheck { .. }
        | PgSetupError::ReadOnly => BackendFailure::Unavailable,
        PgSetupError::AuthenticationFailed { .. } => BackendFailure::Authentication,
        PgSetupError::Tls { .. } => BackendFailure::Tls,
        PgSetupError::PermissionDenied { .. } => BackendFailure::PermissionDenied,
        PgSetupError::NotInstalled
        | PgSetupError::SchemaOutdated { .. }
        | PgSetupError::LegacySchema
        | PgSetupError::SchemaNewer { .. }
        | PgSetupError::ForeignSchema { .. }
        | PgSetupError::Migration { .. } => BackendFailure::SchemaMismatch,
        _ => BackendFailure::Misconfigured,
    };
    StoreError::backend(op, failure, setup)
}

/// A value read from the database that breaks the schema's own constraints.
pub(crate) fn corrupt(op: Operation, what: String) -> StoreError {
    StoreError::backend_detail(op, BackendFailure::Corrupt, what)
}
