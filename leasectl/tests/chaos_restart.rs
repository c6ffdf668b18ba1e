//! `leasectl worker` processes through a restart of the database server: every worker renews
//! again once the server is back, the group ends owned and balanced, the store agrees with the
//! workers, and the merged event log shows no bucket held by two workers at once.
//!
//! It restarts the server, so it needs one of its own: the only test of its file (a process of
//! its own with a cluster of its own), and it fails, rather than pass having checked nothing,
//! when `DATABASE_URL` names an external server.

mod support;

use chrono::Utc;
use support::pool::Pool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_live_through_a_server_restart() {
    let Some(cluster) = lease_testdb::server().own() else {
        panic!(
            "this test restarts the database server, so it needs a server of its own: unset \
             DATABASE_URL to let it start one (the other tests can use an external server)"
        );
    };
    let db = lease_testdb::database().await;
    let mut pool = Pool::new(&db.url, "restart", 12);
    for name in ["w1", "w2", "w3"] {
        pool.start(name);
    }
    pool.until_balanced("the cold start");

    let restarting = std::time::Instant::now();
    tokio::task::spawn_blocking(|| cluster.restart())
        .await
        .expect("the restart task")
        .expect("restarting the server");
    let down = restarting.elapsed();
    let back_at = Utc::now();
    let took = pool
        .until_renewed_after(back_at, "renewals after the restart")
        .await;
    pool.until_balanced("balance after the restart");
    eprintln!(
        "server restart ({down:?} from stop to ready): every worker renewed again within \
         {took:?} after it came back"
    );
    pool.check_store().await;
    let summary = pool
        .merged_log(|_, _| {})
        .check()
        .unwrap_or_else(|e| panic!("overlap in the merged event log: {e}"));
    eprintln!(
        "merged log: {} assignments, {} handoffs, revocations {:?}, {} error events",
        summary.assignments,
        summary.handoffs,
        summary.revocations,
        pool.error_events()
    );
    pool.stop_all();
}
