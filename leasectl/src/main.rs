//! `leasectl`: the command line of the lease engine.
//!
//! `leasectl demo` runs a scripted story entirely in memory; `migrate`, `grant`, `worker`, `run`,
//! `status`, `release`, `resize`, `doctor` and the operators' controls (`cordon`, `drain`,
//! `uncordon`, `weight`, `quarantine`, `unquarantine`) work on Postgres (`--database-url` or
//! `DATABASE_URL`), and, built with the `etcd` feature, all but `grant` on etcd too
//! (`etcd://host:2379,host:2380/prefix`; `migrate` has nothing to do there).
//! Each subcommand is a module owning its arguments and its run function; [`common`] holds
//! what they share: connecting, failures and exit codes.
//!
//! Exit codes: 0 success, 2 bad input or configuration (the message names the flag), 1 a
//! runtime failure (database unreachable, schema missing, stdout not writable, a worker that
//! could not leave one of its groups, ...). A closed stdout (`| head -1`) is not a failure: the command
//! stops quietly with 0. Nor is an unwritable stderr: its lines (log lines included) are dropped
//! and the exit code stays what it would be.

mod common;
mod controls;
mod demo;
mod doctor;
mod duration;
mod grant;
mod migrate;
mod output;
mod release;
mod resize;
mod run;
mod status;
mod why;
mod worker;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::output::{Failure, clap_exit, exit_code};

/// Cooperative shard ownership on renewable leases.
#[derive(Parser, Debug)]
#[command(name = "leasectl", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Watch a pool of workers share buckets, in memory, no setup: a cold start, a worker
    /// joining, one crashing, one stopping gracefully; then a summary.
    Demo(demo::DemoArgs),
    /// Apply the embedded migrations (creates the `lease` schema); safe to run again. On etcd
    /// there is no schema: it says so and does nothing.
    Migrate(migrate::MigrateArgs),
    /// Print (or apply, with --apply) the GRANT statements a role needs to run workers
    /// (--kind worker), read groups (monitor) or fence writes (fencing), and nothing more.
    Grant(grant::GrantArgs),
    /// Run a worker process, one node (one session in the store) in one or more groups, until
    /// SIGTERM, SIGINT or SIGHUP, printing what it is assigned and revoked in each group.
    ///
    /// Groups: --group NAME:SHARDS, repeatable (--group orders:16 --group billing:64), or one
    /// plain --group NAME with --shards N. The first signal stops it gracefully (revoke
    /// everything, leave every group); a second one ends it at once, without leaving, so its
    /// leases expire after the ttl.
    Worker(worker::WorkerArgs),
    /// Run a worker whose buckets are worked by child processes, any program in any language:
    /// `leasectl run --group orders:16 -- ./consumer --partition {bucket}`.
    ///
    /// One child per owned bucket, with {bucket}, {token}, {shards} and {group} replaced in
    /// its arguments and LEASE_GROUP, LEASE_BUCKET, LEASE_SHARDS, LEASE_TOKEN, LEASE_NODE
    /// (and LEASE_PARENTS after a resize) in its environment. A revoked bucket is released
    /// only once its child is gone (the stop signal, SIGKILL after --grace); every child is
    /// dead before the node's trust deadline, killed by a watchdog process if the supervisor
    /// is stopped or dies; a child that crashes --crash-limit times gets its bucket
    /// quarantined. Signals and exit codes as for `worker`; exit 1 also when a child could
    /// not be stopped.
    Run(run::RunArgs),
    /// The watchdog process `run` starts (not for people).
    #[command(name = "__watchdog", hide = true)]
    Watchdog,
    /// Show the nodes (worker processes) the store knows, their sessions and groups; with
    /// --group, who owns which bucket of that group, its members, and the balance.
    Status(status::StatusArgs),
    /// Release every bucket a worker (node) holds in one group and remove it from that group
    /// (for a stuck or decommissioned worker).
    ///
    /// The node's other groups are not touched. A live node goes on working on the released
    /// buckets until its next heartbeat (only fencing tokens keep its writes out meanwhile),
    /// then joins the group again: stop it instead if you can.
    Release(release::ReleaseArgs),
    /// Change a group's shard count while its workers run (--from N --to M). Without --apply,
    /// check and print the plan: which new buckets wait for which old ones, and who holds them.
    Resize(resize::ResizeArgs),
    /// Check a database as a worker would use it: connection, TLS, server, schema, primary,
    /// clock, replication, wake-ups; on etcd, that the members answer a read (the Postgres
    /// checks do not apply). Exit 0 when workers can run, 1 otherwise.
    Doctor(doctor::DoctorArgs),
    /// Stop a worker from claiming in a group: it keeps what it holds (weight 0 in effect),
    /// the others share the rest. Works on a live worker from any host; survives its restarts
    /// until `uncordon`.
    Cordon(controls::MemberArgs),
    /// Make a worker give up everything it holds in a group (revoke, then release; reason
    /// `drained`) and claim nothing until `uncordon`. --wait waits until it holds nothing.
    Drain(controls::DrainArgs),
    /// Undo `cordon` or `drain`: the worker claims its share again.
    Uncordon(controls::MemberArgs),
    /// Set a worker's weight in a group: targets are proportional to weights (default 1).
    Weight(controls::WeightArgs),
    /// Make a bucket unclaimable for a while (--for 5m), for a poison bucket that crashes
    /// every worker that takes it: its owner revokes it (reason `quarantined`).
    Quarantine(controls::QuarantineArgs),
    /// Lift a bucket's quarantine: it is claimable again.
    Unquarantine(controls::BucketArgs),
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        // Log lines go where `output` sends every stderr line: a failed write is dropped. The
        // subscriber's own notice of a failed write would go to stderr by `eprintln!`, which
        // panics when stderr fails: off too.
        .with_writer(|| output::LogWriter)
        .log_internal_errors(false)
        .init();
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    if let Command::Watchdog = cli.command {
        // A plain loop on its stdin: no runtime, no logging setup.
        return run::watchdog::main();
    }
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return exit_code(Failure::Runtime(format!(
                "cannot start the async runtime: {e}"
            )));
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::Migrate(args) => migrate::run(args).await,
            Command::Grant(args) => grant::run(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Watchdog => Ok(()),
            Command::Status(args) => status::run(args).await,
            Command::Release(args) => release::run(args).await,
            Command::Resize(args) => resize::run(args).await,
            Command::Doctor(args) => doctor::run(args).await,
            Command::Cordon(args) => controls::cordon(args).await,
            Command::Drain(args) => controls::drain(args).await,
            Command::Uncordon(args) => controls::uncordon(args).await,
            Command::Weight(args) => controls::weight(args).await,
            Command::Quarantine(args) => controls::quarantine(args).await,
            Command::Unquarantine(args) => controls::unquarantine(args).await,
        }
    });
    // A worker abandoned by a second signal may still wait on the database: do not wait for it.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => exit_code(failure),
    }
}
