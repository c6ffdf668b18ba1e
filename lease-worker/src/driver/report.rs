//! What the driver makes of the machine's reports: logs, metrics, and the applications'
//! error hooks.

use std::sync::Arc;

use lease_core::{Chain, GroupName};

use super::Driver;
use crate::application::AppCommand;
use crate::events::WorkerError;
use crate::machine::{ClockStep, Report};

impl Driver {
    /// Tell the group's application (or every group's, for the node's own) of an error.
    pub(super) fn tell_error(&self, group: Option<&GroupName>, error: WorkerError) {
        let error = Arc::new(error);
        for (name, slot) in &self.groups {
            if group.is_none_or(|g| g == name) {
                slot.metrics.error();
                slot.app.send(AppCommand::Error(error.clone())).ok();
            }
        }
    }

    pub(super) fn report(&mut self, r: Report) {
        match r {
            Report::Error { group, error } => {
                match &group {
                    Some(group) => tracing::warn!(
                        %group,
                        error = %Chain(&error),
                        "lease node error; retrying"
                    ),
                    None => tracing::warn!(error = %Chain(&error), "lease node error; retrying"),
                }
                self.tell_error(group.as_ref(), error);
            }
            Report::Claimed { group, won } => tracing::debug!(%group, claimed = won, "claimed"),
            Report::Stuck { group, bucket } => {
                tracing::error!(
                    %group,
                    %bucket,
                    "the application did not stop working on a revoked bucket in time; it is \
                     kept, not released, until the session ends"
                );
                if let Some(slot) = self.groups.get(&group) {
                    slot.metrics.stuck();
                }
            }
            Report::Fenced { owned } => tracing::warn!(
                owned,
                "renewals did not succeed in time; revoking every bucket of every group"
            ),
            Report::TickCompleted { took } => {
                for slot in self.groups.values() {
                    slot.metrics.tick(took);
                }
            }
            Report::ClockStep(step) => {
                let forward = matches!(step, ClockStep::Forward(_));
                match step {
                    ClockStep::Forward(by) => tracing::warn!(
                        at_least = ?by,
                        "the store's clock stepped forward: taking no dead session's bucket \
                         for a ttl, until their holders have fenced"
                    ),
                    ClockStep::Backward(by) => tracing::warn!(
                        at_least = ?by,
                        "the store's clock stepped back: leases live longer by as much in the \
                         store's eyes"
                    ),
                }
                for slot in self.groups.values() {
                    slot.metrics.clock_step(forward);
                }
            }
            Report::Resized {
                group,
                from,
                to,
                generation,
            } => tracing::warn!(
                %group,
                %from,
                %to,
                %generation,
                "the group was resized from {from} to {to} shards: following it (old buckets \
                 are revoked and released, the new ones shared); configure new workers with {to}"
            ),
            Report::Evicted { group } => tracing::warn!(
                %group,
                "the node was evicted from the group (its buckets were released behind its \
                 back): revoking them and joining again"
            ),
            Report::LeftUnrun {
                group,
                released: Ok(n),
            } => tracing::warn!(
                %group,
                "left a group this node does not run (its session, taken over from the previous \
                 process with this node id, was a member): {n} bucket(s) released for the nodes \
                 that run it"
            ),
            Report::LeftUnrun {
                group,
                released: Err(e),
            } => tracing::warn!(
                %group,
                error = %Chain(&e),
                "could not leave a group this node does not run; trying again after the next \
                 heartbeat"
            ),
            Report::HandedOver { until } => tracing::info!(
                until = %until,
                "stopped: the session and its buckets are handed over to the next process with \
                 this node id (until {until}, when they become claimable if none comes)"
            ),
            Report::Coverage {
                group,
                unowned,
                quarantined,
                at,
            } => {
                if let Some(slot) = self.groups.get_mut(&group) {
                    slot.metrics.coverage(unowned, quarantined, at);
                }
            }
        }
    }
}
