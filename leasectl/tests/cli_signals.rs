//! The signals that stop `leasectl worker`: SIGHUP (a closed terminal, a supervisor's hang-up)
//! stops it the way SIGTERM and SIGINT do, gracefully, and a second signal at once.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::{FreezableProxy, WorkerProcess, run, wait_for};

/// The members `status --json` lists in group `orders`.
fn members(url: &str) -> Vec<Value> {
    let (code, out, err) = run(&["status", "--group", "orders", "--json"], Some(url));
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(out.trim()).expect("status JSON");
    status["members"].as_array().expect("members").clone()
}

/// On SIGHUP a worker revokes every bucket (reason shutdown), leaves the group and exits 0,
/// like on SIGTERM. Told to stop while the database does not answer, a second SIGHUP ends it
/// at once, without leaving, exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_stops_a_worker_gracefully_and_a_second_one_at_once() {
    let db = lease_testdb::database().await;
    let mut w = WorkerProcess::spawn("w", &db.url, "orders", 4, "3s", "1s");
    wait_for("four buckets", Duration::from_secs(20), || {
        w.owned().len() == 4
    });
    w.signal("HUP");
    let status = w.wait(Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "{status:?}: {:?}", w.stderr());
    let events = w.events();
    let shutdown = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("shutdown"))
        .count();
    assert_eq!(shutdown, 4, "{events:?}");
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("stopped"));
    assert!(w.owned().is_empty());
    assert_eq!(
        members(&db.url),
        Vec::<Value>::new(),
        "the worker did not leave"
    );

    // ttl 60 s: a leave call may wait 30 s before it times out.
    let proxy = FreezableProxy::start(&db).await;
    let mut w = WorkerProcess::spawn("w2", &proxy.url, "orders", 4, "60s", "1s");
    wait_for("four buckets", Duration::from_secs(20), || {
        w.owned().len() == 4
    });
    proxy.freeze();
    w.signal("HUP");
    wait_for("the notice of a stop", Duration::from_secs(20), || {
        w.stderr().iter().any(|l| l.contains("leasectl: stopping"))
    });
    let second = Instant::now();
    w.signal("HUP");
    let status = w.wait(Duration::from_secs(20));
    let took = second.elapsed();
    assert_eq!(status.code(), Some(1), "{status:?}: {:?}", w.stderr());
    assert!(
        took < Duration::from_secs(10),
        "the second SIGHUP took {took:?} to end the worker"
    );
    let said = w.stderr().join("\n");
    assert!(
        said.contains("second signal") && said.contains("without leaving the group"),
        "{said}"
    );
    proxy.thaw();
    assert_eq!(members(&db.url).len(), 1, "the worker left after all");
}
