//! One bucket's child process: how it is started (its command line and environment, its own
//! process group, death with the supervisor), how its output is passed through, and how it is
//! stopped (the stop signal, then SIGKILL, then its stragglers).

use std::collections::VecDeque;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use lease::{Assignment, GroupName, NodeId};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::oneshot;

use super::watchdog::signal_group;
use crate::output::{self, SharedOutput};

/// How many of a child's last stderr lines a crash report quotes.
const TAIL: usize = 5;

/// How long a child killed with SIGKILL may take to be reaped before it is reported
/// unstoppable (a process in uninterruptible sleep on a dead NFS mount, say).
const REAP_LIMIT: Duration = Duration::from_secs(5);

/// A signal by number, as `--stop-signal` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopSignal(pub i32);

const SIGNALS: [(&str, i32); 8] = [
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("HUP", libc::SIGHUP),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
    ("KILL", libc::SIGKILL),
    ("ABRT", libc::SIGABRT),
];

/// `--stop-signal`: `TERM`, `SIGTERM` or a number.
pub fn parse_signal(text: &str) -> Result<StopSignal, String> {
    let name = text.trim().to_ascii_uppercase();
    let name = name.strip_prefix("SIG").unwrap_or(&name);
    if let Some(&(_, n)) = SIGNALS.iter().find(|(s, _)| *s == name) {
        return Ok(StopSignal(n));
    }
    match name.parse::<i32>() {
        Ok(n) if (1..=64).contains(&n) => Ok(StopSignal(n)),
        _ => Err(format!(
            "{text:?} is not a signal; use one of {} (with or without SIG), or a number from 1 \
             to 64",
            SIGNALS.map(|(s, _)| s).join(", ")
        )),
    }
}

/// A signal's name for messages: `SIGTERM`, or `signal 40`.
pub fn signal_name(signal: i32) -> String {
    match SIGNALS.iter().find(|(_, n)| *n == signal) {
        Some((name, _)) => format!("SIG{name}"),
        None if signal == libc::SIGSEGV => "SIGSEGV".to_owned(),
        None if signal == libc::SIGPIPE => "SIGPIPE".to_owned(),
        None => format!("signal {signal}"),
    }
}

/// How a child ended, for messages: `exit code 3`, `SIGSEGV`.
pub fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => signal_name(signal),
        (None, None) => status.to_string(),
    }
}

/// A crash: an exit by a signal or with a non-zero code.
pub fn crashed(status: ExitStatus) -> bool {
    !status.success()
}

/// What every child of a group is started with.
#[derive(Clone, Debug)]
pub struct Template {
    /// The command and its arguments, `{bucket}`, `{token}`, `{shards}` and `{group}` still
    /// in them.
    pub argv: Vec<String>,
    /// Prefix each output line with `[group/bucket] `.
    pub prefix: bool,
}

/// The argument `arg` with the assignment's values in place of `{bucket}`, `{token}`,
/// `{shards}` and `{group}`.
fn substitute(arg: &str, group: &GroupName, assignment: &Assignment) -> String {
    arg.replace("{bucket}", &assignment.bucket.to_string())
        .replace("{token}", &assignment.token.to_string())
        .replace("{shards}", &assignment.shards.to_string())
        .replace("{group}", group.as_str())
}

/// The command for `assignment`'s child: substituted arguments and the `LEASE_*`
/// environment (see [`supervised`]).
fn command(
    template: &Template,
    group: &GroupName,
    node: NodeId,
    assignment: &Assignment,
) -> Result<Command, io::Error> {
    let argv: Vec<String> = template
        .argv
        .iter()
        .map(|a| substitute(a, group, assignment))
        .collect();
    let mut command = supervised(&argv)?;
    command
        .env("LEASE_GROUP", group.as_str())
        .env("LEASE_BUCKET", assignment.bucket.to_string())
        .env("LEASE_SHARDS", assignment.shards.to_string())
        .env("LEASE_TOKEN", assignment.token.to_string())
        .env("LEASE_NODE", node.to_string());
    let parents = assignment.parents();
    if assignment.resized_from.is_some() {
        let list: Vec<String> = parents.iter().map(ToString::to_string).collect();
        command.env("LEASE_PARENTS", list.join(","));
    } else {
        command.env_remove("LEASE_PARENTS");
    }
    Ok(command)
}

/// `argv` as a supervised child: stdin empty, stdout and stderr piped, its own process group,
/// killed by the kernel if the supervisor dies.
pub fn supervised(argv: &[String]) -> Result<Command, io::Error> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no command"))?;
    let mut command = Command::new(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own group: the supervisor (and the watchdog) stop the child and whatever it
        // forked with one kill, and a Ctrl-C at the terminal reaches only the supervisor.
        .process_group(0)
        .kill_on_drop(false);
    let supervisor = std::process::id();
    // SAFETY: the closure runs between fork and exec and calls only async-signal-safe
    // functions (prctl, getppid), allocating nothing (an error from a raw code).
    unsafe {
        command.pre_exec(move || {
            // The kernel kills the child when the thread that forked it ends: the spawning
            // thread lives as long as the process (see `spawn`).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The supervisor died before the line above took effect: nobody would kill it.
            if u32::try_from(libc::getppid()).ok() != Some(supervisor) {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    Ok(command)
}

type SpawnRequest = (Command, oneshot::Sender<io::Result<Child>>);

/// Spawn `command` from the one thread that forks every child. `PR_SET_PDEATHSIG` fires
/// when the *thread* that forked a child ends, not its process: spawned from a runtime
/// thread that the runtime later retires, a child would be killed for nothing. This thread
/// never ends before the process.
async fn spawn(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<std::sync::mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<SpawnRequest>();
        let runtime = tokio::runtime::Handle::current();
        let started = std::thread::Builder::new()
            .name("leasectl-spawner".into())
            .spawn(move || {
                // Children are reaped by the runtime's process driver.
                let _entered = runtime.enter();
                for (mut command, reply) in rx {
                    reply.send(command.spawn()).ok();
                }
            });
        if let Err(e) = started {
            tracing::error!("cannot start the thread that spawns children: {e}");
        }
        Mutex::new(tx)
    });
    let (reply, answer) = oneshot::channel();
    spawner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply))
        .map_err(|_| io::Error::other("the thread that spawns children has ended"))?;
    answer
        .await
        .map_err(|_| io::Error::other("the thread that spawns children has ended"))?
}

/// A running child.
#[derive(Debug)]
pub struct Running {
    child: Child,
    /// Its pid, which is its process group's id.
    pub pid: i32,
    /// When it was started.
    pub started: Instant,
    tail: Arc<Mutex<VecDeque<String>>>,
    /// The tasks passing its stdout and stderr through.
    output: Vec<tokio::task::JoinHandle<()>>,
}

/// How long after a child is reaped its last output lines are waited for (a grandchild
/// may hold its pipes open longer: it is killed, but the wait is bounded all the same).
const DRAIN_LIMIT: Duration = Duration::from_millis(200);

/// How a stop ended.
#[derive(Debug)]
pub enum Stopped {
    /// The child exited (by the stop signal, SIGKILL or on its own) and was reaped.
    Exited {
        /// How.
        status: ExitStatus,
        /// Whether SIGKILL was needed.
        killed: bool,
    },
    /// Not even SIGKILL ended it within [`REAP_LIMIT`].
    Unstoppable,
}

impl Running {
    /// Start `assignment`'s child; its stdout goes to `out`, its stderr to stderr, each line
    /// prefixed when the template says so.
    pub async fn start(
        template: &Template,
        group: &GroupName,
        node: NodeId,
        assignment: &Assignment,
        out: &SharedOutput,
    ) -> io::Result<Self> {
        let prefix = if template.prefix {
            format!("[{}/{}] ", group.as_str(), assignment.bucket)
        } else {
            String::new()
        };
        let out = out.clone();
        let stdout_prefix = prefix.clone();
        Self::launch(
            command(template, group, node, assignment)?,
            move |line| {
                out.line(format!("{stdout_prefix}{line}"));
            },
            prefix,
        )
        .await
    }

    /// Start `command` (built by [`supervised`]): each line of its stdout goes to
    /// `on_stdout`, each of its stderr to stderr after `prefix`. A piped stdin is left in
    /// [`stdin`](Self::stdin).
    pub async fn launch(
        command: Command,
        on_stdout: impl FnMut(String) + Send + 'static,
        prefix: String,
    ) -> io::Result<Self> {
        let mut child = spawn(command).await?;
        let pid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or_else(|| io::Error::other("the child has no pid"))?;
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut output = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            output.push(tokio::spawn(pass_through(stdout, on_stdout)));
        }
        if let Some(stderr) = child.stderr.take() {
            let tail = tail.clone();
            output.push(tokio::spawn(pass_through(stderr, move |line| {
                output::error_line(format!("{prefix}{line}"));
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                if tail.len() == TAIL {
                    tail.pop_front();
                }
                tail.push_back(line);
            })));
        }
        Ok(Self {
            child,
            pid,
            started: Instant::now(),
            tail,
            output,
        })
    }

    /// Its stdin, when the command piped it (once).
    pub fn stdin(&mut self) -> Option<tokio::process::ChildStdin> {
        self.child.stdin.take()
    }

    /// Wait for the child to exit on its own; then kill what it left in its group.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        let status = self.child.wait().await;
        signal_group(self.pid, libc::SIGKILL);
        self.drain().await;
        status
    }

    /// Let its last output lines through before anything is said of its end.
    async fn drain(&mut self) {
        let deadline = tokio::time::Instant::now() + DRAIN_LIMIT;
        for task in self.output.drain(..) {
            tokio::time::timeout_at(deadline, task).await.ok();
        }
    }

    /// Wait, without limit, for a child that [`stop`](Self::stop) found unstoppable.
    pub async fn reaped(&mut self) {
        self.child.wait().await.ok();
        signal_group(self.pid, libc::SIGKILL);
    }

    /// The last lines it wrote on stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// Stop the child: `signal` to its group now, SIGKILL at `kill_at` if it has not exited,
    /// then SIGKILL to whatever is left of its group once it is reaped.
    pub async fn stop(&mut self, signal: StopSignal, kill_at: Instant) -> Stopped {
        signal_group(self.pid, signal.0);
        let waited = tokio::time::timeout_at(kill_at.into(), self.child.wait()).await;
        let (status, killed) = match waited {
            Ok(status) => (status, false),
            Err(_) => {
                signal_group(self.pid, libc::SIGKILL);
                match tokio::time::timeout(REAP_LIMIT, self.child.wait()).await {
                    Ok(status) => (status, true),
                    Err(_) => return Stopped::Unstoppable,
                }
            }
        };
        signal_group(self.pid, libc::SIGKILL);
        self.drain().await;
        match status {
            Ok(status) => Stopped::Exited { status, killed },
            // The runtime could not wait for it: it is not known to be gone.
            Err(_) => Stopped::Unstoppable,
        }
    }
}

/// Hand each line `read` gives to `each` (invalid UTF-8 replaced), until it closes.
async fn pass_through<R: AsyncRead + Unpin>(read: R, mut each: impl FnMut(String)) {
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&line);
                each(text.trim_end_matches(['\n', '\r']).to_owned());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use lease::{Bucket, FencingToken, ShardCount};

    use super::*;

    #[test]
    fn signals_are_read_by_name_or_number() {
        assert_eq!(parse_signal("TERM"), Ok(StopSignal(libc::SIGTERM)));
        assert_eq!(parse_signal("sigint"), Ok(StopSignal(libc::SIGINT)));
        assert_eq!(parse_signal("10"), Ok(StopSignal(10)));
        let refused = parse_signal("STOPPLEASE");
        assert!(
            refused
                .as_ref()
                .is_err_and(|m| m.contains("TERM, INT, HUP")),
            "{refused:?}"
        );
        assert!(parse_signal("0").is_err());
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(libc::SIGSEGV), "SIGSEGV");
    }

    #[test]
    fn arguments_get_the_assignment_substituted() -> Result<(), Box<dyn std::error::Error>> {
        let group = GroupName::new("orders")?;
        let assignment = Assignment {
            bucket: Bucket(3),
            token: FencingToken(42),
            shards: ShardCount::new(8)?,
            resized_from: None,
        };
        assert_eq!(
            substitute(
                "--part={bucket}/{shards} t={token} g={group}",
                &group,
                &assignment
            ),
            "--part=3/8 t=42 g=orders"
        );
        Ok(())
    }
}
