//! `leasectl worker` processes through two online resizes of their group, each made with
//! `leasectl resize --apply`: 8 -> 16 (a split,
//! each new bucket waiting for one old one) with a worker frozen and then SIGKILLed while it
//! still holds old buckets, then 16 -> 12 (each new bucket waiting for four old ones held by
//! different workers), then a worker started with the previous count joining. After each
//! step the store agrees with the workers and the group is owned evenly; at the end the
//! merged event log of every process shows that no key was ever in buckets held by two
//! workers at once, across the three generations, and that tokens rose per key.

mod support;

use std::time::{Duration, Instant};

use chrono::Utc;
use lease::store::BucketState;
use support::pool::{LONG, Pool};

/// Resize the pool's group with `leasectl resize --apply`, and judge balance by the new count
/// from then on.
fn resize(pool: &mut Pool, to: u32) {
    let out = support::leasectl()
        .args([
            "resize",
            "--group",
            pool.group.as_str(),
            "--from",
            &pool.shards.to_string(),
            "--to",
            &to.to_string(),
            "--apply",
        ])
        .env("DATABASE_URL", &pool.url)
        .output()
        .expect("running leasectl resize");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "leasectl resize failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("generation"), "{stdout}");
    pool.shards = to;
}

/// Wait until no old bucket is left and the running workers own the new generation evenly,
/// as they say and as the store says.
async fn until_resized(pool: &Pool, what: &str) -> Duration {
    let start = Instant::now();
    loop {
        if pool.balanced() {
            let snap = pool.snapshot().await;
            if snap.draining.is_empty() && snap.shard_count.get() == pool.shards {
                pool.check_store().await;
                return start.elapsed();
            }
        }
        assert!(start.elapsed() < LONG, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leasectl_workers_follow_a_split_and_a_merge_with_a_worker_killed_mid_drain() {
    let db = lease_testdb::database().await;
    let mut pool = Pool::new(&db.url, "chaos-resize", 8);
    for name in ["w1", "w2", "w3", "w4"] {
        pool.start(name);
    }
    pool.until_balanced("the cold start");

    // 8 -> 16 with w4 frozen: its old buckets cannot retire by release, so the drain is
    // still under way when it is killed.
    let victim = pool.running.remove("w4").expect("w4");
    let victim_id = victim.worker().expect("started");
    let victim_held = victim.owned();
    assert_eq!(victim_held.len(), 2, "w4's share of 8");
    victim.signal("STOP");
    let frozen_at = Utc::now();
    resize(&mut pool, 16);
    let deadline = Instant::now() + LONG;
    loop {
        // The live workers' old buckets retire at once; w4's stay.
        let snap = pool.snapshot().await;
        let draining: Vec<u32> = snap
            .draining
            .iter()
            .filter(|b| b.state == BucketState::Live)
            .map(|b| b.bucket.get())
            .collect();
        if draining.len() == 2 {
            assert!(
                draining.iter().all(|b| victim_held.contains_key(b)),
                "{draining:?} still draining, w4 held {victim_held:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "the live workers never drained");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    victim.signal("KILL");
    let mut victim = victim;
    assert!(!victim.wait(LONG).success(), "w4 survived SIGKILL");
    pool.gone.push(victim);
    let took = until_resized(&pool, "the split, w4's keys after its session expired").await;
    eprintln!("8 -> 16, one of 4 workers killed mid-drain: owned by the 3 others {took:?} later");

    // 16 -> 12: every new bucket has four parents, spread over the three workers.
    let started = Instant::now();
    resize(&mut pool, 12);
    let took = until_resized(&pool, "the merge to 12").await;
    eprintln!(
        "16 -> 12 with 3 live workers: followed in {took:?} ({:?} with the resize call)",
        started.elapsed()
    );

    // A worker configured with the count the group was last resized from adopts 12.
    pool.start_with_shards("w5", 16);
    pool.until_balanced("w5 joining with --shards 16");
    let w5 = pool.running["w5"].events();
    let shards: Vec<u32> = w5
        .iter()
        .filter(|e| e.event == "assigned")
        .filter_map(|e| e.shards)
        .collect();
    assert!(
        !shards.is_empty() && shards.iter().all(|&s| s == 12),
        "{shards:?}"
    );
    pool.check_store().await;

    // The merged log: w4 stopped working when it was frozen.
    let mut log = pool.merged_log(|_, _| {});
    log.crashed(victim_id, frozen_at);
    let summary = log
        .check()
        .unwrap_or_else(|e| panic!("a key held twice in the merged log: {e}"));
    eprintln!(
        "merged log: {} assignments, {} handoffs, revocations {:?}, {} pairs of buckets \
         sharing keys across counts judged",
        summary.assignments, summary.handoffs, summary.revocations, summary.key_pairs
    );
    assert!(summary.revocations.get("resharded").copied().unwrap_or(0) >= 6 + 16);
    assert!(summary.key_pairs > 0);
    // Every assignment after a resize names the old buckets sharing its keys.
    for w in pool.running.values() {
        for e in w.events().iter().filter(|e| e.event == "assigned") {
            let parents = e.parents.clone().expect("parents");
            match e.shards {
                Some(16) => assert_eq!(parents, vec![e.bucket.expect("bucket") % 8]),
                Some(12) => assert_eq!(parents.len(), 4, "{e:?}"),
                Some(8) => assert!(parents.is_empty()),
                other => panic!("an assignment of {other:?} shards"),
            }
        }
    }
    pool.stop_all();
}
