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
//! | `lease_revoked_total` | counter | revocations, by `reason` (shed, lost, fenced, expired, shutdown, resharded, drained, quarantined) |
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
    fenced: Counter,
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
    unowned_time: UnownedTime,
}

/// Unowned buckets integrated over time, in whole bucket-seconds for a counter.
#[derive(Debug, Default)]
struct UnownedTime {
    /// The last coverage seen: since when that many buckets were unowned.
    last: Option<(Instant, u32)>,
    /// Bucket-milliseconds not counted yet (under a second's worth).
    carry_ms: u64,
}

impl UnownedTime {
    /// `unowned` buckets from `at` on: the whole bucket-seconds since the last call to count
    /// now (the rest is carried to the next call).
    fn at(&mut self, at: Instant, unowned: u32) -> u64 {
        let mut whole = 0;
        if let Some((since, n)) = self.last {
            let ms =
                u64::try_from(at.saturating_duration_since(since).as_millis()).unwrap_or(u64::MAX);
            self.carry_ms = self
                .carry_ms
                .saturating_add(ms.saturating_mul(u64::from(n)));
            whole = self.carry_ms / 1_000;
            self.carry_ms %= 1_000;
        }
        self.last = Some((at, unowned));
        whole
    }
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
            fenced: revoked(RevokeReason::Fenced),
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
            unowned_time: UnownedTime::default(),
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
            RevokeReason::Fenced => &self.fenced,
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
        self.unowned_seconds
            .increment(self.unowned_time.at(at, unowned));
    }

    pub(crate) fn tick(&self, took: Duration) {
        self.tick.record(took.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unowned_time_counts_whole_bucket_seconds_and_carries_the_rest() {
        let t0 = Instant::now();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        let mut u = UnownedTime::default();
        assert_eq!(u.at(t0, 3), 0, "nothing before the first heartbeat");
        assert_eq!(u.at(ms(1_500), 2), 4, "3 buckets for 1.5 s: 4.5");
        assert_eq!(
            u.at(ms(2_500), 0),
            2,
            "2 for 1 s, plus the half carried: 2.5"
        );
        assert_eq!(u.at(ms(60_000), 0), 0, "none unowned counts nothing");
        assert_eq!(u.at(ms(60_250), 4), 0);
        assert_eq!(u.at(ms(60_500), 4), 1, "4 for 0.25 s and the half: 1.5");
        assert_eq!(u.at(ms(60_625), 4), 1, "4 for 0.125 s and the half: 1.0");
    }
}
