//! The node's metrics, through the `metrics` facade (a no-op until the application installs
//! a recorder, e.g. a Prometheus exporter). Every series carries the `group` label: a node in
//! several groups has a series per group, and what it does for all its groups at once (a
//! tick, a heartbeat that failed, a step of the store's clock) counts in each of them, as it
//! did for each group's own worker.
//!
//! | name | kind | what |
//! |---|---|---|
//! | `lease_owned_buckets` | gauge | buckets the application owns now |
//! | `lease_claimed_total` | counter | buckets won by claims |
//! | `lease_revoked_total` | counter | revocations, by `reason` (shed, lost, expired, shutdown, resharded, drained, quarantined) |
//! | `lease_store_errors_total` | counter | failed or timed-out store calls (the group's, and the node's heartbeats) |
//! | `lease_stuck_total` | counter | revocations the application did not acknowledge in time |
//! | `lease_tick_seconds` | histogram | duration of a tick |
//! | `lease_clock_steps_total` | counter | steps of the store's clock seen between heartbeats, by `direction` (forward, backward) |
//! | `lease_polling_fallback` | gauge | 1 while the worker has no change feed (the store cannot push wake-ups, e.g. Postgres behind a transaction pooler without a direct URL) and re-plans only at its renew interval; 0 while wake-ups are pushed |

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

use lease_core::GroupName;
use lease_core::RevokeReason;

pub(crate) struct Metrics {
    owned: Gauge,
    claimed: Counter,
    shed: Counter,
    lost: Counter,
    expired: Counter,
    shutdown: Counter,
    resharded: Counter,
    drained: Counter,
    quarantined: Counter,
    errors: Counter,
    stuck: Counter,
    tick: Histogram,
    polling: Gauge,
    steps_forward: Counter,
    steps_backward: Counter,
}

impl Metrics {
    pub(crate) fn new(group: &GroupName) -> Self {
        let g = group.to_string();
        let revoked = |reason: RevokeReason| counter!("lease_revoked_total", "group" => g.clone(), "reason" => reason.as_str());
        Self {
            owned: gauge!("lease_owned_buckets", "group" => g.clone()),
            claimed: counter!("lease_claimed_total", "group" => g.clone()),
            shed: revoked(RevokeReason::Shed),
            lost: revoked(RevokeReason::Lost),
            expired: revoked(RevokeReason::Expired),
            shutdown: revoked(RevokeReason::Shutdown),
            resharded: revoked(RevokeReason::Resharded),
            drained: revoked(RevokeReason::Drained),
            quarantined: revoked(RevokeReason::Quarantined),
            errors: counter!("lease_store_errors_total", "group" => g.clone()),
            stuck: counter!("lease_stuck_total", "group" => g.clone()),
            tick: histogram!("lease_tick_seconds", "group" => g.clone()),
            polling: gauge!("lease_polling_fallback", "group" => g.clone()),
            steps_forward: counter!("lease_clock_steps_total", "group" => g.clone(), "direction" => "forward"),
            steps_backward: counter!("lease_clock_steps_total", "group" => g, "direction" => "backward"),
        }
    }

    pub(crate) fn owned(&self, n: usize) {
        self.owned.set(n as f64);
    }

    pub(crate) fn claimed(&self, n: usize) {
        self.claimed.increment(n as u64);
    }

    pub(crate) fn revoked(&self, reason: RevokeReason) {
        match reason {
            RevokeReason::Shed => &self.shed,
            RevokeReason::Lost => &self.lost,
            RevokeReason::Expired => &self.expired,
            RevokeReason::Shutdown => &self.shutdown,
            RevokeReason::Resharded => &self.resharded,
            RevokeReason::Drained => &self.drained,
            RevokeReason::Quarantined => &self.quarantined,
        }
        .increment(1);
    }

    pub(crate) fn error(&self) {
        self.errors.increment(1);
    }

    pub(crate) fn stuck(&self) {
        self.stuck.increment(1);
    }

    /// Whether the worker re-plans only at its renew interval (no change feed).
    pub(crate) fn polling(&self, polling: bool) {
        self.polling.set(if polling { 1.0 } else { 0.0 });
    }

    /// A step of the store's clock, forward or back.
    pub(crate) fn clock_step(&self, forward: bool) {
        if forward {
            self.steps_forward.increment(1);
        } else {
            self.steps_backward.increment(1);
        }
    }

    pub(crate) fn tick(&self, took: Duration) {
        self.tick.record(took.as_secs_f64());
    }
}
