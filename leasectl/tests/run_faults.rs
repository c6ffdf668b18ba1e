//! `leasectl run` under faults, with real children on a real Postgres: a supervisor stopped
//! (SIGSTOP) for longer than the ttl, its database connections frozen, a child that ignores
//! SIGTERM, a crash-looping child, a rolling restart with --keep-on-stop. In every case the
//! children's own lines show no two children of one bucket at work at once.

mod support;

use std::time::{Duration, Instant};

use support::children::{Supervisor, Workdir, freeze_idle, is_gone, signal, until, until_working};

/// ttl 3 s, renew 1 s (margin 0.5 s): 1.25 s of room for --grace.
const FAST: &[&str] = &["--ttl", "3s", "--renew", "1s", "--grace", "1s"];

fn flags<'a>(group: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut f = vec!["--group", group];
    f.extend_from_slice(FAST);
    f.extend_from_slice(extra);
    f
}

fn no_overlap(work: &Workdir) -> f64 {
    let margin = work.lines().check().unwrap_or_else(|e| panic!("{e}"));
    margin.unwrap_or_else(|| panic!("no bucket moved: {:#?}", work.lines()))
}

/// A supervisor stopped for twice the ttl cannot stop its children itself: its watchdog
/// kills them before its trust deadline, and the peer's children start only after. Resumed,
/// the supervisor finds its session gone and gets a share again, still with no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_supervisor_s_children_die_before_the_peer_s_start() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("sigstop");
    let a = Supervisor::start("a", &db.url, &flags("s:6", &[]), &work, "work");
    let b = Supervisor::start("b", &db.url, &flags("s:6", &[]), &work, "work");
    until_working(&a, &work, 3, Duration::from_secs(30), "sharing");
    until_working(&b, &work, 3, Duration::from_secs(10), "sharing");
    let pids = a.child_pids();
    let stopped_at = Instant::now();
    signal(a.pid(), "STOP");
    let killed = until(Duration::from_secs(5), || pids.iter().all(|&p| is_gone(p)));
    let killed = killed.unwrap_or_else(|| panic!("a's children {pids:?} outlived its trust"));
    eprintln!("SIGSTOP: the watchdog killed a's children {killed:?} after the stop");
    // Within the trust left at the stop: at most ttl - margin (2.5 s).
    assert!(killed < Duration::from_millis(2500), "{killed:?}");
    until_working(&b, &work, 6, Duration::from_secs(20), "a stopped");
    // Twice the ttl.
    let stopped_for = Duration::from_secs(6).saturating_sub(stopped_at.elapsed());
    std::thread::sleep(stopped_for);
    signal(a.pid(), "CONT");
    until_working(&a, &work, 3, Duration::from_secs(30), "a resumed");
    until_working(&b, &work, 3, Duration::from_secs(10), "a resumed");
    let log = work.lines();
    // The margins of the moves the stop caused: each of a's killed children's last line to
    // the first line of the next child of its bucket (the peer's).
    let mut stop_margin = f64::INFINITY;
    for &pid in &pids {
        let lives = log
            .by_bucket
            .values()
            .find(|lives| lives.iter().any(|l| l.pid == pid))
            .unwrap_or_else(|| panic!("child {pid} never wrote"));
        let at = lives.iter().position(|l| l.pid == pid).unwrap_or(0);
        let life = &lives[at];
        assert!(
            !life.ended,
            "{life:?}: stopped by SIGKILL, it writes no end"
        );
        let next = lives
            .get(at + 1)
            .unwrap_or_else(|| panic!("nobody worked {life:?}'s bucket after it"));
        stop_margin = stop_margin.min(next.first - life.last);
    }
    assert!(stop_margin > 0.0, "{log:#?}");
    eprintln!("margin of the moves the stop caused: {stop_margin:.3} s");
    assert!(
        a.stderr().contains("deadline passed without a renewal"),
        "{}",
        a.dump()
    );
    let margin = no_overlap(&work);
    eprintln!(
        "smallest margin of any move (the graceful ones back after the resume too): {margin:.3} s"
    );
}

/// Frozen database connections: the supervisor's renewals hang, so its children are stopped
/// before its trust deadline; once the server answers again the group shares out again. No
/// overlap throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_database_connections_stop_the_children_in_time() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("frozen");
    let a = Supervisor::start("a", &db.url, &flags("f:4", &[]), &work, "work");
    until_working(&a, &work, 4, Duration::from_secs(30), "alone");
    let frozen = freeze_idle(&db.url, &db.name).await;
    let before = a.child_pids();
    let b = Supervisor::start("b", &db.url, &flags("f:4", &[]), &work, "work");
    // Either a's renewals hang until its children must stop (and b takes the buckets), or
    // a renews on a new connection: in both cases b ends up working its share.
    until_working(
        &b,
        &work,
        2,
        Duration::from_secs(30),
        "with a's connections frozen",
    );
    drop(frozen);
    until_working(&a, &work, 2, Duration::from_secs(30), "thawed");
    until_working(&b, &work, 2, Duration::from_secs(10), "thawed");
    let stopped_for_trust = a
        .named("child-stopped")
        .iter()
        .filter(|e| e["why"] == "no renewal before the trust deadline")
        .count();
    eprintln!(
        "frozen connections: {stopped_for_trust} of a's {} children stopped for want of a \
         renewal",
        before.len()
    );
    // Its renewals hung: every child it ran was stopped by the supervisor for the deadline.
    assert_eq!(stopped_for_trust, before.len(), "{}", a.dump());
    no_overlap(&work);
}

/// A child that ignores SIGTERM is killed with SIGKILL once its grace is over, and only then
/// is its bucket released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_ignores_sigterm_is_killed_after_its_grace() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("stubborn");
    let a = Supervisor::start("a", &db.url, &flags("t:4", &[]), &work, "stubborn");
    until_working(&a, &work, 4, Duration::from_secs(30), "alone");
    let b = Supervisor::start("b", &db.url, &flags("t:4", &[]), &work, "stubborn");
    until_working(&b, &work, 2, Duration::from_secs(30), "sharing");
    let stopped = a.named("child-stopped");
    assert_eq!(stopped.len(), 2, "{}", a.dump());
    for e in &stopped {
        assert_eq!(e["signal"], "SIGKILL", "{e}");
        let took = e["took_ms"].as_u64().expect("took_ms");
        assert!((1000..2000).contains(&took), "{e}");
    }
    let margin = no_overlap(&work);
    eprintln!("stubborn children: SIGKILL after the 1 s grace; margin {margin:.3} s");
}

/// A child that crashes at once on one bucket: restarted with backoff, and after
/// --crash-limit crashes its bucket is quarantined (with the exit code and its last stderr
/// line) and released, while the other buckets' children run on untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_looping_bucket_is_quarantined_and_the_others_run_on() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("crash");
    let extra = [
        "--restart-backoff",
        "200ms",
        "--crash-limit",
        "3",
        "--quarantine-for",
        "10m",
    ];
    let a = Supervisor::start("a", &db.url, &flags("c:4", &extra), &work, "crash:2");
    let quarantined = until(Duration::from_secs(30), || {
        a.named("revoked")
            .iter()
            .any(|e| e["bucket"] == 2 && e["reason"] == "quarantined")
    });
    assert!(quarantined.is_some(), "{}", a.dump());
    let q = a.named("quarantined");
    assert_eq!(q.len(), 1, "{}", a.dump());
    assert_eq!(q[0]["bucket"], 2);
    assert_eq!(q[0]["crashes"], 3);
    assert_eq!(q[0]["status"], "exit code 3");
    let reason = q[0]["reason"].as_str().expect("reason");
    assert!(reason.contains("poison in bucket 2"), "{reason}");
    // The timeline: three crashes 200 ms then 400 ms apart (plus the child's start), then
    // the quarantine.
    let exits = a.named("child-exited");
    assert_eq!(exits.len(), 2, "{}", a.dump());
    assert_eq!(exits[0]["restart_in_ms"], 200);
    assert_eq!(exits[1]["restart_in_ms"], 400);
    for e in exits.iter().chain(&q) {
        eprintln!(
            "{} {} bucket {}: {}",
            e["at"], e["event"], e["bucket"], e["status"]
        );
    }
    // The other three children were never restarted: one life each, still at work.
    let log = work.lines();
    assert_eq!(log.of(2).len(), 3, "{:?}", log.of(2));
    for bucket in [0, 1, 3] {
        let lives = log.of(bucket);
        assert_eq!(lives.len(), 1, "bucket {bucket}: {lives:?}");
        assert!(!is_gone(lives[0].pid), "bucket {bucket}'s child ended");
    }
    assert_eq!(a.held(), vec![0, 1, 3]);
    // The store has it: status shows the quarantine.
    // The store has it, with its reason: status and status --why show both.
    let (code, status, _) = support::run(&["status", "--group", "c"], Some(&db.url));
    assert_eq!(code, 0, "{status}");
    assert!(
        status.contains("quarantined for") && status.contains("its child crashed 3 times"),
        "{status}"
    );
    let (code, why, _) = support::run(&["status", "--group", "c", "--why", "2"], Some(&db.url));
    assert_eq!(code, 0, "{why}");
    // The paragraph is wrapped: compare with its lines joined.
    let joined = why.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        joined.contains("under quarantine")
            && joined.contains("The quarantine's reason: \"its child crashed 3 times"),
        "{why}"
    );
    let (code, why_json, _) = support::run(
        &["status", "--group", "c", "--why", "2", "--json"],
        Some(&db.url),
    );
    assert_eq!(code, 0, "{why_json}");
    let why_json: serde_json::Value = serde_json::from_str(&why_json).expect("JSON");
    assert_eq!(why_json["quarantine_reason"], reason, "{why_json}");
    eprintln!("{status}\n{why}");
}

/// A rolling restart with --keep-on-stop: the next process with the node's id takes the
/// session and its buckets with their tokens; no child of them is started elsewhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_keeps_the_buckets_off_the_peers() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("keep");
    let id = "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a12";
    let keep = ["--node-id", id, "--keep-on-stop", "20s"];
    let mut a = Supervisor::start("a", &db.url, &flags("r:6", &keep), &work, "work");
    until_working(&a, &work, 6, Duration::from_secs(30), "alone");
    let b = Supervisor::start("b", &db.url, &flags("r:6", &[]), &work, "work");
    until_working(&b, &work, 3, Duration::from_secs(30), "sharing");
    until_working(&a, &work, 3, Duration::from_secs(10), "sharing");
    let a_held = a.held();
    let b_started = b.named("child-started").len();
    signal(a.pid(), "TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        a.dump()
    );
    let a2 = Supervisor::start("a2", &db.url, &flags("r:6", &keep), &work, "work");
    until_working(&a2, &work, 3, Duration::from_secs(30), "after the restart");
    assert_eq!(a2.held(), a_held, "{}", a2.dump());
    // Same tokens: the session and its leases were handed over, not claimed anew.
    let log = work.lines();
    for bucket in &a_held {
        let lives = log.of(*bucket);
        let tokens: Vec<i64> = lives.iter().map(|l| l.token).collect();
        assert_eq!(lives.len(), 2, "bucket {bucket}: {lives:?}");
        assert_eq!(tokens[0], tokens[1], "bucket {bucket}: {lives:?}");
    }
    assert_eq!(b.named("child-started").len(), b_started, "{}", b.dump());
    no_overlap(&work);
}

/// A --grace that does not fit before the trust deadline is refused before anything starts,
/// naming the flags.
#[test]
fn a_grace_with_no_room_is_refused() {
    let (code, out, err) = support::run(
        &[
            "run", "--group", "g:4", "--ttl", "3s", "--renew", "1s", "--grace", "2s", "--", "true",
        ],
        Some("postgres://nobody@127.0.0.1:1/none"),
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("--grace 2s leaves no room") && err.contains("--ttl 3s minus --margin"),
        "{err}"
    );
}
