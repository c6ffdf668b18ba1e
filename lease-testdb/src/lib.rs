//! Throwaway Postgres for tests: one private cluster per test process, started from the
//! system's server binaries, with a migrated template database and a fresh database per test.
//!
//! - With `DATABASE_URL` set, that server is used instead: the tests create a template and
//!   one database per test in it (the role needs `CREATEDB`), named `lease_t_<pid>_<n>`.
//! - Otherwise `initdb` and `pg_ctl` are looked up in `LEASE_PG_BINDIR`, `PATH`,
//!   `pg_config --bindir` and `/usr/lib/postgresql/*/bin`; a cluster is created in a temp
//!   directory (`fsync=off`, unix socket only) and run as the `postgres` user when the tests
//!   run as root. With `LEASE_TESTDB_DURABLE=1` the cluster runs durable instead (`fsync`,
//!   `synchronous_commit` and `full_page_writes` on, as a production server would): for
//!   benchmarks whose figures must include the cost of commits reaching the disk. A watchdog
//!   process stops it and removes the directory when the test process exits, however it
//!   exits.
//! - With neither, [`server`] panics with a message naming what to install: the Postgres tests
//!   fail, they never pass by skipping.
//!
//! Tests that need a server of a particular shape (TLS only, a password policy, a pooler in
//! front) start a [`Cluster`] of their own with [`ClusterOptions`]; [`TestCa`] makes the
//! certificates.

mod bins;
mod certs;
mod cluster;
mod frozen;
mod pgbouncer;
mod tls_server;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

pub use certs::{Issued, TestCa, write_private};
pub use cluster::{Cluster, ClusterOptions, Replication, ServerTls};
pub use frozen::{Backend, Frozen, backends};
pub use pgbouncer::{PgBouncer, PoolMode};
pub use tls_server::{TlsServer, tls_server};

/// Where the test databases live.
#[derive(Debug)]
pub enum Server {
    /// A cluster started by this process.
    Own(Cluster),
    /// The server `DATABASE_URL` names.
    External {
        /// The URL given.
        url: String,
    },
}

static SERVER: OnceLock<Server> = OnceLock::new();
static NEXT_DB: AtomicU32 = AtomicU32::new(0);

/// The test server, started on first use.
///
/// # Panics
///
/// If there is neither a `DATABASE_URL` nor Postgres server binaries, or the cluster cannot
/// be started; the message says why and what to install.
pub fn server() -> &'static Server {
    SERVER.get_or_init(|| {
        let server = match std::env::var("DATABASE_URL") {
            Ok(url) if !url.trim().is_empty() => Server::External { url },
            _ => Server::Own(
                Cluster::start(ClusterOptions {
                    durable: durable(),
                    ..ClusterOptions::default()
                })
                .unwrap_or_else(|e| panic!("{e}")),
            ),
        };
        server.create_template().unwrap_or_else(|e| panic!("{e}"));
        server
    })
}

/// A fresh, migrated database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDb {
    /// Its name.
    pub name: String,
    /// A connection URL for it.
    pub url: String,
}

/// Create a fresh, migrated database (a copy of the template).
pub async fn database() -> TestDb {
    let server = server();
    let n = NEXT_DB.fetch_add(1, Ordering::SeqCst);
    let name = format!("lease_t_{}_{n}", std::process::id());
    let admin = server.url_for("postgres");
    let mut conn = AsyncPgConnection::establish(&admin)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test server at {admin}: {e}"));
    let template = server.template_name();
    let create = format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\"");
    // Creating from a template fails while another session is still leaving it; retry.
    let mut attempt = 0;
    loop {
        match conn.batch_execute(&create).await {
            Ok(()) => break,
            Err(e) if attempt < 20 && e.to_string().contains("being accessed") => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("creating test database {name}: {e}"),
        }
    }
    TestDb {
        url: server.url_for(&name),
        name,
    }
}

/// Create a fresh database without the lease schema (to test what an unmigrated database
/// does).
pub async fn empty_database() -> TestDb {
    let server = server();
    let n = NEXT_DB.fetch_add(1, Ordering::SeqCst);
    let name = format!("lease_e_{}_{n}", std::process::id());
    let admin = server.url_for("postgres");
    let mut conn = AsyncPgConnection::establish(&admin)
        .await
        .unwrap_or_else(|e| panic!("connecting to the test server at {admin}: {e}"));
    conn.batch_execute(&format!("CREATE DATABASE \"{name}\""))
        .await
        .unwrap_or_else(|e| panic!("creating database {name}: {e}"));
    TestDb {
        url: server.url_for(&name),
        name,
    }
}

impl Server {
    /// A connection URL for database `db` on this server.
    pub fn url_for(&self, db: &str) -> String {
        match self {
            Server::Own(c) => c.socket_url(db),
            Server::External { url } => with_database(url, db),
        }
    }

    /// The cluster this process started, if it did (for restart tests).
    pub fn own(&self) -> Option<&Cluster> {
        match self {
            Server::Own(c) => Some(c),
            Server::External { .. } => None,
        }
    }

    fn template_name(&self) -> String {
        match self {
            Server::Own(_) => "lease_template".to_owned(),
            Server::External { .. } => format!("lease_template_{}", std::process::id()),
        }
    }

    fn create_template(&self) -> Result<(), String> {
        let name = self.template_name();
        let admin = self.url_for("postgres");
        let url = self.url_for(&name);
        // Migrations run synchronously under the hood; give them a runtime of their own on a
        // thread of their own, so callers may be on any runtime (or none).
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .map_err(|e| format!("a runtime for the template: {e}"))?;
            rt.block_on(async {
                let mut conn = AsyncPgConnection::establish(&admin)
                    .await
                    .map_err(|e| format!("connecting to the test server ({admin}): {e}"))?;
                conn.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\""))
                    .await
                    .map_err(|e| format!("dropping an old template: {e}"))?;
                conn.batch_execute(&format!("CREATE DATABASE \"{name}\""))
                    .await
                    .map_err(|e| format!("creating the template database: {e}"))?;
                let store = lease_diesel::PgLeaseStore::builder(url)
                    .max_connections(1)
                    .build()
                    .map_err(|e| format!("a store on the template: {e}"))?;
                store
                    .migrate()
                    .await
                    .map_err(|e| format!("migrating the template: {e}"))?;
                drop(store);
                Ok(())
            })
        })
        .join()
        .map_err(|_| "the template thread panicked".to_owned())?
    }
}

/// `url` logging in as `role` with `password` instead of its own user (a URL, or a key=value
/// connection string).
pub fn url_as(url: &str, role: &str, password: &str) -> String {
    match url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        Some(rest) => {
            let scheme = &url[..url.len() - rest.len()];
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let host = match rest[..authority_end].rfind('@') {
                Some(at) => &rest[at + 1..],
                None => rest,
            };
            format!("{scheme}{role}:{password}@{host}")
        }
        None => format!("{url} user={role} password={password}"),
    }
}

/// `url` with its database replaced by `db`; for a URL (`postgres://...`) or a key-value
/// connection string.
fn with_database(url: &str, db: &str) -> String {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let scheme = &url[..url.len() - rest.len()];
        let (before_query, query) = match rest.find('?') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let authority = before_query.split('/').next().unwrap_or(before_query);
        format!("{scheme}{authority}/{db}{query}")
    } else {
        format!("{url} dbname={db}")
    }
}

/// Whether `LEASE_TESTDB_DURABLE` asks for a durable cluster (`1`, `true`, `on` or `yes`).
pub fn durable() -> bool {
    std::env::var("LEASE_TESTDB_DURABLE").is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "on" | "yes"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn database_names_are_replaced() {
        assert_eq!(
            with_database("postgres://u:p@h:5432/app?sslmode=disable", "t1"),
            "postgres://u:p@h:5432/t1?sslmode=disable"
        );
        assert_eq!(with_database("postgresql://h", "t1"), "postgresql://h/t1");
        assert_eq!(
            with_database("host=/tmp port=5432 dbname=app", "t1"),
            "host=/tmp port=5432 dbname=app dbname=t1"
        );
    }
}
