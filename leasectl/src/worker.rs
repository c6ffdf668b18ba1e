//! `leasectl worker`: one worker on Postgres until SIGTERM or SIGINT.

use std::time::Duration;

use async_trait::async_trait;
use clap::Args;
use lease::{
    Assignment, Bucket, Chain, ConfigError, FencingToken, LeaseStore, LeaseWorker, MemberMetadata,
    OwnershipHandler, RevokeReason, ShardCount, WorkerError, WorkerFailed, WorkerId,
};
use serde_json::{Value, json};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::common::{DbArgs, Failure, group_arg, now_rfc3339, store_failure};
use crate::duration::{self, show};
use crate::output::{self, SharedOutput};

/// `leasectl worker`'s arguments.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group (subscription, consumer group) to share.
    #[arg(long)]
    group: String,
    /// How many buckets the group has; must match the stored group if it exists.
    #[arg(long)]
    shards: u32,
    /// A stable worker id (a UUID), e.g. a stateful-set pod's, instead of a fresh one per
    /// start. While another process holds this id's live session, this one waits for that
    /// session to end (printing an error each time it is refused) and never shares it.
    #[arg(long, value_name = "UUID")]
    worker_id: Option<String>,
    /// How long the worker's session lives after a heartbeat (e.g. 500ms, 3s, 1m).
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    ttl: Duration,
    /// How often the worker heartbeats and re-plans; the ttl must exceed twice this.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    renew: Duration,
    /// How long before the store could expire its leases the worker stops trusting them
    /// (default: a sixth of the ttl); must be positive and below ttl - 1.5 x renew.
    #[arg(long, value_parser = duration::parse)]
    margin: Option<Duration>,
    /// Print one JSON object per line on stdout instead of readable lines.
    #[arg(long)]
    json: bool,
    /// Serve Prometheus metrics on this address, e.g. 127.0.0.1:9464.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
}

/// Prints the worker's events on stdout, one line each, flushed at once. Once stdout fails the
/// worker is stopped gracefully (through the shared output's token, the worker's own).
#[derive(Clone)]
struct Printer {
    json: bool,
    group: String,
    worker: WorkerId,
    out: SharedOutput,
}

impl Printer {
    /// Print one event; false if stdout failed, now or earlier.
    fn emit(&self, event: &str, fields: Value, readable: String) -> bool {
        let line = if self.json {
            let mut object = json!({
                "event": event,
                "group": self.group,
                "worker": self.worker.to_string(),
            });
            if let (Some(map), Value::Object(extra)) = (object.as_object_mut(), fields) {
                map.extend(extra);
                map.insert("at".into(), Value::String(now_rfc3339()));
            }
            object.to_string()
        } else {
            format!("{} {readable}", now_rfc3339())
        };
        self.out.line(line)
    }

    fn error(&self, message: &str) {
        self.emit(
            "error",
            json!({ "message": message }),
            format!("error: {message}"),
        );
    }
}

#[async_trait]
impl OwnershipHandler for Printer {
    async fn on_assigned(&self, assignment: Assignment) {
        let Assignment {
            bucket,
            token,
            shards,
            resized_from,
        } = assignment;
        let parents = assignment.parents();
        let continues = match resized_from {
            Some(from) => format!(
                ", continuing bucket(s) {} of {from}",
                parents
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => String::new(),
        };
        self.emit(
            "assigned",
            json!({
                "bucket": bucket.get(),
                "token": token.get(),
                "shards": shards.get(),
                "parents": parents.iter().map(|b| b.get()).collect::<Vec<_>>(),
            }),
            format!("assigned bucket {bucket} of {shards} (token {token}{continues})"),
        );
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        self.emit(
            "revoked",
            json!({ "bucket": bucket.get(), "token": token.get(), "reason": reason.as_str() }),
            format!(
                "revoked bucket {bucket} (token {token}): {}",
                reason.as_str()
            ),
        );
    }

    async fn on_error(&self, error: &WorkerError) {
        self.error(&Chain(error).to_string());
    }
}

fn config_failure(e: ConfigError, args: &WorkerArgs) -> Failure {
    Failure::Usage(match e {
        ConfigError::RenewIntervalZero => "--renew must be positive".to_owned(),
        ConfigError::TtlTooShort { .. } => format!(
            "--ttl {} must be more than twice --renew {}, so one failed heartbeat does not \
             lose the leases",
            show(args.ttl),
            show(args.renew)
        ),
        ConfigError::MarginTooLarge { margin, limit } => format!(
            "--margin {} must be below --ttl minus 1.5 x --renew ({}), so the leases stay \
             trusted until the next renewal is answered",
            show(margin),
            show(limit)
        ),
        ConfigError::MarginZero => "--margin must be positive".to_owned(),
        ConfigError::Ttl(e) => format!("--ttl: {e}"),
        // The debounce is not a flag: a renew interval this short is what the user can change.
        ConfigError::DebounceTooLong { debounce, .. } => format!(
            "--renew {} must exceed the {} wake-up debounce (the pause that folds a burst of \
             wake-ups into one re-plan)",
            show(args.renew),
            show(debounce)
        ),
        other => other.to_string(),
    })
}

/// SIGTERM and SIGINT, both meaning "stop".
struct Signals(Option<(Signal, Signal)>);

impl Signals {
    /// Listen from now on: a signal sent once this returns is never missed.
    fn listen() -> Self {
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Self(Some((term, int))),
            _ => {
                tracing::error!("cannot listen for SIGTERM/SIGINT; stop the worker with SIGKILL");
                Self(None)
            }
        }
    }

    /// The next SIGTERM or SIGINT (never, if they cannot be listened for).
    async fn recv(&mut self) {
        match &mut self.0 {
            Some((term, int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Run the worker until a signal stops it, stdout fails, or the worker fails.
pub async fn run(args: WorkerArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let shards =
        ShardCount::new(args.shards).map_err(|e| Failure::Usage(format!("--shards: {e}")))?;
    let cancel = CancellationToken::new();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let metadata = MemberMetadata::new(format!("host={host} pid={}", std::process::id()))
        .map_err(|e| Failure::Runtime(format!("worker metadata: {e}")))?;
    let mut builder = LeaseWorker::builder(group.clone(), shards)
        .ttl(args.ttl)
        .renew_interval(args.renew)
        .metadata(metadata)
        .cancellation_token(cancel.clone());
    if let Some(margin) = args.margin {
        builder = builder.safety_margin(margin);
    }
    if let Some(id) = &args.worker_id {
        let id: WorkerId = id
            .parse()
            .map_err(|e| Failure::Usage(format!("--worker-id: {e}")))?;
        builder = builder.worker_id(id);
    }
    let config = builder.build().map_err(|e| config_failure(e, &args))?;
    let worker = config.worker_id();
    if let Some(addr) = args.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| Failure::Usage(format!("--metrics-addr {addr}: {e}")))?;
    }
    let store = args.db.open().await?;
    // Refuse a shard-count mismatch before announcing anything (start checks it again).
    store
        .ensure_group(&group, shards)
        .await
        .map_err(store_failure)?;
    // From here on a signal stops the worker instead of killing the process; until here,
    // nothing is held that a kill could leave behind.
    let mut signals = Signals::listen();
    let printer = Printer {
        json: args.json,
        group: group.as_str().to_owned(),
        worker,
        out: SharedOutput::new(cancel.clone()),
    };
    let out = printer.out.clone();
    let announce = printer.clone();
    // Announced before the task starts, so "started" precedes the first assignment.
    let announced = announce.emit(
        "started",
        json!({}),
        format!(
            "worker {worker} started in group {:?} ({shards} shards, ttl {}, renew {})",
            group.as_str(),
            show(args.ttl),
            show(args.renew)
        ),
    );
    if !announced {
        return out.check();
    }
    let mut handle = config.start(store, printer).await.map_err(|e| match e {
        lease::StartError::Store(e) => store_failure(e),
        other => Failure::Runtime(Chain(&other).to_string()),
    })?;
    let ended = tokio::select! {
        () = signals.recv() => {
            output::error_line(
                "leasectl: stopping: revoking every bucket and leaving the group (send SIGTERM \
                 or SIGINT again to stop at once, without leaving)",
            );
            None
        }
        // Stdout failed: the printer cancelled the worker.
        () = cancel.cancelled() => None,
        ended = handle.wait() => Some(ended),
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            cancel.cancel();
            tokio::select! {
                ended = handle.wait() => ended,
                () = signals.recv() => {
                    // The graceful stop may wait on a database that does not answer for as
                    // long as a call's timeout; the operator chose not to.
                    let message = format!(
                        "stopped at once by a second signal, without leaving the group: its \
                         leases stay in the store until they expire (ttl {}), and only then do \
                         other workers take its buckets",
                        show(args.ttl)
                    );
                    announce.error(&message);
                    return Err(Failure::Runtime(message));
                }
            }
        }
    };
    match ended {
        Ok(()) if cancel.is_cancelled() => {
            out.check()?;
            announce.emit("stopped", json!({}), format!("worker {worker} stopped"));
            out.check()
        }
        // The task ended without being asked to: say so and exit, rather than wait for a
        // signal with nothing running.
        Ok(()) => Err(worker_failure(&announce, WorkerFailed::Cancelled, &args)),
        Err(e) => Err(worker_failure(&announce, e, &args)),
    }
}

/// How a worker task that failed ends the command, said on stdout as an `error` event too.
fn worker_failure(announce: &Printer, failed: WorkerFailed, args: &WorkerArgs) -> Failure {
    let message = match &failed {
        WorkerFailed::LeaveFailed { .. } => format!(
            "{}; its leases stay in the store until they expire (ttl {}), and only then \
             do other workers take its buckets",
            Chain(&failed),
            show(args.ttl)
        ),
        other => Chain(other).to_string(),
    };
    announce.error(&message);
    match failed {
        WorkerFailed::Store(e) => store_failure(e),
        _ => Failure::Runtime(message),
    }
}
