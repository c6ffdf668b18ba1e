//! Errors of setting the backend up, and how database failures become [`StoreError`]s.

use lease_core::StoreError;

/// Why the Postgres backend could not be set up or migrated.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgSetupError {
    /// The connection string is not a valid Postgres URL or key-value string.
    #[error("{message}")]
    InvalidUrl {
        /// What is wrong with it.
        message: String,
    },
    /// The connection pool could not be built from the configuration.
    #[error("invalid connection pool configuration: {0}")]
    Pool(#[source] deadpool::managed::BuildError),
    /// No connection to the database could be made.
    #[error("cannot connect to Postgres: {message}")]
    Connect {
        /// What failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// Applying the embedded migrations failed.
    #[error("applying the lease migrations failed: {message}")]
    Migration {
        /// What failed.
        message: String,
    },
    /// The database lacks migrations this build needs.
    #[error(
        "the lease schema is missing migrations {missing:?}; run `leasectl migrate` \
         (or PgLeaseStore::migrate) against this database"
    )]
    SchemaMissing {
        /// Versions not applied yet.
        missing: Vec<String>,
    },
}

/// A diesel error as a [`StoreError::Backend`], with a hint when the schema is missing.
pub(crate) fn from_diesel(what: &str, e: diesel::result::Error) -> StoreError {
    let text = e.to_string();
    let hint = if text.contains("does not exist") && text.contains("lease") {
        " (the lease schema is missing: run `leasectl migrate`)"
    } else {
        ""
    };
    StoreError::backend(format!("{what}: {text}{hint}"), e)
}

/// A pool failure (no connection could be had) as a [`StoreError::Backend`].
pub(crate) fn from_pool(e: diesel_async::pooled_connection::deadpool::PoolError) -> StoreError {
    StoreError::backend(format!("no database connection: {e}"), e)
}

/// A value read from the database that breaks the schema's own constraints.
pub(crate) fn corrupt(what: String) -> StoreError {
    StoreError::Backend {
        message: format!("unexpected data in the lease schema: {what}"),
        source: None,
    }
}
