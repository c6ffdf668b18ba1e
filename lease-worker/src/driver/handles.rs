//! What applications hold of a running node: its handle, its groups' handles, a worker's
//! handle, and how starting and adding can fail.

use std::sync::Arc;

use lease_core::{Bucket, GroupName, Load, NodeId, ShardCount, StoreError, Weight, WorkerStore};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use super::{Added, Command, Ended, Prepared, launch, prepare};
use crate::application::{AppEvent, Application, Handler, panic_message};
use crate::config::{LeaseNode, LeaseWorker};
use crate::events::{OwnershipHandler, WorkerFailed};
use crate::leases::{LeaseSender, Leases, Trust};
use crate::machine::Owned;
use crate::registry::StartError;

/// A running node: add groups to it, remove them, stop it. Dropping it stops the node
/// gracefully in the background (every group revoked and left); call
/// [`shutdown`](Self::shutdown) to wait for that.
pub struct NodeHandle {
    node: NodeId,
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<(), WorkerFailed>>>,
    commands: mpsc::UnboundedSender<Command>,
    apps: mpsc::UnboundedSender<(GroupName, AppEvent)>,
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

    /// Report how busy `bucket` is now (events per second, CPU seconds per second, lag: any
    /// non-negative measure, the same for every bucket of the group). Call it as often as the
    /// application measures; the node smooths the samples in time (see
    /// [`LeaseNodeBuilder::load_half_life`](crate::LeaseNodeBuilder::load_half_life)), and
    /// publishes a bucket's smoothed load only when it moved by more than 10 %, so a steady
    /// heartbeat stays one statement. Once any bucket of the group has a load, every member
    /// balances the group's load rather than its bucket count (see
    /// [`balance`](lease_core::balance)); with no load reported, nothing changes. A sample
    /// for a bucket the node does not hold is dropped. Never waits.
    pub fn report_load(&self, bucket: Bucket, load: Load) -> Result<(), GroupError> {
        report_load(&self.commands, &self.group, bucket, load)
    }

    /// A cheap, cloneable handle that reports loads in this group, for the tasks that
    /// measure them (one per bucket, say).
    pub fn load_reporter(&self) -> LoadReporter {
        LoadReporter {
            group: self.group.clone(),
            commands: self.commands.clone(),
        }
    }
}

/// Reports loads in one group of a running node (see [`GroupHandle::report_load`]).
#[derive(Clone)]
pub struct LoadReporter {
    group: GroupName,
    commands: mpsc::UnboundedSender<Command>,
}

impl LoadReporter {
    /// Report how busy `bucket` is now, as [`GroupHandle::report_load`] does.
    pub fn report(&self, bucket: Bucket, load: Load) -> Result<(), GroupError> {
        report_load(&self.commands, &self.group, bucket, load)
    }
}

impl std::fmt::Debug for LoadReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadReporter")
            .field("group", &self.group)
            .finish_non_exhaustive()
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

    /// Until when the node trusts its leases, as of its last renewal: `ttl - margin` after
    /// the last answered heartbeat was sent, moved at every renewal; `None` while nothing is
    /// trusted (before the first heartbeat, after a missed deadline, once stopped). The same
    /// deadline as every [`BucketLease::trusted_until`](crate::BucketLease::trusted_until) of
    /// the node, for code that must act *before* it on everything the node holds (a
    /// supervisor that has its children killed before it, by another process if need be).
    pub fn trust(&self) -> watch::Receiver<Option<std::time::Instant>> {
        self.trust.clone()
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
        let (prepared, owned, ended) = prepare(group.clone(), shards, app, self.apps.clone());
        add(&self.commands, prepared).await?;
        Ok(GroupHandle {
            group,
            owned,
            ended,
            commands: self.commands.clone(),
            node: self.node,
        })
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

/// Hand a group to the node task and wait until the machine admitted it (ensured it in the
/// store and subscribed to it) or it was refused.
async fn add(
    commands: &mpsc::UnboundedSender<Command>,
    prepared: Prepared,
) -> Result<(), GroupError> {
    let group = prepared.group.clone();
    let (reply, answer) = oneshot::channel();
    commands
        .send(Command::Add {
            prepared: Box::new(prepared),
            reply,
        })
        .map_err(|_| GroupError::NodeEnded)?;
    match answer.await {
        Ok(Added::Yes) => Ok(()),
        Ok(Added::Refused(e)) => Err(GroupError::Store(e)),
        Ok(Added::Duplicate) => Err(GroupError::AlreadyAdded { group }),
        Ok(Added::Stopping) | Err(_) => Err(GroupError::NodeEnded),
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
        let node = self.node_id();
        let running = self.running.claim_node(node)?;
        let store: Arc<dyn WorkerStore> = Arc::new(store);
        // A token of this run's own: stopping it (its handle's shutdown, or dropping the
        // handle) must not stop the configuration's later runs, while cancelling the
        // configuration's token still stops every run.
        let cancel = self.cancel.child_token();
        let parts = launch(self.rules(), store, cancel.clone(), running, false);
        let span = tracing::info_span!("lease_node", node = %node);
        // The node task logs (and makes its calls) with its starter's subscriber.
        let run = tracing::Instrument::instrument(parts.driver.run(), span);
        let task = tokio::spawn(run.with_current_subscriber());
        Ok(NodeHandle {
            node,
            cancel,
            task: Some(task),
            commands: parts.commands,
            apps: parts.apps,
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
    group: GroupName,
    commands: mpsc::UnboundedSender<Command>,
}

/// Hand a load sample to the node task; an error only if the task is gone.
fn report_load(
    commands: &mpsc::UnboundedSender<Command>,
    group: &GroupName,
    bucket: Bucket,
    load: Load,
) -> Result<(), GroupError> {
    commands
        .send(Command::ReportLoad {
            group: group.clone(),
            bucket,
            load,
        })
        .map_err(|_| GroupError::NodeEnded)
}

impl WorkerHandle {
    /// Report how busy `bucket` is now, as [`GroupHandle::report_load`] does for a node's
    /// group.
    pub fn report_load(&self, bucket: Bucket, load: Load) -> Result<(), GroupError> {
        report_load(&self.commands, &self.group, bucket, load)
    }

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

impl Drop for WorkerHandle {
    fn drop(&mut self) {
        self.cancel.cancel();
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
        let worker = self.node.node_id();
        let running = self.node.running.claim(&self.group, worker)?;
        let store: Arc<dyn WorkerStore> = Arc::new(store);
        let cancel = self.node.cancel.child_token();
        let parts = launch(self.node.rules(), store, cancel.clone(), running, true);
        let (app, extra) = app(parts.trust.clone());
        let (prepared, owned, _) = prepare(self.group.clone(), self.shards, app, parts.apps);
        let span = tracing::info_span!("lease_worker", group = %self.group, worker = %worker);
        // The node task logs (and makes its calls) with its starter's subscriber.
        let run = tracing::Instrument::instrument(parts.driver.run(), span);
        let task = tokio::spawn(run.with_current_subscriber());
        if let Err(e) = add(&parts.commands, prepared).await {
            // Refused: the node, which has no group, stops at once.
            cancel.cancel();
            return Err(match e {
                GroupError::Store(e) => StartError::Store(e),
                _ => StartError::Store(StoreError::backend_detail(
                    lease_core::Operation::EnsureGroup,
                    lease_core::BackendFailure::Other,
                    format!("the worker task ended before its group was added: {e}"),
                )),
            });
        }
        Ok((
            WorkerHandle {
                worker,
                cancel,
                task: Some(task),
                owned,
                group: self.group.clone(),
                commands: parts.commands.clone(),
            },
            extra,
        ))
    }
}
