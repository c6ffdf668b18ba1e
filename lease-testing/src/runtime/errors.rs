//! Runtime cases of store errors and refusals: transient errors retried and reported, a
//! permanent one ending the worker, a failed leave said on shutdown, and starts refused (a
//! shard count mismatch, a configuration already running, a node id in use).

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use lease_core::{Clock, ErrorKind, LeaseStore, Operation, ShardCount};
use lease_worker::{StartError, WorkerError, WorkerFailed};

use super::{Env, POLL, Pool, RENEW, Slow, TTL, lock, until};
use crate::Counters;

/// While every store call fails (transiently), the worker keeps retrying (at least 10 attempts,
/// with backoff) and does not end; each failed call is reported once to `on_error`, with the
/// store's error, and counted in `lease_store_errors_total`. Healed, it recovers and reports
/// nothing more.
///
/// The metric is read from a recorder installed for this case's thread only
/// (`metrics::set_default_local_recorder`), so cases running in parallel do not count into it:
/// the worker registers its metrics inside `start`, on the thread awaiting it, which is the
/// test's own thread on both runtimes (a `#[tokio::test]` body runs in `block_on`). The handles
/// it gets then count from any thread.
pub async fn store_errors_are_reported_and_retried_without_stopping<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let counters = Counters::default();
    let recorder = metrics::set_default_local_recorder(&counters);
    let errors_counted = || counters.get(r#"lease_store_errors_total{group="orders"}"#);
    let mut pool = Pool::new(&env, "orders", 4, false);
    let a = pool.start().await;
    drop(recorder);
    pool.until_balanced(5 * RENEW, "cold start").await;
    assert!(pool.errors_of(a).is_empty() && errors_counted() == 0);
    let faults = pool.faults(a);
    faults.fail_all.store(true, Ordering::SeqCst);
    // Backoff from 100 ms doubling to the renew interval: 10 attempts in 7.5 s.
    until(
        10 * RENEW,
        "10 failed attempts reported",
        || pool.errors_of(a).len() >= 10,
        || pool.errors_of(a),
    )
    .await;
    assert!(
        !pool.workers[&a].0.is_finished(),
        "a transient store error ended the worker"
    );
    faults.fail_all.store(false, Ordering::SeqCst);
    pool.until_balanced(5 * RENEW, "recovered").await;
    // Calls are made one at a time, and a tick succeeded since: every failed one was reported.
    let injected = faults.injected.load(Ordering::SeqCst);
    let reported = pool.errors_of(a);
    assert_eq!(
        reported.len() as u64,
        injected,
        "on_error calls for {injected} failed calls"
    );
    assert!(
        reported.iter().all(|k| *k == Some(ErrorKind::Backend)),
        "{reported:?}"
    );
    assert_eq!(errors_counted(), injected, "lease_store_errors_total");
    pool.shutdown().await;
}

/// A store error retrying cannot fix (permission denied) stops the worker, where a transient
/// one (unavailable) is retried: the worker revokes everything, ends, and `wait` returns the
/// store's error, not transient. The worker cannot leave the group either (the store refuses
/// every call of that worker), so the store still lists its session until it expires: the
/// other worker takes its buckets only then.
pub async fn a_permanent_store_error_stops_the_worker<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let a = pool.start().await;
    let b = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let faults = pool.faults(a);
    faults.fail_all.store(true, Ordering::SeqCst);
    until(
        5 * RENEW,
        "3 transient failures reported",
        || pool.errors_of(a).len() >= 3,
        || pool.errors_of(a),
    )
    .await;
    assert!(
        !pool.workers[&a].0.is_finished(),
        "a transient store error ended the worker"
    );
    // One switch on before the other goes off: no call gets through in between.
    faults.fail_permanently.store(true, Ordering::SeqCst);
    faults.fail_all.store(false, Ordering::SeqCst);
    let (mut handle, _) = pool.workers.remove(&a).expect("a");
    let owned = handle.owned();
    let ended = tokio::time::timeout(TTL + env.slack(), handle.wait())
        .await
        .expect("the worker kept running on a permanent error");
    match &ended {
        Err(WorkerFailed::Store(e)) => {
            assert!(!e.is_transient(), "ended on a transient error: {e:?}")
        }
        other => panic!("the worker ended with {other:?}"),
    }
    let ended_at = pool.clock.now();
    assert!(owned.borrow().is_empty(), "{:?}", owned.borrow());
    let held = lock(&pool.log)
        .holdings()
        .expect("holdings")
        .values()
        .flatten()
        .filter(|h| h.worker == a)
        .filter(|h| h.until.is_none())
        .count();
    assert_eq!(held, 0, "a's application still holds buckets");
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    let member = snap
        .members
        .iter()
        .find(|m| m.worker == a)
        .expect("a's session, which it could not leave");
    assert!(member.live && member.expires_at > ended_at);
    let expiry = member.expires_at;
    pool.until_owns(b, 8, TTL + RENEW + env.slack()).await;
    let taken = pool.assigned_at(b).into_iter().max().expect("assignments");
    assert!(
        taken >= expiry,
        "b was assigned a's buckets at {taken}, before a's session expired at {expiry}"
    );
    pool.shutdown().await;
}

/// A worker that cannot leave the group when stopped says so: `shutdown` fails with
/// `LeaveFailed` naming the leave's error, whether the store fails or does not answer, the
/// failure is reported to `on_error` too, and the store keeps the worker's session until it
/// expires (the others must wait for that).
pub async fn a_worker_that_cannot_leave_the_group_says_so_on_shutdown<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    for hang in [false, true] {
        let mut pool = Pool::new(&env, if hang { "hanging" } else { "failing" }, 4, false);
        let a = pool.start().await;
        pool.until_balanced(5 * RENEW, "cold start").await;
        let (handle, faults) = pool.workers.remove(&a).expect("a");
        let switch = if hang { &faults.hang } else { &faults.fail_all };
        switch.store(true, Ordering::SeqCst);
        let failed = handle.shutdown().await;
        match &failed {
            Err(WorkerFailed::LeaveFailed {
                source: WorkerError::Store { operation, source },
            }) if !hang => {
                assert_eq!(
                    (*operation, source.kind()),
                    (Operation::Leave, ErrorKind::Backend)
                );
            }
            Err(WorkerFailed::LeaveFailed {
                source: WorkerError::Timeout { operation, .. },
            }) if hang => assert_eq!(*operation, Operation::Leave),
            other => panic!("hang {hang}: the failed leave was not reported: {other:?}"),
        }
        assert_eq!(
            pool.errors_of(a).len(),
            1,
            "the failed leave is also reported to on_error"
        );
        switch.store(false, Ordering::SeqCst);
        // The session stays until it expires: a leave given up on must not happen later.
        let mut expiry = pool
            .session_expiry(a)
            .await
            .unwrap_or_else(|| panic!("hang {hang}: the session is gone without a leave"));
        let start = Instant::now();
        loop {
            let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
            let now = pool.clock.now();
            match snap.members.iter().find(|m| m.worker == a) {
                Some(m) if m.live => expiry = m.expires_at,
                Some(_) => break,
                None => {
                    assert!(
                        now >= expiry,
                        "hang {hang}: the session left at {now}, before its expiry {expiry}"
                    );
                    break;
                }
            }
            assert!(
                start.elapsed() < TTL + env.slack(),
                "the session never expired"
            );
            tokio::time::sleep(POLL).await;
        }
        pool.check();
    }
}

/// A worker configured with 8 buckets for a group the store holds with 4 is refused at start
/// with the typed mismatch, and nothing runs.
pub async fn a_shard_count_mismatch_refuses_to_start<S: LeaseStore + Clone + 'static>(env: Env<S>) {
    let pool = Pool::new(&env, "orders", 8, false);
    pool.store
        .ensure_group(&pool.group, ShardCount::new(4).expect("n"))
        .await
        .expect("ensure");
    pool.refused_for_its_count().await;
    let snap = pool.store.snapshot(&pool.group).await.expect("snapshot");
    assert!(snap.members.is_empty(), "{:?}", snap.members);
    pool.check();
}

/// A configuration runs as one task at a time: a clone started while the original runs is
/// refused (`AlreadyRunning`, before touching the store); once the original stopped, the
/// clone starts and owns every bucket.
pub async fn starting_a_running_configuration_again_is_refused<S: LeaseStore + Clone + 'static>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 4, true);
    let config = pool.config(None);
    let id = config.node_id();
    let (first, _) = pool
        .launch_config(config.clone(), id, Slow::default())
        .await
        .expect("the first start");
    until(
        5 * RENEW,
        "the first run owning 4",
        || first.owned().borrow().len() == 4,
        || first.owned().borrow().len(),
    )
    .await;
    match pool
        .launch_config(config.clone(), id, Slow::default())
        .await
    {
        Err(StartError::AlreadyRunning { group, worker }) => {
            assert_eq!((group, worker), (pool.group.clone(), id));
        }
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a running configuration started twice"),
    }
    assert_eq!(
        first.owned().borrow().len(),
        4,
        "the refused start disturbed the first"
    );
    first.shutdown().await.expect("a clean stop");
    let (second, faults) = pool
        .launch_config(config, id, Slow::default())
        .await
        .expect("the configuration starts again once stopped");
    pool.workers.insert(id, (second, faults));
    pool.until_owns(id, 4, RENEW + env.slack()).await;
    pool.shutdown().await;
}

/// Two processes started with one node id never share its session: the second is refused
/// (`NodeIdInUse`, reported at each attempt) and owns nothing while the first runs; once the
/// first stops gracefully the second starts a session of its own and takes every bucket, and
/// the ownership log shows no bucket held by both.
pub async fn two_processes_with_one_node_id_never_share_a_session<
    S: LeaseStore + Clone + 'static,
>(
    env: Env<S>,
) {
    let mut pool = Pool::new(&env, "orders", 8, true);
    let first = pool.start().await;
    pool.until_balanced(5 * RENEW, "cold start").await;
    let second = pool.start_as(first).await;
    until(
        5 * RENEW,
        "the second process refused 5 times",
        || pool.errors_of(second).len() >= 5,
        || pool.errors_of(second),
    )
    .await;
    assert_eq!(pool.owned()[&first], 8, "the first process lost buckets");
    assert_eq!(
        pool.owned()[&second],
        0,
        "the second process was given buckets of the first one's session"
    );
    let refused = pool.errors_of(second);
    assert!(
        refused.iter().all(|k| *k == Some(ErrorKind::NodeIdInUse)),
        "the second process did not report the id in use at each attempt: {refused:?}"
    );
    let stopped_at = pool.clock.now();
    pool.stop(first).await;
    pool.until_owns(second, 8, 2 * RENEW + env.slack()).await;
    assert!(pool.assigned_at(second).iter().all(|t| *t >= stopped_at));
    let summary = pool.shutdown().await;
    assert_eq!(summary.handoffs, 8);
}
