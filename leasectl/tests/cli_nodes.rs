//! `leasectl worker` in several groups (one process, one session) and `leasectl status` of the
//! nodes, as a user runs them.

mod support;

use std::time::Duration;

use support::{WorkerProcess, parse_nodes_status, run, wait_for};

/// The two forms of `--group` do not mix, and a plain name needs `--shards`: exit 2 with a
/// message naming the flag, before any database is looked at.
#[test]
fn a_mix_of_group_forms_exits_2_and_names_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "worker",
                "--group",
                "orders",
                "--group",
                "billing:64",
                "--shards",
                "16",
            ],
            "not a mix",
        ),
        (
            &["worker", "--group", "orders:16", "--shards", "16"],
            "not a mix",
        ),
        (&["worker", "--group", "orders"], "orders:N"),
        (&["worker", "--group", "orders:0"], "--group orders:0"),
        (
            &["worker", "--group", "orders:4", "--group", "orders:8"],
            "given twice",
        ),
        (
            &["worker", "--group", "orders:-1"],
            "--group orders:-1: the shard count must be a whole number from 1 to 65536, not -1",
        ),
    ];
    for (args, said) in cases {
        let (code, out, err) = run(args, None);
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert!(
            err.contains(said) && (err.contains("--group") || err.contains("--shards")),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}

/// Two processes, each `--group orders:4 --group billing:6`, share each group evenly; every
/// event names its group. `status` (no `--group`) lists both nodes live in both groups, and
/// `status --group` each group as before. Stopped with SIGTERM, each says `stopped` for each
/// group and exits 0, and the store lists no node: leaving its last group ended each session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_two_groups_shares_both_and_status_lists_the_nodes() {
    let db = lease_testdb::database().await;
    let groups = [("orders", 4), ("billing", 6)];
    let mut workers: Vec<WorkerProcess> = ["a", "b"]
        .iter()
        .map(|name| WorkerProcess::spawn_groups(name, &db.url, &groups, "3s", "1s", &[]))
        .collect();
    wait_for("both groups shared evenly", Duration::from_secs(30), || {
        groups.iter().all(|(g, n)| {
            workers
                .iter()
                .all(|w| w.owned_in(g).len() == *n as usize / 2)
        })
    });
    for w in &workers {
        assert!(w.bad_lines().is_empty(), "{:?}", w.bad_lines());
        let started: Vec<String> = w
            .events()
            .into_iter()
            .filter(|e| e.event == "started")
            .map(|e| e.group)
            .collect();
        assert_eq!(started, ["orders", "billing"], "{}", w.name);
        for e in w.events() {
            assert!(
                groups.iter().any(|(g, _)| *g == e.group),
                "an event of no group of the worker: {e:?}"
            );
        }
    }

    let (code, out, err) = run(&["status", "--json"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    let nodes = parse_nodes_status(&out).expect("status of the nodes");
    assert_eq!(nodes.len(), 2, "{nodes:?}");
    for w in &workers {
        let id = w.worker().expect("started");
        let node = nodes
            .iter()
            .find(|n| n.node == id)
            .unwrap_or_else(|| panic!("{} not listed: {nodes:?}", w.name));
        assert!(node.live, "{node:?}");
        assert_eq!(node.groups, ["billing", "orders"], "{node:?}");
        assert!(node.metadata.contains("pid="), "{node:?}");
    }
    let (code, text, err) = run(&["status", "--nodes"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("2 node(s), 2 live, in 4 group membership(s)"),
        "{text}"
    );
    assert!(text.contains("billing, orders"), "{text}");
    let (code, text, err) = run(&["status", "--group", "billing"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    assert!(
        text.contains("balance: 2 live member(s), 6/6 buckets owned, min 3, max 3: balanced"),
        "{text}"
    );

    for w in &workers {
        w.signal("TERM");
    }
    for w in &mut workers {
        let status = w.wait(Duration::from_secs(20));
        assert!(
            status.success(),
            "{} exited {status:?}: {:?}",
            w.name,
            w.stderr()
        );
        let stopped: Vec<String> = w
            .events()
            .into_iter()
            .filter(|e| e.event == "stopped")
            .map(|e| e.group)
            .collect();
        assert_eq!(stopped, ["orders", "billing"], "{}", w.name);
        for (g, _) in &groups {
            assert!(w.owned_in(g).is_empty(), "{} still owns {g}", w.name);
        }
    }
    let (code, out, err) = run(&["status", "--json"], Some(&db.url));
    assert_eq!(code, 0, "{err}");
    let nodes = parse_nodes_status(&out).expect("status of the nodes");
    assert!(
        nodes.is_empty(),
        "nodes left after a graceful stop: {nodes:?}"
    );
}

/// `worker --group new:4 --group stored:4` where `stored` has 8 buckets: refused, exit 2,
/// naming the flag, before anything is written: `new` is not created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_group_leaves_the_other_groups_uncreated() {
    let db = lease_testdb::database().await;
    let store = lease::postgres::PgLeaseStore::builder(db.url.clone())
        .max_connections(1)
        .build()
        .expect("a store");
    let stored = lease::GroupName::new("stored").expect("name");
    let eight = lease::ShardCount::new(8).expect("a count");
    lease::store::WorkerStore::ensure_group(&store, &stored, eight)
        .await
        .expect("the stored group");
    let (code, out, err) = run(
        &["worker", "--group", "new:4", "--group", "stored:4"],
        Some(&db.url),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--group stored:4") && err.contains("exists with 8 shards"),
        "{err}"
    );
    assert!(out.is_empty(), "a refused worker announced itself: {out}");
    let (code, _, err) = run(&["status", "--group", "new"], Some(&db.url));
    assert_eq!(code, 2, "the refused worker created group new: {err}");
    assert!(err.contains("does not exist"), "{err}");
}
