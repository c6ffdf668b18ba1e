//! `leasectl worker`: one process (a node, one session) in one or several groups on Postgres
//! until SIGTERM, SIGINT or SIGHUP. Its life (flags, store, groups, signals, how it ends) is
//! [`serve`]'s, which `leasectl run` shares: the two differ only in how a group's buckets
//! reach the application ([`Attach`]).

mod groups;
mod signals;

use std::time::Duration;

use async_trait::async_trait;
use clap::Args;
use lease::store::Chain;
use lease::{
    Assignment, Bucket, ConfigError, FencingToken, GroupError, GroupHandle, InvalidInput,
    LeaseNode, MemberMetadata, NodeHandle, NodeId, OwnershipHandler, RevokeReason, StoreError,
    WorkerError, WorkerFailed,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::common::{DbArgs, Store, now_rfc3339, store_failure};
use crate::duration::{self, show};
use crate::output::Failure;
use crate::output::{self, SharedOutput};
pub use groups::GroupArg;
use groups::{check_group, group_args, group_failure};
use signals::Signals;

/// `leasectl worker`'s arguments.
#[derive(Args, Debug)]
pub struct WorkerArgs {
    #[command(flatten)]
    db: DbArgs,
    /// A group (subscription, consumer group) to share: `NAME` with `--shards N`, or
    /// `NAME:SHARDS`, repeatable (`--group orders:16 --group billing:64`): one process, one
    /// session, in every group given.
    #[arg(long, required = true, value_name = "GROUP[:SHARDS]")]
    group: Vec<String>,
    /// How many buckets the group has, with one plain `--group NAME`; must match the stored
    /// group if it exists.
    #[arg(long)]
    shards: Option<u32>,
    /// A stable node id (a UUID), e.g. a stateful-set pod's, instead of a fresh one per
    /// start: the process's id in every group. While another process holds this id's live
    /// session, this one waits for that session to end (printing an error each time it is
    /// refused) and never shares it.
    #[arg(long, value_name = "UUID", alias = "worker-id")]
    node_id: Option<String>,
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
    /// This worker's weight in every group it runs: targets are proportional to weights
    /// (default: the weight stored for it, 1 for a new member). Stored in the database, so it
    /// is set again at each join of this process (each new session), over a `leasectl weight`
    /// set meanwhile.
    #[arg(long, value_parser = crate::controls::parse_weight)]
    weight: Option<lease::Weight>,
    /// On SIGTERM/SIGINT/SIGHUP, revoke everything in the application (reason shutdown), then hand
    /// the session over for this long instead of leaving (e.g. 15s): a process started with
    /// the same --node-id within it takes over the session and its buckets with their
    /// tokens, and nobody else claims them meanwhile. For rolling restarts; needs --node-id.
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    keep_on_stop: Option<Duration>,
}

impl WorkerArgs {
    /// How many `--group`s were given.
    pub fn group_count(&self) -> usize {
        self.group.len()
    }
}

/// How a node's groups reach the application: `leasectl worker` prints each event
/// ([`Printing`]); `leasectl run` has a child process work each bucket.
#[async_trait]
pub trait Attach: Send + Sync {
    /// The node started on `store`: what runs beside it starts now, before any group is
    /// added.
    fn started(&self, _store: &Store, _node: &NodeHandle) {}

    /// Add group `g` to `node`, its events said through `printer`.
    async fn add(
        &self,
        node: &NodeHandle,
        g: &GroupArg,
        printer: Printer,
    ) -> Result<GroupHandle, GroupError>;
}

/// `leasectl worker`'s application: every event printed, a revocation acknowledged once it is.
pub struct Printing;

#[async_trait]
impl Attach for Printing {
    async fn add(
        &self,
        node: &NodeHandle,
        g: &GroupArg,
        printer: Printer,
    ) -> Result<GroupHandle, GroupError> {
        node.add_group(g.group.clone(), g.shards, printer).await
    }
}

/// Prints the worker's events on stdout, one line each, flushed at once. Once stdout fails the
/// worker is stopped gracefully (through the shared output's token, the worker's own).
#[derive(Clone)]
pub struct Printer {
    json: bool,
    group: String,
    worker: NodeId,
    out: SharedOutput,
}

impl Printer {
    /// Print one event; false if stdout failed, now or earlier.
    pub fn emit(&self, event: &str, fields: Value, readable: String) -> bool {
        let line = if self.json {
            self.json_line(event, fields)
        } else {
            format!("{} {readable}", now_rfc3339())
        };
        self.out.line(line)
    }

    /// The `--json` line of an event: its name, group and worker, `fields`, and the time.
    pub fn json_line(&self, event: &str, fields: Value) -> String {
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
    }

    /// The group whose events it prints.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// Stdout, shared with everything the command prints.
    pub fn out(&self) -> &SharedOutput {
        &self.out
    }

    /// Print an `error` event.
    pub fn error(&self, message: &str) {
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
        let (fields, readable) = assigned(assignment);
        self.emit("assigned", fields, readable);
    }

    async fn on_revoked(&self, bucket: Bucket, token: FencingToken, reason: RevokeReason) {
        let (fields, readable) = revoked(bucket, token, reason);
        self.emit("revoked", fields, readable);
    }

    async fn on_error(&self, error: &WorkerError) {
        self.error(&Chain(error).to_string());
    }
}

/// An `assigned` event's fields, and its readable line.
pub fn assigned(assignment: Assignment) -> (Value, String) {
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
    (
        json!({
            "bucket": bucket.get(),
            "token": token.get(),
            "shards": shards.get(),
            "parents": parents.iter().map(|b| b.get()).collect::<Vec<_>>(),
        }),
        format!("assigned bucket {bucket} of {shards} (token {token}{continues})"),
    )
}

/// A `revoked` event's fields, and its readable line.
pub fn revoked(bucket: Bucket, token: FencingToken, reason: RevokeReason) -> (Value, String) {
    (
        json!({ "bucket": bucket.get(), "token": token.get(), "reason": reason.as_str() }),
        format!(
            "revoked bucket {bucket} (token {token}): {}",
            reason.as_str()
        ),
    )
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
        ConfigError::KeepOnStopNeedsNodeId => "--keep-on-stop needs --node-id: the next \
             process with that id takes the session over"
            .to_owned(),
        ConfigError::KeepOnStop(InvalidInput::TtlOutOfRange { min, max, .. }) => format!(
            "--keep-on-stop {} is out of range: the session is handed over for {} to {}",
            args.keep_on_stop.map_or_else(|| "?".to_owned(), show),
            show(min),
            show(max)
        ),
        ConfigError::KeepOnStop(e) => format!("--keep-on-stop: {e}"),
        ConfigError::Ttl(InvalidInput::TtlOutOfRange { min, max, .. }) => format!(
            "--ttl {} is out of range: a session lives {} to {} after a heartbeat",
            show(args.ttl),
            show(min),
            show(max)
        ),
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

/// The node the flags describe, stopped by `cancel`.
pub fn node_config(args: &WorkerArgs, cancel: CancellationToken) -> Result<LeaseNode, Failure> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let metadata = MemberMetadata::new(format!("host={host} pid={}", std::process::id()))
        .map_err(|e| Failure::Runtime(format!("worker metadata: {e}")))?;
    let mut builder = LeaseNode::builder()
        .ttl(args.ttl)
        .renew_interval(args.renew)
        .metadata(metadata)
        .cancellation_token(cancel);
    if let Some(margin) = args.margin {
        builder = builder.safety_margin(margin);
    }
    if let Some(id) = &args.node_id {
        let id: NodeId = id
            .parse()
            .map_err(|e| Failure::Usage(format!("--node-id: {e}")))?;
        builder = builder.node_id(id);
    }
    if let Some(keep) = args.keep_on_stop {
        builder = builder.keep_on_stop(keep);
    }
    builder.build().map_err(|e| config_failure(e, args))
}

/// `leasectl worker`: run the node until a signal stops it, stdout fails, or the node or one
/// of its groups fails.
pub async fn run(args: WorkerArgs) -> Result<(), Failure> {
    serve(&args, &Printing).await
}

/// Run the node the flags describe, its groups attached by `attach`, until a signal stops it,
/// stdout fails, or the node or one of its groups fails.
pub async fn serve(args: &WorkerArgs, attach: &dyn Attach) -> Result<(), Failure> {
    let groups = group_args(args)?;
    let cancel = CancellationToken::new();
    let config = node_config(args, cancel.clone())?;
    let worker = config.node_id();
    if let Some(addr) = args.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .map_err(|e| Failure::Usage(format!("--metrics-addr {addr}: {e}")))?;
    }
    let store = args.db.open().await?;
    // Refuse a shard-count mismatch before announcing anything: every group's stored count is
    // read before any group is created, so a refused group leaves the others as they were
    // (adding a group checks it again).
    for g in &groups {
        check_group(store.as_ref(), g).await?;
    }
    for g in &groups {
        store
            .ensure_group(&g.group, g.shards)
            .await
            .map_err(|e| match e {
                StoreError::ShardCountMismatch { .. } => group_failure(g, &e),
                other => store_failure(other),
            })?;
    }
    // From here on a signal stops the worker instead of killing the process; until here,
    // nothing is held that a kill could leave behind.
    let mut signals = Signals::listen();
    let out = SharedOutput::new(cancel.clone());
    let printers: Vec<Printer> = groups
        .iter()
        .map(|g| Printer {
            json: args.json,
            group: g.group.as_str().to_owned(),
            worker,
            out: out.clone(),
        })
        .collect();
    // Announced before the node starts, so "started" precedes the first assignment.
    for (g, printer) in groups.iter().zip(&printers) {
        let announced = printer.emit(
            "started",
            json!({}),
            format!(
                "worker {worker} started in group {:?} ({} shards, ttl {}, renew {})",
                g.group.as_str(),
                g.shards,
                show(args.ttl),
                show(args.renew)
            ),
        );
        if !announced {
            return out.check();
        }
    }
    let mut node = config
        .start(store.clone())
        .map_err(|e| Failure::Runtime(Chain(&e).to_string()))?;
    attach.started(&store, &node);
    // Each group's end, as it comes: one that ends without being asked stops the process.
    let (ended_tx, mut ended_rx) = tokio::sync::mpsc::unbounded_channel();
    for (i, (g, printer)) in groups.iter().zip(&printers).enumerate() {
        let added = match attach.add(&node, g, printer.clone()).await {
            Ok(handle) => match args.weight {
                Some(w) => handle.set_weight(w).await.map(|()| handle),
                None => Ok(handle),
            },
            Err(e) => Err(e),
        };
        let mut handle = match added {
            Ok(handle) => handle,
            Err(e) => {
                cancel.cancel();
                // The groups added before stop with the node: a failure to leave one of them
                // is said too, before the group that could not be added.
                if let Err(stopped) = node.wait().await {
                    output::error_line(format!("leasectl: {}", Chain(&stopped)));
                }
                return Err(match &e {
                    GroupError::Store(e) => group_failure(g, e),
                    other => Failure::Runtime(Chain(other).to_string()),
                });
            }
        };
        let ended = ended_tx.clone();
        tokio::spawn(async move {
            let result = handle.wait().await;
            ended.send((i, result)).ok();
        });
    }
    drop(ended_tx);
    let mut group_failed: Option<(usize, GroupError)> = None;
    let ended = tokio::select! {
        () = signals.recv() => {
            output::error_line(match args.keep_on_stop {
                None => "leasectl: stopping: revoking every bucket and leaving every group \
                         (send SIGTERM, SIGINT or SIGHUP again to stop at once, without leaving)"
                    .to_owned(),
                Some(keep) => format!(
                    "leasectl: stopping: revoking every bucket, then handing the session over \
                     for {} to the next process with this --node-id (send SIGTERM, SIGINT \
                     or SIGHUP again to stop at once)",
                    duration::show(keep)
                ),
            });
            None
        }
        // Stdout failed: the printer cancelled the node.
        () = cancel.cancelled() => None,
        ended = node.wait() => Some(ended),
        Some((i, result)) = ended_rx.recv() => {
            if let Err(e) = result {
                group_failed = Some((i, e));
            }
            None
        }
    };
    let ended = match ended {
        Some(ended) => ended,
        None => {
            cancel.cancel();
            tokio::select! {
                ended = node.wait() => ended,
                () = signals.recv() => {
                    // The graceful stop may wait on a database that does not answer for as
                    // long as a call's timeout; the operator chose not to.
                    let message = format!(
                        "stopped at once by a second signal, without leaving the group: its \
                         leases stay in the store until they expire (ttl {}), and only then do \
                         other workers take its buckets",
                        show(args.ttl)
                    );
                    for printer in &printers {
                        printer.error(&message);
                    }
                    return Err(Failure::Runtime(message));
                }
            }
        }
    };
    // How each group ended, now that the node has.
    let mut not_left = Vec::new();
    while let Some((i, result)) = ended_rx.recv().await {
        if let Err(e) = result
            && group_failed.as_ref().is_none_or(|(f, _)| *f != i)
        {
            not_left.push((i, e));
        }
    }
    if let Some((i, e)) = group_failed {
        // A group ended without being asked to: the process stopped the others and says why.
        return Err(group_ended(&printers[i], &groups[i], &e, args));
    }
    match ended {
        Ok(()) if cancel.is_cancelled() => {
            out.check()?;
            for printer in &printers {
                printer.emit("stopped", json!({}), format!("worker {worker} stopped"));
            }
            out.check()
        }
        // The task ended without being asked to: say so and exit, rather than wait for a
        // signal with nothing running.
        Ok(()) => Err(worker_failure(&printers, WorkerFailed::Cancelled, args)),
        Err(WorkerFailed::GroupsNotLeft { .. }) if !not_left.is_empty() => {
            let mut first = None;
            for (i, e) in &not_left {
                let failure = group_ended(&printers[*i], &groups[*i], e, args);
                first.get_or_insert(failure);
            }
            Err(first.unwrap_or_else(|| Failure::Runtime("could not leave the group".into())))
        }
        Err(e) => Err(worker_failure(&printers, e, args)),
    }
}

/// How a group that ended on its own (or could not be left) ends the command, said on stdout
/// as an `error` event of the group too.
fn group_ended(printer: &Printer, g: &GroupArg, e: &GroupError, args: &WorkerArgs) -> Failure {
    let failed = match e {
        GroupError::Failed(failed) => Some(failed.as_ref()),
        _ => None,
    };
    let message = match failed {
        Some(failed @ WorkerFailed::LeaveFailed { .. }) => format!(
            "group {:?}: {}; its leases stay in the store until they expire (ttl {}), and only \
             then do other workers take its buckets",
            g.group.as_str(),
            Chain(failed),
            show(args.ttl)
        ),
        _ => format!("group {:?}: {}", g.group.as_str(), Chain(e)),
    };
    printer.error(&message);
    match failed {
        Some(WorkerFailed::Store(e)) => group_failure(g, e),
        _ => Failure::Runtime(message),
    }
}

/// How a node that failed ends the command, said on stdout as an `error` event (of every
/// group) too.
fn worker_failure(printers: &[Printer], failed: WorkerFailed, args: &WorkerArgs) -> Failure {
    let message = match &failed {
        WorkerFailed::LeaveFailed { .. } | WorkerFailed::GroupsNotLeft { .. } => format!(
            "{}; its leases stay in the store until they expire (ttl {}), and only then \
             do other workers take its buckets",
            Chain(&failed),
            show(args.ttl)
        ),
        other => Chain(other).to_string(),
    };
    for printer in printers {
        printer.error(&message);
    }
    match failed {
        WorkerFailed::Store(e) => store_failure(e),
        _ => Failure::Runtime(message),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    /// The usage error the node's flags are refused with.
    fn refused(flags: &[&str]) -> String {
        let flags = ["worker", "--group", "g:4"].iter().chain(flags);
        let cli = Cli::try_parse_from(flags).unwrap_or_else(|e| panic!("{e}"));
        match node_config(&cli.args, CancellationToken::new()) {
            Err(Failure::Usage(message)) => message,
            Err(other) => panic!("not a usage error: {other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    /// A duration out of range names its flag, as given, and the range, not an inner "ttl".
    #[test]
    fn a_duration_out_of_range_names_the_flag_and_the_range() {
        let id = "6f1c1b39-2e3c-4a4e-9d59-0c3f0c1b7a11";
        assert_eq!(
            refused(&["--keep-on-stop", "0s", "--node-id", id]),
            "--keep-on-stop 0s is out of range: the session is handed over for 1ms to 24h"
        );
        assert_eq!(
            refused(&["--ttl", "0s"]),
            "--ttl 0s is out of range: a session lives 1ms to 24h after a heartbeat"
        );
    }

    /// Durations in messages are the flags' values exactly: `1499ms` is not `1.5s`.
    #[test]
    fn messages_show_durations_exactly() {
        let said = refused(&["--ttl", "2s", "--renew", "1499ms"]);
        assert!(
            said.starts_with("--ttl 2s must be more than twice --renew 1.499s"),
            "{said}"
        );
    }
}
