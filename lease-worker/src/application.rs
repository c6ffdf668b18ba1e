//! A group's application as the driver reaches it: a task of its own per group, which hears
//! the group's events one at a time, so that a slow handler in one group delays neither the
//! node's renewals nor the other groups' events.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::FutureExt;
use lease_core::{Assignment, Bucket, FencingToken, GroupName, RevokeReason};
use tokio::sync::mpsc;

use crate::events::{OwnershipHandler, WorkerError, WorkerFailed};

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
pub(crate) enum AppCommand {
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
pub(crate) enum AppEvent {
    Delivered,
    Acked(Bucket),
    /// The application panicked: the node stops at once, as a crashed process would.
    Panicked(String),
    /// The application heard everything; the group's end, handed back.
    Finished(Result<(), WorkerFailed>),
}

/// A group's application task: each event awaited in turn, acknowledgements as they come.
pub(crate) async fn run_app<A: Application>(
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

/// The text a panic was raised with, when it was text.
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(text) => *text,
        Err(payload) => payload.downcast_ref::<&'static str>().map_or_else(
            || "a panic without a message".to_owned(),
            |s| (*s).to_owned(),
        ),
    }
}
