//! The node's rules as a sans-IO state machine: time is an argument, nothing is awaited, no
//! clock is read.
//!
//! A node is one process's membership in any number of groups under **one session**: one
//! heartbeat per tick renews it and answers for every group ([`Heartbeat`]), and each group
//! has its own buckets, its own application and its own share. The machine decides; a driver
//! (the tokio task started by [`LeaseNode::start`](crate::LeaseNode::start), or a test)
//! performs. The driver feeds it what happened ([`Machine::handle`]: a store call's result, an
//! event delivered to a group's application, a revocation acknowledged, a wake-up, a stop
//! request), adds and removes groups ([`Machine::add_group`], [`Machine::remove_group`]), wakes
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
//!   ([`RevokeReason::Lost`], revocations still queued included) and it is joined again.
//!   A group listed in a heartbeat that the node does not run (a session taken over from a
//!   predecessor that ran it, HO3) is left at once ([`Report::LeftUnrun`]).
//! - **Revoke before release.** A shed bucket is released only after its revocation was
//!   acknowledged by the application ([`Input::Acked`]); an acknowledgement that does not come
//!   within the configured limit makes the bucket *stuck*: reported, never released, kept out
//!   of the store's hands until the session ends.
//! - **A new session revokes everything first.** A heartbeat answering with a session other
//!   than the one the machine knew (a new one, or one whose start it never heard of) means
//!   nothing held before is ours, in any group: every bucket is revoked before anything else
//!   ([`RevokeReason::Expired`], revocations still queued included), and each group's join
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
//!   the group). With [`Rules::keep_on_stop`], a graceful stop
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
    GroupStamp, Heartbeat, Incarnation, Lease, MemberMetadata, MemberMode, NodeId, Operation,
    RevokeReason, SessionId, ShardCount, StoreError, Takeover, Timestamp, Ttl, ViewStamp, Weight,
    WorkerStore, policy,
};

use crate::events::{WorkerError, WorkerFailed};

mod steps;
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
}

/// What happened, for the machine to handle.
#[derive(Debug)]
pub enum Input {
    /// The answer to [`StoreCall::EnsureGroup`] of the group.
    Ensured(GroupName, Result<(), StoreError>),
    /// The answer to [`StoreCall::Subscribe`] of the group: whether the store gave a change
    /// feed is the driver's business (it keeps the feed); an error only means the group
    /// re-plans on the renew interval alone.
    Subscribed(GroupName, Result<(), StoreError>),
    /// The application set the node's weight in the group (see
    /// [`GroupHandle::set_weight`](crate::GroupHandle::set_weight)).
    SetWeight(GroupName, Weight),
    /// The answer to [`StoreCall::SetWeight`] of the group.
    WeightSet(GroupName, Result<(), StoreError>),
    /// The answer to [`StoreCall::Heartbeat`].
    Heartbeat(Result<Heartbeat, StoreError>),
    /// The answer to [`StoreCall::Join`] of the group.
    Joined(GroupName, Result<(), StoreError>),
    /// The answer to [`StoreCall::HandOver`].
    HandedOver(Result<Option<Timestamp>, StoreError>),
    /// The answer to [`StoreCall::Claim`] of the group.
    Claimed(GroupName, Result<Vec<Lease>, StoreError>),
    /// The answer to [`StoreCall::Release`] of the group.
    Released(GroupName, Result<Vec<Bucket>, StoreError>),
    /// The answer to [`StoreCall::Leave`] of the group.
    Left(GroupName, Result<Vec<Bucket>, StoreError>),
    /// The group's pending [`Output::Deliver`] reached its application (for an assignment: the
    /// application has it; for a revocation: it has been told, the acknowledgement may follow
    /// later with [`Input::Acked`]).
    Delivered(GroupName),
    /// The group's application stopped working on a revoked bucket. Also counts as
    /// [`Input::Delivered`] for a pending revocation of that bucket.
    Acked(GroupName, Bucket),
    /// A change feed reported a change in one of the node's groups: re-plan soon.
    Wake,
    /// Stop gracefully: remove every group, then finish.
    Stop,
}

/// What the driver must do next.
#[derive(Debug)]
pub enum Output {
    /// Make this store call and hand its result back; only one is in flight at a time.
    Call(StoreCall),
    /// Deliver this event to the group's application, then hand back [`Input::Delivered`] (or
    /// [`Input::Acked`]); only one is pending per group at a time.
    Deliver(GroupName, Delivery),
    /// Report this (log it, count it, tell the applications' error hooks).
    Report(Report),
    /// The group is done (removed, or failed): nothing more will come for it. `Ok` when it was
    /// removed (or the node stopped) and it left the store's group.
    GroupFinished(GroupName, Result<(), WorkerFailed>),
    /// The node is done; nothing more will come. `Ok` when it was asked to stop.
    Finished(Result<(), WorkerFailed>),
}

/// A store call the machine needs made, with every argument the store method takes: a driver
/// makes it as it is and hands the answer back as the matching [`Input`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreCall {
    /// [`WorkerStore::ensure_group`](lease_core::WorkerStore::ensure_group): a group added to
    /// the node is created if needed, and refused on a shard-count mismatch, before it is
    /// joined.
    EnsureGroup {
        /// The group.
        group: GroupName,
        /// The shard count the node was given for it.
        shards: ShardCount,
    },
    /// [`WorkerStore::changes`](lease_core::WorkerStore::changes): the group's wake-ups, once
    /// it is ensured. The driver keeps the feed and hands the machine its wake-ups
    /// ([`Input::Wake`]).
    Subscribe {
        /// The group.
        group: GroupName,
    },
    /// [`WorkerStore::heartbeat`](lease_core::WorkerStore::heartbeat).
    Heartbeat {
        /// The node.
        node: NodeId,
        /// This start of the node.
        incarnation: Incarnation,
        /// How long the session lives after this heartbeat.
        ttl: Ttl,
        /// What the node tells the other members about itself.
        metadata: MemberMetadata,
        /// The stamp of the last view of each group the node was given, for the store to
        /// answer "unchanged" if nothing changed since.
        seen: Vec<GroupStamp>,
    },
    /// [`WorkerStore::hand_over`](lease_core::WorkerStore::hand_over) of the node's session,
    /// as a graceful stop's last call.
    HandOver {
        /// The node.
        node: NodeId,
        /// This start of the node.
        incarnation: Incarnation,
        /// How long the session is kept for a successor.
        keep: Ttl,
    },
    /// [`WorkerStore::join`](lease_core::WorkerStore::join).
    Join {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The node's session.
        session: SessionId,
    },
    /// [`WorkerStore::set_weight`](lease_core::WorkerStore::set_weight): the weight the
    /// application set, written under the node's session once it is a member, and again
    /// after every join.
    SetWeight {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The node's session.
        session: SessionId,
        /// The weight.
        weight: Weight,
    },
    /// [`WorkerStore::claim`](lease_core::WorkerStore::claim).
    Claim {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The session to claim under.
        session: SessionId,
        /// How many.
        want: u32,
        /// Whether dead sessions' buckets may be taken: only once the node has watched the
        /// store's clock advance steadily for a ttl (see [`Machine`]).
        takeover: Takeover,
    },
    /// [`WorkerStore::release`](lease_core::WorkerStore::release).
    Release {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The session the buckets are held under.
        session: SessionId,
        /// The buckets.
        buckets: Vec<Bucket>,
    },
    /// [`WorkerStore::leave`](lease_core::WorkerStore::leave) under the node's own session.
    Leave {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The session.
        session: SessionId,
    },
}

impl StoreCall {
    /// The operation this call is.
    pub fn operation(&self) -> Operation {
        match self {
            Self::EnsureGroup { .. } => Operation::EnsureGroup,
            Self::Subscribe { .. } => Operation::Changes,
            Self::Heartbeat { .. } => Operation::Heartbeat,
            Self::HandOver { .. } => Operation::HandOver,
            Self::Join { .. } => Operation::Join,
            Self::SetWeight { .. } => Operation::SetWeight,
            Self::Claim { .. } => Operation::Claim,
            Self::Release { .. } => Operation::Release,
            Self::Leave { .. } => Operation::Leave,
        }
    }

    /// The group the call is for; `None` for the heartbeat and the hand-over, which are the
    /// node's.
    pub fn group(&self) -> Option<&GroupName> {
        match self {
            Self::Heartbeat { .. } | Self::HandOver { .. } => None,
            Self::EnsureGroup { group, .. }
            | Self::Subscribe { group }
            | Self::Join { group, .. }
            | Self::SetWeight { group, .. }
            | Self::Claim { group, .. }
            | Self::Release { group, .. }
            | Self::Leave { group, .. } => Some(group),
        }
    }

    /// The answer a call gets when it failed without a word from the store (its task
    /// panicked, or was cancelled): a failure of the operation like any other.
    pub fn failed(&self, error: StoreError) -> Input {
        match self.clone() {
            Self::EnsureGroup { group, .. } => Input::Ensured(group, Err(error)),
            Self::Subscribe { group } => Input::Subscribed(group, Err(error)),
            Self::Heartbeat { .. } => Input::Heartbeat(Err(error)),
            Self::HandOver { .. } => Input::HandedOver(Err(error)),
            Self::Join { group, .. } => Input::Joined(group, Err(error)),
            Self::SetWeight { group, .. } => Input::WeightSet(group, Err(error)),
            Self::Claim { group, .. } => Input::Claimed(group, Err(error)),
            Self::Release { group, .. } => Input::Released(group, Err(error)),
            Self::Leave { group, .. } => Input::Left(group, Err(error)),
        }
    }
}

/// What a store call answered: the machine's input, and for a subscription the store's change
/// feed, which the driver keeps (the machine hears only its wake-ups, as [`Input::Wake`]).
#[derive(Debug)]
pub struct Answered {
    /// The answer, for [`Machine::handle`].
    pub input: Input,
    /// The group's change feed, from [`StoreCall::Subscribe`] on a store that has one.
    pub feed: Option<ChangeFeed>,
}

impl StoreCall {
    /// Make the call on `store`, as it is: the whole of a driver's part in a store call. It
    /// reads no clock and spawns nothing; a driver that gives up on a call (the machine's
    /// call timeout) drops the future.
    pub async fn execute(self, store: &dyn WorkerStore) -> Answered {
        let input = match self {
            Self::EnsureGroup { group, shards } => {
                let result = store.ensure_group(&group, shards).await;
                Input::Ensured(group, result)
            }
            Self::Subscribe { group } => {
                return match store.changes(&group).await {
                    Ok(feed) => Answered {
                        input: Input::Subscribed(group, Ok(())),
                        feed,
                    },
                    Err(e) => Answered {
                        input: Input::Subscribed(group, Err(e)),
                        feed: None,
                    },
                };
            }
            Self::Heartbeat {
                node,
                incarnation,
                ttl,
                metadata,
                seen,
            } => Input::Heartbeat(
                store
                    .heartbeat(node, incarnation, ttl, &metadata, &seen)
                    .await,
            ),
            Self::HandOver {
                node,
                incarnation,
                keep,
            } => Input::HandedOver(store.hand_over(node, incarnation, keep).await),
            Self::Join {
                group,
                node,
                session,
            } => {
                let result = store.join(&group, node, session).await;
                Input::Joined(group, result)
            }
            Self::SetWeight {
                group,
                node,
                session,
                weight,
            } => {
                let result = store.set_weight(&group, node, session, weight).await;
                Input::WeightSet(group, result)
            }
            Self::Claim {
                group,
                node,
                session,
                want,
                takeover,
            } => {
                let result = store.claim(&group, node, session, want, takeover).await;
                Input::Claimed(group, result)
            }
            Self::Release {
                group,
                node,
                session,
                buckets,
            } => {
                let result = store.release(&group, node, session, &buckets).await;
                Input::Released(group, result)
            }
            Self::Leave {
                group,
                node,
                session,
            } => {
                let result = store.leave(&group, node, session).await;
                Input::Left(group, result)
            }
        };
        Answered { input, feed: None }
    }
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

/// An event for a group's application.
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
    /// A transient failure; the tick is retried after a backoff. `group` is the group whose
    /// call failed, `None` for the node's heartbeat (every group's application hears it).
    Error {
        /// The group, or `None` for the node.
        group: Option<GroupName>,
        /// What failed.
        error: WorkerError,
    },
    /// A claim won these many buckets.
    Claimed {
        /// The group.
        group: GroupName,
        /// How many.
        won: usize,
    },
    /// The application did not acknowledge the revocation of `bucket` within the limit: the
    /// bucket is kept (never released) until the node's session ends.
    Stuck {
        /// The group.
        group: GroupName,
        /// The bucket.
        bucket: Bucket,
    },
    /// The trust deadline passed with buckets held: they are being revoked, in every group.
    Fenced {
        /// How many, all groups together.
        owned: usize,
    },
    /// A tick completed.
    TickCompleted {
        /// How long it took, from its heartbeat's send time.
        took: Duration,
    },
    /// The store's clock moved between two heartbeats by more than the node's own clock
    /// allows (beyond half the safety margin): a step of the server's wall clock.
    ClockStep(ClockStep),
    /// The group was resized from the group's shard count: the node follows it, revoking and
    /// releasing its buckets of the old generation and sharing the new one's.
    Resized {
        /// The group.
        group: GroupName,
        /// The count the group had.
        from: ShardCount,
        /// The group's count now.
        to: ShardCount,
        /// The group's generation now.
        generation: Generation,
    },
    /// The node's session is a member of a group this node does not run (it took the session
    /// over from a predecessor that ran it): the node left it, so that the nodes running it
    /// share its buckets. An error is retried after the next heartbeat.
    LeftUnrun {
        /// The group.
        group: GroupName,
        /// How many buckets the leave released, or why it failed.
        released: Result<usize, WorkerError>,
    },
    /// The node's session was handed over (a graceful stop with `keep_on_stop`): a successor
    /// with the same node id takes it over, with its buckets, until `until`.
    HandedOver {
        /// When the session expires if no successor takes it over (store clock).
        until: Timestamp,
    },
    /// The group was missing from a heartbeat of the node's session: the node was made to
    /// leave it behind its back (an operator's forced release). Its buckets are revoked and
    /// the group joined again.
    Evicted {
        /// The group.
        group: GroupName,
    },
    /// What the group looked like at this heartbeat: made at every heartbeat that gives the
    /// group's view or says it is unchanged, so that a stall shows while nothing changes.
    Coverage {
        /// The group.
        group: GroupName,
        /// Buckets of the current generation no live member owns.
        unowned: u32,
        /// Buckets under quarantine.
        quarantined: u32,
        /// When the heartbeat was answered (the node's clock).
        at: Instant,
    },
}

/// A step of the store's clock, seen between two heartbeats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockStep {
    /// The store's clock jumped ahead by at least this much: sessions aged at once, so a
    /// session the store calls dead may still be trusted by its holder. The node takes no
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

#[derive(Debug)]
struct InFlight {
    call: StoreCall,
    sent: Instant,
    deadline: Instant,
    /// A leave of a group the node does not run (see `Machine::unrun`): its answer is the
    /// node's, whatever groups were added meanwhile.
    unrun: bool,
}

/// One group of the node: its count, what its application holds, what the store says.
#[derive(Debug)]
struct Group {
    name: GroupName,
    /// The group's shard count as the node follows it: the one it was added with, then each
    /// count the group was resized to.
    shards: ShardCount,
    /// The count the group's current generation was resized from, as of the last view.
    resized_from: Option<ShardCount>,
    /// Buckets of `held` that belong to a draining generation: revoked, released, never
    /// assigned.
    draining: BTreeSet<Bucket>,
    /// Buckets of the current generation the node holds under quarantine (Q2): let go like
    /// draining ones, with reason `quarantined`.
    quarantined: BTreeSet<Bucket>,
    /// Whether the node is a member under its current session, as far as the machine knows.
    member: bool,
    /// The last full view of the group the store gave, kept for "unchanged" answers, and the
    /// stamp to hand in with the next heartbeat.
    last: Option<GroupBeat>,
    stamp: Option<ViewStamp>,
    /// What the application has been told it owns.
    owned: Owned,
    /// What the store says the node owns under its session: the last heartbeat's word,
    /// updated by the claims and releases since.
    held: Owned,
    /// Revoked, not acknowledged yet.
    revoking: Revocations,
    /// Shed, acknowledged, to be released.
    unreleased: BTreeSet<Bucket>,
    /// Acknowledgements that never came in time: kept (never released, never assigned again)
    /// until the application acknowledges after all.
    stuck: BTreeMap<Bucket, Revoking>,
    /// The rest of the group's part of the tick (or of its removal).
    steps: Steps,
    /// An emitted delivery not yet handed back.
    pending: Option<Delivery>,
    /// A retry of a release that left buckets behind, and how many were made in this tick.
    release_retry: Option<Instant>,
    release_retries: u32,
    /// The highest bucket the release in flight names: the unreleased buckets above it are
    /// the next batch's.
    release_upto: Option<Bucket>,
    /// The size of the claim batch in flight when the plan wanted more than a batch.
    batch_of_more: Option<u32>,
    /// A claim this tick was restricted to unowned buckets and asked for this many: if it won
    /// fewer, it may have left wanted buckets of dead sessions, so tick when takeovers open.
    deferred_short: Option<u32>,
    /// Set once the group is being removed, with how it will end.
    removing: Option<Result<(), WorkerFailed>>,
    /// Why the application is told to stop, once the group is being removed.
    removal_reason: RevokeReason,
}

impl Group {
    fn new(name: GroupName, shards: ShardCount) -> Self {
        Self {
            name,
            shards,
            resized_from: None,
            draining: BTreeSet::new(),
            quarantined: BTreeSet::new(),
            member: false,
            last: None,
            stamp: None,
            owned: Owned::new(),
            held: Owned::new(),
            revoking: Revocations::default(),
            unreleased: BTreeSet::new(),
            stuck: BTreeMap::new(),
            steps: Steps::default(),
            pending: None,
            release_retry: None,
            release_retries: 0,
            release_upto: None,
            batch_of_more: None,
            deferred_short: None,
            removing: None,
            removal_reason: RevokeReason::Shutdown,
        }
    }

    fn is_idle(&self) -> bool {
        self.steps.is_empty() && self.pending.is_none()
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

    /// Revoke everything the application holds before anything else, for `reason`, but for
    /// what is on its way out already.
    fn revoke_all_first(&mut self, reason: RevokeReason) {
        let revokes = self.revocations(reason);
        for step in revokes.into_iter().rev() {
            if let Step::Deliver(Delivery::Revoke { bucket, .. }) = step
                && self.steps.revokes(bucket)
            {
                continue;
            }
            self.steps.push_front(step);
        }
    }

    fn drop_assignments_and_claims(&mut self) {
        self.steps
            .retain(|s| !matches!(s, Step::Deliver(Delivery::Assign { .. }) | Step::Claim(_)));
    }

    /// Drop the rest of the group's tick, keeping the revocations still to deliver (a fence's,
    /// a new session's). A group being removed keeps its whole removal.
    fn drop_tick(&mut self) {
        if self.removing.is_none() {
            self.steps.retain(Step::is_revoke);
        }
        self.release_retry = None;
    }

    /// Add `step` to the group's current work, before its end; start a small run when idle.
    /// Whether a run was started.
    fn insert_step(&mut self, step: Step) -> bool {
        if self.is_idle() {
            self.steps.push_back(step);
            self.steps.push_back(Step::EndTick);
            true
        } else {
            self.steps.insert_before_end(step);
            false
        }
    }

    /// Begin removing the group: revoke everything (`reason`), wait for the acknowledgements,
    /// leave, finish with `ended`.
    fn begin_removal(&mut self, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
        self.removing = Some(ended);
        self.removal_reason = reason;
        // Revocations already queued (a fence) go first; nothing else of the tick.
        self.steps.retain(Step::is_revoke);
        self.release_retry = None;
        let revokes = self.revocations(reason);
        self.steps.extend(revokes);
        self.steps.push_back(Step::AwaitAcks);
        self.steps.push_back(Step::Leave);
        self.steps.push_back(Step::Finish);
    }

    /// A heartbeat of the node's session, for a group being removed: its stamp is kept (so
    /// that the store may answer "unchanged" while the removal lasts), and if the heartbeat
    /// does not list the group, the node was evicted from it behind its back (an operator's
    /// forced release): its buckets are free for others, so what is still to be revoked is
    /// lost, not shut down.
    fn removing_beat(&mut self, beat: &Heartbeat) {
        if let Some(given) = beat.group(&self.name) {
            self.stamp = Some(given.stamp);
        } else if let Some(u) = beat.unchanged.iter().find(|u| u.group == self.name) {
            self.stamp = Some(u.stamp);
        } else if self.member {
            self.steps.set_revoke_reasons(RevokeReason::Lost);
            self.revoke_all_first(RevokeReason::Lost);
            self.removal_reason = RevokeReason::Lost;
            self.member = false;
            self.held.clear();
            self.unreleased.clear();
            self.last = None;
            self.stamp = None;
        }
    }

    /// The node's session is not the one the group's state was held under: nothing held is
    /// ours any more, nor to be released, and the group must be joined again.
    fn lose_session(&mut self) {
        // Someone else may hold them already: the revocations still queued say so too, never
        // a reason (a shed, a shutdown) that lets the application act as if it still held the
        // bucket, such as write a last checkpoint.
        self.steps.set_revoke_reasons(RevokeReason::Expired);
        self.revoke_all_first(RevokeReason::Expired);
        if self.removing.is_some() {
            // An assignment still being delivered is revoked as expired too.
            self.removal_reason = RevokeReason::Expired;
        }
        self.unreleased.clear();
        self.held.clear();
        self.draining.clear();
        self.quarantined.clear();
        self.member = false;
        self.last = None;
        self.stamp = None;
    }
}

/// What a group's steps need to know of the node.
#[derive(Clone, Copy)]
struct NodeState {
    session: Option<SessionId>,
    trusted: bool,
    renewal_due: bool,
    ack_limit: Option<Duration>,
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
    /// Whether a graceful stop hands the session over, and how far it got.
    handing_over: HandingOver,
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
    /// Why the node is stopping (`Ok`: it was asked to), once it is.
    stopping: Option<Result<(), WorkerFailed>>,
    finished: bool,
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
            handing_over: HandingOver::No,
            stuck_seen: false,
            leave_skipped: false,
            unrun: Vec::new(),
            fenced: false,
            steady_since: None,
            last_beat: None,
            ahead: VecDeque::new(),
            reports: VecDeque::new(),
            stopping: None,
            finished: false,
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

    /// Add `group`, split into `shards` buckets: it is created in the store if needed
    /// ([`StoreCall::EnsureGroup`]; a refusal, such as another shard count, ends it with
    /// [`Output::GroupFinished`]), subscribed to ([`StoreCall::Subscribe`]), then joined (at
    /// once, or at the next tick, due at once, when the node has no session yet) and shared
    /// from the heartbeat after. False (nothing changes) if the node has the group already
    /// (being added or removed included) or is stopping.
    pub fn add_group(&mut self, group: GroupName, shards: ShardCount) -> bool {
        if self.finished
            || self.stopping.is_some()
            || self.index(&group).is_some()
            || self.admitting_index(&group).is_some()
        {
            return false;
        }
        self.admitting.push(Admitting {
            name: group,
            shards,
            ensured: false,
            cancelled: false,
        });
        true
    }

    fn admitting_index(&self, group: &GroupName) -> Option<usize> {
        self.admitting.iter().position(|a| &a.name == group)
    }

    /// The next call of a group being admitted; the caller checked that no call is in flight.
    fn admission_call(&mut self, now: Instant) -> Option<Output> {
        let a = self.admitting.iter().find(|a| !a.cancelled)?;
        let group = a.name.clone();
        let call = if a.ensured {
            StoreCall::Subscribe { group }
        } else {
            StoreCall::EnsureGroup {
                group,
                shards: a.shards,
            }
        };
        Some(self.call(now, call))
    }

    fn on_ensured(&mut self, group: &GroupName, result: Result<(), StoreError>) {
        let Some(k) = self.admitting_index(group) else {
            return;
        };
        match result {
            Ok(()) if !self.admitting[k].cancelled => self.admitting[k].ensured = true,
            Ok(()) => {
                let a = self.admitting.remove(k);
                self.ended_early.push_back((a.name, Ok(())));
            }
            Err(e) => {
                // Refused (another shard count) or not answered: the caller of the add hears
                // why; nothing was joined, so nothing is to be left.
                let a = self.admitting.remove(k);
                self.ended_early
                    .push_back((a.name, Err(WorkerFailed::Store(e))));
            }
        }
    }

    /// The group's subscription answered: a feed only speeds re-plans up, so whatever the
    /// answer, the group is the node's now.
    fn on_subscribed(&mut self, now: Instant, group: &GroupName) {
        let Some(k) = self.admitting_index(group) else {
            return;
        };
        let a = self.admitting.remove(k);
        if a.cancelled || self.stopping.is_some() {
            self.ended_early.push_back((a.name, Ok(())));
        } else {
            self.join_group(now, a.name, a.shards);
        }
    }

    /// An admitted group becomes the node's: joined at once if the node has a session, at
    /// the next tick (due at once) otherwise.
    fn join_group(&mut self, now: Instant, group: GroupName, shards: ShardCount) {
        let mut added = Group::new(group, shards);
        if self.session.is_some() {
            // The node has a session: join at once; the next heartbeat, at once after,
            // gives the view.
            added.steps.push_back(Step::Join);
            added.steps.push_back(Step::EndTick);
            self.open = true;
            self.groups.push(added);
        } else {
            // The next tick starts a session and joins.
            let idle = self.is_idle();
            self.groups.push(added);
            if idle {
                self.next_tick = Some(self.next_tick.map_or(now, |t| t.min(now)));
            } else {
                self.again = true;
            }
        }
    }

    /// Stop admitting the group at `k`: at once, or when its call in flight answers.
    fn cancel_admission(&mut self, k: usize) {
        let in_flight = self
            .in_flight
            .as_ref()
            .and_then(|f| f.call.group())
            .is_some_and(|g| g == &self.admitting[k].name);
        if in_flight {
            self.admitting[k].cancelled = true;
        } else {
            let a = self.admitting.remove(k);
            self.ended_early.push_back((a.name, Ok(())));
        }
    }

    /// The next weight to write: a group's whose weight the application set and the store
    /// has not been told under the node's session, once the node is a member there.
    fn weight_call(&mut self, now: Instant) -> Option<Output> {
        if self.stopping.is_some() {
            return None;
        }
        let session = self.session?;
        let group = self
            .weight_unsent
            .iter()
            .find(|name| {
                self.group(name)
                    .is_some_and(|g| g.member && g.removing.is_none())
            })?
            .clone();
        self.weight_unsent.remove(&group);
        let weight = *self.weights.get(&group)?;
        let node = self.rules.node;
        Some(self.call(
            now,
            StoreCall::SetWeight {
                group,
                node,
                session,
                weight,
            },
        ))
    }

    /// Whether a weight set for `group` is still to be written under the node's current
    /// membership (it is written at the next call the node makes).
    pub fn weight_pending(&self, group: &GroupName) -> bool {
        self.weight_unsent.contains(group)
            && self.session.is_some()
            && self.group(group).is_some_and(|g| g.member)
    }

    /// Remove `group`: revoke everything its application holds (shutdown), wait for the
    /// acknowledgements, leave it, then [`Output::GroupFinished`]. False if the node has no
    /// such group, or is removing it already.
    pub fn remove_group(&mut self, group: &GroupName) -> bool {
        if let Some(k) = self.admitting_index(group) {
            if self.admitting[k].cancelled {
                return false;
            }
            self.cancel_admission(k);
            return true;
        }
        match self.index(group) {
            Some(i) if self.groups[i].removing.is_none() => {
                self.groups[i].begin_removal(Ok(()), RevokeReason::Shutdown);
                true
            }
            _ => false,
        }
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
        self.finished
    }

    /// Whether the node is stopping (or stopped).
    pub fn is_stopping(&self) -> bool {
        self.stopping.is_some() || self.finished
    }

    /// Whether a tick is under way (or the node is stopping), as opposed to waiting for the
    /// next one.
    pub fn is_busy(&self) -> bool {
        !self.is_idle() || self.stopping.is_some()
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
        if self.stopping.is_some()
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
        if self.stopping.is_some()
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
            || (self.stopping.is_none() && self.has_active_groups())
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
        if self.finished {
            return None;
        }
        let fence = (self.owned_total() > 0 && !self.fenced)
            .then_some(self.trusted_until)
            .flatten();
        let idle = self.is_idle();
        let ticking = idle && self.stopping.is_none() && self.has_active_groups();
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
            release_retry.filter(|_| idle && self.stopping.is_none()),
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
        if self.finished {
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
                if self.take_call(Operation::Join, Some(&group)).is_some()
                    && let Some(i) = self.index(&group)
                {
                    self.on_joined(now, i, result);
                }
            }
            Input::Claimed(group, result) => {
                if self.take_call(Operation::Claim, Some(&group)).is_some()
                    && let Some(i) = self.index(&group)
                {
                    self.on_claimed(now, i, result);
                }
            }
            Input::Released(group, result) => {
                if self.take_call(Operation::Release, Some(&group)).is_some()
                    && let Some(i) = self.index(&group)
                {
                    self.on_released(now, i, result);
                }
            }
            Input::HandedOver(result) => {
                if self.take_call(Operation::HandOver, None).is_some() {
                    self.handing_over = HandingOver::Done;
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
                self.handing_over = HandingOver::Done;
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
        if self.is_idle() && self.stopping.is_none() {
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

    /// The next thing to do at `now`, if any. Call it until it returns `None`, then wait for
    /// an input or for [`poll_timeout`](Self::poll_timeout).
    pub fn poll(&mut self, now: Instant) -> Option<Output> {
        if let Some(report) = self.reports.pop_front() {
            return Some(Output::Report(report));
        }
        if let Some((group, ended)) = self.ended_early.pop_front() {
            return Some(Output::GroupFinished(group, ended));
        }
        if self.finished {
            return None;
        }
        loop {
            // Each group's deliveries and the steps that need no store call.
            for i in 0..self.groups.len() {
                if let Some(out) = self.advance(now, i) {
                    return Some(out);
                }
            }
            if self.in_flight.is_some() {
                break;
            }
            // The heartbeat before any group's call: the groups' calls act on its answer.
            if self.heartbeat_wanted
                || self.busy_renewal_at().is_some_and(|t| now >= t)
                || self.busy_wake_at().is_some_and(|t| now >= t)
                || self.winding_down_renewal_at().is_some_and(|t| now >= t)
            {
                return Some(self.heartbeat_call(now));
            }
            // Groups being added, then weights to write: each one call, between ticks' calls.
            if let Some(out) = self.admission_call(now) {
                return Some(out);
            }
            if let Some(out) = self.weight_call(now) {
                return Some(out);
            }
            // A group of the session the node does not run: leave it first (checked again
            // now, as it may have been added since the heartbeat), also on a stop, unless the
            // session is handed over (the successor decides).
            if let Some(session) = self.session
                && !matches!(self.handing_over, HandingOver::Due(_) | HandingOver::Sent)
                && let Some(group) = self.unrun.pop()
            {
                if self.index(&group).is_none() && self.admitting_index(&group).is_none() {
                    let node = self.rules.node;
                    let out = self.call(
                        now,
                        StoreCall::Leave {
                            group,
                            node,
                            session,
                        },
                    );
                    if let Some(f) = &mut self.in_flight {
                        f.unrun = true;
                    }
                    return Some(out);
                }
                continue;
            }
            // One group's call, the groups taking turns.
            let n = self.groups.len();
            let mut skipped = false;
            for k in 0..n {
                let i = (self.cursor + k) % n;
                let g = &self.groups[i];
                if g.pending.is_some() || !g.steps.front().is_some_and(Step::is_call) {
                    continue;
                }
                if matches!(g.steps.front(), Some(Step::Leave))
                    && matches!(self.handing_over, HandingOver::Due(_))
                    && self.revocations_outstanding()
                {
                    // Whether the groups leave or hand over is decided for all of them at
                    // once, when no revocation is outstanding in any group: one that gets
                    // stuck meanwhile means no hand-over, and then every group leaves.
                    continue;
                }
                match self.call_step(now, i) {
                    Some(out) => {
                        self.cursor = (i + 1) % n;
                        return Some(out);
                    }
                    None => {
                        // The step had nothing to do: the group's next steps may go on.
                        skipped = true;
                        break;
                    }
                }
            }
            if !skipped {
                break;
            }
        }
        if self.stopping.is_some()
            && self.groups.is_empty()
            && self.admitting.is_empty()
            && self.in_flight.is_none()
            && let HandingOver::Due(keep) = self.handing_over
        {
            if self.stuck_seen || !self.leave_skipped {
                // Nothing to hand over, or a bucket is stuck (see `stuck_seen`).
                self.handing_over = HandingOver::No;
            } else {
                self.handing_over = HandingOver::Sent;
                let call = StoreCall::HandOver {
                    node: self.rules.node,
                    incarnation: self.rules.incarnation,
                    keep,
                };
                return Some(self.call(now, call));
            }
        }
        if self.stopping.is_some()
            && self.groups.is_empty()
            && self.admitting.is_empty()
            && self.in_flight.is_none()
            && self.handing_over != HandingOver::Sent
        {
            self.finished = true;
            let ended = self.stopping.take().unwrap_or(Ok(()));
            return Some(Output::Finished(ended));
        }
        if self.open && self.is_idle() {
            self.open = false;
            self.end_tick(now);
            return self.reports.pop_front().map(Output::Report);
        }
        None
    }

    /// Work through group `i`'s steps that need no store call: its next delivery (one pending
    /// at a time), the end of its tick, the wait for acknowledgements, its end.
    fn advance(&mut self, now: Instant, i: usize) -> Option<Output> {
        let own_call = self
            .in_flight
            .as_ref()
            .and_then(|f| f.call.group())
            .is_some_and(|g| g == &self.groups[i].name);
        loop {
            let node = self.node_state(now);
            let g = &mut self.groups[i];
            if g.pending.is_some() {
                return None;
            }
            match g.steps.front() {
                None => return None,
                Some(Step::Deliver(d)) => {
                    let d = *d;
                    // A revocation goes out even while the group's call is in flight (the
                    // trust deadline's must); an assignment waits for the call's answer.
                    if own_call && matches!(d, Delivery::Assign { .. }) {
                        return None;
                    }
                    g.steps.pop_front();
                    if let Some(out) = self.emit(now, node, i, d) {
                        return Some(out);
                    }
                }
                Some(Step::EndTick) => {
                    g.steps.pop_front();
                }
                Some(Step::AwaitAcks) => {
                    if !g.revoking.is_empty() {
                        // Leave only once every revocation was acknowledged or given up on.
                        return None;
                    }
                    g.steps.pop_front();
                }
                Some(Step::Finish) => {
                    if own_call {
                        return None;
                    }
                    let g = self.groups.remove(i);
                    if self.cursor > i {
                        self.cursor -= 1;
                    }
                    let ended = g.removing.unwrap_or(Ok(()));
                    return Some(Output::GroupFinished(g.name, ended));
                }
                Some(_) => return None,
            }
        }
    }

    /// Make group `i`'s next step, a store call, if there is one to make; `None` when the step
    /// had nothing to do (it is dropped).
    fn call_step(&mut self, now: Instant, i: usize) -> Option<Output> {
        let step = self.groups[i].steps.pop_front()?;
        let group = self.groups[i].name.clone();
        let session = self.session?;
        let node = self.rules.node;
        let call = match step {
            Step::Join => StoreCall::Join {
                group,
                node,
                session,
            },
            Step::Release => {
                let g = &mut self.groups[i];
                if g.unreleased.is_empty() {
                    return None;
                }
                let buckets: Vec<Bucket> =
                    g.unreleased.iter().copied().take(RELEASE_BATCH).collect();
                g.release_upto = buckets.last().copied();
                StoreCall::Release {
                    group,
                    node,
                    session,
                    buckets,
                }
            }
            Step::Claim(want) => {
                if !self.trusted(now) || self.renewal_due(now) {
                    // The next heartbeat (due, or at once) plans again.
                    self.again = true;
                    return None;
                }
                let batch = want.min(CLAIM_BATCH);
                let takeover = match self.last_sent {
                    // The store's clock was watched up to the heartbeat sent at `sent`: from
                    // there to the claim, the store checks that its clock moved no more than
                    // ours did (give or take the tolerance), so a step in between defers the
                    // takeover.
                    Some(sent) if self.takeover_opens().is_some_and(|t| now >= t) => {
                        Takeover::AllowedWithin(
                            now.saturating_duration_since(sent) + self.rules.safety_margin / 2,
                        )
                    }
                    _ => Takeover::Deferred,
                };
                let g = &mut self.groups[i];
                g.batch_of_more = (batch < want).then_some(batch);
                g.deferred_short = (takeover == Takeover::Deferred).then_some(batch);
                StoreCall::Claim {
                    group,
                    node,
                    session,
                    want: batch,
                    takeover,
                }
            }
            Step::Leave => match self.handing_over {
                // The membership goes to the successor with the session.
                HandingOver::Due(_) if !self.stuck_seen => {
                    self.leave_skipped = true;
                    return None;
                }
                HandingOver::Due(_) => {
                    // A stuck bucket: no hand-over; every group leaves (the decision waited
                    // until no revocation was outstanding in any group, see `poll`).
                    self.handing_over = HandingOver::No;
                    StoreCall::Leave {
                        group,
                        node,
                        session,
                    }
                }
                _ => StoreCall::Leave {
                    group,
                    node,
                    session,
                },
            },
            _ => return None,
        };
        Some(self.call(now, call))
    }

    fn heartbeat_call(&mut self, now: Instant) -> Output {
        self.heartbeat_wanted = false;
        self.next_tick = None;
        self.woken = false;
        self.woken_at = None;
        self.again = false;
        self.open = true;
        let seen = self
            .groups
            .iter()
            .filter(|g| g.member && (g.last.is_some() || g.removing.is_some()))
            .filter_map(|g| {
                g.stamp.map(|stamp| GroupStamp {
                    group: g.name.clone(),
                    stamp,
                })
            })
            .collect();
        let call = StoreCall::Heartbeat {
            node: self.rules.node,
            incarnation: self.rules.incarnation,
            ttl: self.rules.ttl,
            metadata: self.rules.metadata.clone(),
            seen,
        };
        self.call(now, call)
    }

    /// Emit a delivery of group `i` at `now` if it still applies; `None` when it was dropped.
    fn emit(&mut self, now: Instant, node: NodeState, i: usize, d: Delivery) -> Option<Output> {
        let stopping = self.stopping.is_some();
        let g = &mut self.groups[i];
        match d {
            Delivery::Assign { bucket, token } => {
                // Assign only what the store (as of the latest answer) says is ours with that
                // token, and what the application does not hold already.
                if g.removing.is_some()
                    || stopping
                    || g.held.get(&bucket) != Some(&token)
                    || g.draining.contains(&bucket)
                    || g.quarantined.contains(&bucket)
                    || g.owned.contains_key(&bucket)
                {
                    return None;
                }
                if !node.trusted || node.renewal_due {
                    // Past the trust deadline, or a renewal is due: assign nothing more now.
                    // The heartbeat due renews, and the group assigns what is still ours.
                    g.drop_assignments_and_claims();
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
                if g.owned.get(&bucket) != Some(&token) {
                    return None;
                }
                // At or past the trust deadline the lease may be someone else's already: the
                // application hears that the node fenced (or that the session ended, or the
                // bucket was lost), never a reason (a shutdown, a shed) that would let it act
                // as if it still held the bucket, such as write a last checkpoint.
                let reason = if node.trusted
                    || matches!(reason, RevokeReason::Lost | RevokeReason::Expired)
                {
                    reason
                } else {
                    RevokeReason::Fenced
                };
                g.owned.remove(&bucket);
                g.revoking.insert(
                    bucket,
                    Revoking {
                        reason,
                        session: node.session,
                        deadline: node.ack_limit.map(|limit| now + limit),
                    },
                );
                let d = Delivery::Revoke {
                    bucket,
                    token,
                    reason,
                };
                g.pending = Some(d);
                return Some(Output::Deliver(g.name.clone(), d));
            }
        }
        g.pending = Some(d);
        Some(Output::Deliver(g.name.clone(), d))
    }

    fn on_delivered(&mut self, now: Instant, i: usize) {
        let trusted = self.trusted(now);
        let g = &mut self.groups[i];
        if let Some(Delivery::Assign { bucket, token }) = g.pending.take() {
            g.owned.insert(bucket, token);
            if g.removing.is_some() {
                // Told while the group's removal began: it is revoked with the rest, before the
                // group is left.
                g.steps.push_front(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: g.removal_reason,
                }));
            } else if !trusted {
                // The application took its time past the trust deadline: nothing held can be
                // trusted now, this bucket included.
                if self.fenced {
                    g.steps.push_front(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason: RevokeReason::Fenced,
                    }));
                } else {
                    self.fence();
                }
            } else if g.held.get(&bucket) != Some(&token) && !g.steps.revokes(bucket) {
                // A heartbeat answered while the application was being told, and the store
                // no longer says the bucket is ours: take it back at once.
                g.steps.push_front(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: RevokeReason::Lost,
                }));
            }
        }
    }

    fn on_acked(&mut self, i: usize, bucket: Bucket) {
        let stopping = self.stopping.is_some();
        let session = self.session;
        let g = &mut self.groups[i];
        // A late acknowledgement frees a stuck bucket too.
        let revoked = g
            .revoking
            .remove(&bucket)
            .or_else(|| g.stuck.remove(&bucket));
        let leaving = stopping || g.removing.is_some();
        // A shed (or resharded) bucket is released once acknowledged, if it is still held
        // under the session it was let go from, and so is a bucket of a draining generation
        // however it was revoked; any other acknowledged bucket the store says is ours is
        // assigned again.
        let release = revoked.is_some_and(|r| {
            matches!(
                r.reason,
                RevokeReason::Shed
                    | RevokeReason::Resharded
                    | RevokeReason::Drained
                    | RevokeReason::Quarantined
            ) && r.session == session
        }) || ((g.draining.contains(&bucket) || g.quarantined.contains(&bucket))
            && g.held.contains_key(&bucket));
        if leaving {
            return;
        }
        let started = if release {
            g.unreleased.insert(bucket);
            if g.steps.has_release() {
                false
            } else {
                // Acknowledged after this tick's release went out (or between ticks): release
                // it now rather than a renew interval later.
                g.insert_step(Step::Release)
            }
        } else {
            // Revoked for another reason (a fence, say) and still ours in the store: the
            // application gets it back in this tick rather than at the next.
            match g.held.get(&bucket) {
                Some(&token)
                    if !g.owned.contains_key(&bucket) && !g.unreleased.contains(&bucket) =>
                {
                    g.insert_step(Step::Deliver(Delivery::Assign { bucket, token }))
                }
                _ => false,
            }
        };
        self.open |= started;
    }

    /// Revoke everything every group's application holds: the leases are not trusted any more.
    fn fence(&mut self) {
        self.fenced = true;
        self.reports.push_back(Report::Fenced {
            owned: self.owned_total(),
        });
        for g in &mut self.groups {
            // No assignment may follow untrusted leases in this tick.
            g.drop_assignments_and_claims();
            g.revoke_all_first(RevokeReason::Fenced);
        }
    }

    fn call(&mut self, now: Instant, call: StoreCall) -> Output {
        self.in_flight = Some(InFlight {
            call: call.clone(),
            sent: now,
            deadline: now + self.rules.call_timeout,
            unrun: false,
        });
        Output::Call(call)
    }

    /// The send time of the call in flight, if it is `op`'s for `group`; an answer nobody
    /// waits for any more is dropped.
    fn take_call(&mut self, op: Operation, group: Option<&GroupName>) -> Option<Instant> {
        match &self.in_flight {
            Some(f) if f.call.operation() == op && f.call.group() == group => {
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
            Err(e) => return self.on_store_error(now, None, Operation::Heartbeat, e),
        };
        if self.stopping.is_some() {
            // Stopping: the session keeps the applications' leases trusted until their
            // revocations are acknowledged, and it is the one to leave (or hand over).
            self.failures = 0;
            self.last_sent = Some(sent);
            if self.session == Some(beat.session) {
                self.trusted_until =
                    Some(sent + self.rules.ttl.as_duration() - self.rules.safety_margin);
                self.fenced = false;
            } else {
                // A new session: nothing held before is ours any more; what is still to be
                // revoked has expired.
                self.session = Some(beat.session);
                for g in &mut self.groups {
                    g.lose_session();
                }
            }
            for g in &mut self.groups {
                g.removing_beat(&beat);
            }
            return;
        }
        self.failures = 0;
        self.observe_clock(sent, now, beat.observed_at);
        self.last_sent = Some(sent);
        self.trusted_until = Some(sent + self.rules.ttl.as_duration() - self.rules.safety_margin);
        self.fenced = false;
        if self.session != Some(beat.session) {
            // A new session (or one whose start this node never heard of): nothing held
            // before is ours any more, in any group, nor to be released; and it is a member of
            // no group.
            self.session = Some(beat.session);
            for g in &mut self.groups {
                g.lose_session();
            }
        }
        // A session taken over from a predecessor (HO3) keeps the predecessor's memberships,
        // some perhaps of groups this node does not run: nobody would work their buckets.
        self.unrun = beat
            .groups
            .iter()
            .map(|g| &g.group)
            .chain(beat.unchanged.iter().map(|u| &u.group))
            .filter(|&name| self.index(name).is_none() && self.admitting_index(name).is_none())
            .cloned()
            .collect();
        for i in 0..self.groups.len() {
            if self.groups[i].removing.is_some() {
                self.groups[i].removing_beat(&beat);
                continue;
            }
            let name = self.groups[i].name.clone();
            let given = beat.group(&name).cloned();
            let unchanged = beat
                .unchanged
                .iter()
                .find(|u| u.group == name)
                .map(|u| u.stamp);
            let g = &mut self.groups[i];
            let view = match (given, unchanged) {
                (Some(given), _) => {
                    g.stamp = Some(given.stamp);
                    g.last = Some(given.clone());
                    Some(given)
                }
                (None, Some(stamp)) => match g.last.clone() {
                    // Unchanged since the view it was last given (contract rule H8); its
                    // leases now expire with the renewed session.
                    Some(mut last) => {
                        g.stamp = Some(stamp);
                        for lease in &mut last.owned {
                            lease.expires_at = beat.expires_at;
                        }
                        g.last = Some(last.clone());
                        Some(last)
                    }
                    None => {
                        // Unchanged since a view this node no longer has: ask for it.
                        g.stamp = None;
                        g.drop_tick();
                        g.steps.push_back(Step::EndTick);
                        self.again = true;
                        continue;
                    }
                },
                (None, None) => None,
            };
            match view {
                Some(view) => {
                    g.member = true;
                    self.reconcile(now, i, &view);
                }
                None => {
                    if g.member {
                        // Left behind the node's back (an operator evicted it): what it held
                        // there was released with the membership.
                        self.reports.push_back(Report::Evicted {
                            group: name.clone(),
                        });
                        g.drop_tick();
                        // What is still to be revoked (a shed, say) is free for others too.
                        g.steps.set_revoke_reasons(RevokeReason::Lost);
                        g.revoke_all_first(RevokeReason::Lost);
                        g.held.clear();
                        g.unreleased.clear();
                        g.draining.clear();
                    } else {
                        g.drop_tick();
                    }
                    g.member = false;
                    g.last = None;
                    g.stamp = None;
                    // Join once the revocations are out; claim once a heartbeat gives the
                    // view.
                    g.steps.push_back(Step::Join);
                    g.steps.push_back(Step::EndTick);
                }
            }
        }
    }

    /// Plan group `i` on the store's word about it: its view and the node's leases in it.
    fn reconcile(&mut self, now: Instant, i: usize, beat: &GroupBeat) {
        let node = self.rules.node;
        let owned: u32 = beat.view.members.iter().map(|m| m.owned).sum();
        self.reports.push_back(Report::Coverage {
            group: self.groups[i].name.clone(),
            unowned: beat.view.shard_count.get().saturating_sub(owned),
            quarantined: beat.view.quarantined,
            at: now,
        });
        let g = &mut self.groups[i];
        if beat.view.shard_count != g.shards {
            if beat.view.previous == Some(g.shards) {
                // Resized from the count the group routes by: follow it.
                self.reports.push_back(Report::Resized {
                    group: g.name.clone(),
                    from: g.shards,
                    to: beat.view.shard_count,
                    generation: beat.view.generation,
                });
                g.shards = beat.view.shard_count;
            } else {
                // The group was deleted and created again with another count (or resized
                // from one the group never had): the buckets this group routes by are not
                // the store's. Retrying cannot help.
                let mismatch = StoreError::ShardCountMismatch {
                    group: g.name.clone(),
                    configured: g.shards,
                    found: beat.view.shard_count,
                };
                g.held = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
                return self.fail_group(i, Err(WorkerFailed::Store(mismatch)), RevokeReason::Lost);
            }
        }
        g.resized_from = beat.view.previous;
        g.draining = beat.draining_buckets().into_iter().collect();
        g.quarantined = beat.quarantined.iter().copied().collect();
        let held: Owned = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
        g.held.clone_from(&held);
        // Revocations still queued (a fence's, a new session's) stay first; their buckets are
        // on their way out, neither kept nor assigned again in this tick.
        g.steps.retain(Step::is_revoke);
        let out = &g.steps;
        // What the application was told it owns: an assignment still being delivered counts
        // (the heartbeat went out while a handler worked), so it is never released unrevoked.
        let mut told = g.owned.clone();
        if let Some(Delivery::Assign { bucket, token }) = g.pending {
            told.insert(bucket, token);
        }
        let mut steps: Vec<Step> = Vec::new();
        for (&bucket, &token) in &g.owned {
            if held.get(&bucket) != Some(&token) && !out.revokes(bucket) {
                steps.push(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: RevokeReason::Lost,
                }));
            }
        }
        // What is not held any more needs no release.
        g.unreleased.retain(|b| held.contains_key(b));
        // The application is told of what the store says is ours and it does not hold (a
        // claim whose answer was lost, leases kept alive that it fenced), unless it is on its
        // way out.
        let mut assigning: BTreeMap<Bucket, FencingToken> = BTreeMap::new();
        // Buckets of a draining generation and buckets under quarantine are let go: revoked
        // first if the application holds them, released at once if it does not.
        let mut let_go: Vec<Step> = Vec::new();
        for (&bucket, &token) in &held {
            let holds_it = !out.revokes(bucket) && told.get(&bucket) == Some(&token);
            let busy = g.unreleased.contains(&bucket)
                || g.revoking.contains_key(&bucket)
                || g.stuck.contains_key(&bucket)
                || out.revokes(bucket);
            let letting_go = if g.draining.contains(&bucket) {
                Some(RevokeReason::Resharded)
            } else if g.quarantined.contains(&bucket) {
                Some(RevokeReason::Quarantined)
            } else {
                None
            };
            if let Some(reason) = letting_go {
                if holds_it {
                    let_go.push(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason,
                    }));
                } else if !busy {
                    g.unreleased.insert(bucket);
                }
            } else if !holds_it && !busy {
                assigning.insert(bucket, token);
            }
        }
        // The plan counts what the group will hold once this tick's revocations and
        // assignments are done: what the store says, less what is on its way out.
        let keeping: Vec<Bucket> = held
            .keys()
            .copied()
            .filter(|b| {
                !g.draining.contains(b)
                    && !g.quarantined.contains(b)
                    && !g.unreleased.contains(b)
                    && !g.revoking.contains_key(b)
                    && !g.stuck.contains_key(b)
                    && !out.revokes(*b)
            })
            .collect();
        let plan = policy::plan(&beat.view, node, &keeping);
        // An operator's drain (or weight 0) is why this node sheds, not the fair share.
        let shed_reason = match beat.view.members.iter().find(|m| m.worker == node) {
            Some(me) if me.mode == MemberMode::Draining || me.weight == 0 => RevokeReason::Drained,
            _ => RevokeReason::Shed,
        };
        let mut shed_now: Vec<Step> = let_go;
        for bucket in &plan.shed {
            if assigning.remove(bucket).is_some() {
                // Never handed to the application: it can go at once.
                g.unreleased.insert(*bucket);
            } else if let Some(&token) = told.get(bucket) {
                shed_now.push(Step::Deliver(Delivery::Revoke {
                    bucket: *bucket,
                    token,
                    reason: shed_reason,
                }));
            }
        }
        steps.extend(
            assigning
                .into_iter()
                .map(|(bucket, token)| Step::Deliver(Delivery::Assign { bucket, token })),
        );
        if !g.unreleased.is_empty() {
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
        g.steps.extend(steps);
    }

    fn on_joined(&mut self, now: Instant, i: usize, result: Result<(), StoreError>) {
        if self.stopping.is_some() || self.groups[i].removing.is_some() {
            // Its leave follows.
            return;
        }
        match result {
            Ok(()) => {
                let g = &mut self.groups[i];
                g.member = true;
                g.last = None;
                g.stamp = None;
                // A weight the application set is written under every new membership (over
                // an operator's `leasectl weight` meanwhile).
                if self.weights.contains_key(&g.name) {
                    self.weight_unsent.insert(g.name.clone());
                }
                // The next heartbeat gives the group's view: tick again at once.
                self.again = true;
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Join, e),
        }
    }

    fn on_released(&mut self, now: Instant, i: usize, result: Result<Vec<Bucket>, StoreError>) {
        if self.stopping.is_some() || self.groups[i].removing.is_some() {
            return;
        }
        match result {
            Ok(released) => {
                let g = &mut self.groups[i];
                for bucket in &released {
                    g.unreleased.remove(bucket);
                    g.held.remove(bucket);
                }
                let upto = g.release_upto.take();
                if let Some(upto) = upto
                    && g.unreleased
                        .range((Excluded(upto), Unbounded))
                        .next()
                        .is_some()
                {
                    // The next batch, at once.
                    g.steps.push_front(Step::Release);
                }
                // The store may skip a row another transaction holds for an instant (a claim
                // re-checking it): a few quick retries release it. An application's fencing
                // transaction may hold it longer: then the next tick retries.
                let skipped = upto.is_none_or(|upto| g.unreleased.range(..=upto).next().is_some());
                if skipped && g.release_retries < RELEASE_RETRIES {
                    g.release_retries += 1;
                    g.release_retry = Some(now + RELEASE_RETRY);
                }
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Release, e),
        }
    }

    fn on_claimed(&mut self, now: Instant, i: usize, result: Result<Vec<Lease>, StoreError>) {
        if self.stopping.is_some() || self.groups[i].removing.is_some() {
            // What was won goes with the leave.
            return;
        }
        match result {
            Ok(won) => {
                let g = &mut self.groups[i];
                self.reports.push_back(Report::Claimed {
                    group: g.name.clone(),
                    won: won.len(),
                });
                let all = |asked: u32| u32::try_from(won.len()).is_ok_and(|n| n >= asked);
                if g.deferred_short.is_some_and(all) {
                    // It won all it asked for: nothing wanted was left behind.
                    g.deferred_short = None;
                }
                g.held.extend(won.iter().map(|l| (l.bucket, l.token)));
                if g.batch_of_more.take().is_some_and(all) {
                    // A full batch and more wanted: tick again at once, on a fresh view.
                    self.again = true;
                }
                // A bucket whose earlier revocation the application has not acknowledged is
                // held, not assigned: it is assigned at a tick after the acknowledgement.
                let assigns: Vec<Step> = won
                    .iter()
                    .filter(|l| {
                        !g.revoking.contains_key(&l.bucket) && !g.stuck.contains_key(&l.bucket)
                    })
                    .map(|l| {
                        Step::Deliver(Delivery::Assign {
                            bucket: l.bucket,
                            token: l.token,
                        })
                    })
                    .collect();
                for step in assigns.into_iter().rev() {
                    g.steps.push_front(step);
                }
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Claim, e),
        }
    }

    fn on_left(&mut self, i: usize, result: Result<Vec<Bucket>, StoreError>) {
        if let Err(e) = result {
            let source = WorkerError::Store {
                operation: Operation::Leave,
                source: e,
            };
            self.on_leave_failed(i, source);
        }
    }

    /// A leave that failed or did not answer: a group removed on request ends with the
    /// failure; one ending for another reason keeps that reason, and the failure is reported.
    fn on_leave_failed(&mut self, i: usize, source: WorkerError) {
        let g = &mut self.groups[i];
        if matches!(g.removing, Some(Ok(()))) {
            g.removing = Some(Err(WorkerFailed::LeaveFailed { source }));
        } else {
            self.reports.push_back(Report::Error {
                group: Some(g.name.clone()),
                error: source,
            });
        }
    }

    fn on_store_error(
        &mut self,
        now: Instant,
        i: Option<usize>,
        operation: Operation,
        e: StoreError,
    ) {
        let error = WorkerError::Store {
            operation,
            source: e,
        };
        let removing = i.is_some_and(|i| self.groups[i].removing.is_some());
        if self.stopping.is_some() && i.is_none() {
            // A renewal during the stop, whatever the error: retried after a backoff while
            // the stop goes on (the trust deadline fences if none succeeds).
            self.on_failure(now, None, error);
        } else if self.stopping.is_some() || removing {
            self.reports.push_back(Report::Error {
                group: i.map(|i| self.groups[i].name.clone()),
                error,
            });
        } else if error_is_transient(&error) {
            self.on_failure(now, i, error);
        } else {
            let WorkerError::Store { source, .. } = error else {
                return;
            };
            match i {
                // A group's call: that group ends; the node's other groups go on.
                Some(i) => self.fail_group(i, Err(WorkerFailed::Store(source)), RevokeReason::Lost),
                None => self.stop(Err(WorkerFailed::Store(source)), RevokeReason::Lost),
            }
        }
    }

    /// A transient failure, or a call that did not answer: report it, drop the rest of the
    /// tick (the group's, for a group's call; every group's, for the heartbeat), and tick
    /// again after a backoff. A leave that did not answer ends its group's removal with the
    /// failure.
    fn on_failure(&mut self, now: Instant, i: Option<usize>, error: WorkerError) {
        let removing = i.is_some_and(|i| self.groups[i].removing.is_some());
        if self.stopping.is_some() || removing {
            match (i, &error) {
                (
                    Some(i),
                    WorkerError::Timeout {
                        operation: Operation::Leave,
                        ..
                    },
                ) => self.on_leave_failed(i, error),
                (None, _) => {
                    // A renewal during the stop: try again after a backoff.
                    self.reports.push_back(Report::Error { group: None, error });
                    self.failures = self.failures.saturating_add(1);
                    self.next_tick = Some(now + self.backoff());
                }
                _ => self.reports.push_back(Report::Error {
                    group: i.map(|i| self.groups[i].name.clone()),
                    error,
                }),
            }
            return;
        }
        self.reports.push_back(Report::Error {
            group: i.map(|i| self.groups[i].name.clone()),
            error,
        });
        self.failures = self.failures.saturating_add(1);
        match i {
            Some(i) => self.groups[i].drop_tick(),
            None => {
                for g in &mut self.groups {
                    g.drop_tick();
                }
            }
        }
        // The tick is abandoned: the next one, after the backoff, does it again.
        self.open = false;
        self.heartbeat_wanted = false;
        self.next_tick = Some(now + self.backoff());
    }

    /// End group `i` for `ended`: revoke what its application holds (`reason`), leave, finish.
    fn fail_group(&mut self, i: usize, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
        self.groups[i].begin_removal(ended, reason);
    }

    /// Stop the node: let the call in flight answer (a heartbeat may be starting the session
    /// the node must leave), remove every group (revoke, wait for the acknowledgements, leave
    /// under the node's own session), then finish with `ended`.
    /// The hand-over failed (`None`: the session had ended before it): the node ends with
    /// the failure, its memberships and buckets left to the session's expiry.
    fn hand_over_failed(&mut self, source: Option<WorkerError>) {
        if matches!(self.stopping, Some(Ok(()))) {
            self.stopping = Some(Err(WorkerFailed::HandOverFailed { source }));
        }
    }

    fn stop(&mut self, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
        let failed = ended.is_err();
        self.stopping = Some(ended);
        // A graceful stop of a node with a session hands it over instead of leaving, if
        // configured to; a failure leaves (or lets the session expire) as always.
        let hand_over = match (self.rules.keep_on_stop, failed, self.session) {
            (Some(keep), false, Some(_)) if reason == RevokeReason::Shutdown => Some(keep),
            _ => None,
        };
        self.next_tick = None;
        self.heartbeat_wanted = false;
        // Renewals go on during the stop, the first when due (at once after failures).
        self.failures = 0;
        for k in (0..self.admitting.len()).rev() {
            if !self.admitting[k].cancelled {
                self.cancel_admission(k);
            }
        }
        for g in &mut self.groups {
            if g.removing.is_none() {
                let group_ended = if failed {
                    Err(WorkerFailed::NodeFailed)
                } else {
                    Ok(())
                };
                g.begin_removal(group_ended, reason);
            }
            if !g.stuck.is_empty() {
                self.stuck_seen = true;
            }
        }
        // Once no revocation is outstanding in any group, every group's leave is skipped, or,
        // if a bucket got stuck by then, every group leaves.
        if let Some(keep) = hand_over {
            self.handing_over = HandingOver::Due(keep);
        }
    }

    /// When this node may take dead sessions' buckets: a ttl after it began watching the
    /// store's clock advance steadily. Until then a session the store calls dead may be one
    /// whose holder still trusts it: the store's clock stepped forward (before this node
    /// started, or since), and the holder fences by its own clock, up to a ttl after its last
    /// renewal. The node's own ttl stands for the group's: members of a group share one.
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
        // How far the store's clock is ahead of the node's, relative to the last answer's
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

    /// The node went idle after a tick (or a group's small run): schedule the next tick.
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
        // Every group's mark is cleared (not only up to the first): the tick is over.
        let mut short = false;
        for g in &mut self.groups {
            short |= g.deferred_short.take().is_some();
        }
        if short && let Some(opens) = self.takeover_opens().filter(|&t| t > now) {
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
        self.woken_at = None;
        self.next_tick = Some(self.next_tick.map_or(next, |t| t.min(next)));
    }
}
