//! What the store's answers do: a heartbeat's views reconciled into each group's plan, and
//! the joins', claims', releases' and leaves' results.

use super::loads;
use super::*;

impl Machine {
    pub(super) fn on_heartbeat(
        &mut self,
        now: Instant,
        sent: Instant,
        result: Result<Heartbeat, StoreError>,
    ) {
        let beat = match result {
            Ok(beat) => beat,
            Err(e) => return self.on_store_error(now, None, Operation::Heartbeat, e),
        };
        self.writes.beat(&beat);
        if self.winding_up() {
            // Stopping: the session keeps the applications' leases trusted until their
            // revocations are acknowledged, and it is the one to leave (or hand over).
            self.failures = 0;
            self.last_sent = Some(sent);
            if self.session == Some(beat.session) {
                self.trusted_until =
                    Some(sent + self.rules.ttl.as_duration() - self.rules.safety_margin);
                self.fenced = false;
            } else {
                // A new session: nothing held before is ours any more; what is still to be
                // revoked has expired.
                self.session = Some(beat.session);
                for g in &mut self.groups {
                    g.lose_session();
                }
            }
            for g in &mut self.groups {
                g.removing_beat(&beat);
            }
            return;
        }
        self.failures = 0;
        self.observe_clock(sent, now, beat.observed_at);
        self.last_sent = Some(sent);
        self.trusted_until = Some(sent + self.rules.ttl.as_duration() - self.rules.safety_margin);
        self.fenced = false;
        if self.session != Some(beat.session) {
            // A new session (or one whose start this node never heard of): nothing held
            // before is ours any more, in any group, nor to be released; and it is a member of
            // no group.
            self.session = Some(beat.session);
            for g in &mut self.groups {
                g.lose_session();
            }
        }
        // A session taken over from a predecessor (HO3) keeps the predecessor's memberships,
        // some perhaps of groups this node does not run: nobody would work their buckets.
        self.unrun = beat
            .groups
            .iter()
            .map(|g| &g.group)
            .chain(beat.unchanged.iter().map(|u| &u.group))
            .filter(|&name| self.index(name).is_none() && self.admitting_index(name).is_none())
            .cloned()
            .collect();
        for i in 0..self.groups.len() {
            if self.groups[i].removing.is_some() {
                self.groups[i].removing_beat(&beat);
                continue;
            }
            let name = self.groups[i].name.clone();
            let given = beat.group(&name).cloned();
            let unchanged = beat
                .unchanged
                .iter()
                .find(|u| u.group == name)
                .map(|u| u.stamp);
            let g = &mut self.groups[i];
            let view = match (given, unchanged) {
                (Some(given), _) => {
                    g.stamp = Some(given.stamp);
                    g.last = Some(given.clone());
                    Some(given)
                }
                (None, Some(stamp)) => match g.last.clone() {
                    // Unchanged since the view it was last given (contract rule H8); its
                    // leases now expire with the renewed session.
                    Some(mut last) => {
                        g.stamp = Some(stamp);
                        for lease in &mut last.owned {
                            lease.expires_at = beat.expires_at;
                        }
                        g.last = Some(last.clone());
                        Some(last)
                    }
                    None => {
                        // Unchanged since a view this node no longer has: ask for it.
                        g.stamp = None;
                        g.drop_tick();
                        g.steps.push_back(Step::EndTick);
                        self.again = true;
                        continue;
                    }
                },
                (None, None) => None,
            };
            match view {
                Some(view) => {
                    g.member = true;
                    self.reconcile(now, i, &view);
                }
                None => {
                    if g.member {
                        // Left behind the node's back (an operator evicted it): what it held
                        // there was released with the membership.
                        self.reports.push_back(Report::Evicted {
                            group: name.clone(),
                        });
                        g.drop_tick();
                        // What is still to be revoked (a shed, say) is free for others too.
                        g.steps.set_revoke_reasons(RevokeReason::Lost);
                        g.revoke_all_first(RevokeReason::Lost);
                        g.held.clear();
                        g.unreleased.clear();
                        g.draining.clear();
                    } else {
                        g.drop_tick();
                    }
                    g.member = false;
                    g.last = None;
                    g.stamp = None;
                    // Join once the revocations are out; claim once a heartbeat gives the
                    // view.
                    g.steps.push_back(Step::Join);
                    g.steps.push_back(Step::EndTick);
                }
            }
        }
    }

    /// Plan group `i` on the store's word about it: its view and the node's leases in it.
    pub(super) fn reconcile(&mut self, now: Instant, i: usize, beat: &GroupBeat) {
        let node = self.rules.node;
        let owned: u32 = beat.view.members.iter().map(|m| m.owned).sum();
        self.reports.push_back(Report::Coverage {
            group: self.groups[i].name.clone(),
            unowned: beat.view.shard_count.get().saturating_sub(owned),
            quarantined: beat.view.quarantined,
            at: now,
        });
        let g = &mut self.groups[i];
        if beat.view.shard_count != g.shards {
            if beat.view.previous == Some(g.shards) {
                // Resized from the count the group routes by: follow it.
                self.reports.push_back(Report::Resized {
                    group: g.name.clone(),
                    from: g.shards,
                    to: beat.view.shard_count,
                    generation: beat.view.generation,
                });
                g.shards = beat.view.shard_count;
            } else {
                // The group was deleted and created again with another count (or resized
                // from one the group never had): the buckets this group routes by are not
                // the store's. Retrying cannot help.
                let mismatch = StoreError::ShardCountMismatch {
                    group: g.name.clone(),
                    configured: g.shards,
                    found: beat.view.shard_count,
                };
                g.held = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
                return self.fail_group(i, Err(WorkerFailed::Store(mismatch)), RevokeReason::Lost);
            }
        }
        g.resized_from = beat.view.previous;
        g.draining = beat.draining_buckets().into_iter().collect();
        g.quarantined = beat.quarantined.iter().copied().collect();
        let held: Owned = beat.owned.iter().map(|l| (l.bucket, l.token)).collect();
        g.held.clone_from(&held);
        // Revocations still queued (a fence's, a new session's) stay first; their buckets are
        // on their way out, neither kept nor assigned again in this tick.
        g.steps.retain(Step::is_revoke);
        let out = &g.steps;
        // What the application was told it owns: an assignment still being delivered counts
        // (the heartbeat went out while a handler worked), so it is never released unrevoked.
        let mut told = g.owned.clone();
        if let Some(Delivery::Assign { bucket, token }) = g.pending {
            told.insert(bucket, token);
        }
        let mut steps: Vec<Step> = Vec::new();
        for (&bucket, &token) in &g.owned {
            if held.get(&bucket) != Some(&token) && !out.revokes(bucket) {
                steps.push(Step::Deliver(Delivery::Revoke {
                    bucket,
                    token,
                    reason: RevokeReason::Lost,
                }));
            }
        }
        // What is not held any more needs no release.
        g.unreleased.retain(|b| held.contains_key(b));
        // The application is told of what the store says is ours and it does not hold (a
        // claim whose answer was lost, leases kept alive that it fenced), unless it is on its
        // way out.
        let mut assigning: BTreeMap<Bucket, FencingToken> = BTreeMap::new();
        // Buckets of a draining generation and buckets under quarantine are let go: revoked
        // first if the application holds them, released at once if it does not.
        let mut let_go: Vec<Step> = Vec::new();
        for (&bucket, &token) in &held {
            let holds_it = !out.revokes(bucket) && told.get(&bucket) == Some(&token);
            let busy = g.unreleased.contains(&bucket)
                || g.revoking.contains_key(&bucket)
                || g.stuck.contains_key(&bucket)
                || out.revokes(bucket);
            let letting_go = if g.draining.contains(&bucket) {
                Some(RevokeReason::Resharded)
            } else if g.quarantined.contains(&bucket) {
                Some(RevokeReason::Quarantined)
            } else {
                None
            };
            if let Some(reason) = letting_go {
                if holds_it {
                    let_go.push(Step::Deliver(Delivery::Revoke {
                        bucket,
                        token,
                        reason,
                    }));
                } else if !busy {
                    g.unreleased.insert(bucket);
                }
            } else if !holds_it && !busy {
                assigning.insert(bucket, token);
            }
        }
        // The plan counts what the group will hold once this tick's revocations and
        // assignments are done: what the store says, less what is on its way out.
        let keeping: Vec<Bucket> = held
            .keys()
            .copied()
            .filter(|b| {
                !g.draining.contains(b)
                    && !g.quarantined.contains(b)
                    && !g.unreleased.contains(b)
                    && !g.revoking.contains_key(b)
                    && !g.stuck.contains_key(b)
                    && !out.revokes(*b)
            })
            .collect();
        let plan = loads::moves(
            &g.loads,
            &beat.view,
            node,
            &keeping,
            self.rules.loads.balance,
        );
        // An operator's drain (or weight 0) is why this node sheds, not the fair share.
        let shed_reason = match beat.view.members.iter().find(|m| m.worker == node) {
            Some(me) if me.mode == MemberMode::Draining || me.weight == 0 => RevokeReason::Drained,
            _ => RevokeReason::Shed,
        };
        let mut shed_now: Vec<Step> = let_go;
        for bucket in &plan.shed {
            if assigning.remove(bucket).is_some() {
                // Never handed to the application: it can go at once.
                g.unreleased.insert(*bucket);
            } else if let Some(&token) = told.get(bucket) {
                shed_now.push(Step::Deliver(Delivery::Revoke {
                    bucket: *bucket,
                    token,
                    reason: shed_reason,
                }));
            }
        }
        steps.extend(
            assigning
                .into_iter()
                .map(|(bucket, token)| Step::Deliver(Delivery::Assign { bucket, token })),
        );
        if !g.unreleased.is_empty() {
            steps.push(Step::Release);
        }
        if !shed_now.is_empty() {
            // Revoke first, release after: the next owner can only start once the
            // application stopped.
            steps.extend(shed_now);
            steps.push(Step::Release);
        }
        if !plan.claim_named.is_empty() {
            steps.push(Step::ClaimNamed(plan.claim_named));
        }
        if plan.claim > 0 {
            steps.push(Step::Claim(plan.claim));
        }
        steps.push(Step::EndTick);
        g.steps.extend(steps);
    }

    pub(super) fn on_joined(&mut self, now: Instant, i: usize, result: Result<(), StoreError>) {
        if self.winding_up() || self.groups[i].removing.is_some() {
            // Its leave follows.
            return;
        }
        match result {
            Ok(()) => {
                let g = &mut self.groups[i];
                g.member = true;
                g.last = None;
                g.stamp = None;
                g.loads.rejoined();
                // A weight the application set is written under every new membership (over
                // an operator's `leasectl weight` meanwhile).
                if self.weights.contains_key(&g.name) {
                    self.weight_unsent.insert(g.name.clone());
                }
                // The next heartbeat gives the group's view: tick again at once.
                self.again = true;
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Join, e),
        }
    }

    pub(super) fn on_released(
        &mut self,
        now: Instant,
        i: usize,
        result: Result<Vec<Bucket>, StoreError>,
    ) {
        if self.winding_up() || self.groups[i].removing.is_some() {
            return;
        }
        match result {
            Ok(released) => {
                let g = &mut self.groups[i];
                for bucket in &released {
                    g.unreleased.remove(bucket);
                    g.held.remove(bucket);
                }
                let upto = g.release_upto.take();
                if let Some(upto) = upto
                    && g.unreleased
                        .range((Excluded(upto), Unbounded))
                        .next()
                        .is_some()
                {
                    // The next batch, at once.
                    g.steps.push_front(Step::Release);
                }
                // The store may skip a row another transaction holds for an instant (a claim
                // re-checking it): a few quick retries release it. An application's fencing
                // transaction may hold it longer: then the next tick retries.
                let skipped = upto.is_none_or(|upto| g.unreleased.range(..=upto).next().is_some());
                if skipped && g.release_retries < RELEASE_RETRIES {
                    g.release_retries += 1;
                    g.release_retry = Some(now + RELEASE_RETRY);
                }
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Release, e),
        }
    }

    pub(super) fn on_claimed(
        &mut self,
        now: Instant,
        i: usize,
        result: Result<Vec<Lease>, StoreError>,
    ) {
        if self.winding_up() || self.groups[i].removing.is_some() {
            // What was won goes with the leave.
            return;
        }
        match result {
            Ok(won) => {
                let g = &mut self.groups[i];
                self.reports.push_back(Report::Claimed {
                    group: g.name.clone(),
                    won: won.len(),
                });
                let all = |asked: u32| u32::try_from(won.len()).is_ok_and(|n| n >= asked);
                if g.deferred_short.is_some_and(all) {
                    // It won all it asked for: nothing wanted was left behind.
                    g.deferred_short = None;
                }
                g.held.extend(won.iter().map(|l| (l.bucket, l.token)));
                if g.batch_of_more.take().is_some_and(all) {
                    // A full batch and more wanted: tick again at once, on a fresh view.
                    self.again = true;
                }
                // A bucket whose earlier revocation the application has not acknowledged is
                // held, not assigned: it is assigned at a tick after the acknowledgement.
                let assigns: Vec<Step> = won
                    .iter()
                    .filter(|l| {
                        !g.revoking.contains_key(&l.bucket) && !g.stuck.contains_key(&l.bucket)
                    })
                    .map(|l| {
                        Step::Deliver(Delivery::Assign {
                            bucket: l.bucket,
                            token: l.token,
                        })
                    })
                    .collect();
                for step in assigns.into_iter().rev() {
                    g.steps.push_front(step);
                }
            }
            Err(e) => self.on_store_error(now, Some(i), Operation::Claim, e),
        }
    }

    pub(super) fn on_left(&mut self, i: usize, result: Result<Vec<Bucket>, StoreError>) {
        if let Err(e) = result {
            let source = WorkerError::Store {
                operation: Operation::Leave,
                source: e,
            };
            self.on_leave_failed(i, source);
        }
    }

    /// A leave that failed or did not answer: a group removed on request ends with the
    /// failure; one ending for another reason keeps that reason, and the failure is reported.
    pub(super) fn on_leave_failed(&mut self, i: usize, source: WorkerError) {
        let g = &mut self.groups[i];
        if matches!(g.removing, Some(Ok(()))) {
            g.removing = Some(Err(WorkerFailed::LeaveFailed { source }));
        } else {
            self.reports.push_back(Report::Error {
                group: Some(g.name.clone()),
                error: source,
            });
        }
    }
}
