//! Failures and the node's end: transient errors back off, permanent ones end a group or the
//! node; a stop removes every group, then leaves or hands the session over.

use super::*;

pub(super) fn error_is_transient(e: &WorkerError) -> bool {
    match e {
        WorkerError::Store { source, .. } => source.is_transient(),
        _ => true,
    }
}

impl Machine {
    pub(super) fn on_store_error(
        &mut self,
        now: Instant,
        i: Option<usize>,
        operation: Operation,
        e: StoreError,
    ) {
        let error = WorkerError::Store {
            operation,
            source: e,
        };
        let removing = i.is_some_and(|i| self.groups[i].removing.is_some());
        if self.winding_up() && i.is_none() {
            // A renewal during the stop, whatever the error: retried after a backoff while
            // the stop goes on (the trust deadline fences if none succeeds).
            self.on_failure(now, None, error);
        } else if self.winding_up() || removing {
            self.reports.push_back(Report::Error {
                group: i.map(|i| self.groups[i].name.clone()),
                error,
            });
        } else if error_is_transient(&error) {
            self.on_failure(now, i, error);
        } else {
            let WorkerError::Store { source, .. } = error else {
                return;
            };
            match i {
                // A group's call: that group ends; the node's other groups go on.
                Some(i) => self.fail_group(i, Err(WorkerFailed::Store(source)), RevokeReason::Lost),
                None => self.stop(Err(WorkerFailed::Store(source)), RevokeReason::Lost),
            }
        }
    }

    /// A transient failure, or a call that did not answer: report it, drop the rest of the
    /// tick (the group's, for a group's call; every group's, for the heartbeat), and tick
    /// again after a backoff. A leave that did not answer ends its group's removal with the
    /// failure.
    pub(super) fn on_failure(&mut self, now: Instant, i: Option<usize>, error: WorkerError) {
        let removing = i.is_some_and(|i| self.groups[i].removing.is_some());
        if self.winding_up() || removing {
            match (i, &error) {
                (
                    Some(i),
                    WorkerError::Timeout {
                        operation: Operation::Leave,
                        ..
                    },
                ) => self.on_leave_failed(i, error),
                (None, _) => {
                    // A renewal during the stop: try again after a backoff.
                    self.reports.push_back(Report::Error { group: None, error });
                    self.failures = self.failures.saturating_add(1);
                    self.next_tick = Some(now + self.backoff());
                }
                _ => self.reports.push_back(Report::Error {
                    group: i.map(|i| self.groups[i].name.clone()),
                    error,
                }),
            }
            return;
        }
        self.reports.push_back(Report::Error {
            group: i.map(|i| self.groups[i].name.clone()),
            error,
        });
        self.failures = self.failures.saturating_add(1);
        match i {
            Some(i) => self.groups[i].drop_tick(),
            None => {
                for g in &mut self.groups {
                    g.drop_tick();
                }
            }
        }
        // The tick is abandoned: the next one, after the backoff, does it again.
        self.open = false;
        self.heartbeat_wanted = false;
        self.next_tick = Some(now + self.backoff());
    }

    /// End group `i` for `ended`: revoke what its application holds (`reason`), leave, finish.
    pub(super) fn fail_group(
        &mut self,
        i: usize,
        ended: Result<(), WorkerFailed>,
        reason: RevokeReason,
    ) {
        self.groups[i].begin_removal(ended, reason);
    }

    /// Stop the node: let the call in flight answer (a heartbeat may be starting the session
    /// the node must leave), remove every group (revoke, wait for the acknowledgements, leave
    /// under the node's own session), then finish with `ended`.
    /// The hand-over failed (`None`: the session had ended before it): the node ends with
    /// the failure, its memberships and buckets left to the session's expiry.
    pub(super) fn hand_over_failed(&mut self, source: Option<WorkerError>) {
        if let Lifecycle::Stopping { ended, .. } = &mut self.life
            && ended.is_ok()
        {
            *ended = Err(WorkerFailed::HandOverFailed { source });
        }
    }

    pub(super) fn stop(&mut self, ended: Result<(), WorkerFailed>, reason: RevokeReason) {
        let failed = ended.is_err();
        self.life = Lifecycle::Stopping {
            ended,
            handing_over: HandingOver::No,
        };
        // A graceful stop of a node with a session hands it over instead of leaving, if
        // configured to; a failure leaves (or lets the session expire) as always.
        let hand_over = match (self.rules.keep_on_stop, failed, self.session) {
            (Some(keep), false, Some(_)) if reason == RevokeReason::Shutdown => Some(keep),
            _ => None,
        };
        self.next_tick = None;
        self.heartbeat_wanted = false;
        // Renewals go on during the stop, the first when due (at once after failures).
        self.failures = 0;
        for k in (0..self.admitting.len()).rev() {
            if !self.admitting[k].cancelled {
                self.cancel_admission(k);
            }
        }
        for g in &mut self.groups {
            if g.removing.is_none() {
                let group_ended = if failed {
                    Err(WorkerFailed::NodeFailed)
                } else {
                    Ok(())
                };
                g.begin_removal(group_ended, reason);
            }
            if !g.stuck.is_empty() {
                self.stuck_seen = true;
            }
        }
        // Once no revocation is outstanding in any group, every group's leave is skipped, or,
        // if a bucket got stuck by then, every group leaves.
        if let Some(keep) = hand_over {
            self.set_handing_over(HandingOver::Due(keep));
        }
    }
}
