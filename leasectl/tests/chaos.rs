//! Chaos with real processes on real Postgres: several `leasectl worker --json` processes,
//! driven with signals while the database loses its connections. Judged from the merged JSON
//! event logs: no bucket held by two running workers at once, failover only after expiry and
//! promptly after it, a prompt graceful handoff, a served late joiner, a zombie that fences
//! itself with tokens below the new owners', and an owned, balanced group at the end. A
//! server restart under such a pool is `chaos_restart.rs`, a process of its own: it needs a
//! server it can restart, which this test does not.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use chrono::Utc;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use support::pool::{LONG, Pool};
use support::{Event, WorkerProcess, wait_for};

const GROUP: &str = "chaos";
const SHARDS: u32 = 24;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

fn buckets_of(w: &WorkerProcess) -> BTreeSet<u32> {
    w.owned().keys().copied().collect()
}

fn secs(d: chrono::Duration) -> f64 {
    d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_with_real_processes() {
    let db = lease_testdb::database().await;
    let mut pool = Pool::new(&db.url, GROUP, SHARDS);
    let mut figures: Vec<String> = Vec::new();

    for name in ["w1", "w2", "w3", "w4"] {
        pool.start(name);
    }
    let took = pool.until_balanced("the cold start");
    figures.push(format!(
        "cold start of 4 workers x {SHARDS} buckets balanced in {took:?}"
    ));

    // 1. SIGKILL: the buckets move only after the lease expires, and soon after.
    let victim = pool.running.remove("w1").expect("w1");
    let held = buckets_of(&victim);
    let victim_id = victim.worker().expect("w1 started");
    victim.signal("KILL");
    let killed_at = Utc::now();
    let expiry = pool
        .snapshot()
        .await
        .members
        .iter()
        .find(|m| m.worker == victim_id)
        .expect("w1's member row")
        .expires_at;
    wait_for("w1's buckets to be re-owned", LONG, || {
        let moved: BTreeSet<u32> = pool
            .reassignments("w1", &held, killed_at)
            .iter()
            .filter_map(|e| e.bucket)
            .collect();
        moved == held
    });
    let moved = pool.reassignments("w1", &held, killed_at);
    let first = moved.iter().map(|e| e.at).min().expect("re-assignments");
    let last = moved.iter().map(|e| e.at).max().expect("re-assignments");
    assert!(
        first >= expiry,
        "a killed worker's bucket moved {:.3}s before its lease expired",
        secs(expiry - first)
    );
    let bound = chrono::Duration::from_std(TTL + RENEW + Duration::from_secs(1)).expect("bound");
    assert!(
        last - killed_at <= bound,
        "the killed worker's buckets took {:.3}s to move",
        secs(last - killed_at)
    );
    figures.push(format!(
        "SIGKILL: {} buckets re-owned {:.3}s to {:.3}s after the kill, {:.3}s after the lease \
         expired (bound: ttl + renew + 1 s = {:.0}s)",
        held.len(),
        secs(first - killed_at),
        secs(last - killed_at),
        secs(first - expiry),
        secs(bound)
    ));
    pool.gone.push(victim);
    pool.until_balanced("balance after the kill");

    // 2. SIGSTOP past the ttl, then SIGCONT: a zombie.
    let zombie_held: BTreeMap<u32, i64> = pool.running["w2"].owned();
    let zombie_buckets: BTreeSet<u32> = zombie_held.keys().copied().collect();
    pool.running["w2"].signal("STOP");
    let stopped_at = Utc::now();
    wait_for("the frozen worker's buckets to be re-owned", LONG, || {
        let moved: BTreeSet<u32> = pool
            .reassignments("w2", &zombie_buckets, stopped_at)
            .iter()
            .filter_map(|e| e.bucket)
            .collect();
        moved == zombie_buckets
    });
    let new_tokens: BTreeMap<u32, i64> = pool
        .reassignments("w2", &zombie_buckets, stopped_at)
        .iter()
        .filter_map(|e| Some((e.bucket?, e.token?)))
        .collect();
    let continued_at = Utc::now();
    pool.running["w2"].signal("CONT");
    wait_for("the zombie to revoke what it held", LONG, || {
        pool.running["w2"]
            .events()
            .iter()
            .filter(|e| e.at >= continued_at && e.event == "revoked")
            .count()
            >= zombie_held.len()
    });
    let after: Vec<Event> = pool.running["w2"]
        .events()
        .into_iter()
        .filter(|e| e.at >= continued_at && (e.event == "assigned" || e.event == "revoked"))
        .collect();
    let first_revocations = &after[..zombie_held.len()];
    for e in first_revocations {
        assert_eq!(
            e.event, "revoked",
            "the zombie did something before fencing: {after:?}"
        );
        assert!(
            matches!(e.reason.as_deref(), Some("expired" | "lost")),
            "the zombie revoked with {:?}",
            e.reason
        );
        let bucket = e.bucket.expect("bucket");
        let (old, new) = (zombie_held[&bucket], new_tokens[&bucket]);
        assert!(
            old < new,
            "bucket {bucket}: zombie token {old} is not below the new owner's {new}"
        );
    }
    assert!(
        pool.running["w2"]
            .events()
            .iter()
            .all(|e| e.at <= stopped_at || e.at >= continued_at),
        "the frozen process printed while stopped"
    );
    figures.push(format!(
        "SIGSTOP for {:.3}s (ttl 3 s): {} buckets re-owned while frozen; on SIGCONT the zombie \
         revoked them first ({}), with tokens below the new owners'",
        secs(continued_at - stopped_at),
        zombie_held.len(),
        first_revocations
            .iter()
            .filter_map(|e| e.reason.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
            .join("/")
    ));
    pool.until_balanced("balance after the zombie rejoined");

    // 3. SIGTERM: a graceful handoff within a second.
    let mut leaver = pool.running.remove("w3").expect("w3");
    let handed = buckets_of(&leaver);
    leaver.signal("TERM");
    let termed_at = Utc::now();
    let status = leaver.wait(LONG);
    assert!(status.success(), "SIGTERM exit status {status:?}");
    assert_eq!(
        leaver.events().last().map(|e| e.event.clone()).as_deref(),
        Some("stopped")
    );
    wait_for("the graceful handoff", LONG, || {
        let moved: BTreeSet<u32> = pool
            .reassignments("w3", &handed, termed_at)
            .iter()
            .filter_map(|e| e.bucket)
            .collect();
        moved == handed
    });
    let handoff = pool
        .reassignments("w3", &handed, termed_at)
        .iter()
        .map(|e| e.at)
        .max()
        .expect("handoff")
        - termed_at;
    assert!(
        handoff <= chrono::Duration::seconds(1),
        "graceful handoff took {:.3}s",
        secs(handoff)
    );
    figures.push(format!(
        "SIGTERM: exit 0, {} buckets re-owned within {:.3}s",
        handed.len(),
        secs(handoff)
    ));
    pool.gone.push(leaver);
    pool.until_balanced("balance after the graceful stop");

    // 4. A late joiner gets its share.
    pool.start("w5");
    let took = pool.until_balanced("the late joiner's share");
    let share = pool.running["w5"].owned().len();
    assert!(share >= (SHARDS as usize) / pool.running.len());
    figures.push(format!(
        "late joiner: {share} buckets, balanced in {took:?}"
    ));

    // 5. Every database connection terminated once.
    let mut admin = AsyncPgConnection::establish(&db.url).await.expect("admin");
    let cut_at = Utc::now();
    admin
        .batch_execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = '{}' AND pid <> pg_backend_pid()",
            db.name
        ))
        .await
        .expect("terminate connections");
    drop(admin);
    let took = pool
        .until_renewed_after(cut_at, "renewals after the connections were cut")
        .await;
    pool.until_balanced("balance after terminated connections");
    figures.push(format!(
        "all connections terminated: every worker renewed again within {took:?}"
    ));

    // Settle for two renew intervals, so the last word is the workers' steady state.
    tokio::time::sleep(RENEW * 2).await;
    pool.until_balanced("the final balance");

    pool.check_store().await;

    // The merged log: no bucket held by two running workers at once. A frozen process does
    // nothing: what it held when stopped, it held only until then, so its first revocation of
    // each of those buckets after it continued is dated back to the stop. Only those: what it
    // holds after rejoining is judged at the times it said.
    let mut log = pool.merged_log(|w, events| {
        if w.name != "w2" {
            return;
        }
        let mut pending = zombie_held.clone();
        for e in events.iter_mut() {
            if e.event != "revoked" || e.at < continued_at {
                continue;
            }
            let Some(token) = e.bucket.and_then(|b| pending.remove(&b)) else {
                continue;
            };
            assert_eq!(
                e.token,
                Some(token),
                "the zombie revoked another lease: {e:?}"
            );
            e.at = stopped_at;
        }
        assert!(
            pending.is_empty(),
            "the zombie never revoked {pending:?} after it continued"
        );
    });
    log.crashed(victim_id, killed_at);
    let summary = log
        .check()
        .unwrap_or_else(|e| panic!("overlap in the merged event log: {e}"));
    let errors = pool.error_events();
    figures.push(format!(
        "merged log: {} assignments, {} handoffs, revocations {:?}, {errors} error events \
         reported, 0 overlaps",
        summary.assignments, summary.handoffs, summary.revocations
    ));
    pool.stop_all();
    eprintln!("chaos figures:\n  {}", figures.join("\n  "));
}
