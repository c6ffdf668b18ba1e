//! The worker's rules as a sans-IO state machine: time is an argument, nothing is awaited,
//! no clock is read.
//!
//! The machine decides; a driver (the tokio task started by [`LeaseWorker::start`](crate::LeaseWorker::start), or a test)
//! performs. The driver feeds it what happened ([`Machine::handle`]: a store call's result, an
//! event delivered to the application, a revocation acknowledged, a wake-up, a stop request),
//! wakes it when [`Machine::poll_timeout`] says ([`Machine::handle_timeout`]), and performs
//! what [`Machine::poll`] returns: the next store call ([`Output::Call`]), the next event to
//! deliver ([`Output::Deliver`]), a report ([`Output::Report`]), and finally how the worker
//! ended ([`Output::Finished`]). At most one store call is in flight and one delivery is
//! pending at a time (contract rule G8, and the handler's one-at-a-time promise).
//!
//! The rules it owns:
//!
//! - **Ticks.** A tick is a heartbeat, then the work the answer calls for: revoke what the
//!   store says is not ours any more, assign what it says is ours and the application was not
//!   told of, retry releases, then the policy's plan: shed (revoke, then release) or claim
//!   (at most [`CLAIM_BATCH`] at a time, ticking again at once while more is wanted). The next
//!   tick is due one renew interval after the last heartbeat was *sent* (a slow tick does not
//!   push renewals past the trust deadline), at once after a full claim batch, a wake-up's
//!   debounce after a wake-up, or after a backoff (100 ms doubling, at most the renew
//!   interval) after a failure.
//! - **Trust.** Leases are trusted until `sent + ttl - margin`, `sent` being when the last
//!   successful heartbeat was sent. Nothing is assigned at or past that deadline, nor once a
//!   renewal is due (a slow application must not starve the heartbeat); at the deadline
//!   everything the application holds is revoked ([`RevokeReason::Expired`]), even while a
//!   store call is in flight.
//! - **Revoke before release.** A shed bucket is released only after its revocation was
//!   acknowledged by the application ([`Input::Acked`]); an acknowledgement that does not come
//!   within the configured limit makes the bucket *stuck*: reported, never released, kept out
//!   of the store's hands until the session ends.
//! - **A new session revokes everything first.** A heartbeat answering with a session other
//!   than the one the machine knew (a new one, or one whose start it never heard of) means
//!   nothing held before is ours: every bucket is revoked before anything else.
//! - **Reconciliation.** Once a tick completes, what the application holds is what the store
//!   says the worker owns, less what is being released.
//! - **Resizes.** A heartbeat whose group has another shard count than the machine's is a
//!   resize the worker follows when the group was resized from the machine's count (one the
//!   worker was configured with, or followed before): it adopts the new count (reported once),
//!   shares the new generation's buckets by the policy, and revokes every bucket of the old
//!   generation it holds ([`RevokeReason::Resharded`]), releasing each once acknowledged, as a
//!   shed bucket. Old buckets are never assigned. Any other count is the typed mismatch error.
//! - **Errors.** A transient store error is reported and the tick retried after a backoff; a
//!   permanent one (or a group found with another shard count) revokes everything, leaves the
//!   group and finishes with the failure. A call that does not answer within the call timeout
//!   is abandoned and counts as a transient failure.
//! - **Stopping.** A stop abandons the call in flight, revokes everything
//!   ([`RevokeReason::Shutdown`]), waits for the acknowledgements (within the limit), leaves
//!   the group under the worker's own session, and finishes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use chrono::TimeDelta;
use lease_core::{
    Assignment, Bucket, FencingToken, Generation, GroupName, Heartbeat, Incarnation, Lease,
    Operation, RevokeReason, SessionId, ShardCount, StoreError, Takeover, Timestamp, Ttl, WorkerId,
    policy,
};

use crate::events::{WorkerError, WorkerFailed};

/// The most buckets one claim asks for. A worker that needs more claims in batches, each after
/// a fresh heartbeat: a worker alone in a big group while the others are starting stops at its
/// share as soon as they show up, instead of taking (and then shedding) the whole group, and
/// no statement holds thousands of row locks at a time.
pub const CLAIM_BATCH: u32 = 512;

/// How long a release waits before retrying buckets the store skipped (a row another
/// transaction held for an instant), and how many times it does within a tick.
const RELEASE_RETRY: Duration = Duration::from_millis(20);
const RELEASE_RETRIES: u32 = 3;

/// The first backoff after a failure; it doubles with each consecutive one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// The buckets the application owns, with their tokens.
pub type Owned = BTreeMap<Bucket, FencingToken>;

/// What the machine needs to know about its worker.
#[derive(Clone, Debug)]
pub struct Rules {
    /// The group.
    pub group: GroupName,
    /// The group's shard count the worker was configured with; it follows a resize from it
    /// ([`Machine::shards`]).
    pub shards: ShardCount,
    /// The worker.
    pub worker: WorkerId,
    /// This start of the worker.
    pub incarnation: Incarnation,
    /// How long a session lives after a heartbeat.
    pub ttl: Ttl,
    /// How often to heartbeat.
    pub renew_interval: Duration,
    /// How long before the store could expire a lease the worker stops trusting it.
    pub safety_margin: Duration,
    /// The pause after a wake-up before ticking, so a burst of changes costs one tick.
    pub wake_debounce: Duration,
    /// How long a store call may take before it is abandoned.
    pub call_timeout: Duration,
    /// How long the application may take to acknowledge a revocation before the bucket is
    /// reported stuck; `None`: no limit.
    pub ack_limit: Option<Duration>,
}

/// What happened, for the machine to handle.
#[derive(Debug)]
pub enum Input {
    /// The answer to [`StoreCall::Heartbeat`].
    Heartbeat(Result<Heartbeat, StoreError>),
    /// The answer to [`StoreCall::Claim`].
    Claimed(Result<Vec<Lease>, StoreError>),
    /// The answer to [`StoreCall::Release`].
    Released(Result<Vec<Bucket>, StoreError>),
    /// The answer to [`StoreCall::Leave`].
    Left(Result<Vec<Bucket>, StoreError>),
    /// The pending [`Output::Deliver`] reached the application (for an assignment: the
    /// application has it; for a revocation: it has been told, the acknowledgement may follow
    /// later with [`Input::Acked`]).
    Delivered,
    /// The application stopped working on a revoked bucket. Also counts as
    /// [`Input::Delivered`] for a pending revocation of that bucket.
    Acked(Bucket),
    /// The store's change feed reported a change in the group.
    Wake,
    /// Stop gracefully.
    Stop,
}

/// What the driver must do next.
#[derive(Debug)]
pub enum Output {
    /// Make this store call and hand its result back; only one is in flight at a time.
    Call(StoreCall),
    /// Deliver this event to the application, then hand back [`Input::Delivered`] (or
    /// [`Input::Acked`]); only one is pending at a time.
    Deliver(Delivery),
    /// Report this (log it, count it, tell the application's error hook).
    Report(Report),
    /// The worker is done; nothing more will come.
    Finished(Result<(), WorkerFailed>),
}

/// A store call the machine needs made, for its group and worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreCall {
    /// [`LeaseStore::heartbeat`](lease_core::LeaseStore::heartbeat) with the worker's
    /// incarnation, ttl and metadata.
    Heartbeat,
    /// [`LeaseStore::claim`](lease_core::LeaseStore::claim).
    Claim {
        /// The session to claim under.
        session: SessionId,
        /// How many.
        want: u32,
        /// Whether dead sessions' buckets may be taken: only once the worker has watched the
        /// store's clock advance steadily for a ttl (see [`Machine`]).
        takeover: Takeover,
    },
    /// [`LeaseStore::release`](lease_core::LeaseStore::release).
    Release {
        /// The session the buckets are held under.
        session: SessionId,
        /// The buckets.
        buckets: Vec<Bucket>,
    },
    /// [`LeaseStore::leave`](lease_core::LeaseStore::leave) under the worker's own session.
    Leave {
        /// The session.
        session: SessionId,
    },
}

impl StoreCall {
    /// The operation this call is.
    pub fn operation(&self) -> Operation {
        match self {
            Self::Heartbeat => Operation::Heartbeat,
            Self::Claim { .. } => Operation::Claim,
            Self::Release { .. } => Operation::Release,
            Self::Leave { .. } => Operation::Leave,
        }
    }
}

/// An event for the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Start working on `bucket`, fencing writes with `token`.
    Assign {
        /// The bucket.
        bucket: Bucket,
        /// Its token.
        token: FencingToken,
    },
    /// Stop working on `bucket`.
    Revoke {
        /// The bucket.
        bucket: Bucket,
        /// The token it was held with.
        token: FencingToken,
        /// Why.
        reason: RevokeReason,
    },
}

/// Something worth logging or counting.
#[derive(Debug)]
pub enum Report {
    /// A transient failure; the tick is retried after a backoff.
    Error(WorkerError),
    /// A claim won these many buckets.
    Claimed(usize),
    /// The application did not acknowledge the revocation of `bucket` within the limit: the
    /// bucket is kept (never released) until the worker's session ends.
    Stuck {
        /// The bucket.
        bucket: Bucket,
    },
    /// The trust deadline passed with buckets held: they are being revoked.
    Fenced {
        /// How many.
        owned: usize,
    },
    /// A tick completed.
    TickCompleted {
        /// How long it took, from its heartbeat's send time.
        took: Duration,
    },
    /// The store's clock moved between two heartbeats by more than the worker's own clock
    /// allows (beyond half the safety margin): a step of the server's wall clock.
    ClockStep(ClockStep),
    /// The group was resized from the worker's shard count: the worker follows it, revoking
    /// and releasing its buckets of the old generation and sharing the new one's.
    Resized {
        /// The count the worker had.
        from: ShardCount,
        /// The group's count now.
        to: ShardCount,
        /// The group's generation now.
        generation: Generation,
    },
}

/// A step of the store's clock, seen between two heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockStep {
    /// The store's clock jumped ahead by at least this much: sessions aged at once, so a
    /// session the store calls dead may still be trusted by its holder. The worker takes no
    /// dead session's bucket for a ttl from now.
    Forward(Duration),
    /// The store's clock went back by at least this much: leases live longer by as much in
    /// the store's eyes (their holders still fence on their own clocks).
    Backward(Duration),
}

fn error_is_transient(e: &WorkerError) -> bool {
    match e {
        WorkerError::Store { source, .. } => source.is_transient(),
        _ => true,
    }
}

/// One step of the current tick (or of stopping), done in order.
#[derive(Debug)]
enum Step {
    /// Send the tick's heartbeat.
    Heartbeat,
    Deliver(Delivery),
    /// Release what is shed and acknowledged (and what earlier releases skipped).
    Release,
    Claim(u32),
    /// Wait until every revocation was acknowledged or given up on (stopping).
    AwaitAcks,
    /// Leave the group (stopping).
    Leave,
    /// The end of a tick: schedule the next one.
    EndTick,
    /// The end of the worker.
    Finish,
}

/// A revocation not acknowledged (yet, or in time).
#[derive(Debug, Clone, Copy)]
struct Revoking {
    reason: RevokeReason,
    /// The session the bucket was held under when it was revoked: once acknowledged, a shed
    /// bucket is released only if that session is still the worker's.
    session: Option<SessionId>,
    /// When the application must have acknowledged it.
    deadline: Option<Instant>,
}

#[derive(Debug)]
struct InFlight {
    call: StoreCall,
    sent: Instant,
    deadline: Instant,
}

/// The worker's state machine; see the module documentation.
#[derive(Debug)]
pub struct Machine {
    rules: Rules,
    /// The group's shard count as the worker follows it: the configured one, then each count
    /// the group was resized to.
    shards: ShardCount,
    /// The count the group's current generation was resized from, as of the last heartbeat.
    resized_from: Option<ShardCount>,
    /// Buckets of `held` that belong to a draining generation: revoked, released, never
    /// assigned.
    draining: BTreeSet<Bucket>,
    session: Option<SessionId>,
    /// What the application has been told it owns.
    owned: Owned,
    /// What the store says the worker owns under its session: the last heartbeat's word,
    /// updated by the claims and releases since.
    held: Owned,
    /// Revoked, not acknowledged yet.
    revoking: BTreeMap<Bucket, Revoking>,
    /// Shed, acknowledged, to be released.
    unreleased: BTreeSet<Bucket>,
    /// Acknowledgements that never came in time: kept (never released, never assigned again)
    /// until the application acknowledges after all.
    stuck: BTreeMap<Bucket, Revoking>,
    trusted_until: Option<Instant>,
    last_sent: Option<Instant>,
    /// When the next tick starts, while idle.
    next_tick: Option<Instant>,
    /// A retry of a release that left buckets behind, and how many were made in this tick.
    release_retry: Option<Instant>,
    release_retries: u32,
    /// Consecutive failures, for the backoff.
    failures: u32,
    /// A wake-up arrived during a tick: tick again soon after it.
    woken: bool,
    /// The tick could not do all it wanted (a full claim batch, assignments held back for a
    /// due renewal): tick again at once.
    again: bool,
    /// The size of the claim batch in flight when the plan wanted more than a batch.
    batch_of_more: Option<u32>,
    /// The rest of the current tick.
    steps: VecDeque<Step>,
    in_flight: Option<InFlight>,
    /// An emitted delivery not yet handed back.
    pending: Option<Delivery>,
    /// Whether the trust deadline's revocations were queued already.
    fenced: bool,
    /// Since when the store's clock has been seen advancing with the worker's own, without a
    /// forward step: from the first heartbeat's answer, or the last step's detection.
    steady_since: Option<Instant>,
    /// The last successful heartbeat: when it was answered, and the store's time in it.
    last_beat: Option<(Instant, Timestamp)>,
    /// How far the store's clock was ahead of the worker's at each answer over the last ttl,
    /// relative to a reading of the worker's: forward steps show as a rise above the least.
    ahead: VecDeque<(Instant, TimeDelta)>,
    /// A claim this tick was restricted to unowned buckets and asked for this many: if it won
    /// fewer, it may have left wanted buckets of dead sessions, so tick when takeovers open.
    deferred_short: Option<u32>,
    reports: VecDeque<Report>,
    /// Why the worker is stopping (`Ok`: it was asked to), once it is.
    stopping: Option<Result<(), WorkerFailed>>,
    finished: bool,
}

impl Machine {
    /// A machine whose first tick is due at `now`.
    pub fn new(rules: Rules, now: Instant) -> Self {
        Self {
            shards: rules.shards,
            resized_from: None,
            draining: BTreeSet::new(),
            rules,
            session: None,
            owned: Owned::new(),
            held: Owned::new(),
            revoking: BTreeMap::new(),
            unreleased: BTreeSet::new(),
            stuck: BTreeMap::new(),
            trusted_until: None,
            last_sent: None,
            next_tick: Some(now),
            release_retry: None,
            release_retries: 0,
            failures: 0,
            woken: false,
            again: false,
            batch_of_more: None,
            steps: VecDeque::new(),
            in_flight: None,
            pending: None,
            fenced: false,
            steady_since: None,
            last_beat: None,
            ahead: VecDeque::new(),
            deferred_short: None,
            reports: VecDeque::new(),
            stopping: None,
            finished: false,
        }
    }

    /// The rules the machine follows.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// What the application owns now.
    pub fn owned(&self) -> &Owned {
        &self.owned
    }

    /// The group's shard count the worker follows: the configured one until a heartbeat shows
    /// the group resized from it.
    pub fn shards(&self) -> ShardCount {
        self.shards
    }

    /// What the application is told with an assignment of `bucket` with `token`: a bucket of
    /// the current generation (old ones are never assigned).
    pub fn assignment(&self, bucket: Bucket, token: FencingToken) -> Assignment {
        Assignment {
            bucket,
            token,
            shards: self.shards,
            resized_from: self.resized_from,
        }
    }

    /// The session the worker holds, as of its last successful heartbeat.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// Until when the leases are trusted.
    pub fn trusted_until(&self) -> Option<Instant> {
        self.trusted_until
    }

    /// The store call the machine waits for, if any. A driver drops a call the machine no
    /// longer waits for (it timed out, or the worker is stopping).
    pub fn awaits(&self) -> Option<&StoreCall> {
        self.in_flight.as_ref().map(|f| &f.call)
    }

    /// Buckets shed and acknowledged, waiting to be released.
    pub fn releasing(&self) -> &BTreeSet<Bucket> {
        &self.unreleased
    }

    /// Buckets whose revocation the application did not acknowledge in time: the worker
    /// neither releases them nor assigns them again until it does.
    pub fn stuck(&self) -> BTreeSet<Bucket> {
        self.stuck.keys().copied().collect()
    }

    /// Whether the machine finished.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether a tick is under way (or the worker is stopping), as opposed to waiting for the
    /// next one.
    pub fn is_busy(&self) -> bool {
        !self.steps.is_empty()
            || self.in_flight.is_some()
            || self.pending.is_some()
            || self.stopping.is_some()
    }

    fn trusted(&self, now: Instant) -> bool {
        self.trusted_until.is_some_and(|t| now < t)
    }

    fn renewal_due(&self, now: Instant) -> bool {
        self.last_sent
            .is_some_and(|sent| now >= sent + self.rules.renew_interval)
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
        if self.finished {
            return None;
        }
        let fence = (!self.owned.is_empty() && !self.fenced)
            .then_some(self.trusted_until)
            .flatten();
        let idle = !self.is_busy();
        [
            fence,
            self.in_flight.as_ref().map(|f| f.deadline),
            self.revoking.values().filter_map(|r| r.deadline).min(),
            self.next_tick.filter(|_| idle),
            self.release_retry.filter(|_| idle),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Handle what happened at `now`.
    pub fn handle(&mut self, now: Instant, input: Input) {
        if self.finished {
            return;
        }
        match input {
            Input::Heartbeat(result) => {
                if let Some(sent) = self.take_call(Operation::Heartbeat) {
                    self.on_heartbeat(now, sent, result);
                }
            }
            Input::Claimed(result) => {
                if self.take_call(Operation::Claim).is_some() {
                    self.on_claimed(now, result);
                }
            }
            Input::Released(result) => {
                if self.take_call(Operation::Release).is_some() {
                    self.on_released(now, result);
                }
            }
            Input::Left(result) => {
                if self.take_call(Operation::Leave).is_some() {
                    self.on_left(result);
                }
            }
            Input::Delivered => self.on_delivered(now),
            Input::Acked(bucket) => {
                if matches!(self.pending, Some(Delivery::Revoke { bucket: b, .. }) if b == bucket) {
                    self.pending = None;
                }
                self.on_acked(bucket);
            }
            Input::Wake => {
                if self.is_busy() {
                    self.woken = true;
                } else {
                    let soon = now + self.rules.wake_debounce;
                    self.next_tick = Some(self.next_tick.map_or(soon, |t| t.min(soon)));
                }
            }
            Input::Stop => {
                if self.stopping.is_none() {
                    self.stop(Ok(()), RevokeReason::Shutdown);
                }
            }
        }
    }

    /// Handle the deadlines that passed by `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        // The trust deadline first: nothing held may be trusted past it.
        if !self.owned.is_empty() && !self.fenced && self.trusted_until.is_none_or(|t| now >= t) {
            self.fence();
        }
        if let Some(f) = &self.in_flight
            && now >= f.deadline
        {
            let (operation, after) = (f.call.operation(), self.rules.call_timeout);
            self.in_flight = None;
            self.on_failure(now, WorkerError::Timeout { operation, after });
        }
        let late: Vec<Bucket> = self
            .revoking
            .iter()
            .filter(|(_, r)| r.deadline.is_some_and(|d| now >= d))
            .map(|(&b, _)| b)
            .collect();
        for bucket in late {
            if let Some(r) = self.revoking.remove(&bucket) {
                self.stuck.insert(bucket, r);
            }
            if matches!(self.pending, Some(Delivery::Revoke { bucket: b, .. }) if b == bucket) {
                self.pending = None;
            }
            self.reports.push_back(Report::Stuck { bucket });
        }
        if !self.is_busy() {
            if self.release_retry.is_some_and(|t| now >= t) {
                self.release_retry = None;
                self.steps.push_back(Step::Release);
                self.steps.push_back(Step::EndTick);
            } else if self.next_tick.is_some_and(|t| now >= t) {
                self.next_tick = None;
                self.woken = false;
                self.again = false;
                self.release_retries = 0;
                self.steps.push_back(Step::Heartbeat);
            }
        }
    }

    /// The next thing to do at `now`, if any. Call it until it returns `None`, then wait for
    /// an input or for [`poll_timeout`](Self::poll_timeout).
    pub fn poll(&mut self, now: Instant) -> Option<Output> {
        if let Some(report) = self.reports.pop_front() {
            return Some(Output::Report(report));
        }
        if self.finished || self.pending.is_some() {
            return None;
        }
        // Revocations at the front (the trust deadline's) go out even while a call is in flight.
        if matches!(
            self.steps.front(),
            Some(Step::Deliver(Delivery::Revoke { .. }))
        ) {
            while let Some(Step::Deliver(d)) = self.steps.front() {
                let d = *d;
                self.steps.pop_front();
                if let Some(out) = self.emit(now, d) {
                    return Some(out);
                }
            }
        }
        if self.in_flight.is_some() {
            return None;
        }
        while let Some(step) = self.steps.pop_front() {
            let out = match step {
                Step::Heartbeat => Some(self.call(now, StoreCall::Heartbeat)),
                Step::Deliver(d) => self.emit(now, d),
                Step::Release => self.release_step(now),
                Step::Claim(want) => self.claim_step(now, want),
                Step::Leave => self
                    .session
                    .map(|session| self.call(now, StoreCall::Leave { session })),
                Step::EndTick => {
                    self.end_tick(now);
                    None
                }
                Step::AwaitAcks => {
                    if !self.revoking.is_empty() {
                        // Leave only once every revocation was acknowledged or given up on.
                        self.steps.push_front(Step::AwaitAcks);
                        return None;
                    }
                    None
                }
                Step::Finish => {
                    self.finished = true;
                    let ended = self.stopping.take().unwrap_or(Ok(()));
                    return Some(Output::Finished(ended));
                }
            };
            if out.is_some() {
                return out;
            }
        }
        None
    }

    /// Emit a delivery if it still applies; `None` when it was dropped.
    fn emit(&mut self, now: Instant, d: Delivery) -> Option<Output> {
        match d {
            Delivery::Assign { bucket, token } => {
                // Assign only what the store (as of the latest answer) says is ours with that
                // token, and what the application does not hold already.
                if self.stopping.is_some()
                    || self.held.get(&bucket) != Some(&token)
                    || self.draining.contains(&bucket)
                    || self.owned.contains_key(&bucket)
                {
                    return None;
                }
                if !self.trusted(now) || self.renewal_due(now) {
                    // Past the trust deadline, or a renewal is due: assign nothing more now.
                    // The next tick renews, at once, and assigns what is still ours.
                    self.drop_assignments_and_claims();
                    self.again = true;
                    return None;
                }
            }
            Delivery::Revoke {
                bucket,
                token,
                reason,
            } => {
                // Revoke only what the application holds, with the token it holds.
                if self.owned.get(&bucket) != Some(&token) {
                    return None;
                }
                self.owned.remove(&bucket);
                let deadline = self.rules.ack_limit.map(|limit| now + limit);
                let session = self.session;
                self.revoking.insert(
                    bucket,
                    Revoking {
                        reason,
                        session,
                        deadline,
                    },
                );
            }
        }
        self.pending = Some(d);
        Some(Output::Deliver(d))
    }

    fn drop_assignments_and_claims(&mut self) {
        self.steps
            .retain(|s| !matches!(s, Step::Deliver(Delivery::Assign { .. }) | Step::Claim(_)));
    }

    fn on_delivered(&mut self, now: Instant) {
        if let Some(Delivery::Assign { bucket, token }) = self.pending.take() {
            self.owned.insert(bucket, token);
            if !self.trusted(now) {
                // The application took its time past the trust deadline: nothing held can be
                // trusted now, this bucket included.
                if self.fenced {
                    self.steps.push_front(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason: RevokeReason::Expired,
                    }));
                } else {
                    self.fence();
                }
            }
        }
    }

    fn on_acked(&mut self, bucket: Bucket) {
        // A late acknowledgement frees a stuck bucket too.
        let revoked = self
            .revoking
            .remove(&bucket)
            .or_else(|| self.stuck.remove(&bucket));
        // A shed (or resharded) bucket is released once acknowledged, if it is still held under
        // the session it was let go from, and so is a bucket of a draining generation however
        // it was revoked; any other acknowledged bucket the store says is ours is assigned
        // again.
        let release = revoked.is_some_and(|r| {
            matches!(r.reason, RevokeReason::Shed | RevokeReason::Resharded)
                && r.session == self.session
        }) || (self.draining.contains(&bucket) && self.held.contains_key(&bucket));
        if !release && self.stopping.is_none() {
            // Revoked for another reason (a fence, say) and still ours in the store: the
            // application gets it back in this tick rather than at the next.
            if let Some(&token) = self.held.get(&bucket)
                && !self.owned.contains_key(&bucket)
                && !self.unreleased.contains(&bucket)
            {
                self.insert_step(Step::Deliver(Delivery::Assign { bucket, token }));
            }
            return;
        }
        if release && self.stopping.is_none() {
            self.unreleased.insert(bucket);
            if !self.steps.iter().any(|s| matches!(s, Step::Release)) {
                // Acknowledged after this tick's release went out (or between ticks): release
                // it now rather than a renew interval later.
                self.insert_step(Step::Release);
            }
        }
    }

    /// Add `step` to the current tick, before its end; start a small one when idle.
    fn insert_step(&mut self, step: Step) {
        if self.is_busy() {
            let end = self
                .steps
                .iter()
                .position(|s| matches!(s, Step::EndTick))
                .unwrap_or(self.steps.len());
            self.steps.insert(end, step);
        } else {
            self.steps.push_back(step);
            self.steps.push_back(Step::EndTick);
        }
    }

    /// Revoke everything the application holds: the leases are not trusted any more.
    fn fence(&mut self) {
        self.fenced = true;
        self.reports.push_back(Report::Fenced {
            owned: self.owned.len(),
        });
        // No assignment may follow untrusted leases in this tick.
        self.drop_assignments_and_claims();
        let revokes = self.revocations(RevokeReason::Expired);
        for step in revokes.into_iter().rev() {
            self.steps.push_front(step);
        }
    }

    /// Steps revoking everything the application holds.
    fn revocations(&self, reason: RevokeReason) -> Vec<Step> {
        self.owned
            .iter()
            .map(|(&bucket, &token)| {
                Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason,
                })
            })
            .collect()
    }

    fn call(&mut self, now: Instant, call: StoreCall) -> Output {
        self.in_flight = Some(InFlight {
            call: call.clone(),
            sent: now,
            deadline: now + self.rules.call_timeout,
        });
        Output::Call(call)
    }

    /// The send time of the call in flight, if it is `op`'s; an answer nobody waits for any
    /// more is dropped.
    fn take_call(&mut self, op: Operation) -> Option<Instant> {
        match &self.in_flight {
            Some(f) if f.call.operation() == op => {
                let sent = f.sent;
                self.in_flight = None;
                Some(sent)
            }
            _ => None,
        }
    }

    fn on_heartbeat(&mut self, now: Instant, sent: Instant, result: Result<Heartbeat, StoreError>) {
        let beat = match result {
            Ok(beat) => beat,
            Err(e) => return self.on_store_error(now, Operation::Heartbeat, e),
        };
        if self.stopping.is_some() {
            // Stopping: only the session matters now, to leave it.
            self.session = Some(beat.session);
            return;
        }
        self.failures = 0;
        self.observe_clock(sent, now, beat.observed_at);
        self.last_sent = Some(sent);
        self.trusted_until = Some(sent + self.rules.ttl.as_duration() - self.rules.safety_margin);
        self.fenced = false;
        let mut steps: Vec<Step> = Vec::new();
        if self.session != Some(beat.session) {
            // A new session (or one whose start this worker never heard of): nothing held
            // before is ours any more, nor to be released.
            steps.extend(self.revocations(RevokeReason::Expired));
            self.unreleased.clear();
            self.held.clear();
            self.session = Some(beat.session);
        }
        if beat.view.shard_count != self.shards {
            if beat.view.previous == Some(self.shards) {
                // Resized from the count the worker routes by: follow it.
                self.reports.push_back(Report::Resized {
                    from: self.shards,
                    to: beat.view.shard_count,
                    generation: beat.view.generation,
                });
                self.shards = beat.view.shard_count;
            } else {
                // The group was deleted and created again with another count (or resized
                // from one the worker never had): the buckets this worker routes by are not
                // the group's. Retrying cannot help.
                let mismatch = StoreError::ShardCountMismatch {
                    group: self.rules.group.clone(),
                    configured: self.shards,
                    found: beat.view.shard_count,
                };
                self.steps.extend(steps);
                return self.stop(Err(WorkerFailed::Store(mismatch)), RevokeReason::Lost);
            }
        }
        self.resized_from = beat.view.previous;
        self.draining = beat.draining_buckets().into_iter().collect();
        let held: Owned = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
        self.held.clone_from(&held);
        let revoked_first: BTreeSet<Bucket> = if steps.is_empty() {
            BTreeSet::new()
        } else {
            self.owned.keys().copied().collect()
        };
        for (&bucket, &token) in &self.owned {
            if held.get(&bucket) != Some(&token) && !revoked_first.contains(&bucket) {
                steps.push(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: RevokeReason::Lost,
                }));
            }
        }
        // What is not held any more needs no release.
        self.unreleased.retain(|b| held.contains_key(b));
        // The application is told of what the store says is ours and it does not hold (a
        // claim whose answer was lost, leases kept alive that it fenced), unless it is on its
        // way out.
        let mut assigning: BTreeMap<Bucket, FencingToken> = BTreeMap::new();
        // Buckets of a draining generation are let go: revoked first if the application
        // holds them, released at once if it does not.
        let mut resharded: Vec<Step> = Vec::new();
        for (&bucket, &token) in &held {
            let holds_it =
                !revoked_first.contains(&bucket) && self.owned.get(&bucket) == Some(&token);
            let busy = self.unreleased.contains(&bucket)
                || self.revoking.contains_key(&bucket)
                || self.stuck.contains_key(&bucket);
            if self.draining.contains(&bucket) {
                if holds_it {
                    resharded.push(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason: RevokeReason::Resharded,
                    }));
                } else if !busy {
                    self.unreleased.insert(bucket);
                }
            } else if !holds_it && !busy {
                assigning.insert(bucket, token);
            }
        }
        // The plan counts what the worker will hold once this tick's revocations and
        // assignments are done: what the store says, less what is on its way out.
        let keeping: Vec<Bucket> = held
            .keys()
            .copied()
            .filter(|b| {
                !self.draining.contains(b)
                    && !self.unreleased.contains(b)
                    && !self.revoking.contains_key(b)
                    && !self.stuck.contains_key(b)
            })
            .collect();
        let plan = policy::plan(&beat.view, self.rules.worker, &keeping);
        let mut shed_now: Vec<Step> = resharded;
        for bucket in &plan.shed {
            if assigning.remove(bucket).is_some() {
                // Never handed to the application: it can go at once.
                self.unreleased.insert(*bucket);
            } else if let Some(&token) = self.owned.get(bucket) {
                shed_now.push(Step::Deliver(Delivery::Revoke {
                    bucket: *bucket,
                    token,
                    reason: RevokeReason::Shed,
                }));
            }
        }
        steps.extend(
            assigning
                .into_iter()
                .map(|(bucket, token)| Step::Deliver(Delivery::Assign { bucket, token })),
        );
        if !self.unreleased.is_empty() {
            steps.push(Step::Release);
        }
        if !shed_now.is_empty() {
            // Revoke first, release after: the next owner can only start once the
            // application stopped.
            steps.extend(shed_now);
            steps.push(Step::Release);
        }
        if plan.claim > 0 {
            steps.push(Step::Claim(plan.claim));
        }
        steps.push(Step::EndTick);
        self.steps.extend(steps);
    }

    fn release_step(&mut self, now: Instant) -> Option<Output> {
        let session = self.session?;
        if self.unreleased.is_empty() {
            return None;
        }
        let buckets: Vec<Bucket> = self.unreleased.iter().copied().collect();
        Some(self.call(now, StoreCall::Release { session, buckets }))
    }

    fn on_released(&mut self, now: Instant, result: Result<Vec<Bucket>, StoreError>) {
        if self.stopping.is_some() {
            return;
        }
        match result {
            Ok(released) => {
                for bucket in &released {
                    self.unreleased.remove(bucket);
                    self.held.remove(bucket);
                }
                // The store may skip a row another transaction holds for an instant (a claim
                // re-checking it): a few quick retries release it. An application's fencing
                // transaction may hold it longer: then the next tick retries.
                if !self.unreleased.is_empty() && self.release_retries < RELEASE_RETRIES {
                    self.release_retries += 1;
                    self.release_retry = Some(now + RELEASE_RETRY);
                }
            }
            Err(e) => self.on_store_error(now, Operation::Release, e),
        }
    }

    fn claim_step(&mut self, now: Instant, want: u32) -> Option<Output> {
        let session = self.session?;
        if !self.trusted(now) || self.renewal_due(now) {
            self.again = true;
            return None;
        }
        let batch = want.min(CLAIM_BATCH);
        self.batch_of_more = (batch < want).then_some(batch);
        let takeover = match self.last_sent {
            // The store's clock was watched up to the heartbeat sent at `sent`: from there to
            // the claim, the store checks that its clock moved no more than ours did (give or
            // take the tolerance), so a step in between defers the takeover.
            Some(sent) if self.takeover_opens().is_some_and(|t| now >= t) => {
                Takeover::AllowedWithin(
                    now.saturating_duration_since(sent) + self.rules.safety_margin / 2,
                )
            }
            _ => Takeover::Deferred,
        };
        self.deferred_short = (takeover == Takeover::Deferred).then_some(batch);
        Some(self.call(
            now,
            StoreCall::Claim {
                session,
                want: batch,
                takeover,
            },
        ))
    }

    fn on_claimed(&mut self, now: Instant, result: Result<Vec<Lease>, StoreError>) {
        if self.stopping.is_some() {
            // What was won goes with the leave.
            return;
        }
        match result {
            Ok(won) => {
                self.reports.push_back(Report::Claimed(won.len()));
                if self
                    .deferred_short
                    .is_some_and(|asked| u32::try_from(won.len()).is_ok_and(|n| n >= asked))
                {
                    // It won all it asked for: nothing wanted was left behind.
                    self.deferred_short = None;
                }
                self.held.extend(won.iter().map(|l| (l.bucket, l.token)));
                if self
                    .batch_of_more
                    .take()
                    .is_some_and(|batch| u32::try_from(won.len()).is_ok_and(|n| n == batch))
                {
                    // A full batch and more wanted: tick again at once, on a fresh view.
                    self.again = true;
                }
                // A bucket whose earlier revocation the application has not acknowledged is
                // held, not assigned: it is assigned at a tick after the acknowledgement.
                let assigns: Vec<Step> = won
                    .iter()
                    .filter(|l| {
                        !self.revoking.contains_key(&l.bucket)
                            && !self.stuck.contains_key(&l.bucket)
                    })
                    .map(|l| {
                        Step::Deliver(Delivery::Assign {
                            bucket: l.bucket,
                            token: l.token,
                        })
                    })
                    .collect();
                for step in assigns.into_iter().rev() {
                    self.steps.push_front(step);
                }
            }
            Err(e) => self.on_store_error(now, Operation::Claim, e),
        }
    }

    fn on_left(&mut self, result: Result<Vec<Bucket>, StoreError>) {
        if let Err(e) = result {
            let source = WorkerError::Store {
                operation: Operation::Leave,
                source: e,
            };
            if matches!(self.stopping, Some(Ok(()))) {
                self.stopping = Some(Err(WorkerFailed::LeaveFailed { source }));
            } else {
                self.reports.push_back(Report::Error(source));
            }
        }
    }

    fn on_store_error(&mut self, now: Instant, operation: Operation, e: StoreError) {
        let error = WorkerError::Store {
            operation,
            source: e,
        };
        if self.stopping.is_some() {
            self.reports.push_back(Report::Error(error));
        } else if error_is_transient(&error) {
            self.on_failure(now, error);
        } else {
            let WorkerError::Store { source, .. } = error else {
                return;
            };
            self.stop(Err(WorkerFailed::Store(source)), RevokeReason::Lost);
        }
    }

    /// A transient failure, or a call that did not answer: report it, drop the rest of the
    /// tick, and tick again after a backoff. While stopping, a leave that did not answer ends
    /// the stop with the failure.
    fn on_failure(&mut self, now: Instant, error: WorkerError) {
        if self.stopping.is_some() {
            if matches!(
                error,
                WorkerError::Timeout {
                    operation: Operation::Leave,
                    ..
                }
            ) {
                self.on_left_timeout(error);
            } else {
                self.reports.push_back(Report::Error(error));
            }
            return;
        }
        self.reports.push_back(Report::Error(error));
        self.failures = self.failures.saturating_add(1);
        // Revocations still to deliver (a fence, a new session's) stay; the rest goes.
        self.steps
            .retain(|s| matches!(s, Step::Deliver(Delivery::Revoke { .. })));
        self.release_retry = None;
        self.next_tick = Some(now + self.backoff());
    }

    fn on_left_timeout(&mut self, error: WorkerError) {
        if matches!(self.stopping, Some(Ok(()))) {
            self.stopping = Some(Err(WorkerFailed::LeaveFailed { source: error }));
        } else {
            self.reports.push_back(Report::Error(error));
        }
    }

    /// Stop: let the call in flight answer (a heartbeat may be starting the session the
    /// worker must leave), revoke everything, wait for the acknowledgements, leave under the
    /// worker's own session, finish with `ended`.
    fn stop(&mut self, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
        self.stopping = Some(ended);
        self.next_tick = None;
        self.release_retry = None;
        // Revocations already queued (a fence) go first; nothing else of the tick.
        self.steps
            .retain(|s| matches!(s, Step::Deliver(Delivery::Revoke { .. })));
        let revokes = self.revocations(reason);
        self.steps.extend(revokes);
        self.steps.push_back(Step::AwaitAcks);
        self.steps.push_back(Step::Leave);
        self.steps.push_back(Step::Finish);
    }

    /// When this worker may take dead sessions' buckets: a ttl after it began watching the
    /// store's clock advance steadily. Until then a session the store calls dead may be one
    /// whose holder still trusts it: the store's clock stepped forward (before this worker
    /// started, or since), and the holder fences by its own clock, up to a ttl after its last
    /// renewal. The worker's own ttl stands for the group's: workers of a group share one.
    pub fn takeover_opens(&self) -> Option<Instant> {
        self.steady_since.map(|t| t + self.rules.ttl.as_duration())
    }

    /// Compare the store's time in a heartbeat with the earlier ones'. Between two answers the
    /// store's clock must have advanced by at least the time from the first answer to the
    /// second request: less, by more than half the safety margin (the trust deadline absorbs
    /// smaller steps), is a backward step. Forward, the store reads its clock late in a call
    /// (under the row lock, after any wait), so its time is judged against the answers' times:
    /// the store's clock ahead of ours by more than half the margin beyond the least it was
    /// ahead over the last ttl is a forward step, whether it jumped at once or in smaller steps
    /// that add up. (Over a ttl, clocks drift apart by far less.) A false alarm only defers
    /// takeovers for a ttl.
    fn observe_clock(&mut self, sent: Instant, received: Instant, observed: Timestamp) {
        let tolerance = self.rules.safety_margin / 2;
        let Some((received_before, observed_before)) = self.last_beat else {
            self.steady_since = Some(received);
            self.last_beat = Some((received, observed));
            self.ahead.push_back((received, TimeDelta::zero()));
            return;
        };
        // How far the store's clock is ahead of the worker's, relative to the last answer's
        // reading, accumulated in `ahead`.
        let elapsed = TimeDelta::from_std(received.saturating_duration_since(received_before))
            .unwrap_or(TimeDelta::MAX);
        let last_ahead = self.ahead.back().map_or(TimeDelta::zero(), |&(_, a)| a);
        let ahead = last_ahead + ((observed - observed_before) - elapsed);
        while self.ahead.front().is_some_and(|&(t, _)| {
            received.saturating_duration_since(t) > self.rules.ttl.as_duration()
        }) {
            self.ahead.pop_front();
        }
        let least_ahead = self
            .ahead
            .iter()
            .map(|&(_, a)| a)
            .min()
            .unwrap_or(last_ahead);
        let tolerance_delta = TimeDelta::from_std(tolerance).unwrap_or(TimeDelta::MAX);
        if ahead - least_ahead > tolerance_delta {
            self.steady_since = Some(received);
            let by = (ahead - least_ahead).to_std().unwrap_or_default();
            self.reports
                .push_back(Report::ClockStep(ClockStep::Forward(by)));
            // Judged from here on: the step is reported once.
            self.ahead.clear();
        } else {
            let least = sent.saturating_duration_since(received_before);
            let advanced = observed - observed_before;
            let least_delta = TimeDelta::from_std(least).unwrap_or(TimeDelta::MAX);
            if advanced + tolerance_delta < least_delta {
                let by = (least_delta - advanced).to_std().unwrap_or_default();
                self.reports
                    .push_back(Report::ClockStep(ClockStep::Backward(by)));
            }
        }
        self.ahead.push_back((received, ahead));
        self.last_beat = Some((received, observed));
    }

    fn end_tick(&mut self, now: Instant) {
        if self.stopping.is_some() {
            return;
        }
        let mut next = if self.again {
            now
        } else if self.woken {
            now + self.rules.wake_debounce
        } else {
            // Renew on a cadence counted from when the last heartbeat was sent, the instant
            // trust is counted from.
            self.last_sent.unwrap_or(now) + self.rules.renew_interval
        };
        if self.deferred_short.take().is_some()
            && let Some(opens) = self.takeover_opens().filter(|&t| t > now)
        {
            // Dead sessions' buckets were left for later: claim them as soon as that is safe.
            next = next.min(opens);
        }
        if let Some(started) = self.last_sent {
            self.reports.push_back(Report::TickCompleted {
                took: now.saturating_duration_since(started),
            });
        }
        self.again = false;
        self.woken = false;
        self.next_tick = Some(self.next_tick.map_or(next, |t| t.min(next)));
    }
}
