//! The tokio task that drives a node's [`Machine`]: it makes the store calls the machine asks
//! for (each on a task of its own, so the machine can revoke at the trust deadline while a
//! call hangs, and a call it gives up on is dropped), hands each group's events to that
//! group's application task, feeds the machine the groups' change feeds' wake-ups, the
//! applications' acknowledgements, groups added and removed and a stop request, and publishes
//! what each application owns, metrics and logs. No rule lives here.
//!
//! Each group's application runs on a task of its own, one event at a time: a slow handler in
//! one group delays neither the node's renewals nor the other groups' events.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use async_trait::async_trait;
use futures_util::FutureExt;
use lease_core::{
    Assignment, Bucket, Chain, Change, ChangeFeed, FencingToken, GroupName, Incarnation,
    MemberMetadata, NodeId, RevokeReason, ShardCount, StoreError, Weight, WorkerStore,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::config::{LeaseNode, LeaseWorker, Timing};
use crate::events::{OwnershipHandler, WorkerError, WorkerFailed};
use crate::leases::{LeaseSender, Leases, Trust};
use crate::machine::{
    ClockStep, Delivery, Input, Machine, Output, Owned, Report, Rules, StoreCall,
};
use crate::metrics::Metrics;
use crate::registry::Running;

/// How the driver reaches a group's application: through an [`OwnershipHandler`] (each event
/// awaited in turn) or through per-bucket leases ([`LeaseSender`]).
#[async_trait]
pub(crate) trait Application: Send + 'static {
    /// Tell the application it owns a bucket.
    async fn assign(&mut self, assignment: Assignment);

    /// Tell the application it does not own `bucket` any more; returns whether it has
    /// stopped working on it already (an acknowledgement coming later otherwise).
    async fn revoke(&mut self, bucket: Bucket, token: FencingToken, reason: RevokeReason) -> bool;

    /// Report an error the node survived.
    async fn error(&mut self, error: &WorkerError);

    /// The next revoked bucket the application stopped working on, when acknowledgements
    /// come later than [`revoke`](Self::revoke) returns; pending for ever otherwise.
    async fn next_ack(&mut self) -> Bucket {
        std::future::pending().await
    }
}

/// An [`OwnershipHandler`]: a revocation is acknowledged when `on_revoked` returns.
pub(crate) struct Handler<H>(pub(crate) H);

#[async_trait]
impl<H: OwnershipHandler> Application for Handler<H> {
    async fn assign(&mut self, assignment: Assignment) {
        self.0.on_assigned(assignment).await;
    }

    async fn revoke(&mut self, bucket: Bucket, token: FencingToken, reason: RevokeReason) -> bool {
        self.0.on_revoked(bucket, token, reason).await;
        true
    }

    async fn error(&mut self, error: &WorkerError) {
        self.0.on_error(error).await;
    }
}

/// What the driver asks of a group's application task.
enum AppCommand {
    Assign(Assignment),
    Revoke {
        bucket: Bucket,
        token: FencingToken,
        reason: RevokeReason,
    },
    Error(Arc<WorkerError>),
    /// The group ended: report a failed leave, then hand the result back and stop.
    Finish(Result<(), WorkerFailed>),
}

/// What a group's application task tells the driver.
enum AppEvent {
    Delivered,
    Acked(Bucket),
    /// The application panicked: the node stops at once, as a crashed process would.
    Panicked(String),
    /// The application heard everything; the group's end, handed back.
    Finished(Result<(), WorkerFailed>),
}

/// A group's application task: each event awaited in turn, acknowledgements as they come.
async fn run_app<A: Application>(
    group: GroupName,
    mut app: A,
    mut commands: mpsc::UnboundedReceiver<AppCommand>,
    events: mpsc::UnboundedSender<(GroupName, AppEvent)>,
) {
    let send = |event: AppEvent| {
        // The driver gone, nobody listens any more.
        events.send((group.clone(), event)).ok();
    };
    let body = async {
        loop {
            tokio::select! {
                biased;
                command = commands.recv() => match command {
                    None => return,
                    Some(AppCommand::Assign(assignment)) => {
                        app.assign(assignment).await;
                        send(AppEvent::Delivered);
                    }
                    Some(AppCommand::Revoke { bucket, token, reason }) => {
                        let acked = app.revoke(bucket, token, reason).await;
                        send(if acked { AppEvent::Acked(bucket) } else { AppEvent::Delivered });
                    }
                    Some(AppCommand::Error(error)) => app.error(&error).await,
                    Some(AppCommand::Finish(ended)) => {
                        if let Err(WorkerFailed::LeaveFailed { source }) = &ended {
                            app.error(source).await;
                        }
                        send(AppEvent::Finished(ended));
                        return;
                    }
                },
                bucket = app.next_ack() => send(AppEvent::Acked(bucket)),
            }
        }
    };
    if let Err(panic) = AssertUnwindSafe(body).catch_unwind().await {
        send(AppEvent::Panicked(panic_message(panic)));
    }
}

/// A store call in flight: the call, and the task making it.
struct Call {
    call: StoreCall,
    task: JoinHandle<Input>,
}

/// A call nobody waits for any more is stopped, however the driver let go of it (the machine
/// gave up on it, the node finished, the node task ended or was aborted): a detached call
/// would still reach the store later, a leave reported failed leaving after all, and it would
/// keep a connection it may hold mid-statement.
impl Drop for Call {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The owned-set sender. However the task ends, a normal stop or a panicking handler, the
/// application's view is emptied: a node that is gone owns nothing it can vouch for.
pub(crate) struct Published(pub(crate) watch::Sender<Owned>);

impl Drop for Published {
    fn drop(&mut self) {
        self.0.send_replace(Owned::new());
    }
}

/// How a group ended, as its handles see it: `None` while it runs.
type Ended = Option<Result<(), Arc<WorkerFailed>>>;

/// Everything the driver keeps of a group.
struct Slot {
    app: mpsc::UnboundedSender<AppCommand>,
    published: Published,
    metrics: Metrics,
    feed: Option<ChangeFeed>,
    ended: watch::Sender<Ended>,
    /// The group's end was handed to its application task; its answer is awaited.
    finishing: bool,
    /// The assignment being delivered to the application: published as owned once delivered.
    assigning: Option<(Bucket, FencingToken)>,
    /// A weight was set while the group's join was in flight, which may have read the weights
    /// before: it is set again once the join answers.
    weight_after_join: bool,
}

/// A group ready to join a node: its store checks done, its application task running.
pub(crate) struct Prepared {
    group: GroupName,
    shards: ShardCount,
    slot: Slot,
}

/// How a node answered a group to add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Added {
    Yes,
    /// The node has the group already (or is still removing it).
    Duplicate,
    /// The node is stopping.
    Stopping,
}

/// What a node's handles ask of its task.
enum Command {
    Add {
        prepared: Box<Prepared>,
        reply: oneshot::Sender<Added>,
    },
    Remove {
        group: GroupName,
        reply: oneshot::Sender<Option<watch::Receiver<Ended>>>,
    },
    SetWeight {
        group: GroupName,
        weight: Weight,
        reply: oneshot::Sender<Result<(), GroupError>>,
    },
}

/// Everything a node task needs.
struct Driver {
    machine: Machine,
    store: Arc<dyn WorkerStore>,
    metadata: MemberMetadata,
    cancel: CancellationToken,
    commands: mpsc::UnboundedReceiver<Command>,
    apps: mpsc::UnboundedReceiver<(GroupName, AppEvent)>,
    groups: BTreeMap<GroupName, Slot>,
    /// Until when the leases are trusted, for per-bucket leases to watch.
    trust: watch::Sender<Option<std::time::Instant>>,
    call: Option<Call>,
    /// A worker: a node of one group, which stops when its group ends and ends with the
    /// group's result.
    single: bool,
    single_result: Option<Result<(), WorkerFailed>>,
    /// Groups that could not be left while the node stopped.
    not_left: Vec<GroupName>,
    /// The weights the application set, applied again after every join (see
    /// [`GroupHandle::set_weight`]).
    weights: Weights,
    /// Held until the task ends: the configuration is running meanwhile.
    _running: Running,
}

/// The weights the application set per group, shared by the node task and its joins' tasks.
type Weights = Arc<std::sync::Mutex<HashMap<GroupName, Weight>>>;

/// The weight the application set for `group`, if any. A poisoned lock (a panic while the
/// map was held, which its short sections cannot cause) still gives the map.
fn weight_of(weights: &Weights, group: &GroupName) -> Option<Weight> {
    weights
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .get(group)
        .copied()
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// Sleep until `at`, or forever if there is nothing to wait for.
async fn sleep_until_or_never(at: Option<std::time::Instant>) {
    match at {
        Some(at) => sleep_until(Instant::from_std(at)).await,
        None => std::future::pending().await,
    }
}

/// The next wake-up of any group's feed, with the group; `None` for a feed that closed.
async fn next_change(groups: &mut BTreeMap<GroupName, Slot>) -> (GroupName, Option<Change>) {
    std::future::poll_fn(|cx| {
        for (group, slot) in groups.iter_mut() {
            if let Some(feed) = slot.feed.as_mut() {
                // A feed's `recv` takes nothing from the stream until a change is ready, so a
                // future dropped unfinished loses no change.
                let recv = pin!(feed.recv());
                if let Poll::Ready(change) = recv.poll(cx) {
                    return Poll::Ready((group.clone(), change));
                }
            }
        }
        Poll::Pending
    })
    .await
}

/// The answer of a call in flight; pending without one.
async fn answer(call: &mut Option<Call>) -> Input {
    match call {
        Some(call) => match (&mut call.task).await {
            Ok(input) => input,
            // The call's task panicked (a store that panics) or was cancelled: a failure of
            // the operation like any other.
            Err(e) => failed(&call.call, format!("the store call did not finish: {e}")),
        },
        None => std::future::pending().await,
    }
}

fn failed(call: &StoreCall, detail: String) -> Input {
    let e = StoreError::backend_detail(call.operation(), lease_core::BackendFailure::Other, detail);
    match call {
        StoreCall::Heartbeat { .. } => Input::Heartbeat(Err(e)),
        StoreCall::HandOver { .. } => Input::HandedOver(Err(e)),
        StoreCall::Join { group, .. } => Input::Joined(group.clone(), Err(e)),
        StoreCall::Claim { group, .. } => Input::Claimed(group.clone(), Err(e)),
        StoreCall::Release { group, .. } => Input::Released(group.clone(), Err(e)),
        StoreCall::Leave { group, .. } => Input::Left(group.clone(), Err(e)),
    }
}

impl Driver {
    async fn run(mut self) -> Result<(), WorkerFailed> {
        let mut stop_sent = false;
        let mut node_ended: Option<Result<(), WorkerFailed>> = None;
        let mut commands_open = true;
        loop {
            while let Some(out) = self.machine.poll(now()) {
                match out {
                    Output::Call(call) => self.spawn(call),
                    Output::Deliver(group, d) => self.deliver(&group, d),
                    Output::Report(r) => self.report(r),
                    Output::GroupFinished(group, ended) => self.group_finished(group, ended),
                    Output::Finished(ended) => node_ended = Some(ended),
                }
            }
            if self.machine.awaits().is_none() {
                // The machine gave up on it (timed out): stop it.
                self.call = None;
            }
            self.publish();
            if node_ended.is_some() && self.groups.is_empty() {
                let ended = node_ended.take().unwrap_or(Ok(()));
                return self.result(ended);
            }
            tokio::select! {
                biased;
                () = self.cancel.cancelled(), if !stop_sent => {
                    stop_sent = true;
                    self.machine.handle(now(), Input::Stop);
                }
                input = answer(&mut self.call) => {
                    self.call = None;
                    if let Input::Claimed(group, Ok(won)) = &input
                        && let Some(slot) = self.groups.get(group)
                    {
                        slot.metrics.claimed(won.len());
                    }
                    let joined = match &input {
                        Input::Joined(group, Ok(())) => Some(group.clone()),
                        _ => None,
                    };
                    self.machine.handle(now(), input);
                    if let Some(group) = joined {
                        self.joined(&group);
                    }
                }
                () = sleep_until_or_never(self.machine.poll_timeout()) => {
                    self.machine.handle_timeout(now());
                }
                Some((group, event)) = self.apps.recv() => match event {
                    AppEvent::Delivered => {
                        self.machine.handle(now(), Input::Delivered(group.clone()));
                        self.delivered(&group);
                    }
                    AppEvent::Acked(bucket) => {
                        self.machine.handle(now(), Input::Acked(group, bucket));
                    }
                    AppEvent::Panicked(message) => {
                        // As a crash: nothing is revoked or left, the leases expire.
                        return Err(WorkerFailed::HandlerPanicked { message });
                    }
                    AppEvent::Finished(ended) => self.group_ended(group, ended),
                },
                command = self.commands.recv(), if commands_open => match command {
                    Some(command) => self.command(command),
                    // Every handle is gone; their drop cancelled the node.
                    None => commands_open = false,
                },
                (group, change) = next_change(&mut self.groups) => match change {
                    Some(change) => {
                        tracing::debug!(%group, ?change, "woken by a change");
                        self.machine.handle(now(), Input::Wake);
                    }
                    None => {
                        tracing::warn!(
                            %group,
                            "change feed closed; re-planning on the renew interval only"
                        );
                        if let Some(slot) = self.groups.get_mut(&group) {
                            slot.feed = None;
                            slot.metrics.polling(true);
                        }
                    }
                },
            }
        }
    }

    /// How the node task ends: the node's own failure first; a worker ends with its group's
    /// result; a node that could not leave some group says which.
    fn result(&mut self, node: Result<(), WorkerFailed>) -> Result<(), WorkerFailed> {
        node?;
        if self.single {
            return self.single_result.take().unwrap_or(Ok(()));
        }
        if self.not_left.is_empty() {
            Ok(())
        } else {
            Err(WorkerFailed::GroupsNotLeft {
                groups: std::mem::take(&mut self.not_left),
            })
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Add { prepared, reply } => {
                let Prepared {
                    group,
                    shards,
                    slot,
                } = *prepared;
                let added = if self.machine.is_stopping() {
                    Added::Stopping
                } else if self.groups.contains_key(&group)
                    || !self.machine.add_group(now(), group.clone(), shards)
                {
                    Added::Duplicate
                } else {
                    self.groups.insert(group, slot);
                    Added::Yes
                };
                // Refused, the slot drops here: its application task ends.
                reply.send(added).ok();
            }
            Command::Remove { group, reply } => {
                let ended = self.groups.get(&group).map(|slot| slot.ended.subscribe());
                if ended.is_some() {
                    self.machine.remove_group(&group);
                }
                reply.send(ended).ok();
            }
            Command::SetWeight {
                group,
                weight,
                reply,
            } => self.set_weight(group, weight, reply),
        }
    }

    /// Set the node's weight in `group`: kept, and written to the store only under the node's
    /// own session once it is a member of the group. A process that never gets a session (its
    /// node id is another live process's) writes nothing: the weight is the other process's
    /// member row's.
    fn set_weight(
        &mut self,
        group: GroupName,
        weight: Weight,
        reply: oneshot::Sender<Result<(), GroupError>>,
    ) {
        let Some(slot) = self.groups.get_mut(&group) else {
            reply.send(Err(GroupError::NotAdded { group })).ok();
            return;
        };
        self.weights
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(group.clone(), weight);
        let joining =
            matches!(self.machine.awaits(), Some(StoreCall::Join { group: g, .. }) if g == &group);
        if joining {
            // The join may have read the weights already: set it again when it answers.
            slot.weight_after_join = true;
            reply.send(Ok(())).ok();
        } else if self.machine.is_member(&group)
            && let Some(session) = self.machine.session()
        {
            let store = self.store.clone();
            let node = self.machine.rules().node;
            tokio::spawn(async move {
                let result = match store.set_weight(&group, node, session, weight).await {
                    // The membership or the session ended meanwhile: the next join applies it.
                    Ok(()) | Err(StoreError::SessionExpired { .. }) => Ok(()),
                    Err(e) => Err(GroupError::Store(e)),
                };
                reply.send(result).ok();
            });
        } else {
            // Not a member under the node's session (yet): its next join applies it.
            reply.send(Ok(())).ok();
        }
    }

    /// The group's join answered: a weight set while it was in flight is set again now.
    fn joined(&mut self, group: &GroupName) {
        let Some(slot) = self.groups.get_mut(group) else {
            return;
        };
        if !std::mem::take(&mut slot.weight_after_join) || !self.machine.is_member(group) {
            return;
        }
        let Some(weight) = weight_of(&self.weights, group) else {
            return;
        };
        let Some(session) = self.machine.session() else {
            return;
        };
        let store = self.store.clone();
        let node = self.machine.rules().node;
        let group = group.clone();
        tokio::spawn(async move {
            if let Err(e) = store.set_weight(&group, node, session, weight).await {
                tracing::warn!(group = %group, weight = %weight, error = %Chain(&e),
                    "could not set the group's weight after joining; the node keeps the \
                     weight the store has");
            }
        });
    }

    fn spawn(&mut self, call: StoreCall) {
        let store = self.store.clone();
        let rules = self.machine.rules().clone();
        let metadata = self.metadata.clone();
        let weights = self.weights.clone();
        let made = call.clone();
        let task = tokio::spawn(async move {
            let node = rules.node;
            match made {
                StoreCall::Heartbeat { seen } => Input::Heartbeat(
                    store
                        .heartbeat(node, rules.incarnation, rules.ttl, &metadata, &seen)
                        .await,
                ),
                StoreCall::HandOver { keep } => {
                    Input::HandedOver(store.hand_over(node, rules.incarnation, keep).await)
                }
                StoreCall::Join { group, session } => {
                    let result = store.join(&group, node, session).await;
                    // Read after the join: a weight set while it was under way, whose own
                    // control found no member yet, is applied here (K1 keeps it after).
                    if result.is_ok()
                        && let Some(w) = weight_of(&weights, &group)
                        && let Err(e) = store.set_weight(&group, node, session, w).await
                    {
                        tracing::warn!(group = %group, weight = %w, error = %Chain(&e),
                            "could not set the group's weight after joining; the node keeps \
                             the weight the store has");
                    }
                    Input::Joined(group, result)
                }
                StoreCall::Claim {
                    group,
                    session,
                    want,
                    takeover,
                } => {
                    let result = store.claim(&group, node, session, want, takeover).await;
                    Input::Claimed(group, result)
                }
                StoreCall::Release {
                    group,
                    session,
                    buckets,
                } => {
                    let result = store.release(&group, node, session, &buckets).await;
                    Input::Released(group, result)
                }
                StoreCall::Leave { group, session } => {
                    let result = store.leave(&group, node, session).await;
                    Input::Left(group, result)
                }
            }
        });
        // A call still held here is one the machine gave up on: replacing it stops it.
        self.call = Some(Call { call, task });
    }

    fn deliver(&mut self, group: &GroupName, d: Delivery) {
        let Some(slot) = self.groups.get_mut(group) else {
            return;
        };
        let command = match d {
            Delivery::Assign { bucket, token } => {
                let Some(assignment) = self.machine.assignment(group, bucket, token) else {
                    return;
                };
                slot.assigning = Some((bucket, token));
                AppCommand::Assign(assignment)
            }
            Delivery::Revoke {
                bucket,
                token,
                reason,
            } => {
                slot.metrics.revoked(reason);
                // The machine counts a bucket no longer owned once its revocation goes out.
                slot.published
                    .0
                    .send_if_modified(|owned| owned.remove(&bucket).is_some());
                AppCommand::Revoke {
                    bucket,
                    token,
                    reason,
                }
            }
        };
        // An application task that is gone panicked: its report is on its way.
        slot.app.send(command).ok();
    }

    /// The group's application heard its pending delivery: an assignment is owned from now on
    /// (the machine counts it once delivered).
    fn delivered(&mut self, group: &GroupName) {
        let Some(slot) = self.groups.get_mut(group) else {
            return;
        };
        if let Some((bucket, token)) = slot.assigning.take()
            && self
                .machine
                .owned(group)
                .is_some_and(|owned| owned.get(&bucket) == Some(&token))
        {
            slot.published.0.send_if_modified(|owned| {
                let changed = owned.get(&bucket) != Some(&token);
                owned.insert(bucket, token);
                changed
            });
        }
    }

    /// Tell the group's application (or every group's, for the node's own) of an error.
    fn tell_error(&self, group: Option<&GroupName>, error: WorkerError) {
        let error = Arc::new(error);
        for (name, slot) in &self.groups {
            if group.is_none_or(|g| g == name) {
                slot.metrics.error();
                slot.app.send(AppCommand::Error(error.clone())).ok();
            }
        }
    }

    fn report(&mut self, r: Report) {
        match r {
            Report::Error { group, error } => {
                match &group {
                    Some(group) => tracing::warn!(
                        %group,
                        error = %Chain(&error),
                        "lease node error; retrying"
                    ),
                    None => tracing::warn!(error = %Chain(&error), "lease node error; retrying"),
                }
                self.tell_error(group.as_ref(), error);
            }
            Report::Claimed { group, won } => tracing::debug!(%group, claimed = won, "claimed"),
            Report::Stuck { group, bucket } => {
                tracing::error!(
                    %group,
                    %bucket,
                    "the application did not stop working on a revoked bucket in time; it is \
                     kept, not released, until the session ends"
                );
                if let Some(slot) = self.groups.get(&group) {
                    slot.metrics.stuck();
                }
            }
            Report::Fenced { owned } => tracing::warn!(
                owned,
                "renewals did not succeed in time; revoking every bucket of every group"
            ),
            Report::TickCompleted { took } => {
                for slot in self.groups.values() {
                    slot.metrics.tick(took);
                }
            }
            Report::ClockStep(step) => {
                let forward = matches!(step, ClockStep::Forward(_));
                match step {
                    ClockStep::Forward(by) => tracing::warn!(
                        at_least = ?by,
                        "the store's clock stepped forward: taking no dead session's bucket \
                         for a ttl, until their holders have fenced"
                    ),
                    ClockStep::Backward(by) => tracing::warn!(
                        at_least = ?by,
                        "the store's clock stepped back: leases live longer by as much in the \
                         store's eyes"
                    ),
                }
                for slot in self.groups.values() {
                    slot.metrics.clock_step(forward);
                }
            }
            Report::Resized {
                group,
                from,
                to,
                generation,
            } => tracing::warn!(
                %group,
                %from,
                %to,
                %generation,
                "the group was resized from {from} to {to} shards: following it (old buckets \
                 are revoked and released, the new ones shared); configure new workers with {to}"
            ),
            Report::Evicted { group } => tracing::warn!(
                %group,
                "the node was evicted from the group (its buckets were released behind its \
                 back): revoking them and joining again"
            ),
            Report::LeftUnrun {
                group,
                released: Ok(n),
            } => tracing::warn!(
                %group,
                "left a group this node does not run (its session, taken over from the previous \
                 process with this node id, was a member): {n} bucket(s) released for the nodes \
                 that run it"
            ),
            Report::LeftUnrun {
                group,
                released: Err(e),
            } => tracing::warn!(
                %group,
                error = %Chain(&e),
                "could not leave a group this node does not run; trying again after the next \
                 heartbeat"
            ),
            Report::HandedOver { until } => tracing::info!(
                until = %until,
                "stopped: the session and its buckets are handed over to the next process with \
                 this node id (until {until}, when they become claimable if none comes)"
            ),
            Report::Coverage {
                group,
                unowned,
                quarantined,
                at,
            } => {
                if let Some(slot) = self.groups.get_mut(&group) {
                    slot.metrics.coverage(unowned, quarantined, at);
                }
            }
        }
    }

    /// The machine is done with `group`: its application hears how it ended, then hands the
    /// result back ([`group_ended`](Self::group_ended)).
    fn group_finished(&mut self, group: GroupName, ended: Result<(), WorkerFailed>) {
        if let Err(WorkerFailed::LeaveFailed { source }) = &ended {
            tracing::warn!(%group, error = %Chain(source), "could not leave the group");
        }
        let Some(slot) = self.groups.get_mut(&group) else {
            return;
        };
        if matches!(ended, Err(WorkerFailed::LeaveFailed { .. })) {
            slot.metrics.error();
        }
        slot.feed = None;
        slot.finishing = true;
        if let Err(tokio::sync::mpsc::error::SendError(AppCommand::Finish(ended))) =
            slot.app.send(AppCommand::Finish(ended))
        {
            // The application task is gone (it panicked; its report is on its way).
            self.group_ended(group, ended);
        }
    }

    /// The group's application heard everything: publish how the group ended.
    fn group_ended(&mut self, group: GroupName, ended: Result<(), WorkerFailed>) {
        let Some(slot) = self.groups.remove(&group) else {
            return;
        };
        if matches!(ended, Err(WorkerFailed::LeaveFailed { .. })) && self.machine.is_stopping() {
            self.not_left.push(group.clone());
        }
        if self.single {
            self.single_result = Some(ended);
            // A worker is its group: it stops with it.
            self.machine.handle(now(), Input::Stop);
        } else {
            slot.ended.send_replace(Some(ended.map_err(Arc::new)));
        }
        // `slot` drops: the owned set is emptied.
    }

    /// Publish the trust deadline the leases watch, and each group's owned count. The owned
    /// sets follow the machine's change by change as deliveries go out and come back
    /// ([`deliver`](Self::deliver), [`delivered`](Self::delivered)), so that a stop revoking
    /// 65,536 buckets does not copy the set once per bucket; one found of another size than
    /// the machine's (which those changes should never leave behind) is copied whole.
    fn publish(&self) {
        let trusted = self
            .machine
            .trusted_until()
            .filter(|_| !self.machine.is_finished());
        self.trust.send_if_modified(|t| {
            let changed = *t != trusted;
            *t = trusted;
            changed
        });
        for (group, slot) in &self.groups {
            if slot.finishing {
                continue;
            }
            let Some(owned) = self.machine.owned(group) else {
                continue;
            };
            slot.metrics.owned(owned.len());
            slot.published.0.send_if_modified(|current| {
                if current.len() == owned.len() {
                    false
                } else {
                    current.clone_from(owned);
                    true
                }
            });
        }
    }
}

/// The machine's rules for a node of this timing and id, and a fresh incarnation.
fn rules(node: NodeId, timing: Timing) -> Rules {
    Rules {
        node,
        incarnation: Incarnation::new(),
        ttl: timing.ttl,
        renew_interval: timing.renew_interval,
        safety_margin: timing.margin,
        wake_debounce: timing.wake_debounce,
        call_timeout: timing.renew_interval.max(timing.ttl.as_duration() / 2),
        ack_limit: timing.ack_limit,
        keep_on_stop: timing.keep_on_stop,
    }
}

/// Create `group` if needed (failing on a shard-count mismatch), subscribe to its wake-ups,
/// register its metrics (on the caller's task: a test's local recorder sees the series) and
/// start its application task.
async fn prepare<A: Application>(
    store: &dyn WorkerStore,
    group: GroupName,
    shards: ShardCount,
    app: A,
    events: mpsc::UnboundedSender<(GroupName, AppEvent)>,
) -> Result<(Prepared, watch::Receiver<Owned>, watch::Receiver<Ended>), StoreError> {
    store.ensure_group(&group, shards).await?;
    let feed = match store.changes(&group).await {
        // A store without a feed says why itself (the Postgres store logs it once).
        Ok(None) => {
            tracing::debug!(
                %group,
                "the store has no change feed; re-planning on the renew interval only"
            );
            None
        }
        Ok(feed) => feed,
        Err(e) => {
            // Wake-ups only speed things up; the node still re-plans every interval.
            tracing::warn!(
                %group,
                error = %Chain(&e),
                "no change feed; re-planning on the renew interval only"
            );
            None
        }
    };
    let metrics = Metrics::new(&group);
    metrics.polling(feed.is_none());
    let (published, owned) = watch::channel(Owned::new());
    let (ended, ended_rx) = watch::channel(None);
    let (app_tx, app_rx) = mpsc::unbounded_channel();
    tokio::spawn(run_app(group.clone(), app, app_rx, events));
    Ok((
        Prepared {
            group,
            shards,
            slot: Slot {
                app: app_tx,
                published: Published(published),
                metrics,
                feed,
                ended,
                finishing: false,
                assigning: None,
                weight_after_join: false,
            },
        },
        owned,
        ended_rx,
    ))
}

/// The parts of a node task before it starts.
struct Launch {
    commands: mpsc::UnboundedSender<Command>,
    apps: mpsc::UnboundedSender<(GroupName, AppEvent)>,
    trust: Trust,
    driver: Driver,
}

fn launch(
    node: NodeId,
    timing: Timing,
    metadata: MemberMetadata,
    store: Arc<dyn WorkerStore>,
    cancel: CancellationToken,
    running: Running,
    single: bool,
) -> Launch {
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (apps_tx, apps) = mpsc::unbounded_channel();
    let (trust, watching) = watch::channel(None);
    let driver = Driver {
        machine: Machine::new(rules(node, timing), now()),
        store,
        metadata,
        cancel,
        commands,
        apps,
        groups: BTreeMap::new(),
        trust,
        call: None,
        single,
        single_result: None,
        not_left: Vec::new(),
        weights: Weights::default(),
        _running: running,
    };
    Launch {
        commands: commands_tx,
        apps: apps_tx,
        trust: watching,
        driver,
    }
}

/// A running node: add groups to it, remove them, stop it. Dropping it stops the node
/// gracefully in the background (every group revoked and left); call
/// [`shutdown`](Self::shutdown) to wait for that.
pub struct NodeHandle {
    node: NodeId,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), WorkerFailed>>>,
    commands: mpsc::UnboundedSender<Command>,
    apps: mpsc::UnboundedSender<(GroupName, AppEvent)>,
    store: Arc<dyn WorkerStore>,
    trust: Trust,
}

impl std::fmt::Debug for NodeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandle")
            .field("node", &self.node)
            .field("finished", &self.is_finished())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { prepared, .. } => f.debug_tuple("Add").field(&prepared.group).finish(),
            Command::Remove { group, .. } => f.debug_tuple("Remove").field(group).finish(),
            Command::SetWeight { group, weight, .. } => f
                .debug_tuple("SetWeight")
                .field(group)
                .field(weight)
                .finish(),
        }
    }
}

impl std::fmt::Debug for AppEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AppEvent::Delivered => "Delivered",
            AppEvent::Acked(_) => "Acked",
            AppEvent::Panicked(_) => "Panicked",
            AppEvent::Finished(_) => "Finished",
        })
    }
}

/// Why a group could not be added or removed, or how it ended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The store refused the group: it exists with another shard count, or the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The node has this group already (or is still removing it).
    #[error("group {group:?} is in this node already")]
    AlreadyAdded {
        /// The group.
        group: GroupName,
    },
    /// The node has no such group.
    #[error("group {group:?} is not in this node")]
    NotAdded {
        /// The group.
        group: GroupName,
    },
    /// The node has ended (it was stopped, or failed), or is stopping.
    #[error("the node has ended or is stopping")]
    NodeEnded,
    /// The group ended with this failure (a permanent store error, a shard-count mismatch, a
    /// leave that failed, the node's failure).
    #[error(transparent)]
    Failed(Arc<WorkerFailed>),
}

impl GroupError {
    /// The store's error, if that is why.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(e) => Some(e),
            Self::Failed(failed) => match failed.as_ref() {
                WorkerFailed::Store(e) => Some(e),
                _ => None,
            },
            _ => None,
        }
    }
}

/// One group of a running node: what its application owns, and how to remove it. Dropping it
/// leaves the group running (remove it with [`NodeHandle::remove_group`], or stop the node).
pub struct GroupHandle {
    group: GroupName,
    owned: watch::Receiver<Owned>,
    ended: watch::Receiver<Ended>,
    commands: mpsc::UnboundedSender<Command>,
    node: NodeId,
}

/// Wait until a group's end is published; the node ending without publishing it (it crashed,
/// its handler panicked, its task was aborted) is [`GroupError::NodeEnded`].
async fn wait_ended(ended: &mut watch::Receiver<Ended>) -> Result<(), GroupError> {
    match ended.wait_for(Option::is_some).await {
        Ok(end) => match end.as_ref() {
            Some(Ok(())) => Ok(()),
            Some(Err(failed)) => Err(GroupError::Failed(failed.clone())),
            None => Err(GroupError::NodeEnded),
        },
        Err(_) => Err(GroupError::NodeEnded),
    }
}

impl GroupHandle {
    /// The group.
    pub fn group(&self) -> &GroupName {
        &self.group
    }

    /// The buckets the group's application owns right now; changes as events are delivered.
    pub fn owned(&self) -> watch::Receiver<Owned> {
        self.owned.clone()
    }

    /// Whether the group has ended (removed, failed, or its node gone).
    pub fn is_finished(&self) -> bool {
        self.ended.borrow().is_some() || self.ended.has_changed().is_err()
    }

    /// Remove the group from its node (revoke everything its application holds, leave the
    /// group, wake its other members) and wait for that. The node's other groups go on.
    pub async fn remove(mut self) -> Result<(), GroupError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Remove {
                group: self.group.clone(),
                reply,
            })
            .ok();
        // A node that is gone cannot answer; the group's end says how it ended then.
        answer.await.ok();
        wait_ended(&mut self.ended).await
    }

    /// Wait until the group ends, without asking it to: removed through the node's handle,
    /// failed, or its node stopped.
    pub async fn wait(&mut self) -> Result<(), GroupError> {
        wait_ended(&mut self.ended).await
    }

    /// Set the node's weight in the group: its share of the buckets is proportional to it
    /// (see [`policy`](lease_core::policy)). Stored in the store (rule K1) under the node's
    /// own session: at once if the node is a member of the group, otherwise right after its
    /// next join; and set again after every later join (each new session), over a `leasectl
    /// weight` set meanwhile. Every member sees it at its next heartbeat. A node that has no
    /// session (another live process holds its node id, and the store refuses it) writes
    /// nothing: the weight is applied if it ever joins.
    pub async fn set_weight(&self, weight: Weight) -> Result<(), GroupError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::SetWeight {
                group: self.group.clone(),
                weight,
                reply,
            })
            .map_err(|_| GroupError::NodeEnded)?;
        answer.await.unwrap_or(Err(GroupError::NodeEnded))
    }
}

impl std::fmt::Debug for GroupHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupHandle")
            .field("group", &self.group)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl NodeHandle {
    /// The node's id.
    pub fn node_id(&self) -> NodeId {
        self.node
    }

    /// The token that stops this run of the node when cancelled (a child of the
    /// configuration's token, whose cancellation also stops it).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Whether the node task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Add `group`, split into `shards` buckets, to the node, delivering its events to
    /// `handler`: the group is created if needed (a shard-count mismatch is refused), joined
    /// at once and shared from then on.
    pub async fn add_group<H: OwnershipHandler>(
        &self,
        group: GroupName,
        shards: ShardCount,
        handler: H,
    ) -> Result<GroupHandle, GroupError> {
        self.add(group, shards, Handler(handler)).await
    }

    /// Like [`add_group`](Self::add_group), handing the application a
    /// [`BucketLease`](crate::BucketLease) per bucket of the group it owns instead of calling a
    /// handler (see [`LeaseWorker::start_leases`]). Up to 64 leases wait in the channel before
    /// the group waits for the application to take them.
    pub async fn add_group_leases(
        &self,
        group: GroupName,
        shards: ShardCount,
    ) -> Result<(GroupHandle, Leases), GroupError> {
        let (sender, leases) = LeaseSender::new(64, self.trust.clone());
        let handle = self.add(group, shards, sender).await?;
        Ok((handle, leases))
    }

    async fn add<A: Application>(
        &self,
        group: GroupName,
        shards: ShardCount,
        app: A,
    ) -> Result<GroupHandle, GroupError> {
        if self.is_finished() || self.cancel.is_cancelled() {
            return Err(GroupError::NodeEnded);
        }
        let (prepared, owned, ended) = prepare(
            self.store.as_ref(),
            group.clone(),
            shards,
            app,
            self.apps.clone(),
        )
        .await?;
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Add {
                prepared: Box::new(prepared),
                reply,
            })
            .map_err(|_| GroupError::NodeEnded)?;
        match answer.await {
            Ok(Added::Yes) => Ok(GroupHandle {
                group,
                owned,
                ended,
                commands: self.commands.clone(),
                node: self.node,
            }),
            Ok(Added::Duplicate) => Err(GroupError::AlreadyAdded { group }),
            Ok(Added::Stopping) | Err(_) => Err(GroupError::NodeEnded),
        }
    }

    /// Remove `group` from the node (revoke everything its application holds, leave the
    /// group, wake its other members) and wait for that. The node's other groups go on.
    pub async fn remove_group(&self, group: &GroupName) -> Result<(), GroupError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Remove {
                group: group.clone(),
                reply,
            })
            .map_err(|_| GroupError::NodeEnded)?;
        match answer.await {
            Ok(Some(mut ended)) => wait_ended(&mut ended).await,
            Ok(None) => Err(GroupError::NotAdded {
                group: group.clone(),
            }),
            Err(_) => Err(GroupError::NodeEnded),
        }
    }

    /// Stop gracefully (revoke everything in every group, leave every group, wake the peers)
    /// and wait for it. Returns how the task ended: an error if the node had failed before it
    /// was asked to stop, or [`WorkerFailed::GroupsNotLeft`] if it could not leave some group
    /// (its leases there expire after the ttl instead of passing on at once).
    pub async fn shutdown(mut self) -> Result<(), WorkerFailed> {
        self.cancel.cancel();
        self.wait().await
    }

    /// Wait until the node task ends, without asking it to: after its token is cancelled, or
    /// because it failed (a handler panicked, or the store answered a heartbeat in a way
    /// retrying cannot change). Every group's owned set is empty either way.
    pub async fn wait(&mut self) -> Result<(), WorkerFailed> {
        wait_task(&mut self.task).await
    }

    /// Stop the task at once, without revoking or leaving: what a crash looks like to the
    /// other nodes (tests and demos).
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn wait_task(
    task: &mut Option<JoinHandle<Result<(), WorkerFailed>>>,
) -> Result<(), WorkerFailed> {
    let Some(running) = task.as_mut() else {
        return Ok(());
    };
    let result = running.await;
    *task = None;
    match result {
        Ok(ended) => ended,
        Err(e) if e.is_panic() => Err(WorkerFailed::HandlerPanicked {
            message: panic_message(e.into_panic()),
        }),
        Err(_) => Err(WorkerFailed::Cancelled),
    }
}

impl Drop for NodeHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

impl LeaseNode {
    /// Start the node task on the current tokio runtime, with no group yet: add them with
    /// [`NodeHandle::add_group`]. A node without groups makes no store call. Refused if this
    /// configuration (or a clone) runs already.
    pub fn start<S>(&self, store: S) -> Result<NodeHandle, StartError>
    where
        S: WorkerStore + 'static,
    {
        let running = self.running.claim_node(self.node)?;
        let store: Arc<dyn WorkerStore> = Arc::new(store);
        // A token of this run's own: stopping it (its handle's shutdown, or dropping the
        // handle) must not stop the configuration's later runs, while cancelling the
        // configuration's token still stops every run.
        let cancel = self.cancel.child_token();
        let parts = launch(
            self.node,
            self.timing,
            self.metadata.clone(),
            store.clone(),
            cancel.clone(),
            running,
            false,
        );
        let span = tracing::info_span!("lease_node", node = %self.node);
        let task = tokio::spawn(tracing::Instrument::instrument(parts.driver.run(), span));
        Ok(NodeHandle {
            node: self.node,
            cancel,
            task: Some(task),
            commands: parts.commands,
            apps: parts.apps,
            store,
            trust: parts.trust,
        })
    }
}

/// A running worker. Dropping it stops the worker gracefully in the background; call
/// [`shutdown`](Self::shutdown) to wait for that.
#[derive(Debug)]
pub struct WorkerHandle {
    worker: NodeId,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), WorkerFailed>>>,
    owned: watch::Receiver<Owned>,
}

impl WorkerHandle {
    /// The worker's id.
    pub fn node_id(&self) -> NodeId {
        self.worker
    }

    /// The buckets the application owns right now; changes as events are delivered.
    pub fn owned(&self) -> watch::Receiver<Owned> {
        self.owned.clone()
    }

    /// The token that stops this run of the worker when cancelled (a child of the
    /// configuration's token, whose cancellation also stops it).
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Whether the worker task has ended.
    pub fn is_finished(&self) -> bool {
        self.task.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Stop gracefully (revoke everything, leave the group, wake the peers) and wait for it.
    /// Returns how the task ended: an error if it had failed before it was asked to stop, or
    /// [`WorkerFailed::LeaveFailed`] if it could not leave the group (its leases then expire
    /// after the ttl instead of passing on at once).
    pub async fn shutdown(mut self) -> Result<(), WorkerFailed> {
        self.cancel.cancel();
        self.wait().await
    }

    /// Wait until the worker task ends, without asking it to: after its token is cancelled,
    /// or because it failed (a handler panicked, or the store answered in a way retrying
    /// cannot change). A failure is an error; the owned set is empty either way.
    pub async fn wait(&mut self) -> Result<(), WorkerFailed> {
        wait_task(&mut self.task).await
    }

    /// Stop the task at once, without revoking or leaving: what a crash looks like to the
    /// other workers (tests and demos).
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// The text a panic was raised with, when it was text.
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&'static str>().map_or_else(
            || "a panic without a message".to_owned(),
            |s| (*s).to_owned(),
        ),
    }
}

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Why a worker or a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The store refused: the group exists with another shard count, or the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// This configuration (or a clone of it) is running already: two tasks of one worker
    /// would break contract rule G8 (one caller per incarnation) and compete for its session.
    /// (A configuration built anew with the same node id starts, and is refused by the store
    /// while the other's session lives: `StoreError::NodeIdInUse`.)
    #[error(
        "worker {worker} of group {group:?} is running already; stop it before starting it again"
    )]
    AlreadyRunning {
        /// The group.
        group: GroupName,
        /// The node id.
        worker: NodeId,
    },
    /// This node configuration (or a clone of it) is running already, for the same reason.
    #[error("node {node} is running already; stop it before starting it again")]
    NodeAlreadyRunning {
        /// The node id.
        node: NodeId,
    },
}

impl StartError {
    /// The store's error, if that is why.
    pub fn store_error(&self) -> Option<&StoreError> {
        match self {
            Self::Store(e) => Some(e),
            Self::AlreadyRunning { .. } | Self::NodeAlreadyRunning { .. } => None,
        }
    }
}

impl LeaseWorker {
    /// Create the group if needed (failing on a shard-count mismatch), subscribe to its
    /// wake-ups, and start the worker task on the current tokio runtime, delivering events
    /// to `handler`. Refused if this process already runs this node id in this group.
    pub async fn start<S, H>(self, store: S, handler: H) -> Result<WorkerHandle, StartError>
    where
        S: WorkerStore + 'static,
        H: OwnershipHandler,
    {
        let (handle, _) = self.launch(store, |_| (Handler(handler), ())).await?;
        Ok(handle)
    }

    /// Like [`start`](Self::start), handing the application a [`BucketLease`](crate::BucketLease) per bucket it
    /// owns instead of calling a handler: work on a bucket until the lease's
    /// [`revoked`](crate::BucketLease::revoked) fires, then drop the lease. The worker releases a
    /// shed bucket only once its lease is dropped (see
    /// [`revoke_ack_limit`](crate::LeaseWorkerBuilder::revoke_ack_limit) for an application
    /// that does not). Up to 64 leases wait in the channel before the worker waits for the
    /// application to take them.
    pub async fn start_leases<S>(self, store: S) -> Result<(WorkerHandle, Leases), StartError>
    where
        S: WorkerStore + 'static,
    {
        self.launch(store, |trust| LeaseSender::new(64, trust))
            .await
    }

    /// Run as a node of one group: the node stops when the group ends, and ends with the
    /// group's result.
    async fn launch<S, A, T>(
        self,
        store: S,
        app: impl FnOnce(Trust) -> (A, T),
    ) -> Result<(WorkerHandle, T), StartError>
    where
        S: WorkerStore + 'static,
        A: Application,
    {
        let running = self.running.claim(&self.group, self.worker)?;
        let store: Arc<dyn WorkerStore> = Arc::new(store);
        let cancel = self.cancel.child_token();
        let mut parts = launch(
            self.worker,
            self.timing,
            self.metadata.clone(),
            store.clone(),
            cancel.clone(),
            running,
            true,
        );
        let (app, extra) = app(parts.trust.clone());
        let (prepared, owned, _) = prepare(
            store.as_ref(),
            self.group.clone(),
            self.shards,
            app,
            parts.apps.clone(),
        )
        .await?;
        let Prepared {
            group,
            shards,
            slot,
        } = prepared;
        parts.driver.machine.add_group(now(), group.clone(), shards);
        parts.driver.groups.insert(group, slot);
        let worker = self.worker;
        let span = tracing::info_span!("lease_worker", group = %self.group, worker = %worker);
        let task = tokio::spawn(tracing::Instrument::instrument(parts.driver.run(), span));
        Ok((
            WorkerHandle {
                worker,
                cancel,
                task: Some(task),
                owned,
            },
            extra,
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::event_channel;
    use lease_core::MockWorkerStore;
    use lease_core::{Clock, ManualClock};
    use lease_core::{GroupBeat, GroupView, Heartbeat, Lease, MemberLoad, SessionId, ViewStamp};

    /// Counts of each store call the mock saw.
    #[derive(Default)]
    struct Calls {
        ensure: AtomicUsize,
        changes: AtomicUsize,
        heartbeat: AtomicUsize,
        join: AtomicUsize,
        claim: AtomicUsize,
        release: AtomicUsize,
        leave: AtomicUsize,
        joined: Mutex<BTreeSet<GroupName>>,
    }

    impl Calls {
        fn get(n: &AtomicUsize) -> usize {
            n.load(Ordering::SeqCst)
        }

        fn count(n: &AtomicUsize) -> usize {
            n.fetch_add(1, Ordering::SeqCst)
        }
    }

    /// In steady state (the node holds its fair share of each of its two groups, nothing
    /// claimable) a tick is one heartbeat for both groups and nothing else. Every call is
    /// counted by the mock and the counts are checked here, after the node stopped: an
    /// expectation checked when the mock drops inside the node task would only be logged.
    #[tokio::test(start_paused = true)]
    async fn a_steady_tick_is_one_heartbeat_for_every_group() {
        let me = NodeId::new();
        let other = NodeId::new();
        let session = SessionId::new();
        let now = ManualClock::new().now();
        let shards = ShardCount::new(8).unwrap();
        let calls = Arc::new(Calls::default());
        let mut store = MockWorkerStore::new();
        let c = calls.clone();
        store.expect_ensure_group().returning(move |_, _| {
            Calls::count(&c.ensure);
            Ok(())
        });
        let c = calls.clone();
        store.expect_changes().returning(move |_| {
            Calls::count(&c.changes);
            Ok(None)
        });
        let c = calls.clone();
        store.expect_join().returning(move |group, _, joined| {
            assert_eq!(joined, session, "joined under another session");
            Calls::count(&c.join);
            c.joined.lock().unwrap().insert(group.clone());
            Ok(())
        });
        let c = calls.clone();
        store.expect_heartbeat().returning(move |node, _, _, _, _| {
            let first = Calls::count(&c.heartbeat) == 0;
            let groups = c
                .joined
                .lock()
                .unwrap()
                .iter()
                .map(|group| {
                    let owned: Vec<Lease> = (0..4)
                        .map(|b| Lease {
                            bucket: Bucket(b),
                            shards,
                            owner: node,
                            token: FencingToken(1),
                            expires_at: now,
                        })
                        .collect();
                    let mut members = vec![MemberLoad::new(node, 4), MemberLoad::new(other, 4)];
                    members.sort_by_key(|m| m.worker);
                    GroupBeat {
                        group: group.clone(),
                        view: GroupView::new(shards, members, 0),
                        owned,
                        stamp: ViewStamp::default(),
                        quarantined: Vec::new(),
                    }
                })
                .collect();
            Ok(Heartbeat {
                session,
                new_session: first,
                observed_at: now,
                expires_at: now,
                groups,
                unchanged: Vec::new(),
            })
        });
        let c = calls.clone();
        store.expect_claim().returning(move |_, _, _, _, _| {
            Calls::count(&c.claim);
            Ok(Vec::new())
        });
        let c = calls.clone();
        store.expect_release().returning(move |_, _, _, _| {
            Calls::count(&c.release);
            Ok(Vec::new())
        });
        let c = calls.clone();
        store.expect_leave().returning(move |_, _, left| {
            assert_eq!(left, session, "the node left under another session");
            Calls::count(&c.leave);
            Ok(Vec::new())
        });

        let node = LeaseNode::builder()
            .node_id(me)
            .ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_secs(1))
            .build()
            .unwrap()
            .start(store)
            .unwrap();
        let mut events = Vec::new();
        let mut handles = Vec::new();
        for name in ["orders", "billing"] {
            let (handler, rx) = event_channel(64);
            events.push(rx);
            handles.push(
                node.add_group(GroupName::new(name).unwrap(), shards, handler)
                    .await
                    .unwrap(),
            );
        }
        // The first tick heartbeats, joins both groups and heartbeats again for their views,
        // all at 0 s; then one heartbeat per tick for both, at 1 s, 2 s, ... 10 s.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Calls::get(&calls.heartbeat);
        assert!(started <= 3, "{started} heartbeats to start");
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!node.is_finished(), "the node stopped");
        for h in &handles {
            assert_eq!(h.owned().borrow().len(), 4, "{}", h.group());
        }
        node.shutdown().await.expect("a clean stop");
        assert_eq!(Calls::get(&calls.ensure), 2, "ensure_group calls");
        assert_eq!(Calls::get(&calls.changes), 2, "changes calls");
        assert_eq!(Calls::get(&calls.join), 2, "join calls");
        assert_eq!(
            Calls::get(&calls.heartbeat) - started,
            10,
            "heartbeats in 10 s of steady state"
        );
        assert_eq!(Calls::get(&calls.claim), 0, "claims in steady state");
        assert_eq!(Calls::get(&calls.release), 0, "releases in steady state");
        assert_eq!(Calls::get(&calls.leave), 2, "leave calls");
        for (mut rx, h) in events.into_iter().zip(&handles) {
            let mut assigned = 0;
            let mut revoked = 0;
            while let Ok(e) = rx.try_recv() {
                match e {
                    lease_core::OwnershipEvent::Assigned(_) => assigned += 1,
                    lease_core::OwnershipEvent::Revoked { reason, .. } => {
                        assert_eq!(reason, RevokeReason::Shutdown);
                        revoked += 1;
                    }
                }
            }
            assert_eq!((assigned, revoked), (4, 4), "{}", h.group());
        }
    }
}
