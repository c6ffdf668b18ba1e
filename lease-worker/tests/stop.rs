//! A stop (and the removal of a node's last group) with explicit time, against a small store
//! that answers at once: the session is renewed while the applications acknowledge their
//! revocations, nothing is delivered past the trust deadline as if the bucket were still held,
//! and a stop that cannot hand its session over (a stuck bucket) leaves every group.

mod admission;
use admission::admit;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use lease_core::{
    BackendFailure, Bucket, FencingToken, GroupBeat, GroupName, GroupView, Heartbeat, Incarnation,
    Lease, MemberLoad, NodeId, Operation, RevokeReason, SessionId, ShardCount, StoreError, Ttl,
    ViewStamp,
};
use lease_worker::machine::{Delivery, Input, Machine, Output, Report, Rules, StoreCall};
use uuid::Uuid;

const TTL: Duration = Duration::from_secs(3);
const RENEW: Duration = Duration::from_millis(500);
const MARGIN: Duration = Duration::from_millis(500);
/// How many buckets each group has (all the node's).
const BUCKETS: u32 = 64;
/// How long the slow application takes per revocation: 64 of them take 6.4 s, more than two
/// ttls.
const SLOW: Duration = Duration::from_millis(100);

fn me() -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(1))
}

fn name(g: &str) -> GroupName {
    GroupName::new(g).expect("a group name")
}

fn count() -> ShardCount {
    ShardCount::new(BUCKETS).expect("a count")
}

fn rules(ack_limit: Option<Duration>, keep_on_stop: Option<Duration>) -> Rules {
    Rules {
        node: me(),
        incarnation: Incarnation::new(),
        metadata: lease_core::MemberMetadata::default(),
        ttl: Ttl::new(TTL).expect("ttl"),
        renew_interval: RENEW,
        safety_margin: MARGIN,
        wake_debounce: Duration::from_millis(10),
        call_timeout: Duration::from_millis(1_500),
        ack_limit,
        keep_on_stop: keep_on_stop.map(|k| Ttl::new(k).expect("keep")),
    }
}

/// A delivery the node made, and when.
#[derive(Debug)]
struct Delivered {
    at: Instant,
    group: GroupName,
    delivery: Delivery,
    /// Whether the node's leases were trusted then, by the test's own account of the
    /// heartbeats answered: `sent + ttl - margin` of the last one of the session.
    trusted: bool,
}

/// A node and its store, moved along by the test.
struct World {
    m: Machine,
    now: Instant,
    start: Instant,
    base: DateTime<Utc>,
    session: SessionId,
    first_beat: bool,
    /// The store: per group, whether the node is a member and what it holds.
    member: BTreeMap<GroupName, bool>,
    held: BTreeMap<GroupName, BTreeSet<Bucket>>,
    /// Heartbeats fail from now on (the store cannot be reached for them).
    heartbeats_fail: bool,
    /// Other live members of every group, owning nothing: the node's share shrinks.
    peers: u32,
    /// The call in flight and when it was sent.
    call: Option<(StoreCall, Instant)>,
    /// Every call made, and when.
    calls: Vec<(Instant, StoreCall)>,
    deliveries: Vec<Delivered>,
    pending: BTreeMap<GroupName, Delivery>,
    /// Until when the test trusts the node's leases.
    trusted_until: Option<Instant>,
    reports: Vec<Report>,
    finished: Option<String>,
}

impl World {
    fn new(rules: Rules, groups: &[&str]) -> Self {
        let now = Instant::now();
        let mut m = Machine::new(rules, now);
        for g in groups {
            admit(&mut m, now, name(g), count());
        }
        Self {
            m,
            now,
            start: now,
            base: DateTime::UNIX_EPOCH + chrono::TimeDelta::days(20_000),
            session: SessionId::from_uuid(Uuid::from_u128(7)),
            first_beat: true,
            member: groups.iter().map(|g| (name(g), false)).collect(),
            held: groups.iter().map(|g| (name(g), BTreeSet::new())).collect(),
            heartbeats_fail: false,
            peers: 0,
            call: None,
            calls: Vec::new(),
            deliveries: Vec::new(),
            pending: BTreeMap::new(),
            trusted_until: None,
            reports: Vec::new(),
            finished: None,
        }
    }

    fn timestamp(&self) -> DateTime<Utc> {
        self.base + chrono::TimeDelta::from_std(self.now - self.start).expect("a short test")
    }

    fn trusted(&self) -> bool {
        self.trusted_until.is_some_and(|t| self.now < t)
    }

    /// Take every output the machine has now, and whatever falls due by now.
    fn drain(&mut self) {
        // A deadline handled at `now` must produce output or move on: a machine that keeps
        // answering a deadline it has passed without acting on it (the trust deadline with no
        // fence, say) would spin here forever instead of failing.
        let mut idle_deadlines = 0;
        loop {
            let mut produced = false;
            while let Some(out) = self.m.poll(self.now) {
                produced = true;
                match out {
                    Output::Call(call) => {
                        assert!(self.call.is_none(), "two calls at once");
                        self.calls.push((self.now, call.clone()));
                        self.call = Some((call, self.now));
                    }
                    Output::Deliver(group, delivery) => {
                        assert!(
                            self.pending.insert(group.clone(), delivery).is_none(),
                            "two deliveries at once in {group}"
                        );
                        let trusted = self.trusted();
                        self.deliveries.push(Delivered {
                            at: self.now,
                            group,
                            delivery,
                            trusted,
                        });
                    }
                    Output::Report(r) => self.reports.push(r),
                    Output::GroupFinished(..) => {}
                    Output::Finished(ended) => self.finished = Some(format!("{ended:?}")),
                }
            }
            match self.m.poll_timeout() {
                Some(t) if t <= self.now && self.finished.is_none() => {
                    idle_deadlines = if produced { 0 } else { idle_deadlines + 1 };
                    assert!(
                        idle_deadlines < 100,
                        "the machine's deadline {t:?} passed at {:?} and handling it does nothing",
                        self.now
                    );
                    self.m.handle_timeout(self.now);
                }
                _ => return,
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.drain();
    }

    fn heartbeat(&mut self, sent: Instant) -> Input {
        if self.heartbeats_fail {
            return Input::Heartbeat(Err(StoreError::backend_detail(
                Operation::Heartbeat,
                BackendFailure::Unavailable,
                "injected",
            )));
        }
        self.trusted_until = Some(sent + TTL - MARGIN);
        let at = self.timestamp();
        let groups = self
            .member
            .iter()
            .filter(|&(_, &member)| member)
            .map(|(g, _)| {
                let held = &self.held[g];
                let owned: Vec<Lease> = held
                    .iter()
                    .map(|&bucket| Lease {
                        bucket,
                        shards: count(),
                        owner: me(),
                        token: FencingToken(1),
                        expires_at: at,
                    })
                    .collect();
                let free = BUCKETS - held.len() as u32;
                let mut members = vec![MemberLoad::new(me(), held.len() as u32)];
                members.extend((0..self.peers).map(|i| {
                    MemberLoad::new(NodeId::from_uuid(Uuid::from_u128(100 + u128::from(i))), 0)
                }));
                members.sort_by_key(|m| m.worker);
                GroupBeat {
                    group: g.clone(),
                    view: GroupView::new(count(), members, free),
                    owned,
                    stamp: ViewStamp::new(held.len() as u64, None),
                    quarantined: Vec::new(),
                }
            })
            .collect();
        let new_session = std::mem::take(&mut self.first_beat);
        Input::Heartbeat(Ok(Heartbeat {
            session: self.session,
            new_session,
            observed_at: at,
            expires_at: at + chrono::TimeDelta::seconds(3),
            groups,
            unchanged: Vec::new(),
            position: None,
        }))
    }

    /// The node's session ends in the store (it expired unseen): the next heartbeat starts a
    /// new one, a member of no group, holding nothing.
    fn end_session(&mut self) {
        self.session = SessionId::from_uuid(Uuid::from_u128(8));
        self.first_beat = true;
        for member in self.member.values_mut() {
            *member = false;
        }
        for held in self.held.values_mut() {
            held.clear();
        }
    }

    /// An operator evicts the node from `group`: its buckets there are free for others.
    fn evict(&mut self, group: &GroupName) {
        self.member.insert(group.clone(), false);
        self.held.insert(group.clone(), BTreeSet::new());
    }

    /// Move the clock without handling what falls due: the next input is handled first, as
    /// when a driver's first wake-up past a deadline is an answer or an acknowledgement.
    fn jump(&mut self, by: Duration) {
        self.now += by;
    }

    /// Answer the call in flight, if any, as the store would at once.
    fn answer(&mut self) {
        let Some((call, sent)) = self.call.take() else {
            return;
        };
        let input = match call {
            StoreCall::Heartbeat { .. } => self.heartbeat(sent),
            StoreCall::Join { group, .. } => {
                self.member.insert(group.clone(), true);
                Input::Joined(group, Ok(()))
            }
            StoreCall::Claim { group, want, .. } => {
                let held = self.held.get_mut(&group).expect("a group of the test");
                let won: Vec<Lease> = (0..BUCKETS)
                    .map(Bucket)
                    .filter(|b| !held.contains(b))
                    .take(want as usize)
                    .map(|bucket| Lease {
                        bucket,
                        shards: count(),
                        owner: me(),
                        token: FencingToken(1),
                        expires_at: self.base,
                    })
                    .collect();
                held.extend(won.iter().map(|l| l.bucket));
                Input::Claimed(group, Ok(won))
            }
            StoreCall::Release { group, buckets, .. } => {
                let held = self.held.get_mut(&group).expect("a group of the test");
                let released = buckets.into_iter().filter(|b| held.remove(b)).collect();
                Input::Released(group, Ok(released))
            }
            StoreCall::Leave { group, .. } => {
                self.member.insert(group.clone(), false);
                let left = std::mem::take(self.held.get_mut(&group).expect("a group"));
                Input::Left(group, Ok(left.into_iter().collect()))
            }
            StoreCall::EnsureGroup { group, .. } => Input::Ensured(group, Ok(())),
            StoreCall::Subscribe { group } => Input::Subscribed(group, Ok(())),
            StoreCall::SetWeight { .. } => unreachable!("no weight is set here"),
            StoreCall::HandOver { .. } => Input::HandedOver(Ok(Some(self.timestamp()))),
        };
        self.m.handle(self.now, input);
        self.drain();
    }

    /// The application of `group` finishes with its pending delivery.
    fn ack(&mut self, group: &GroupName) {
        let input = match self.pending.remove(group) {
            Some(Delivery::Assign { .. }) => Input::Delivered(group.clone()),
            Some(Delivery::Revoke { bucket, .. }) => Input::Acked(group.clone(), bucket),
            None => return,
        };
        self.m.handle(self.now, input);
        self.drain();
    }

    /// Start, and run until every group's application owns all its buckets.
    fn own_everything(&mut self) {
        self.drain();
        for _ in 0..1_000 {
            let groups: Vec<GroupName> = self.member.keys().cloned().collect();
            if groups
                .iter()
                .all(|g| self.m.owned(g).is_some_and(|o| o.len() == BUCKETS as usize))
            {
                return;
            }
            self.answer();
            for g in &groups {
                self.ack(g);
            }
            self.advance(Duration::from_millis(10));
        }
        panic!("the node never owned its groups: {:?}", self.calls);
    }

    /// Run until the node finishes (or `limit` passes): the store answers at once, the
    /// application of each group takes `slow(group)` per delivery.
    fn run(&mut self, limit: Duration, slow: impl Fn(&GroupName) -> Duration) {
        let until = self.now + limit;
        let mut busy: BTreeMap<GroupName, Instant> = BTreeMap::new();
        while self.finished.is_none() {
            assert!(self.now < until, "the node did not finish within {limit:?}");
            self.answer();
            // Each group's application starts on its delivery when it comes, and acknowledges
            // it `slow` later.
            for (g, _) in self.pending.clone() {
                busy.entry(g.clone()).or_insert(self.now + slow(&g));
            }
            let due: Vec<GroupName> = busy
                .iter()
                .filter(|&(_, &t)| t <= self.now)
                .map(|(g, _)| g.clone())
                .collect();
            for g in due {
                busy.remove(&g);
                self.ack(&g);
            }
            if self.call.is_none() && busy.values().all(|&t| t > self.now) {
                self.advance(Duration::from_millis(10));
            }
        }
    }

    fn revocations(&self, since: Instant) -> Vec<&Delivered> {
        self.deliveries
            .iter()
            .filter(|d| d.at >= since && matches!(d.delivery, Delivery::Revoke { .. }))
            .collect()
    }

    fn heartbeats_since(&self, since: Instant) -> Vec<Instant> {
        self.calls
            .iter()
            .filter(|(at, c)| *at >= since && matches!(c, StoreCall::Heartbeat { .. }))
            .map(|(at, _)| *at)
            .collect()
    }

    fn left(&self) -> BTreeSet<GroupName> {
        self.calls
            .iter()
            .filter_map(|(_, c)| match c {
                StoreCall::Leave { group, .. } => Some(group.clone()),
                _ => None,
            })
            .collect()
    }
}

fn reason(d: &Delivered) -> RevokeReason {
    match d.delivery {
        Delivery::Revoke { reason, .. } => reason,
        Delivery::Assign { .. } => unreachable!("a revocation"),
    }
}

/// Revocations that reached the application while its leases were not trusted any more and
/// said anything but `fenced` (or `expired`, `lost`): the application would act on them as if it still
/// held the bucket, while its next owner may already have it.
fn untrusted_as_held(revoked: &[&Delivered]) -> Vec<String> {
    revoked
        .iter()
        .filter(|d| {
            !d.trusted
                && !matches!(
                    reason(d),
                    RevokeReason::Fenced | RevokeReason::Expired | RevokeReason::Lost
                )
        })
        .map(|d| format!("{}: {:?} at {:?}", d.group, d.delivery, d.at))
        .collect()
}

/// How many revocations were delivered untrusted, and the first of them.
fn untrusted(revoked: &[&Delivered]) -> String {
    let all: Vec<String> = revoked
        .iter()
        .filter(|d| !d.trusted)
        .map(|d| format!("{}: {:?} at {:?}", d.group, d.delivery, d.at))
        .collect();
    format!(
        "{} of {}, the first {:?}",
        all.len(),
        revoked.len(),
        all.first()
    )
}

/// The longest time between the stop and its first heartbeat, between two heartbeats, or
/// between the last heartbeat and the last leave.
fn longest_gap(stop: Instant, beats: &[Instant], last_leave: Instant) -> Duration {
    let mut marks = vec![stop];
    marks.extend(beats.iter().copied());
    marks.push(last_leave);
    marks
        .windows(2)
        .map(|w| w[1].saturating_duration_since(w[0]))
        .max()
        .unwrap_or_default()
}

/// A stop whose application takes 100 ms per revocation (64 of them: 6.4 s, more than two
/// ttls) renews the session on its cadence until the last revocation is acknowledged and the
/// group left: every revocation is delivered while the leases are trusted, as a shutdown.
/// Without renewals during the stop, the session outlived its trust 2.5 s into it, and the
/// rest went on being delivered as shutdowns while a peer could already hold the buckets.
#[test]
fn a_slow_stop_keeps_renewing_until_the_last_revocation_is_acknowledged() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| SLOW);
    let revoked = w.revocations(stop);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    assert!(
        revoked.iter().all(|d| d.trusted),
        "revocations delivered past the trust deadline: {}",
        untrusted(&revoked)
    );
    assert!(
        revoked.iter().all(|d| reason(d) == RevokeReason::Shutdown),
        "a revocation of the stop said another reason"
    );
    let last_ack = revoked.last().expect("revocations").at + SLOW;
    let (leave_at, _) = w
        .calls
        .iter()
        .find(|(_, c)| matches!(c, StoreCall::Leave { .. }))
        .expect("the group left");
    assert!(
        *leave_at >= last_ack,
        "left before the last acknowledgement"
    );
    let beats = w.heartbeats_since(stop);
    let gap = longest_gap(stop, &beats, *leave_at);
    assert!(
        gap <= RENEW + SLOW,
        "{} heartbeats in the {:?} stop, the longest gap {gap:?}",
        beats.len(),
        *leave_at - stop
    );
    assert_eq!(w.finished.as_deref(), Some("Ok(())"));
}

/// The same slow stop with the store out of reach for heartbeats: renewals are retried, and at
/// the trust deadline the node fences as it does everywhere else. What is still to be revoked
/// then is delivered as `fenced`, never as a shutdown the application would take for a bucket
/// it still holds.
#[test]
fn a_stop_that_cannot_renew_says_fenced_past_the_trust_deadline() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.heartbeats_fail = true;
    w.advance(RENEW / 2);
    let stop = w.now;
    let deadline = w.trusted_until.expect("trusted");
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| SLOW);
    let revoked = w.revocations(stop);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    let as_held = untrusted_as_held(&revoked);
    assert!(
        as_held.is_empty(),
        "{} delivered past the trust deadline as if still held, the first {:?}",
        as_held.len(),
        as_held.first()
    );
    let before = revoked.iter().filter(|d| d.at < deadline).count();
    assert!(
        before > 0 && before < revoked.len(),
        "the deadline fell within the stop"
    );
    assert!(
        revoked
            .iter()
            .all(|d| (d.at < deadline) == (reason(d) == RevokeReason::Shutdown)),
        "shutdown before the deadline, expired after"
    );
    assert!(
        w.reports.iter().any(|r| matches!(r, Report::Fenced { .. })),
        "the node fenced"
    );
    let retries = w.heartbeats_since(stop).len();
    assert!(retries >= 5, "{retries} renewals tried during a 6.4 s stop");
}

/// Removing the node's last group (a node that stays up with no group) is a stop of that group:
/// the session is renewed until its application acknowledged every revocation and the group
/// is left. Without it, nothing renewed a node whose groups were all being removed.
#[test]
fn removing_the_last_group_keeps_renewing_until_it_is_left() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let removed = w.now;
    assert!(w.m.remove_group(&name("orders")));
    w.drain();
    let limit = w.now + Duration::from_secs(30);
    while w.m.groups().next().is_some() {
        assert!(w.now < limit, "the group was not removed");
        w.answer();
        w.advance(SLOW);
        w.ack(&name("orders"));
    }
    let revoked = w.revocations(removed);
    assert_eq!(revoked.len(), BUCKETS as usize, "every bucket revoked");
    assert!(
        revoked.iter().all(|d| d.trusted),
        "revocations delivered past the trust deadline: {}",
        untrusted(&revoked)
    );
    let (leave_at, _) = w
        .calls
        .iter()
        .find(|(_, c)| matches!(c, StoreCall::Leave { .. }))
        .expect("the group left");
    let beats = w.heartbeats_since(removed);
    let gap = longest_gap(removed, &beats, *leave_at);
    assert!(
        gap <= RENEW + SLOW,
        "the longest gap between renewals {gap:?}"
    );
    assert!(!w.m.is_stopping(), "removing a group stopped the node");
}

/// A node that would hand its session over at a stop (`keep_on_stop`) but whose application
/// does not acknowledge a revocation in time (a stuck bucket) hands nothing over: it leaves
/// every group, so their buckets are released at the stop rather than at the session's
/// expiry. The other group, whose application acknowledges at once, leaves too, though its
/// revocations were done long before the bucket got stuck.
#[test]
fn a_stop_with_a_stuck_bucket_leaves_every_group_instead_of_handing_over() {
    let mut w = World::new(
        rules(
            Some(Duration::from_millis(200)),
            Some(Duration::from_secs(10)),
        ),
        &["orders", "audit"],
    );
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    // The application of `orders` never acknowledges its first revocation: given up on after
    // 200 ms, the bucket is stuck. `audit`'s acknowledges each at once.
    let stuck = w
        .pending
        .get(&name("orders"))
        .copied()
        .expect("a revocation in orders");
    w.pending.remove(&name("orders"));
    let limit = w.now + Duration::from_secs(30);
    while w.finished.is_none() {
        assert!(w.now < limit, "the node did not finish");
        w.answer();
        // `audit` acknowledges everything at once: its revocations are all done long before
        // the bucket of `orders` gets stuck.
        while w.pending.contains_key(&name("audit")) {
            w.ack(&name("audit"));
        }
        if w.m.stuck(&name("orders")).is_empty() {
            w.advance(Duration::from_millis(10));
        } else {
            w.ack(&name("orders"));
            if w.call.is_none() && w.pending.is_empty() {
                w.advance(Duration::from_millis(10));
            }
        }
    }
    let Delivery::Revoke { bucket, .. } = stuck else {
        panic!("{stuck:?}");
    };
    assert!(
        w.reports
            .iter()
            .any(|r| matches!(r, Report::Stuck { bucket: b, .. } if *b == bucket)),
        "the bucket got stuck"
    );
    assert!(
        !w.calls
            .iter()
            .any(|(_, c)| matches!(c, StoreCall::HandOver { .. })),
        "the session was handed over with a stuck bucket"
    );
    assert_eq!(
        w.left(),
        [name("audit"), name("orders")].into_iter().collect(),
        "the groups left at the stop: {:?}",
        w.calls
            .iter()
            .filter(|(at, _)| *at >= stop)
            .map(|(_, c)| c)
            .collect::<Vec<_>>()
    );
    assert!(
        w.held.values().all(BTreeSet::is_empty),
        "buckets still held in the store: {:?}",
        w.held
    );
}

/// The same stop without a stuck bucket hands the session over and leaves no group: the
/// buckets stay with the session for a successor.
#[test]
fn a_stop_without_a_stuck_bucket_hands_over_and_leaves_nothing() {
    let mut w = World::new(
        rules(
            Some(Duration::from_millis(200)),
            Some(Duration::from_secs(10)),
        ),
        &["orders", "audit"],
    );
    w.own_everything();
    w.advance(RENEW / 2);
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.run(Duration::from_secs(30), |_| Duration::from_millis(1));
    assert!(w.left().is_empty(), "a group left: {:?}", w.left());
    assert!(
        w.calls
            .iter()
            .any(|(_, c)| matches!(c, StoreCall::HandOver { .. })),
        "no hand-over"
    );
    assert!(
        w.held.values().all(|h| h.len() == BUCKETS as usize),
        "the buckets stay with the session"
    );
}

/// A revocation that goes out at the trust deadline before the node has handled the deadline
/// itself (the first thing the driver handles past it is an acknowledgement, or a call's
/// answer) says `fenced` all the same: whatever it was queued for, the lease is not trusted
/// any more.
#[test]
fn a_revocation_delivered_at_the_deadline_before_the_fence_says_fenced() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.heartbeats_fail = true;
    let deadline = w.trusted_until.expect("trusted");
    w.m.handle(w.now, Input::Stop);
    w.drain();
    // The application acknowledges every revocation at once, and the first one only at the
    // deadline: the stop's renewals fail meanwhile.
    w.answer();
    let gap = deadline - w.now;
    w.jump(gap);
    w.ack(&name("orders"));
    let after: Vec<&Delivered> = w
        .revocations(deadline)
        .into_iter()
        .filter(|d| d.at >= deadline)
        .collect();
    assert!(!after.is_empty(), "a revocation went out at the deadline");
    assert_eq!(
        reason(after[0]),
        RevokeReason::Fenced,
        "the first revocation at the deadline, before the fence: {:?}",
        after[0].delivery
    );
}

/// A heartbeat during a stop that finds the node's session gone (it expired unseen; a new
/// one starts): the buckets are not the node's any more, so every revocation still queued
/// says `expired`, not `shutdown`, though the new session is trusted.
#[test]
fn a_new_session_during_a_stop_turns_the_rest_into_expired() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.end_session();
    w.run(Duration::from_secs(30), |_| SLOW);
    let beats = w.heartbeats_since(stop);
    let new_at = *beats.first().expect("a renewal during the stop");
    let revoked = w.revocations(stop);
    assert!(
        revoked.iter().any(|d| d.at <= new_at),
        "revoked before the new session"
    );
    let wrong: Vec<String> = revoked
        .iter()
        .filter(|d| d.at > new_at && reason(d) != RevokeReason::Expired)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} revocations after the new session did not say expired, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// An operator evicts the node from a group it is stopping (or removing): the group's buckets
/// are free for others at once, so every revocation still queued says `lost`, not `shutdown`.
#[test]
fn an_eviction_during_a_stop_turns_the_rest_into_lost() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    w.advance(RENEW / 2);
    let stop = w.now;
    w.m.handle(w.now, Input::Stop);
    w.drain();
    w.evict(&name("orders"));
    w.run(Duration::from_secs(30), |_| SLOW);
    let beats = w.heartbeats_since(stop);
    let seen_at = *beats.first().expect("a renewal during the stop");
    let revoked = w.revocations(stop);
    let wrong: Vec<String> = revoked
        .iter()
        .filter(|d| d.at > seen_at && reason(d) != RevokeReason::Lost)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        revoked.iter().filter(|d| d.at > seen_at).count() > BUCKETS as usize / 2,
        "most revocations came after the eviction was seen"
    );
    assert!(
        wrong.is_empty(),
        "{} revocations after the eviction did not say lost, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// The same for a group the node is shedding: an eviction seen while shed revocations are
/// still queued turns them into `lost`, since the buckets are free for others already.
#[test]
fn an_eviction_while_shedding_turns_the_rest_into_lost() {
    let mut w = World::new(rules(None, None), &["orders"]);
    w.own_everything();
    // A peer joins: the node sheds half, one revocation at a time, 100 ms each.
    w.peers = 1;
    w.advance(RENEW);
    let shed_from = w.now;
    let limit = w.now + Duration::from_secs(30);
    let mut evicted_at = None;
    while w.now < limit {
        w.answer();
        let shed = w
            .revocations(shed_from)
            .iter()
            .filter(|d| reason(d) == RevokeReason::Shed)
            .count();
        if evicted_at.is_none() && shed >= 4 {
            w.evict(&name("orders"));
            evicted_at = Some(w.now);
        }
        if evicted_at.is_some_and(|t| {
            w.heartbeats_since(t)
                .first()
                .is_some_and(|&b| w.now >= b + Duration::from_secs(4))
        }) {
            break;
        }
        w.advance(SLOW);
        w.ack(&name("orders"));
    }
    let evicted_at = evicted_at.expect("shedding began");
    let seen_at = *w
        .heartbeats_since(evicted_at)
        .first()
        .expect("a heartbeat after");
    let after: Vec<&Delivered> = w
        .revocations(shed_from)
        .into_iter()
        .filter(|d| d.at > seen_at)
        .collect();
    assert!(
        after.len() >= BUCKETS as usize / 2,
        "{} revocations after the eviction was seen",
        after.len()
    );
    let wrong: Vec<String> = after
        .iter()
        .filter(|d| reason(d) != RevokeReason::Lost)
        .map(|d| format!("{:?}", d.delivery))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} revocations after the eviction did not say lost, the first {:?}",
        wrong.len(),
        wrong.first()
    );
}
