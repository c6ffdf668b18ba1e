//! `leasectl worker` processes through a failover to a streaming standby: a primary and a
//! standby of the test's own (lease-testdb), every worker given one multi-host URL
//! (`target_session_attrs=read-write`), the primary killed (`pg_ctl stop -m immediate`) and
//! the standby promoted. Every worker renews on the new primary, the group ends owned and
//! balanced within ttl + renew + 2 s of the promotion, the store agrees with the workers, the merged event log shows no bucket held by
//! two workers at once, and every token assigned after the failover exceeds every token
//! assigned before it.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease::postgres::PgLeaseStore;
use lease_testdb::{Cluster, ClusterOptions, Replication};
use support::pool::Pool;

const DB: &str = "failover";

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
    let standby = tokio::task::block_in_place(|| primary.start_standby(replication))
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    (primary, standby)
}

/// Per bucket, the highest token assigned before `t` and the lowest at or after it, in the
/// workers' printed events.
fn tokens_around(pool: &Pool, t: DateTime<Utc>) -> (BTreeMap<u32, i64>, BTreeMap<u32, i64>) {
    let (mut before, mut after) = (BTreeMap::new(), BTreeMap::new());
    for w in pool.running.values().chain(pool.gone.iter()) {
        for e in w.events() {
            let (Some(bucket), Some(token)) = (e.bucket, e.token) else {
                continue;
            };
            if e.event != "assigned" {
                continue;
            }
            if e.at < t {
                let m = before.entry(bucket).or_insert(token);
                *m = (*m).max(token);
            } else {
                let m = after.entry(bucket).or_insert(token);
                *m = (*m).min(token);
            }
        }
    }
    (before, after)
}

/// Kill `primary`, promote `standby`, then judge the pool on the new primary.
async fn fail_over_and_judge(pool: &mut Pool, primary: &Cluster, standby: &Cluster, what: &str) {
    let killed_at = Utc::now();
    let killed = Instant::now();
    tokio::task::block_in_place(|| {
        primary.kill().expect("killing the primary");
        standby.promote().expect("promoting the standby");
    });
    let promoted = killed.elapsed();
    let promoted_at = Utc::now();
    let renewed = pool
        .until_renewed_after(promoted_at, "renewals on the new primary")
        .await;
    let balanced = pool.until_balanced("balance on the new primary");
    pool.check_store().await;
    // ttl 3 s, renew 1 s (Pool::start): the bound of the in-process failover tests.
    assert!(
        renewed + balanced < Duration::from_secs(6),
        "{what}: settled {:?} after the promotion, beyond ttl + renew + 2 s",
        renewed + balanced
    );
    eprintln!(
        "{what}: kill to promoted {promoted:?}; every worker renewed {renewed:?} after the \
         promotion, owned and balanced {:?} later",
        balanced
    );
    let summary = pool
        .merged_log(|_, _| {})
        .check()
        .unwrap_or_else(|e| panic!("{what}: overlap in the merged event log: {e}"));
    let (before, after) = tokens_around(pool, killed_at);
    for (bucket, first_after) in &after {
        let last_before = before.get(bucket).copied().unwrap_or(0);
        assert!(
            *first_after > last_before,
            "{what}: bucket {bucket} assigned with token {first_after} after the failover, \
             {last_before} before"
        );
    }
    eprintln!(
        "{what}: merged log: {} assignments, {} handoffs, revocations {:?}, {} error events",
        summary.assignments,
        summary.handoffs,
        summary.revocations,
        pool.error_events()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasectl_workers_live_through_a_synchronous_failover() {
    let (primary, standby) = primary_and_standby(Replication::Synchronous).await;
    let url = Cluster::multi_host_url(
        &[&primary, &standby],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut pool = Pool::new(&url, "failover", 12);
    for name in ["w1", "w2", "w3"] {
        pool.start(name);
    }
    pool.until_balanced("the cold start");
    // The promoted server trusts its switch point only if it ran for over a second before the
    // old primary's last heartbeat it replayed (V4): wait for that, then for a renewal.
    let deadline = Instant::now() + Duration::from_secs(10);
    while standby
        .psql_in(
            DB,
            "SELECT clock_timestamp() > pg_postmaster_start_time() + interval '1.2 seconds'",
        )
        .as_deref()
        != Ok("t")
    {
        assert!(Instant::now() < deadline, "the standby's clock");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pool.until_renewed_after(Utc::now(), "renewals after the standby's first second")
        .await;
    fail_over_and_judge(&mut pool, &primary, &standby, "synchronous failover").await;
    // Nothing was lost: every session was kept, and status and doctor say so.
    let on_new = standby.tcp_url("postgres", DB, "");
    let (code, out, err) = support::run(&["status"], Some(&on_new));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("after the last failover: 3 session(s) kept with their buckets, 0 restarted"),
        "{out}"
    );
    let (code, out, err) = support::run(&["doctor"], Some(&on_new));
    assert!(code == 0 || code == 1, "{err}");
    let line = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("failover"))
        .unwrap_or_else(|| panic!("no failover check: {out}"));
    assert!(
        line.starts_with("ok") && line.contains("every session (3) was kept"),
        "{line}"
    );
    eprintln!("status and doctor after the failover: {line}");
    pool.stop_all();
}

/// Replication cut first: a fourth worker's join and the rebalance it causes reach the
/// primary only, then the primary dies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasectl_workers_stay_exclusive_through_an_asynchronous_failover_with_lost_writes() {
    let (primary, standby) = primary_and_standby(Replication::Asynchronous).await;
    let url = Cluster::multi_host_url(
        &[&primary, &standby],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut pool = Pool::new(&url, "failover", 12);
    for name in ["w1", "w2", "w3"] {
        pool.start(name);
    }
    pool.until_balanced("the cold start");
    tokio::task::block_in_place(|| standby.cut_replication()).expect("cutting replication");
    pool.start("w4");
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool.running["w4"].owned().len() < 3 {
        assert!(Instant::now() < deadline, "w4 never got its share");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    fail_over_and_judge(&mut pool, &primary, &standby, "asynchronous failover").await;
    pool.stop_all();
}
