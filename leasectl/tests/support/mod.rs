//! Running `leasectl worker --json` processes and reading their event streams.

#![allow(dead_code)] // each test binary uses its own subset

pub mod children;
pub mod pool;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease::audit::OwnershipLog;
use lease::{Assignment, Bucket, FencingToken, NodeId, OwnershipEvent, RevokeReason, ShardCount};
use serde_json::Value;

/// A process that is killed if the test fails before it exited: a failed test must not leave
/// a worker running.
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            self.0.kill().ok();
            self.0.wait().ok();
        }
    }
}

/// A loopback port nobody listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The binary under test.
pub fn leasectl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasectl"))
}

/// `leasectl args`, on `url` if given, logging nothing.
pub fn command(args: &[&str], url: Option<&str>) -> Command {
    let mut cmd = leasectl();
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env("LEASE_LOG", "off");
    if let Some(url) = url {
        cmd.env("DATABASE_URL", url);
    }
    cmd
}

/// Runs `leasectl args` on `url`: its exit code, stdout and stderr.
pub fn run(args: &[&str], url: Option<&str>) -> (i32, String, String) {
    let out = command(args, url).output().expect("running leasectl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// One line of `leasectl worker --json`, checked against the documented format.
#[derive(Clone, Debug)]
pub struct Event {
    pub event: String,
    pub group: String,
    pub worker: NodeId,
    pub bucket: Option<u32>,
    pub token: Option<i64>,
    /// An assignment's bucket's shard count.
    pub shards: Option<u32>,
    /// An assignment's parents (old buckets sharing its keys, after a resize).
    pub parents: Option<Vec<u32>>,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub at: DateTime<Utc>,
}

/// Parse one line, insisting on the exact documented shape.
pub fn parse_event(line: &str) -> Result<Event, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not JSON ({e}): {line}"))?;
    let obj = v
        .as_object()
        .ok_or_else(|| format!("not an object: {line}"))?;
    let text = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| format!("missing string {k:?}: {line}"))
    };
    let event = text("event")?;
    let at_text = text("at")?;
    // RFC 3339, UTC, with microseconds: 2026-01-02T03:04:05.123456Z
    let well_formed =
        at_text.len() == 27 && at_text.ends_with('Z') && at_text.as_bytes().get(19) == Some(&b'.');
    if !well_formed {
        return Err(format!(
            "\"at\" is not RFC 3339 UTC with microseconds: {line}"
        ));
    }
    let at = DateTime::parse_from_rfc3339(&at_text)
        .map_err(|e| format!("bad time ({e}): {line}"))?
        .with_timezone(&Utc);
    let worker: NodeId = text("worker")?
        .parse()
        .map_err(|e| format!("bad worker ({e}): {line}"))?;
    let expected: &[&str] = match event.as_str() {
        "started" | "stopped" => &["event", "group", "worker", "at"],
        "assigned" => &[
            "event", "group", "worker", "bucket", "token", "shards", "parents", "at",
        ],
        "revoked" => &[
            "event", "group", "worker", "bucket", "token", "reason", "at",
        ],
        "error" => &["event", "group", "worker", "message", "at"],
        other => return Err(format!("unknown event {other:?}: {line}")),
    };
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    if keys != expected {
        return Err(format!("fields {keys:?}, expected {expected:?}: {line}"));
    }
    let int = |k: &str| obj.get(k).and_then(Value::as_i64);
    let reason = obj.get("reason").and_then(Value::as_str).map(str::to_owned);
    if let Some(r) = &reason
        && ![
            "shed",
            "lost",
            "fenced",
            "expired",
            "shutdown",
            "resharded",
            "drained",
            "quarantined",
        ]
        .contains(&r.as_str())
    {
        return Err(format!("unknown reason {r:?}: {line}"));
    }
    let shards = match obj.get("shards") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("\"shards\" is not a shard count: {line}"))?,
        ),
    };
    let parents = match obj.get("parents") {
        None => None,
        Some(v) => Some(
            v.as_array()
                .and_then(|a| {
                    a.iter()
                        .map(|b| b.as_u64().and_then(|b| u32::try_from(b).ok()))
                        .collect::<Option<Vec<u32>>>()
                })
                .ok_or_else(|| format!("\"parents\" is not an array of buckets: {line}"))?,
        ),
    };
    Ok(Event {
        event,
        shards,
        parents,
        group: text("group")?,
        worker,
        bucket: int("bucket").and_then(|b| u32::try_from(b).ok()),
        token: int("token"),
        reason,
        message: obj
            .get("message")
            .and_then(Value::as_str)
            .map(str::to_owned),
        at,
    })
}

#[derive(Default)]
struct Stream {
    events: Vec<Event>,
    bad_lines: Vec<String>,
    closed: bool,
    stderr: Vec<String>,
    stderr_closed: bool,
}

/// A `leasectl worker --json` process and everything it printed so far.
pub struct WorkerProcess {
    pub name: String,
    child: Child,
    stream: Arc<Mutex<Stream>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl WorkerProcess {
    /// Start `leasectl worker --json` on `url` with the given flags.
    pub fn spawn(name: &str, url: &str, group: &str, shards: u32, ttl: &str, renew: &str) -> Self {
        Self::spawn_with(name, url, group, shards, ttl, renew, &[])
    }

    /// [`spawn`](Self::spawn) with more flags.
    pub fn spawn_with(
        name: &str,
        url: &str,
        group: &str,
        shards: u32,
        ttl: &str,
        renew: &str,
        extra: &[&str],
    ) -> Self {
        let shards = shards.to_string();
        let flags = ["--group", group, "--shards", &shards];
        Self::spawn_flags(name, url, &flags, ttl, renew, extra)
    }

    /// Start `leasectl worker --json` in several groups at once (`--group NAME:SHARDS` each):
    /// one process, one session. Its events carry their group; read what it owns per group
    /// ([`owned_in`](Self::owned_in)).
    pub fn spawn_groups(
        name: &str,
        url: &str,
        groups: &[(&str, u32)],
        ttl: &str,
        renew: &str,
        extra: &[&str],
    ) -> Self {
        let values: Vec<String> = groups.iter().map(|(g, n)| format!("{g}:{n}")).collect();
        let flags: Vec<&str> = values
            .iter()
            .flat_map(|v| ["--group", v.as_str()])
            .collect();
        Self::spawn_flags(name, url, &flags, ttl, renew, extra)
    }

    fn spawn_flags(
        name: &str,
        url: &str,
        groups: &[&str],
        ttl: &str,
        renew: &str,
        extra: &[&str],
    ) -> Self {
        let mut cmd = worker_command(url, groups, ttl, renew, extra);
        cmd.stderr(Stdio::piped());
        Self::spawn_command(name, cmd)
    }

    /// Start `cmd`, a `leasectl worker --json` (see [`worker_command`]), reading its stdout and,
    /// if it is piped, its stderr; a stderr sent elsewhere reads as closed at once.
    pub fn spawn_command(name: &str, mut cmd: Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning leasectl worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let stream = Arc::new(Mutex::new(Stream::default()));
        match child.stderr.take() {
            Some(stderr) => {
                // Kept for the test to read, and passed on so a failing test shows what it
                // said.
                let sink = stream.clone();
                let label = name.to_owned();
                std::thread::spawn(move || {
                    for line in BufReader::new(stderr).lines() {
                        let Ok(line) = line else { break };
                        eprintln!("[{label}] {line}");
                        lock(&sink).stderr.push(line);
                    }
                    lock(&sink).stderr_closed = true;
                });
            }
            None => lock(&stream).stderr_closed = true,
        }
        let sink = stream.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut s = lock(&sink);
                match parse_event(&line) {
                    Ok(e) => s.events.push(e),
                    Err(bad) => s.bad_lines.push(bad),
                }
            }
            lock(&sink).closed = true;
        });
        Self {
            name: name.to_owned(),
            child,
            stream,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn events(&self) -> Vec<Event> {
        lock(&self.stream).events.clone()
    }

    pub fn bad_lines(&self) -> Vec<String> {
        lock(&self.stream).bad_lines.clone()
    }

    /// What the process wrote on stderr so far, line by line.
    pub fn stderr(&self) -> Vec<String> {
        lock(&self.stream).stderr.clone()
    }

    /// The node id, once the process announced itself.
    pub fn worker(&self) -> Option<NodeId> {
        lock(&self.stream)
            .events
            .iter()
            .find(|e| e.event == "started")
            .map(|e| e.worker)
    }

    /// The node id, waiting at most `limit` for the process to announce itself.
    pub fn worker_within(&self, limit: Duration) -> NodeId {
        wait_for(&format!("{} to start", self.name), limit, || {
            self.worker().is_some()
        });
        self.worker().expect("announced")
    }

    /// What the worker's events say it owns now: bucket -> token (a worker in one group).
    pub fn owned(&self) -> BTreeMap<u32, i64> {
        owned_by(&lock(&self.stream).events)
    }

    /// What the worker's events of `group` say it owns there now: bucket -> token.
    pub fn owned_in(&self, group: &str) -> BTreeMap<u32, i64> {
        owned_by(&events_of(&lock(&self.stream).events, group))
    }

    /// The events of `group`.
    pub fn events_in(&self, group: &str) -> Vec<Event> {
        events_of(&lock(&self.stream).events, group)
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{signal} {} failed", self.pid());
    }

    /// Wait for the process to exit, at most `limit`.
    pub fn wait(&mut self, limit: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                // Let the readers drain what is left.
                let drained = Instant::now();
                let done = |s: &Stream| s.closed && s.stderr_closed;
                while !done(&lock(&self.stream)) && drained.elapsed() < Duration::from_secs(5) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "{} did not exit within {limit:?}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // A test that failed half-way must not leave workers running (SIGKILL also ends a
        // stopped process); errors mean it already exited.
        if self.child.try_wait().ok().flatten().is_none() {
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// `leasectl worker --json` on `url` with these `--group` flags and more, logging errors only;
/// its stdio is for the caller (or [`WorkerProcess::spawn_command`]) to set.
pub fn worker_command(
    url: &str,
    groups: &[&str],
    ttl: &str,
    renew: &str,
    extra: &[&str],
) -> Command {
    let mut cmd = leasectl();
    cmd.args(["worker", "--json"])
        .args(groups)
        .args(["--ttl", ttl, "--renew", renew])
        .args(extra)
        .env("DATABASE_URL", url)
        .env("LEASE_LOG", "error");
    cmd
}

/// The events of `group`, in order.
pub fn events_of(events: &[Event], group: &str) -> Vec<Event> {
    events
        .iter()
        .filter(|e| e.group == group)
        .cloned()
        .collect()
}

/// One node as `leasectl status --json` (without `--group`) lists it.
#[derive(Clone, Debug)]
pub struct NodeStatus {
    pub node: NodeId,
    pub session: String,
    pub expires_at: DateTime<Utc>,
    pub live: bool,
    pub metadata: String,
    pub groups: Vec<String>,
}

/// Parse `leasectl status --json` without `--group`, insisting on the documented shape:
/// `{"observed_at","nodes":[{"node","session","started_at","heartbeat_at","expires_at","live",
/// "metadata","groups","handed_over","crossed"}]}` (`crossed`: null, or how the session came
/// through the last failover, a string).
pub fn parse_nodes_status(text: &str) -> Result<Vec<NodeStatus>, String> {
    let v: Value =
        serde_json::from_str(text.trim()).map_err(|e| format!("not JSON ({e}): {text}"))?;
    let keys: Vec<&str> = v
        .as_object()
        .ok_or_else(|| format!("not an object: {text}"))?
        .keys()
        .map(String::as_str)
        .collect();
    if keys != ["observed_at", "nodes"] {
        return Err(format!("fields {keys:?}: {text}"));
    }
    let time = |n: &Value, k: &str| {
        n[k].as_str()
            .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
            .map(|t| t.with_timezone(&Utc))
            .ok_or_else(|| format!("{k:?} is not a time: {n}"))
    };
    v["nodes"]
        .as_array()
        .ok_or_else(|| format!("\"nodes\" is not an array: {text}"))?
        .iter()
        .map(|n| {
            let keys: Vec<&str> = n
                .as_object()
                .ok_or_else(|| format!("a node is not an object: {n}"))?
                .keys()
                .map(String::as_str)
                .collect();
            let expected = [
                "node",
                "session",
                "started_at",
                "heartbeat_at",
                "expires_at",
                "live",
                "metadata",
                "groups",
                "handed_over",
                "crossed",
            ];
            if keys != expected {
                return Err(format!("node fields {keys:?}, expected {expected:?}: {n}"));
            }
            if !(n["crossed"].is_null() || n["crossed"].is_string()) {
                return Err(format!("bad crossed: {n}"));
            }
            time(n, "started_at")?;
            time(n, "heartbeat_at")?;
            Ok(NodeStatus {
                node: n["node"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| format!("bad node id: {n}"))?,
                session: n["session"].as_str().unwrap_or_default().to_owned(),
                expires_at: time(n, "expires_at")?,
                live: n["live"]
                    .as_bool()
                    .ok_or_else(|| format!("bad live: {n}"))?,
                metadata: n["metadata"].as_str().unwrap_or_default().to_owned(),
                groups: n["groups"]
                    .as_array()
                    .ok_or_else(|| format!("bad groups: {n}"))?
                    .iter()
                    .map(|g| g.as_str().map(str::to_owned))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| format!("a group is not a string: {n}"))?,
            })
        })
        .collect()
}

/// What a list of events says is owned at the end: bucket -> token.
pub fn owned_by(events: &[Event]) -> BTreeMap<u32, i64> {
    let mut owned = BTreeMap::new();
    for e in events {
        match (e.event.as_str(), e.bucket, e.token) {
            ("assigned", Some(b), Some(t)) => {
                owned.insert(b, t);
            }
            ("revoked", Some(b), _) => {
                owned.remove(&b);
            }
            _ => {}
        }
    }
    owned
}

/// Poll `cond` every 10 ms until it holds; panic with `what` after `limit`.
pub fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// Record a process's `assigned` and `revoked` events in `log` under `label` (a process's own
/// label, so that two processes given one node id stay apart).
pub fn record(log: &mut OwnershipLog<DateTime<Utc>>, label: NodeId, events: &[Event]) {
    for e in events {
        let (Some(bucket), Some(token)) = (e.bucket, e.token) else {
            continue;
        };
        let (bucket, token) = (Bucket(bucket), FencingToken(token));
        let event = match (e.event.as_str(), e.reason.as_deref()) {
            ("assigned", _) => {
                let shards = e
                    .shards
                    .and_then(|n| ShardCount::new(n).ok())
                    .expect("parse_event insists on an assignment's shard count");
                // The log judges keys by each bucket's shard count; the count it was resized
                // from is not in the event (its parents are), nor needed.
                OwnershipEvent::Assigned(Assignment {
                    bucket,
                    token,
                    shards,
                    resized_from: None,
                })
            }
            ("revoked", Some(reason)) => OwnershipEvent::Revoked {
                bucket,
                token,
                reason: reason_of(reason),
            },
            _ => continue,
        };
        log.record(label, event, e.at);
    }
}

/// A revocation reason as `leasectl worker --json` prints it.
pub fn reason_of(text: &str) -> RevokeReason {
    match text {
        "shed" => RevokeReason::Shed,
        "lost" => RevokeReason::Lost,
        "fenced" => RevokeReason::Fenced,
        "expired" => RevokeReason::Expired,
        "shutdown" => RevokeReason::Shutdown,
        "resharded" => RevokeReason::Resharded,
        "drained" => RevokeReason::Drained,
        "quarantined" => RevokeReason::Quarantined,
        other => panic!("unknown revocation reason {other:?}"),
    }
}

/// A TCP proxy to the test server that can be frozen: while frozen it forwards nothing either
/// way (what it read is held, not lost) and new connections get no answer, like a network
/// that silently drops every packet. Connect through [`url`](Self::url). Runs on the test's
/// tokio runtime.
pub struct FreezableProxy {
    /// A connection URL for the database, through the proxy.
    pub url: String,
    frozen: tokio::sync::watch::Sender<bool>,
}

/// Where the proxy connects to.
#[derive(Clone)]
enum Upstream {
    Unix(std::path::PathBuf),
    Tcp(String),
}

impl FreezableProxy {
    /// A proxy to `db`, forwarding.
    pub async fn start(db: &lease_testdb::TestDb) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let (upstream, url) = match lease_testdb::server() {
            lease_testdb::Server::Own(cluster) => (
                Upstream::Unix(cluster.socket_file()),
                format!(
                    "host=127.0.0.1 port={port} user=postgres dbname={}",
                    db.name
                ),
            ),
            lease_testdb::Server::External { .. } => through_port(&db.url, port),
        };
        let (frozen, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (upstream, watch) = (upstream.clone(), watch.clone());
                tokio::spawn(async move {
                    match upstream {
                        Upstream::Unix(path) => {
                            if let Ok(server) = tokio::net::UnixStream::connect(path).await {
                                splice(client, server, watch).await;
                            }
                        }
                        Upstream::Tcp(addr) => {
                            if let Ok(server) = tokio::net::TcpStream::connect(addr).await {
                                splice(client, server, watch).await;
                            }
                        }
                    }
                });
            }
        });
        Self { url, frozen }
    }

    /// Stop forwarding, in both directions, on every connection.
    pub fn freeze(&self) {
        self.frozen.send_replace(true);
    }

    /// Forward again, what was held first.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }
}

/// Where `url` (a `postgres://` URL or `key=value` pairs) leads, and `url` with its host and
/// port replaced by 127.0.0.1 and `port`.
fn through_port(url: &str, port: u16) -> (Upstream, String) {
    if let Some(rest) = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        let scheme = &url[..url.len() - rest.len()];
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        let (user, hostport) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        assert!(
            !hostport.contains(',') && !hostport.starts_with('['),
            "the proxy handles one IPv4 or named host in DATABASE_URL, not {hostport:?}"
        );
        let upstream = if hostport.contains(':') {
            hostport.to_owned()
        } else {
            format!("{hostport}:5432")
        };
        (
            Upstream::Tcp(upstream),
            format!("{scheme}{user}127.0.0.1:{port}{tail}"),
        )
    } else {
        let mut host = "localhost".to_owned();
        let mut upstream_port = "5432".to_owned();
        let mut kept = Vec::new();
        for pair in url.split_whitespace() {
            match pair.split_once('=') {
                Some(("host", h)) => host = h.to_owned(),
                Some(("port", p)) => upstream_port = p.to_owned(),
                _ => kept.push(pair),
            }
        }
        let upstream = if host.starts_with('/') {
            Upstream::Unix(std::path::Path::new(&host).join(format!(".s.PGSQL.{upstream_port}")))
        } else {
            Upstream::Tcp(format!("{host}:{upstream_port}"))
        };
        (
            upstream,
            format!("host=127.0.0.1 port={port} {}", kept.join(" ")),
        )
    }
}

/// Forward between `client` and `server` until either side closes, holding data while frozen.
async fn splice<S>(
    client: tokio::net::TcpStream,
    server: S,
    frozen: tokio::sync::watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + 'static,
{
    let (client_read, client_write) = tokio::io::split(client);
    let (server_read, server_write) = tokio::io::split(server);
    tokio::join!(
        forward(client_read, server_write, frozen.clone()),
        forward(server_read, client_write, frozen),
    );
}

async fn forward(
    mut from: impl tokio::io::AsyncRead + Unpin,
    mut to: impl tokio::io::AsyncWrite + Unpin,
    mut frozen: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    to.shutdown().await.ok();
}
