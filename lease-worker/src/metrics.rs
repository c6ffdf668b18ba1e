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
//! | `lease_unowned_buckets` | gauge | buckets of the group no live member owns, as of the node's last heartbeat (a stall that lasts shows here) |
//! | `lease_unowned_bucket_seconds_total` | counter | unowned buckets integrated over time between the node's heartbeats; every member of the group counts the same, so aggregate with `max` by group, not `sum` |
//! | `lease_quarantined_buckets` | gauge | buckets of the group under quarantine (`leasectl quarantine`) |
//! | `lease_polling_fallback` | gauge | 1 while the worker has no change feed (the store cannot push wake-ups, e.g. Postgres behind a transaction pooler without a direct URL) and re-plans only at its renew interval; 0 while wake-ups are pushed |

use std::time::{Duration, Instant};

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
    unowned: Gauge,
    unowned_seconds: Counter,
    quarantined_gauge: Gauge,
    /// The last coverage seen: since when that many buckets were unowned, for the counter.
    last_unowned: Option<(Instant, u32)>,
    /// Bucket-milliseconds unowned not counted yet (under a second's worth).
    unowned_ms: u64,
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
            unowned: gauge!("lease_unowned_buckets", "group" => g.clone()),
            unowned_seconds: counter!("lease_unowned_bucket_seconds_total", "group" => g.clone()),
            quarantined_gauge: gauge!("lease_quarantined_buckets", "group" => g.clone()),
            last_unowned: None,
            unowned_ms: 0,
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

    /// The group's coverage at a heartbeat answered at `at`: the gauges, and the bucket-seconds
    /// unowned since the previous one (a counter takes integers: whole bucket-seconds are
    /// counted, the rest carried to the next heartbeat).
    pub(crate) fn coverage(&mut self, unowned: u32, quarantined: u32, at: Instant) {
        self.unowned.set(f64::from(unowned));
        self.quarantined_gauge.set(f64::from(quarantined));
        if let Some((since, n)) = self.last_unowned {
            let ms =
                u64::try_from(at.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX);
            self.unowned_ms = self
                .unowned_ms
                .saturating_add(ms.saturating_mul(u64::from(n)));
            self.unowned_seconds.increment(self.unowned_ms / 1_000);
            self.unowned_ms %= 1_000;
        }
        self.last_unowned = Some((at, unowned));
    }

    pub(crate) fn tick(&self, took: Duration) {
        self.tick.record(took.as_secs_f64());
    }
}
