//! The watchdog: a second process (`leasectl` run again as `leasectl __watchdog`) that kills
//! the children's process groups when the supervisor can no longer do it.
//!
//! A supervisor stopped by SIGSTOP (or frozen in a cgroup, or swapped out) stops all its
//! threads: no timer of its own can fence its children. So the watchdog holds the deadline
//! by which every child must be dead (the node's trust deadline less the kill allowance),
//! which the supervisor moves at every renewal over the watchdog's stdin, and sends SIGKILL to
//! every child's process group once it passes unmoved. When the supervisor dies, the pipe
//! closes: the watchdog kills every group at once and exits, so no child outlives its
//! supervisor, even one killed with SIGKILL.
//!
//! The protocol is lines of text, times on `CLOCK_MONOTONIC` (which a stopped process's clock
//! shares with every other process): `until NANOS`, the new deadline; `child PGID`, a group
//! to watch; `gone PGID`, a group whose leader the supervisor reaped and whose stragglers it
//! killed. A group is watched from the moment its child is spawned, so a child killed by the
//! watchdog stays a zombie (unreaped, its process-group id taken) until the supervisor runs
//! again: the id the watchdog kills cannot be another process's by then.

use std::collections::BTreeSet;
use std::io;
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::{Child, ChildStdin};
use tokio::sync::{mpsc, watch};

use super::deadline::Timing;
use crate::output;

/// How often the watchdog kills the groups again while the deadline is past: a child's
/// stragglers forked meanwhile die too.
const REKILL: Duration = Duration::from_millis(100);

/// Nanoseconds on `CLOCK_MONOTONIC`.
fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the call to fill; CLOCK_MONOTONIC always exists.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u64::try_from(ts.tv_nsec).unwrap_or(0))
}

/// `at` as nanoseconds on `CLOCK_MONOTONIC`, rounded early: the clock is read before `now`,
/// so the time computed is never later than `at`.
fn nanos_of(at: Instant) -> u64 {
    let clock = monotonic_nanos();
    let now = Instant::now();
    match at.checked_duration_since(now) {
        Some(ahead) => clock.saturating_add(u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX)),
        None => clock.saturating_sub(u64::try_from((now - at).as_nanos()).unwrap_or(u64::MAX)),
    }
}

/// Send `signal` to every process of group `pgid`; false when there is none.
pub fn signal_group(pgid: i32, signal: i32) -> bool {
    // SAFETY: kill has no memory effects; a negative pid names a process group.
    pgid > 1 && unsafe { libc::kill(-pgid, signal) } == 0
}

/// The watchdog process: reads the supervisor's lines on stdin until it closes.
pub fn main() -> ExitCode {
    let mut groups = BTreeSet::new();
    // Nothing is trusted until the supervisor says so: a group named before a deadline is
    // killed at once.
    let mut until = 0u64;
    let mut pending = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let now = monotonic_nanos();
        let timeout_ms = if groups.is_empty() {
            -1
        } else if now >= until {
            kill_all(&groups, "its deadline passed without a renewal");
            i32::try_from(REKILL.as_millis()).unwrap_or(100)
        } else {
            // Round up: waking early only loops once more.
            i32::try_from((until - now).div_ceil(1_000_000)).unwrap_or(i32::MAX)
        };
        let mut poll = libc::pollfd {
            fd: 0,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
        if ready <= 0 {
            continue;
        }
        // Read the descriptor itself: a buffered reader could keep lines that poll no longer
        // announces.
        // SAFETY: `buf` is valid for its length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        let n = match usize::try_from(n) {
            Err(_) if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            Ok(0) | Err(_) => {
                // The supervisor is gone (or its pipe broke): nobody can renew any more.
                kill_all(&groups, "the supervisor is gone");
                return ExitCode::SUCCESS;
            }
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let mut words = line.split_whitespace();
            match (
                words.next(),
                words.next().and_then(|w| w.parse::<u64>().ok()),
            ) {
                (Some("until"), Some(n)) => until = n,
                (Some("child"), Some(g)) => {
                    groups.insert(i32::try_from(g).unwrap_or(0));
                }
                (Some("gone"), Some(g)) => {
                    groups.remove(&i32::try_from(g).unwrap_or(0));
                }
                _ => output::error_line(format!("leasectl watchdog: ignored {:?}", line.trim())),
            }
        }
    }
}

fn kill_all(groups: &BTreeSet<i32>, why: &str) {
    let killed: Vec<String> = groups
        .iter()
        .filter(|&&g| signal_group(g, libc::SIGKILL))
        .map(ToString::to_string)
        .collect();
    if !killed.is_empty() {
        output::error_line(format!(
            "leasectl watchdog: {why}: SIGKILL to process group(s) {}",
            killed.join(", ")
        ));
    }
}

/// What the supervisor tells its watchdog.
#[derive(Debug)]
enum Message {
    Child(i32),
    Gone(i32),
}

/// The supervisor's side: a task that keeps one watchdog running (a new one, told everything,
/// if it dies) and tells it every group and every new deadline.
#[derive(Clone, Debug)]
pub struct Watchdog {
    tx: mpsc::UnboundedSender<Message>,
}

impl Watchdog {
    /// Start the watchdog, its deadline following `trust` (the node's trust deadline).
    pub fn start(trust: watch::Receiver<Option<Instant>>, timing: Timing) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(keep(rx, trust, timing));
        Self { tx }
    }

    /// Watch process group `pgid` (a child just spawned).
    pub fn child(&self, pgid: i32) {
        self.tx.send(Message::Child(pgid)).ok();
    }

    /// Forget process group `pgid` (its child reaped, its stragglers killed).
    pub fn gone(&self, pgid: i32) {
        self.tx.send(Message::Gone(pgid)).ok();
    }
}

/// A running watchdog process.
struct Process {
    child: Child,
    stdin: ChildStdin,
}

fn spawn_process() -> io::Result<Process> {
    // The running binary, even if a deploy replaced the file meanwhile.
    let mut command = tokio::process::Command::new("/proc/self/exe");
    command
        .arg("__watchdog")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Out of the supervisor's group: a Ctrl-C at the terminal stops the supervisor
        // gracefully and leaves the watchdog to it.
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("the watchdog's stdin is not piped"))?;
    Ok(Process { child, stdin })
}

/// The line of the deadline for leases trusted until `trusted` (`None`: kill now).
fn until_line(trusted: Option<Instant>, timing: Timing) -> String {
    let at = trusted.map_or(0, |t| nanos_of(timing.kill_at(t)));
    format!("until {at}\n")
}

async fn keep(
    mut rx: mpsc::UnboundedReceiver<Message>,
    mut trust: watch::Receiver<Option<Instant>>,
    timing: Timing,
) {
    let mut groups = BTreeSet::new();
    let mut process: Option<Process> = None;
    let mut trust_open = true;
    loop {
        // (Re)start: a new watchdog hears the deadline and every group first.
        let running = match &mut process {
            Some(p) => p,
            None => match spawn_process() {
                Ok(mut p) => {
                    let mut replay = until_line(*trust.borrow_and_update(), timing);
                    for g in &groups {
                        replay.push_str(&format!("child {g}\n"));
                    }
                    if p.stdin.write_all(replay.as_bytes()).await.is_err() {
                        continue;
                    }
                    process.insert(p)
                }
                Err(e) => {
                    tracing::error!("cannot start the watchdog process, retrying: {e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let line = tokio::select! {
            message = rx.recv() => match message {
                Some(Message::Child(g)) => {
                    groups.insert(g);
                    format!("child {g}\n")
                }
                Some(Message::Gone(g)) => {
                    groups.remove(&g);
                    format!("gone {g}\n")
                }
                // The supervisor is done: closing the pipe ends the watchdog.
                None => return,
            },
            changed = trust.changed(), if trust_open => {
                if changed.is_err() {
                    // The node ended: nothing is trusted from now on.
                    trust_open = false;
                    until_line(None, timing)
                } else {
                    until_line(*trust.borrow_and_update(), timing)
                }
            }
            status = running.child.wait() => {
                output::error_line(format!(
                    "leasectl: the watchdog process ended ({}); starting another",
                    status.map_or_else(|e| e.to_string(), |s| s.to_string())
                ));
                process = None;
                continue;
            }
        };
        if running.stdin.write_all(line.as_bytes()).await.is_err() {
            // It died: the next turn starts another and tells it everything.
            process = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instants_map_onto_the_monotonic_clock_never_later() {
        let now = Instant::now();
        let ahead = now + Duration::from_secs(3);
        let clock = monotonic_nanos();
        let mapped = nanos_of(ahead);
        // Within the time this test takes, and never past the instant.
        assert!(
            mapped <= clock + 3_000_000_000 + 1_000_000,
            "{mapped} vs {clock}"
        );
        assert!(
            mapped + 50_000_000 >= clock + 3_000_000_000,
            "{mapped} vs {clock}"
        );
        let behind = nanos_of(now - Duration::from_secs(1));
        assert!(behind < clock, "{behind} vs {clock}");
    }

    #[test]
    fn no_trust_is_a_deadline_already_past() {
        assert_eq!(
            until_line(
                None,
                Timing {
                    grace: Duration::ZERO
                }
            ),
            "until 0\n"
        );
    }
}
