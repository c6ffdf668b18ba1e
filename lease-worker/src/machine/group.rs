//! One group of the node: what its application holds, what the store says, and the steps
//! left of its part of the tick.

use super::loads::GroupLoads;
use super::*;

#[derive(Debug)]
pub(super) struct InFlight {
    pub(super) call: StoreCall,
    pub(super) sent: Instant,
    pub(super) deadline: Instant,
    /// A leave of a group the node does not run (see `Machine::unrun`): its answer is the
    /// node's, whatever groups were added meanwhile.
    pub(super) unrun: bool,
}

/// One group of the node: its count, what its application holds, what the store says.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) name: GroupName,
    /// The group's shard count as the node follows it: the one it was added with, then each
    /// count the group was resized to.
    pub(super) shards: ShardCount,
    /// The count the group's current generation was resized from, as of the last view.
    pub(super) resized_from: Option<ShardCount>,
    /// Buckets of `held` that belong to a draining generation: revoked, released, never
    /// assigned.
    pub(super) draining: BTreeSet<Bucket>,
    /// Buckets of the current generation the node holds under quarantine (Q2): let go like
    /// draining ones, with reason `quarantined`.
    pub(super) quarantined: BTreeSet<Bucket>,
    /// Whether the node is a member under its current session, as far as the machine knows.
    pub(super) member: bool,
    /// The last full view of the group the store gave, kept for "unchanged" answers, and the
    /// stamp to hand in with the next heartbeat.
    pub(super) last: Option<GroupBeat>,
    pub(super) stamp: Option<ViewStamp>,
    /// What the application has been told it owns.
    pub(super) owned: Owned,
    /// What the store says the node owns under its session: the last heartbeat's word,
    /// updated by the claims and releases since.
    pub(super) held: Owned,
    /// Revoked, not acknowledged yet.
    pub(super) revoking: Revocations,
    /// Shed, acknowledged, to be released.
    pub(super) unreleased: BTreeSet<Bucket>,
    /// Acknowledgements that never came in time: kept (never released, never assigned again)
    /// until the application acknowledges after all.
    pub(super) stuck: BTreeMap<Bucket, Revoking>,
    /// The rest of the group's part of the tick (or of its removal).
    pub(super) steps: Steps,
    /// An emitted delivery not yet handed back.
    pub(super) pending: Option<Delivery>,
    /// A retry of a release that left buckets behind, and how many were made in this tick.
    pub(super) release_retry: Option<Instant>,
    pub(super) release_retries: u32,
    /// The highest bucket the release in flight names: the unreleased buckets above it are
    /// the next batch's.
    pub(super) release_upto: Option<Bucket>,
    /// The size of the claim batch in flight when the plan wanted more than a batch.
    pub(super) batch_of_more: Option<u32>,
    /// A claim this tick was restricted to unowned buckets and asked for this many: if it won
    /// fewer, it may have left wanted buckets of dead sessions, so tick when takeovers open.
    pub(super) deferred_short: Option<u32>,
    /// Set once the group is being removed, with how it will end.
    pub(super) removing: Option<Result<(), WorkerFailed>>,
    /// Why the application is told to stop, once the group is being removed.
    pub(super) removal_reason: RevokeReason,
    /// The loads the application reported, smoothed, and what of them was published.
    pub(super) loads: GroupLoads,
}

impl Group {
    pub(super) fn new(name: GroupName, shards: ShardCount) -> Self {
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
            loads: GroupLoads::default(),
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        self.steps.is_empty() && self.pending.is_none()
    }

    /// Steps revoking everything the application holds.
    pub(super) fn revocations(&self, reason: RevokeReason) -> Vec<Step> {
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
    pub(super) fn revoke_all_first(&mut self, reason: RevokeReason) {
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

    pub(super) fn drop_assignments_and_claims(&mut self) {
        self.steps.retain(|s| {
            !matches!(
                s,
                Step::Deliver(Delivery::Assign { .. }) | Step::Claim(_) | Step::ClaimNamed(_)
            )
        });
    }

    /// Drop the rest of the group's tick, keeping the revocations still to deliver (a fence's,
    /// a new session's). A group being removed keeps its whole removal.
    pub(super) fn drop_tick(&mut self) {
        if self.removing.is_none() {
            self.steps.retain(Step::is_revoke);
        }
        self.release_retry = None;
    }

    /// Add `step` to the group's current work, before its end; start a small run when idle.
    /// Whether a run was started.
    pub(super) fn insert_step(&mut self, step: Step) -> bool {
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
    pub(super) fn begin_removal(&mut self, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
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
    pub(super) fn removing_beat(&mut self, beat: &Heartbeat) {
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
    pub(super) fn lose_session(&mut self) {
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
pub(super) struct NodeState {
    pub(super) session: Option<SessionId>,
    pub(super) trusted: bool,
    pub(super) renewal_due: bool,
    pub(super) ack_limit: Option<Duration>,
}
