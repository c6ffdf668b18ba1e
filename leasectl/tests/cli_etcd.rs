//! `leasectl` on etcd (built with `--features etcd`), as a user runs it: `migrate` (nothing to
//! do), `doctor`, two `leasectl worker` processes sharing a group, `status` (the nodes, the
//! group, `--json`, `--why`), `drain --wait` and `uncordon`, `resize --apply`, and `release`
//! of a killed worker, on the test process's shared three-member etcd cluster
//! (`lease_testetcd::cluster()`), each test under a key prefix of its own.

#![cfg(feature = "etcd")]

mod support;

use std::time::Duration;

use support::{WorkerProcess, parse_nodes_status, run, wait_for};

/// `etcd://` with the shared cluster's members and a fresh key prefix.
fn etcd_url() -> String {
    let cluster = lease_testetcd::cluster();
    let members: Vec<String> = cluster
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    let prefix = lease_testetcd::prefix();
    format!("etcd://{}/{}", members.join(","), prefix.trim_matches('/'))
}

/// Runs `args` on `url`, insisting on exit 0; its stdout.
fn ok(args: &[&str], url: &str) -> String {
    let (code, out, err) = run(args, Some(url));
    assert_eq!(code, 0, "{args:?} exited {code}: {err}");
    out
}

fn owned(w: &WorkerProcess) -> usize {
    w.owned_in("orders").len()
}

#[test]
fn migrate_has_nothing_to_do_and_doctor_passes() {
    let url = etcd_url();
    let said = ok(&["migrate"], &url);
    assert!(
        said.starts_with("nothing to migrate: the etcd store has no schema"),
        "{said}"
    );
    let said = ok(&["doctor"], &url);
    let lines: Vec<&str> = said.lines().collect();
    assert_eq!(lines.len(), 2, "{said}");
    assert!(
        lines[0].starts_with("ok    connection   etcd members http://127.0.0.1:"),
        "{said}"
    );
    assert!(lines[0].contains("do not apply to etcd"), "{said}");
    assert!(
        lines[1]
            .starts_with("ok    sessions     the cluster has a leader and answers reads: 0 nodes"),
        "{said}"
    );
    let said: serde_json::Value =
        serde_json::from_str(&ok(&["doctor", "--json"], &url)).expect("one JSON object");
    assert_eq!(said["ok"], true, "{said}");
    assert_eq!(said["checks"][1]["check"], "sessions", "{said}");

    // No member there: the doctor fails (exit 1) and says so.
    let (code, out, err) = run(&["doctor"], Some("etcd://127.0.0.1:9/nobody"));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("FAIL  connection   "), "{out}");
    assert!(err.contains("workers cannot run here"), "{err}");
}

/// Two workers share a group; the operators' commands steer them; a resize doubles the group;
/// a killed worker's buckets are released at once.
#[test]
fn two_workers_share_a_group_and_the_commands_steer_them() {
    let url = etcd_url();
    let url = url.as_str();
    let limit = Duration::from_secs(20);
    let groups = [("orders", 8)];
    let a = WorkerProcess::spawn_groups("a", url, &groups, "3s", "500ms", &[]);
    let mut b = WorkerProcess::spawn_groups("b", url, &groups, "3s", "500ms", &[]);
    wait_for("a and b share eight buckets", limit, || {
        owned(&a) == 4 && owned(&b) == 4
    });
    let (ida, idb) = (a.worker().expect("a"), b.worker().expect("b"));
    let (ida, idb) = (ida.to_string(), idb.to_string());

    // The nodes, as a table and as JSON.
    let said = ok(&["status"], url);
    for id in [&ida, &idb] {
        let line = said
            .lines()
            .find(|l| l.starts_with(id.as_str()))
            .unwrap_or_else(|| panic!("{id} not in {said}"));
        assert!(line.contains(" live ") && line.contains("orders"), "{line}");
    }
    assert!(
        said.contains("2 node(s), 2 live, in 2 group membership(s)"),
        "{said}"
    );
    let nodes = parse_nodes_status(&ok(&["status", "--json"], url)).expect("the nodes' JSON");
    assert_eq!(nodes.len(), 2, "{nodes:?}");

    // The group: both members live, every bucket owned live by one of them.
    let said = ok(&["status", "--group", "orders"], url);
    assert!(
        said.contains("balance: 2 live member(s), 8/8 buckets owned, min 4, max 4: balanced"),
        "{said}"
    );
    let snap: serde_json::Value =
        serde_json::from_str(&ok(&["status", "--group", "orders", "--json"], url))
            .expect("one JSON object");
    let buckets = snap["buckets"].as_array().expect("buckets");
    assert_eq!(buckets.len(), 8, "{snap}");
    for b in buckets {
        assert_eq!(b["state"], "live", "{snap}");
        let owner = b["owner"].as_str().expect("an owner");
        assert!(owner == ida || owner == idb, "{snap}");
    }
    let members = snap["members"].as_array().expect("members");
    assert_eq!(members.len(), 2, "{snap}");

    // Why bucket 0 is where it is.
    let holder = if a.owned_in("orders").contains_key(&0) {
        &ida
    } else {
        &idb
    };
    let said = ok(&["status", "--group", "orders", "--why", "0"], url)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        said.contains(&format!("Bucket 0 of orders is owned by {holder} since")),
        "{said}"
    );

    // Drain a: b takes everything; uncordon: they share again.
    let said = ok(
        &[
            "drain", "--group", "orders", "--worker", &ida, "--wait", "15s",
        ],
        url,
    );
    assert!(said.contains("drained in "), "{said}");
    wait_for("b takes a's four", limit, || {
        owned(&a) == 0 && owned(&b) == 8
    });
    ok(&["uncordon", "--group", "orders", "--worker", &ida], url);
    wait_for("a and b share again", limit, || {
        owned(&a) == 4 && owned(&b) == 4
    });

    // Resize from 8 to 16 while they run: a plan, then the resize.
    let said = ok(
        &["resize", "--group", "orders", "--from", "8", "--to", "16"],
        url,
    );
    assert!(
        said.starts_with("resize plan: group \"orders\": 8 -> 16 shards, generation 0 -> 1"),
        "{said}"
    );
    let said = ok(
        &[
            "resize", "--group", "orders", "--from", "8", "--to", "16", "--apply",
        ],
        url,
    );
    assert!(
        said.starts_with("group \"orders\": resized from 8 to 16 shards; generation 1 started"),
        "{said}"
    );
    let shards_16 = |w: &WorkerProcess| {
        w.events_in("orders")
            .iter()
            .filter(|e| e.event == "assigned" && e.shards == Some(16))
            .count()
    };
    wait_for("a and b share sixteen buckets", limit, || {
        owned(&a) == 8 && owned(&b) == 8 && shards_16(&a) >= 8 && shards_16(&b) >= 8
    });

    // b is killed (no leaving): release gives its buckets to a before its session expires.
    b.signal("KILL");
    b.wait(limit);
    let said = ok(&["release", "--group", "orders", "--worker", &idb], url);
    assert!(said.contains("would release 8 bucket(s)"), "{said}");
    let said = ok(
        &["release", "--group", "orders", "--worker", &idb, "--force"],
        url,
    );
    assert!(
        said.starts_with("released 8 bucket(s)") && said.contains("its membership is removed"),
        "{said}"
    );
    wait_for("a takes all sixteen", limit, || owned(&a) == 16);
    let said = ok(&["status", "--group", "orders"], url);
    assert!(
        said.contains("balance: 1 live member(s), 16/16 buckets owned, min 16, max 16: balanced"),
        "{said}"
    );

    let mut a = a;
    a.signal("TERM");
    assert!(a.wait(limit).success(), "a did not stop cleanly");
}
