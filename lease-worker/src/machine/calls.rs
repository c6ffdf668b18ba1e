//! What the machine and its driver say to each other: the inputs it handles, the outputs it
//! asks for, the store calls it makes (each with every argument its store method takes, and
//! how a driver makes it), the deliveries to applications, and the reports.

use super::*;

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
    /// The application measured a bucket's load in the group (see
    /// [`GroupHandle::report_load`](crate::GroupHandle::report_load)): a sample, smoothed
    /// with the others in time.
    ReportLoad(GroupName, Bucket, Load),
    /// The answer to [`StoreCall::PublishLoads`] of the group.
    LoadsPublished(GroupName, Result<u32, StoreError>),
    /// The answer to [`StoreCall::Heartbeat`].
    Heartbeat(Result<Heartbeat, StoreError>),
    /// The answer to [`StoreCall::Join`] of the group.
    Joined(GroupName, Result<(), StoreError>),
    /// The answer to [`StoreCall::HandOver`].
    HandedOver(Result<Option<Timestamp>, StoreError>),
    /// The answer to [`StoreCall::Claim`] or [`StoreCall::ClaimBuckets`] of the group.
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
    /// [`WorkerStore::heartbeat_with_bound`](lease_core::WorkerStore::heartbeat_with_bound).
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
        /// The bound of the session's writes, to keep it across a failover (V4).
        bound: Option<SessionBound>,
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
    /// [`WorkerStore::claim_buckets`](lease_core::WorkerStore::claim_buckets): the buckets
    /// the load-aware policy chose.
    ClaimBuckets {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The session to claim under.
        session: SessionId,
        /// Which.
        buckets: Vec<Bucket>,
        /// As for [`StoreCall::Claim`].
        takeover: Takeover,
    },
    /// [`WorkerStore::publish_loads`](lease_core::WorkerStore::publish_loads): the smoothed
    /// loads that moved since the last publication, and the node's work in the group.
    PublishLoads {
        /// The group.
        group: GroupName,
        /// The node.
        node: NodeId,
        /// The node's session.
        session: SessionId,
        /// The loads to record.
        loads: Vec<(Bucket, Load)>,
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
            Self::ClaimBuckets { .. } => Operation::ClaimBuckets,
            Self::PublishLoads { .. } => Operation::PublishLoads,
            Self::Release { .. } => Operation::Release,
            Self::Leave { .. } => Operation::Leave,
        }
    }

    /// Whether the call writes under the node's session (what V4's bound must cover).
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Self::Join { .. }
                | Self::SetWeight { .. }
                | Self::Claim { .. }
                | Self::ClaimBuckets { .. }
                | Self::PublishLoads { .. }
                | Self::Release { .. }
                | Self::Leave { .. }
                | Self::HandOver { .. }
        )
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
            | Self::ClaimBuckets { group, .. }
            | Self::PublishLoads { group, .. }
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
            Self::Claim { group, .. } | Self::ClaimBuckets { group, .. } => {
                Input::Claimed(group, Err(error))
            }
            Self::PublishLoads { group, .. } => Input::LoadsPublished(group, Err(error)),
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
                bound,
            } => Input::Heartbeat(
                store
                    .heartbeat_with_bound(node, incarnation, ttl, &metadata, &seen, bound)
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
            Self::ClaimBuckets {
                group,
                node,
                session,
                buckets,
                takeover,
            } => {
                let result = store
                    .claim_buckets(&group, node, session, &buckets, takeover)
                    .await;
                Input::Claimed(group, result)
            }
            Self::PublishLoads {
                group,
                node,
                session,
                loads,
            } => {
                let result = store.publish_loads(&group, node, session, &loads).await;
                Input::LoadsPublished(group, result)
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
