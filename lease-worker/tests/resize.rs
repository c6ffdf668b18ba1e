//! The worker machine following a resize of its group, driven by hand against the in-memory
//! store with explicit time: store calls are made as the machines ask, wake-ups are delivered
//! after every change (as a change feed would), and the application acknowledges at once
//! unless a test holds a revocation back. Every run's events are judged by the ownership log,
//! per bucket and per key across the two generations.

mod admission;
use admission::admit;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lease_core::ownership_log::OwnershipLog;
use lease_core::{
    AdminStore, Bucket, FencingToken, GroupName, Incarnation, ManualClock, NodeId, OwnershipEvent,
    ResizeOutcome, RevokeReason, ShardCount, StoreError, Ttl, WorkerStore,
};
use lease_memory::MemoryLeaseStore;
use lease_worker::WorkerFailed;
use lease_worker::machine::{Delivery, Input, Machine, Output, Report, Rules, StoreCall};

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const DEBOUNCE: Duration = Duration::from_millis(10);

fn n(x: u32) -> ShardCount {
    ShardCount::new(x).expect("a valid count")
}

fn group() -> GroupName {
    GroupName::new("resized").expect("a valid name")
}

fn rules(node: NodeId) -> Rules {
    Rules {
        node,
        incarnation: Incarnation::new(),
        metadata: lease_core::MemberMetadata::default(),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: Duration::from_millis(500),
        wake_debounce: DEBOUNCE,
        call_timeout: Duration::from_millis(1_500),
        ack_limit: None,
        keep_on_stop: None,
        loads: Default::default(),
    }
}

/// One worker: its machine, what its application holds, what it saw.
struct Worker {
    m: Machine,
    id: NodeId,
    /// What the application holds: bucket -> (token, shard count).
    app: BTreeMap<Bucket, (FencingToken, ShardCount)>,
    /// Revocations the application has not acknowledged, held back by the test.
    unacked: BTreeSet<Bucket>,
    /// Buckets whose revocation the application holds back instead of acknowledging.
    hold_back: BTreeSet<Bucket>,
    resized: Vec<(ShardCount, ShardCount)>,
    finished: Option<Result<(), WorkerFailed>>,
    /// Every assignment, with its parents.
    assigned: Vec<(lease_core::Assignment, Vec<Bucket>)>,
    revoked: Vec<(Bucket, RevokeReason)>,
}

/// Machines sharing one memory store whose clock moves with the test's time.
struct Pool {
    store: MemoryLeaseStore,
    clock: ManualClock,
    rt: tokio::runtime::Runtime,
    now: Instant,
    workers: Vec<Worker>,
    log: OwnershipLog<Instant>,
}

impl Pool {
    fn new(shards: u32) -> Self {
        let clock = ManualClock::new();
        let store = MemoryLeaseStore::with_clock(clock.clone());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        rt.block_on(store.ensure_group(&group(), n(shards)))
            .expect("the group");
        Self {
            store,
            clock,
            rt,
            now: Instant::now(),
            workers: Vec::new(),
            log: OwnershipLog::new(),
        }
    }

    fn add(&mut self, shards: u32) -> usize {
        let id = NodeId::new();
        let mut m = Machine::new(rules(id), self.now);
        admit(&mut m, self.now, group(), n(shards));
        self.workers.push(Worker {
            m,
            id,
            app: BTreeMap::new(),
            unacked: BTreeSet::new(),
            hold_back: BTreeSet::new(),
            resized: Vec::new(),
            finished: None,
            assigned: Vec::new(),
            revoked: Vec::new(),
        });
        self.workers.len() - 1
    }

    fn wake_all(&mut self) {
        for w in &mut self.workers {
            w.m.handle(self.now, Input::Wake);
        }
    }

    /// Make the call on the shared store; whether it changed what the others see (a wake-up
    /// for them).
    fn call(&self, call: StoreCall) -> (Input, bool) {
        let input = self.rt.block_on(call.execute(&self.store)).input;
        let woke = match &input {
            Input::Joined(_, r) => r.is_ok(),
            Input::Released(_, r) => r.as_ref().is_ok_and(|b| !b.is_empty()),
            Input::Left(..) => true,
            _ => false,
        };
        (input, woke)
    }

    /// Let every machine do all it can at the current instant.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            let mut progressed = false;
            let mut changed = false;
            for i in 0..self.workers.len() {
                let now = self.now;
                self.workers[i].m.handle_timeout(now);
                while let Some(out) = self.workers[i].m.poll(now) {
                    progressed = true;
                    match out {
                        Output::Call(call) => {
                            let (input, woke) = self.call(call);
                            changed |= woke;
                            self.workers[i].m.handle(now, input);
                        }
                        Output::Deliver(_, d) => self.deliver(i, d),
                        Output::Report(Report::Resized { from, to, .. }) => {
                            self.workers[i].resized.push((from, to));
                        }
                        Output::Report(_) => {}
                        // A worker's group ending ends it.
                        Output::GroupFinished(_, r) | Output::Finished(r) => {
                            if self.workers[i].finished.is_none() {
                                self.workers[i].finished = Some(r);
                            }
                        }
                    }
                }
            }
            if changed {
                self.wake_all();
            }
            if !progressed && !changed {
                return;
            }
        }
        panic!("the machines never settled");
    }

    fn deliver(&mut self, i: usize, d: Delivery) {
        let now = self.now;
        let w = &mut self.workers[i];
        match d {
            Delivery::Assign { bucket, token } => {
                let a = w.m.assignment(&group(), bucket, token).expect("the group");
                w.app.insert(bucket, (token, a.shards));
                w.assigned.push((a, a.parents()));
                self.log.record(w.id, OwnershipEvent::Assigned(a), now);
                w.m.handle(now, Input::Delivered(group()));
            }
            Delivery::Revoke {
                bucket,
                token,
                reason,
            } => {
                w.app.remove(&bucket);
                w.revoked.push((bucket, reason));
                self.log.record(
                    w.id,
                    OwnershipEvent::Revoked {
                        bucket,
                        token,
                        reason,
                    },
                    now,
                );
                if w.hold_back.contains(&bucket) {
                    w.unacked.insert(bucket);
                    w.m.handle(now, Input::Delivered(group()));
                } else {
                    w.m.handle(now, Input::Acked(group(), bucket));
                }
            }
        }
    }

    /// Move time on by `d` in steps of at most 5 ms, letting the machines act at each.
    fn run_for(&mut self, d: Duration) {
        let end = self.now + d;
        while self.now < end {
            self.settle();
            let step = Duration::from_millis(5).min(end - self.now);
            self.now += step;
            self.clock.advance(step);
        }
        self.settle();
    }

    fn ack(&mut self, i: usize, bucket: Bucket) {
        let now = self.now;
        let w = &mut self.workers[i];
        assert!(
            w.unacked.remove(&bucket),
            "bucket {bucket} was not held back"
        );
        w.hold_back.remove(&bucket);
        w.m.handle(now, Input::Acked(group(), bucket));
    }

    fn resize(&mut self, from: u32, to: u32) {
        let outcome = self
            .rt
            .block_on(self.store.resize(&group(), n(from), n(to)))
            .expect("the resize");
        assert!(matches!(outcome, ResizeOutcome::Started { .. }));
        self.wake_all();
    }

    /// Who the application of each worker holds each bucket of `shards` with.
    fn holders(&self, shards: ShardCount) -> BTreeMap<Bucket, NodeId> {
        let mut holders = BTreeMap::new();
        for w in &self.workers {
            for (&b, &(_, s)) in &w.app {
                if s == shards {
                    assert!(holders.insert(b, w.id).is_none(), "bucket {b} held twice");
                }
            }
        }
        holders
    }

    fn balanced(&self, shards: ShardCount) -> bool {
        let holders = self.holders(shards);
        let loads: Vec<usize> = self
            .workers
            .iter()
            .map(|w| holders.values().filter(|&&h| h == w.id).count())
            .collect();
        holders.len() == shards.get() as usize
            && loads
                .iter()
                .max()
                .zip(loads.iter().min())
                .is_some_and(|(a, b)| a - b <= 1)
    }
}

/// Two workers share 8 buckets; the group splits to 16. Each old bucket is revoked with
/// `resharded` before any new bucket sharing its keys is assigned, every new assignment names
/// its shard count and its one parent, and the change completes on wake-ups alone, well
/// within one renew interval.
#[test]
fn a_split_is_followed_within_a_renew_interval() {
    let mut pool = Pool::new(8);
    pool.add(8);
    pool.add(8);
    pool.run_for(TTL + RENEW * 2);
    assert!(
        pool.balanced(n(8)),
        "not balanced before: {:?}",
        pool.holders(n(8))
    );
    let assigned_before: usize = pool.workers.iter().map(|w| w.assigned.len()).sum();

    pool.resize(8, 16);
    pool.run_for(Duration::from_millis(200));
    assert!(
        pool.balanced(n(16)),
        "the split did not complete on wake-ups within 200 ms: {:?}",
        pool.holders(n(16))
    );
    assert!(pool.holders(n(8)).is_empty(), "old buckets still held");
    for w in &pool.workers {
        assert_eq!(w.resized, vec![(n(8), n(16))]);
        assert_eq!(w.m.shards(&group()), Some(n(16)));
        assert!(w.finished.is_none());
        let resharded = w
            .revoked
            .iter()
            .filter(|(_, r)| *r == RevokeReason::Resharded)
            .count();
        assert_eq!(resharded, 4, "each worker let its 4 old buckets go");
        for (a, parents) in &w.assigned[..] {
            if a.shards == n(16) {
                assert_eq!(a.resized_from, Some(n(8)));
                assert_eq!(parents, &vec![Bucket(a.bucket.get() % 8)]);
            }
        }
    }
    let assigned_after: usize = pool.workers.iter().map(|w| w.assigned.len()).sum();
    assert_eq!(assigned_after - assigned_before, 16);
    let summary = pool
        .log
        .check()
        .expect("no key held twice, tokens rising per key");
    let old_holdings = pool
        .log
        .holdings()
        .expect("holdings")
        .values()
        .flatten()
        .filter(|h| h.shards == n(8))
        .count();
    assert_eq!(
        summary.key_pairs,
        old_holdings * 2,
        "each old holding judged against the two new buckets holding its keys"
    );
}

/// A merge 16 -> 8 over three workers: a new bucket has two parents and waits for both.
#[test]
fn a_merge_waits_for_both_parents() {
    let mut pool = Pool::new(16);
    for _ in 0..3 {
        pool.add(16);
    }
    pool.run_for(TTL + RENEW * 3);
    assert!(pool.balanced(n(16)));
    pool.resize(16, 8);
    pool.run_for(Duration::from_millis(300));
    assert!(pool.balanced(n(8)), "{:?}", pool.holders(n(8)));
    for w in &pool.workers {
        for (a, parents) in &w.assigned {
            if a.shards == n(8) {
                let b = a.bucket.get();
                assert_eq!(parents, &vec![Bucket(b), Bucket(b + 8)]);
            }
        }
    }
    let summary = pool.log.check().expect("no key held twice");
    assert!(summary.key_pairs >= 16, "{summary:?}");
}

/// An application slow to stop working on an old bucket holds back exactly the new buckets
/// that share its keys: the others move on, these wait for the acknowledgement.
#[test]
fn a_slow_acknowledgement_holds_back_only_the_children() {
    let mut pool = Pool::new(4);
    let a = pool.add(4);
    pool.run_for(TTL + RENEW);
    assert_eq!(pool.holders(n(4)).len(), 4);
    pool.workers[a].hold_back.insert(Bucket(1));
    pool.resize(4, 8);
    pool.run_for(Duration::from_millis(200));
    let held = pool.holders(n(8));
    let waiting: Vec<u32> = (0..8).filter(|b| !held.contains_key(&Bucket(*b))).collect();
    assert_eq!(waiting, vec![1, 5], "only old bucket 1's children wait");
    pool.ack(a, Bucket(1));
    pool.run_for(Duration::from_millis(100));
    assert_eq!(pool.holders(n(8)).len(), 8);
    pool.log.check().expect("no key held twice");
}

/// A worker configured with the count the group was resized from adopts the new count; one
/// configured with any other count stops with the mismatch error, holding nothing.
#[test]
fn a_worker_adopts_the_new_count_or_stops_on_another() {
    let mut pool = Pool::new(8);
    pool.resize(8, 12);
    let old = pool.add(8);
    let other = pool.add(6);
    pool.run_for(TTL + RENEW);
    assert_eq!(pool.workers[old].resized, vec![(n(8), n(12))]);
    assert_eq!(pool.holders(n(12)).len(), 12);
    assert!(pool.workers[old].finished.is_none());
    match &pool.workers[other].finished {
        Some(Err(WorkerFailed::Store(StoreError::ShardCountMismatch {
            configured,
            found,
            ..
        }))) => assert_eq!((*configured, *found), (n(6), n(12))),
        ended => panic!("the worker configured with 6 ended with {ended:?}"),
    }
    assert!(pool.workers[other].app.is_empty());
}

/// A worker that dies holding old buckets during the drain: the new buckets sharing their
/// keys wait until its session is dead, then the survivor takes them, and no key is held
/// twice.
#[test]
fn an_owner_dead_during_the_drain_retires_its_buckets_by_expiry() {
    let mut pool = Pool::new(4);
    let live = pool.add(4);
    let dying = pool.add(4);
    pool.run_for(TTL + RENEW * 2);
    assert!(pool.balanced(n(4)));
    let dead_held: BTreeSet<Bucket> = pool.workers[dying].app.keys().copied().collect();
    // The worker dies: its machine is never polled again; what its application held ends now.
    let crashed = pool.workers.remove(dying);
    pool.log.crashed(crashed.id, pool.now);
    pool.resize(4, 8);
    pool.run_for(Duration::from_millis(200));
    let held = pool.holders(n(8));
    for b in 0..8 {
        let parent_dead = dead_held.contains(&Bucket(b % 4));
        assert_eq!(
            held.contains_key(&Bucket(b)),
            !parent_dead,
            "new bucket {b}: taken before its dead parent expired, or not taken"
        );
    }
    pool.run_for(TTL * 2);
    assert_eq!(pool.holders(n(8)).len(), 8);
    assert!(
        pool.holders(n(8))
            .values()
            .all(|&w| w == pool.workers[live].id)
    );
    pool.log.check().expect("no key held twice");
}
