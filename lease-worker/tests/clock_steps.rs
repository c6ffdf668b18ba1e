//! The worker machine against steps of the store's clock, with explicit time: each heartbeat
//! answer carries the store's time, and the machine compares its progress with its own clock.
//! A forward step is reported and defers taking dead sessions' buckets for a ttl from when it
//! was seen (their holders may still trust them); a backward step is reported; a steady clock
//! opens takeovers a ttl after the first answer and never reports a step.

mod admission;
use admission::admit;

use std::time::{Duration, Instant};

use chrono::TimeDelta;
use lease_core::{
    Clock, GroupBeat, GroupName, GroupView, Heartbeat, Incarnation, ManualClock, MemberLoad,
    NodeId, SessionId, ShardCount, Takeover, Timestamp, Ttl, ViewStamp, store_precision,
};
use lease_worker::machine::{ClockStep, Input, Machine, Output, Report, Rules, StoreCall};

/// A claim that may take dead sessions' buckets (the store bounds how far its clock moved
/// since the heartbeat; `Run` checks that bound separately).
const ALLOWED: Takeover = Takeover::AllowedWithin(Duration::ZERO);
const TTL: Duration = Duration::from_secs(10);
const RENEW: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_secs(1);
/// The store's answer takes this long to come back.
const ROUND_TRIP: Duration = Duration::from_millis(4);

fn group() -> GroupName {
    GroupName::new("steps").expect("name")
}

fn rules(node: NodeId) -> Rules {
    Rules {
        node,
        incarnation: Incarnation::new(),
        metadata: lease_core::MemberMetadata::default(),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: MARGIN,
        wake_debounce: Duration::from_millis(10),
        call_timeout: Duration::from_secs(5),
        ack_limit: None,
        keep_on_stop: None,
        loads: Default::default(),
    }
}

/// A worker alone in a group whose 8 buckets all look claimable (a dead session's), and a
/// store whose clock reads `store_at(now)`: the local time since the start plus `offset`.
struct Run {
    m: Machine,
    worker: NodeId,
    session: SessionId,
    start: Instant,
    now: Instant,
    base: Timestamp,
    /// What the store's clock is ahead of (or behind) the local one.
    offset: TimeDelta,
    steps: Vec<ClockStep>,
    /// When the last heartbeat was sent.
    sent: Instant,
    /// Whether the node joined the group.
    joined: bool,
}

impl Run {
    fn new() -> Self {
        let worker = NodeId::new();
        let now = Instant::now();
        let mut m = Machine::new(rules(worker), now);
        admit(&mut m, now, group(), ShardCount::new(8).expect("count"));
        Self {
            m,
            worker,
            session: SessionId::new(),
            start: now,
            now,
            base: ManualClock::new().now(),
            offset: TimeDelta::zero(),
            steps: Vec::new(),
            sent: now,
            joined: false,
        }
    }

    fn store_at(&self) -> Timestamp {
        let local = TimeDelta::from_std(self.now - self.start).expect("short");
        store_precision(self.base + local + self.offset)
    }

    /// Run the machine until it makes a store call other than a join (answered at once);
    /// reports are collected, deliveries done.
    fn next_call(&mut self) -> StoreCall {
        for _ in 0..10_000 {
            self.m.handle_timeout(self.now);
            match self.m.poll(self.now) {
                Some(Output::Call(StoreCall::Join { group, .. })) => {
                    self.joined = true;
                    self.m.handle(self.now, Input::Joined(group, Ok(())));
                }
                Some(Output::Call(call)) => return call,
                Some(Output::Report(Report::ClockStep(step))) => self.steps.push(step),
                Some(Output::Report(_)) => {}
                Some(Output::Deliver(group, _)) => {
                    self.m.handle(self.now, Input::Delivered(group));
                }
                Some(Output::GroupFinished(g, r)) => panic!("group {g} finished: {r:?}"),
                Some(Output::Finished(r)) => panic!("the machine finished: {r:?}"),
                None => {
                    let t = self.m.poll_timeout().expect("something to wait for");
                    self.now = self.now.max(t);
                }
            }
        }
        panic!("no store call");
    }

    /// Answer the heartbeat in flight, `round_trip` after it was sent; the store reads its
    /// clock as it answers (late in the call, as Postgres does under the row lock).
    fn answer_heartbeat_after(&mut self, round_trip: Duration) {
        self.now += round_trip;
        let at = self.store_at();
        let groups = if self.joined {
            vec![GroupBeat {
                group: group(),
                view: GroupView {
                    shard_count: ShardCount::new(8).expect("count"),
                    members: vec![MemberLoad::new(self.worker, 0)],
                    claimable: 8,
                    generation: Default::default(),
                    previous: None,
                    draining: 0,
                    quarantined: 0,
                    loaded: Vec::new(),
                },
                owned: Vec::new(),
                stamp: ViewStamp::default(),
                quarantined: Vec::new(),
            }]
        } else {
            Vec::new()
        };
        let beat = Heartbeat {
            session: self.session,
            new_session: false,
            observed_at: at,
            expires_at: at + TimeDelta::from_std(TTL).expect("ttl"),
            groups,
            unchanged: Vec::new(),
            position: None,
        };
        self.m.handle(self.now, Input::Heartbeat(Ok(beat)));
    }

    /// One tick: a heartbeat answered, then the claim it plans, answered with nothing won
    /// (the buckets stay claimable); the claim's scope.
    fn tick(&mut self) -> (Instant, Takeover) {
        self.tick_after(ROUND_TRIP)
    }

    /// [`tick`](Self::tick) with a heartbeat that takes `round_trip`. The node's first tick
    /// joins the group: its heartbeat is answered with no view, the join at once, and the
    /// heartbeat that follows at once gives the view.
    fn tick_after(&mut self, round_trip: Duration) -> (Instant, Takeover) {
        if !self.joined {
            assert!(matches!(self.next_call(), StoreCall::Heartbeat { .. }));
            self.answer_heartbeat_after(ROUND_TRIP);
        }
        let call = self.next_call();
        assert!(matches!(call, StoreCall::Heartbeat { .. }), "{call:?}");
        self.sent = self.now;
        self.answer_heartbeat_after(round_trip);
        let answered = self.now;
        match self.next_call() {
            StoreCall::Claim { takeover, .. } => {
                let takeover = match takeover {
                    Takeover::AllowedWithin(within) => {
                        // From the heartbeat's send to the claim, plus half the 1 s margin.
                        let since = self.now - self.sent;
                        assert_eq!(within, since + MARGIN / 2, "the claim's bound");
                        ALLOWED
                    }
                    other => other,
                };
                self.now += ROUND_TRIP;
                self.m
                    .handle(self.now, Input::Claimed(group(), Ok(Vec::new())));
                (answered, takeover)
            }
            other => panic!("a claim was due, got {other:?}"),
        }
    }
}

#[test]
fn a_steady_clock_opens_takeovers_a_ttl_after_the_first_answer() {
    let mut run = Run::new();
    let (first, takeover) = run.tick();
    assert_eq!(takeover, Takeover::Deferred, "a worker without history");
    loop {
        let (at, takeover) = run.tick();
        if at - first >= TTL {
            assert_eq!(takeover, ALLOWED, "{:?} after the first", at - first);
            // Ticking when takeovers open, not at the next renewal after.
            assert!(at - first < TTL + ROUND_TRIP * 4, "{:?}", at - first);
            break;
        }
        assert_eq!(
            takeover,
            Takeover::Deferred,
            "{:?} after the first",
            at - first
        );
    }
    assert!(run.steps.is_empty(), "{:?}", run.steps);
}

#[test]
fn a_forward_step_defers_takeovers_for_a_ttl_and_is_reported() {
    let mut run = Run::new();
    let (first, _) = run.tick();
    while run.tick().0 - first < TTL {}
    assert_eq!(run.tick().1, ALLOWED);

    // The store's clock jumps 15 s ahead (NTP stepping after a VM resume): every session in
    // the store aged 15 s at once.
    run.offset = TimeDelta::seconds(15);
    let (seen, takeover) = run.tick();
    assert_eq!(takeover, Takeover::Deferred, "right after the step");
    match run.steps.as_slice() {
        [ClockStep::Forward(by)] => assert!(
            *by > Duration::from_secs(14) && *by <= Duration::from_secs(15),
            "{by:?}"
        ),
        other => panic!("one forward step expected: {other:?}"),
    }
    loop {
        let (at, takeover) = run.tick();
        if at - seen >= TTL {
            assert_eq!(takeover, ALLOWED);
            break;
        }
        assert_eq!(
            takeover,
            Takeover::Deferred,
            "{:?} after the step",
            at - seen
        );
    }
    assert_eq!(run.steps.len(), 1, "{:?}", run.steps);
}

#[test]
fn a_backward_step_is_reported_and_defers_nothing() {
    let mut run = Run::new();
    let (first, _) = run.tick();
    while run.tick().0 - first < TTL {}
    run.offset = TimeDelta::seconds(-5);
    let (_, takeover) = run.tick();
    assert_eq!(takeover, ALLOWED);
    match run.steps.as_slice() {
        [ClockStep::Backward(by)] => assert!(
            *by > Duration::from_millis(4_900) && *by <= Duration::from_secs(5),
            "{by:?}"
        ),
        other => panic!("one backward step expected: {other:?}"),
    }
}

#[test]
fn steps_the_trust_margin_absorbs_are_not_reported() {
    let mut run = Run::new();
    let (first, _) = run.tick();
    while run.tick().0 - first < TTL {}
    // Under half the 1 s margin, either way.
    run.offset = TimeDelta::milliseconds(400);
    assert_eq!(run.tick().1, ALLOWED);
    run.offset = TimeDelta::milliseconds(-20);
    assert_eq!(run.tick().1, ALLOWED);
    assert!(run.steps.is_empty(), "{:?}", run.steps);
}

#[test]
fn a_slow_heartbeat_does_not_hide_the_next_step() {
    let mut run = Run::new();
    let (first, _) = run.tick();
    while run.tick().0 - first < TTL {}
    // A heartbeat that waits 1.5 s (a lock, a slow server), then a +1.2 s step, over the
    // 0.5 s tolerance: judged from request to answer, the 1.5 s would have hidden it.
    assert_eq!(run.tick_after(Duration::from_millis(1_500)).1, ALLOWED);
    run.offset = TimeDelta::milliseconds(1_200);
    assert_eq!(run.tick().1, Takeover::Deferred);
    match run.steps.as_slice() {
        [ClockStep::Forward(by)] => assert!(
            *by > Duration::from_millis(1_100) && *by <= Duration::from_millis(1_200),
            "{by:?}"
        ),
        other => panic!("one forward step expected: {other:?}"),
    }
}

#[test]
fn small_forward_steps_that_add_up_are_a_step() {
    let mut run = Run::new();
    let (first, _) = run.tick();
    while run.tick().0 - first < TTL {}
    // +0.3 s at each of two renewals: each under the 0.5 s tolerance, 0.6 s together.
    run.offset = TimeDelta::milliseconds(300);
    assert_eq!(run.tick().1, ALLOWED);
    assert!(run.steps.is_empty(), "{:?}", run.steps);
    run.offset = TimeDelta::milliseconds(600);
    assert_eq!(run.tick().1, Takeover::Deferred);
    match run.steps.as_slice() {
        [ClockStep::Forward(by)] => assert!(
            *by > Duration::from_millis(550) && *by <= Duration::from_millis(600),
            "{by:?}"
        ),
        other => panic!("one forward step expected: {other:?}"),
    }
}
