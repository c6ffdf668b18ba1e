//! `leasectl resize` and what `leasectl status` shows of a resize, on a real Postgres: the dry
//! run's plan changes nothing, `--apply` opens a generation that drains while an old bucket is
//! held, refusals exit with the documented codes and name what is wrong.
//!
//! Buckets are held through the library (heartbeat and claim with a long ttl), not by
//! `leasectl worker` processes, so that the drain lasts exactly until the test releases them.

mod support;

use std::process::Command;
use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, Incarnation, SessionId, Takeover, WorkerStore};
use lease::{Bucket, GroupName, MemberMetadata, NodeId, ShardCount, Ttl};
use serde_json::{Value, json};
use support::leasectl;

/// `leasectl args` on `url` (or no database at all), logging nothing: (exit code, stdout,
/// stderr).
fn run(args: &[&str], url: Option<&str>) -> (i32, String, String) {
    let mut cmd: Command = leasectl();
    cmd.args(args)
        .env_remove("DATABASE_URL")
        .env("LEASE_LOG", "off");
    if let Some(url) = url {
        cmd.env("DATABASE_URL", url);
    }
    let out = cmd.output().expect("running leasectl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `leasectl args` that must succeed: its stdout.
#[track_caller]
fn ok(args: &[&str], url: &str) -> String {
    let (code, out, err) = run(args, Some(url));
    assert_eq!(code, 0, "leasectl {args:?} exited {code}: {err}");
    out
}

/// `leasectl args --json` that must succeed, parsed.
#[track_caller]
fn ok_json(args: &[&str], url: &str) -> Value {
    let args: Vec<&str> = args.iter().copied().chain(["--json"]).collect();
    let out = ok(&args, url);
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

fn status(url: &str, group: &str) -> Value {
    ok_json(&["status", "--group", group], url)
}

fn keys(v: &Value) -> Vec<&str> {
    v.as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// The line of `text` that starts with `start`.
#[track_caller]
fn line_starting<'a>(text: &'a str, start: &str) -> &'a str {
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("no line starting with {start:?} in:\n{text}"))
}

/// The row of a resize plan for old bucket `old` whose first column (the new buckets waiting
/// for it, empty on a class's later rows) is `new`.
#[track_caller]
fn plan_row<'a>(text: &'a str, new: &str, old: &str) -> &'a str {
    text.lines()
        .find(|l| {
            l.strip_prefix(new).is_some_and(|rest| {
                rest.starts_with("  ") && rest.split_whitespace().next() == Some(old)
            })
        })
        .unwrap_or_else(|| panic!("no row of new {new:?} and old {old:?} in:\n{text}"))
}

fn store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url.to_owned())
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
}

fn n(count: u32) -> ShardCount {
    ShardCount::new(count).expect("a shard count")
}

/// A worker holding buckets through the library, with a session that outlives the test.
struct Holder {
    store: PgLeaseStore,
    group: GroupName,
    worker: NodeId,
    session: SessionId,
}

impl Holder {
    /// A member of `group` (of `shards` buckets, created if need be) holding every bucket.
    async fn holding_all(url: &str, group: &str, shards: u32) -> Self {
        let store = store(url);
        let group = GroupName::new(group).expect("a group name");
        store
            .ensure_group(&group, n(shards))
            .await
            .expect("ensure_group");
        let worker = NodeId::new();
        let beat = store
            .heartbeat(
                worker,
                Incarnation::new(),
                Ttl::from_secs(300).expect("a ttl"),
                &MemberMetadata::empty(),
                &[],
            )
            .await
            .expect("heartbeat");
        store
            .join(&group, worker, beat.session)
            .await
            .expect("join");
        let leases = store
            .claim(&group, worker, beat.session, shards, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(leases.len(), shards as usize, "claimed {leases:?}");
        Self {
            store,
            group,
            worker,
            session: beat.session,
        }
    }

    async fn release(&self, buckets: &[u32]) {
        let buckets: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
        let released = self
            .store
            .release(&self.group, self.worker, self.session, &buckets)
            .await
            .expect("release");
        assert_eq!(released, buckets, "released");
    }
}

/// The dry run prints which new buckets wait for which old ones, with the old buckets' owners,
/// and writes nothing: the group keeps its count, generation and owners.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_prints_the_waits_and_changes_nothing() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let holder = Holder::holding_all(url, "orders", 4).await;
    holder.release(&[1, 3]).await;
    let me = holder.worker.to_string();
    let before = status(url, "orders");

    let out = ok(
        &["resize", "--group", "orders", "--from", "4", "--to", "8"],
        url,
    );
    assert!(
        out.starts_with("resize plan: group \"orders\": 4 -> 8 shards, generation 0 -> 1, gcd 4\n"),
        "{out}"
    );
    assert!(
        out.contains("old buckets now: 2 live (their new buckets wait), 0 expired and 2 unowned"),
        "{out}"
    );
    // A split: each old bucket's keys go to two new buckets, which wait for it alone.
    for (new, old, state) in [
        ("0, 4", "0", "live"),
        ("1, 5", "1", "unowned"),
        ("2, 6", "2", "live"),
        ("3, 7", "3", "unowned"),
    ] {
        let line = plan_row(&out, new, old);
        let fields: Vec<&str> = line[new.len()..].split_whitespace().collect();
        assert_eq!(fields.last(), Some(&state), "{line}");
        assert_eq!(fields.contains(&me.as_str()), state == "live", "{line}");
    }
    assert!(
        out.ends_with("\ndry run: nothing changed; run again with --apply to resize\n"),
        "{out}"
    );

    // A merge: each new bucket waits for two old ones, printed on two rows.
    let out = ok(
        &["resize", "--group", "orders", "--from", "4", "--to", "2"],
        url,
    );
    let first = plan_row(&out, "0", "0");
    assert!(first.contains(&me) && first.ends_with("live"), "{out}");
    let next = out
        .lines()
        .skip_while(|l| *l != first)
        .nth(1)
        .unwrap_or_default();
    assert_eq!(
        plan_row(next, "", "2"),
        next,
        "the second parent of new bucket 0 on the next row: {out}"
    );
    assert!(next.contains(&me) && next.ends_with("live"), "{out}");
    assert!(plan_row(&out, "", "3").ends_with("unowned"), "{out}");
    // Coprime counts: every new bucket waits for every old one.
    let out = ok(
        &["resize", "--group", "orders", "--from", "4", "--to", "3"],
        url,
    );
    assert!(
        out.contains("every new bucket waits for every old bucket"),
        "{out}"
    );
    for old in ["0", "1", "2", "3"] {
        plan_row(&out, if old == "0" { "0, 1, 2" } else { "" }, old);
    }

    let after = status(url, "orders");
    for key in [
        "shard_count",
        "generation",
        "previous",
        "buckets",
        "draining",
    ] {
        assert_eq!(after[key], before[key], "{key} changed by a dry run");
    }
    assert_eq!(after["generation"], 0);
}

/// `--apply` splits 4 buckets into 8 while one worker holds them all: the old buckets drain,
/// `status` shows them and the new buckets waiting; as the holder releases them the waits go,
/// and once all are released the drain is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_splits_and_status_follows_the_drain() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let holder = Holder::holding_all(url, "orders", 4).await;
    let me = holder.worker.to_string();

    let out = ok(
        &[
            "resize", "--group", "orders", "--from", "4", "--to", "8", "--apply",
        ],
        url,
    );
    assert!(
        out.starts_with("group \"orders\": resized from 4 to 8 shards; generation 1 started"),
        "{out}"
    );
    assert!(
        out.contains("plan: group \"orders\": 4 -> 8 shards, generation 0 -> 1, gcd 4"),
        "{out}"
    );
    assert!(!out.contains("dry run"), "{out}");

    let s = status(url, "orders");
    assert_eq!(
        (&s["shard_count"], &s["generation"], &s["previous"]),
        (&json!(8), &json!(1), &json!(4))
    );
    let draining = s["draining"].as_array().expect("draining");
    assert_eq!(draining.len(), 4, "{s}");
    for b in draining {
        assert_eq!(
            (&b["state"], &b["owner"]),
            (&json!("live"), &json!(me)),
            "{b}"
        );
    }
    // Every new bucket waits for its one parent, as the library computes it.
    let expected: Vec<Value> = (0..8u32)
        .map(|b| json!({"bucket": b, "parents": [b % 4]}))
        .collect();
    assert_eq!(s["waiting"], json!(expected), "{s}");
    let snap = holder
        .store
        .snapshot(&holder.group)
        .await
        .expect("snapshot");
    assert_eq!(snap.waiting().len(), 8);
    assert!(
        s["buckets"]
            .as_array()
            .is_some_and(|bs| bs.len() == 8 && bs.iter().all(|b| b["state"] == "unowned")),
        "{s}"
    );
    let text = ok(&["status", "--group", "orders"], url);
    assert!(
        text.contains("generation 1, resizing from 4 shards: 4 of 4 old bucket(s) not retired yet"),
        "{text}"
    );
    assert!(
        text.contains("draining: generation 0's buckets (4 shards) not retired yet"),
        "{text}"
    );
    let (_, drain) = text.split_once("\ndraining: ").expect("a draining section");
    let row = line_starting(drain, "     3  ");
    assert!(row.contains(&me) && row.ends_with("live"), "{text}");
    assert!(text.contains("waiting: 8 new bucket(s) wait"), "{text}");
    assert_eq!(
        line_starting(&text, "1, 5  ").trim_end(),
        "1, 5  1",
        "{text}"
    );
    assert!(
        text.contains("buckets owned, min 0, max 0: resize draining: 4 old bucket(s) not retired"),
        "{text}"
    );

    // Half released: old buckets 0 and 1 are retired, new buckets 0, 1, 4, 5 wait no more.
    holder.release(&[0, 1]).await;
    let s = status(url, "orders");
    let live: Vec<&Value> = s["draining"]
        .as_array()
        .expect("draining")
        .iter()
        .filter(|b| b["state"] == "live")
        .map(|b| &b["bucket"])
        .collect();
    assert_eq!(live, [&json!(2), &json!(3)], "{s}");
    let waiting: Vec<&Value> = s["waiting"]
        .as_array()
        .expect("waiting")
        .iter()
        .map(|w| &w["bucket"])
        .collect();
    assert_eq!(waiting, [&json!(2), &json!(3), &json!(6), &json!(7)], "{s}");
    let text = ok(&["status", "--group", "orders"], url);
    assert!(
        text.contains("2 of 4 old bucket(s) not retired yet"),
        "{text}"
    );
    assert!(!text.contains("\n0, 4  "), "{text}");

    // The rest released by the operator: the dry run names the old buckets too, and the drain
    // is over.
    let out = ok(&["release", "--group", "orders", "--worker", &me], url);
    assert!(
        out.contains(
            "would release 0 bucket(s) [] and 2 old bucket(s) [2, 3] of the resize from 4"
        ),
        "{out}"
    );
    let out = ok(
        &["release", "--group", "orders", "--worker", &me, "--force"],
        url,
    );
    assert!(out.contains("released 2 bucket(s) [2, 3]"), "{out}");
    assert!(out.contains("its membership is removed"), "{out}");
    let s = status(url, "orders");
    assert_eq!(
        (
            &s["generation"],
            &s["previous"],
            &s["draining"],
            &s["waiting"]
        ),
        (&json!(1), &json!(4), &json!([]), &json!([])),
        "{s}"
    );
    let text = ok(&["status", "--group", "orders"], url);
    assert!(text.contains("\ngeneration 1, resized from 4\n"), "{text}");
    assert!(!text.contains("draining"), "{text}");
    assert!(!text.contains("waiting"), "{text}");
}

/// A `--from` that is not the group's count is bad input: exit 2, naming the flag and the
/// count, with or without `--apply`; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_from_is_bad_input_naming_the_count() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    Holder::holding_all(url, "orders", 4).await;
    for apply in [false, true] {
        let mut args = vec!["resize", "--group", "orders", "--from", "5", "--to", "8"];
        if apply {
            args.push("--apply");
        }
        let (code, out, err) = run(&args, Some(url));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("--from") && err.contains("has 4 shards, not 5"),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "{args:?} printed a plan: {out}");
    }
    let s = status(url, "orders");
    assert_eq!(
        (&s["shard_count"], &s["generation"]),
        (&json!(4), &json!(0))
    );
}

/// A resize while an earlier one drains is refused (exit 1: it passes once the old buckets
/// are retired), naming the draining resize, dry run or not; then it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_during_a_drain_is_refused_until_it_is_over() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let holder = Holder::holding_all(url, "orders", 4).await;
    ok(
        &[
            "resize", "--group", "orders", "--from", "4", "--to", "8", "--apply",
        ],
        url,
    );
    holder.release(&[0, 1, 2]).await;
    for apply in [false, true] {
        let mut args = vec!["resize", "--group", "orders", "--from", "8", "--to", "16"];
        if apply {
            args.push("--apply");
        }
        let (code, out, err) = run(&args, Some(url));
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(
            err.contains(
                "still draining its resize from 4 to 8 shards: 1 old bucket(s) not retired"
            ),
            "{args:?}: {err}"
        );
        assert!(out.is_empty(), "{args:?}: {out}");
    }
    assert_eq!(status(url, "orders")["generation"], 1);
    holder.release(&[3]).await;
    let out = ok(
        &[
            "resize", "--group", "orders", "--from", "8", "--to", "16", "--apply",
        ],
        url,
    );
    assert!(out.contains("generation 2 started"), "{out}");
    let s = status(url, "orders");
    assert_eq!(
        (&s["shard_count"], &s["generation"], &s["previous"]),
        (&json!(16), &json!(2), &json!(8))
    );
}

/// An unknown group is bad input (exit 2), like `status` on one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_group_is_bad_input() {
    let db = lease_testdb::database().await;
    for extra in [None, Some("--apply")] {
        let mut args = vec!["resize", "--group", "nobody", "--from", "4", "--to", "8"];
        args.extend(extra);
        let (code, out, err) = run(&args, Some(&db.url));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("--group") && err.contains("\"nobody\" does not exist"),
            "{err}"
        );
        assert!(out.is_empty(), "{out}");
    }
}

/// `--from N --to N` changes nothing and says so, dry run or applied, even while a resize
/// drains (as the store answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_count_is_unchanged() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    Holder::holding_all(url, "orders", 4).await;
    let out = ok(
        &["resize", "--group", "orders", "--from", "4", "--to", "4"],
        url,
    );
    assert_eq!(
        out,
        "group \"orders\" has 4 shards already: nothing to change (generation 0)\n"
    );
    let out = ok(
        &[
            "resize", "--group", "orders", "--from", "4", "--to", "4", "--apply",
        ],
        url,
    );
    assert!(out.contains("the store answered unchanged"), "{out}");
    let j = ok_json(
        &[
            "resize", "--group", "orders", "--from", "4", "--to", "4", "--apply",
        ],
        url,
    );
    assert_eq!(
        j,
        json!({"group": "orders", "from": 4, "to": 4, "generation": 0, "next_generation": 0,
               "gcd": 4, "applied": true, "outcome": "unchanged", "waits": []})
    );
    ok(
        &[
            "resize", "--group", "orders", "--from", "4", "--to", "8", "--apply",
        ],
        url,
    );
    let j = ok_json(
        &["resize", "--group", "orders", "--from", "8", "--to", "8"],
        url,
    );
    assert_eq!((&j["generation"], &j["outcome"]), (&json!(1), &Value::Null));
    let s = status(url, "orders");
    assert_eq!(
        (&s["shard_count"], &s["generation"]),
        (&json!(8), &json!(1))
    );
}

/// Counts out of range and missing or malformed flags are usage errors (exit 2) naming the
/// flag, found before any database is needed.
#[test]
fn bad_counts_are_usage_errors_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--from", "4", "--to", "0"], "--to"),
        (&["--from", "0", "--to", "4"], "--from"),
        (&["--from", "4", "--to", "65537"], "--to"),
        (&["--from", "4", "--to", "many"], "--to"),
        (&["--from", "4"], "--to"),
    ];
    for (flags, flag) in cases {
        let args: Vec<&str> = ["resize", "--group", "g"]
            .iter()
            .chain(flags.iter())
            .copied()
            .collect();
        let (code, out, err) = run(&args, None);
        assert_eq!(code, 2, "{args:?} exited {code}: {err}");
        assert!(err.contains(flag), "{args:?}: {flag} not named: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
    }
}

/// The JSON objects of a dry run, an applied resize and `status` during the drain, field by
/// field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_shapes() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let holder = Holder::holding_all(url, "orders", 4).await;
    let merge = ["resize", "--group", "orders", "--from", "4", "--to", "2"];
    let dry = ok_json(&merge, url);
    assert_eq!(
        dry,
        json!({"group": "orders", "from": 4, "to": 2, "generation": 0, "next_generation": 1,
               "gcd": 2, "applied": false, "outcome": null,
               "waits": [{"bucket": 0, "parents": [0, 2]}, {"bucket": 1, "parents": [1, 3]}]})
    );
    let applied = ok_json(&[&merge[..], &["--apply"]].concat(), url);
    let mut expected = dry.clone();
    expected["applied"] = json!(true);
    expected["outcome"] = json!("started");
    assert_eq!(applied, expected);

    let s = status(url, "orders");
    assert_eq!(
        keys(&s),
        [
            "group",
            "shard_count",
            "observed_at",
            "members",
            "buckets",
            "generation",
            "previous",
            "draining",
            "waiting"
        ]
    );
    let bucket_keys = [
        "bucket",
        "owner",
        "session",
        "token",
        "expires_at",
        "state",
        "quarantined_until",
        "quarantine_reason",
        "load",
    ];
    let draining = s["draining"].as_array().expect("draining");
    assert_eq!(draining.len(), 4);
    for b in draining {
        assert_eq!(keys(b), bucket_keys);
        assert!(
            b["session"].is_string() && b["expires_at"].is_string(),
            "{b}"
        );
    }
    assert_eq!(
        s["waiting"],
        json!([{"bucket": 0, "parents": [0, 2]}, {"bucket": 1, "parents": [1, 3]}])
    );
    holder.release(&[2]).await;
    assert_eq!(
        status(url, "orders")["waiting"],
        json!([{"bucket": 0, "parents": [0]}, {"bucket": 1, "parents": [1, 3]}]),
        "a released parent is no longer waited for"
    );

    // A group never resized: generation 0, no previous count, nothing draining or waiting.
    Holder::holding_all(url, "fresh", 2).await;
    let s = status(url, "fresh");
    assert_eq!(
        (
            &s["generation"],
            &s["previous"],
            &s["draining"],
            &s["waiting"]
        ),
        (&json!(0), &Value::Null, &json!([]), &json!([]))
    );
    let text = ok(&["status", "--group", "fresh"], url);
    assert!(text.contains("\ngeneration 0, never resized\n"), "{text}");
}

/// Above 64 old buckets the text plan shows 32 rows and a summary; `--json` still lists every
/// new bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_plan_is_summed_up() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    let store = store(url);
    let group = GroupName::new("big").expect("a group name");
    store
        .ensure_group(&group, n(128))
        .await
        .expect("ensure_group");
    let args = ["resize", "--group", "big", "--from", "128", "--to", "256"];
    let out = ok(&args, url);
    let rows = out.lines().filter(|l| l.ends_with("unowned")).count();
    assert_eq!(rows, 32, "{out}");
    assert!(
        out.contains("... 96 more old bucket(s), the same way"),
        "{out}"
    );
    let j = ok_json(&args, url);
    let waits = j["waits"].as_array().expect("waits");
    assert_eq!(waits.len(), 256);
    assert_eq!(waits[200], json!({"bucket": 200, "parents": [72]}));
}

/// A role with a worker's grants may plan a resize (it only reads) but not apply it: exit 1,
/// permission denied, saying which role may; nothing changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_is_told_to_resize_as_the_owner() {
    let db = lease_testdb::database().await;
    let url = db.url.as_str();
    Holder::holding_all(url, "orders", 4).await;
    let role = format!("leasectl_resizer_{}", std::process::id());
    let mut admin = AsyncPgConnection::establish(url)
        .await
        .expect("connecting as the test server's superuser");
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN PASSWORD 'pw'"))
        .await
        .expect("creating the role");
    ok(&["grant", "--role", &role, "--apply"], url);
    let as_worker = lease_testdb::url_as(url, &role, "pw");
    let resize = ["resize", "--group", "orders", "--from", "4", "--to", "8"];
    let plan = ok(&resize, &as_worker);
    assert!(plan.contains("dry run: nothing changed"), "{plan}");
    let (code, out, err) = run(&[&resize[..], &["--apply"]].concat(), Some(&as_worker));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("permission denied") && err.contains("owner of schema lease"),
        "{err}"
    );
    assert!(out.is_empty(), "{out}");
    let s = status(url, "orders");
    assert_eq!(
        (&s["shard_count"], &s["generation"]),
        (&json!(4), &json!(0))
    );
}
