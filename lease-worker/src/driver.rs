//! The tokio task that drives a node's [`Machine`]: a plain executor. It makes the store calls
//! the machine asks for, as they are ([`StoreCall::execute`], each on a task of its own, so
//! the machine can revoke at the trust deadline while a call hangs, and a call it gives up on
//! is dropped), hands each group's events to that group's application task, feeds the machine
//! the answers, the groups' change feeds' wake-ups, the applications' acknowledgements, groups
//! added and removed, weights set and a stop request, and publishes what each application
//! owns, metrics and logs. No rule lives here.
//!
//! The handles applications hold are in `handles`, the application tasks in `crate::application`, what the
//! machine's reports become in `report`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use lease_core::{
    BackendFailure, Bucket, Chain, Change, ChangeFeed, FencingToken, GroupName, Load, ShardCount,
    StoreError, Weight, WorkerStore,
};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use crate::events::WorkerFailed;
use crate::leases::Trust;
use crate::machine::{Answered, Delivery, Input, Machine, Output, Owned, Rules, StoreCall};
use crate::metrics::Metrics;
use crate::registry::Running;

mod handles;
mod report;
#[cfg(test)]
mod tests;

use crate::application::{AppCommand, AppEvent, Application, run_app};
pub use handles::{GroupError, GroupHandle, LoadReporter, NodeHandle, WorkerHandle};

/// A store call in flight: the call, and the task making it.
struct Call {
    call: StoreCall,
    task: JoinHandle<Answered>,
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
    /// The caller adding the group, answered once the machine admitted it (or refused).
    adding: Option<oneshot::Sender<Added>>,
    /// The caller of a weight change the machine is writing, answered with the write's
    /// result.
    weight_reply: Option<oneshot::Sender<Result<(), GroupError>>>,
}

/// A group to add to a node: its application task running, its metrics registered.
pub(crate) struct Prepared {
    group: GroupName,
    shards: ShardCount,
    slot: Slot,
}

/// How a node answered a group to add.
#[derive(Debug)]
pub(crate) enum Added {
    /// Ensured in the store, subscribed to, and being joined.
    Yes,
    /// The store refused it (another shard count) or failed.
    Refused(StoreError),
    /// The node has the group already (or is still removing it).
    Duplicate,
    /// The node is stopping.
    Stopping,
}

/// What a node's handles ask of its task.
pub(crate) enum Command {
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
    ReportLoad {
        group: GroupName,
        bucket: Bucket,
        load: Load,
    },
}

/// Everything a node task needs.
struct Driver {
    machine: Machine,
    store: Arc<dyn WorkerStore>,
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
    /// Held until the task ends: the configuration is running meanwhile.
    _running: Running,
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
async fn answer(call: &mut Option<Call>) -> Answered {
    match call {
        Some(call) => match (&mut call.task).await {
            Ok(answered) => answered,
            // The call's task panicked (a store that panics) or was cancelled: a failure of
            // the operation like any other.
            Err(e) => Answered {
                input: call.call.failed(StoreError::backend_detail(
                    call.call.operation(),
                    BackendFailure::Other,
                    format!("the store call did not finish: {e}"),
                )),
                feed: None,
            },
        },
        None => std::future::pending().await,
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
                answered = answer(&mut self.call) => {
                    self.call = None;
                    self.answered(answered);
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
                let mut slot = slot;
                if self.machine.is_stopping() {
                    reply.send(Added::Stopping).ok();
                } else if self.groups.contains_key(&group)
                    || !self.machine.add_group(group.clone(), shards)
                {
                    reply.send(Added::Duplicate).ok();
                } else {
                    // Answered once the machine admitted the group, or refused it.
                    slot.adding = Some(reply);
                    self.groups.insert(group, slot);
                }
                // Refused, the slot drops here: its application task ends.
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
            Command::ReportLoad {
                group,
                bucket,
                load,
            } => self
                .machine
                .handle(now(), Input::ReportLoad(group, bucket, load)),
        }
    }

    /// Set the node's weight in `group`: the machine writes it under the node's session
    /// once it is a member (now, or after its next join) and after every later join. The
    /// caller hears the write's result when it is made now; otherwise that it was kept.
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
        self.machine
            .handle(now(), Input::SetWeight(group.clone(), weight));
        if self.machine.weight_pending(&group) {
            // An earlier change not written yet is overtaken by this one.
            if let Some(earlier) = slot.weight_reply.replace(reply) {
                earlier.send(Ok(())).ok();
            }
        } else {
            // Not a member under the node's session (yet): its next join writes it.
            reply.send(Ok(())).ok();
        }
    }

    fn spawn(&mut self, call: StoreCall) {
        let store = self.store.clone();
        let made = call.clone();
        // The call runs with the node task's subscriber (the one its starter had), so what
        // the store logs while making it goes where the node's own logs go.
        let making = async move { made.execute(store.as_ref()).await };
        let task = tokio::spawn(making.with_current_subscriber());
        // A call still held here is one the machine gave up on: replacing it stops it.
        self.call = Some(Call { call, task });
    }

    /// A store call answered: what only the driver keeps (a change feed, the callers of an
    /// add or a weight change, metrics) is taken from the answer, and the machine handles it.
    fn answered(&mut self, answered: Answered) {
        let Answered { mut input, feed } = answered;
        let mut subscribed = None;
        match &mut input {
            Input::Claimed(group, Ok(won)) => {
                if let Some(slot) = self.groups.get(group) {
                    slot.metrics.claimed(won.len());
                }
            }
            Input::Subscribed(group, result) => {
                self.subscribed(group, result.as_ref().err(), feed);
                subscribed = Some(group.clone());
            }
            Input::WeightSet(group, result) => {
                if let Some(reply) = self
                    .groups
                    .get_mut(group)
                    .and_then(|slot| slot.weight_reply.take())
                {
                    // The caller hears how the write went (its error is the caller's, not
                    // the application's error hook's).
                    let told = match std::mem::replace(result, Ok(())) {
                        Ok(()) | Err(StoreError::SessionExpired { .. }) => Ok(()),
                        Err(e) => Err(GroupError::Store(e)),
                    };
                    reply.send(told).ok();
                }
            }
            _ => {}
        }
        self.machine.handle(now(), input);
        if let Some(group) = subscribed
            && self.machine.owned(&group).is_some()
            && let Some(reply) = self.groups.get_mut(&group).and_then(|s| s.adding.take())
        {
            reply.send(Added::Yes).ok();
        }
    }

    /// The group's subscription answered: keep its feed, or say why it has none.
    fn subscribed(
        &mut self,
        group: &GroupName,
        error: Option<&StoreError>,
        feed: Option<ChangeFeed>,
    ) {
        let Some(slot) = self.groups.get_mut(group) else {
            return;
        };
        match (error, &feed) {
            // Wake-ups only speed things up; the node still re-plans every interval.
            (Some(e), _) => tracing::warn!(
                %group,
                error = %Chain(e),
                "no change feed; re-planning on the renew interval only"
            ),
            // A store without a feed says why itself (the Postgres store logs it once).
            (None, None) => tracing::debug!(
                %group,
                "the store has no change feed; re-planning on the renew interval only"
            ),
            (None, Some(_)) => {}
        }
        slot.metrics.polling(feed.is_none());
        slot.feed = feed;
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

    /// The machine is done with `group`: its application hears how it ended, then hands the
    /// result back ([`group_ended`](Self::group_ended)).
    fn group_finished(&mut self, group: GroupName, ended: Result<(), WorkerFailed>) {
        if let Some(slot) = self.groups.get_mut(&group)
            && let Some(reply) = slot.adding.take()
        {
            // Never admitted: the caller of the add hears why, and nothing else does (the
            // slot drops, its application task ends).
            let answer = match ended {
                Err(WorkerFailed::Store(e)) => Added::Refused(e),
                _ => Added::Stopping,
            };
            reply.send(answer).ok();
            self.groups.remove(&group);
            if self.single {
                self.machine.handle(now(), Input::Stop);
            }
            return;
        }
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

/// Register `group`'s metrics (on the caller's task: a test's local recorder sees the
/// series) and start its application task: what the node needs to add the group.
pub(crate) fn prepare<A: Application>(
    group: GroupName,
    shards: ShardCount,
    app: A,
    events: mpsc::UnboundedSender<(GroupName, AppEvent)>,
) -> (Prepared, watch::Receiver<Owned>, watch::Receiver<Ended>) {
    let metrics = Metrics::new(&group);
    let (published, owned) = watch::channel(Owned::new());
    let (ended, ended_rx) = watch::channel(None);
    let (app_tx, app_rx) = mpsc::unbounded_channel();
    tokio::spawn(run_app(group.clone(), app, app_rx, events).with_current_subscriber());
    (
        Prepared {
            group,
            shards,
            slot: Slot {
                app: app_tx,
                published: Published(published),
                metrics,
                feed: None,
                ended,
                finishing: false,
                assigning: None,
                adding: None,
                weight_reply: None,
            },
        },
        owned,
        ended_rx,
    )
}

/// The parts of a node task before it starts.
pub(crate) struct Launch {
    commands: mpsc::UnboundedSender<Command>,
    apps: mpsc::UnboundedSender<(GroupName, AppEvent)>,
    trust: Trust,
    driver: Driver,
}

/// A node task of `rules` (their incarnation this start's), not started yet.
pub(crate) fn launch(
    rules: Rules,
    store: Arc<dyn WorkerStore>,
    cancel: CancellationToken,
    running: Running,
    single: bool,
) -> Launch {
    let (commands_tx, commands) = mpsc::unbounded_channel();
    let (apps_tx, apps) = mpsc::unbounded_channel();
    let (trust, watching) = watch::channel(None);
    let driver = Driver {
        machine: Machine::new(rules, now()),
        store,
        cancel,
        commands,
        apps,
        groups: BTreeMap::new(),
        trust,
        call: None,
        single,
        single_result: None,
        not_left: Vec::new(),
        _running: running,
    };
    Launch {
        commands: commands_tx,
        apps: apps_tx,
        trust: watching,
        driver,
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
            Command::ReportLoad {
                group,
                bucket,
                load,
            } => f
                .debug_tuple("ReportLoad")
                .field(group)
                .field(bucket)
                .field(load)
                .finish(),
        }
    }
}
