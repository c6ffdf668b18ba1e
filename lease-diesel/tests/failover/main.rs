//! Failover, store by store (docs/postgres.md, "Failover"): a primary and a streaming
//! standby started from the system binaries (lease-testdb), the primary killed (`-m
//! immediate`) and the standby promoted, a store reaching both through one multi-host URL.
//! Time is a client clock the tests move, so the quiet period is checked to the microsecond
//! and nothing waits for a guessed time; waits for a server poll a condition with a bound.

#[path = "../support/mod.rs"]
mod support;

mod kept;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lease_core::{
    Bucket, Clock, ErrorKind, FencingToken, GroupName, Incarnation, ManualClock, MemberMetadata,
    NodeId, ShardCount, StoreError, SystemClock, Takeover, Ttl, WorkerStore,
};
use lease_diesel::PgLeaseStore;
use lease_testdb::{Cluster, ClusterOptions, Replication};
use support::{process, tokens, worker};

const DB: &str = "failover";
const SHARDS: u32 = 8;
/// Every token issued on the first timeline after the base one is at least this.
const FLOOR_1: i64 = (1 << 32) + 1;

fn group() -> GroupName {
    GroupName::new("failover").expect("a group name")
}

fn ttl() -> Ttl {
    Ttl::from_secs(3).expect("a ttl")
}

/// A primary with a migrated database `failover`, and its standby.
async fn primary_and_standby(replication: Replication) -> (Cluster, Cluster) {
    let primary = Cluster::start(ClusterOptions {
        tcp: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a primary: {e}"));
    primary
        .psql(&format!("CREATE DATABASE {DB}"))
        .expect("a database");
    PgLeaseStore::builder(primary.tcp_url("postgres", DB, ""))
        .max_connections(1)
        .build()
        .expect("a store")
        .migrate()
        .await
        .expect("migrating");
    let standby = primary
        .start_standby(replication)
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    (primary, standby)
}

/// A store on both servers, the standby named first: it reaches whichever takes writes.
fn store_on_both(primary: &Cluster, standby: &Cluster, clock: &ManualClock) -> PgLeaseStore {
    let url = Cluster::multi_host_url(
        &[standby, primary],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
        .with_client_clock(clock.clone())
}

/// Kill the primary and promote the standby.
fn fail_over(primary: &Cluster, standby: &Cluster) {
    primary.kill().expect("killing the primary");
    standby.promote().expect("promoting the standby");
}

/// Run `op` until it succeeds, at most 30 s; every failure meanwhile must be transient (the
/// pool's connections to the dead primary break, new ones find the new primary).
async fn until_ok<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let started = Instant::now();
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    e.is_transient(),
                    "{what}: a failover gave a permanent error: {e:?}"
                );
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "{what}: still failing after 30 s: {}",
                    lease_core::Chain(&e)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// The rows of `lease.server_epochs` as `timeline|first_seen is finite`, in order.
fn epochs(cluster: &Cluster) -> String {
    cluster
        .psql_in(
            DB,
            "SELECT string_agg(timeline || ':' || isfinite(first_seen), ',' \
             ORDER BY timeline) FROM lease.server_epochs",
        )
        .expect("reading the epochs")
}

fn bucket_tokens(store_tokens: &[(u32, i64)]) -> Vec<i64> {
    store_tokens.iter().map(|&(_, t)| t).collect()
}

/// What the store logs on this test's thread, captured. One global subscriber writes every
/// warning to the capture of the thread that logged it, if that thread has one: a subscriber
/// set per thread (`set_default`) misses events when other tests' threads reach the same
/// call site first and its interest is cached.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

thread_local! {
    static CAPTURE: std::cell::RefCell<Option<Logged>> = const { std::cell::RefCell::new(None) };
}

struct ThreadWriter;

impl std::io::Write for ThreadWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        CAPTURE.with(|c| {
            if let Some(logged) = &*c.borrow() {
                logged.0.lock().expect("log").extend_from_slice(buf);
            }
        });
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    /// Capture this thread's warnings from now on.
    fn capture() -> Self {
        static GLOBAL: std::sync::Once = std::sync::Once::new();
        GLOBAL.call_once(|| {
            tracing::subscriber::set_global_default(
                tracing_subscriber::fmt()
                    .with_writer(|| ThreadWriter)
                    .with_ansi(false)
                    .with_max_level(tracing::Level::WARN)
                    .finish(),
            )
            .expect("the only global subscriber of this test binary");
        });
        let logged = Logged::default();
        CAPTURE.with(|c| *c.borrow_mut() = Some(logged.clone()));
        logged
    }

    fn lines_with(&self, needle: &str) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().expect("log"))
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// A promoted server: a claim before any heartbeat ran on it takes nothing; the first
/// heartbeat records its timeline (and the store says so, once, in a warning); claims take
/// nothing for one ttl after that (to the microsecond of the client clock), then take what is
/// claimable with tokens above every token of the old primary, and the old holder's fencing
/// check fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_wait_one_ttl_on_a_promoted_server_then_issue_tokens_above_the_floor() {
    // The test's own task makes every store call, on this thread.
    let logged = Logged::capture();
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    let clock = ManualClock::starting_at(SystemClock.now());
    let store = store_on_both(&primary, &standby, &clock);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    assert_eq!(epochs(&primary), "1:false", "the base timeline");
    let a = worker();
    let beat = support::beat_as(&store, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("a's heartbeat");
    let won = store
        .claim(&g, a, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claims");
    assert_eq!(tokens(&won), [(0, 1), (1, 1), (2, 1), (3, 1)]);

    fail_over(&primary, &standby);

    // a's session reached the standby (synchronous replication) and is live: its claim is
    // judged, but the new timeline has no record yet, so it takes nothing.
    let none = until_ok("a claim on the promoted server", || {
        store.claim(&g, a, beat.session, 4, Takeover::Allowed)
    })
    .await;
    assert!(none.is_empty(), "claimed before any heartbeat: {none:?}");
    assert_eq!(epochs(&standby), "1:false");

    let b = worker();
    let t0 = clock.now();
    let b_beat = support::beat_as(&store, &g, b, process(b), ttl(), &MemberMetadata::empty())
        .await
        .expect("b's heartbeat");
    assert_eq!(epochs(&standby), "1:false,2:true", "recorded once");
    let warned = logged.lines_with("new timeline");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert!(
        warned[0].contains("timeline=2") && warned[0].contains("previous=1"),
        "{warned:?}"
    );
    let first_seen = standby
        .psql_in(
            DB,
            &format!(
                "SELECT first_seen = '{}'::timestamptz FROM lease.server_epochs \
                 WHERE timeline = 2",
                t0.to_rfc3339()
            ),
        )
        .expect("first_seen");
    assert_eq!(first_seen, "t", "first seen at the heartbeat's time");
    assert!(
        store
            .claim(&g, b, b_beat.session, 4, Takeover::Allowed)
            .await
            .expect("b claims")
            .is_empty(),
        "claimed in the quiet period"
    );
    // Renew b just before its own expiry; a's session runs out meanwhile (it does not renew).
    clock.set(t0 + chrono::Duration::milliseconds(2_900));
    let b_beat = support::beat_as(&store, &g, b, process(b), ttl(), &MemberMetadata::empty())
        .await
        .expect("b renews");
    assert_eq!(epochs(&standby), "1:false,2:true", "nothing new recorded");
    assert_eq!(logged.lines_with("new timeline").len(), 1, "said once");
    clock.set(t0 + chrono::Duration::milliseconds(3_000) - chrono::Duration::microseconds(1));
    assert!(
        store
            .claim(&g, b, b_beat.session, SHARDS, Takeover::Allowed)
            .await
            .expect("b claims")
            .is_empty(),
        "claimed 1 µs before the quiet period ended"
    );
    clock.set(t0 + chrono::Duration::milliseconds(3_000));
    let won = store
        .claim(&g, b, b_beat.session, SHARDS, Takeover::Allowed)
        .await
        .expect("b claims");
    // a's four (token 1) and the four never owned (token 0): all at the floor.
    assert_eq!(
        bucket_tokens(&tokens(&won)),
        vec![FLOOR_1; SHARDS as usize],
        "{won:?}"
    );
    assert!(
        !store
            .is_current(&g, Bucket(0), a, FencingToken(1))
            .await
            .expect("is_current"),
        "the old holder still passes the fencing check"
    );
    assert!(
        store
            .is_current(&g, Bucket(0), b, FencingToken(FLOOR_1))
            .await
            .expect("is_current")
    );
    // Past the floor, tokens rise by one as on any server.
    store
        .release(&g, b, b_beat.session, &[Bucket(0)])
        .await
        .expect("release");
    let again = store
        .claim(&g, b, b_beat.session, 1, Takeover::Allowed)
        .await
        .expect("claim again");
    assert_eq!(tokens(&again), [(0, FLOOR_1 + 1)]);
}

/// The quiet period after a failover lasts the longest ttl of the group's members, not the
/// shortest: a member with a 6 s ttl may still trust a lease of the old primary for up to
/// 6 s, so a claim by a member with a 3 s ttl takes nothing at 3 s, nor 1 µs before 6 s, and
/// takes everything, at the floor, at 6 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quiet_period_lasts_the_longest_ttl_of_the_group() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    let clock = ManualClock::starting_at(SystemClock.now());
    let store = store_on_both(&primary, &standby, &clock);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let (short, long) = (ttl(), Ttl::from_secs(6).expect("a ttl"));
    let empty = MemberMetadata::empty();
    let (a, b) = (worker(), worker());
    let beat = support::beat_as(&store, &g, a, process(a), short, &empty)
        .await
        .expect("a's heartbeat");
    support::beat_as(&store, &g, b, process(b), long, &empty)
        .await
        .expect("b's heartbeat");
    let won = store
        .claim(&g, a, beat.session, SHARDS, Takeover::Allowed)
        .await
        .expect("a claims");
    assert_eq!(won.len(), SHARDS as usize);

    fail_over(&primary, &standby);

    // a's heartbeat records the new timeline at t0; b joins with its 6 s ttl.
    let t0 = clock.now();
    until_ok("a's heartbeat on the promoted server", || {
        support::beat_as(&store, &g, a, process(a), short, &empty)
    })
    .await;
    support::beat_as(&store, &g, b, process(b), long, &empty)
        .await
        .expect("b's heartbeat");
    assert_eq!(epochs(&standby), "1:false,2:true");
    let claim_at = async |at: chrono::TimeDelta| {
        // a renews just before, so that its session lives at `at`.
        clock.set(t0 + at - chrono::TimeDelta::milliseconds(100));
        let a_beat = support::beat_as(&store, &g, a, process(a), short, &empty)
            .await
            .expect("a renews");
        support::beat_as(&store, &g, b, process(b), long, &empty)
            .await
            .expect("b renews");
        clock.set(t0 + at);
        store
            .claim(&g, a, a_beat.session, SHARDS, Takeover::Allowed)
            .await
            .expect("a claims")
    };
    let at_short = claim_at(chrono::TimeDelta::seconds(3)).await;
    assert!(
        at_short.is_empty(),
        "claimed one short ttl after the failover, while b's 6 s ttl runs: {:?}",
        tokens(&at_short)
    );
    let just_before =
        claim_at(chrono::TimeDelta::seconds(6) - chrono::TimeDelta::microseconds(1)).await;
    assert!(
        just_before.is_empty(),
        "claimed 1 µs before the longest ttl"
    );
    let won = claim_at(chrono::TimeDelta::seconds(6)).await;
    assert_eq!(
        bucket_tokens(&tokens(&won)),
        vec![FLOOR_1; SHARDS as usize],
        "{won:?}"
    );
}

/// Asynchronous replication, writes lost on purpose: a releases a bucket and c claims it on
/// the primary only, then the primary dies. On the promoted standby a still holds the bucket
/// under its session, which a's worker, having released it, would be handed back while c
/// still works on it with a token the new server never issued. A session does not survive a
/// change of timeline: a's heartbeat there starts a new one and reports nothing owned, and
/// once the quiet period is over the bucket is claimed with a token above c's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_in_a_failover_does_not_hand_the_bucket_back() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    let clock = ManualClock::starting_at(SystemClock.now());
    let store = store_on_both(&primary, &standby, &clock);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = worker();
    let a_beat = support::beat_as(&store, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("a's heartbeat");
    let won = store
        .claim(&g, a, a_beat.session, SHARDS, Takeover::Allowed)
        .await
        .expect("a claims");
    assert_eq!(won.len(), SHARDS as usize);
    // Wait until the standby has all of it, then cut it off.
    let deadline = Instant::now() + Duration::from_secs(10);
    while standby
        .psql_in(
            DB,
            "SELECT count(*) FROM lease.shards WHERE owner_node IS NOT NULL",
        )
        .as_deref()
        != Ok("8")
    {
        assert!(Instant::now() < deadline, "the standby never caught up");
        std::thread::sleep(Duration::from_millis(10));
    }
    standby.cut_replication().expect("cutting replication");

    // On the primary only: a releases bucket 0, c takes it with token 2.
    let released = store
        .release(&g, a, a_beat.session, &[Bucket(0)])
        .await
        .expect("release");
    assert_eq!(released, [Bucket(0)]);
    let c = worker();
    let c_beat = support::beat_as(&store, &g, c, process(c), ttl(), &MemberMetadata::empty())
        .await
        .expect("c's heartbeat");
    let c_won = store
        .claim(&g, c, c_beat.session, 1, Takeover::Allowed)
        .await
        .expect("c claims");
    assert_eq!(tokens(&c_won), [(0, 2)]);

    fail_over(&primary, &standby);

    clock.advance(Duration::from_millis(500));
    let t0 = clock.now();
    let empty = MemberMetadata::empty();
    let a_on_new = until_ok("a's heartbeat on the promoted server", || {
        support::beat_as(&store, &g, a, process(a), ttl(), &empty)
    })
    .await;
    assert!(
        a_on_new.owned.is_empty(),
        "a is told it owns {:?} on the new server, bucket 0 included, which it released \
         and c holds with token 2",
        tokens(&a_on_new.owned)
    );
    assert!(
        a_on_new.new_session && a_on_new.session != a_beat.session,
        "a's session survived the failover"
    );
    clock.set(t0 + chrono::Duration::milliseconds(3_000));
    let a_on_new = support::beat_as(&store, &g, a, process(a), ttl(), &MemberMetadata::empty())
        .await
        .expect("a renews");
    let won = store
        .claim(&g, a, a_on_new.session, 1, Takeover::Allowed)
        .await
        .expect("a claims after the quiet period");
    assert_eq!(tokens(&won), [(0, FLOOR_1)], "above c's lost token 2");
    assert!(
        !store
            .is_current(&g, Bucket(0), c, FencingToken(2))
            .await
            .expect("is_current")
    );
}

/// V1 on a steady tick: a node that hands in the stamps it was given just before a lossless
/// (synchronous) failover, so that on the promoted server its groups and counters are exactly
/// those stamps, still gets a new session there: the steady statement (one `UPDATE`, no
/// function) checks the timeline as the heartbeat function does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_heartbeat_on_a_promoted_server_starts_a_new_session() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    let clock = ManualClock::starting_at(SystemClock.now());
    let store = store_on_both(&primary, &standby, &clock);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    let a = worker();
    let empty = MemberMetadata::empty();
    let joined = support::beat_as(&store, &g, a, process(a), ttl(), &empty)
        .await
        .expect("a's heartbeat");
    // The stamps of a heartbeat after the join: the next one, with nothing changed, is steady.
    let given = store
        .heartbeat(a, process(a), ttl(), &empty, &[])
        .await
        .expect("a's view");
    let seen: Vec<lease_core::GroupStamp> = given
        .groups
        .iter()
        .map(|v| lease_core::GroupStamp {
            group: v.group.clone(),
            stamp: v.stamp,
        })
        .collect();
    assert_eq!(seen.len(), 1, "a is a member of {g}");
    let steady = store
        .heartbeat(a, process(a), ttl(), &empty, &seen)
        .await
        .expect("a steady heartbeat");
    assert!(
        !steady.new_session && steady.groups.is_empty(),
        "the tick before the failover is steady: {steady:?}"
    );

    fail_over(&primary, &standby);

    clock.advance(Duration::from_millis(100));
    let after = until_ok("a's steady heartbeat on the promoted server", || {
        store.heartbeat(a, process(a), ttl(), &empty, &seen)
    })
    .await;
    assert!(
        after.new_session && after.session != joined.session,
        "a's session was renewed across the failover by its steady tick"
    );
}

/// A store whose URL names only a standby is refused with a transient error on every
/// operation that writes, and never crashes: with `target_session_attrs=read-write` no
/// connection is made, without it the statements fail read-only. Listing the standby first
/// and the primary second reaches the primary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_refused_with_a_transient_error_and_skipped_in_a_multi_host_url() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    let g = group();
    let w = worker();
    for query in ["target_session_attrs=read-write", ""] {
        let only_standby = PgLeaseStore::builder(standby.tcp_url("postgres", DB, query))
            .max_connections(1)
            .build()
            .expect("a store");
        let started = Instant::now();
        let refused = support::beat_as(
            &only_standby,
            &g,
            w,
            Incarnation::new(),
            ttl(),
            &MemberMetadata::empty(),
        )
        .await
        .expect_err("a heartbeat on a standby");
        assert_eq!(refused.kind(), ErrorKind::Backend, "{refused:?}");
        assert!(refused.is_transient(), "{refused:?}");
        assert!(started.elapsed() < Duration::from_secs(5), "slow refusal");
        eprintln!(
            "on the standby ({query:?}): {}",
            lease_core::Chain(&refused)
        );
    }
    let clock = ManualClock::starting_at(SystemClock.now());
    let both = store_on_both(&primary, &standby, &clock);
    both.ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group through the multi-host URL");
    let beat = support::beat_as(&both, &g, w, process(w), ttl(), &MemberMetadata::empty())
        .await
        .expect("a heartbeat through the multi-host URL");
    assert!(beat.new_session);
    let _: NodeId = w;
}

/// The procedure docs/postgres.md gives for a history that starts again at timeline 1
/// (`pg_upgrade`, a restore into a new cluster), on a stand-in: a database whose record holds
/// later timelines and whose tokens are far above timeline 1's floor. Without the procedure a
/// promotion to a recorded timeline starts no quiet period; with it, the promotion is seen and
/// its floor is above every token issued before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_reset_after_a_new_history_makes_the_next_failover_count() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    let clock = ManualClock::starting_at(SystemClock.now());
    let store = store_on_both(&primary, &standby, &clock);
    let g = group();
    store
        .ensure_group(&g, ShardCount::new(SHARDS).expect("n"))
        .await
        .expect("ensure_group");
    // The old history: timelines 2 and 3 recorded, a bucket claimed up to 3 << 32.
    primary
        .psql_in(
            DB,
            "INSERT INTO lease.server_epochs VALUES (2, now() - interval '1 day'), \
             (3, now() - interval '1 day'); \
             UPDATE lease.shards SET token = (3::bigint << 32) + 7 WHERE bucket = 0",
        )
        .expect("an old history");
    primary
        .psql_in(
            DB,
            "BEGIN; \
             DELETE FROM lease.server_epochs; \
             INSERT INTO lease.server_epochs (timeline, first_seen) \
             SELECT lease.timeline() - 1 - COALESCE(max(token) >> 32, 0), '-infinity' \
               FROM lease.shards; \
             INSERT INTO lease.server_epochs (timeline, first_seen) \
             VALUES (lease.timeline(), '-infinity'); \
             COMMIT",
        )
        .expect("the documented reset");
    fail_over(&primary, &standby);
    let w = worker();
    let empty = MemberMetadata::empty();
    let beat = until_ok("a heartbeat on the promoted server", || {
        support::beat_as(&store, &g, w, process(w), ttl(), &empty)
    })
    .await;
    assert!(
        store
            .claim(&g, w, beat.session, SHARDS, Takeover::Allowed)
            .await
            .expect("a claim")
            .is_empty(),
        "no quiet period after the promotion"
    );
    clock.advance(Duration::from_millis(2_900));
    let beat = support::beat_as(&store, &g, w, process(w), ttl(), &empty)
        .await
        .expect("renew");
    clock.advance(Duration::from_millis(100));
    let won = store
        .claim(&g, w, beat.session, SHARDS, Takeover::Allowed)
        .await
        .expect("a claim");
    let floor = (5_i64 << 32) + 1;
    assert_eq!(
        bucket_tokens(&tokens(&won)),
        vec![floor; SHARDS as usize],
        "base -3 (timeline 1, tokens below 4 << 32), timeline 2: floor 5 << 32 + 1"
    );
}
