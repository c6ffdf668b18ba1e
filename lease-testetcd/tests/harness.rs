//! The harness itself, seen through the gRPC client the backend uses: a three-member cluster
//! replicates; killing the leader elects another and the killed member catches up when it
//! restarts; killing two of three stops writes until they are back; the members are gone
//! when the cluster is dropped, and when the test process is killed.
//!
//! Timings go to stderr as `[timing] …` (`cargo test -p lease-testetcd -- --nocapture`).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions, Error, GetOptions};
use lease_testetcd::EtcdCluster;

/// How long an election may take after the leader is killed, or after quorum returns. The
/// election timeout is 500 ms; the rest is slack for a loaded 2-core machine.
const ELECTION_LIMIT: Duration = Duration::from_secs(10);
/// How long a member may take to catch up, or a write to succeed once a leader is agreed on.
const SETTLE_LIMIT: Duration = Duration::from_secs(10);
/// How long two restarted members and the survivor may take to agree on a leader. The first
/// elections after the restarts are sometimes contested (a leader elected, then deposed by
/// the other restarted member's higher term; etcd 3.4 runs without pre-vote by default): up
/// to 6 s seen on a loaded 2-core machine, usually about 1 s.
const QUORUM_LIMIT: Duration = Duration::from_secs(30);

fn start(members: usize) -> EtcdCluster {
    let started = Instant::now();
    let cluster = EtcdCluster::start(members).unwrap_or_else(|e| panic!("{e}"));
    eprintln!(
        "[timing] {members}-member cluster ready (healthy, leader agreed) in {:?}",
        started.elapsed()
    );
    cluster
}

/// A client of the members at `endpoints` only, every request bounded by 2 s.
async fn connect(endpoints: &[String], require_leader: bool) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_millis(500))
        .with_timeout(Duration::from_secs(2))
        .with_require_leader(require_leader);
    Client::connect(endpoints, Some(options))
        .await
        .unwrap_or_else(|e| panic!("a client of {endpoints:?}: {e}"))
}

/// An error as the backend would match on it.
fn kind(e: &Error) -> String {
    match e {
        Error::GRpcStatus(s) => format!("GRpcStatus({:?}: {:?})", s.code(), s.message()),
        other => format!("{other:?}"),
    }
}

/// Run `op` until it succeeds, at most `limit`; its value and the errors before it, or every
/// error seen.
async fn until_ok<T>(
    limit: Duration,
    mut op: impl AsyncFnMut() -> Result<T, Error>,
) -> Result<(T, Vec<String>), Vec<String>> {
    let deadline = Instant::now() + limit;
    let mut errors = Vec::new();
    loop {
        match op().await {
            Ok(value) => return Ok((value, errors)),
            Err(e) => errors.push(kind(&e)),
        }
        if Instant::now() > deadline {
            return Err(errors);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of `key` as the member `client` talks to has it; serializable reads answer from
/// that member's own data, without asking the leader.
async fn value(
    client: &mut Client,
    key: &str,
    serializable: bool,
) -> Result<Option<String>, Error> {
    let options = serializable.then(|| GetOptions::new().with_serializable());
    let answer = client.get(key, options).await?;
    Ok(answer
        .kvs()
        .first()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
}

/// Whether process `pid` runs (a zombie, killed but not reaped, does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            != Some("Z")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_through_one_member_is_read_back_through_another() {
    let cluster = start(3);
    let endpoints = cluster.endpoints();
    let mut distinct = endpoints.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), 3, "{endpoints:?}");
    assert!((0..3).all(|i| cluster.is_running(i)));
    let leader = cluster.leader().expect("a leader once started");
    let statuses: Vec<_> = (0..3)
        .map(|i| cluster.status(i).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let ids: Vec<u64> = statuses.iter().map(|s| s.member_id).collect();
    assert!(
        ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2],
        "{ids:?}"
    );
    assert!(
        statuses.iter().all(|s| s.leader == Some(ids[leader])),
        "{statuses:?}"
    );

    let mut writer = connect(&endpoints[0..1], false).await;
    let mut reader = connect(&endpoints[1..2], false).await;
    let put = writer
        .put("k", "through m0", None)
        .await
        .unwrap_or_else(|e| panic!("a put through m0: {}", kind(&e)));
    assert_eq!(put.header().map(|h| h.member_id()), Some(ids[0]));
    let read = reader
        .get("k", None)
        .await
        .unwrap_or_else(|e| panic!("a get through m1: {}", kind(&e)));
    assert_eq!(read.header().map(|h| h.member_id()), Some(ids[1]));
    assert_eq!(
        read.kvs().first().map(|kv| kv.value()),
        Some(&b"through m0"[..])
    );

    // etcd grants no lease shorter than its minimum, which the harness knows.
    let lease = writer
        .lease_grant(1, None)
        .await
        .unwrap_or_else(|e| panic!("a lease: {}", kind(&e)));
    assert_eq!(
        Duration::from_secs(u64::try_from(lease.ttl()).expect("a positive ttl")),
        cluster.min_lease_ttl().max(Duration::from_secs(1))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leader_elects_another_and_the_killed_member_catches_up() {
    let mut cluster = start(3);
    let old = cluster
        .wait_for_leader(ELECTION_LIMIT)
        .unwrap_or_else(|e| panic!("{e}"));
    let old_term = cluster.status(old).expect("the leader's status").raft_term;

    let killed_at = Instant::now();
    cluster.kill(old).expect("killing the leader");
    assert!(!cluster.is_running(old));
    assert!(cluster.kill(old).is_err(), "a dead member cannot be killed");
    let new = cluster
        .wait_for_leader(ELECTION_LIMIT)
        .unwrap_or_else(|e| panic!("after killing the leader m{old}: {e}"));
    let election = killed_at.elapsed();
    eprintln!("[timing] leader m{old} killed: m{new} leads after {election:?}");
    assert_ne!(new, old);
    let term = cluster
        .status(new)
        .expect("the new leader's status")
        .raft_term;
    assert!(term > old_term, "term {term} after {old_term}");

    // Informational: a client of all three members, as the backend has, keeps sending some
    // requests to the dead one (each fails at once).
    let mut balanced = connect(&cluster.endpoints(), false).await;
    let mut outcomes = std::collections::BTreeMap::<String, usize>::new();
    for _ in 0..20 {
        let outcome = match balanced.get("k", None).await {
            Ok(_) => "ok".to_owned(),
            Err(e) => kind(&e),
        };
        *outcomes.entry(outcome).or_default() += 1;
    }
    eprintln!("[client] 20 gets through a client of all three, one dead: {outcomes:?}");

    // Through the survivor that does not lead: it forwards the write to the new leader.
    let follower = (0..3).find(|&i| i != old && i != new).expect("a third");
    let mut client = connect(&[cluster.endpoint(follower)], false).await;
    let (_, errors) = until_ok(SETTLE_LIMIT, async || {
        client
            .put("while-down", "written while the old leader was down", None)
            .await
    })
    .await
    .unwrap_or_else(|errors| panic!("no write through m{follower} succeeded: {errors:?}"));
    assert!(
        errors.len() < 5,
        "writes failed before one succeeded: {errors:?}"
    );
    if !errors.is_empty() {
        eprintln!("[errors] before the write through m{follower} succeeded: {errors:?}");
    }

    let restarted_at = Instant::now();
    cluster
        .restart(old)
        .unwrap_or_else(|e| panic!("restarting m{old}: {e}"));
    assert!(cluster.is_running(old));
    // Every member answers and names one leader: m{old} has joined.
    let leader = cluster
        .wait_for_leader(ELECTION_LIMIT)
        .unwrap_or_else(|e| panic!("after the restart: {e}"));
    let joined = restarted_at.elapsed();
    // Serializable: what m{old} has itself, not what the leader tells it.
    let mut lagging = connect(&[cluster.endpoint(old)], false).await;
    let (seen, _) = until_ok(SETTLE_LIMIT, async || {
        match value(&mut lagging, "while-down", true).await? {
            Some(v) => Ok(v),
            None => Err(Error::InvalidArgs("not there yet".to_owned())),
        }
    })
    .await
    .unwrap_or_else(|errors| {
        panic!(
            "m{old} did not catch up within {SETTLE_LIMIT:?}: {:?}\n{}",
            errors.last(),
            cluster.describe()
        )
    });
    assert_eq!(seen, "written while the old leader was down");
    eprintln!(
        "[timing] m{old} restarted: joined (answers, names the leader) after {joined:?}, has \
         the write after {:?}",
        restarted_at.elapsed()
    );
    let statuses: Vec<_> = (0..3)
        .map(|i| cluster.status(i).expect("a status"))
        .collect();
    assert!(
        statuses
            .iter()
            .all(|s| s.leader == Some(statuses[leader].member_id)),
        "all three follow one leader: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_a_majority_refuses_writes_until_it_is_back() {
    let mut cluster = start(3);
    let leader = cluster
        .wait_for_leader(ELECTION_LIMIT)
        .unwrap_or_else(|e| panic!("{e}"));
    let other = (leader + 1) % 3;
    let survivor = (leader + 2) % 3;
    let survivor_endpoint = [cluster.endpoint(survivor)];
    let mut plain = connect(&survivor_endpoint, false).await;
    let mut strict = connect(&survivor_endpoint, true).await;
    for client in [&mut plain, &mut strict] {
        client
            .put("before", "with quorum", None)
            .await
            .unwrap_or_else(|e| panic!("a put with all three up: {}", kind(&e)));
    }

    let killed_at = Instant::now();
    cluster.kill(leader).expect("killing the leader");
    cluster.kill(other).expect("killing another");

    // With require_leader, once the survivor knows it has no leader, it refuses at once;
    // until then a write waits for the dead leader (each attempt is given up after 250 ms).
    let mut before_no_leader = Vec::new();
    let no_leader_after = loop {
        let asked = Instant::now();
        let attempt = tokio::time::timeout(
            Duration::from_millis(250),
            strict.put("strict", "without quorum", None),
        )
        .await;
        match attempt {
            Ok(Ok(_)) => panic!(
                "a write succeeded through m{survivor} with two of three members down, after \
                 {before_no_leader:?}"
            ),
            Ok(Err(Error::GRpcStatus(s)))
                if s.code() == tonic::Code::Unavailable && s.message().contains("no leader") =>
            {
                eprintln!(
                    "[errors] a write with require_leader: GRpcStatus(Unavailable: {:?}) in {:?}",
                    s.message(),
                    asked.elapsed()
                );
                break killed_at.elapsed();
            }
            Ok(Err(e)) => before_no_leader.push(format!("{} in {:?}", kind(&e), asked.elapsed())),
            Err(_) => before_no_leader.push("no answer in 250 ms".to_owned()),
        }
        assert!(
            killed_at.elapsed() < ELECTION_LIMIT,
            "m{survivor} did not say `no leader` within {ELECTION_LIMIT:?}: {before_no_leader:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "[timing] majority killed: `no leader` after {no_leader_after:?}; errors before it: \
         {before_no_leader:?}"
    );

    // Without require_leader, the leaderless survivor still takes the write and does not
    // answer: the client's own timeout (2 s) ends it.
    let asked = Instant::now();
    let plain_write = plain.put("plain", "without quorum", None).await;
    let plain_error = match &plain_write {
        Ok(_) => panic!("a write succeeded with two of three members down"),
        Err(e) => kind(e),
    };
    eprintln!(
        "[errors] a write without require_leader, no leader: {plain_error} after {:?}",
        asked.elapsed()
    );
    assert_eq!(cluster.leader(), None);
    assert!(
        !cluster
            .status(survivor)
            .expect("a status")
            .errors
            .is_empty()
    );

    let restarted_at = Instant::now();
    cluster
        .restart(leader)
        .unwrap_or_else(|e| panic!("restarting the old leader: {e}"));
    let first_up = restarted_at.elapsed();
    cluster
        .restart(other)
        .unwrap_or_else(|e| panic!("restarting the other: {e}"));
    let second_up = restarted_at.elapsed();
    let new = cluster
        .wait_for_leader(QUORUM_LIMIT)
        .unwrap_or_else(|e| panic!("after restarting two of three: {e}"));
    let elected = restarted_at.elapsed();
    eprintln!(
        "[timing] restarts: m{leader} serves its peers after {first_up:?}, m{other} after \
         {second_up:?}"
    );
    let (_, errors) = until_ok(SETTLE_LIMIT, async || {
        strict.put("after", "quorum is back", None).await
    })
    .await
    .unwrap_or_else(|errors| panic!("no write succeeded once quorum was back: {errors:?}"));
    eprintln!(
        "[timing] two of three restarted: m{new} leads after {elected:?}, a write succeeds after \
         {:?} (errors before: {errors:?})",
        restarted_at.elapsed()
    );
    let mut restarted = connect(&[cluster.endpoint(leader)], false).await;
    let (after, _) = until_ok(SETTLE_LIMIT, async || {
        value(&mut restarted, "after", false).await
    })
    .await
    .unwrap_or_else(|errors| panic!("reading through m{leader}: {errors:?}"));
    assert_eq!(after.as_deref(), Some("quorum is back"));
    // Informational: whether the write that timed out without quorum was applied later.
    let plain_later = value(&mut restarted, "plain", false).await.ok().flatten();
    let strict_later = value(&mut restarted, "strict", false).await.ok().flatten();
    eprintln!(
        "[outcome] once quorum was back: the timed-out write is {}, the refused one is {}",
        plain_later.map_or("absent".to_owned(), |v| format!("there ({v})")),
        strict_later.map_or("absent".to_owned(), |v| format!("there ({v})")),
    );
}

#[test]
fn dropping_a_cluster_kills_its_members_and_removes_its_directory() {
    let cluster = start(3);
    let pids: Vec<u32> = (0..3)
        .map(|i| cluster.pid(i).expect("a running member"))
        .collect();
    assert!(pids.iter().all(|&pid| alive(pid)));
    let dir = cluster.dir().to_path_buf();
    assert!(dir.join("m0").is_dir(), "{}", dir.display());
    drop(cluster);
    assert!(!dir.exists(), "{} is left", dir.display());
    assert!(
        pids.iter().all(|&pid| !alive(pid)),
        "members {pids:?} outlived their cluster"
    );
}

/// Where [`helper_holds_a_cluster_until_killed`] writes what it started.
const HELPER_OUT: &str = "LEASE_TESTETCD_HELPER_OUT";

/// Not a test by itself: the process the watchdog test kills, run by that test (with
/// `--ignored`), which names the file to write what it started in `LEASE_TESTETCD_HELPER_OUT`.
/// Run without it, it fails. If the watchdog test's process goes away first (killed itself),
/// it drops its cluster and removes its files.
#[test]
#[ignore = "the watchdog test's helper process: run by the_watchdog_removes_a_killed_test_process_cluster"]
fn helper_holds_a_cluster_until_killed() {
    let out = std::env::var_os(HELPER_OUT)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{HELPER_OUT} is not set: this is the helper process of \
                 the_watchdog_removes_a_killed_test_process_cluster, which runs it"
            )
        });
    let parent = std::os::unix::process::parent_id();
    let cluster = start(3);
    let pids: Vec<String> = (0..3)
        .map(|i| cluster.pid(i).expect("running").to_string())
        .collect();
    let staged = out.with_extension("new");
    std::fs::write(
        &staged,
        format!("{}\n{}\n", cluster.dir().display(), pids.join(" ")),
    )
    .and_then(|()| std::fs::rename(&staged, &out))
    .expect("writing what was started");
    let started = Instant::now();
    while std::os::unix::process::parent_id() == parent && started.elapsed() < HELPER_LIFETIME {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(cluster);
    std::fs::remove_file(&out).ok();
    std::fs::remove_file(out.with_extension("log")).ok();
}

/// How long the helper waits to be killed at most.
const HELPER_LIFETIME: Duration = Duration::from_secs(120);

#[test]
fn the_watchdog_removes_a_killed_test_process_cluster() {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_nanos();
    let base = std::env::temp_dir().join(format!(
        "lease-testetcd-helper-{}-{stamp}",
        std::process::id()
    ));
    let out = base.with_extension("out");
    let log = base.with_extension("log");
    let _cleanup = RemoveOnDrop(vec![out.clone(), log.clone()]);
    let log_file = std::fs::File::create(&log).expect("a log file");
    let mut helper = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "helper_holds_a_cluster_until_killed",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER_OUT, &out)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().expect("a log file"))
        .stderr(log_file)
        .spawn()
        .expect("starting the helper");
    let deadline = Instant::now() + Duration::from_secs(90);
    let written = loop {
        if let Ok(text) = std::fs::read_to_string(&out) {
            break text;
        }
        if let Ok(Some(status)) = helper.try_wait() {
            panic!(
                "the helper exited ({status}) before starting a cluster:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the helper started no cluster in time"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut lines = written.lines();
    let dir = PathBuf::from(lines.next().expect("a directory"));
    let pids: Vec<u32> = lines
        .next()
        .expect("pids")
        .split_whitespace()
        .map(|p| p.parse().expect("a pid"))
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(dir.is_dir() && pids.iter().all(|&pid| alive(pid)));

    helper.kill().expect("SIGKILL to the helper");
    helper.wait().expect("reaping the helper");
    let killed_at = Instant::now();
    let deadline = killed_at + Duration::from_secs(15);
    while dir.exists() || pids.iter().any(|&pid| alive(pid)) {
        assert!(
            Instant::now() < deadline,
            "15 s after the test process was killed: directory left: {}, members running: {:?}",
            dir.exists(),
            pids.iter().filter(|&&pid| alive(pid)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "[timing] watchdog: members gone and directory removed {:?} after the test process was \
         killed",
        killed_at.elapsed()
    );
}

/// Files a test removes however it ends.
struct RemoveOnDrop(Vec<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for path in &self.0 {
            std::fs::remove_file(path).ok();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shared_cluster_is_one_per_process_and_prefixes_keep_tests_apart() {
    let shared = lease_testetcd::cluster();
    assert!(std::ptr::eq(shared, lease_testetcd::cluster()));
    assert_eq!(shared.members(), 3);
    assert!(shared.leader().is_some());
    let (mine, theirs) = (lease_testetcd::prefix(), lease_testetcd::prefix());
    assert!(
        !mine.starts_with(&theirs) && !theirs.starts_with(&mine),
        "{mine} {theirs}"
    );
    let mut client = connect(&shared.endpoints(), false).await;
    client
        .put(format!("{mine}k"), "mine", None)
        .await
        .unwrap_or_else(|e| panic!("a put: {}", kind(&e)));
    let theirs_seen = client
        .get(theirs.clone(), Some(GetOptions::new().with_prefix()))
        .await
        .unwrap_or_else(|e| panic!("a get: {}", kind(&e)));
    assert_eq!(theirs_seen.count(), 0);
    assert_eq!(
        value(&mut client, &format!("{mine}k"), false)
            .await
            .ok()
            .flatten()
            .as_deref(),
        Some("mine")
    );
}
