//! Runtime cases of load-aware balance: the applications report their buckets' loads, and
//! the workers share the work rather than the bucket count.

use lease_core::{Bucket, LeaseStore, Load};

use super::{Env, Pool, RENEW};

/// The load every application reports for `bucket`: bucket 0 is ten times as hot as each
/// of the others, and alone above a fair share of two workers (10 of 17).
fn load_of(bucket: Bucket) -> Load {
    let units = if bucket == Bucket(0) { 10.0 } else { 1.0 };
    Load::new(units).expect("a load")
}

/// Two workers share eight buckets 4 : 4 by count. Once the applications report their
/// loads (bucket 0 ten times as hot as each other one), the owner of bucket 0 keeps it
/// alone (it alone is above a fair share, 10 of 17) and the other worker works the seven
/// cold ones: 10 : 7, where the count-fair split leaves one worker at 13 of 17 or more.
/// Nothing is owned twice meanwhile, and once there the split stays put.
pub async fn reported_loads_share_the_work_not_the_bucket_count<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW + env.slack(), "cold start")
        .await;
    let report = |pool: &Pool<S>| {
        for (handle, _) in pool.workers.values() {
            let owned: Vec<Bucket> = handle.owned().borrow().keys().copied().collect();
            for bucket in owned {
                // A worker that ended takes no report; the checks below say what went wrong.
                handle.report_load(bucket, load_of(bucket)).ok();
            }
        }
    };
    let split = |pool: &Pool<S>| {
        let mut by_worker: Vec<(usize, bool)> = pool
            .workers
            .values()
            .map(|(h, _)| {
                let owned = h.owned().borrow().clone();
                (owned.len(), owned.contains_key(&Bucket(0)))
            })
            .collect();
        by_worker.sort();
        by_worker
    };
    let isolated = |pool: &Pool<S>| split(pool) == [(1, true), (7, false)];
    super::until(
        12 * RENEW + env.slack(),
        "bucket 0 alone on its worker, the seven others on the other",
        || {
            report(&pool);
            isolated(&pool)
        },
        || split(&pool),
    )
    .await;
    let moves = pool.check().handoffs;
    // Steady: a few more ticks of the same loads move nothing.
    let steady = tokio::time::Instant::now();
    while steady.elapsed() < 4 * RENEW {
        report(&pool);
        tokio::time::sleep(RENEW / 4).await;
    }
    assert!(isolated(&pool), "the split moved again: {:?}", split(&pool));
    assert_eq!(
        pool.check().handoffs,
        moves,
        "buckets moved under steady loads"
    );
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    assert_eq!(
        snap.buckets[0].load,
        load_of(Bucket(0)),
        "bucket 0's load recorded"
    );
    let work: Vec<u64> = {
        let mut w: Vec<u64> = snap.members.iter().map(|m| m.load).collect();
        w.sort_unstable();
        w
    };
    assert_eq!(
        work,
        [7_000_000, 10_000_000],
        "each member's work as published, in millionths: {:?} and {:?}",
        a,
        b
    );
    pool.shutdown().await;
}
