//! PgBouncer in front of a test cluster, started from the system's `pgbouncer` (Debian
//! package `pgbouncer`), listening on a free loopback port. Stopped when dropped, and by a
//! watchdog when the test process exits.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bins;
use crate::cluster::{Cluster, free_port, spawn_watchdog};

/// How PgBouncer hands server connections to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolMode {
    /// A server connection per client connection, for the client's whole session.
    Session,
    /// A server connection per transaction: session state (`LISTEN`, prepared statements
    /// before PgBouncer 1.21, `SET`) does not survive from one transaction to the next.
    Transaction,
}

impl PoolMode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Transaction => "transaction",
        }
    }
}

/// A running PgBouncer.
#[derive(Debug)]
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Start PgBouncer in `mode` in front of `upstream` (through its unix socket), every
    /// database passed through, trusting the users `users` (PgBouncer needs them listed even
    /// when it trusts them).
    ///
    /// # Errors
    ///
    /// If `pgbouncer` is not installed (the message names the package) or does not start.
    pub fn start(upstream: &Cluster, mode: PoolMode, users: &[&str]) -> Result<Self, String> {
        Self::start_with_pool_size(upstream, mode, users, 40)
    }

    /// [`start`](Self::start), with at most `pool_size` server connections per database and
    /// user: more clients than that wait in PgBouncer's queue and share them.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with_pool_size(
        upstream: &Cluster,
        mode: PoolMode,
        users: &[&str],
        pool_size: u32,
    ) -> Result<Self, String> {
        let program = bins::program("pgbouncer", "pgbouncer")?;
        let run_as = bins::run_as()?;
        let port = free_port()?;
        let dir = upstream.dir().join(format!("pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        upstream.give(&dir)?;
        let userlist: String = users.iter().map(|u| format!("\"{u}\" \"\"\n")).collect();
        std::fs::write(dir.join("userlist.txt"), userlist)
            .map_err(|e| format!("writing the user list: {e}"))?;
        let ini = format!(
            "[databases]\n\
             * = host={socket} port={upstream_port}\n\
             [pgbouncer]\n\
             listen_addr = 127.0.0.1\n\
             listen_port = {port}\n\
             unix_socket_dir =\n\
             auth_type = trust\n\
             auth_file = {dir}/userlist.txt\n\
             pool_mode = {mode}\n\
             max_client_conn = 1000\n\
             default_pool_size = {pool_size}\n\
             max_db_connections = 100\n\
             ignore_startup_parameters = extra_float_digits,options\n\
             pidfile = {dir}/pgbouncer.pid\n\
             logfile = {dir}/pgbouncer.log\n",
            socket = upstream.socket_dir().display(),
            upstream_port = upstream.port(),
            dir = dir.display(),
            mode = mode.as_str(),
        );
        let config = dir.join("pgbouncer.ini");
        std::fs::write(&config, ini).map_err(|e| format!("writing {}: {e}", config.display()))?;
        for file in ["userlist.txt", "pgbouncer.ini"] {
            upstream.give(&dir.join(file))?;
        }
        spawn_watchdog(&dir, "pgbouncer.pid")?;
        let mut command = Command::new(program);
        command
            .arg(&config)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((uid, gid)) = run_as {
            // PgBouncer refuses to run as root.
            command.uid(uid).gid(gid);
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting pgbouncer: {e}"))?;
        let bouncer = Self { child, dir, port };
        bouncer.wait_until_listening()?;
        Ok(bouncer)
    }

    fn wait_until_listening(&self) -> Result<(), String> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!(
            "pgbouncer did not listen on port {} within 10 s: {}",
            self.port,
            self.log()
        ))
    }

    /// The port it listens on, on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for database `db` as `user` through PgBouncer, with `query` if not empty.
    pub fn url(&self, user: &str, db: &str, query: &str) -> String {
        let mut url = format!("postgres://{user}@127.0.0.1:{}/{db}", self.port);
        if !query.is_empty() {
            url.push('?');
            url.push_str(query);
        }
        url
    }

    /// Its log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("pgbouncer.log")).unwrap_or_default()
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        // Killing an already exited child fails harmlessly.
        self.child.kill().ok();
        self.child.wait().ok();
    }
}
