//! `leasectl worker`: one worker on Postgres until SIGTERM or SIGINT.

use std::io::Write;

use async_trait::async_trait;
use lease::{
    Bucket, ConfigError, FencingToken, LeaseStore, LeaseWorker, MemberMetadata, OwnershipHandler,
    RevokeReason, ShardCount, WorkerError, WorkerFailed, WorkerId,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::duration::show;
use crate::status::{group_arg, now_rfc3339, open, store_failure};
use crate::{Failure, WorkerArgs};

/// Prints the worker's events on stdout, one line each, flushed at once.
struct Printer {
    json: bool,
    group: String,
    worker: WorkerId,
}

impl Printer {
    fn emit(&self, event: &str, fields: Value, readable: String) {
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
        let mut out = std::io::stdout().lock();
        if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
            // Nowhere left to report but the log.
            tracing::error!(error = %e, "cannot write to stdout");
        }
    }
}

#[async_trait]
impl OwnershipHandler for Printer {
    async fn on_assigned(&self, bucket: Bucket, token: FencingToken) {
        self.emit(
            "assigned",
            json!({ "bucket": bucket.get(), "token": token.get() }),
            format!("assigned bucket {bucket} (token {token})"),
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
        self.emit(
            "error",
            json!({ "message": error.to_string() }),
            format!("error: {error}"),
        );
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
        other => other.to_string(),
    })
}

async fn signalled(cancel: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot listen for SIGTERM/SIGINT; stop the worker with SIGKILL");
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    cancel.cancel();
}

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
    let store = open(&args.db).await?;
    // Refuse a shard-count mismatch before announcing anything (start checks it again).
    store
        .ensure_group(&group, shards)
        .await
        .map_err(store_failure)?;
    let printer = Printer {
        json: args.json,
        group: group.as_str().to_owned(),
        worker,
    };
    tokio::spawn(signalled(cancel.clone()));
    let announce = Printer {
        json: args.json,
        group: group.as_str().to_owned(),
        worker,
    };
    // Announced before the task starts, so "started" precedes the first assignment.
    announce.emit(
        "started",
        json!({}),
        format!(
            "worker {worker} started in group {:?} ({shards} shards, ttl {}, renew {})",
            group.as_str(),
            show(args.ttl),
            show(args.renew)
        ),
    );
    let mut handle = config.start(store, printer).await.map_err(store_failure)?;
    let failed = tokio::select! {
        () = cancel.cancelled() => None,
        result = handle.wait() => Some(result),
    };
    let ended = match failed {
        None => handle.shutdown().await,
        // The task ended without being asked to: say so and exit, rather than wait for a
        // signal with nothing running.
        Some(Ok(())) => Err(WorkerFailed::Cancelled),
        Some(Err(e)) => Err(e),
    };
    match ended {
        Ok(()) => {
            announce.emit("stopped", json!({}), format!("worker {worker} stopped"));
            Ok(())
        }
        Err(e) => {
            let message = e.to_string();
            announce.emit(
                "error",
                json!({ "message": message }),
                format!("error: {message}"),
            );
            Err(match e {
                WorkerFailed::Store(e) => store_failure(e),
                other => Failure::Runtime(other.to_string()),
            })
        }
    }
}
