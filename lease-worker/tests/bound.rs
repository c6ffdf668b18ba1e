//! The bound of a session's writes the machine hands in with each heartbeat (the contract's
//! V4): the position of the first heartbeat answered after its last write was answered, none
//! while a write is unbounded, none for the rest of a session once a write failed, none on a
//! session's first heartbeats, and none while the session is not trusted. One machine on the memory store, whose heartbeats are given
//! positions here (one per call made, so every later call's is higher); a second node joins
//! and leaves through the store to make the machine claim, shed and release.

use std::time::{Duration, Instant};

use lease_core::{
    BackendFailure, GroupName, Incarnation, LogPosition, ManualClock, MemberMetadata, NodeId,
    Operation, SessionBound, SessionId, ShardCount, StoreError, Ttl, WorkerStore,
};
use lease_memory::MemoryLeaseStore;
use lease_worker::machine::{Delivery, Input, Machine, Output, Rules, StoreCall};

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);

fn rules(node: NodeId) -> Rules {
    Rules {
        node,
        incarnation: Incarnation::new(),
        metadata: MemberMetadata::empty(),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: Duration::from_millis(500),
        wake_debounce: Duration::from_millis(10),
        call_timeout: Duration::from_millis(1500),
        ack_limit: Some(Duration::from_secs(2)),
        keep_on_stop: None,
        loads: Default::default(),
    }
}

/// What the bound must be, derived from the calls and answers alone.
#[derive(Default)]
struct Expected {
    session: Option<SessionId>,
    /// A write answered and no heartbeat answered since.
    unbounded: bool,
    /// A write failed under the session.
    in_doubt: bool,
    bound: Option<LogPosition>,
}

impl Expected {
    /// The session's bound, whether the session is trusted or not.
    fn bound(&self) -> Option<SessionBound> {
        match (self.session, self.unbounded || self.in_doubt, self.bound) {
            (Some(session), false, Some(position)) => Some(SessionBound { session, position }),
            _ => None,
        }
    }
}

struct Run {
    store: MemoryLeaseStore,
    clock: ManualClock,
    now: Instant,
    m: Machine,
    calls: u64,
    expected: Expected,
    /// Fail the next call of this operation (the store is not called).
    fail_next: Option<Operation>,
    /// Fail every heartbeat until then.
    cut_until: Option<Instant>,
    /// Heartbeats sent past the trust deadline while the session had a bound.
    untrusted: usize,
    /// Heartbeats seen handing in a bound, and not.
    with_bound: usize,
    without: usize,
}

impl Run {
    /// Do all the machine asks at the current instant, checking every heartbeat's bound.
    async fn settle(&mut self) {
        let now = self.now;
        self.m.handle_timeout(now);
        while let Some(out) = self.m.poll(now) {
            match out {
                Output::Call(call) => self.make(call).await,
                Output::Deliver(group, d) => {
                    self.m.handle(now, Input::Delivered(group.clone()));
                    if let Delivery::Revoke { bucket, .. } = d {
                        self.m.handle(now, Input::Acked(group, bucket));
                    }
                }
                Output::Report(_) | Output::GroupFinished(..) | Output::Finished(_) => {}
            }
        }
    }

    async fn make(&mut self, call: StoreCall) {
        self.calls += 1;
        if let StoreCall::Heartbeat { bound, .. } = &call {
            let trusted = self.m.trusted_until().is_some_and(|t| self.now < t);
            if !trusted && self.expected.bound().is_some() {
                self.untrusted += 1;
            }
            assert_eq!(
                *bound,
                self.expected.bound().filter(|_| trusted),
                "the bound handed in, call {}",
                self.calls
            );
            if bound.is_some() {
                self.with_bound += 1;
            } else {
                self.without += 1;
            }
        }
        let writes = call.writes();
        let cut = matches!(call, StoreCall::Heartbeat { .. })
            && self.cut_until.is_some_and(|until| self.now < until);
        let input = if cut || self.fail_next == Some(call.operation()) {
            self.fail_next = None;
            let e = StoreError::backend_detail(
                call.operation(),
                BackendFailure::Unavailable,
                "the connection broke",
            );
            call.failed(e)
        } else {
            call.execute(&self.store).await.input
        };
        let input = match input {
            Input::Heartbeat(Ok(mut beat)) => {
                beat.position = Some(LogPosition {
                    timeline: 1,
                    offset: self.calls,
                });
                let e = &mut self.expected;
                if e.session != Some(beat.session) {
                    *e = Expected {
                        session: Some(beat.session),
                        unbounded: true,
                        ..Expected::default()
                    };
                } else if e.unbounded {
                    e.unbounded = false;
                    e.bound = beat.position;
                }
                Input::Heartbeat(Ok(beat))
            }
            other => other,
        };
        if writes {
            let ok = match &input {
                Input::Joined(_, r) | Input::WeightSet(_, r) => r.is_ok(),
                Input::Claimed(_, r) => r.is_ok(),
                Input::Released(_, r) | Input::Left(_, r) => r.is_ok(),
                Input::HandedOver(r) => r.is_ok(),
                other => panic!("a write answered with {other:?}"),
            };
            if ok {
                self.expected.unbounded = true;
            } else {
                self.expected.in_doubt = true;
            }
        }
        self.m.handle(self.now, input);
    }

    /// Run for `span` of machine and store time.
    async fn run_for(&mut self, span: Duration) {
        let end = self.now + span;
        loop {
            self.settle().await;
            let next = self
                .m
                .poll_timeout()
                .unwrap_or(self.now + RENEW)
                .max(self.now);
            if next > end {
                return;
            }
            self.clock.advance(next - self.now);
            self.now = next;
        }
    }

    fn owned(&self, g: &GroupName) -> usize {
        self.m.owned(g).map_or(0, |o| o.len())
    }
}

#[tokio::test]
async fn the_bound_handed_in_is_the_first_position_after_the_last_write() {
    let clock = ManualClock::new();
    let now = Instant::now();
    let store = MemoryLeaseStore::with_clock(clock.clone());
    let g = GroupName::new("bound").expect("a group name");
    let shards = ShardCount::new(8).expect("shards");
    let mut run = Run {
        store: store.clone(),
        clock: clock.clone(),
        now,
        m: Machine::new(rules(NodeId::new()), now),
        calls: 0,
        expected: Expected::default(),
        fail_next: None,
        cut_until: None,
        untrusted: 0,
        with_bound: 0,
        without: 0,
    };
    assert!(run.m.add_group(g.clone(), shards));
    run.run_for(Duration::from_secs(5)).await;
    assert_eq!(run.owned(&g), 8, "alone, the node claims every bucket");

    // A second node joins: the machine sheds half, releasing (a write) in its ticks.
    let other = NodeId::new();
    let incarnation = Incarnation::new();
    let ttl = Ttl::new(Duration::from_secs(60)).expect("ttl");
    let beat = store
        .heartbeat(other, incarnation, ttl, &MemberMetadata::empty(), &[])
        .await
        .expect("the other node's heartbeat");
    store.join(&g, other, beat.session).await.expect("a join");
    run.run_for(Duration::from_secs(5)).await;
    assert_eq!(run.owned(&g), 4, "the machine shed half");

    // The store unreachable for 2.8 s: the trust deadline (ttl 3 s - margin 0.5 s after the
    // last heartbeat sent) passes, and the heartbeats sent after it hand in no bound.
    run.cut_until = Some(run.now + Duration::from_millis(2_800));
    run.run_for(Duration::from_secs(5)).await;
    assert!(run.untrusted > 0, "no heartbeat was sent untrusted");
    assert_eq!(run.owned(&g), 4, "back after the cut");

    // It leaves: the machine claims the rest. Its first claim fails without a word from the
    // store: the session has no bound from then on.
    store
        .leave(&g, other, beat.session)
        .await
        .expect("the other node leaves");
    run.fail_next = Some(Operation::Claim);
    run.run_for(Duration::from_secs(5)).await;
    assert_eq!(run.owned(&g), 8, "the machine claimed the rest");
    assert!(run.expected.in_doubt && run.expected.bound().is_none());
    let without = run.without;
    run.run_for(Duration::from_secs(3)).await;
    assert!(run.without > without, "heartbeats went on without a bound");

    assert!(
        run.with_bound >= 5,
        "only {} heartbeats handed in a bound",
        run.with_bound
    );
}
