//! `leasectl run --events` with a real Python child on a real Postgres: one child hears every
//! assignment and revocation on stdin and acknowledges revocations on stdout; a bucket moves
//! only once acknowledged, and a child that does not acknowledge is killed and started again.

mod support;

use std::time::Duration;

use support::children::{Supervisor, Workdir, freeze_idle, until};

const FAST: &[&str] = &["--ttl", "3s", "--renew", "1s", "--grace", "1s"];

fn flags(group: &str) -> Vec<&str> {
    let mut f = vec!["--group", group];
    f.extend_from_slice(FAST);
    f
}

/// Wait until `sup` holds `n` buckets and its child logged a start for each of them.
fn until_holding(sup: &Supervisor, work: &Workdir, n: usize, what: &str) {
    let done = until(Duration::from_secs(30), || {
        let held = sup.held();
        let log = work.lines();
        held.len() == n
            && held.iter().all(|b| {
                let token = sup
                    .named("assigned")
                    .iter()
                    .rev()
                    .find(|e| e["bucket"] == *b)
                    .and_then(|e| e["token"].as_i64());
                log.of(*b).iter().any(|l| Some(l.token) == token)
            })
    });
    assert!(
        done.is_some(),
        "{what}: {} never worked {n}\n{}",
        sup.name,
        sup.dump()
    );
}

/// Revocations are acknowledged on stdout, and only then do the buckets move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_are_acknowledged_before_the_buckets_move() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("events");
    let a = Supervisor::start_events("a", &db.url, &flags("e:4"), &work, "ack");
    until_holding(&a, &work, 4, "alone");
    let b = Supervisor::start_events("b", &db.url, &flags("e:4"), &work, "ack");
    until_holding(&b, &work, 2, "sharing");
    until_holding(&a, &work, 2, "sharing");
    // One child each, never restarted; no acknowledgement was late.
    assert_eq!(a.named("child-started").len(), 1, "{}", a.dump());
    assert!(a.named("child-stopped").is_empty(), "{}", a.dump());
    let log = work.lines();
    let moved: Vec<u32> = a
        .named("revoked")
        .iter()
        .map(|e| e["bucket"].as_u64().expect("bucket") as u32)
        .collect();
    assert_eq!(moved.len(), 2, "{}", a.dump());
    for bucket in &moved {
        let lives = log.of(*bucket);
        assert!(lives[0].ended, "bucket {bucket}: {lives:?}");
    }
    let margin = log.check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("--events: acknowledged revocations; margin {margin:?} s");
    assert!(margin.is_some());
}

/// A child that does not acknowledge a revocation within --grace is killed (its revoked
/// buckets then move) and started again, hearing the buckets still held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_does_not_acknowledge_is_killed_and_started_again() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("noack");
    let a = Supervisor::start_events("a", &db.url, &flags("n:4"), &work, "noack");
    until_holding(&a, &work, 4, "alone");
    let b = Supervisor::start_events("b", &db.url, &flags("n:4"), &work, "noack");
    until_holding(&b, &work, 2, "sharing");
    until_holding(&a, &work, 2, "sharing");
    let stopped = a.named("child-stopped");
    assert_eq!(stopped.len(), 1, "{}", a.dump());
    assert_eq!(
        stopped[0]["why"],
        "a revocation was not acknowledged within --grace",
        "{}",
        a.dump()
    );
    assert_eq!(stopped[0]["signal"], "SIGKILL");
    let took = stopped[0]["took_ms"].as_u64().expect("took_ms");
    assert!(took < 500, "{}", stopped[0]);
    // Started again after the restart backoff (1 s), hearing the two buckets still held.
    let restarted = until(Duration::from_secs(10), || {
        a.named("child-started").len() == 2
    });
    assert!(restarted.is_some(), "{}", a.dump());
    let pid = a.named("child-started")[1]["pid"].as_i64().expect("pid") as i32;
    let heard = until(Duration::from_secs(10), || {
        let log = work.lines();
        a.held()
            .iter()
            .all(|b| log.of(*b).iter().any(|l| l.pid == pid))
    });
    assert!(heard.is_some(), "{:#?}\n{}", work.lines(), a.dump());
    let margin = work.lines().check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("--events without acknowledgement: killed and restarted; margin {margin:?} s");
    assert!(margin.is_some());
}

/// Frozen database connections: the renewals hang, so the one child is stopped before the
/// trust deadline (every bucket it works with it), and started again, hearing its buckets,
/// once a renewal moves the deadline. No overlap with the peer meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_connections_stop_the_child_before_the_trust_deadline() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("events-frozen");
    let a = Supervisor::start_events("a", &db.url, &flags("f:4"), &work, "ack");
    until_holding(&a, &work, 4, "alone");
    let frozen = freeze_idle(&db.url, &db.name).await;
    let b = Supervisor::start_events("b", &db.url, &flags("f:4"), &work, "ack");
    until_holding(&b, &work, 2, "with a's connections frozen");
    drop(frozen);
    until_holding(&a, &work, 2, "thawed");
    let stopped = a.named("child-stopped");
    assert!(
        stopped
            .iter()
            .any(|e| e["why"] == "no renewal before the trust deadline"),
        "{}",
        a.dump()
    );
    let margin = work.lines().check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("--events with frozen connections: margin {margin:?} s");
}
