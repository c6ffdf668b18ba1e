//! `leasectl run` with real children (Python scripts) on a real Postgres: every owned bucket
//! has one child with its assignment, a revoked bucket's child is gone before anyone else's
//! starts, and a supervisor's death takes its children with it.

mod support;

use std::time::Duration;

use support::children::{
    Supervisor, Workdir, children_with, is_gone, signal, until, until_every, until_working,
};

/// ttl 3 s, renew 1 s (margin 0.5 s): 1.25 s of room for --grace.
const FAST: &[&str] = &["--ttl", "3s", "--renew", "1s", "--grace", "1s"];

fn flags<'a>(group: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut f = vec!["--group", group];
    f.extend_from_slice(FAST);
    f.extend_from_slice(extra);
    f
}

/// Every bucket held has exactly one live child, started with the bucket's token in its
/// environment and arguments; a graceful stop ends them (their end lines written) before the
/// peer's children start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_owned_bucket_has_one_child_until_a_graceful_stop() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("children");
    let mut a = Supervisor::start("a", &db.url, &flags("g:8", &[]), &work, "work");
    let all_held = until(Duration::from_secs(30), || a.held().len() == 8);
    assert!(all_held.is_some(), "a never held 8 buckets\n{}", a.dump());
    // Every bucket: one child alive, started with the assignment's token.
    let started = until(Duration::from_secs(10), || {
        work.lines().by_bucket.len() == 8 && a.child_pids().len() == 8
    });
    assert!(started.is_some(), "not 8 children\n{}", a.dump());
    for e in a.named("assigned") {
        let bucket = e["bucket"].as_u64().expect("bucket") as u32;
        let lives = work.lines();
        let lives = lives.of(bucket);
        assert_eq!(lives.len(), 1, "bucket {bucket}: {lives:?}");
        assert_eq!(Some(lives[0].token), e["token"].as_i64(), "bucket {bucket}");
    }
    // Their stdout is passed through, prefixed with group and bucket.
    let prefixed = until(Duration::from_secs(5), || {
        a.passed()
            .iter()
            .filter(|l| l.starts_with("[g/") && l.contains("] working on bucket"))
            .count()
            == 8
    });
    assert!(prefixed.is_some(), "{:?}", a.passed());

    let b = Supervisor::start("b", &db.url, &flags("g:8", &[]), &work, "work");
    let shared = until(Duration::from_secs(30), || {
        a.held().len() == 4 && b.held().len() == 4
    });
    assert!(shared.is_some(), "not 4 and 4\n{}\n{}", a.dump(), b.dump());

    signal(a.pid(), "TERM");
    assert_eq!(
        a.wait_exit(Duration::from_secs(20)),
        Some(0),
        "{}",
        a.dump()
    );
    let stopped = a.named("child-stopped");
    assert_eq!(stopped.len(), 8, "{}", a.dump());
    for e in &stopped {
        assert_eq!(e["signal"], "SIGTERM", "{e}");
    }
    until_working(&b, &work, 8, Duration::from_secs(20), "after a stopped");
    let log = work.lines();
    let margin = log.check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("smallest margin between a child's last line and the next one's first: {margin:?} s");
    assert!(margin.is_some(), "no bucket moved");
    // a's children all wrote their end (SIGTERM): none was killed.
    let a_pids: Vec<i32> = stopped
        .iter()
        .map(|e| e["pid"].as_i64().expect("pid") as i32)
        .collect();
    for lives in log.by_bucket.values() {
        for life in lives.iter().filter(|l| a_pids.contains(&l.pid)) {
            assert!(life.ended, "{life:?} did not write its end");
        }
    }
    drop(b);
}

/// SIGKILL of a supervisor: every child, and what each forked, is gone at once (the
/// kernel's parent-death signal kills the children; the watchdog, whose pipe closes, kills
/// their process groups, grandchildren included); the peer takes the buckets after the ttl,
/// with no overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_takes_its_children_with_it() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("sigkill");
    let a = Supervisor::start("a", &db.url, &flags("k:6", &[]), &work, "fork");
    let b = Supervisor::start("b", &db.url, &flags("k:6", &[]), &work, "work");
    until_working(&a, &work, 3, Duration::from_secs(30), "sharing");
    until_working(&b, &work, 3, Duration::from_secs(10), "sharing");
    let mut pids = a.child_pids();
    let grandchildren = until(Duration::from_secs(10), || {
        work.lines().grandchildren.len() == 3
    });
    assert!(grandchildren.is_some(), "{:#?}", work.lines());
    pids.extend(work.lines().grandchildren);
    let watchdog = children_with(a.pid(), "__watchdog");
    assert_eq!(watchdog.len(), 1, "a's watchdog: {watchdog:?}");
    // Timed from before `kill(1)` runs: an upper bound.
    let killed = std::time::Instant::now();
    signal(a.pid(), "KILL");
    let gone = until_every(Duration::from_millis(1), Duration::from_secs(5), || {
        pids.iter().all(|&p| is_gone(p))
    })
    .map(|_| killed.elapsed());
    let gone = gone.unwrap_or_else(|| panic!("children {pids:?} outlived their supervisor"));
    eprintln!(
        "SIGKILL of the supervisor: its {} children and grandchildren gone within {gone:?}",
        pids.len()
    );
    assert!(gone < Duration::from_secs(1), "{gone:?}");
    // The watchdog, its work done, is gone too.
    let watchdog_gone = until(Duration::from_secs(5), || is_gone(watchdog[0]));
    assert!(
        watchdog_gone.is_some(),
        "the watchdog outlived its supervisor"
    );
    until_working(&b, &work, 6, Duration::from_secs(20), "after a was killed");
    let margin = work.lines().check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("smallest margin: {margin:?} s");
    assert!(margin.is_some(), "no bucket moved");
}

/// A resize: the old generation's children are stopped (revoked as resharded) before the new
/// generation's start, each new child with the old buckets its keys come from in
/// `LEASE_PARENTS`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_starts_the_new_buckets_children_with_their_parents() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("resize");
    let a = Supervisor::start("a", &db.url, &flags("z:2", &[]), &work, "work");
    until_working(&a, &work, 2, Duration::from_secs(30), "before the resize");
    let (code, out, err) = support::run(
        &[
            "resize", "--group", "z", "--from", "2", "--to", "4", "--apply",
        ],
        Some(&db.url),
    );
    assert_eq!(code, 0, "{out}{err}");
    let resized = until(Duration::from_secs(30), || {
        let passed = a.passed();
        (0..4).all(|b| {
            passed.iter().any(|l| {
                l.starts_with(&format!("[z/{b}] working on bucket {b} "))
                    && l.ends_with(&format!(" after buckets {}", b % 2))
            })
        })
    });
    assert!(resized.is_some(), "{:?}\n{}", a.passed(), a.dump());
    let resharded = a
        .named("revoked")
        .iter()
        .filter(|e| e["reason"] == "resharded")
        .count();
    assert_eq!(resharded, 2, "{}", a.dump());
    // The old buckets' children (tokens 1) ended before the new ones of their keys started.
    let log = work.lines();
    for b in 0..4u32 {
        let old = log.of(b % 2).iter().find(|l| l.token == 1);
        // A new bucket starts at its parents' highest token, plus one (Z4): token 2.
        let new = log.of(b).iter().find(|l| l.token == 2);
        let (Some(old), Some(new)) = (old, new) else {
            panic!("bucket {b}: no old or new child in {log:#?}");
        };
        assert!(old.last < new.first, "bucket {b}: {old:?} then {new:?}");
    }
}

/// A second signal stops the supervisor at once, while a child ignores the first one's stop
/// signal: it exits 1, without leaving, and its children die with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_stops_at_once_and_the_children_die_with_it() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("second");
    let mut a = Supervisor::start("a", &db.url, &flags("x:2", &[]), &work, "stubborn");
    until_working(&a, &work, 2, Duration::from_secs(30), "alone");
    let pids = a.child_pids();
    signal(a.pid(), "TERM");
    // The first signal's stops are under way (SIGTERM ignored, SIGKILL due after 1 s).
    let stopping = until(Duration::from_secs(5), || a.stderr().contains("stopping"));
    assert!(stopping.is_some(), "{}", a.dump());
    signal(a.pid(), "TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(5)), Some(1), "{}", a.dump());
    assert!(
        a.stderr().contains("stopped at once by a second signal"),
        "{}",
        a.dump()
    );
    let gone = until(Duration::from_secs(2), || pids.iter().all(|&p| is_gone(p)));
    assert!(
        gone.is_some(),
        "children {pids:?} outlived their supervisor"
    );
}
