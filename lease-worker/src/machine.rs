//! The node's rules as a sans-IO state machine: time is an argument, nothing is awaited, no
//! clock is read.
//!
//! A node is one process's membership in any number of groups under **one session**: one
//! heartbeat per tick renews it and answers for every group ([`Heartbeat`]), and each group
//! has its own buckets, its own application and its own share. The machine decides; a driver
//! (the tokio task started by [`LeaseNode::start`](crate::LeaseNode::start), or a test)
//! performs, and the machine is the only caller of the store: every call a node makes (a
//! group's ensure and subscription, heartbeats, joins, weights, claims, releases, leaves, the
//! hand-over) is a [`StoreCall`] it emits with all its arguments, which a driver makes as it
//! is ([`StoreCall::execute`]). The driver feeds it what happened ([`Machine::handle`]: a
//! store call's result, an event delivered to a group's application, a revocation
//! acknowledged, a wake-up, a weight set, a stop request), adds and removes groups ([`Machine::add_group`], [`Machine::remove_group`]), wakes
//! it when [`Machine::poll_timeout`] says ([`Machine::handle_timeout`]), and performs what
//! [`Machine::poll`] returns: the next store call ([`Output::Call`]), the next event to deliver
//! to a group ([`Output::Deliver`]), a report ([`Output::Report`]), the end of a group
//! ([`Output::GroupFinished`]) and finally how the node ended ([`Output::Finished`]). At most
//! one store call is in flight for the whole node (contract rule G8: heartbeats and the calls
//! of its groups are one caller's), and at most one delivery is pending per group (each
//! group's application hears its events one at a time, in order; groups do not wait for each
//! other).
//!
//! The rules it owns:
//!
//! - **Ticks.** A tick is a heartbeat for the whole node (handing in, per group, the stamp of
//!   the last view it was given, so that the store may answer "unchanged"; the machine keeps
//!   that view), then for each group the work the answer calls for: revoke what the store
//!   says is not ours any more, assign what it says is ours and the application was not told
//!   of, retry releases, then the policy's plan: shed (revoke, then release) or claim (at most
//!   [`CLAIM_BATCH`] at a time, ticking again at once while more is wanted). The next tick is
//!   due one renew interval after the last heartbeat was *sent* (a slow tick does not push
//!   renewals past the trust deadline), at once after a full claim batch or a join, a wake-up's
//!   debounce after a wake-up, or after a backoff (100 ms doubling, at most the renew interval)
//!   after a failure. A renewal never waits for an application: once it is due the heartbeat
//!   goes out as soon as no store call is in flight, even while a group's handler is still
//!   working on a delivery, and so does a wake-up's re-plan once nothing but deliveries is
//!   left of the tick; the answer re-plans every group.
//! - **Trust, per node.** Leases are trusted until `sent + ttl - margin`, `sent` being when the
//!   last successful heartbeat was sent. Nothing is assigned at or past that deadline, nor once
//!   a renewal is due; at the deadline everything every group's application holds is revoked
//!   ([`RevokeReason::Fenced`]), even while a store call is in flight: one missed renewal
//!   fences every group. A revocation queued for another reason before the deadline says
//!   `Fenced` when it is delivered after it.
//! - **Membership.** A new session is a member of no group: after one, every group is joined
//!   again (one [`StoreCall::Join`] each) and claims nothing before the next heartbeat gives
//!   its view. A group missing from a heartbeat of the same session was left behind the
//!   node's back (an operator evicted the node from it): its buckets are revoked
//!   ([`RevokeReason::Lost`], revocations still queued included, but for the fence's) and
//!   it is joined again.
//!   A group listed in a heartbeat that the node does not run (a session taken over from a
//!   predecessor that ran it, HO3) is left at once ([`Report::LeftUnrun`]).
//! - **Revoke before release.** A shed bucket is released only after its revocation was
//!   acknowledged by the application ([`Input::Acked`]); an acknowledgement that does not come
//!   within the configured limit makes the bucket *stuck*: reported, never released, kept out
//!   of the store's hands until the session ends.
//! - **A new session revokes everything first.** A heartbeat answering with a session other
//!   than the one the machine knew (a new one, or one whose start it never heard of) means
//!   nothing held before is ours, in any group: every bucket is revoked before anything else
//!   ([`RevokeReason::Expired`], revocations still queued included, but for those the
//!   trust deadline queued, which keep saying `Fenced`), and each group's join
//!   waits for its revocations.
//! - **Reconciliation.** Once a tick completes, what each application holds is what the store
//!   says the node owns in its group, less what is being released.
//! - **Resizes.** A heartbeat whose group has another shard count than the group's is a
//!   resize the group follows when the group was resized from that count (the one it was
//!   added with, or followed before): it adopts the new count (reported once), shares the new
//!   generation's buckets by the policy, and revokes every bucket of the old generation it
//!   holds ([`RevokeReason::Resharded`]), releasing each once acknowledged, as a shed bucket.
//!   Old buckets are never assigned. Any other count is the typed mismatch error, for that
//!   group.
//! - **Errors.** A transient store error is reported and the tick retried after a backoff. A
//!   permanent one ends what it concerns: a group's call (or a group found with another shard
//!   count) revokes that group's buckets, leaves it and ends it ([`Output::GroupFinished`]); a
//!   heartbeat's ends the node (every group revoked and left). A call that does not answer
//!   within the call timeout is abandoned and counts as a transient failure.
//! - **Removing a group, stopping.** Removing a group revokes everything its application holds
//!   ([`RevokeReason::Shutdown`]), waits for the acknowledgements (within the limit), leaves
//!   that group under the node's session, and ends the group; the node's other groups go on. A
//!   stop removes every group that way (letting the call in flight answer: it may be starting
//!   the session to leave), then finishes. The session is renewed on its cadence meanwhile,
//!   also while the node removes its last groups, until every group is left or handed over:
//!   the applications hold their buckets until they acknowledge. The trust deadline holds as
//!   everywhere else: a revocation delivered at or past it says [`RevokeReason::Fenced`]
//!   (never a shutdown, a shed, a resize's), and every revocation still queued when the node
//!   finds its session gone says [`RevokeReason::Expired`] (`Lost` when it was evicted from
//!   the group) unless the fence queued it. With [`Rules::keep_on_stop`], a graceful stop
//!   skips the leaves and ends with one [`StoreCall::HandOver`] (rule HO1), unless a
//!   revocation was not acknowledged in time (a stuck bucket): then every group leaves, and
//!   nothing is handed over (the choice is made for every group at once, when no revocation
//!   is outstanding in any). A hand-over that fails ends the node with
//!   [`WorkerFailed::HandOverFailed`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Bound::{Excluded, Unbounded};
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use lease_core::{
    Assignment, BackendFailure, Bucket, ChangeFeed, FencingToken, Generation, GroupBeat, GroupName,
    GroupStamp, GroupView, Heartbeat, Incarnation, Lease, Load, MemberMetadata, MemberMode, NodeId,
    Operation, RevokeReason, SessionBound, SessionId, ShardCount, StoreError, Takeover, Timestamp,
    Ttl, ViewStamp, Weight, WorkerStore,
};

use crate::events::{WorkerError, WorkerFailed};

mod admission;
mod answers;
mod calls;
mod clock;
mod group;
mod lifecycle;
mod loads;
mod steps;
mod tick;
mod writes;

pub use calls::{Answered, ClockStep, Delivery, Input, Output, Report, StoreCall};
use group::{Group, InFlight, NodeState};
pub use loads::LoadRules;
use steps::{Revocations, Revoking, Step, Steps};

/// The most buckets one claim asks for. A group that needs more claims in batches, each after
/// a fresh heartbeat: a node alone in a big group while the others are starting stops at its
/// share as soon as they show up, instead of taking (and then shedding) the whole group, and
/// no statement holds thousands of row locks at a time.
pub const CLAIM_BATCH: u32 = 512;

/// How long a release waits before retrying buckets the store skipped (a row another
/// transaction held for an instant), and how many times it does within a tick.
const RELEASE_RETRY: Duration = Duration::from_millis(20);
const RELEASE_RETRIES: u32 = 3;

/// The most buckets one release names. A node letting go of many buckets at once (a drain, a
/// resize, a big shed) releases them in batches, each a call of its own, so that no release
/// outlasts the call timeout (an abandoned call is cancelled on the server and would never
/// finish) and no statement holds thousands of row locks at a time.
pub const RELEASE_BATCH: usize = 4096;

/// The first backoff after a failure; it doubles with each consecutive one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The buckets the application owns, with their tokens.
pub type Owned = BTreeMap<Bucket, FencingToken>;

/// What the machine needs to know about its node.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The node (the process's id in the store).
    pub node: NodeId,
    /// This start of the node.
    pub incarnation: Incarnation,
    /// What the node tells the other members about itself, with every heartbeat.
    pub metadata: MemberMetadata,
    /// How long a session lives after a heartbeat.
    pub ttl: Ttl,
    /// How often to heartbeat.
    pub renew_interval: Duration,
    /// How long before the store could expire a lease the node stops trusting it.
    pub safety_margin: Duration,
    /// The pause after a wake-up before ticking, so a burst of changes costs one tick.
    pub wake_debounce: Duration,
    /// How long a store call may take before it is abandoned.
    pub call_timeout: Duration,
    /// How long an application may take to acknowledge a revocation before the bucket is
    /// reported stuck; `None`: no limit.
    pub ack_limit: Option<Duration>,
    /// On a graceful stop, hand the session over for this long (HO1) instead of leaving the
    /// groups: a successor with the same node id takes it over with its buckets.
    pub keep_on_stop: Option<Ttl>,
    /// How the node smooths, publishes and balances its buckets' loads.
    pub loads: LoadRules,
}

/// A stop's hand-over of the session (rule HO1), once every group's buckets are revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HandingOver {
    /// Not handing over.
    No,
    /// To be sent once every group is done, keeping the session this long.
    Due(Ttl),
    /// Sent; the node finishes when it is answered (or times out).
    Sent,
    /// Answered (or given up on).
    Done,
}

/// Where the node is in its life.
#[derive(Debug)]
enum Lifecycle {
    /// Sharing its groups.
    Running,
    /// Removing every group; then it finishes with `ended` (`Ok` when it was asked to stop),
    /// once the session is handed over if `handing_over` says so.
    Stopping {
        ended: Result<(), WorkerFailed>,
        handing_over: HandingOver,
    },
    /// Done: nothing more comes.
    Finished,
}

/// The node's state machine; see the module documentation.
#[derive(Debug)]
pub struct Machine {
    rules: Rules,
    /// The node's groups, in the order they were added.
    groups: Vec<Group>,
    session: Option<SessionId>,
    trusted_until: Option<Instant>,
    last_sent: Option<Instant>,
    /// When the next tick starts, once the node is idle.
    next_tick: Option<Instant>,
    /// A heartbeat is to be sent as soon as no call is in flight.
    heartbeat_wanted: bool,
    /// Consecutive failures, for the backoff.
    failures: u32,
    /// A wake-up arrived during a tick: tick again soon after it.
    woken: bool,
    /// When a wake-up that arrived during a tick may re-plan though some group's application
    /// is still being told of the last plan: once no store call is queued or in flight.
    woken_at: Option<Instant>,
    /// The tick could not do all it wanted (a full claim batch, a join waiting for its view,
    /// assignments held back): tick again at once.
    again: bool,
    /// Work started (a tick, or a group's small run) whose end is still to be marked.
    open: bool,
    in_flight: Option<InFlight>,
    /// Running, stopping (and how far the hand-over got) or finished.
    life: Lifecycle,
    /// A revocation was not acknowledged in time (a bucket is stuck): the session must not
    /// pass to a successor, who would hold that bucket under the same token while the stuck
    /// application may still write with it. The node leaves instead.
    stuck_seen: bool,
    /// A group skipped its leave for the hand-over (so there is a membership to hand over).
    leave_skipped: bool,
    /// Groups the last heartbeat listed that the node does not run (a predecessor's, taken
    /// over with the session): to leave.
    unrun: Vec<GroupName>,
    /// Whether the trust deadline's revocations were queued already.
    fenced: bool,
    /// Since when the store's clock has been seen advancing with the node's own, without a
    /// forward step: from the first heartbeat's answer, or the last step's detection.
    steady_since: Option<Instant>,
    /// The last successful heartbeat: when it was answered, and the store's time in it.
    last_beat: Option<(Instant, Timestamp)>,
    /// How far the store's clock was ahead of the node's at each answer over the last ttl,
    /// relative to a reading of the node's: forward steps show as a rise above the least.
    ahead: VecDeque<(Instant, TimeDelta)>,
    reports: VecDeque<Report>,
    /// Where the search for the next group call starts, so that groups take turns.
    cursor: usize,
    /// Groups added and not yet ensured and subscribed, in the order they were added: they
    /// make those calls first, then become the node's groups and are joined.
    admitting: Vec<Admitting>,
    /// Groups that ended before they were admitted (refused by the store, or removed
    /// meanwhile), to hand out as [`Output::GroupFinished`].
    ended_early: VecDeque<(GroupName, Result<(), WorkerFailed>)>,
    /// The weight the application set per group, written after every join.
    weights: BTreeMap<GroupName, Weight>,
    /// Groups whose weight is still to be written under the node's session, once it is a
    /// member there.
    weight_unsent: BTreeSet<GroupName>,
    /// The bound of the session's writes, handed in with each heartbeat (V4).
    writes: writes::Writes,
}

/// A group on its way into the node: ensured in the store, then subscribed to.
#[derive(Debug)]
struct Admitting {
    name: GroupName,
    shards: ShardCount,
    /// Ensured already: subscribing is next.
    ensured: bool,
    /// Removed (or the node stopped) while its call was in flight: it ends when the call
    /// answers.
    cancelled: bool,
}

impl Machine {
    /// A machine of no group yet; its first tick is due at `now`, once it has one.
    pub fn new(rules: Rules, now: Instant) -> Self {
        Self {
            rules,
            groups: Vec::new(),
            session: None,
            writes: writes::Writes::default(),
            trusted_until: None,
            last_sent: None,
            next_tick: Some(now),
            heartbeat_wanted: false,
            failures: 0,
            woken: false,
            woken_at: None,
            again: false,
            open: false,
            in_flight: None,
            life: Lifecycle::Running,
            stuck_seen: false,
            leave_skipped: false,
            unrun: Vec::new(),
            fenced: false,
            steady_since: None,
            last_beat: None,
            ahead: VecDeque::new(),
            reports: VecDeque::new(),
            cursor: 0,
            admitting: Vec::new(),
            ended_early: VecDeque::new(),
            weights: BTreeMap::new(),
            weight_unsent: BTreeSet::new(),
        }
    }

    /// The rules the machine follows.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The node's groups, in the order they were added (those being removed included).
    pub fn groups(&self) -> impl Iterator<Item = &GroupName> {
        self.groups.iter().map(|g| &g.name)
    }

    fn index(&self, group: &GroupName) -> Option<usize> {
        self.groups.iter().position(|g| &g.name == group)
    }

    fn group(&self, group: &GroupName) -> Option<&Group> {
        self.groups.iter().find(|g| &g.name == group)
    }

    /// Whether the node is a member of `group` under its session, as far as the machine knows
    /// (it joined, or the last heartbeat listed the group).
    pub fn is_member(&self, group: &GroupName) -> bool {
        self.session.is_some() && self.group(group).is_some_and(|g| g.member)
    }

    /// What `group`'s application owns now.
    pub fn owned(&self, group: &GroupName) -> Option<&Owned> {
        self.group(group).map(|g| &g.owned)
    }

    /// How many buckets the applications of all groups own now.
    pub fn owned_total(&self) -> usize {
        self.groups.iter().map(|g| g.owned.len()).sum()
    }

    /// `group`'s shard count as the node follows it: the one it was added with until a
    /// heartbeat shows the group resized from it.
    pub fn shards(&self, group: &GroupName) -> Option<ShardCount> {
        self.group(group).map(|g| g.shards)
    }

    /// What `group`'s application is told with an assignment of `bucket` with `token`: a
    /// bucket of the current generation (old ones are never assigned).
    pub fn assignment(
        &self,
        group: &GroupName,
        bucket: Bucket,
        token: FencingToken,
    ) -> Option<Assignment> {
        self.group(group).map(|g| Assignment {
            bucket,
            token,
            shards: g.shards,
            resized_from: g.resized_from,
        })
    }

    /// The session the node holds, as of its last successful heartbeat.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// Until when the leases are trusted.
    pub fn trusted_until(&self) -> Option<Instant> {
        self.trusted_until
    }

    /// The store call the machine waits for, if any. A driver drops a call the machine no
    /// longer waits for (it timed out, or the node is stopping).
    pub fn awaits(&self) -> Option<&StoreCall> {
        self.in_flight.as_ref().map(|f| &f.call)
    }

    /// `group`'s buckets shed and acknowledged, waiting to be released.
    pub fn releasing(&self, group: &GroupName) -> BTreeSet<Bucket> {
        self.group(group)
            .map(|g| g.unreleased.clone())
            .unwrap_or_default()
    }

    /// `group`'s buckets whose revocation the application did not acknowledge in time: the
    /// node neither releases them nor assigns them again until it does.
    pub fn stuck(&self, group: &GroupName) -> BTreeSet<Bucket> {
        self.group(group)
            .map(|g| g.stuck.keys().copied().collect())
            .unwrap_or_default()
    }

    /// Whether the machine finished.
    pub fn is_finished(&self) -> bool {
        matches!(self.life, Lifecycle::Finished)
    }

    /// Whether the node is stopping (or stopped).
    pub fn is_stopping(&self) -> bool {
        !matches!(self.life, Lifecycle::Running)
    }

    /// Stopping, not finished yet.
    fn winding_up(&self) -> bool {
        matches!(self.life, Lifecycle::Stopping { .. })
    }

    /// How far a stop's hand-over got (`No` unless stopping).
    fn handing_over(&self) -> HandingOver {
        match self.life {
            Lifecycle::Stopping { handing_over, .. } => handing_over,
            _ => HandingOver::No,
        }
    }

    fn set_handing_over(&mut self, to: HandingOver) {
        if let Lifecycle::Stopping { handing_over, .. } = &mut self.life {
            *handing_over = to;
        }
    }

    /// Whether a tick is under way (or the node is stopping), as opposed to waiting for the
    /// next one.
    pub fn is_busy(&self) -> bool {
        !self.is_idle() || self.winding_up()
    }

    fn is_idle(&self) -> bool {
        self.in_flight.is_none() && !self.heartbeat_wanted && self.groups.iter().all(Group::is_idle)
    }

    /// Whether no store call is in flight, wanted or queued in any group: what is left of the
    /// tick is deliveries to applications.
    fn calls_idle(&self) -> bool {
        self.in_flight.is_none()
            && !self.heartbeat_wanted
            && self.groups.iter().all(|g| !g.steps.has_call())
    }

    /// A wake-up's re-plan that does not wait for the applications: due, the node healthy and
    /// not stopping, some group shared, nothing but deliveries left of the tick.
    fn busy_wake_at(&self) -> Option<Instant> {
        // Almost always none: answer that before scanning the groups' queued steps.
        let at = self.woken_at?;
        if self.winding_up()
            || self.failures > 0
            || !self.has_active_groups()
            || self.is_idle()
            || !self.calls_idle()
        {
            return None;
        }
        Some(at)
    }

    /// Whether some group's application is still to be told of a revocation, or has not
    /// acknowledged one (nor been given up on), or is being told of anything.
    fn revocations_outstanding(&self) -> bool {
        self.groups
            .iter()
            .any(|g| !g.revoking.is_empty() || g.steps.has_revoke() || g.pending.is_some())
    }

    /// Whether some group is shared (not being removed): only then does the node tick.
    fn has_active_groups(&self) -> bool {
        self.groups.iter().any(|g| g.removing.is_none())
    }

    fn trusted(&self, now: Instant) -> bool {
        self.trusted_until.is_some_and(|t| now < t)
    }

    fn renewal_at(&self) -> Option<Instant> {
        self.last_sent.map(|sent| sent + self.rules.renew_interval)
    }

    fn renewal_due(&self, now: Instant) -> bool {
        self.renewal_at().is_some_and(|t| now >= t)
    }

    /// A renewal that must not wait for the groups' work: due, the node healthy (after a
    /// failure the backoff decides), some group shared, and the node busy (idle, the next
    /// tick covers it).
    fn busy_renewal_at(&self) -> Option<Instant> {
        if self.winding_up()
            || self.failures > 0
            || self.heartbeat_wanted
            || self.in_flight.is_some()
            || !self.has_active_groups()
            || self.is_idle()
        {
            return None;
        }
        self.renewal_at()
    }

    /// A renewal while the node winds down (stopping, or removing its last groups): the
    /// applications still hold buckets until their revocations are acknowledged, so the
    /// session is renewed on its cadence (after a failure, on the backoff) until every group
    /// is left or handed over. Without it a slow stop outlives the session, and the next
    /// owner starts while the application still works on its buckets.
    fn winding_down_renewal_at(&self) -> Option<Instant> {
        if self.groups.is_empty()
            || self.session.is_none()
            || self.in_flight.is_some()
            || self.heartbeat_wanted
            || (!self.winding_up() && self.has_active_groups())
        {
            return None;
        }
        if self.failures > 0 {
            self.next_tick
        } else {
            self.renewal_at()
        }
    }

    fn node_state(&self, now: Instant) -> NodeState {
        NodeState {
            session: self.session,
            trusted: self.trusted(now),
            renewal_due: self.renewal_due(now),
            ack_limit: self.rules.ack_limit,
        }
    }

    /// 100 ms, doubling per consecutive failure, capped at the renew interval.
    fn backoff(&self) -> Duration {
        let exp = self.failures.saturating_sub(1).min(16);
        (FIRST_BACKOFF * 2u32.pow(exp)).min(self.rules.renew_interval)
    }

    /// The next instant the machine must be woken at with [`handle_timeout`], if any.
    ///
    /// [`handle_timeout`]: Self::handle_timeout
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_finished() {
            return None;
        }
        let fence = (self.owned_total() > 0 && !self.fenced)
            .then_some(self.trusted_until)
            .flatten();
        let idle = self.is_idle();
        let ticking = idle && !self.winding_up() && self.has_active_groups();
        let revoking = self
            .groups
            .iter()
            .filter_map(|g| g.revoking.earliest())
            .min();
        let release_retry = self
            .groups
            .iter()
            .filter(|g| g.removing.is_none())
            .filter_map(|g| g.release_retry)
            .min();
        [
            fence,
            self.in_flight.as_ref().map(|f| f.deadline),
            revoking,
            self.next_tick.filter(|_| ticking),
            release_retry.filter(|_| idle && !self.winding_up()),
            self.busy_renewal_at(),
            self.busy_wake_at(),
            self.winding_down_renewal_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handle what happened at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) {
        if self.is_finished() {
            return;
        }
        match input {
            Input::Ensured(group, result) => {
                if self
                    .take_call(Operation::EnsureGroup, Some(&group))
                    .is_some()
                {
                    self.on_ensured(&group, result);
                }
            }
            Input::Subscribed(group, _) => {
                // Without a feed the group re-plans on the renew interval alone; the driver,
                // which holds the feed, says so.
                if self.take_call(Operation::Changes, Some(&group)).is_some() {
                    self.on_subscribed(now, &group);
                }
            }
            Input::SetWeight(group, weight) => {
                self.weights.insert(group.clone(), weight);
                self.weight_unsent.insert(group);
            }
            Input::WeightSet(group, result) => {
                if self.take_call(Operation::SetWeight, Some(&group)).is_some() {
                    self.write_answered(result.is_ok());
                    match result {
                        // The membership or the session ended meanwhile: the next join
                        // writes it.
                        Ok(()) | Err(StoreError::SessionExpired { .. }) => {}
                        Err(source) => self.reports.push_back(Report::Error {
                            group: Some(group),
                            error: WorkerError::Store {
                                operation: Operation::SetWeight,
                                source,
                            },
                        }),
                    }
                }
            }
            Input::Heartbeat(result) => {
                if let Some(sent) = self.take_call(Operation::Heartbeat, None) {
                    self.on_heartbeat(now, sent, result);
                }
            }
            Input::Joined(group, result) => {
                if self.take_call(Operation::Join, Some(&group)).is_some() {
                    self.write_answered(result.is_ok());
                    if let Some(i) = self.index(&group) {
                        self.on_joined(now, i, result);
                    }
                }
            }
            Input::ReportLoad(group, bucket, load) => {
                let half_life = self.rules.loads.half_life;
                if let Some(i) = self.index(&group)
                    && self.groups[i].held.contains_key(&bucket)
                {
                    self.groups[i].loads.sample(now, bucket, load, half_life);
                }
            }
            Input::LoadsPublished(group, result) => {
                if self
                    .take_call(Operation::PublishLoads, Some(&group))
                    .is_some()
                {
                    self.write_answered(result.is_ok());
                    if let Some(i) = self.index(&group) {
                        self.on_loads_published(now, i, result);
                    }
                }
            }
            Input::Claimed(group, result) => {
                if self
                    .take_call(Operation::Claim, Some(&group))
                    .or_else(|| self.take_call(Operation::ClaimBuckets, Some(&group)))
                    .is_some()
                {
                    self.write_answered(result.is_ok());
                    if let Some(i) = self.index(&group) {
                        self.on_claimed(now, i, result);
                    }
                }
            }
            Input::Released(group, result) => {
                if self.take_call(Operation::Release, Some(&group)).is_some() {
                    self.write_answered(result.is_ok());
                    if let Some(i) = self.index(&group) {
                        self.on_released(now, i, result);
                    }
                }
            }
            Input::HandedOver(result) => {
                if self.take_call(Operation::HandOver, None).is_some() {
                    self.write_answered(result.is_ok());
                    self.set_handing_over(HandingOver::Done);
                    match result {
                        Ok(Some(until)) => self.reports.push_back(Report::HandedOver { until }),
                        Ok(None) => self.hand_over_failed(None),
                        Err(source) => self.hand_over_failed(Some(WorkerError::Store {
                            operation: Operation::HandOver,
                            source,
                        })),
                    }
                }
            }
            Input::Left(group, result) => {
                let unrun = self.in_flight.as_ref().is_some_and(|f| f.unrun);
                if self.take_call(Operation::Leave, Some(&group)).is_some() {
                    self.write_answered(result.is_ok());
                    if unrun {
                        let released =
                            result
                                .map(|b| b.len())
                                .map_err(|source| WorkerError::Store {
                                    operation: Operation::Leave,
                                    source,
                                });
                        self.reports
                            .push_back(Report::LeftUnrun { group, released });
                    } else if let Some(i) = self.index(&group) {
                        self.on_left(i, result);
                    }
                }
            }
            Input::Delivered(group) => {
                if let Some(i) = self.index(&group) {
                    self.on_delivered(now, i);
                }
            }
            Input::Acked(group, bucket) => {
                if let Some(i) = self.index(&group) {
                    let g = &mut self.groups[i];
                    if matches!(g.pending, Some(Delivery::Revoke { bucket: b, .. }) if b == bucket)
                    {
                        g.pending = None;
                    }
                    self.on_acked(i, bucket);
                }
            }
            Input::Wake => {
                if self.is_busy() {
                    self.woken = true;
                    let soon = now + self.rules.wake_debounce;
                    self.woken_at = Some(self.woken_at.map_or(soon, |t| t.min(soon)));
                } else {
                    let soon = now + self.rules.wake_debounce;
                    self.next_tick = Some(self.next_tick.map_or(soon, |t| t.min(soon)));
                }
            }
            Input::Stop => {
                if !self.winding_up() {
                    self.stop(Ok(()), RevokeReason::Shutdown);
                }
            }
        }
    }

    /// Handle the deadlines that passed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_finished() {
            return;
        }
        // The trust deadline first: nothing held may be trusted past it, in any group.
        if self.owned_total() > 0 && !self.fenced && self.trusted_until.is_none_or(|t| now >= t) {
            self.fence();
        }
        if let Some(f) = &self.in_flight
            && now >= f.deadline
        {
            let (operation, after) = (f.call.operation(), self.rules.call_timeout);
            let group = f.call.group().and_then(|g| self.index(g));
            let unrun = f.unrun.then(|| f.call.group().cloned()).flatten();
            let admitting = matches!(operation, Operation::EnsureGroup | Operation::Changes)
                .then(|| f.call.group().cloned())
                .flatten();
            self.in_flight = None;
            if let Some(group) = admitting {
                // A group being added: an ensure that does not answer refuses it (the caller
                // of the add hears why); a subscription that does not answer leaves it
                // without wake-ups.
                if operation == Operation::EnsureGroup {
                    let detail = format!("no answer within {after:?}");
                    let e = StoreError::backend_detail(operation, BackendFailure::Other, detail);
                    self.on_ensured(&group, Err(e));
                } else {
                    self.on_subscribed(now, &group);
                }
            } else if let Some(group) = unrun {
                // Not the node's failure: the next heartbeat lists the group again.
                self.reports.push_back(Report::LeftUnrun {
                    group,
                    released: Err(WorkerError::Timeout { operation, after }),
                });
            } else if operation == Operation::HandOver {
                self.set_handing_over(HandingOver::Done);
                self.hand_over_failed(Some(WorkerError::Timeout { operation, after }));
            } else {
                self.on_failure(now, group, WorkerError::Timeout { operation, after });
            }
        }
        for g in &mut self.groups {
            for (bucket, r) in g.revoking.take_late(now) {
                g.stuck.insert(bucket, r);
                self.stuck_seen = true;
                if matches!(g.pending, Some(Delivery::Revoke { bucket: b, .. }) if b == bucket) {
                    g.pending = None;
                }
                self.reports.push_back(Report::Stuck {
                    group: g.name.clone(),
                    bucket,
                });
            }
        }
        if self.is_idle() && !self.winding_up() {
            if let Some(g) = self
                .groups
                .iter_mut()
                .find(|g| g.removing.is_none() && g.release_retry.is_some_and(|t| now >= t))
            {
                g.release_retry = None;
                g.steps.push_back(Step::Release);
                g.steps.push_back(Step::EndTick);
                self.open = true;
            } else if self.next_tick.is_some_and(|t| now >= t) && self.has_active_groups() {
                for g in &mut self.groups {
                    g.release_retries = 0;
                }
                self.heartbeat_wanted = true;
            }
        }
    }
}
