//! Running `leasectl worker --json` processes and reading their event streams.

#![allow(dead_code)] // each test binary uses its own subset

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease::ownership_log::OwnershipLog;
use lease::{Bucket, FencingToken, OwnershipEvent, RevokeReason, WorkerId};
use serde_json::Value;

/// The binary under test.
pub fn leasectl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasectl"))
}

/// One line of `leasectl worker --json`, checked against the documented format.
#[derive(Clone, Debug)]
pub struct Event {
    pub event: String,
    pub group: String,
    pub worker: WorkerId,
    pub bucket: Option<u32>,
    pub token: Option<i64>,
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
    let worker: WorkerId = text("worker")?
        .parse()
        .map_err(|e| format!("bad worker ({e}): {line}"))?;
    let expected: &[&str] = match event.as_str() {
        "started" | "stopped" => &["event", "group", "worker", "at"],
        "assigned" => &["event", "group", "worker", "bucket", "token", "at"],
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
        && !["shed", "lost", "expired", "shutdown"].contains(&r.as_str())
    {
        return Err(format!("unknown reason {r:?}: {line}"));
    }
    Ok(Event {
        event,
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
        let mut child = leasectl()
            .args([
                "worker",
                "--json",
                "--group",
                group,
                "--shards",
                &shards.to_string(),
                "--ttl",
                ttl,
                "--renew",
                renew,
            ])
            .args(extra)
            .env("DATABASE_URL", url)
            .env("LEASE_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning leasectl worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let stream = Arc::new(Mutex::new(Stream::default()));
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

    /// The worker id, once the process announced itself.
    pub fn worker(&self) -> Option<WorkerId> {
        lock(&self.stream)
            .events
            .iter()
            .find(|e| e.event == "started")
            .map(|e| e.worker)
    }

    /// What the worker's events say it owns now: bucket -> token.
    pub fn owned(&self) -> BTreeMap<u32, i64> {
        owned_by(&lock(&self.stream).events)
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
                // Let the reader drain what is left.
                let drained = Instant::now();
                while !lock(&self.stream).closed && drained.elapsed() < Duration::from_secs(5) {
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
/// label, so that two processes given one worker id stay apart).
pub fn record(log: &mut OwnershipLog<DateTime<Utc>>, label: WorkerId, events: &[Event]) {
    for e in events {
        let (Some(bucket), Some(token)) = (e.bucket, e.token) else {
            continue;
        };
        let (bucket, token) = (Bucket(bucket), FencingToken(token));
        let event = match (e.event.as_str(), e.reason.as_deref()) {
            ("assigned", _) => OwnershipEvent::Assigned { bucket, token },
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
        "expired" => RevokeReason::Expired,
        "shutdown" => RevokeReason::Shutdown,
        other => panic!("unknown revocation reason {other:?}"),
    }
}
