//! `leasectl run`: a node whose buckets are worked by child processes, any program in any
//! language. One child per owned bucket, started with the bucket, its token and its group in
//! its arguments and environment, stopped (and reaped) before the bucket is released or the
//! node's trust deadline passes, killed by a watchdog process when the supervisor cannot do it
//! (stopped, or dead), and its bucket quarantined when it crashes in a loop.
//!
//! The node's life (flags, store, groups, signals, exit codes) is `leasectl worker`'s
//! ([`crate::worker::serve`]); only how a bucket reaches the application differs: here each
//! group takes per-bucket leases ([`lease::BucketLease`]), and a lease is dropped, which
//! acknowledges its revocation, only once its child is gone.

mod bucket;
mod children;
mod cpu;
mod crashes;
mod deadline;
mod events;
pub mod watchdog;

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use clap::Args;
use lease::store::QuarantineFor;
use lease::{GroupError, GroupHandle, InvalidInput, NodeHandle};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::common::Store;
use crate::duration::{self, show};
use crate::output::Failure;
use crate::worker::{Attach, GroupArg, Printer, WorkerArgs, node_config, serve};
use bucket::{Group, Shared};
use children::{StopSignal, Template, parse_signal};
use crashes::CrashRules;
use deadline::Timing;
use events::Note;
use watchdog::Watchdog;

/// `leasectl run`'s arguments: a worker's, the children's, and the command.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    worker: WorkerArgs,
    /// The signal that asks a child to stop (TERM, INT, HUP, QUIT, USR1, USR2, with or
    /// without SIG, or a number); SIGKILL follows after --grace.
    #[arg(long, default_value = "TERM", value_parser = parse_signal)]
    stop_signal: StopSignal,
    /// How long a child has to exit after the stop signal before SIGKILL. A child must be dead
    /// before the node's trust deadline (--ttl minus --margin after a heartbeat), so --grace
    /// must fit within that less --renew; a larger one is refused, naming the limit.
    #[arg(long, default_value = "5s", value_parser = duration::parse)]
    grace: Duration,
    /// How long after a child ends it is started again; doubled at each crash within
    /// --crash-window, up to a minute.
    #[arg(long, default_value = "1s", value_parser = duration::parse)]
    restart_backoff: Duration,
    /// After this many crashes (an exit by a signal or with a non-zero code) within
    /// --crash-window, the bucket is quarantined for --quarantine-for and released.
    #[arg(long, default_value_t = 3)]
    crash_limit: u32,
    /// How far back crashes count towards --crash-limit.
    #[arg(long, default_value = "10m", value_parser = duration::parse)]
    crash_window: Duration,
    /// How long a crash-looping bucket is quarantined (nobody claims it); `leasectl
    /// unquarantine` lifts it sooner.
    #[arg(long, default_value = "15m", value_parser = duration::parse)]
    quarantine_for: Duration,
    /// Pass the children's output through as it is, without the `[group/bucket] ` prefix on
    /// each line (`[events] ` with --events).
    #[arg(long)]
    no_prefix: bool,
    /// One child for every bucket of the node instead of one per bucket: it hears each
    /// assignment and revocation as a JSON line on stdin (the `worker --json` schema) and
    /// acknowledges each revocation with `{"ack":BUCKET,"token":TOKEN}` (and `"group":NAME`
    /// with several groups) on stdout; no acknowledgement within --grace has it killed and
    /// started again. Crashes back off but quarantine nothing (no bucket is to blame).
    #[arg(long)]
    events: bool,
    /// Balance the work, not the bucket count: `cpu` reports each child's CPU use (cores,
    /// from /proc, sampled every second, its reaped children included) as its bucket's load,
    /// and every member then shares the group's load (see the README's load-aware balance).
    /// Per-bucket children only (not with --events).
    #[arg(long, value_enum)]
    balance: Option<BalanceBy>,
    /// The command each child runs, after `--`: `{bucket}`, `{token}`, `{shards}` and
    /// `{group}` in it are replaced with the assignment's; the environment has LEASE_GROUP,
    /// LEASE_BUCKET, LEASE_SHARDS, LEASE_TOKEN, LEASE_NODE, and LEASE_PARENTS after a resize.
    #[arg(required = true, last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// What `--balance` measures as a bucket's load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BalanceBy {
    /// The child's CPU use, in cores.
    Cpu,
}

/// `leasectl run`'s application: a [`Group`] of children per group.
struct Supervisor {
    /// `--balance`.
    balance: Option<BalanceBy>,
    template: Template,
    timing: Timing,
    stop_signal: StopSignal,
    crash_rules: CrashRules,
    quarantine_for: QuarantineFor,
    shared: OnceLock<Arc<Shared>>,
    unstoppable: Arc<Mutex<Vec<String>>>,
    /// With --events: how many groups the node runs, and the one child's conductor, started
    /// with the first group.
    events: Option<(usize, OnceLock<mpsc::UnboundedSender<Note>>)>,
}

#[async_trait]
impl Attach for Supervisor {
    fn started(&self, store: &Store, node: &NodeHandle) {
        let trust = node.trust();
        let shared = Shared {
            template: self.template.clone(),
            timing: self.timing,
            stop_signal: self.stop_signal,
            crash_rules: self.crash_rules,
            quarantine_for: self.quarantine_for,
            node: node.node_id(),
            store: store.clone(),
            watchdog: Watchdog::start(trust.clone(), self.timing),
            trust,
            unstoppable: self.unstoppable.clone(),
        };
        self.shared.set(Arc::new(shared)).ok();
    }

    async fn add(
        &self,
        node: &NodeHandle,
        g: &GroupArg,
        printer: Printer,
    ) -> Result<GroupHandle, GroupError> {
        let shared = self.shared.get().cloned().ok_or(GroupError::NodeEnded)?;
        let (handle, mut leases) = node.add_group_leases(g.group.clone(), g.shards).await?;
        if let Some((groups, conductor)) = &self.events {
            let notes = conductor
                .get_or_init(|| {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(events::conduct(shared, printer.clone(), rx, *groups));
                    tx
                })
                .clone();
            let printer = Arc::new(printer);
            tokio::spawn(async move {
                while let Some(lease) = leases.recv().await {
                    notes.send(Note::Lease(printer.clone(), lease)).ok();
                }
                notes.send(Note::GroupDone).ok();
            });
            return Ok(handle);
        }
        let group = Arc::new(Group {
            group: g.group.clone(),
            printer,
            shared,
            loads: self.balance.map(|_| handle.load_reporter()),
        });
        tokio::spawn(async move {
            while let Some(lease) = leases.recv().await {
                tokio::spawn(bucket::work(group.clone(), lease));
            }
        });
        Ok(handle)
    }
}

/// The supervisor the flags describe, or the usage error naming the flag.
fn supervisor(args: &RunArgs) -> Result<Supervisor, Failure> {
    // The worker's own flags first, with their messages; the node is built again by `serve`.
    let node = node_config(&args.worker, CancellationToken::new())?;
    deadline::check(
        args.grace,
        node.ttl().as_duration(),
        node.safety_margin(),
        node.renew_interval(),
    )
    .map_err(Failure::Usage)?;
    if args.crash_limit == 0 {
        return Err(Failure::Usage(
            "--crash-limit must be at least 1 (the crashes that quarantine a bucket)".to_owned(),
        ));
    }
    if args.crash_window.is_zero() {
        return Err(Failure::Usage("--crash-window must be positive".to_owned()));
    }
    let quarantine_for = QuarantineFor::new(args.quarantine_for).map_err(|e| match e {
        InvalidInput::QuarantineOutOfRange { max, .. } => Failure::Usage(format!(
            "--quarantine-for {} is out of range: a quarantine lasts 1ms to {}",
            show(args.quarantine_for),
            show(max)
        )),
        other => Failure::Usage(format!("--quarantine-for: {other}")),
    })?;
    if args.balance.is_some() && args.events {
        return Err(Failure::Usage(
            "--balance measures each bucket's own child: it does not go with --events".to_owned(),
        ));
    }
    Ok(Supervisor {
        balance: args.balance,
        template: Template {
            argv: args.command.clone(),
            prefix: !args.no_prefix,
        },
        timing: Timing { grace: args.grace },
        stop_signal: args.stop_signal,
        crash_rules: CrashRules {
            backoff: args.restart_backoff,
            limit: args.crash_limit,
            window: args.crash_window,
        },
        quarantine_for,
        shared: OnceLock::new(),
        unstoppable: Arc::new(Mutex::new(Vec::new())),
        events: args
            .events
            .then(|| (args.worker.group_count(), OnceLock::new())),
    })
}

/// `leasectl run`: the node until a signal stops it (every child stopped first), stdout
/// fails, or the node fails. Exit 1 when a child could not be stopped, naming it.
pub async fn run(args: RunArgs) -> Result<(), Failure> {
    let supervisor = supervisor(&args)?;
    let served = serve(&args.worker, &supervisor).await;
    let unstoppable = std::mem::take(
        &mut *supervisor
            .unstoppable
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    );
    if !unstoppable.is_empty() {
        return Err(Failure::Runtime(format!(
            "children could not be stopped, not even by SIGKILL: {}; their buckets stay held \
             until the session expires",
            unstoppable.join("; ")
        )));
    }
    served
}
