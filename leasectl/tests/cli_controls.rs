//! The operators' controls as a user runs them: `worker --weight`, `weight`, `cordon`,
//! `drain --wait`, `uncordon`, `quarantine` and `unquarantine` on live `leasectl worker`
//! processes, from another process, and what `status` (and `status --why`) shows of them.

mod support;

use std::time::Duration;

use support::{WorkerProcess, run, wait_for};

/// Bad values exit 2 naming the flag, before any database is looked at.
#[test]
fn bad_control_values_exit_2_and_name_the_flag() {
    let worker = "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a11";
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "weight", "--group", "g", "--worker", worker, "--weight", "-1",
            ],
            "--weight",
        ),
        (
            &[
                "weight", "--group", "g", "--worker", worker, "--weight", "2000000",
            ],
            "--weight",
        ),
        (&["cordon", "--group", "g", "--worker", "nope"], "--worker"),
        (
            &["quarantine", "--group", "g", "--bucket", "0", "--for", "0s"],
            "--for",
        ),
        (
            &[
                "quarantine",
                "--group",
                "g",
                "--bucket",
                "0",
                "--for",
                "400d",
            ],
            "--for",
        ),
        (
            &[
                "quarantine",
                "--group",
                "g",
                "--bucket",
                "0",
                "--for",
                "5m",
                "--reason",
                "",
            ],
            "--reason",
        ),
        (&["worker", "--group", "g:4", "--weight", "x"], "--weight"),
    ];
    for (args, said) in cases {
        let (code, out, err) = run(args, None);
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert!(err.contains(said), "{args:?}: {err}");
        assert!(out.is_empty(), "{args:?} printed {out}");
    }
}

fn owned(w: &WorkerProcess) -> usize {
    w.owned_in("orders").len()
}

fn revoked_for(w: &WorkerProcess, reason: &str) -> usize {
    w.events_in("orders")
        .iter()
        .filter(|e| e.event == "revoked" && e.reason.as_deref() == Some(reason))
        .count()
}

/// Two workers on eight buckets, one started with `--weight 3`: 6 and 2. `weight` evens them;
/// `cordon` keeps the other's four while a third worker arrives and gets none of them;
/// `drain --wait` empties a worker (reason `drained`) and says how long it took; `uncordon`
/// brings it back; `quarantine` takes a bucket out (reason `quarantined`) until
/// `unquarantine`; `status` shows weights, modes and the quarantine. A stranger or a bucket
/// out of range exits 2 and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controls_steer_live_workers_from_another_process() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let groups = [("orders", 8)];
    let a = WorkerProcess::spawn_groups("a", url, &groups, "3s", "1s", &["--weight", "3"]);
    let b = WorkerProcess::spawn_groups("b", url, &groups, "3s", "1s", &[]);
    let limit = Duration::from_secs(30);
    wait_for("weights 3 : 1", limit, || owned(&a) == 6 && owned(&b) == 2);
    let (ida, idb) = (a.worker().expect("a"), b.worker().expect("b"));
    let (ida, idb) = (ida.to_string(), idb.to_string());

    let ok = |args: &[&str]| {
        let (code, out, err) = run(args, Some(url));
        assert_eq!(code, 0, "{args:?}: {err}");
        out
    };
    let said = ok(&[
        "weight", "--group", "orders", "--worker", &ida, "--weight", "1",
    ]);
    assert!(said.contains("has weight 1"), "{said}");
    wait_for("weights 1 : 1", limit, || owned(&a) == 4 && owned(&b) == 4);

    let given_up = |w: &WorkerProcess| revoked_for(w, "shed") + revoked_for(w, "drained");
    let before = given_up(&b);
    let said = ok(&["cordon", "--group", "orders", "--worker", &idb]);
    assert!(said.contains("keeps its 4 bucket(s)"), "{said}");
    let c = WorkerProcess::spawn_groups("c", url, &groups, "3s", "1s", &[]);
    wait_for("c shares a's buckets only", limit, || {
        owned(&a) == 2 && owned(&b) == 4 && owned(&c) == 2
    });
    assert_eq!(given_up(&b), before, "a cordoned worker gave buckets up");
    let status = ok(&["status", "--group", "orders"]);
    let line = status
        .lines()
        .find(|l| l.starts_with(&idb))
        .unwrap_or_else(|| panic!("b not in {status}"));
    assert!(line.contains("cordoned"), "{line}");
    assert!(status.contains(": balanced"), "{status}");

    let said = ok(&[
        "drain", "--group", "orders", "--worker", &ida, "--wait", "20s",
    ]);
    let ms: u64 = said
        .rsplit("drained in ")
        .next()
        .and_then(|t| t.trim().strip_suffix(" ms"))
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no drain time in {said}"));
    eprintln!("drain of 2 buckets with renew 1 s: empty after {ms} ms");
    // The store says a holds nothing; its revocations came first (revoke, then release), and
    // its output is read as it comes.
    wait_for("a's revocations printed", limit, || owned(&a) == 0);
    wait_for("c takes a's two", limit, || owned(&c) == 4);
    assert_eq!(revoked_for(&a, "drained"), 2);

    ok(&["uncordon", "--group", "orders", "--worker", &ida]);
    ok(&["uncordon", "--group", "orders", "--worker", &idb]);
    wait_for("three share eight again", limit, || {
        let mut loads = [owned(&a), owned(&b), owned(&c)];
        loads.sort_unstable();
        loads == [2, 3, 3]
    });

    let holder = [&a, &b, &c]
        .into_iter()
        .find(|w| w.owned_in("orders").contains_key(&0))
        .expect("someone owns bucket 0");
    let said = ok(&[
        "quarantine",
        "--group",
        "orders",
        "--bucket",
        "0",
        "--for",
        "5m",
        "--reason",
        "a poison message at offset 42",
    ]);
    assert!(said.contains("revokes it (reason quarantined)"), "{said}");
    wait_for("bucket 0 revoked", limit, || {
        revoked_for(holder, "quarantined") == 1
    });
    // The holder's release of bucket 0 changes everyone's share (7 buckets for 3): a member
    // may shed one and another claim it a moment later, so wait for the group to settle.
    wait_for("the other seven owned again", limit, || {
        ok(&["status", "--group", "orders"]).contains("7/8 buckets owned, 1 quarantined")
    });
    let status = ok(&["status", "--group", "orders"]);
    assert!(status.contains("unowned, quarantined for "), "{status}");
    assert!(
        status.contains(": a poison message at offset 42"),
        "{status}"
    );
    // The paragraph is wrapped: compare it unwrapped.
    let why = |bucket: &str| -> String {
        ok(&["status", "--group", "orders", "--why", bucket])
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let said = why("0");
    for part in [
        "Bucket 0 of orders is unowned.",
        "released because it was under quarantine",
        "It is under quarantine until",
        "The quarantine's reason: \"a poison message at offset 42\".",
        "Next: nobody claims it before",
    ] {
        assert!(said.contains(part), "{part:?} not in: {said}");
    }
    ok(&["unquarantine", "--group", "orders", "--bucket", "0"]);
    wait_for("bucket 0 owned again", limit, || {
        [&a, &b, &c]
            .iter()
            .any(|w| w.owned_in("orders").contains_key(&0))
    });
    let next = [&a, &b, &c]
        .into_iter()
        .find(|w| w.owned_in("orders").contains_key(&0))
        .and_then(|w| w.worker())
        .expect("someone owns bucket 0")
        .to_string();
    let said: serde_json::Value = serde_json::from_str(&ok(&[
        "status", "--group", "orders", "--why", "0", "--json",
    ]))
    .expect("one JSON object");
    assert_eq!(said["state"], "live", "{said}");
    assert_eq!(said["owner"], next.as_str(), "{said}");
    let history = said["history"].as_array().expect("a history");
    let [.., quarantined, current] = history.as_slice() else {
        panic!("two tenures at least: {said}");
    };
    assert_eq!(quarantined["reason"], "quarantined", "{said}");
    assert_eq!(
        (&current["owner"], &current["reason"], &said["since"]),
        (
            &said["owner"],
            &serde_json::Value::Null,
            &current["began_at"]
        ),
        "{said}"
    );
    assert!(
        said["why"]
            .as_str()
            .is_some_and(|w| w.contains(&format!("owned by {next} since"))),
        "{said}"
    );

    let stranger = "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a11";
    let (code, _, err) = run(
        &["cordon", "--group", "orders", "--worker", stranger],
        Some(url),
    );
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--worker") && err.contains("not a member"),
        "{err}"
    );
    let (code, _, err) = run(
        &[
            "quarantine",
            "--group",
            "orders",
            "--bucket",
            "8",
            "--for",
            "1m",
        ],
        Some(url),
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bucket"), "{err}");
    let (code, _, err) = run(&["status", "--group", "orders", "--why", "8"], Some(url));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--why") && err.contains("0 to 7"), "{err}");
    for mut w in [a, b, c] {
        w.signal("TERM");
        assert!(w.wait(Duration::from_secs(20)).success());
    }
}

/// `drain` says what is true of who is left and of the worker: draining the only worker that
/// could claim warns that no live member will take its buckets (and no warning while another
/// can); a worker whose process stopped and handed its session over is said to be handed
/// over, not live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_warns_when_nobody_is_left_and_names_a_hand_over() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let groups = [("orders", 4)];
    let ida = lease::NodeId::new().to_string();
    let handing_over = ["--node-id", ida.as_str(), "--keep-on-stop", "30s"];
    let mut a = WorkerProcess::spawn_groups("a", url, &groups, "3s", "1s", &handing_over);
    let limit = Duration::from_secs(30);
    wait_for("a's four buckets", limit, || owned(&a) == 4);
    let drain = |id: &str| {
        let (code, out, err) = run(&["drain", "--group", "orders", "--worker", id], Some(url));
        assert_eq!(code, 0, "{err}");
        (out, err)
    };
    let nobody_left = "warning: no other live member of group \"orders\" can take its buckets";
    let (out, err) = drain(&ida);
    assert!(
        out.contains(&format!("draining worker {ida} (live)")),
        "{out}"
    );
    assert!(err.contains(nobody_left), "no warning: {err}");
    wait_for("a drained", limit, || owned(&a) == 0);

    let mut b = WorkerProcess::spawn_groups("b", url, &groups, "3s", "1s", &[]);
    let idb = b.worker_within(limit).to_string();
    wait_for("b takes the four", limit, || owned(&b) == 4);
    let (code, _, err) = run(
        &["uncordon", "--group", "orders", "--worker", &ida],
        Some(url),
    );
    assert_eq!(code, 0, "{err}");
    wait_for("two each", limit, || owned(&a) == 2 && owned(&b) == 2);
    let (_, err) = drain(&idb);
    assert!(!err.contains("warning"), "a claims b's buckets: {err}");
    wait_for("a takes b's two", limit, || {
        owned(&a) == 4 && owned(&b) == 0
    });
    let (code, _, err) = run(
        &["uncordon", "--group", "orders", "--worker", &idb],
        Some(url),
    );
    assert_eq!(code, 0, "{err}");
    wait_for("two each again", limit, || owned(&a) == 2 && owned(&b) == 2);

    a.signal("TERM");
    assert!(a.wait(limit).success());
    let (out, err) = drain(&ida);
    assert!(
        out.contains(&format!(
            "draining worker {ida} (handed over: no process runs it until the next one with \
             its id)"
        )) && out.contains("the process that takes its session over"),
        "{out}"
    );
    assert!(!err.contains("warning"), "b is live and claims: {err}");
    b.signal("TERM");
    assert!(b.wait(limit).success());
}
