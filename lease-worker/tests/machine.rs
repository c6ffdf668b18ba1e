//! Property tests of the worker's state machine with explicit time: no tokio, no clock. A
//! small fake store answers the machine's calls (or fails them, or never answers), an
//! application acknowledges deliveries when the test says so, other workers join, leave and
//! take buckets, sessions expire, time jumps; after every step the machine's outputs are
//! checked against the rules:
//!
//! 1. nothing is assigned at or past the trust deadline (`sent + ttl - margin` of the last
//!    heartbeat answered) nor once a renewal is due;
//! 2. a bucket is released only when the application does not hold it: its revocation was
//!    delivered and acknowledged (or it was never assigned);
//! 3. after a heartbeat answers with a new session, everything the application held is revoked
//!    before anything is assigned or claimed;
//! 4. when a tick completes, what the application holds is what the store says the worker owns,
//!    less what it is releasing or gave up on;
//! 5. a claim may take dead sessions' buckets exactly from a ttl after the first heartbeat's
//!    answer (the store's clock advances with the test's time here, never stepping);
//!
//! and the plumbing: one store call and one delivery at a time.
//!
//! `PROPTEST_CASES` raises the case count (default 256).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lease_core::Takeover;
use lease_core::{
    BackendFailure, Bucket, Clock, FencingToken, GroupName, GroupView, Heartbeat, Incarnation,
    Lease, ManualClock, MemberLoad, Operation, SessionId, ShardCount, StoreError, Ttl, WorkerId,
};
use lease_worker::machine::{Delivery, Input, Machine, Output, Report, Rules, StoreCall};
use proptest::prelude::*;
use uuid::Uuid;

const SHARDS: u32 = 6;
const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_millis(500);
const CALL_TIMEOUT: Duration = Duration::from_millis(1_500);
const ACK_LIMIT: Duration = Duration::from_secs(2);

fn me() -> WorkerId {
    WorkerId::from_uuid(Uuid::from_u128(0x100))
}

fn other(i: usize) -> WorkerId {
    WorkerId::from_uuid(Uuid::from_u128(0x200 + i as u128))
}

fn rules() -> Rules {
    Rules {
        group: GroupName::new("g").expect("name"),
        shards: ShardCount::new(SHARDS).expect("count"),
        worker: me(),
        incarnation: Incarnation::new(),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: MARGIN,
        wake_debounce: Duration::from_millis(10),
        call_timeout: CALL_TIMEOUT,
        ack_limit: Some(ACK_LIMIT),
    }
}

/// What happens next.
#[derive(Clone, Debug)]
enum Action {
    /// Time moves on.
    Advance(u64),
    /// The call in flight is applied and answered.
    Answer,
    /// The call in flight is applied, but its answer is lost.
    ApplyNoAnswer,
    /// The call in flight fails, transiently.
    Fail,
    /// The call in flight fails for good (rare).
    FailForGood,
    /// The application finishes with the pending delivery (acknowledges a revocation).
    Ack,
    /// The change feed reports a change.
    Wake,
    /// Another worker joins (idle).
    OtherJoins,
    /// Another worker leaves, releasing what it held.
    OtherLeaves,
    /// Another worker takes one of the buckets the store says are ours (our session died for
    /// it, or an operator moved it).
    StoreLoses(usize),
    /// Our session dies in the store (expired while we were not looking, or evicted).
    SessionDies,
    /// Stop the worker (rare).
    Stop,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => prop::sample::select(vec![1u64, 10, 100, 400, 900, 1_100, 2_000, 3_000])
            .prop_map(Action::Advance),
        8 => Just(Action::Answer),
        1 => Just(Action::ApplyNoAnswer),
        2 => Just(Action::Fail),
        1 => Just(Action::FailForGood).prop_filter("rare", |_| true),
        8 => Just(Action::Ack),
        1 => Just(Action::Wake),
        2 => Just(Action::OtherJoins),
        1 => Just(Action::OtherLeaves),
        1 => (0usize..SHARDS as usize).prop_map(Action::StoreLoses),
        1 => Just(Action::SessionDies),
        1 => Just(Action::Stop),
    ]
}

/// What the application was told about a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AppState {
    Owned(FencingToken),
    /// Told to stop, not acknowledged yet.
    Revoking,
}

struct World {
    m: Machine,
    now: Instant,
    /// The store's clock reads `base` at `start` and advances with the test's time.
    start: Instant,
    base: chrono::DateTime<chrono::Utc>,
    /// When the machine's first heartbeat was answered successfully: it may take dead
    /// sessions' buckets only a ttl after (the store's clock never steps here).
    first_answer: Option<Instant>,
    // The store.
    session: Option<SessionId>,
    sessions_minted: u128,
    held: BTreeMap<Bucket, FencingToken>,
    tokens: BTreeMap<Bucket, i64>,
    others: Vec<BTreeSet<Bucket>>,
    // The application.
    app: BTreeMap<Bucket, AppState>,
    // In flight.
    call: Option<(StoreCall, Instant)>,
    delivery: Option<Delivery>,
    // For the invariants.
    /// `sent` of the last heartbeat the machine was answered with successfully.
    last_sent: Option<Instant>,
    /// After a new session: buckets the application held, still to be revoked.
    owe_revoke: BTreeSet<Bucket>,
    /// The machine's session as of its last successful heartbeat, as the test saw it.
    known_session: Option<SessionId>,
    /// The store changed behind the machine's back since the last heartbeat answer.
    changed_behind: bool,
    finished: bool,
    ticks_checked: u32,
}

impl World {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            m: Machine::new(rules(), now),
            now,
            start: now,
            base: ManualClock::new().now(),
            first_answer: None,
            session: None,
            sessions_minted: 0,
            held: BTreeMap::new(),
            tokens: BTreeMap::new(),
            others: Vec::new(),
            app: BTreeMap::new(),
            call: None,
            delivery: None,
            last_sent: None,
            owe_revoke: BTreeSet::new(),
            known_session: None,
            changed_behind: false,
            finished: false,
            ticks_checked: 0,
        }
    }

    fn taken(&self) -> BTreeSet<Bucket> {
        let mut t: BTreeSet<Bucket> = self.held.keys().copied().collect();
        for o in &self.others {
            t.extend(o.iter().copied());
        }
        t
    }

    fn timestamp(&self) -> chrono::DateTime<chrono::Utc> {
        let elapsed = chrono::TimeDelta::from_std(self.now - self.start).expect("a short test");
        lease_core::store_precision(self.base + elapsed)
    }

    /// Apply the call in flight to the store; the answer the machine would get.
    fn apply(&mut self, call: &StoreCall) -> Input {
        match call {
            StoreCall::Heartbeat => {
                let new_session = self.session.is_none();
                if new_session {
                    self.sessions_minted += 1;
                    self.session =
                        Some(SessionId::from_uuid(Uuid::from_u128(self.sessions_minted)));
                    self.held.clear();
                }
                let session = self.session.expect("set above");
                let mut members = vec![MemberLoad {
                    worker: me(),
                    owned: self.held.len() as u32,
                }];
                for (i, o) in self.others.iter().enumerate() {
                    members.push(MemberLoad {
                        worker: other(i),
                        owned: o.len() as u32,
                    });
                }
                members.sort_by_key(|m| m.worker);
                let claimable = SHARDS - self.taken().len() as u32;
                let at = self.timestamp();
                Input::Heartbeat(Ok(Heartbeat {
                    session,
                    new_session,
                    observed_at: at,
                    expires_at: at,
                    view: GroupView {
                        shard_count: ShardCount::new(SHARDS).expect("count"),
                        members,
                        claimable,
                        generation: Default::default(),
                        previous: None,
                        draining: 0,
                    },
                    owned: self
                        .held
                        .iter()
                        .map(|(&bucket, &token)| Lease {
                            bucket,
                            shards: ShardCount::new(SHARDS).expect("count"),
                            owner: me(),
                            token,
                            expires_at: at,
                        })
                        .collect(),
                }))
            }
            StoreCall::Claim { session, want, .. } => {
                if self.session != Some(*session) {
                    return Input::Claimed(Err(StoreError::SessionExpired {
                        group: GroupName::new("g").expect("name"),
                        worker: me(),
                    }));
                }
                let taken = self.taken();
                let free: Vec<Bucket> = (0..SHARDS)
                    .map(Bucket)
                    .filter(|b| !taken.contains(b))
                    .take(*want as usize)
                    .collect();
                let at = self.timestamp();
                let mut won = Vec::new();
                for b in free {
                    let t = self.tokens.entry(b).or_insert(0);
                    *t += 1;
                    self.held.insert(b, FencingToken(*t));
                    won.push(Lease {
                        bucket: b,
                        shards: ShardCount::new(SHARDS).expect("count"),
                        owner: me(),
                        token: FencingToken(*t),
                        expires_at: at,
                    });
                }
                Input::Claimed(Ok(won))
            }
            StoreCall::Release { session, buckets } => {
                let mut released = Vec::new();
                if self.session == Some(*session) {
                    for b in buckets {
                        if self.held.remove(b).is_some() {
                            released.push(*b);
                        }
                    }
                }
                Input::Released(Ok(released))
            }
            StoreCall::Leave { session } => {
                let mut released = Vec::new();
                if self.session == Some(*session) {
                    released = self.held.keys().copied().collect();
                    self.held.clear();
                    self.session = None;
                }
                Input::Left(Ok(released))
            }
        }
    }

    fn failed(call: &StoreCall, failure: BackendFailure) -> Input {
        let op = call.operation();
        let e = StoreError::backend_detail(op, failure, "injected");
        match op {
            Operation::Heartbeat => Input::Heartbeat(Err(e)),
            Operation::Claim => Input::Claimed(Err(e)),
            Operation::Release => Input::Released(Err(e)),
            _ => Input::Left(Err(e)),
        }
    }

    fn handle(&mut self, input: Input) {
        if let Input::Heartbeat(Ok(beat)) = &input {
            let sent = self.call.as_ref().map(|(_, sent)| *sent).expect("sent");
            if self.m.awaits() == Some(&StoreCall::Heartbeat) {
                self.last_sent = Some(sent);
                self.first_answer.get_or_insert(self.now);
                if self.known_session != Some(beat.session) {
                    // Everything the application holds must be revoked first.
                    self.owe_revoke = self
                        .app
                        .iter()
                        .filter(|(_, s)| matches!(s, AppState::Owned(_)))
                        .map(|(&b, _)| b)
                        .collect();
                    self.known_session = Some(beat.session);
                }
                self.changed_behind = false;
            }
        }
        self.m.handle(self.now, input);
    }

    fn step(&mut self, a: &Action) {
        if self.finished {
            return;
        }
        match a {
            Action::Advance(ms) => {
                self.now += Duration::from_millis(*ms);
                while let Some(t) = self.m.poll_timeout() {
                    if t > self.now {
                        break;
                    }
                    self.m.handle_timeout(self.now);
                    self.drain();
                    if self.finished {
                        return;
                    }
                }
            }
            Action::Answer | Action::ApplyNoAnswer => {
                if let Some((call, sent)) = self.call.clone() {
                    let input = self.apply(&call);
                    if matches!(a, Action::Answer) && self.m.awaits() == Some(&call) {
                        self.call = Some((call, sent));
                        self.handle(input);
                    }
                    self.call = None;
                }
            }
            Action::Fail | Action::FailForGood => {
                if let Some((call, _)) = self.call.take() {
                    let failure = if matches!(a, Action::Fail) {
                        BackendFailure::Unavailable
                    } else {
                        BackendFailure::PermissionDenied
                    };
                    if self.m.awaits() == Some(&call) {
                        self.handle(Self::failed(&call, failure));
                    }
                }
            }
            Action::Ack => match self.delivery.take() {
                Some(Delivery::Assign { bucket, token }) => {
                    self.app.insert(bucket, AppState::Owned(token));
                    self.handle(Input::Delivered);
                }
                Some(Delivery::Revoke { bucket, .. }) => {
                    self.app.remove(&bucket);
                    self.handle(Input::Acked(bucket));
                }
                None => {}
            },
            Action::Wake => self.handle(Input::Wake),
            Action::OtherJoins => self.others.push(BTreeSet::new()),
            Action::OtherLeaves => {
                self.others.pop();
            }
            Action::StoreLoses(i) => {
                let lost = self.held.keys().nth(*i).copied();
                if let (Some(b), Some(o)) = (lost, self.others.first_mut()) {
                    self.held.remove(&b);
                    let t = self.tokens.entry(b).or_insert(0);
                    *t += 1;
                    o.insert(b);
                    self.changed_behind = true;
                }
            }
            Action::SessionDies => {
                self.session = None;
                self.held.clear();
                self.changed_behind = true;
            }
            Action::Stop => self.handle(Input::Stop),
        }
        self.drain();
    }

    fn trusted(&self) -> bool {
        self.last_sent
            .is_some_and(|sent| self.now < sent + TTL - MARGIN && self.now < sent + RENEW)
    }

    /// Take every output the machine has now, checking each.
    fn drain(&mut self) {
        // The machine may have given up on the call in flight.
        if let Some((call, _)) = &self.call
            && self.m.awaits() != Some(call)
        {
            self.call = None;
        }
        while let Some(out) = self.m.poll(self.now) {
            match out {
                Output::Call(call) => {
                    assert!(
                        self.call.is_none(),
                        "a second call while {:?} is in flight",
                        self.call
                    );
                    match &call {
                        StoreCall::Claim { takeover, .. } => {
                            // 5. Dead sessions' buckets only a ttl after the store's clock was
                            // first seen (it never steps here), and then always.
                            let opens = self.first_answer.map(|t| t + TTL);
                            assert_eq!(
                                matches!(takeover, Takeover::AllowedWithin(_)),
                                opens.is_some_and(|t| self.now >= t),
                                "takeover {takeover:?} at {:?} after the first answer",
                                self.first_answer.map(|t| self.now - t)
                            );
                            assert!(
                                self.owe_revoke.is_empty(),
                                "a claim before the new session's revocations: {:?}",
                                self.owe_revoke
                            );
                            assert!(self.trusted(), "a claim with the leases untrusted");
                        }
                        StoreCall::Release { buckets, .. } => {
                            for b in buckets {
                                assert!(
                                    !self.app.contains_key(b),
                                    "bucket {b} released while the application holds it ({:?})",
                                    self.app.get(b)
                                );
                            }
                        }
                        _ => {}
                    }
                    self.call = Some((call, self.now));
                }
                Output::Deliver(d) => {
                    assert!(self.delivery.is_none(), "a second delivery at once");
                    match d {
                        Delivery::Assign { bucket, .. } => {
                            assert!(
                                self.owe_revoke.is_empty(),
                                "bucket {bucket} assigned before the new session's \
                                 revocations: {:?}",
                                self.owe_revoke
                            );
                            assert!(
                                self.trusted(),
                                "bucket {bucket} assigned at {:?} past the trust deadline or a \
                                 due renewal (last heartbeat sent at {:?})",
                                self.now,
                                self.last_sent
                            );
                            assert!(
                                !self.app.contains_key(&bucket),
                                "bucket {bucket} assigned twice"
                            );
                        }
                        Delivery::Revoke { bucket, token, .. } => {
                            assert_eq!(
                                self.app.get(&bucket),
                                Some(&AppState::Owned(token)),
                                "a revocation of a bucket the application does not hold"
                            );
                            self.app.insert(bucket, AppState::Revoking);
                            self.owe_revoke.remove(&bucket);
                        }
                    }
                    self.delivery = Some(d);
                }
                Output::Report(Report::Stuck { bucket }) => {
                    // Given up on: the application may still hold it, the store keeps it.
                    if let Some(Delivery::Revoke { bucket: b, .. }) = self.delivery
                        && b == bucket
                    {
                        self.delivery = None;
                    }
                }
                Output::Report(Report::TickCompleted { .. }) => self.check_reconciled(),
                Output::Report(_) => {}
                Output::Finished(_) => {
                    self.finished = true;
                    return;
                }
            }
        }
    }

    /// Rule 4, when a tick completes: what the application holds is what the store says,
    /// less what is being released or was given up on. Checked only when nothing moved in the
    /// store since the heartbeat and the tick could do all it wanted (trusted, no renewal due).
    fn check_reconciled(&mut self) {
        if self.changed_behind || !self.trusted() || self.delivery.is_some() {
            return;
        }
        self.ticks_checked += 1;
        let (stuck, releasing) = (self.m.stuck(), self.m.releasing());
        for (b, state) in &self.app {
            if let AppState::Owned(token) = state {
                assert_eq!(
                    self.held.get(b),
                    Some(token),
                    "the application holds bucket {b} with {token}, the store says {:?}",
                    self.held.get(b)
                );
            }
        }
        for (b, token) in &self.held {
            let owned = self.app.get(b) == Some(&AppState::Owned(*token));
            let leaving = self.app.get(b) == Some(&AppState::Revoking)
                || stuck.contains(b)
                || releasing.contains(b);
            assert!(
                owned || leaving,
                "the store says bucket {b} is ours; the application was not told, and it is \
                 not being released"
            );
        }
        assert_eq!(
            self.app
                .iter()
                .filter_map(|(&b, s)| match s {
                    AppState::Owned(t) => Some((b, *t)),
                    AppState::Revoking => None,
                })
                .collect::<BTreeMap<_, _>>(),
            *self.m.owned(),
            "the machine's view of what the application holds"
        );
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn the_machine_keeps_its_rules(actions in prop::collection::vec(action(), 1..120)) {
        let mut w = World::new();
        w.drain();
        for a in &actions {
            w.step(a);
        }
        // Wind down: the application acknowledges, the store answers, time passes.
        for _ in 0..200 {
            if w.finished {
                break;
            }
            w.step(&Action::Ack);
            w.step(&Action::Answer);
            w.step(&Action::Advance(100));
        }
    }
}

/// A plain run reaches balance and the reconciliation check runs: the properties above are not
/// passing by never getting anywhere.
#[test]
fn a_plain_run_assigns_and_reconciles() {
    let mut w = World::new();
    w.drain();
    w.step(&Action::Advance(1));
    for _ in 0..20 {
        w.step(&Action::Answer);
        w.step(&Action::Ack);
    }
    assert_eq!(w.m.owned().len(), SHARDS as usize, "{:?}", w.m.owned());
    w.step(&Action::OtherJoins);
    for _ in 0..40 {
        w.step(&Action::Advance(100));
        w.step(&Action::Answer);
        w.step(&Action::Ack);
    }
    assert_eq!(
        w.m.owned().len(),
        SHARDS as usize / 2,
        "after a joiner: {:?}",
        w.m.owned()
    );
    assert!(
        w.ticks_checked >= 3,
        "reconciliation checked {} times",
        w.ticks_checked
    );
}

/// Runs that found bugs while the machine was written: a revocation acknowledged while a
/// heartbeat was in flight, and assignments queued twice for one bucket.
#[test]
fn sequences_that_once_broke_a_rule() {
    use Action::*;
    let runs: [&[Action]; 2] = [
        &[
            Advance(1),
            Answer,
            Answer,
            Advance(2000),
            Ack,
            Advance(100),
            Advance(400),
            Answer,
            Answer,
        ],
        &[
            Advance(1),
            Advance(2000),
            Advance(100),
            Answer,
            Answer,
            Advance(900),
            Advance(900),
            Advance(400),
            Ack,
            Advance(1),
            Advance(400),
            Ack,
            Answer,
            Answer,
        ],
    ];
    for run in runs {
        let mut w = World::new();
        w.drain();
        for a in run {
            w.step(a);
        }
        for _ in 0..200 {
            if w.finished {
                break;
            }
            for a in [Ack, Answer, Advance(100)] {
                w.step(&a);
            }
        }
        assert_eq!(w.m.owned().len(), SHARDS as usize, "{run:?}");
    }
}
