//! Groups on their way into the node (ensured, then subscribed to, then joined) and out of
//! it, and the weights the application sets: written under the node's session, again after
//! every join.

use super::*;

impl Machine {
    /// Add `group`, split into `shards` buckets: it is created in the store if needed
    /// ([`StoreCall::EnsureGroup`]; a refusal, such as another shard count, ends it with
    /// [`Output::GroupFinished`]), subscribed to ([`StoreCall::Subscribe`]), then joined (at
    /// once, or at the next tick, due at once, when the node has no session yet) and shared
    /// from the heartbeat after. False (nothing changes) if the node has the group already
    /// (being added or removed included) or is stopping.
    pub fn add_group(&mut self, group: GroupName, shards: ShardCount) -> bool {
        if self.is_finished()
            || self.winding_up()
            || self.index(&group).is_some()
            || self.admitting_index(&group).is_some()
        {
            return false;
        }
        self.admitting.push(Admitting {
            name: group,
            shards,
            ensured: false,
            cancelled: false,
        });
        true
    }

    pub(super) fn admitting_index(&self, group: &GroupName) -> Option<usize> {
        self.admitting.iter().position(|a| &a.name == group)
    }

    /// The next call of a group being admitted; the caller checked that no call is in flight.
    pub(super) fn admission_call(&mut self, now: Instant) -> Option<Output> {
        let a = self.admitting.iter().find(|a| !a.cancelled)?;
        let group = a.name.clone();
        let call = if a.ensured {
            StoreCall::Subscribe { group }
        } else {
            StoreCall::EnsureGroup {
                group,
                shards: a.shards,
            }
        };
        Some(self.call(now, call))
    }

    pub(super) fn on_ensured(&mut self, group: &GroupName, result: Result<(), StoreError>) {
        let Some(k) = self.admitting_index(group) else {
            return;
        };
        match result {
            Ok(()) if !self.admitting[k].cancelled => self.admitting[k].ensured = true,
            Ok(()) => {
                let a = self.admitting.remove(k);
                self.ended_early.push_back((a.name, Ok(())));
            }
            Err(e) => {
                // Refused (another shard count) or not answered: the caller of the add hears
                // why; nothing was joined, so nothing is to be left.
                let a = self.admitting.remove(k);
                self.ended_early
                    .push_back((a.name, Err(WorkerFailed::Store(e))));
            }
        }
    }

    /// The group's subscription answered: a feed only speeds re-plans up, so whatever the
    /// answer, the group is the node's now.
    pub(super) fn on_subscribed(&mut self, now: Instant, group: &GroupName) {
        let Some(k) = self.admitting_index(group) else {
            return;
        };
        let a = self.admitting.remove(k);
        if a.cancelled || self.winding_up() {
            self.ended_early.push_back((a.name, Ok(())));
        } else {
            self.join_group(now, a.name, a.shards);
        }
    }

    /// An admitted group becomes the node's: joined at once if the node has a session, at
    /// the next tick (due at once) otherwise.
    pub(super) fn join_group(&mut self, now: Instant, group: GroupName, shards: ShardCount) {
        let mut added = Group::new(group, shards);
        if self.session.is_some() {
            // The node has a session: join at once; the next heartbeat, at once after,
            // gives the view.
            added.steps.push_back(Step::Join);
            added.steps.push_back(Step::EndTick);
            self.open = true;
            self.groups.push(added);
        } else {
            // The next tick starts a session and joins.
            let idle = self.is_idle();
            self.groups.push(added);
            if idle {
                self.next_tick = Some(self.next_tick.map_or(now, |t| t.min(now)));
            } else {
                self.again = true;
            }
        }
    }

    /// Stop admitting the group at `k`: at once, or when its call in flight answers.
    pub(super) fn cancel_admission(&mut self, k: usize) {
        let in_flight = self
            .in_flight
            .as_ref()
            .and_then(|f| f.call.group())
            .is_some_and(|g| g == &self.admitting[k].name);
        if in_flight {
            self.admitting[k].cancelled = true;
        } else {
            let a = self.admitting.remove(k);
            self.ended_early.push_back((a.name, Ok(())));
        }
    }

    /// The next weight to write: a group's whose weight the application set and the store
    /// has not been told under the node's session, once the node is a member there.
    pub(super) fn weight_call(&mut self, now: Instant) -> Option<Output> {
        let session = self.session?;
        let group = self
            .weight_unsent
            .iter()
            .find(|name| self.weight_writable(name))?
            .clone();
        self.weight_unsent.remove(&group);
        let weight = *self.weights.get(&group)?;
        let node = self.rules.node;
        Some(self.call(
            now,
            StoreCall::SetWeight {
                group,
                node,
                session,
                weight,
            },
        ))
    }

    /// Whether a weight for `group` may be written now: the node runs, has a session, and is
    /// a member of the group, which it is not removing.
    fn weight_writable(&self, group: &GroupName) -> bool {
        !self.winding_up()
            && self.session.is_some()
            && self
                .group(group)
                .is_some_and(|g| g.member && g.removing.is_none())
    }

    /// Whether a weight set for `group` is still to be written under the node's current
    /// membership (it is written at the next call the node makes).
    pub fn weight_pending(&self, group: &GroupName) -> bool {
        self.weight_unsent.contains(group) && self.weight_writable(group)
    }

    /// Remove `group`: revoke everything its application holds (shutdown), wait for the
    /// acknowledgements, leave it, then [`Output::GroupFinished`]. False if the node has no
    /// such group, or is removing it already.
    pub fn remove_group(&mut self, group: &GroupName) -> bool {
        if let Some(k) = self.admitting_index(group) {
            if self.admitting[k].cancelled {
                return false;
            }
            self.cancel_admission(k);
            return true;
        }
        match self.index(group) {
            Some(i) if self.groups[i].removing.is_none() => {
                self.groups[i].begin_removal(Ok(()), RevokeReason::Shutdown);
                true
            }
            _ => false,
        }
    }
}
