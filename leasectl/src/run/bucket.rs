//! One owned bucket's life under `leasectl run`: its child is started while the lease is
//! trusted, restarted with backoff when it ends on its own, stopped before the trust deadline
//! when no renewal moved it, quarantined after too many crashes, and stopped (and reaped) on a
//! revocation before the lease is dropped, which is what lets the node release the bucket.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use lease::store::{Chain, QuarantineFor, QuarantineReason};
use lease::{
    Assignment, BucketLease, GroupName, LoadReporter, NodeId, OwnershipHandler, RevokeReason,
};
use serde_json::json;
use tokio::sync::watch;

use super::children::{Running, StopSignal, Stopped, Template, crashed, describe, signal_name};
use super::cpu::CpuMeter;
use super::crashes::{CrashRules, Crashes, Next};
use super::deadline::Timing;
use super::watchdog::Watchdog;
use crate::common::Store;
use crate::duration::show;
use crate::worker::Printer;

/// What every bucket of a node's groups shares.
pub struct Shared {
    /// The children's command.
    pub template: Template,
    /// Stop times from the trust deadline.
    pub timing: Timing,
    /// `--stop-signal`.
    pub stop_signal: StopSignal,
    /// `--restart-backoff`, `--crash-limit`, `--crash-window`.
    pub crash_rules: CrashRules,
    /// `--quarantine-for`.
    pub quarantine_for: QuarantineFor,
    /// The node.
    pub node: NodeId,
    /// For quarantines.
    pub store: Store,
    /// Holds the children's deadline when the supervisor cannot.
    pub watchdog: Watchdog,
    /// The node's trust deadline.
    pub trust: watch::Receiver<Option<Instant>>,
    /// Children that not even SIGKILL ended: `bucket B of group G (pid P)`.
    pub unstoppable: Arc<Mutex<Vec<String>>>,
}

/// One group of the node.
pub struct Group {
    /// Its name.
    pub group: GroupName,
    /// Says its events.
    pub printer: Printer,
    /// What its buckets share.
    pub shared: Arc<Shared>,
    /// With `--balance cpu`: where each child's CPU use is reported as its bucket's load.
    pub loads: Option<LoadReporter>,
}

/// How a running child's wait ended.
enum Outcome {
    Revoked(RevokeReason),
    Exited(std::io::Result<std::process::ExitStatus>),
    Untrusted,
}

/// Work `lease`'s bucket with a child until the bucket is revoked; the lease is dropped (the
/// revocation acknowledged) only once no child of it is alive.
pub async fn work(g: Arc<Group>, lease: BucketLease) {
    let assignment = lease.assignment();
    g.printer.on_assigned(assignment).await;
    let mut crashes = Crashes::new(g.shared.crash_rules);
    let mut restart_at: Option<Instant> = None;
    let mut quarantined = false;
    let mut trust = g.shared.trust.clone();
    let timing = g.shared.timing;
    loop {
        tokio::select! {
            biased;
            reason = lease.revoked() => {
                g.revoked(&assignment, reason).await;
                return;
            }
            () = may_run(&mut trust, timing, restart_at, quarantined) => {}
        }
        let mut running = match Running::start(
            &g.shared.template,
            &g.group,
            g.shared.node,
            &assignment,
            g.printer.out(),
        )
        .await
        {
            Ok(running) => running,
            Err(e) => {
                let message = format!(
                    "bucket {}: cannot start {:?}: {e}",
                    assignment.bucket, g.shared.template.argv[0]
                );
                g.printer.error(&message);
                let next = crashes.ended(Instant::now(), true);
                if g.after_crash(&assignment, next, &message, &[]).await {
                    quarantined = true;
                }
                restart_at = Some(Instant::now() + next.delay());
                continue;
            }
        };
        g.shared.watchdog.child(running.pid);
        g.printer.emit(
            "child-started",
            json!({ "bucket": assignment.bucket.get(), "token": assignment.token.get(), "pid": running.pid }),
            format!(
                "bucket {}: child started (pid {}, token {})",
                assignment.bucket, running.pid, assignment.token
            ),
        );
        let mut meter = CpuMeter::new(running.pid.unsigned_abs());
        let mut sampling = tokio::time::interval(SAMPLE_EVERY);
        let outcome = loop {
            tokio::select! {
                biased;
                reason = lease.revoked() => break Outcome::Revoked(reason),
                status = running.wait() => break Outcome::Exited(status),
                () = trust_runs_out(&mut trust, timing) => break Outcome::Untrusted,
                _ = sampling.tick(), if g.loads.is_some() => {
                    if let (Some(loads), Some(load)) = (&g.loads, meter.sample()) {
                        // A node that ended takes no report; the child is stopped anyway.
                        loads.report(assignment.bucket, load).ok();
                    }
                }
            }
        };
        match outcome {
            Outcome::Revoked(reason) => {
                g.revoked(&assignment, reason).await;
                g.stop(&assignment, running, "revoked").await;
                return;
            }
            Outcome::Untrusted => {
                // No renewal moved the deadline: the child must be dead before it. It starts
                // again when a renewal does, unless the bucket is revoked meanwhile.
                g.stop(&assignment, running, "no renewal before the trust deadline")
                    .await;
            }
            Outcome::Exited(status) => {
                g.shared.watchdog.gone(running.pid);
                let now = Instant::now();
                let (said, crash) = match &status {
                    Ok(status) => (describe(*status), crashed(*status)),
                    Err(e) => (format!("lost ({e})"), true),
                };
                let next = crashes.ended(now, crash);
                let ran = now.duration_since(running.started);
                let tail = running.stderr_tail();
                let message = format!(
                    "bucket {}: child (pid {}) ended after {} with {said}",
                    assignment.bucket,
                    running.pid,
                    show(round_ms(ran))
                );
                if let Next::Restart(after) = next {
                    g.printer.emit(
                        "child-exited",
                        json!({
                            "bucket": assignment.bucket.get(),
                            "pid": running.pid,
                            "status": said,
                            "crashed": crash,
                            "restart_in_ms": after.as_millis() as u64,
                        }),
                        format!("{message}; restarting in {}", show(after)),
                    );
                }
                if g.after_crash(&assignment, next, &said, &tail).await {
                    quarantined = true;
                }
                restart_at = Some(now + next.delay());
            }
        }
    }
}

/// How often `--balance cpu` samples a child's CPU use.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);

fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(d.as_millis() as u64)
}

impl Group {
    async fn revoked(&self, assignment: &Assignment, reason: RevokeReason) {
        self.printer
            .on_revoked(assignment.bucket, assignment.token, reason)
            .await;
    }

    /// After a crash: quarantine the bucket when `next` says so. True when the store took the
    /// quarantine (the bucket's revocation follows at the node's next heartbeat).
    async fn after_crash(
        &self,
        assignment: &Assignment,
        next: Next,
        status: &str,
        tail: &[String],
    ) -> bool {
        let Next::Quarantine { crashes } = next else {
            return false;
        };
        let rules = self.shared.crash_rules;
        let reason = format!(
            "its child crashed {crashes} times within {}, last with {status}{}",
            show(rules.window),
            match tail.last() {
                Some(line) => format!("; last stderr line: {line}"),
                None => String::new(),
            }
        );
        let bucket = assignment.bucket;
        let duration = self.shared.quarantine_for;
        match self
            .shared
            .store
            .quarantine_with_reason(
                &self.group,
                bucket,
                Some(duration),
                QuarantineReason::truncated(&reason),
            )
            .await
        {
            Ok(()) => {
                self.printer.emit(
                    "quarantined",
                    json!({
                        "bucket": bucket.get(),
                        "crashes": crashes,
                        "status": status,
                        "stderr": tail,
                        "for_ms": duration.get().as_millis() as u64,
                        "reason": reason,
                    }),
                    format!(
                        "bucket {bucket}: quarantined for {}: {reason}",
                        show(duration.get())
                    ),
                );
                true
            }
            Err(e) => {
                self.printer.error(&format!(
                    "bucket {bucket}: {reason}, but it could not be quarantined ({}); the child \
                     is restarted in {}",
                    Chain(&e),
                    show(super::crashes::MAX_BACKOFF)
                ));
                false
            }
        }
    }

    /// Stop `running` now (the stop signal, SIGKILL at its grace or before the trust
    /// deadline, whichever comes first) and say how it ended. A child that not even SIGKILL
    /// ends is reported, recorded, and waited for without limit: the lease is held (the
    /// bucket not released) until it is gone.
    async fn stop(&self, assignment: &Assignment, mut running: Running, why: &str) {
        let shared = &self.shared;
        let asked = Instant::now();
        let kill_at = shared.timing.kill_by(asked, *shared.trust.borrow());
        let bucket = assignment.bucket;
        match running.stop(shared.stop_signal, kill_at).await {
            Stopped::Exited { status, killed } => {
                shared.watchdog.gone(running.pid);
                let took = round_ms(asked.elapsed());
                let signal = if killed {
                    "SIGKILL".to_owned()
                } else {
                    signal_name(shared.stop_signal.0)
                };
                self.printer.emit(
                    "child-stopped",
                    json!({
                        "bucket": bucket.get(),
                        "pid": running.pid,
                        "why": why,
                        "signal": signal,
                        "status": describe(status),
                        "took_ms": took.as_millis() as u64,
                    }),
                    format!(
                        "bucket {bucket}: child (pid {}) stopped ({why}) by {signal} in {}: {}",
                        running.pid,
                        show(took),
                        describe(status)
                    ),
                );
            }
            Stopped::Unstoppable => {
                let who = format!(
                    "bucket {bucket} of group {:?} (pid {})",
                    self.group.as_str(),
                    running.pid
                );
                self.printer.error(&format!(
                    "{who}: the child did not end after SIGKILL; the bucket is held (not \
                     released) until it does"
                ));
                shared
                    .unstoppable
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(who);
                running.reaped().await;
                shared.watchdog.gone(running.pid);
            }
        }
    }
}

/// Returns once a child may run: the restart backoff over, the bucket not quarantined, and
/// the trust deadline far enough that the child is not due to stop at once.
async fn may_run(
    trust: &mut watch::Receiver<Option<Instant>>,
    timing: Timing,
    restart_at: Option<Instant>,
    quarantined: bool,
) {
    if quarantined {
        // The revocation comes with the node's next heartbeat.
        return std::future::pending().await;
    }
    if let Some(at) = restart_at {
        tokio::time::sleep_until(at.into()).await;
    }
    loop {
        let trusted = *trust.borrow_and_update();
        if trusted.is_some_and(|t| timing.stop_at(t) > Instant::now()) {
            return;
        }
        if trust.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Returns when a running child must be told to stop because no renewal moved the trust
/// deadline: [`Timing::stop_at`] passed, or nothing is trusted any more.
async fn trust_runs_out(trust: &mut watch::Receiver<Option<Instant>>, timing: Timing) {
    loop {
        let Some(trusted) = *trust.borrow_and_update() else {
            return;
        };
        let at = timing.stop_at(trusted);
        if Instant::now() >= at {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(at.into()) => {}
            changed = trust.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
    }
}
