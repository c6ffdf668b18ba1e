//! `leasectl` behind PgBouncer in transaction pooling mode (the system's `pgbouncer`, started
//! in front of the test server): the option from the flag, the environment or the URL, the
//! direct URL that `migrate` needs there, and a worker that polls without one and says so
//! once, in its log and its metrics. Fails, never skips, without `pgbouncer` (the harness
//! names the package) or with a `DATABASE_URL` of someone else's server.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lease_testdb::{PgBouncer, PoolMode};
use support::{Running, free_port, leasectl, wait_for};

fn bouncer() -> &'static PgBouncer {
    static BOUNCER: OnceLock<PgBouncer> = OnceLock::new();
    BOUNCER.get_or_init(|| {
        let cluster = lease_testdb::server().own().unwrap_or_else(|| {
            panic!(
                "the PgBouncer tests put PgBouncer in front of a server of their own: unset \
                 DATABASE_URL to let them start one"
            )
        });
        PgBouncer::start(cluster, PoolMode::Transaction, &["postgres"])
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

fn text(out: &Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `leasectl args` with only the given environment of ours.
fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut command = leasectl();
    command
        .args(args)
        .env_remove("DATABASE_URL")
        .env_remove("LEASE_DIRECT_URL")
        .env_remove("LEASE_TRANSACTION_POOLER")
        .env("LEASE_LOG", "warn");
    for (k, v) in env {
        command.env(k, v);
    }
    text(&command.output().expect("running leasectl"))
}

/// `migrate` through the pooler is refused without a direct URL (exit 2, naming the flag,
/// nothing done) and works with one; the option comes from the flag, the environment or the
/// URL, and a URL that says otherwise than the flag is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_through_the_pooler_takes_the_direct_url() {
    let db = lease_testdb::empty_database().await;
    let pooled = bouncer().url("postgres", &db.name, "");

    let (code, _, err) = run(
        &["migrate", "--transaction-pooler"],
        &[("DATABASE_URL", &pooled)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--direct-url"), "{err}");
    let (code, _, err) = run(
        &["migrate"],
        &[
            ("DATABASE_URL", &pooled),
            ("LEASE_TRANSACTION_POOLER", "true"),
        ],
    );
    assert_eq!(code, 2, "the environment turns the option on: {err}");
    let (code, _, err) = run(
        &["status", "--group", "orders", "--transaction-pooler"],
        &[("DATABASE_URL", &pooled)],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("no `lease` schema"),
        "the refused migrations did something: {err}"
    );

    let contradicted = format!("{pooled}?transaction_pooler=false");
    let (code, _, err) = run(
        &["migrate", "--transaction-pooler", "--direct-url", &db.url],
        &[("DATABASE_URL", &contradicted)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--database-url"), "{err}");

    let in_url = format!("{pooled}?transaction_pooler=true");
    let (code, out, err) = run(
        &["migrate"],
        &[("DATABASE_URL", &in_url), ("LEASE_DIRECT_URL", &db.url)],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("applied migrations"), "{out}");
    // The schema is there: what is missing now is the group.
    let (code, _, err) = run(
        &["status", "--group", "orders"],
        &[("DATABASE_URL", &in_url)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("group \"orders\" does not exist"), "{err}");
}

/// Lines a child wrote, read on a thread of their own.
fn lines_of(stream: impl Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            eprintln!("[worker] {line}");
            sink.lock().expect("lines").push(line);
        }
    });
    lines
}

fn count(lines: &Mutex<Vec<String>>, what: &str) -> usize {
    lines
        .lock()
        .expect("lines")
        .iter()
        .filter(|l| l.contains(what))
        .count()
}

/// A `leasectl worker` whose URL says `transaction_pooler=true` and which has no direct URL:
/// it owns its group, its metrics say it polls, it says so once on stderr, `status` through
/// the pooler (the option from the flag) sees it, and SIGTERM stops it gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_through_the_pooler_polls_and_says_so_once() {
    let db = lease_testdb::database().await;
    let url = bouncer().url("postgres", &db.name, "transaction_pooler=true");
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
            .env("DATABASE_URL", &url)
            .env_remove("LEASE_DIRECT_URL")
            .env("LEASE_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn"),
    );
    let stdout = lines_of(child.0.stdout.take().expect("stdout"));
    let stderr = lines_of(child.0.stderr.take().expect("stderr"));
    wait_for("four assignments", Duration::from_secs(20), || {
        count(&stdout, "\"assigned\"") == 4
    });
    let mut body = String::new();
    wait_for("the metrics endpoint", Duration::from_secs(10), || {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        body.clear();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").is_ok()
            && s.read_to_string(&mut body).is_ok()
            && body.contains("lease_polling_fallback")
    });
    assert!(
        body.contains("lease_polling_fallback{group=\"orders\"} 1"),
        "{body}"
    );

    let plain = bouncer().url("postgres", &db.name, "");
    let (code, out, err) = run(
        &["status", "--group", "orders", "--transaction-pooler"],
        &[("DATABASE_URL", &plain)],
    );
    assert_eq!(code, 0, "{err}");
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
    assert!(exit.success(), "SIGTERM exit: {exit:?}");
    wait_for("the last lines", Duration::from_secs(5), || {
        count(&stdout, "\"stopped\"") == 1
    });
    assert_eq!(count(&stdout, "\"reason\":\"shutdown\""), 4);
    assert_eq!(
        count(&stderr, "no LISTEN"),
        1,
        "said once: {:?}",
        stderr.lock().expect("lines")
    );
}

/// `doctor` through the pooler: without a direct URL it warns that wake-ups cannot work (workers
/// poll) and fails nothing; with one it checks LISTEN/NOTIFY over the direct URL and says that
/// is what workers listen on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_through_the_pooler_judges_wake_ups_by_the_direct_url() {
    let db = lease_testdb::database().await;
    let pooled = bouncer().url("postgres", &db.name, "transaction_pooler=true");

    let (code, out, err) = run(&["doctor"], &[("DATABASE_URL", &pooled)]);
    assert_eq!(
        code, 0,
        "a pooler without a direct URL is a warning: {out}{err}"
    );
    let wake = out
        .lines()
        .find(|l| l.contains("wake-ups"))
        .unwrap_or_else(|| panic!("no wake-ups line: {out}"));
    assert!(wake.contains("warn"), "{wake}");
    assert!(wake.contains("--direct-url"), "{wake}");

    let (code, out, err) = run(
        &["doctor", "--direct-url", &db.url],
        &[("DATABASE_URL", &pooled)],
    );
    assert_eq!(code, 0, "{out}{err}");
    let wake = out
        .lines()
        .find(|l| l.contains("wake-ups"))
        .unwrap_or_else(|| panic!("no wake-ups line: {out}"));
    assert!(wake.contains("ok"), "{wake}");
    assert!(wake.contains("over the direct URL"), "{wake}");
    assert!(wake.contains("a pooler is in the way"), "{wake}");
}
