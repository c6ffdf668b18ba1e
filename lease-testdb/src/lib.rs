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

use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

/// The port of the private cluster's socket (the socket directory is private, so any port).
const PORT: u16 = 5432;

/// A cluster the tests own.
#[derive(Debug)]
pub struct OwnCluster {
    bindir: PathBuf,
    dir: PathBuf,
    /// The user the server runs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
}

/// Where the test databases live.
#[derive(Debug)]
pub enum Server {
    /// A cluster started by this process.
    Own(OwnCluster),
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
            _ => Server::Own(OwnCluster::start().unwrap_or_else(|e| panic!("{e}"))),
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
            Server::Own(c) => format!(
                "host={} port={PORT} user=postgres dbname={db}",
                c.socket_dir().display()
            ),
            Server::External { url } => with_database(url, db),
        }
    }

    /// The cluster this process started, if it did (for restart tests).
    pub fn own(&self) -> Option<&OwnCluster> {
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

fn bin_candidates() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("LEASE_PG_BINDIR") {
        dirs.push(PathBuf::from(dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output()
        && out.status.success()
    {
        dirs.push(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
    }
    if let Ok(entries) = std::fs::read_dir("/usr/lib/postgresql") {
        let mut versions: Vec<(u32, PathBuf)> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                Some((v, e.path().join("bin")))
            })
            .collect();
        versions.sort_by_key(|v| std::cmp::Reverse(v.0));
        dirs.extend(versions.into_iter().map(|(_, p)| p));
    }
    dirs
}

fn find_bindir() -> Option<PathBuf> {
    bin_candidates().into_iter().find(|d| {
        d.join("initdb").is_file() && d.join("pg_ctl").is_file() && d.join("postgres").is_file()
    })
}

/// The uid and gid of `user`, from /etc/passwd.
fn lookup_user(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&user) && fields.len() > 3)
            .then(|| Some((fields[2].parse().ok()?, fields[3].parse().ok()?)))
            .flatten()
    })
}

impl OwnCluster {
    fn start() -> Result<Self, String> {
        let bindir = find_bindir().ok_or_else(|| {
            "The Postgres tests need a PostgreSQL server: install the server binaries \
             (Debian/Ubuntu: `apt install postgresql`, which provides initdb and pg_ctl under \
             /usr/lib/postgresql/<version>/bin), or set LEASE_PG_BINDIR to their directory, or \
             set DATABASE_URL to a server where the tests may create databases."
                .to_owned()
        })?;
        let euid = std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .unwrap_or(0);
        let run_as = if euid == 0 {
            // Postgres refuses to run as root.
            Some(lookup_user("postgres").or_else(|| lookup_user("nobody")).ok_or(
                "running as root, the test cluster needs a `postgres` or `nobody` user to run as",
            )?)
        } else {
            None
        };
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!("lease-pg-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(dir.join("sock"))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let cluster = Self {
            bindir,
            dir,
            run_as,
        };
        if let Some((uid, gid)) = run_as {
            for p in [cluster.dir.as_path(), &cluster.socket_dir()] {
                std::os::unix::fs::chown(p, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {}: {e}", p.display()))?;
            }
        }
        cluster.spawn_watchdog()?;
        cluster.run(
            "initdb",
            [
                OsStr::new("-D"),
                cluster.data_dir().as_os_str(),
                OsStr::new("-A"),
                OsStr::new("trust"),
                OsStr::new("-U"),
                OsStr::new("postgres"),
                OsStr::new("-E"),
                OsStr::new("UTF8"),
                OsStr::new("--locale=C"),
                OsStr::new("--no-sync"),
            ],
        )?;
        cluster.pg_ctl_start()?;
        Ok(cluster)
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join("sock")
    }

    fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(self.bindir.join(program));
        cmd.current_dir(&self.dir).stdin(Stdio::null());
        if let Some((uid, gid)) = self.run_as {
            cmd.uid(uid).gid(gid);
        }
        cmd
    }

    fn run<I, S>(&self, program: &str, args: I) -> Result<(), String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let out = self
            .command(program)
            .args(args)
            .output()
            .map_err(|e| format!("running {program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed ({}): {}{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        // Tests need no durability and run faster without it; benchmarks may ask for it.
        let durability = if durable() { "on" } else { "off" };
        let options = format!(
            "-c listen_addresses='' -k {} -p {PORT} -c fsync={durability} \
             -c synchronous_commit={durability} -c full_page_writes={durability} \
             -c max_connections=500",
            self.socket_dir().display()
        );
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data_dir().as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&options),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("60"),
                OsStr::new("start"),
            ],
        )
    }

    /// Stop the server (fast shutdown: connections are cut) and start it again; returns once
    /// it accepts connections.
    pub fn restart(&self) -> Result<(), String> {
        self.stop()?;
        self.pg_ctl_start()
    }

    /// Stop the server (fast shutdown).
    pub fn stop(&self) -> Result<(), String> {
        self.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data_dir().as_os_str(),
                OsStr::new("-m"),
                OsStr::new("fast"),
                OsStr::new("-w"),
                OsStr::new("stop"),
            ],
        )
    }

    /// Start the server after [`stop`](Self::stop).
    pub fn resume(&self) -> Result<(), String> {
        self.pg_ctl_start()
    }

    /// A process outside this one that stops the server and removes its directory once this
    /// process has exited (statics are never dropped, and a killed test runs no destructors).
    fn spawn_watchdog(&self) -> Result<(), String> {
        let script = r#"
            while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
            pidfile="$2/data/postmaster.pid"
            if [ -f "$pidfile" ]; then
                pg=$(head -n 1 "$pidfile")
                kill -INT "$pg" 2>/dev/null
                for _ in $(seq 1 40); do kill -0 "$pg" 2>/dev/null || break; sleep 0.25; done
                kill -KILL "$pg" 2>/dev/null
            fi
            rm -rf "$2"
        "#;
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .arg("lease-testdb-watchdog")
            .arg(std::process::id().to_string())
            .arg(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .map(drop)
            .map_err(|e| format!("starting the watchdog: {e}"))
    }
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

/// Server processes frozen with `SIGSTOP` (a server process that stops answering while the
/// server goes on accepting connections); they are resumed with `SIGCONT` when this is dropped,
/// however the test ends.
#[derive(Debug)]
pub struct Frozen {
    pids: Vec<i32>,
}

impl Frozen {
    /// Freeze the processes `pids` (the tests run as root, or as the server's user).
    ///
    /// # Panics
    ///
    /// If `kill` cannot be run or refuses.
    pub fn freeze(pids: Vec<i32>) -> Self {
        signal(&pids, "STOP");
        Self { pids }
    }

    /// The frozen processes.
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }

    /// Whether every frozen process is still stopped (state `T` in `/proc/<pid>/stat`).
    pub fn all_stopped(&self) -> bool {
        self.pids.iter().all(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().next())
                    == Some("T")
            })
        })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pids, "CONT");
    }
}

fn signal(pids: &[i32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(ToString::to_string))
        .status()
        .unwrap_or_else(|e| panic!("running kill: {e}"));
    assert!(status.success(), "kill -{signal} {pids:?} failed");
}

/// One server process serving a database, as `pg_stat_activity` shows it.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct Backend {
    /// Its process id.
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub pid: i32,
    /// `idle`, `active`, `idle in transaction`...
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub state: String,
    /// The last statement it ran (or runs).
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub query: String,
}

/// The server processes serving database `db`, but the one `admin` is connected to.
///
/// # Panics
///
/// If the query fails.
pub async fn backends(admin: &mut AsyncPgConnection, db: &str) -> Vec<Backend> {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(
        "SELECT pid, COALESCE(state, '') AS state, COALESCE(query, '') AS query \
           FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind::<diesel::sql_types::Text, _>(db)
    .load(admin)
    .await
    .unwrap_or_else(|e| panic!("reading pg_stat_activity: {e}"))
}
