//! A Postgres cluster of the tests' own: `initdb` in a temp directory, started with `pg_ctl`
//! from the system binaries, on a private unix socket and, on request, on a loopback TCP port
//! with TLS and an access policy of the test's choosing. It is stopped and its directory
//! removed when it is dropped, and by a watchdog process when the test process exits however
//! it exits (statics are never dropped, and a killed test runs no destructors).

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::bins;
use crate::certs::Issued;

/// The port of a cluster without TCP (its socket directory is private, so any port does).
const SOCKET_ONLY_PORT: u16 = 5432;

/// TLS on the server side.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server's certificate and key.
    pub server: Issued,
    /// The CA whose client certificates the server accepts (`ssl_ca_file`), if any.
    pub client_ca_pem: Option<String>,
}

/// How to start a cluster. The default is what the shared test server uses: unix socket
/// only, trust authentication, no durability.
#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// Listen on 127.0.0.1 as well, at a free port.
    pub tcp: bool,
    /// Serve TLS (`ssl = on`) with these certificates; implies `tcp`.
    pub tls: Option<ServerTls>,
    /// `pg_hba.conf`, replacing initdb's (which trusts every local and loopback connection).
    pub hba: Option<Vec<String>>,
    /// Settings appended to `postgresql.conf` (`name = value`, the value as SQL would quote
    /// it, e.g. `'on'`).
    pub settings: Vec<(String, String)>,
    /// `fsync`, `synchronous_commit` and `full_page_writes` on, as production runs.
    pub durable: bool,
    /// Run the server under libfaketime (Debian package `faketime`), so a test can step its
    /// wall clock with [`Cluster::set_clock_offset`]; its monotonic clock is left alone.
    pub fake_clock: bool,
}

/// How a standby's commits relate to the primary's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// The primary acknowledges a commit once the standby has it
    /// (`synchronous_standby_names` names the standby, `synchronous_commit = on`).
    Synchronous,
    /// The primary acknowledges commits the standby may not have yet, once they are flushed
    /// locally (`synchronous_commit = local`).
    Asynchronous,
}

/// A running cluster the tests own.
#[derive(Debug)]
pub struct Cluster {
    bindir: PathBuf,
    dir: PathBuf,
    /// The user the server runs as, when the tests run as root.
    run_as: Option<(u32, u32)>,
    port: u16,
    tcp: bool,
    /// The libfaketime library, when the server's clock can be stepped.
    faketime: Option<PathBuf>,
}

/// Where Debian's `libfaketime` puts the library.
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

static NEXT_CLUSTER: AtomicU32 = AtomicU32::new(0);

impl Cluster {
    /// Create and start a cluster.
    ///
    /// # Errors
    ///
    /// If the server binaries are missing (the message names the package) or a step fails.
    pub fn start(options: ClusterOptions) -> Result<Self, String> {
        let mut cluster = Self::prepare(options.tcp || options.tls.is_some())?;
        if options.fake_clock {
            let library = PathBuf::from(LIBFAKETIME);
            if !library.is_file() {
                return Err(format!(
                    "this test steps the server's clock with libfaketime ({LIBFAKETIME}): \
                     install the Debian/Ubuntu package `faketime` (`apt install faketime`; \
                     scripts/test.sh does it when run as root)"
                ));
            }
            cluster.faketime = Some(library);
            cluster.set_clock_offset(0)?;
        }
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
        cluster.configure(&options)?;
        cluster.start_on_its_port()?;
        Ok(cluster)
    }

    /// Start the server. A TCP port is found free before the server binds it, so another
    /// process (a parallel test, a client's ephemeral port) may take it meanwhile: when the
    /// server could not bind, start it again on another free port, up to 5 times. A failure
    /// says what the server logged.
    fn start_on_its_port(&mut self) -> Result<(), String> {
        let mut attempt = 1;
        loop {
            let Err(e) = self.pg_ctl_start() else {
                return Ok(());
            };
            let log = self.log();
            if !(self.tcp && attempt < 5 && log.contains("could not bind")) {
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                return Err(format!("{e}\nthe server's log ends:\n{}", tail.join("\n")));
            }
            attempt += 1;
            self.port = free_port()?;
            append(
                &self.data_dir().join("postgresql.conf"),
                &format!("port = {}", self.port),
            )?;
        }
    }

    /// A directory, a port and a watchdog for a cluster not created yet.
    fn prepare(tcp: bool) -> Result<Self, String> {
        let bindir = bins::postgres_bindir()?;
        let run_as = bins::run_as()?;
        let port = if tcp { free_port()? } else { SOCKET_ONLY_PORT };
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = NEXT_CLUSTER.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("lease-pg-{}-{n}-{stamp}", std::process::id()));
        std::fs::create_dir_all(dir.join("sock"))
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let cluster = Self {
            bindir,
            dir,
            run_as,
            port,
            tcp,
            faketime: None,
        };
        cluster.give(&cluster.dir)?;
        cluster.give(&cluster.socket_dir())?;
        spawn_watchdog(&cluster.dir, "data/postmaster.pid")?;
        Ok(cluster)
    }

    /// A streaming standby of this cluster (`pg_basebackup -R -X stream`), listening like
    /// this one (TCP or not) on a port of its own, caught up and streaming when this returns;
    /// with [`Replication::Synchronous`], this cluster waits for it on every commit.
    ///
    /// # Errors
    ///
    /// If a step fails, or the standby does not stream within 30 s.
    pub fn start_standby(&self, replication: Replication) -> Result<Self, String> {
        // As for a primary (`start_on_its_port`): a port taken before the standby bound it
        // means another standby, in a new directory on a new port.
        let mut attempt = 1;
        loop {
            let standby = Self::prepare(self.tcp)?;
            match standby.follow(self, replication) {
                Ok(()) => return Ok(standby),
                Err(_)
                    if standby.tcp && attempt < 5 && standby.log().contains("could not bind") =>
                {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Make this cluster, stopped or killed (an old primary after a failover), a streaming
    /// standby of `primary`, on the same port and directory, as an operator rebuilds a failed
    /// primary: its data is replaced by a fresh base backup of `primary`. Returns when it
    /// streams, as [`start_standby`](Self::start_standby) does.
    ///
    /// # Errors
    ///
    /// If the server is still running, a step fails, or it does not stream within 30 s.
    pub fn rejoin_as_standby(
        &self,
        primary: &Self,
        replication: Replication,
    ) -> Result<(), String> {
        if self.data_dir().join("postmaster.pid").exists() {
            return Err("rejoin_as_standby: stop or kill the server first".to_owned());
        }
        std::fs::remove_dir_all(self.data_dir())
            .map_err(|e| format!("removing {}: {e}", self.data_dir().display()))?;
        self.follow(primary, replication)
    }

    /// Fill this cluster's (absent) data directory with a base backup of `primary`, start it
    /// as its standby and wait until it streams.
    fn follow(&self, primary: &Self, replication: Replication) -> Result<(), String> {
        let standby = self;
        let name = format!("standby_{}", standby.port_or_dir_tag());
        standby.run(
            "pg_basebackup",
            [
                OsStr::new("-D"),
                standby.data_dir().as_os_str(),
                OsStr::new("-R"),
                OsStr::new("-X"),
                OsStr::new("stream"),
                OsStr::new("-c"),
                OsStr::new("fast"),
                OsStr::new("-h"),
                primary.socket_dir().as_os_str(),
                OsStr::new("-p"),
                OsStr::new(&primary.port.to_string()),
                OsStr::new("-U"),
                OsStr::new("postgres"),
            ],
        )?;
        // Later lines win: the copied configuration keeps the primary's settings, these
        // override where the standby differs.
        let listen = if standby.tcp { "127.0.0.1" } else { "" };
        append(
            &standby.data_dir().join("postgresql.conf"),
            &[
                format!("listen_addresses = '{listen}'"),
                format!("port = {}", standby.port),
                format!(
                    "unix_socket_directories = '{}'",
                    standby.socket_dir().display()
                ),
                // The walreceiver's application_name, which synchronous_standby_names names.
                format!("cluster_name = '{name}'"),
            ]
            .join("\n"),
        )?;
        standby.pg_ctl_start()?;
        match replication {
            Replication::Synchronous => {
                primary.psql(&format!(
                    "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
                ))?;
                // Test clusters run with synchronous_commit off, which waits for nobody.
                primary.psql("ALTER SYSTEM SET synchronous_commit = on")?;
            }
            Replication::Asynchronous => {
                // Commits flushed locally, as production runs: with the test clusters' `off`
                // the primary's WAL reaches the standby (which is sent only what is flushed)
                // seconds late, not the milliseconds of a real asynchronous standby.
                primary.psql("ALTER SYSTEM SET synchronous_commit = local")?;
            }
        }
        primary.psql("SELECT pg_reload_conf()")?;
        let wanted = match replication {
            Replication::Synchronous => "sync",
            Replication::Asynchronous => "async",
        };
        primary
            .wait_for(
                &format!(
                    "SELECT count(*) FROM pg_stat_replication \
                      WHERE application_name = '{name}' AND state = 'streaming' \
                        AND sync_state = '{wanted}'"
                ),
                "1",
                Duration::from_secs(30),
            )
            .map_err(|e| format!("the standby does not stream ({wanted}): {e}"))
    }

    fn port_or_dir_tag(&self) -> String {
        if self.tcp {
            self.port.to_string()
        } else {
            NEXT_CLUSTER.load(Ordering::SeqCst).to_string()
        }
    }

    /// Run `sql` with `psql` as `postgres` in database `postgres` over the unix socket;
    /// its output, unaligned, tuples only.
    ///
    /// # Errors
    ///
    /// If `psql` fails (the message has its output).
    pub fn psql(&self, sql: &str) -> Result<String, String> {
        self.psql_in("postgres", sql)
    }

    /// [`psql`](Self::psql) in database `db`.
    ///
    /// # Errors
    ///
    /// If `psql` fails (the message has its output).
    pub fn psql_in(&self, db: &str, sql: &str) -> Result<String, String> {
        let out = self
            .command("psql")
            .args([
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-U",
                "postgres",
                "-d",
            ])
            .arg(db)
            .arg("-h")
            .arg(self.socket_dir())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-c")
            .arg(sql)
            .output()
            .map_err(|e| format!("running psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
        } else {
            Err(format!(
                "psql {sql:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// Poll `sql` until it answers `expected`, at most `limit`.
    fn wait_for(&self, sql: &str, expected: &str, limit: Duration) -> Result<(), String> {
        let started = Instant::now();
        loop {
            let answer = self.psql(sql);
            if answer.as_deref() == Ok(expected) {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(format!(
                    "{sql} answered {answer:?}, not {expected:?}, for {limit:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop receiving the primary's WAL (a standby only): from now on what the primary
    /// commits is missing here, as after a network cut. With asynchronous replication the
    /// primary goes on acknowledging commits.
    ///
    /// # Errors
    ///
    /// If the setting cannot be changed or the receiver does not stop within 10 s.
    pub fn cut_replication(&self) -> Result<(), String> {
        append(
            &self.data_dir().join("postgresql.auto.conf"),
            "primary_conninfo = ''",
        )?;
        self.psql("SELECT pg_reload_conf()")?;
        self.wait_for(
            "SELECT count(*) FROM pg_stat_wal_receiver",
            "0",
            Duration::from_secs(10),
        )
    }

    /// Kill the server at once (`pg_ctl stop -m immediate`): no shutdown checkpoint, as a
    /// crash.
    ///
    /// # Errors
    ///
    /// If `pg_ctl` fails.
    pub fn kill(&self) -> Result<(), String> {
        self.pg_ctl_stop("immediate")
    }

    /// Promote a standby to primary (`pg_ctl promote -w`): returns once it accepts writes.
    ///
    /// # Errors
    ///
    /// If `pg_ctl` fails.
    pub fn promote(&self) -> Result<(), String> {
        self.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data_dir().as_os_str(),
                OsStr::new("-w"),
                OsStr::new("promote"),
            ],
        )
    }

    /// Make `path` the server user's (when the tests run as root).
    pub(crate) fn give(&self, path: &Path) -> Result<(), String> {
        match self.run_as {
            Some((uid, gid)) => std::os::unix::fs::chown(path, Some(uid), Some(gid))
                .map_err(|e| format!("chown {}: {e}", path.display())),
            None => Ok(()),
        }
    }

    fn configure(&self, options: &ClusterOptions) -> Result<(), String> {
        let durability = if options.durable { "on" } else { "off" };
        let listen = if self.tcp { "127.0.0.1" } else { "" };
        let mut conf = vec![
            format!("listen_addresses = '{listen}'"),
            format!("port = {}", self.port),
            format!(
                "unix_socket_directories = '{}'",
                self.socket_dir().display()
            ),
            format!("fsync = {durability}"),
            format!("synchronous_commit = {durability}"),
            format!("full_page_writes = {durability}"),
            "max_connections = 500".to_owned(),
        ];
        if let Some(tls) = &options.tls {
            let certs = self.dir.join("certs");
            std::fs::create_dir_all(&certs)
                .map_err(|e| format!("creating {}: {e}", certs.display()))?;
            self.give(&certs)?;
            let cert = crate::certs::write_private(&certs, "server.crt", &tls.server.cert_pem);
            let key = crate::certs::write_private(&certs, "server.key", &tls.server.key_pem);
            self.give(&cert)?;
            self.give(&key)?;
            conf.push("ssl = on".to_owned());
            conf.push(format!("ssl_cert_file = '{}'", cert.display()));
            conf.push(format!("ssl_key_file = '{}'", key.display()));
            if let Some(ca) = &tls.client_ca_pem {
                let ca = crate::certs::write_private(&certs, "client-ca.crt", ca);
                self.give(&ca)?;
                conf.push(format!("ssl_ca_file = '{}'", ca.display()));
            }
        }
        conf.extend(options.settings.iter().map(|(k, v)| format!("{k} = {v}")));
        append(&self.data_dir().join("postgresql.conf"), &conf.join("\n"))?;
        if let Some(hba) = &options.hba {
            let path = self.data_dir().join("pg_hba.conf");
            std::fs::write(&path, hba.join("\n") + "\n")
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        Ok(())
    }

    /// The cluster's directory (removed with the cluster): for files a test makes.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// The directory of the server's unix socket.
    pub fn socket_dir(&self) -> PathBuf {
        self.dir.join("sock")
    }

    /// The server's unix socket file.
    pub fn socket_file(&self) -> PathBuf {
        self.socket_dir().join(format!(".s.PGSQL.{}", self.port))
    }

    /// The port: of the TCP listener on 127.0.0.1 if the cluster has one, and of the socket.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A key-value connection string for database `db` as user `postgres`, through the unix
    /// socket (trusted whatever `pg_hba.conf` says about TCP, unless a test replaced it).
    pub fn socket_url(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.socket_dir().display(),
            self.port
        )
    }

    /// A URL for database `db` as `user` over TCP on 127.0.0.1, with `query` (e.g.
    /// `sslmode=require`) if not empty.
    ///
    /// # Panics
    ///
    /// If the cluster does not listen on TCP.
    pub fn tcp_url(&self, user: &str, db: &str, query: &str) -> String {
        assert!(self.tcp, "this cluster listens on its unix socket only");
        let mut url = format!("postgres://{user}@127.0.0.1:{}/{db}", self.port);
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// A URL naming several clusters' TCP listeners, in order, for database `db` as `user`
    /// (`postgres://user@127.0.0.1:p1,127.0.0.1:p2/db?query`): with
    /// `target_session_attrs=read-write` a client connects to whichever is the primary.
    ///
    /// # Panics
    ///
    /// If a cluster does not listen on TCP.
    pub fn multi_host_url(clusters: &[&Self], user: &str, db: &str, query: &str) -> String {
        let hosts: Vec<String> = clusters
            .iter()
            .map(|c| {
                assert!(c.tcp, "this cluster listens on its unix socket only");
                format!("127.0.0.1:{}", c.port)
            })
            .collect();
        let mut url = format!("postgres://{user}@{}/{db}", hosts.join(","));
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
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
        let mut command = self.command(program);
        Self::output(program, command.args(args))
    }

    fn output(program: &str, command: &mut Command) -> Result<(), String> {
        let out = command
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
        let log = self.dir.join("server.log");
        let mut command = self.command("pg_ctl");
        if let Some(library) = &self.faketime {
            // Read the offset file on every call, so a step takes effect at once; leave the
            // monotonic clock (timeouts, sleeps) real.
            command
                .env("LD_PRELOAD", library)
                .env("FAKETIME_TIMESTAMP_FILE", self.dir.join("faketime"))
                .env("FAKETIME_NO_CACHE", "1")
                .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
        }
        Self::output(
            "pg_ctl",
            command.args([
                OsStr::new("-D"),
                self.data_dir().as_os_str(),
                OsStr::new("-l"),
                log.as_os_str(),
                OsStr::new("-w"),
                OsStr::new("-t"),
                OsStr::new("60"),
                OsStr::new("start"),
            ]),
        )
    }

    /// Set the server's wall clock to real time plus `seconds` (negative: behind). Only for a
    /// cluster started with [`ClusterOptions::fake_clock`]; takes effect at the server's next
    /// reading of the clock.
    ///
    /// # Errors
    ///
    /// If the cluster's clock is real, or the offset file cannot be written.
    pub fn set_clock_offset(&self, seconds: i64) -> Result<(), String> {
        if self.faketime.is_none() {
            return Err("this cluster was not started with fake_clock".to_owned());
        }
        let path = self.dir.join("faketime");
        // Written whole and renamed into place, so the server never reads half a line.
        let staged = self.dir.join("faketime.new");
        std::fs::write(&staged, format!("{seconds:+}s\n"))
            .and_then(|()| std::fs::rename(&staged, &path))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        self.give(&path)
    }

    /// Stop the server (fast shutdown: connections are cut) and start it again; returns once
    /// it accepts connections.
    ///
    /// # Errors
    ///
    /// If `pg_ctl` fails.
    pub fn restart(&self) -> Result<(), String> {
        self.stop()?;
        self.pg_ctl_start()
    }

    /// Stop the server (fast shutdown).
    ///
    /// # Errors
    ///
    /// If `pg_ctl` fails.
    pub fn stop(&self) -> Result<(), String> {
        self.pg_ctl_stop("fast")
    }

    fn pg_ctl_stop(&self, mode: &str) -> Result<(), String> {
        self.run(
            "pg_ctl",
            [
                OsStr::new("-D"),
                self.data_dir().as_os_str(),
                OsStr::new("-m"),
                OsStr::new(mode),
                OsStr::new("-w"),
                OsStr::new("stop"),
            ],
        )
    }

    /// Start the server after [`stop`](Self::stop).
    ///
    /// # Errors
    ///
    /// If `pg_ctl` fails.
    pub fn resume(&self) -> Result<(), String> {
        self.pg_ctl_start()
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Nothing to report to: a server that will not stop is killed by the watchdog.
        self.pg_ctl_stop("immediate").ok();
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

fn append(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .and_then(|mut f| writeln!(f, "\n{text}"))
        .map_err(|e| format!("appending to {}: {e}", path.display()))
}

/// A TCP port on 127.0.0.1 nobody listens on right now.
pub(crate) fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("finding a free port: {e}"))
}

/// A process outside this one that, once this process has exited, kills the process whose
/// pid is in `dir/pidfile` (politely first) and removes `dir`.
pub(crate) fn spawn_watchdog(dir: &Path, pidfile: &str) -> Result<(), String> {
    let script = r#"
        while kill -0 "$1" 2>/dev/null; do sleep 0.5; done
        pidfile="$2/$3"
        if [ -f "$pidfile" ]; then
            pid=$(head -n 1 "$pidfile")
            kill -INT "$pid" 2>/dev/null
            for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
            kill -KILL "$pid" 2>/dev/null
        fi
        rm -rf "$2"
    "#;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("lease-testdb-watchdog")
        .arg(std::process::id().to_string())
        .arg(dir)
        .arg(pidfile)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .map(drop)
        .map_err(|e| format!("starting the watchdog: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A port taken between `free_port` and the server's start (here by a listener of this
    /// test) moves the server to another free port instead of failing the test that wanted a
    /// server.
    #[test]
    fn a_port_taken_before_the_server_binds_it_moves_the_server() {
        let mut cluster = Cluster::prepare(true).unwrap_or_else(|e| panic!("a cluster: {e}"));
        let taken = std::net::TcpListener::bind(("127.0.0.1", cluster.port))
            .expect("taking the cluster's port");
        let wanted = cluster.port;
        cluster
            .run(
                "initdb",
                [
                    OsStr::new("-D"),
                    cluster.data_dir().as_os_str(),
                    OsStr::new("-A"),
                    OsStr::new("trust"),
                    OsStr::new("-U"),
                    OsStr::new("postgres"),
                    OsStr::new("--no-sync"),
                ],
            )
            .unwrap_or_else(|e| panic!("initdb: {e}"));
        cluster
            .configure(&ClusterOptions {
                tcp: true,
                ..ClusterOptions::default()
            })
            .unwrap_or_else(|e| panic!("configuring: {e}"));
        cluster
            .start_on_its_port()
            .unwrap_or_else(|e| panic!("starting: {e}"));
        assert_ne!(
            cluster.port, wanted,
            "the server still wants the taken port"
        );
        assert!(
            cluster.log().contains("could not bind"),
            "{}",
            cluster.log()
        );
        assert_eq!(cluster.psql("SELECT 1").as_deref(), Ok("1"));
        drop(taken);
    }
}
