//! `leasectl`: the command line of the lease engine.
//!
//! `leasectl demo` runs a scripted story entirely in memory; `migrate`, `worker`, `status` and
//! `release` work on Postgres (`--database-url` or `DATABASE_URL`).
//!
//! Exit codes: 0 success, 2 bad input or configuration (the message names the flag), 1 a
//! runtime failure (database unreachable, schema missing, stdout not writable, a worker that
//! could not leave its group, ...). A closed stdout (`| head -1`) is not a failure: the command
//! stops quietly with 0.

mod demo;
mod duration;
mod output;
mod status;
mod worker;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

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
    Demo(DemoArgs),
    /// Apply the embedded migrations (creates the `lease` schema); safe to run again.
    Migrate(DbArgs),
    /// Run one worker until SIGTERM or SIGINT, printing what it is assigned and revoked. The
    /// first signal stops it gracefully (revoke everything, leave the group); a second one
    /// ends it at once, without leaving, so its leases expire after the ttl.
    Worker(WorkerArgs),
    /// Show who owns which bucket of a group, the members, and the balance.
    Status(StatusArgs),
    /// Release every bucket of a worker (for a stuck or decommissioned worker).
    Release(ReleaseArgs),
}

/// Where the database is.
#[derive(Args, Debug, Clone)]
struct DbArgs {
    /// Postgres connection URL, e.g. postgres://user:pass@host:5432/db or
    /// "host=/var/run/postgresql user=app dbname=app".
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Workers at the start (2 to 25); one more joins during the story.
    #[arg(long, default_value_t = 4)]
    workers: u32,
    /// Buckets to share (1 to 256).
    #[arg(long, default_value_t = 16)]
    shards: u32,
    /// How long the story runs, in seconds (10 to 3600).
    #[arg(long, default_value_t = 20)]
    seconds: u64,
}

#[derive(Args, Debug)]
struct WorkerArgs {
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

#[derive(Args, Debug)]
struct StatusArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group to show.
    #[arg(long)]
    group: String,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group.
    #[arg(long)]
    group: String,
    /// The worker whose buckets to release (its UUID, as `status` shows it).
    #[arg(long)]
    worker: String,
    /// Do it. Without this flag, only show what would be released.
    #[arg(long)]
    force: bool,
}

/// Why `leasectl` failed, and so its exit code.
#[derive(Debug)]
enum Failure {
    /// Bad input or configuration: exit 2.
    Usage(String),
    /// The operation failed: exit 1.
    Runtime(String),
    /// Stdout's reader went away (a closed pipe): stop quietly, exit 0, as nobody reads on.
    OutputClosed,
}

impl DbArgs {
    fn url(&self) -> Result<&str, Failure> {
        self.database_url
            .as_deref()
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| {
                Failure::Usage(
                    "--database-url is required (or set DATABASE_URL), e.g. \
                 postgres://user:pass@localhost:5432/app"
                        .into(),
                )
            })
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("LEASE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .init();
}

/// Help, version and usage errors the way clap prints them, with our exit codes for output
/// errors (clap's own `exit` ignores them).
fn clap_exit(e: &clap::Error) -> ExitCode {
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    let printed = e.print();
    if e.use_stderr() {
        // A usage error is already a failure; a lost message changes nothing.
        return ExitCode::from(code);
    }
    match printed.map_err(output::OutputError::from) {
        Ok(()) | Err(output::OutputError::Closed) => ExitCode::from(code),
        Err(failed) => report(failed.failure()),
    }
}

/// The exit code of `failure`, saying why on stderr.
fn report(failure: Failure) -> ExitCode {
    match failure {
        Failure::OutputClosed => ExitCode::SUCCESS,
        Failure::Usage(message) => {
            output::error_line(format!("leasectl: {message}"));
            ExitCode::from(2)
        }
        Failure::Runtime(message) => {
            output::error_line(format!("leasectl: {message}"));
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return report(Failure::Runtime(format!(
                "cannot start the async runtime: {e}"
            )));
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Demo(args) => demo::run(args).await,
            Command::Migrate(args) => status::migrate(args).await,
            Command::Worker(args) => worker::run(args).await,
            Command::Status(args) => status::status(args).await,
            Command::Release(args) => status::release(args).await,
        }
    });
    // A worker abandoned by a second signal may still wait on the database: do not wait for it.
    runtime.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => report(failure),
    }
}
