//! `leasectl run --balance cpu` on a real Postgres with real children: a child that burns a
//! core makes its bucket hot, and its worker ends up working it nearly alone while the
//! other works the idle buckets, with no bucket worked twice at once.

mod support;

use std::time::Duration;

use support::children::{Supervisor, Workdir, until};

/// ttl 3 s, renew 1 s (margin 0.5 s), grace 1 s, balanced by CPU.
const FLAGS: &[&str] = &[
    "--group",
    "g:8",
    "--ttl",
    "3s",
    "--renew",
    "1s",
    "--grace",
    "1s",
    "--balance",
    "cpu",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_that_burns_a_core_leaves_its_worker_fewer_buckets() {
    let db = lease_testdb::database().await;
    let work = Workdir::new("balance");
    let a = Supervisor::start("a", &db.url, FLAGS, &work, "burn:0");
    let all = until(Duration::from_secs(30), || a.held().len() == 8);
    assert!(all.is_some(), "a never held 8 buckets\n{}", a.dump());
    let b = Supervisor::start("b", &db.url, FLAGS, &work, "burn:0");
    // Bucket 0's child burns a core; the seven others idle. Its owner is isolated: it keeps
    // bucket 0 and at most one idle bucket, and the other worker takes the rest.
    let hot_alone = until(Duration::from_secs(60), || {
        let (ha, hb) = (a.held(), b.held());
        let (hot, cold) = if ha.contains(&0) { (ha, hb) } else { (hb, ha) };
        hot.contains(&0) && hot.len() <= 2 && hot.len() + cold.len() == 8
    });
    assert!(
        hot_alone.is_some(),
        "bucket 0's worker still has more than 2 buckets: a {:?}, b {:?}\n{}\n{}",
        a.held(),
        b.held(),
        a.dump(),
        b.dump()
    );
    eprintln!(
        "bucket 0 isolated after {:?}: a {:?}, b {:?}",
        hot_alone,
        a.held(),
        b.held()
    );
    // status shows the loads: per member, and on the hot bucket.
    let (code, status, _) = support::run(&["status", "--group", "g"], Some(&db.url));
    assert_eq!(code, 0, "{status}");
    assert!(status.contains("work (by load)"), "{status}");
    let bucket0 = status
        .lines()
        .find(|l| l.trim_start().starts_with("0 "))
        .unwrap_or_default();
    assert!(bucket0.contains(", load "), "{status}");
    eprintln!("{status}");
    // status --why explains the plan by load: bucket 0 isolated on its worker, or (when the
    // machine is busy and the idle children's CPU adds up) within the band of a load target.
    let (code, why, _) = support::run(&["status", "--group", "g", "--why", "0"], Some(&db.url));
    assert_eq!(code, 0, "{why}");
    let said = why.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        said.contains("(isolated)") || said.contains("of its load target"),
        "{why}"
    );
    eprintln!("{why}");
    let (code, json, _) = support::run(&["status", "--group", "g", "--json"], Some(&db.url));
    assert_eq!(code, 0, "{json}");
    let v: serde_json::Value = serde_json::from_str(&json).expect("json");
    let hot = v["buckets"][0]["load"].as_f64().expect("bucket 0's load");
    assert!(
        hot > 0.3,
        "bucket 0's child burns a core, its load says {hot}\n{json}"
    );
    drop(a);
    drop(b);
    let margin = work.lines().check().unwrap_or_else(|e| panic!("{e}"));
    eprintln!("smallest margin between a child's last line and the next one's first: {margin:?} s");
    assert!(margin.is_some(), "no bucket moved");
}
