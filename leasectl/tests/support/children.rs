//! `leasectl run` supervisors and the children they start, seen from outside: the
//! supervisors' `--json` events, and the lines every child appends to one shared file (its
//! start, a line every 20 ms while it works, its end when it ends by itself or by SIGTERM).
//!
//! A child killed by SIGKILL writes no end: its last line is the last moment it is known to
//! have worked. Two children of one bucket overlap when the older one wrote a line after the
//! newer one's first: the check reads exactly that, and the smallest gap between a child's
//! last line and the next child's first is the margin it reports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::leasectl;

/// The child: `python3 child.py LOG MODE`. Modes: `work` (stops on SIGTERM, writing its
/// end), `stubborn` (ignores SIGTERM), `crash:B` (exits 3 at once, after a line on stderr,
/// when its bucket is B; works otherwise), `fork` (works, and forks a grandchild that works
/// too, its lines counted as the child's, after a `grand` line with its own pid), `burn:B`
/// (works, and when its bucket is B spins between its lines: a core's worth of CPU).
pub const CHILD: &str = r#"
import os, signal, sys, time
log, mode = sys.argv[1], sys.argv[2]
bucket, token = os.environ["LEASE_BUCKET"], os.environ["LEASE_TOKEN"]
out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
me = os.getpid()
def line(kind, pid=None):
    # One write of a short line on O_APPEND: whole, never interleaved with another child's.
    os.write(out, f"{kind} {bucket} {token} {pid or me} {time.time():.6f}\n".encode())
line("start")
if mode == "fork" and os.fork() == 0:
    line("grand", os.getpid())
parents = os.environ.get("LEASE_PARENTS")
print(f"working on bucket {bucket} with token {token}"
      + (f" after buckets {parents}" if parents is not None else ""), flush=True)
if mode.startswith("crash:") and mode[6:] == bucket:
    print(f"poison in bucket {bucket}", file=sys.stderr, flush=True)
    line("end")
    sys.exit(3)
def stop(*_):
    line("end")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" else stop)
burn = mode.startswith("burn:") and mode[5:] == bucket
while True:
    line("alive")
    if burn:
        until = time.time() + 0.02
        while time.time() < until:
            pass
    else:
        time.sleep(0.02)
"#;

/// The `--events` child: `python3 events.py LOG MODE`. It writes a `start` line for each
/// assignment, `alive` lines for every bucket it holds every 20 ms, and an `end` line when it
/// acknowledges a revocation; mode `noack` never acknowledges (and works on).
pub const EVENTS_CHILD: &str = r#"
import json, os, sys, threading, time
log, mode = sys.argv[1], sys.argv[2]
out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
me = os.getpid()
held = {}
lock = threading.Lock()
def line(kind, bucket, token):
    os.write(out, f"{kind} {bucket} {token} {me} {time.time():.6f}\n".encode())
def alive():
    while True:
        with lock:
            for bucket, token in held.items():
                line("alive", bucket, token)
        time.sleep(0.02)
threading.Thread(target=alive, daemon=True).start()
for raw in sys.stdin:
    event = json.loads(raw)
    bucket, token = event["bucket"], event["token"]
    if event["event"] == "assigned":
        with lock:
            held[bucket] = token
            line("start", bucket, token)
    elif event["event"] == "revoked" and mode != "noack":
        with lock:
            held.pop(bucket, None)
            line("end", bucket, token)
        print(json.dumps({"ack": bucket, "token": token}), flush=True)
"#;

/// A test's directory: the child script and the shared log.
pub struct Workdir {
    pub dir: PathBuf,
    pub script: PathBuf,
    pub log: PathBuf,
}

impl Workdir {
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "leasectl-run-{name}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        std::fs::create_dir_all(&dir).expect("a temp dir");
        let script = dir.join("child.py");
        std::fs::write(&script, CHILD).expect("writing the child");
        std::fs::write(dir.join("events.py"), EVENTS_CHILD).expect("writing the child");
        let log = dir.join("children.log");
        Self { dir, script, log }
    }

    /// The children's lines so far.
    pub fn lines(&self) -> ChildLog {
        ChildLog::read(&self.log)
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

/// One child as its lines tell it.
#[derive(Clone, Debug)]
pub struct ChildLife {
    pub bucket: u32,
    pub token: i64,
    pub pid: i32,
    pub first: f64,
    pub last: f64,
    /// It wrote its end (a clean stop or its crash), rather than being killed.
    pub ended: bool,
}

/// Every child of the shared log, by bucket, in order of their first line.
#[derive(Debug, Default)]
pub struct ChildLog {
    pub by_bucket: BTreeMap<u32, Vec<ChildLife>>,
    /// The pids of the grandchildren (mode `fork`), whose lines count as their parent's.
    pub grandchildren: Vec<i32>,
}

impl ChildLog {
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        // By process, bucket and token: an --events child works several buckets.
        let mut lives: BTreeMap<(i32, u32, i64), ChildLife> = BTreeMap::new();
        let mut grandchildren = Vec::new();
        for line in text.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            let [kind, bucket, token, pid, at] = words[..] else {
                panic!("a malformed child line: {line:?}");
            };
            let (bucket, token, pid, at): (u32, i64, i32, f64) = (
                bucket.parse().expect("bucket"),
                token.parse().expect("token"),
                pid.parse().expect("pid"),
                at.parse().expect("time"),
            );
            if kind == "grand" {
                grandchildren.push(pid);
                continue;
            }
            let life = lives.entry((pid, bucket, token)).or_insert(ChildLife {
                bucket,
                token,
                pid,
                first: at,
                last: at,
                ended: false,
            });
            life.first = life.first.min(at);
            life.last = life.last.max(at);
            life.ended |= kind == "end";
        }
        let mut by_bucket: BTreeMap<u32, Vec<ChildLife>> = BTreeMap::new();
        for life in lives.into_values() {
            by_bucket.entry(life.bucket).or_default().push(life);
        }
        for lives in by_bucket.values_mut() {
            lives.sort_by(|a, b| a.first.total_cmp(&b.first));
        }
        Self {
            by_bucket,
            grandchildren,
        }
    }

    /// The smallest gap, in seconds, between a child's last line and the next child's first
    /// line for the same bucket (`None` with no bucket worked twice); `Err` naming the first
    /// overlap: two children of one bucket at work at once.
    pub fn check(&self) -> Result<Option<f64>, String> {
        let mut smallest: Option<f64> = None;
        for (bucket, lives) in &self.by_bucket {
            for pair in lives.windows(2) {
                let (before, after) = (&pair[0], &pair[1]);
                let gap = after.first - before.last;
                if gap <= 0.0 {
                    return Err(format!(
                        "bucket {bucket}: child {} (token {}) wrote at {:.6}, after child {} \
                         (token {}) started at {:.6}",
                        before.pid, before.token, before.last, after.pid, after.token, after.first
                    ));
                }
                smallest = Some(smallest.map_or(gap, |s: f64| s.min(gap)));
            }
        }
        Ok(smallest)
    }

    /// Whether every one of `pids` wrote a line.
    pub fn has_all(&self, pids: &[i32]) -> bool {
        pids.iter().all(|p| {
            self.by_bucket
                .values()
                .any(|lives| lives.iter().any(|l| l.pid == *p))
        })
    }

    /// The children of `bucket`.
    pub fn of(&self, bucket: u32) -> &[ChildLife] {
        self.by_bucket.get(&bucket).map_or(&[], Vec::as_slice)
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: it runs no more).
pub fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            stat.rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next())
                == Some("Z")
        }
    }
}

/// Send `signal` (`KILL`, `STOP`, `CONT`, `TERM`) to `pid`.
pub fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .expect("running kill");
    assert!(status.success(), "kill -{signal} {pid} failed");
}

#[derive(Default)]
struct Seen {
    events: Vec<Value>,
    /// Stdout lines that are not events: the children's, prefixed.
    passed: Vec<String>,
    stderr: Vec<String>,
}

/// A `leasectl run --json` process and what it printed so far.
pub struct Supervisor {
    pub name: String,
    child: Child,
    seen: Arc<Mutex<Seen>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Supervisor {
    /// `leasectl run --json FLAGS -- python3 SCRIPT LOG MODE` on `url`.
    pub fn start(name: &str, url: &str, flags: &[&str], work: &Workdir, mode: &str) -> Self {
        Self::start_script(name, url, flags, &work.script, work, mode)
    }

    /// `leasectl run --json --events FLAGS -- python3 events.py LOG MODE` on `url`.
    pub fn start_events(name: &str, url: &str, flags: &[&str], work: &Workdir, mode: &str) -> Self {
        let mut flags = flags.to_vec();
        flags.push("--events");
        Self::start_script(name, url, &flags, &work.dir.join("events.py"), work, mode)
    }

    fn start_script(
        name: &str,
        url: &str,
        flags: &[&str],
        script: &Path,
        work: &Workdir,
        mode: &str,
    ) -> Self {
        let mut cmd = leasectl();
        cmd.arg("run")
            .arg("--json")
            .args(flags)
            .arg("--")
            .arg("python3")
            .arg(script)
            .arg(&work.log)
            .arg(mode)
            .env("DATABASE_URL", url)
            .env("LEASE_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("starting leasectl run");
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stdout = child.stdout.take().expect("stdout");
        let stderr = child.stderr.take().expect("stderr");
        let (s1, s2) = (seen.clone(), seen.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                match serde_json::from_str::<Value>(&line) {
                    Ok(v) if v.is_object() => lock(&s1).events.push(v),
                    _ => lock(&s1).passed.push(line),
                }
            }
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lock(&s2).stderr.push(line);
            }
        });
        Self {
            name: name.to_owned(),
            child,
            seen,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn events(&self) -> Vec<Value> {
        lock(&self.seen).events.clone()
    }

    pub fn passed(&self) -> Vec<String> {
        lock(&self.seen).passed.clone()
    }

    pub fn stderr(&self) -> String {
        lock(&self.seen).stderr.join("\n")
    }

    /// The events named `event`.
    pub fn named(&self, event: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }

    /// The buckets it holds now: assigned and not revoked since.
    pub fn held(&self) -> Vec<u32> {
        let mut held = std::collections::BTreeSet::new();
        for e in self.events() {
            let bucket = e["bucket"].as_u64().map(|b| b as u32);
            match (e["event"].as_str(), bucket) {
                (Some("assigned"), Some(b)) => {
                    held.insert(b);
                }
                (Some("revoked"), Some(b)) => {
                    held.remove(&b);
                }
                _ => {}
            }
        }
        held.into_iter().collect()
    }

    /// The pids of its children that were started and have not been seen to end (by its
    /// events).
    pub fn child_pids(&self) -> Vec<i32> {
        let mut pids = std::collections::BTreeSet::new();
        for e in self.events() {
            let pid = e["pid"].as_i64().map(|p| p as i32);
            match (e["event"].as_str(), pid) {
                (Some("child-started"), Some(p)) => {
                    pids.insert(p);
                }
                (Some("child-exited" | "child-stopped"), Some(p)) => {
                    pids.remove(&p);
                }
                _ => {}
            }
        }
        pids.into_iter().collect()
    }

    /// Wait (up to `limit`) for its exit code.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Describe it for a failure message.
    pub fn dump(&self) -> String {
        let seen = lock(&self.seen);
        format!(
            "--- {} events:\n{}\n--- stderr:\n{}",
            self.name,
            seen.events
                .iter()
                .map(Value::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            seen.stderr.join("\n")
        )
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // Resume it first: a stopped process dies of SIGKILL all the same, but its
            // watchdog's children should be seen gone before the test's directory is.
            signal(self.child.id(), "CONT");
            self.child.kill().ok();
            self.child.wait().ok();
        }
    }
}

/// Wait until `sup` holds `n` buckets, each with a child that wrote its first line; panics
/// naming `what` after `limit`.
pub fn until_working(sup: &Supervisor, work: &Workdir, n: usize, limit: Duration, what: &str) {
    let done = until(limit, || {
        let pids = sup.child_pids();
        sup.held().len() == n && pids.len() == n && work.lines().has_all(&pids)
    });
    assert!(
        done.is_some(),
        "{what}: {} never worked {n} buckets\n{}",
        sup.name,
        sup.dump()
    );
}

/// Wait until `cond` holds, polling every 20 ms, for at most `limit`: how long it took, or
/// `None`.
pub fn until(limit: Duration, cond: impl FnMut() -> bool) -> Option<Duration> {
    until_every(Duration::from_millis(20), limit, cond)
}

/// [`until`], polling every `step`.
pub fn until_every(
    step: Duration,
    limit: Duration,
    mut cond: impl FnMut() -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() >= limit {
            return None;
        }
        std::thread::sleep(step);
    }
}

/// Freeze (SIGSTOP) every server process serving database `name` at `url` (the supervisors'
/// connections), at a moment when all are idle: a process frozen mid-statement would hold row
/// locks nobody can take over (a limit of any database). Resumed when dropped.
pub async fn freeze_idle(url: &str, name: &str) -> lease_testdb::Frozen {
    use diesel_async::{AsyncConnection, AsyncPgConnection};
    let mut admin = AsyncPgConnection::establish(url).await.expect("admin");
    loop {
        let pids: Vec<i32> = lease_testdb::backends(&mut admin, name)
            .await
            .into_iter()
            .map(|b| b.pid)
            .collect();
        assert!(!pids.is_empty(), "no connection to freeze");
        let frozen = lease_testdb::Frozen::freeze(pids);
        let states = lease_testdb::backends(&mut admin, name).await;
        if states
            .iter()
            .filter(|b| frozen.pids().contains(&b.pid))
            .all(|b| b.state == "idle")
        {
            return frozen;
        }
        drop(frozen);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The processes whose parent is `ppid` and whose command line holds `word`.
pub fn children_with(ppid: u32, word: &str) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let parent = stat
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().nth(1))
                .and_then(|p| p.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            parent == Some(ppid) && String::from_utf8_lossy(&cmdline).contains(word)
        })
        .collect()
}
