//! `leasectl run --events`: one child for every bucket of the node, for programs that keep
//! state across buckets. It hears each assignment and revocation as a JSON line on its stdin
//! (the `worker --json` schema) and acknowledges each revocation with `{"ack":B,"token":T}`
//! (and `"group":G` when the node runs several groups) on its stdout; its other stdout lines
//! are passed through. A revoked bucket is released once acknowledged, or once the child is
//! gone: a revocation not acknowledged within `--grace` has the child killed (its process
//! group), which ends its work on every bucket, and started again, hearing an assignment for
//! every bucket still held. The child is stopped, like a per-bucket child, before the trust
//! deadline when no renewal moved it, and started again when one does.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};
use lease::BucketLease;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use super::bucket::Shared;
use super::children::{Running, StopSignal, Stopped, crashed, describe, signal_name, supervised};
use super::crashes::Crashes;
use crate::duration::show;
use crate::worker::{Printer, assigned, revoked};

/// A held bucket: its group and number.
type Key = (String, u32);

/// What reaches the conductor.
pub enum Note {
    /// A group's new lease.
    Lease(Arc<Printer>, BucketLease),
    /// A group's leases ended (the group was removed or the node stopped).
    GroupDone,
}

/// A bucket the node holds, as the conductor keeps it.
struct Held {
    printer: Arc<Printer>,
    lease: Arc<BucketLease>,
    /// Revoked, waiting for the child's acknowledgement until then.
    ack_by: Option<Instant>,
}

/// What the child said on stdout that the conductor acts on.
struct Ack {
    group: Option<String>,
    bucket: u32,
    token: i64,
}

/// Run the one child of the node's `groups` groups, fed by `notes`, until every group is
/// done and nothing is held.
pub async fn conduct(
    shared: Arc<Shared>,
    node: Printer,
    mut notes: mpsc::UnboundedReceiver<Note>,
    groups: usize,
) {
    let mut held: BTreeMap<Key, Held> = BTreeMap::new();
    let mut revocations = FuturesUnordered::new();
    let mut crashes = Crashes::new(shared.crash_rules);
    let mut restart_at: Option<Instant> = None;
    let mut child: Option<Child> = None;
    // The child's acknowledgements, apart from it: waiting for one and for its exit at once.
    let mut acks: Option<mpsc::UnboundedReceiver<Ack>> = None;
    let mut trust = shared.trust.clone();
    let mut open_groups = groups;
    // Closed once every sender is gone: not polled again (it would answer at once, for ever).
    let mut notes_open = true;
    let mut trust_open = true;
    let timing = shared.timing;
    loop {
        if open_groups == 0 && held.is_empty() {
            if let Some(c) = child.take() {
                c.stop(&shared, &node, "the node stopped").await;
            }
            return;
        }
        // Start the child when it may run: backoff over, trust far enough.
        let trusted = *trust.borrow_and_update();
        let may_run = restart_at.is_none_or(|at| Instant::now() >= at)
            && trusted.is_some_and(|t| timing.stop_at(t) > Instant::now());
        if child.is_none() && may_run {
            match Child::start(&shared, &node, &held).await {
                Ok((c, a)) => {
                    child = Some(c);
                    acks = Some(a);
                }
                Err(e) => {
                    node.error(&format!("cannot start {:?}: {e}", shared.template.argv[0]));
                    restart_at = Some(Instant::now() + crashes.ended(Instant::now(), true).delay());
                }
            }
        }
        let ack_by = held.values().filter_map(|h| h.ack_by).min();
        let stop_at = trusted.map(|t| timing.stop_at(t));
        let wake = [
            ack_by,
            stop_at.filter(|_| child.is_some()),
            // A restart still to wait for (one due, the trust too short, waits for a renewal).
            restart_at.filter(|&at| child.is_none() && at > Instant::now()),
        ]
        .into_iter()
        .flatten()
        .min();
        let sleep = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            // A renewal: a child waiting for trust may start.
            changed = trust.changed(), if trust_open => {
                if changed.is_err() {
                    trust_open = false;
                }
            }
            note = notes.recv(), if notes_open => match note {
                Some(Note::Lease(printer, lease)) => {
                    let assignment = lease.assignment();
                    let (fields, readable) = assigned(assignment);
                    printer.emit("assigned", fields, readable);
                    let key = (printer.group().to_owned(), assignment.bucket.get());
                    let lease = Arc::new(lease);
                    if let Some(c) = &child {
                        c.send(printer.json_line("assigned", assigned(assignment).0));
                    }
                    let watched = lease.clone();
                    let watched_key = key.clone();
                    revocations.push(async move { (watched_key, watched.revoked().await) });
                    held.insert(key, Held { printer, lease, ack_by: None });
                }
                Some(Note::GroupDone) => open_groups = open_groups.saturating_sub(1),
                None => {
                    notes_open = false;
                    open_groups = 0;
                }
            },
            Some((key, reason)) = revocations.next() => {
                if let Some(h) = held.get_mut(&key) {
                    let a = h.lease.assignment();
                    let (fields, readable) = revoked(a.bucket, a.token, reason);
                    h.printer.emit("revoked", fields.clone(), readable);
                    match &child {
                        Some(c) => {
                            c.send(h.printer.json_line("revoked", fields));
                            h.ack_by = Some(Instant::now() + timing.grace);
                        }
                        // No child works on it.
                        None => {
                            held.remove(&key);
                        }
                    }
                }
            }
            ack = next_ack(&mut acks) => match ack {
                Some(ack) => {
                    let found = held.iter().find(|((g, b), h)| {
                        *b == ack.bucket
                            && h.lease.token().get() == ack.token
                            && h.ack_by.is_some()
                            && ack.group.as_deref().is_none_or(|name| name == g)
                    }).map(|(k, _)| k.clone());
                    match found {
                        Some(key) => {
                            held.remove(&key);
                        }
                        None => node.error(&format!(
                            "the --events child acknowledged bucket {} (token {}), which is not \
                             being revoked",
                            ack.bucket,
                            ack.token
                        )),
                    }
                }
                // Its stdout closed: it is ending; its exit says how.
                None => acks = None,
            },
            status = wait_exit(&mut child) => {
                let now = Instant::now();
                let c = child.take();
                if let Some(c) = &c {
                    shared.watchdog.gone(c.running.pid);
                }
                let (said, crash) = match &status {
                    Ok(s) => (describe(*s), crashed(*s)),
                    Err(e) => (format!("lost ({e})"), true),
                };
                let after = crashes.ended(now, crash).delay();
                restart_at = Some(now + after);
                let pid = c.as_ref().map_or(0, |c| c.running.pid);
                node.emit(
                    "child-exited",
                    json!({
                        "pid": pid,
                        "status": said,
                        "crashed": crash,
                        "restart_in_ms": after.as_millis() as u64,
                    }),
                    format!("events child (pid {pid}) ended with {said}; restarting in {}", show(after)),
                );
                release_revoked(&mut held);
            }
            () = sleep => {
                let now = Instant::now();
                let late = held.values().any(|h| h.ack_by.is_some_and(|at| at <= now));
                let untrusted = stop_at.is_some_and(|at| at <= now) || trusted.is_none();
                if let Some(c) = child.take() {
                    if late {
                        c.kill(&shared, &node, "a revocation was not acknowledged within --grace")
                            .await;
                    } else if untrusted {
                        c.stop(&shared, &node, "no renewal before the trust deadline").await;
                    } else {
                        child = Some(c);
                        continue;
                    }
                    release_revoked(&mut held);
                    restart_at = Some(Instant::now() + shared.crash_rules.backoff);
                }
            }
        }
    }
}

/// Drop every revoked lease: the child that was told is gone, so nothing works on them.
fn release_revoked(held: &mut BTreeMap<Key, Held>) {
    held.retain(|_, h| h.ack_by.is_none());
}

/// The running child.
struct Child {
    running: Running,
    lines: mpsc::UnboundedSender<String>,
}

async fn next_ack(acks: &mut Option<mpsc::UnboundedReceiver<Ack>>) -> Option<Ack> {
    match acks {
        Some(acks) => acks.recv().await,
        None => std::future::pending().await,
    }
}

async fn wait_exit(child: &mut Option<Child>) -> std::io::Result<std::process::ExitStatus> {
    match child {
        Some(c) => c.running.wait().await,
        None => std::future::pending().await,
    }
}

impl Child {
    /// Start the child and tell it every bucket held (and not being revoked).
    async fn start(
        shared: &Shared,
        node: &Printer,
        held: &BTreeMap<Key, Held>,
    ) -> std::io::Result<(Self, mpsc::UnboundedReceiver<Ack>)> {
        let mut command = supervised(&shared.template.argv)?;
        command
            .env("LEASE_NODE", shared.node.to_string())
            .stdin(std::process::Stdio::piped());
        let (ack_tx, acks) = mpsc::unbounded_channel();
        let out = node.out().clone();
        let prefix = if shared.template.prefix {
            "[events] "
        } else {
            ""
        };
        let on_stdout = move |line: String| match parse_ack(&line) {
            Some(ack) => {
                ack_tx.send(ack).ok();
            }
            None => {
                out.line(format!("{prefix}{line}"));
            }
        };
        let mut running = Running::launch(command, on_stdout, prefix.to_owned()).await?;
        shared.watchdog.child(running.pid);
        node.emit(
            "child-started",
            json!({ "pid": running.pid }),
            format!("events child started (pid {})", running.pid),
        );
        let mut stdin = running
            .stdin()
            .ok_or_else(|| std::io::Error::other("the child's stdin is not piped"))?;
        let (lines, mut rx) = mpsc::unbounded_channel::<String>();
        // A child that stops reading blocks only this task, never the conductor.
        tokio::spawn(async move {
            while let Some(line) = rx.recv().await {
                if stdin
                    .write_all(format!("{line}\n").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        let child = Self { running, lines };
        for h in held.values().filter(|h| h.ack_by.is_none()) {
            child.send(
                h.printer
                    .json_line("assigned", assigned(h.lease.assignment()).0),
            );
        }
        Ok((child, acks))
    }

    fn send(&self, line: String) {
        self.lines.send(line).ok();
    }

    /// Stop it as a per-bucket child is stopped: the stop signal, SIGKILL after the grace or
    /// before the trust deadline.
    async fn stop(mut self, shared: &Shared, node: &Printer, why: &str) {
        let kill_at = shared
            .timing
            .kill_by(Instant::now(), *shared.trust.borrow());
        self.end(shared, node, why, shared.stop_signal, kill_at)
            .await;
    }

    /// SIGKILL at once, without the stop signal first.
    async fn kill(mut self, shared: &Shared, node: &Printer, why: &str) {
        self.end(shared, node, why, StopSignal(libc::SIGKILL), Instant::now())
            .await;
    }

    async fn end(
        &mut self,
        shared: &Shared,
        node: &Printer,
        why: &str,
        signal: StopSignal,
        kill_at: Instant,
    ) {
        let asked = Instant::now();
        let pid = self.running.pid;
        let said = match self.running.stop(signal, kill_at).await {
            Stopped::Exited { status, killed } => {
                let signal = if killed {
                    "SIGKILL".to_owned()
                } else {
                    signal_name(signal.0)
                };
                Some((signal, describe(status)))
            }
            Stopped::Unstoppable => {
                node.error(&format!(
                    "the events child (pid {pid}) did not end after SIGKILL; its revoked \
                     buckets are held until it does"
                ));
                self.running.reaped().await;
                None
            }
        };
        shared.watchdog.gone(pid);
        if let Some((signal, status)) = said {
            let took = Duration::from_millis(asked.elapsed().as_millis() as u64);
            node.emit(
                "child-stopped",
                json!({
                    "pid": pid,
                    "why": why,
                    "signal": signal,
                    "status": status,
                    "took_ms": took.as_millis() as u64,
                }),
                format!(
                    "events child (pid {pid}) stopped ({why}) by {signal} in {}: {status}",
                    show(took)
                ),
            );
        }
    }
}

/// `{"ack":B,"token":T}` (with `"group":G` optionally).
fn parse_ack(line: &str) -> Option<Ack> {
    let value: Value = serde_json::from_str(line.trim()).ok()?;
    let bucket = u32::try_from(value.get("ack")?.as_u64()?).ok()?;
    let token = value.get("token")?.as_i64()?;
    let group = value
        .get("group")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Some(Ack {
        group,
        bucket,
        token,
    })
}
