//! `leasectl` as a user runs it: exit codes, messages, the JSON formats, `release`, metrics,
//! and the in-memory demo.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lease::store::{AdminStore, WorkerStore};
use serde_json::Value;
use support::{
    FreezableProxy, Running, WorkerProcess, command, free_port, leasectl, run, wait_for,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_exits_2_and_names_the_flag() {
    let db = lease_testdb::database().await;
    let url = Some(db.url.as_str());
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "worker", "--group", "g", "--shards", "4", "--ttl", "2s", "--renew", "1s",
            ],
            "--ttl",
        ),
        (
            &["worker", "--group", "g", "--shards", "4", "--margin", "25s"],
            "--margin",
        ),
        (&["worker", "--group", "g", "--shards", "0"], "--shards"),
        (&["worker", "--group", "", "--shards", "4"], "--group"),
        (
            &["worker", "--group", "g", "--shards", "4", "--ttl", "3"],
            "--ttl",
        ),
        (
            &["worker", "--group", "g", "--shards", "4", "--renew", "0s"],
            "--renew",
        ),
        (&["status", "--group", "never-created"], "--group"),
        (
            &["release", "--group", "g", "--worker", "not-a-uuid"],
            "--worker",
        ),
        (
            &[
                "worker",
                "--group",
                "g",
                "--shards",
                "4",
                "--node-id",
                "not-a-uuid",
            ],
            "--node-id",
        ),
    ];
    for (args, flag) in cases {
        let (code, _, err) = run(args, url);
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert!(
            err.contains(flag),
            "{args:?}: message does not name {flag}: {err}"
        );
    }
    // No database configured at all.
    let (code, _, err) = run(&["status", "--group", "g"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--database-url"), "{err}");
    let (code, _, err) = run(&["status", "--group", "g"], Some("postgres://x@[bad"));
    assert_eq!(code, 2);
    assert!(err.contains("--database-url"), "{err}");
    // A group's shard count cannot change.
    let (code, _, _) = run(&["migrate"], url);
    assert_eq!(code, 0);
    let mut first = WorkerProcess::spawn("first", &db.url, "g", 4, "3s", "1s");
    wait_for("the first worker", Duration::from_secs(20), || {
        first.owned().len() == 4
    });
    let (code, out, err) = run(&["worker", "--group", "g", "--shards", "5"], url);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--shards") && err.contains("4 shards"),
        "{err}"
    );
    assert!(out.is_empty(), "a refused worker announced itself: {out}");
    first.signal("TERM");
    assert!(first.wait(Duration::from_secs(10)).success());
}

#[test]
fn runtime_failures_exit_1_with_what_to_do() {
    let (code, _, err) = run(
        &["status", "--group", "g"],
        Some("host=/nonexistent-socket-dir user=nobody dbname=none"),
    );
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("unreachable"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unmigrated_database_says_to_run_migrate() {
    let url = lease_testdb::empty_database().await.url;
    let (code, _, err) = run(&["worker", "--group", "g", "--shards", "4"], Some(&url));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("leasectl migrate"), "{err}");
    let (code, out, _) = run(&["migrate"], Some(&url));
    assert_eq!(code, 0);
    assert!(out.contains("applied"), "{out}");
    let (code, out, _) = run(&["migrate"], Some(&url));
    assert_eq!(code, 0);
    assert!(out.contains("up to date"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_prints_json_serves_metrics_and_stops_on_sigterm() {
    let db = lease_testdb::database().await;
    let port = free_port();
    let mut child = Running(
        leasectl()
            .args([
                "worker",
                "--json",
                "--group",
                "orders",
                "--shards",
                "4",
                "--ttl",
                "3s",
                "--renew",
                "1s",
                "--metrics-addr",
            ])
            .arg(format!("127.0.0.1:{port}"))
            .env("DATABASE_URL", &db.url)
            .env("LEASE_LOG", "off")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let stdout = child.0.stdout.take().expect("stdout");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    let reader = std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().expect("lines").push(line);
        }
    });
    let count = |lines: &std::sync::Mutex<Vec<String>>, what: &str| {
        lines
            .lock()
            .expect("lines")
            .iter()
            .filter(|l| l.contains(what))
            .count()
    };
    wait_for("four assignments", Duration::from_secs(20), || {
        count(&lines, "\"assigned\"") == 4
    });
    // Prometheus metrics over plain HTTP.
    let mut body = String::new();
    wait_for("the metrics endpoint", Duration::from_secs(10), || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        body.clear();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("lease_owned_buckets")
    });
    assert!(
        body.contains("lease_owned_buckets{group=\"orders\"} 4"),
        "{body}"
    );
    assert!(body.contains("lease_claimed_total"), "{body}");

    // status --json while it runs.
    let (code, out, err) = run(&["status", "--group", "orders", "--json"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    let keys: Vec<&str> = status
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        [
            "group",
            "shard_count",
            "observed_at",
            "members",
            "buckets",
            "generation",
            "previous",
            "draining",
            "waiting"
        ]
    );
    assert_eq!(status["shard_count"], 4);
    let member = status["members"][0].as_object().expect("a member");
    let keys: Vec<&str> = member.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "worker",
            "session",
            "expires_at",
            "owned",
            "weight",
            "mode",
            "load",
            "hottest"
        ]
    );
    // No load reported: every member's work is 0.
    assert_eq!(status["members"][0]["load"], 0.0);
    assert_eq!(status["members"][0]["owned"], 4);
    assert_eq!(status["members"][0]["weight"], 1);
    assert_eq!(status["members"][0]["mode"], "active");
    let session = &status["members"][0]["session"];
    assert!(session.is_string(), "{session}");
    assert_eq!(status["buckets"].as_array().expect("buckets").len(), 4);
    for b in status["buckets"].as_array().expect("buckets") {
        let keys: Vec<&str> = b
            .as_object()
            .expect("a bucket")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "bucket",
                "owner",
                "session",
                "token",
                "expires_at",
                "state",
                "quarantined_until",
                "quarantine_reason",
                "load"
            ]
        );
        assert_eq!(b["state"], "live");
        assert_eq!(b["load"], 0.0);
        assert!(b["quarantined_until"].is_null());
        assert!(b["quarantine_reason"].is_null());
        assert!(b["owner"].is_string() && b["expires_at"].is_string() && b["token"] == 1);
        assert_eq!(
            &b["session"], session,
            "a bucket held under another session"
        );
    }
    let (code, out, _) = run(&["status", "--group", "orders"], Some(&db.url));
    assert_eq!(code, 0);
    assert!(
        out.contains("balance: 1 live member(s), 4/4 buckets owned"),
        "{out}"
    );

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.0.wait().expect("wait");
    reader.join().expect("reader");
    assert!(exit.success(), "SIGTERM exit: {exit:?}");
    let lines = lines.lock().expect("lines").clone();
    let events: Vec<support::Event> = lines
        .iter()
        .map(|l| support::parse_event(l).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    assert_eq!(events.first().map(|e| e.event.as_str()), Some("started"));
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("stopped"));
    assert_eq!(
        events
            .iter()
            .filter(|e| e.reason.as_deref() == Some("shutdown"))
            .count(),
        4
    );
    assert!(support::owned_by(&events).is_empty());
}

/// What `status --json` says a worker holds: its session, and its live buckets with the
/// session and token of each.
#[derive(Debug, PartialEq)]
struct StoreOwnership {
    session: Option<String>,
    buckets: Vec<(u64, String, i64)>,
}

fn ownership_in_store(url: &str, worker: &str) -> StoreOwnership {
    let (code, out, err) = run(&["status", "--group", "orders", "--json"], Some(url));
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    let text = |v: &Value, k: &str| v[k].as_str().map(str::to_owned);
    let session = status["members"]
        .as_array()
        .expect("members")
        .iter()
        .find(|m| m["worker"] == worker)
        .map(|m| text(m, "session").expect("a member's session"));
    let buckets = status["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .filter(|b| b["owner"] == worker && b["state"] == "live")
        .map(|b| {
            (
                b["bucket"].as_u64().expect("bucket"),
                text(b, "session").expect("an owned bucket's session"),
                b["token"].as_i64().expect("token"),
            )
        })
        .collect();
    StoreOwnership { session, buckets }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_shows_then_does_and_the_worker_recovers() {
    let db = lease_testdb::database().await;
    let mut w = WorkerProcess::spawn("w", &db.url, "orders", 4, "3s", "1s");
    wait_for("four buckets", Duration::from_secs(20), || {
        w.owned().len() == 4
    });
    let id = w.worker().expect("started").to_string();
    // The store's view, not the worker's: a release would show there at once, while the
    // worker only hears of it at its next heartbeat.
    let before = ownership_in_store(&db.url, &id);
    assert_eq!(before.buckets.len(), 4, "{before:?}");
    let (code, out, _) = run(
        &["release", "--group", "orders", "--worker", &id],
        Some(&db.url),
    );
    assert_eq!(code, 0);
    assert!(out.contains("would release 4 bucket(s)"), "{out}");
    assert!(out.contains(&format!("--worker {id} --force")), "{out}");
    assert!(
        out.contains("warning: this worker's session is live"),
        "{out}"
    );
    assert_eq!(
        ownership_in_store(&db.url, &id),
        before,
        "a dry run changed the store"
    );
    let (code, out, _) = run(
        &["release", "--group", "orders", "--worker", &id, "--force"],
        Some(&db.url),
    );
    assert_eq!(code, 0);
    assert!(out.contains("released 4 bucket(s)"), "{out}");
    // Woken by the release, the worker may already hold a new session: never the old one.
    let after = ownership_in_store(&db.url, &id);
    assert_ne!(after.session, before.session, "the release left {after:?}");
    // The worker's next heartbeat starts a new session: it revokes everything, then claims again.
    wait_for(
        "the worker to revoke and reclaim",
        Duration::from_secs(20),
        || {
            let events = w.events();
            let expired = events
                .iter()
                .filter(|e| e.reason.as_deref() == Some("expired"))
                .count();
            expired == 4 && w.owned().len() == 4
        },
    );
    let tokens: Vec<i64> = w.owned().values().copied().collect();
    assert!(
        tokens.iter().all(|&t| t == 2),
        "tokens after the re-claim: {tokens:?}"
    );
    w.signal("TERM");
    assert!(w.wait(Duration::from_secs(10)).success());
    assert!(w.bad_lines().is_empty(), "{:?}", w.bad_lines());
}

/// The number of milliseconds `line` of the demo's summary gives after `label`: a number,
/// never "not within this phase".
fn millis_after(out: &str, label: &str) -> u64 {
    let line = out
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("the demo did not say {label:?}:\n{out}"));
    let after = &line[line.find(label).map_or(0, |i| i + label.len())..];
    after
        .strip_suffix(" ms")
        .or_else(|| after.split_once(" ms ").map(|(n, _)| n))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{label:?} is not followed by a number of ms: {line}"))
}

#[test]
fn the_demo_tells_its_story_and_finds_no_overlap() {
    let (code, out, err) = run(
        &[
            "demo",
            "--workers",
            "3",
            "--shards",
            "12",
            "--seconds",
            "15",
        ],
        None,
    );
    assert_eq!(code, 0, "demo failed: {err}\n{out}");
    let cold = millis_after(&out, "cold start (3 workers, 12 buckets): balanced after ");
    let join = millis_after(&out, "D joined: balanced after ");
    let crash = millis_after(&out, "re-owned and balanced after ");
    let stop = millis_after(
        &out,
        "B stopped gracefully: its buckets re-owned and balanced after ",
    );
    // Bucket 0 runs hot: its worker gets down to it and at most one cold bucket.
    let hot = millis_after(&out, "within the 10 % band) after ");
    eprintln!(
        "balanced after: cold start {cold} ms, join {join} ms, stop {stop} ms; hot bucket \
         settled after {hot} ms"
    );
    // The crashed worker's buckets wait for its lease (ttl 2 s, renewed every 0.5 s): about
    // 1.5 s at the least, far more than a balance that does not wait.
    assert!(
        crash >= 1_000,
        "the crashed worker's buckets were re-owned after {crash} ms, before its lease \
         expired:\n{out}"
    );
    // Four workers share 12 buckets when A crashes: it holds 3, and none moved early.
    assert!(
        out.contains("A crashed holding 3 buckets") && out.contains("; taken before expiry: 0\n"),
        "{out}"
    );
    assert!(out.contains("overlaps found: 0"), "{out}");
    let (code, _, err) = run(&["demo", "--workers", "1"], None);
    assert_eq!(code, 2);
    assert!(err.contains("--workers"), "{err}");
}

/// Two `leasectl worker` processes given one `--node-id` (a stateful-set pod restarted while
/// the old one still terminates): the second is refused while the first runs, with an error
/// event saying the id is in use, and owns nothing; once the first stops it takes every bucket.
/// The merged event log, each process under a label of its own, shows no bucket held by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_given_one_node_id_never_share_its_session() {
    let db = lease_testdb::database().await;
    let id = lease::NodeId::new().to_string();
    let flags = ["--node-id", id.as_str()];
    let mut first = WorkerProcess::spawn_with("first", &db.url, "orders", 4, "3s", "1s", &flags);
    wait_for(
        "the first worker's buckets",
        Duration::from_secs(20),
        || first.owned().len() == 4,
    );
    let mut second = WorkerProcess::spawn_with("second", &db.url, "orders", 4, "3s", "1s", &flags);
    let refusals = |w: &WorkerProcess| {
        w.events()
            .iter()
            .filter(|e| e.event == "error")
            .filter(|e| {
                e.message
                    .as_deref()
                    .is_some_and(|m| m.contains("is in use"))
            })
            .count()
    };
    wait_for(
        "three refusals of the second worker",
        Duration::from_secs(20),
        || refusals(&second) >= 3,
    );
    assert_eq!(second.worker().map(|w| w.to_string()), Some(id.clone()));
    assert!(
        second.owned().is_empty(),
        "the second worker shares the first one's buckets"
    );
    assert_eq!(first.owned().len(), 4);

    first.signal("TERM");
    assert!(first.wait(Duration::from_secs(10)).success());
    wait_for(
        "the second worker to take over",
        Duration::from_secs(20),
        || second.owned().len() == 4,
    );
    second.signal("TERM");
    assert!(second.wait(Duration::from_secs(10)).success());
    let mut log = lease::audit::OwnershipLog::new();
    support::record(&mut log, lease::NodeId::new(), &first.events());
    support::record(&mut log, lease::NodeId::new(), &second.events());
    let summary = log
        .check()
        .unwrap_or_else(|e| panic!("two processes with one node id overlapped: {e}"));
    assert_eq!(summary.handoffs, 4);
    assert!(first.bad_lines().is_empty() && second.bad_lines().is_empty());
}

/// What a command's stdout is connected to.
#[derive(Clone, Copy, Debug)]
enum Stdout {
    /// A pipe whose reader closed before the command started: every write fails with EPIPE.
    ClosedPipe,
    /// `/dev/full`: every write fails with ENOSPC.
    Full,
}

impl Stdout {
    fn connect(self, cmd: &mut Command) {
        match self {
            Self::ClosedPipe => {
                let (reader, writer) = std::io::pipe().expect("a pipe");
                drop(reader);
                cmd.stdout(writer);
            }
            Self::Full => {
                let full = std::fs::File::options()
                    .write(true)
                    .open("/dev/full")
                    .expect("/dev/full");
                cmd.stdout(full);
            }
        }
    }
}

/// Start `cmd` with stderr captured (read as it comes, so it never blocks the command).
fn spawn_capturing(mut cmd: Command) -> (Running, std::thread::JoinHandle<String>) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning leasectl");
    // Our copies of the child's stdio must not keep a pipe open.
    drop(cmd);
    let mut stderr = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr.read_to_string(&mut text).ok();
        text
    });
    (Running(child), reader)
}

/// Wait for `child` to exit, at most `limit` (then kill it and fail); its exit code and stderr.
fn finish(
    mut child: Running,
    stderr: std::thread::JoinHandle<String>,
    limit: Duration,
    what: &str,
) -> (i32, String) {
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            start.elapsed() <= limit,
            "{what} did not exit within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let stderr = stderr.join().expect("the stderr reader");
    assert!(!stderr.contains("panicked"), "{what} panicked: {stderr}");
    (status.code().unwrap_or(-1), stderr)
}

/// Run `leasectl args` with stdout connected to `to`; its exit code and stderr.
fn run_to(args: &[&str], url: Option<&str>, to: Stdout) -> (i32, String) {
    let mut cmd = command(args, url);
    to.connect(&mut cmd);
    let (child, stderr) = spawn_capturing(cmd);
    finish(
        child,
        stderr,
        Duration::from_secs(60),
        &format!("{args:?} > {to:?}"),
    )
}

/// Start `leasectl args` writing to a pipe; returns the process, the reader of its stdout,
/// and its stderr.
fn spawn_piped(
    args: &[&str],
    url: Option<&str>,
) -> (
    Running,
    BufReader<std::io::PipeReader>,
    std::thread::JoinHandle<String>,
) {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    let mut cmd = command(args, url);
    cmd.stdout(writer);
    let (child, stderr) = spawn_capturing(cmd);
    (child, BufReader::new(reader), stderr)
}

fn first_line(reader: &mut impl BufRead) -> String {
    let mut line = String::new();
    reader.read_line(&mut line).expect("reading stdout");
    line
}

const NO_SPACE: &str = "cannot write to stdout: No space left on device";

/// `demo | head -1` and `demo > /dev/full`: the story stops at once instead of running its
/// hour; a closed pipe quietly (0), a full disk with a message (1). Help likewise.
#[test]
fn the_demo_stops_early_when_stdout_goes() {
    let hour = ["demo", "--seconds", "3600"];
    let (child, mut reader, stderr) = spawn_piped(&hour, None);
    let line = first_line(&mut reader);
    assert!(line.contains("cold start"), "{line}");
    drop(reader);
    let (code, err) = finish(child, stderr, Duration::from_secs(30), "demo | head -1");
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, err) = run_to(&hour, None, Stdout::ClosedPipe);
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, err) = run_to(&hour, None, Stdout::Full);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(NO_SPACE), "{err}");

    let (code, err) = run_to(&["--help"], None, Stdout::ClosedPipe);
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, err) = run_to(&["demo", "--help"], None, Stdout::Full);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(NO_SPACE), "{err}");
}

/// `demo --help` states the range of `--workers`, and the demo accepts exactly that range.
#[test]
fn the_demo_accepts_the_workers_its_help_promises() {
    let (code, help, _) = run(&["demo", "--help"], None);
    assert_eq!(code, 0);
    let range = help
        .split("Workers at the start (")
        .nth(1)
        .and_then(|rest| rest.split_once(')'))
        .map(|(range, _)| range)
        .unwrap_or_else(|| panic!("no range of workers in the help:\n{help}"));
    let (low, high) = range
        .split_once(" to ")
        .and_then(|(l, h)| Some((l.parse::<u32>().ok()?, h.parse::<u32>().ok()?)))
        .unwrap_or_else(|| panic!("not a range: {range:?}"));
    for n in [low, high] {
        // The first line shows the story started; then the demo stops as its reader goes.
        let (child, mut reader, stderr) = spawn_piped(
            &["demo", "--workers", &n.to_string(), "--seconds", "3600"],
            None,
        );
        let line = first_line(&mut reader);
        drop(reader);
        let (code, err) = finish(child, stderr, Duration::from_secs(30), "demo");
        assert_eq!(code, 0, "--workers {n}: {err}");
        assert!(line.contains(&format!("cold start: {n} workers")), "{line}");
    }
    for n in [low - 1, high + 1] {
        let (code, _, err) = run(&["demo", "--workers", &n.to_string()], None);
        assert_eq!(code, 2, "--workers {n} was accepted");
        assert!(
            err.contains("--workers") && err.contains(&format!("{low} to {high}")),
            "{err}"
        );
    }
}

/// `migrate | head -0`, `status > /dev/full` and the like: a closed pipe ends quietly once the
/// work is done (0), a full disk is a failure saying so (1), nothing panics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_quietly_and_a_full_one_fails() {
    // The migration is applied even though nobody reads that it was.
    let fresh = lease_testdb::empty_database().await;
    let (code, err) = run_to(&["migrate"], Some(&fresh.url), Stdout::ClosedPipe);
    assert_eq!((code, err.as_str()), (0, ""));
    let (code, out, _) = run(&["migrate"], Some(&fresh.url));
    assert_eq!(code, 0);
    assert!(
        out.contains("up to date"),
        "migrate | head -0 applied nothing: {out}"
    );
    // A full disk after the work: a failure that says the work was done.
    let fresh = lease_testdb::empty_database().await;
    let (code, err) = run_to(&["migrate"], Some(&fresh.url), Stdout::Full);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("applied migrations") && err.contains(NO_SPACE),
        "{err}"
    );

    let db = lease_testdb::database().await;
    let store = lease::postgres::PgLeaseStore::builder(db.url.clone())
        .max_connections(1)
        .build()
        .expect("a store");
    let group = lease::GroupName::new("orders").expect("name");
    store
        .ensure_group(&group, lease::ShardCount::new(4).expect("n"))
        .await
        .expect("the group");
    let stranger = lease::NodeId::new().to_string();
    let cases: &[&[&str]] = &[
        &["migrate"],
        &["status", "--group", "orders"],
        &["status", "--group", "orders", "--json"],
        &["release", "--group", "orders", "--worker", &stranger],
        &[
            "release", "--group", "orders", "--worker", &stranger, "--force",
        ],
        &["worker", "--group", "orders", "--shards", "4", "--json"],
    ];
    for args in cases {
        let (code, err) = run_to(args, Some(&db.url), Stdout::ClosedPipe);
        assert_eq!((code, err.as_str()), (0, ""), "{args:?} | head -0");
        let (code, err) = run_to(args, Some(&db.url), Stdout::Full);
        assert_eq!(code, 1, "{args:?} > /dev/full: {err}");
        assert!(err.contains(NO_SPACE), "{args:?} > /dev/full: {err}");
    }
    // A worker that could not announce itself never joined.
    let snap = store.snapshot(&group).await.expect("snapshot");
    assert!(snap.members.is_empty(), "{:?}", snap.members);
}

/// A worker whose reader goes away stops gracefully at its next event: it revokes, leaves the
/// group (the store shows it gone) and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_stdout_closes_leaves_the_group_and_exits_0() {
    let db = lease_testdb::database().await;
    let (child, mut reader, stderr) = spawn_piped(
        &[
            "worker", "--json", "--group", "orders", "--shards", "4", "--ttl", "3s", "--renew",
            "1s",
        ],
        Some(&db.url),
    );
    let started = support::parse_event(first_line(&mut reader).trim()).expect("started");
    let id = started.worker.to_string();
    wait_for("the worker's buckets", Duration::from_secs(20), || {
        ownership_in_store(&db.url, &id).buckets.len() == 4
    });
    drop(reader);
    // A joiner makes it shed, so it has something to print.
    let mut joiner = WorkerProcess::spawn("joiner", &db.url, "orders", 4, "3s", "1s");
    let (code, err) = finish(child, stderr, Duration::from_secs(20), "the worker");
    assert_eq!((code, err.as_str()), (0, ""));
    assert_eq!(
        ownership_in_store(&db.url, &id),
        StoreOwnership {
            session: None,
            buckets: Vec::new()
        },
        "the worker did not leave the group"
    );
    wait_for("the joiner to take over", Duration::from_secs(20), || {
        joiner.owned().len() == 4
    });
    joiner.signal("TERM");
    assert!(joiner.wait(Duration::from_secs(10)).success());
}

/// A worker that cannot write its events for another reason than a closed pipe (here a file
/// past its size limit: EFBIG) stops gracefully too, but exits 1 and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_stdout_fails_leaves_the_group_and_exits_1() {
    let db = lease_testdb::database().await;
    let path = std::env::temp_dir().join(format!("leasectl-efbig-{}", std::process::id()));
    let file = std::fs::File::create(&path).expect("a file for stdout");
    // Room for "started" and a few assignments of the eight; SIGXFSZ ignored, so writes past
    // the limit fail with EFBIG instead of killing the process.
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "trap '' XFSZ && exec prlimit --fsize=600 -- \"$@\"",
        "sh",
    ])
    .arg(env!("CARGO_BIN_EXE_leasectl"))
    .args([
        "worker", "--json", "--group", "orders", "--shards", "8", "--ttl", "3s", "--renew", "1s",
    ])
    .env("DATABASE_URL", &db.url)
    .env("LEASE_LOG", "off")
    .stdout(file);
    let (child, stderr) = spawn_capturing(cmd);
    let (code, err) = finish(child, stderr, Duration::from_secs(20), "the worker");
    let printed = std::fs::read_to_string(&path).expect("the worker's stdout");
    std::fs::remove_file(&path).ok();
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("cannot write to stdout: File too large"),
        "{err}"
    );
    let started =
        support::parse_event(printed.lines().next().expect("a first line")).expect("started");
    assert_eq!(started.event, "started");
    assert_eq!(
        ownership_in_store(&db.url, &started.worker.to_string()),
        StoreOwnership {
            session: None,
            buckets: Vec::new()
        },
        "the worker did not leave the group"
    );
}

/// `--ttl 30ms --renew 10ms`: the message names the flag to change, not the wake-up debounce
/// alone, which is no flag.
#[test]
fn a_renew_interval_within_the_wake_up_debounce_names_renew() {
    let (code, _, err) = run(
        &[
            "worker", "--group", "g", "--shards", "4", "--ttl", "30ms", "--renew", "10ms",
        ],
        Some("postgres://nobody@127.0.0.1:1/none"),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--renew 10ms") && err.contains("wake-up debounce"),
        "{err}"
    );
}

/// Told to stop while the database does not answer, a worker waits for its leave call; a
/// second signal ends it at once, with exit 1 and a message saying it did not leave, and the
/// store still lists it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_a_worker_at_once_without_leaving() {
    let db = lease_testdb::database().await;
    let proxy = FreezableProxy::start(&db).await;
    // ttl 60 s: a leave call may wait 30 s before it times out.
    let mut w = WorkerProcess::spawn("w", &proxy.url, "orders", 4, "60s", "1s");
    wait_for("four buckets", Duration::from_secs(20), || {
        w.owned().len() == 4
    });
    let id = w.worker().expect("started").to_string();
    proxy.freeze();
    w.signal("TERM");
    wait_for("the notice of a stop", Duration::from_secs(20), || {
        w.stderr().iter().any(|l| l.contains("leasectl: stopping"))
    });
    let second = Instant::now();
    w.signal("INT");
    let status = w.wait(Duration::from_secs(20));
    let took = second.elapsed();
    assert_eq!(status.code(), Some(1), "{:?}", w.stderr());
    assert!(
        took < Duration::from_secs(10),
        "the second signal took {took:?} to end the worker"
    );
    let said = w.stderr().join("\n");
    assert!(
        said.contains("second signal") && said.contains("without leaving the group"),
        "{said}"
    );
    let error = w.events().into_iter().rfind(|e| e.event == "error");
    assert!(
        error.is_some_and(|e| e.message.is_some_and(|m| m.contains("without leaving"))),
        "no error event: {:?}",
        w.events()
    );
    // Through the proxy nothing reached the store: it still lists the worker and its buckets.
    let left = ownership_in_store(&db.url, &id);
    assert!(
        left.session.is_some() && left.buckets.len() == 4,
        "{left:?}"
    );
    proxy.thaw();
}

/// A worker that cannot leave the group when told to stop (the database does not answer)
/// exits 1 and says that its leases stay until they expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_cannot_leave_the_group_exits_1_and_says_so() {
    let db = lease_testdb::database().await;
    let proxy = FreezableProxy::start(&db).await;
    let mut w = WorkerProcess::spawn("w", &proxy.url, "orders", 4, "3s", "1s");
    wait_for("four buckets", Duration::from_secs(20), || {
        w.owned().len() == 4
    });
    let id = w.worker().expect("started").to_string();
    proxy.freeze();
    w.signal("TERM");
    // A call in flight and the leave each time out after 1.5 s (half the ttl).
    let status = w.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(1), "{:?}", w.stderr());
    let said = w.stderr().join("\n");
    assert!(
        said.contains("could not leave the group") && said.contains("until they expire"),
        "{said}"
    );
    assert!(
        ownership_in_store(&db.url, &id).session.is_some(),
        "the store lost the worker's membership without a leave"
    );
    proxy.thaw();
}
