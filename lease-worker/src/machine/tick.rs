//! A tick's work: the next output (a delivery, a heartbeat, a group's call), the deliveries'
//! rules (nothing assigned untrusted, revoke before release), the one call in flight, and
//! the tick's end.

use super::*;

impl Machine {
    /// The next thing to do at `now`, if any. Call it until it returns `None`, then wait for
    /// an input or for [`poll_timeout`](Self::poll_timeout).
    pub fn poll(&mut self, now: Instant) -> Option<Output> {
        if let Some(report) = self.reports.pop_front() {
            return Some(Output::Report(report));
        }
        if let Some((group, ended)) = self.ended_early.pop_front() {
            return Some(Output::GroupFinished(group, ended));
        }
        if self.is_finished() {
            return None;
        }
        loop {
            // Each group's deliveries and the steps that need no store call.
            for i in 0..self.groups.len() {
                if let Some(out) = self.advance(now, i) {
                    return Some(out);
                }
            }
            if self.in_flight.is_some() {
                break;
            }
            // The heartbeat before any group's call: the groups' calls act on its answer.
            if self.heartbeat_wanted
                || self.busy_renewal_at().is_some_and(|t| now >= t)
                || self.busy_wake_at().is_some_and(|t| now >= t)
                || self.winding_down_renewal_at().is_some_and(|t| now >= t)
            {
                return Some(self.heartbeat_call(now));
            }
            // Groups being added, then weights to write: each one call, between ticks' calls.
            if let Some(out) = self.admission_call(now) {
                return Some(out);
            }
            if let Some(out) = self.weight_call(now) {
                return Some(out);
            }
            if let Some(out) = self.load_call(now) {
                return Some(out);
            }
            // A group of the session the node does not run: leave it first (checked again
            // now, as it may have been added since the heartbeat), also on a stop, unless the
            // session is handed over (the successor decides).
            if let Some(session) = self.session
                && !matches!(self.handing_over(), HandingOver::Due(_) | HandingOver::Sent)
                && let Some(group) = self.unrun.pop()
            {
                if self.index(&group).is_none() && self.admitting_index(&group).is_none() {
                    let node = self.rules.node;
                    let out = self.call(
                        now,
                        StoreCall::Leave {
                            group,
                            node,
                            session,
                        },
                    );
                    if let Some(f) = &mut self.in_flight {
                        f.unrun = true;
                    }
                    return Some(out);
                }
                continue;
            }
            // One group's call, the groups taking turns.
            let n = self.groups.len();
            let mut skipped = false;
            for k in 0..n {
                let i = (self.cursor + k) % n;
                let g = &self.groups[i];
                if g.pending.is_some() || !g.steps.front().is_some_and(Step::is_call) {
                    continue;
                }
                if matches!(g.steps.front(), Some(Step::Leave))
                    && matches!(self.handing_over(), HandingOver::Due(_))
                    && self.revocations_outstanding()
                {
                    // Whether the groups leave or hand over is decided for all of them at
                    // once, when no revocation is outstanding in any group: one that gets
                    // stuck meanwhile means no hand-over, and then every group leaves.
                    continue;
                }
                match self.call_step(now, i) {
                    Some(out) => {
                        self.cursor = (i + 1) % n;
                        return Some(out);
                    }
                    None => {
                        // The step had nothing to do: the group's next steps may go on.
                        skipped = true;
                        break;
                    }
                }
            }
            if !skipped {
                break;
            }
        }
        if self.winding_up()
            && self.groups.is_empty()
            && self.admitting.is_empty()
            && self.in_flight.is_none()
            && let HandingOver::Due(keep) = self.handing_over()
        {
            if self.stuck_seen || !self.leave_skipped {
                // Nothing to hand over, or a bucket is stuck (see `stuck_seen`).
                self.set_handing_over(HandingOver::No);
            } else {
                self.set_handing_over(HandingOver::Sent);
                let call = StoreCall::HandOver {
                    node: self.rules.node,
                    incarnation: self.rules.incarnation,
                    keep,
                };
                return Some(self.call(now, call));
            }
        }
        if self.winding_up()
            && self.groups.is_empty()
            && self.admitting.is_empty()
            && self.in_flight.is_none()
            && self.handing_over() != HandingOver::Sent
        {
            let ended = match std::mem::replace(&mut self.life, Lifecycle::Finished) {
                Lifecycle::Stopping { ended, .. } => ended,
                _ => Ok(()),
            };
            return Some(Output::Finished(ended));
        }
        if self.open && self.is_idle() {
            self.open = false;
            self.end_tick(now);
            return self.reports.pop_front().map(Output::Report);
        }
        None
    }

    /// Work through group `i`'s steps that need no store call: its next delivery (one pending
    /// at a time), the end of its tick, the wait for acknowledgements, its end.
    pub(super) fn advance(&mut self, now: Instant, i: usize) -> Option<Output> {
        let own_call = self
            .in_flight
            .as_ref()
            .and_then(|f| f.call.group())
            .is_some_and(|g| g == &self.groups[i].name);
        loop {
            let node = self.node_state(now);
            let g = &mut self.groups[i];
            if g.pending.is_some() {
                return None;
            }
            match g.steps.front() {
                None => return None,
                Some(Step::Deliver(d)) => {
                    let d = *d;
                    // A revocation goes out even while the group's call is in flight (the
                    // trust deadline's must); an assignment waits for the call's answer.
                    if own_call && matches!(d, Delivery::Assign { .. }) {
                        return None;
                    }
                    g.steps.pop_front();
                    if let Some(out) = self.emit(now, node, i, d) {
                        return Some(out);
                    }
                }
                Some(Step::EndTick) => {
                    g.steps.pop_front();
                }
                Some(Step::AwaitAcks) => {
                    if !g.revoking.is_empty() {
                        // Leave only once every revocation was acknowledged or given up on.
                        return None;
                    }
                    g.steps.pop_front();
                }
                Some(Step::Finish) => {
                    if own_call {
                        return None;
                    }
                    let g = self.groups.remove(i);
                    if self.cursor > i {
                        self.cursor -= 1;
                    }
                    let ended = g.removing.unwrap_or(Ok(()));
                    return Some(Output::GroupFinished(g.name, ended));
                }
                Some(_) => return None,
            }
        }
    }

    /// Make group `i`'s next step, a store call, if there is one to make; `None` when the step
    /// had nothing to do (it is dropped).
    pub(super) fn call_step(&mut self, now: Instant, i: usize) -> Option<Output> {
        let step = self.groups[i].steps.pop_front()?;
        let group = self.groups[i].name.clone();
        let session = self.session?;
        let node = self.rules.node;
        let call = match step {
            Step::Join => StoreCall::Join {
                group,
                node,
                session,
            },
            Step::Release => {
                let g = &mut self.groups[i];
                if g.unreleased.is_empty() {
                    return None;
                }
                let buckets: Vec<Bucket> =
                    g.unreleased.iter().copied().take(RELEASE_BATCH).collect();
                g.release_upto = buckets.last().copied();
                StoreCall::Release {
                    group,
                    node,
                    session,
                    buckets,
                }
            }
            Step::Claim(want) => {
                if !self.trusted(now) || self.renewal_due(now) {
                    // The next heartbeat (due, or at once) plans again.
                    self.again = true;
                    return None;
                }
                let batch = want.min(CLAIM_BATCH);
                let takeover = self.takeover(now);
                let g = &mut self.groups[i];
                g.batch_of_more = (batch < want).then_some(batch);
                g.deferred_short = (takeover == Takeover::Deferred).then_some(batch);
                StoreCall::Claim {
                    group,
                    node,
                    session,
                    want: batch,
                    takeover,
                }
            }
            Step::ClaimNamed(buckets) => {
                if !self.trusted(now) || self.renewal_due(now) {
                    self.again = true;
                    return None;
                }
                let takeover = self.takeover(now);
                let g = &mut self.groups[i];
                g.batch_of_more = None;
                g.deferred_short = (takeover == Takeover::Deferred)
                    .then_some(u32::try_from(buckets.len()).unwrap_or(u32::MAX));
                StoreCall::ClaimBuckets {
                    group,
                    node,
                    session,
                    buckets,
                    takeover,
                }
            }
            Step::Leave => match self.handing_over() {
                // The membership goes to the successor with the session.
                HandingOver::Due(_) if !self.stuck_seen => {
                    self.leave_skipped = true;
                    return None;
                }
                HandingOver::Due(_) => {
                    // A stuck bucket: no hand-over; every group leaves (the decision waited
                    // until no revocation was outstanding in any group, see `poll`).
                    self.set_handing_over(HandingOver::No);
                    StoreCall::Leave {
                        group,
                        node,
                        session,
                    }
                }
                _ => StoreCall::Leave {
                    group,
                    node,
                    session,
                },
            },
            _ => return None,
        };
        Some(self.call(now, call))
    }

    pub(super) fn heartbeat_call(&mut self, now: Instant) -> Output {
        self.heartbeat_wanted = false;
        self.next_tick = None;
        self.woken = false;
        self.woken_at = None;
        self.again = false;
        self.open = true;
        let seen = self
            .groups
            .iter()
            .filter(|g| g.member && (g.last.is_some() || g.removing.is_some()))
            .filter_map(|g| {
                g.stamp.map(|stamp| GroupStamp {
                    group: g.name.clone(),
                    stamp,
                })
            })
            .collect();
        let call = StoreCall::Heartbeat {
            node: self.rules.node,
            incarnation: self.rules.incarnation,
            ttl: self.rules.ttl,
            metadata: self.rules.metadata.clone(),
            seen,
            // V4's promise: a bound only while the session is trusted, so that a session
            // expired on a promoted store may be kept (it outlived the old one).
            bound: self.writes.bound().filter(|_| self.trusted(now)),
        };
        self.call(now, call)
    }

    /// Emit a delivery of group `i` at `now` if it still applies; `None` when it was dropped.
    pub(super) fn emit(
        &mut self,
        now: Instant,
        node: NodeState,
        i: usize,
        d: Delivery,
    ) -> Option<Output> {
        let stopping = self.winding_up();
        let g = &mut self.groups[i];
        match d {
            Delivery::Assign { bucket, token } => {
                // Assign only what the store (as of the latest answer) says is ours with that
                // token, and what the application does not hold already.
                if g.removing.is_some()
                    || stopping
                    || g.held.get(&bucket) != Some(&token)
                    || g.draining.contains(&bucket)
                    || g.quarantined.contains(&bucket)
                    || g.owned.contains_key(&bucket)
                {
                    return None;
                }
                if !node.trusted || node.renewal_due {
                    // Past the trust deadline, or a renewal is due: assign nothing more now.
                    // The heartbeat due renews, and the group assigns what is still ours.
                    g.drop_assignments_and_claims();
                    self.again = true;
                    return None;
                }
            }
            Delivery::Revoke {
                bucket,
                token,
                reason,
            } => {
                // Revoke only what the application holds, with the token it holds.
                if g.owned.get(&bucket) != Some(&token) {
                    return None;
                }
                // At or past the trust deadline the lease may be someone else's already: the
                // application hears that the node fenced (or that the session ended, or the
                // bucket was lost), never a reason (a shutdown, a shed) that would let it act
                // as if it still held the bucket, such as write a last checkpoint.
                let reason = if node.trusted
                    || matches!(reason, RevokeReason::Lost | RevokeReason::Expired)
                {
                    reason
                } else {
                    RevokeReason::Fenced
                };
                g.owned.remove(&bucket);
                g.revoking.insert(
                    bucket,
                    Revoking {
                        reason,
                        session: node.session,
                        deadline: node.ack_limit.map(|limit| now + limit),
                    },
                );
                let d = Delivery::Revoke {
                    bucket,
                    token,
                    reason,
                };
                g.pending = Some(d);
                return Some(Output::Deliver(g.name.clone(), d));
            }
        }
        g.pending = Some(d);
        Some(Output::Deliver(g.name.clone(), d))
    }

    pub(super) fn on_delivered(&mut self, now: Instant, i: usize) {
        let trusted = self.trusted(now);
        let g = &mut self.groups[i];
        if let Some(Delivery::Assign { bucket, token }) = g.pending.take() {
            g.owned.insert(bucket, token);
            if g.removing.is_some() {
                // Told while the group's removal began: it is revoked with the rest, before the
                // group is left.
                g.steps.push_front(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: g.removal_reason,
                }));
            } else if !trusted {
                // The application took its time past the trust deadline: nothing held can be
                // trusted now, this bucket included.
                if self.fenced {
                    g.steps.push_front(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason: RevokeReason::Fenced,
                    }));
                } else {
                    self.fence();
                }
            } else if g.held.get(&bucket) != Some(&token) && !g.steps.revokes(bucket) {
                // A heartbeat answered while the application was being told, and the store
                // no longer says the bucket is ours: take it back at once.
                g.steps.push_front(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: RevokeReason::Lost,
                }));
            }
        }
    }

    pub(super) fn on_acked(&mut self, i: usize, bucket: Bucket) {
        let stopping = self.winding_up();
        let session = self.session;
        let g = &mut self.groups[i];
        // A late acknowledgement frees a stuck bucket too.
        let revoked = g
            .revoking
            .remove(&bucket)
            .or_else(|| g.stuck.remove(&bucket));
        let leaving = stopping || g.removing.is_some();
        // A shed (or resharded) bucket is released once acknowledged, if it is still held
        // under the session it was let go from, and so is a bucket of a draining generation
        // however it was revoked; any other acknowledged bucket the store says is ours is
        // assigned again.
        let release = revoked.is_some_and(|r| {
            matches!(
                r.reason,
                RevokeReason::Shed
                    | RevokeReason::Resharded
                    | RevokeReason::Drained
                    | RevokeReason::Quarantined
            ) && r.session == session
        }) || ((g.draining.contains(&bucket) || g.quarantined.contains(&bucket))
            && g.held.contains_key(&bucket));
        if leaving {
            return;
        }
        let started = if release {
            g.unreleased.insert(bucket);
            if g.steps.has_release() {
                false
            } else {
                // Acknowledged after this tick's release went out (or between ticks): release
                // it now rather than a renew interval later.
                g.insert_step(Step::Release)
            }
        } else {
            // Revoked for another reason (a fence, say) and still ours in the store: the
            // application gets it back in this tick rather than at the next.
            match g.held.get(&bucket) {
                Some(&token)
                    if !g.owned.contains_key(&bucket) && !g.unreleased.contains(&bucket) =>
                {
                    g.insert_step(Step::Deliver(Delivery::Assign { bucket, token }))
                }
                _ => false,
            }
        };
        self.open |= started;
    }

    /// Revoke everything every group's application holds: the leases are not trusted any more.
    pub(super) fn fence(&mut self) {
        self.fenced = true;
        self.reports.push_back(Report::Fenced {
            owned: self.owned_total(),
        });
        for g in &mut self.groups {
            // No assignment may follow untrusted leases in this tick.
            g.drop_assignments_and_claims();
            g.revoke_all_first(RevokeReason::Fenced);
        }
    }

    pub(super) fn call(&mut self, now: Instant, call: StoreCall) -> Output {
        if call.writes() {
            self.writes.sent();
        }
        self.in_flight = Some(InFlight {
            call: call.clone(),
            sent: now,
            deadline: now + self.rules.call_timeout,
            unrun: false,
        });
        Output::Call(call)
    }

    /// A write's call in flight was answered: `ok`, it committed (or wrote nothing) before
    /// the next call; otherwise it may commit after any later read (the session loses its
    /// bound).
    pub(super) fn write_answered(&mut self, ok: bool) {
        self.writes.answered(ok);
    }

    /// The send time of the call in flight, if it is `op`'s for `group`; an answer nobody
    /// waits for any more is dropped.
    /// Whether a claim made now may take dead sessions' buckets (C7).
    fn takeover(&self, now: Instant) -> Takeover {
        match self.last_sent {
            // The store's clock was watched up to the heartbeat sent at `sent`: from there to
            // the claim, the store checks that its clock moved no more than ours did (give or
            // take the tolerance), so a step in between defers the takeover.
            Some(sent) if self.takeover_opens().is_some_and(|t| now >= t) => {
                Takeover::AllowedWithin(
                    now.saturating_duration_since(sent) + self.rules.safety_margin / 2,
                )
            }
            _ => Takeover::Deferred,
        }
    }

    pub(super) fn take_call(
        &mut self,
        op: Operation,
        group: Option<&GroupName>,
    ) -> Option<Instant> {
        match &self.in_flight {
            Some(f) if f.call.operation() == op && f.call.group() == group => {
                let sent = f.sent;
                self.in_flight = None;
                Some(sent)
            }
            _ => None,
        }
    }

    /// The node went idle after a tick (or a group's small run): schedule the next tick.
    pub(super) fn end_tick(&mut self, now: Instant) {
        if self.winding_up() {
            return;
        }
        let mut next = if self.again {
            now
        } else if self.woken {
            now + self.rules.wake_debounce
        } else {
            // Renew on a cadence counted from when the last heartbeat was sent, the instant
            // trust is counted from.
            self.last_sent.unwrap_or(now) + self.rules.renew_interval
        };
        // Every group's mark is cleared (not only up to the first): the tick is over.
        let mut short = false;
        for g in &mut self.groups {
            short |= g.deferred_short.take().is_some();
        }
        if short && let Some(opens) = self.takeover_opens().filter(|&t| t > now) {
            // Dead sessions' buckets were left for later: claim them as soon as that is safe.
            next = next.min(opens);
        }
        if let Some(started) = self.last_sent {
            self.reports.push_back(Report::TickCompleted {
                took: now.saturating_duration_since(started),
            });
        }
        self.again = false;
        self.woken = false;
        self.woken_at = None;
        self.next_tick = Some(self.next_tick.map_or(next, |t| t.min(next)));
    }
}
