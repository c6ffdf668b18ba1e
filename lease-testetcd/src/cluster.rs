//! An etcd cluster of the tests' own: members started from the system's `etcd`, each on two
//! loopback ports (client and peer) with its data directory in one temp directory. Dropping
//! it kills every member and removes the directory; a watchdog process does the same when the
//! test process exits however it exits (statics are never dropped, and a killed test runs no
//! destructors).

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::http::{self, MemberStatus};
use crate::{bins, ports};

/// How long a cluster may take to have every member healthy and a leader.
const START_LIMIT: Duration = Duration::from_secs(60);
/// How long a restarted member may take to serve its peers.
const RESTART_LIMIT: Duration = Duration::from_secs(30);
/// How often conditions are polled.
const POLL: Duration = Duration::from_millis(20);
/// How many times a start is tried again on fresh ports when a port was taken meanwhile.
const START_ATTEMPTS: usize = 3;
/// Lines of each member's log in an error message.
const LOG_TAIL: usize = 12;

static NEXT_CLUSTER: AtomicU32 = AtomicU32::new(0);

/// Where clusters keep their data: `LEASE_TESTETCD_DIR` if set; else `/dev/shm` where it is a
/// writable directory (memory: etcd's fsyncs cost nothing there, as lease-testdb's servers run
/// with fsync off); else the temp directory.
pub fn data_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("LEASE_TESTETCD_DIR") {
        return dir.into();
    }
    let shm = Path::new("/dev/shm");
    let writable = shm
        .metadata()
        .is_ok_and(|m| m.is_dir() && !m.permissions().readonly());
    if writable {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// How to start a cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// How many members (3 for the fault tests: one may die, two may not).
    pub members: usize,
    /// `--heartbeat-interval`.
    pub heartbeat: Duration,
    /// `--election-timeout`: how long followers wait for the leader before electing another.
    /// It also sets the shortest lease etcd grants (see [`EtcdCluster::min_lease_ttl`]).
    pub election_timeout: Duration,
}

impl Default for EtcdOptions {
    /// Three members, heartbeat 50 ms, election timeout 500 ms: a dead leader is replaced in
    /// about 0.5-0.6 s, and leases of 1 s are granted as asked.
    fn default() -> Self {
        Self {
            members: 3,
            heartbeat: Duration::from_millis(50),
            election_timeout: Duration::from_millis(500),
        }
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    /// The running process; `None` once killed.
    process: Mutex<Option<Child>>,
}

impl Member {
    fn process(&self) -> MutexGuard<'_, Option<Child>> {
        self.process.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A running etcd cluster the tests own. Members are numbered from 0.
///
/// Every method blocks the calling thread (a few milliseconds for [`leader`](Self::leader);
/// up to its limit for [`wait_for_leader`](Self::wait_for_leader) and
/// [`restart`](Self::restart)). From a `#[tokio::test]`, use the multi-thread flavor or
/// `spawn_blocking`, so that the runtime's other tasks (keep-alives, workers) go on meanwhile.
///
/// [`kill`](Self::kill) and [`restart`](Self::restart) take `&mut self`: the process-wide
/// [`cluster`](crate::cluster) is shared by reference only, so no test can take its members
/// down under the others.
#[derive(Debug)]
pub struct EtcdCluster {
    etcd: PathBuf,
    dir: PathBuf,
    token: String,
    options: EtcdOptions,
    members: Vec<Member>,
}

/// Why a start failed: a port taken between choosing it and the member binding it is worth
/// another attempt on other ports; anything else is not.
enum StartError {
    PortTaken(String),
    Failed(String),
}

impl EtcdCluster {
    /// Start a cluster of `members` members with the default timings ([`EtcdOptions`]);
    /// returns once every member is healthy and all agree on a leader.
    ///
    /// # Errors
    ///
    /// If `etcd` is not installed (the message names the Debian package `etcd-server`), or
    /// the cluster is not ready within 60 s (the message has each member's state and the end
    /// of its log).
    pub fn start(members: usize) -> Result<Self, String> {
        Self::start_with(EtcdOptions {
            members,
            ..EtcdOptions::default()
        })
    }

    /// [`start`](Self::start) with other timings.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub fn start_with(options: EtcdOptions) -> Result<Self, String> {
        if options.members == 0 {
            return Err("an etcd cluster needs at least one member".to_owned());
        }
        if options.heartbeat.is_zero() || options.election_timeout < options.heartbeat * 5 {
            return Err(format!(
                "the election timeout ({:?}) must be at least 5 heartbeats ({:?})",
                options.election_timeout, options.heartbeat
            ));
        }
        let etcd = bins::etcd()?;
        let mut taken = Vec::new();
        for _ in 0..START_ATTEMPTS {
            match Self::try_start(&etcd, &options) {
                Ok(cluster) => return Ok(cluster),
                Err(StartError::PortTaken(e)) => taken.push(e),
                Err(StartError::Failed(e)) => return Err(e),
            }
        }
        Err(format!(
            "the etcd cluster did not start: a port was taken each of {START_ATTEMPTS} times:\n{}",
            taken.join("\n")
        ))
    }

    fn try_start(etcd: &Path, options: &EtcdOptions) -> Result<Self, StartError> {
        let failed = StartError::Failed;
        let stamp = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let n = NEXT_CLUSTER.fetch_add(1, Ordering::SeqCst);
        let token = format!("lease-{}-{n}-{stamp}", std::process::id());
        let dir = data_root().join(format!("lease-etcd-{}-{n}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| failed(format!("creating {}: {e}", dir.display())))?;
        if let Err(e) = spawn_watchdog(&dir) {
            std::fs::remove_dir_all(&dir).ok();
            return Err(failed(e));
        }
        let ports = match ports::free_ports(options.members * 2) {
            Ok(ports) => ports,
            Err(e) => {
                std::fs::remove_dir_all(&dir).ok();
                return Err(failed(e));
            }
        };
        let members = ports
            .chunks(2)
            .enumerate()
            .map(|(i, pair)| Member {
                name: format!("m{i}"),
                client_port: pair[0],
                peer_port: pair[1],
                process: Mutex::new(None),
            })
            .collect();
        // From here on, dropping `cluster` kills what was started and removes the directory.
        let cluster = Self {
            etcd: etcd.to_path_buf(),
            dir,
            token,
            options: options.clone(),
            members,
        };
        let deadline = Instant::now() + START_LIMIT;
        // One after the other, each once the one before serves its peers. Started together,
        // each new member first asks the others whether it is already part of the cluster,
        // and waits 1 s for each other member that listens but does not serve yet: 2 s more
        // for a cluster of three.
        for i in 0..cluster.members.len() {
            let child = cluster.spawn(i, "new").map_err(failed)?;
            *cluster.members[i].process() = Some(child);
            while cluster.is_running(i) && !http::serves_peers(cluster.members[i].peer_port) {
                if Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(POLL);
            }
        }
        loop {
            let exited: Vec<usize> = (0..cluster.members.len())
                .filter(|&i| !cluster.is_running(i))
                .collect();
            if !exited.is_empty() {
                let message = format!(
                    "etcd member(s) {exited:?} exited while the cluster started:\n{}",
                    cluster.describe()
                );
                let port_taken = exited
                    .iter()
                    .any(|&i| cluster.log(i).contains("address already in use"));
                return Err(if port_taken {
                    StartError::PortTaken(message)
                } else {
                    failed(message)
                });
            }
            // A leader every member names first (each member answers clients only once it
            // has joined), then etcd's own health check of each.
            if cluster.leader().is_some()
                && (0..cluster.members.len())
                    .all(|i| http::healthy(cluster.members[i].client_port) == Ok(true))
            {
                return Ok(cluster);
            }
            if Instant::now() > deadline {
                return Err(failed(format!(
                    "the etcd cluster was not ready (every member healthy, one leader) within \
                     {START_LIMIT:?}:\n{}",
                    cluster.describe()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Start member `i`'s process; its output is appended to its log.
    fn spawn(&self, i: usize, state: &str) -> Result<Child, String> {
        let member = &self.members[i];
        let log_path = self.log_path(i);
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let log_too = log
            .try_clone()
            .map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let initial_cluster: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect();
        let mut command = Command::new(&self.etcd);
        // etcd reads every flag from ETCD_<FLAG> too: none of the caller's may leak in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("ETCD_") {
                command.env_remove(key);
            }
        }
        command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(self.data_dir(i))
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster.join(",")])
            .args(["--initial-cluster-state", state])
            .args(["--initial-cluster-token", &self.token])
            .args([
                "--heartbeat-interval",
                &self.options.heartbeat.as_millis().to_string(),
            ])
            .args([
                "--election-timeout",
                &self.options.election_timeout.as_millis().to_string(),
            ])
            .args(["--snapshot-count", "10000"])
            .args(["--quota-backend-bytes", &(256u64 << 20).to_string()])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .args(["--log-level", "info"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_too);
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.etcd.display()))?;
        // For the watchdog; removed once the process is killed and reaped.
        let pid_path = self.pid_path(i);
        std::fs::write(&pid_path, format!("{}\n", child.id()))
            .map_err(|e| format!("writing {}: {e}", pid_path.display()))?;
        Ok(child)
    }

    /// How many members the cluster has (running or not).
    pub fn members(&self) -> usize {
        self.members.len()
    }

    /// The client URLs of every member, in order (killed ones too): what a client or an
    /// `etcd://` URL names.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// Member `i`'s client URL, `http://127.0.0.1:<port>`.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}", self.members[i].client_port)
    }

    /// The timings the cluster runs with.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    /// The shortest lease TTL this cluster grants: a grant asking for less gets this (etcd's
    /// `minTTL`, 1.5 election timeouts rounded up to whole seconds; 1 s with the defaults).
    pub fn min_lease_ttl(&self) -> Duration {
        min_lease_ttl(self.options.heartbeat, self.options.election_timeout)
    }

    /// Whether member `i`'s process is running (not killed, not exited by itself).
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn is_running(&self, i: usize) -> bool {
        match self.members[i].process().as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The process id of member `i`, while it runs.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.is_running(i)
            .then(|| self.members[i].process().as_ref().map(Child::id))
            .flatten()
    }

    /// What member `i` says about itself.
    ///
    /// # Errors
    ///
    /// If it does not answer (killed; started but not joined to a quorum with a leader yet) or
    /// answers something unexpected.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn status(&self, i: usize) -> Result<MemberStatus, String> {
        http::status(self.members[i].client_port).map_err(|e| format!("m{i}: {e}"))
    }

    /// What every member says about itself, asked all at once: `None` for a member that is
    /// not running, an error for one that does not answer (yet).
    pub fn statuses(&self) -> Vec<Option<Result<MemberStatus, String>>> {
        std::thread::scope(|scope| {
            let asking: Vec<_> = (0..self.members.len())
                .map(|i| {
                    self.is_running(i)
                        .then(|| scope.spawn(move || self.status(i)))
                })
                .collect();
            asking
                .into_iter()
                .enumerate()
                .map(|(i, asked)| {
                    asked.map(|handle| {
                        handle
                            .join()
                            .unwrap_or_else(|_| Err(format!("m{i}: asking panicked")))
                    })
                })
                .collect()
        })
    }

    /// The member every running member names as leader, if they all answer and all name the
    /// same one, and that one is running and names itself. `None` while an election is going
    /// on, while a survivor still names a killed leader, while a restarted member has not
    /// joined yet, and while a majority is down.
    pub fn leader(&self) -> Option<usize> {
        let mut leader = None;
        let mut ids = Vec::new();
        for (i, status) in self.statuses().into_iter().enumerate() {
            let Some(status) = status else { continue };
            let status = status.ok()?;
            let named = status.leader?;
            if leader.is_some_and(|l| l != named) {
                return None;
            }
            leader = Some(named);
            ids.push((i, status.member_id));
        }
        let leader = leader?;
        ids.into_iter()
            .find(|&(_, id)| id == leader)
            .map(|(i, _)| i)
    }

    /// Wait until [`leader`](Self::leader) names one, at most `limit`; returns it.
    ///
    /// # Errors
    ///
    /// If none is agreed on within `limit` (the message has each member's state and the end
    /// of its log).
    pub fn wait_for_leader(&self, limit: Duration) -> Result<usize, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(leader) = self.leader() {
                return Ok(leader);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the running etcd members agreed on no leader within {limit:?}:\n{}",
                    self.describe()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Kill member `i` with SIGKILL (no shutdown: as a crash or a power cut) and reap it.
    ///
    /// # Errors
    ///
    /// If it was killed already.
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn kill(&mut self, i: usize) -> Result<(), String> {
        let mut child = self.members[i]
            .process()
            .take()
            .ok_or_else(|| format!("member m{i} is not running"))?;
        // Fails only for a process already reaped, which is what is wanted.
        child.kill().ok();
        child
            .wait()
            .map_err(|e| format!("waiting for member m{i}: {e}"))?;
        std::fs::remove_file(self.pid_path(i)).ok();
        Ok(())
    }

    /// Start a killed member again, on its ports with its data directory
    /// (`--initial-cluster-state existing`); returns once it serves its peers (its raft node
    /// runs). It answers clients only once it has joined a quorum with a leader (etcd serves
    /// no client before it has published itself through raft): after restarting one of three
    /// killed members, it answers nobody until a second one is back. It catches up with the
    /// leader by itself. [`wait_for_leader`](Self::wait_for_leader) waits for all of that.
    ///
    /// # Errors
    ///
    /// If it is running, exits, or does not serve its peers within 30 s (the message has the
    /// end of its log).
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        if self.is_running(i) {
            return Err(format!("member m{i} is running: kill it first"));
        }
        // A member that exited by itself is reaped here.
        if let Some(mut old) = self.members[i].process().take() {
            old.wait().ok();
        }
        let child = self.spawn(i, "existing")?;
        *self.members[i].process() = Some(child);
        let deadline = Instant::now() + RESTART_LIMIT;
        loop {
            if !self.is_running(i) {
                return Err(format!(
                    "member m{i} exited after its restart:\n{}",
                    self.describe()
                ));
            }
            if http::serves_peers(self.members[i].peer_port) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "member m{i} did not serve its peers within {RESTART_LIMIT:?} of its \
                     restart:\n{}",
                    self.describe()
                ));
            }
            std::thread::sleep(POLL);
        }
    }

    /// The cluster's directory (removed with it): one `m<i>` data directory, `m<i>.log` and
    /// `m<i>.pid` per member.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Member `i`'s log so far, over all its runs (for a failing test's message).
    ///
    /// # Panics
    ///
    /// If there is no member `i`.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.log_path(i)).unwrap_or_default()
    }

    /// Every member's state (running, its status) and the end of its log.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let statuses = self.statuses();
        for ((i, member), status) in self.members.iter().enumerate().zip(statuses) {
            let state = if let Some(status) = status {
                match status {
                    Ok(s) => format!(
                        "running, member id {}, leader {}, term {}, applied index {}{}",
                        s.member_id,
                        s.leader.map_or("none".to_owned(), |l| l.to_string()),
                        s.raft_term,
                        s.raft_applied_index,
                        if s.errors.is_empty() {
                            String::new()
                        } else {
                            format!(", errors {:?}", s.errors)
                        }
                    ),
                    Err(e) => format!("running, not answering clients: {e}"),
                }
            } else {
                match member.process().as_mut().map(Child::try_wait) {
                    Some(Ok(Some(status))) => format!("exited: {status}"),
                    _ => "killed".to_owned(),
                }
            };
            let log = self.log(i);
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n    ");
            out.push_str(&format!(
                "  m{i} (client {}, peer {}): {state}\n    {tail}\n",
                member.client_port, member.peer_port
            ));
        }
        out
    }

    fn data_dir(&self, i: usize) -> PathBuf {
        self.dir.join(&self.members[i].name)
    }

    fn log_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.log", self.members[i].name))
    }

    fn pid_path(&self, i: usize) -> PathBuf {
        self.dir.join(format!("{}.pid", self.members[i].name))
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            let process = member
                .process
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(mut child) = process.take() {
                child.kill().ok();
                child.wait().ok();
            }
        }
        // The watchdog sees the directory gone and exits.
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// etcd's `minTTL` (etcdserver/server.go): 1.5 election timeouts, counted in whole heartbeat
/// ticks, rounded up to whole seconds.
fn min_lease_ttl(heartbeat: Duration, election_timeout: Duration) -> Duration {
    let heartbeat = heartbeat.as_millis().max(1);
    let ticks = election_timeout.as_millis() / heartbeat;
    let min_ms = (3 * ticks / 2) * heartbeat;
    Duration::from_secs(u64::try_from(min_ms.div_ceil(1000)).unwrap_or(u64::MAX))
}

/// A process outside this one that, once this process has exited, kills every process whose
/// pid is in `dir/*.pid` and removes `dir`. It exits by itself when `dir` is removed (the
/// cluster was dropped). A killed member's parent is gone by then, so it may stay a zombie
/// until init reaps it: that counts as gone.
fn spawn_watchdog(dir: &Path) -> Result<(), String> {
    let script = r#"
        while kill -0 "$1" 2>/dev/null && [ -d "$2" ]; do sleep 0.5; done
        [ -d "$2" ] || exit 0
        for f in "$2"/*.pid; do
            [ -f "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null
        done
        for f in "$2"/*.pid; do
            [ -f "$f" ] || continue
            pid=$(cat "$f")
            for _ in $(seq 1 100); do
                state=$(sed -n 's/^.*) \(.\).*$/\1/p' "/proc/$pid/stat" 2>/dev/null)
                if [ -z "$state" ] || [ "$state" = Z ]; then break; fi
                sleep 0.05
            done
        done
        rm -rf "$2"
    "#;
    use std::os::unix::process::CommandExt;
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("lease-testetcd-watchdog")
        .arg(std::process::id().to_string())
        .arg(dir)
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

    #[test]
    fn the_shortest_lease_follows_the_election_timeout() {
        let ms = Duration::from_millis;
        // What etcd 3.4.23 granted for a 1 s lease with these timings.
        assert_eq!(min_lease_ttl(ms(50), ms(500)), Duration::from_secs(1));
        assert_eq!(min_lease_ttl(ms(100), ms(1000)), Duration::from_secs(2));
        assert_eq!(min_lease_ttl(ms(100), ms(2000)), Duration::from_secs(3));
    }
}
