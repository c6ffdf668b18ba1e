//! `leasectl` with a stderr nobody can write to (a full disk, a closed pipe): what would go
//! there, log lines included, is dropped; nothing panics, and the exit code is the one the
//! command would have had.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{WorkerProcess, command, run, wait_for, worker_command};

/// Where a command's stderr goes.
#[derive(Clone, Copy, Debug)]
enum Stderr {
    /// A pipe whose reader closed before the command started: every write fails with EPIPE.
    ClosedPipe,
    /// `/dev/full`: every write fails with ENOSPC.
    Full,
}

impl Stderr {
    fn connect(self, cmd: &mut Command) {
        match self {
            Self::ClosedPipe => {
                let (reader, writer) = std::io::pipe().expect("a pipe");
                drop(reader);
                cmd.stderr(writer);
            }
            Self::Full => {
                let full = std::fs::File::options()
                    .write(true)
                    .open("/dev/full")
                    .expect("/dev/full");
                cmd.stderr(full);
            }
        }
    }
}

/// Run `cmd` (at most a minute) with stderr on `to`: its exit code and stdout.
fn run_with(mut cmd: Command, to: Stderr) -> (Option<i32>, String) {
    to.connect(&mut cmd);
    let mut child = support::Running(
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawning leasectl"),
    );
    // Our copies of the child's stdio must not keep a pipe open.
    drop(cmd);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.0.try_wait().expect("try_wait") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not done in a minute"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut out = String::new();
    if let Some(mut stdout) = child.0.stdout.take() {
        std::io::Read::read_to_string(&mut stdout, &mut out).expect("stdout");
    }
    (status.code(), out)
}

/// With the database unreachable, `status` and `worker` retry, logging a warning each time,
/// then fail: exit 1 whether or not those warnings and the message can be written, never
/// 101 (a panic). A usage error stays exit 2.
#[test]
fn an_unwritable_stderr_keeps_the_exit_code() {
    let unreachable = "host=/nonexistent-socket-dir user=nobody dbname=none";
    let cases: &[(&[&str], Option<&str>, i32)] = &[
        (&["status", "--group", "g"], Some(unreachable), 1),
        (&["status"], Some(unreachable), 1),
        (&["worker", "--group", "g:4"], Some(unreachable), 1),
        (&["status", "--group", "g"], None, 2),
    ];
    for to in [Stderr::ClosedPipe, Stderr::Full] {
        for &(args, url, expected) in cases {
            let mut cmd = command(args, url);
            // The default level: the retries' warnings are written.
            cmd.env_remove("LEASE_LOG");
            let (code, out) = run_with(cmd, to);
            assert_eq!(code, Some(expected), "{args:?} 2> {to:?}");
            assert!(out.is_empty(), "{args:?} 2> {to:?} printed {out}");
        }
    }
}

/// A worker whose stderr is `/dev/full` logs a warning (it follows a resize) and goes on: it
/// shares the new buckets, and on SIGTERM revokes them all (reason shutdown), leaves the
/// group and exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_full_stderr_works_and_stops_gracefully() {
    let db = lease_testdb::database().await;
    let mut cmd = worker_command(
        &db.url,
        &["--group", "orders", "--shards", "4"],
        "3s",
        "1s",
        &[],
    );
    cmd.env_remove("LEASE_LOG");
    Stderr::Full.connect(&mut cmd);
    let mut w = WorkerProcess::spawn_command("w", cmd);
    let limit = Duration::from_secs(20);
    wait_for("four buckets", limit, || w.owned().len() == 4);
    let resize = [
        "resize", "--group", "orders", "--from", "4", "--to", "8", "--apply",
    ];
    let (code, _, err) = run(&resize, Some(&db.url));
    assert_eq!(code, 0, "{err}");
    // Following the resize, the worker logs a warning, then takes the eight new buckets.
    wait_for("the eight new buckets", limit, || {
        let resharded = w
            .events()
            .iter()
            .filter(|e| e.reason.as_deref() == Some("resharded"))
            .count();
        resharded == 4 && w.owned().len() == 8
    });
    w.signal("TERM");
    let status = w.wait(limit);
    assert_eq!(status.code(), Some(0), "{status:?}");
    let events = w.events();
    let shutdown = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("shutdown"))
        .count();
    assert_eq!(shutdown, 8, "{events:?}");
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("stopped"));
    assert!(w.bad_lines().is_empty(), "{:?}", w.bad_lines());
    let (code, out, err) = run(&["status", "--group", "orders", "--json"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    assert_eq!(status["members"], Value::Array(Vec::new()), "{status}");
    let held = status["buckets"]
        .as_array()
        .expect("buckets")
        .iter()
        .filter(|b| b["state"] == "live")
        .count();
    assert_eq!(held, 0, "{status}");
}
