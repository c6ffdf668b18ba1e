//! The world the stop tests move along by hand: a machine, a small store that answers at
//! once, applications that acknowledge when told, and the test's own account of the trust
//! deadline.

#![allow(dead_code)]

use crate::admission::admit;

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

pub const TTL: Duration = Duration::from_secs(3);
pub const RENEW: Duration = Duration::from_millis(500);
pub const MARGIN: Duration = Duration::from_millis(500);
/// How many buckets each group has (all the node's).
pub const BUCKETS: u32 = 64;
/// How long the slow application takes per revocation: 64 of them take 6.4 s, more than two
/// ttls.
pub const SLOW: Duration = Duration::from_millis(100);

pub fn me() -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(1))
}

pub fn name(g: &str) -> GroupName {
    GroupName::new(g).expect("a group name")
}

pub fn count() -> ShardCount {
    ShardCount::new(BUCKETS).expect("a count")
}

pub fn rules(ack_limit: Option<Duration>, keep_on_stop: Option<Duration>) -> Rules {
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
        loads: Default::default(),
    }
}

/// A delivery the node made, and when.
#[derive(Debug)]
pub struct Delivered {
    pub at: Instant,
    pub group: GroupName,
    pub delivery: Delivery,
    /// Whether the node's leases were trusted then, by the test's own account of the
    /// heartbeats answered: `sent + ttl - margin` of the last one of the session.
    pub trusted: bool,
}

/// A node and its store, moved along by the test.
pub struct World {
    pub m: Machine,
    pub now: Instant,
    pub start: Instant,
    pub base: DateTime<Utc>,
    pub session: SessionId,
    pub first_beat: bool,
    /// The store: per group, whether the node is a member and what it holds.
    pub member: BTreeMap<GroupName, bool>,
    pub held: BTreeMap<GroupName, BTreeSet<Bucket>>,
    /// Heartbeats fail from now on (the store cannot be reached for them).
    pub heartbeats_fail: bool,
    /// Other live members of every group, owning nothing: the node's share shrinks.
    pub peers: u32,
    /// The call in flight and when it was sent.
    pub call: Option<(StoreCall, Instant)>,
    /// Every call made, and when.
    pub calls: Vec<(Instant, StoreCall)>,
    pub deliveries: Vec<Delivered>,
    pub pending: BTreeMap<GroupName, Delivery>,
    /// Until when the test trusts the node's leases.
    pub trusted_until: Option<Instant>,
    pub reports: Vec<Report>,
    pub finished: Option<String>,
}

impl World {
    pub fn new(rules: Rules, groups: &[&str]) -> Self {
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

    pub fn timestamp(&self) -> DateTime<Utc> {
        self.base + chrono::TimeDelta::from_std(self.now - self.start).expect("a short test")
    }

    pub fn trusted(&self) -> bool {
        self.trusted_until.is_some_and(|t| self.now < t)
    }

    /// Take every output the machine has now, and whatever falls due by now.
    pub fn drain(&mut self) {
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

    pub fn advance(&mut self, by: Duration) {
        self.now += by;
        self.drain();
    }

    pub fn heartbeat(&mut self, sent: Instant) -> Input {
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
    pub fn end_session(&mut self) {
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
    pub fn evict(&mut self, group: &GroupName) {
        self.member.insert(group.clone(), false);
        self.held.insert(group.clone(), BTreeSet::new());
    }

    /// Move the clock without handling what falls due: the next input is handled first, as
    /// when a driver's first wake-up past a deadline is an answer or an acknowledgement.
    pub fn jump(&mut self, by: Duration) {
        self.now += by;
    }

    /// Answer the call in flight, if any, as the store would at once.
    pub fn answer(&mut self) {
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
            StoreCall::ClaimBuckets { .. } | StoreCall::PublishLoads { .. } => {
                unreachable!("no load is reported here")
            }
            StoreCall::HandOver { .. } => Input::HandedOver(Ok(Some(self.timestamp()))),
        };
        self.m.handle(self.now, input);
        self.drain();
    }

    /// The application of `group` finishes with its pending delivery.
    pub fn ack(&mut self, group: &GroupName) {
        let input = match self.pending.remove(group) {
            Some(Delivery::Assign { .. }) => Input::Delivered(group.clone()),
            Some(Delivery::Revoke { bucket, .. }) => Input::Acked(group.clone(), bucket),
            None => return,
        };
        self.m.handle(self.now, input);
        self.drain();
    }

    /// Start, and run until every group's application owns all its buckets.
    pub fn own_everything(&mut self) {
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
    pub fn run(&mut self, limit: Duration, slow: impl Fn(&GroupName) -> Duration) {
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

    pub fn revocations(&self, since: Instant) -> Vec<&Delivered> {
        self.deliveries
            .iter()
            .filter(|d| d.at >= since && matches!(d.delivery, Delivery::Revoke { .. }))
            .collect()
    }

    pub fn heartbeats_since(&self, since: Instant) -> Vec<Instant> {
        self.calls
            .iter()
            .filter(|(at, c)| *at >= since && matches!(c, StoreCall::Heartbeat { .. }))
            .map(|(at, _)| *at)
            .collect()
    }

    pub fn left(&self) -> BTreeSet<GroupName> {
        self.calls
            .iter()
            .filter_map(|(_, c)| match c {
                StoreCall::Leave { group, .. } => Some(group.clone()),
                _ => None,
            })
            .collect()
    }
}

pub fn reason(d: &Delivered) -> RevokeReason {
    match d.delivery {
        Delivery::Revoke { reason, .. } => reason,
        Delivery::Assign { .. } => unreachable!("a revocation"),
    }
}

/// Revocations that reached the application while its leases were not trusted any more and
/// said anything but `fenced` (or `expired`, `lost`): the application would act on them as if it still
/// held the bucket, while its next owner may already have it.
pub fn untrusted_as_held(revoked: &[&Delivered]) -> Vec<String> {
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
pub fn untrusted(revoked: &[&Delivered]) -> String {
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
