//! When a child must be told to stop, and when it must be dead, from the node's trust
//! deadline: pure arithmetic, so the rule is stated (and tested) once.
//!
//! The node trusts its leases until `ttl - margin` after its last answered heartbeat was sent
//! (the store expires them `margin` later). A child works a bucket only while the lease is
//! trusted, so it must be dead, SIGKILL included, before that deadline: it is sent the stop
//! signal `grace` + [`KILL_ALLOWANCE`] before it, and SIGKILL [`KILL_ALLOWANCE`] before it
//! (by the supervisor, or by the watchdog when the supervisor is stopped). Every renewal
//! moves the deadline: in steady state the stop time must stay ahead of the next renewal's
//! answer, or every child would be stopped between two heartbeats; [`check`] refuses a
//! `--grace` that leaves no room for that.

use std::time::{Duration, Instant};

use crate::duration::show;

/// How long SIGKILL is given to take effect: the process must be gone by the deadline, and
/// the kernel needs a moment to deliver it and the supervisor to see the exit.
pub const KILL_ALLOWANCE: Duration = Duration::from_millis(250);

/// A child's stop times, from `--grace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a child has between the stop signal and SIGKILL.
    pub grace: Duration,
}

impl Timing {
    /// When a child still running under leases trusted until `trusted_until` is sent the stop
    /// signal.
    pub fn stop_at(self, trusted_until: Instant) -> Instant {
        self.kill_at(trusted_until)
            .checked_sub(self.grace)
            .unwrap_or(trusted_until)
            .min(trusted_until)
    }

    /// When such a child is sent SIGKILL (by the watchdog too).
    pub fn kill_at(self, trusted_until: Instant) -> Instant {
        trusted_until
            .checked_sub(KILL_ALLOWANCE)
            .unwrap_or(trusted_until)
    }

    /// When a child told to stop `now` is sent SIGKILL: after its grace, and before the trust
    /// deadline (`None`: nothing is trusted any more, SIGKILL now).
    pub fn kill_by(self, now: Instant, trusted_until: Option<Instant>) -> Instant {
        let graceful = now + self.grace;
        match trusted_until {
            Some(until) => graceful.min(self.kill_at(until)).max(now),
            None => now,
        }
    }
}

/// Whether `grace` fits: the stop signal is due `grace + KILL_ALLOWANCE` before the trust
/// deadline, which is `ttl - margin` after a heartbeat is sent; the next heartbeat is sent
/// `renew` later and must be answered before that. `Err` names the flags and the largest grace
/// that fits.
pub fn check(
    grace: Duration,
    ttl: Duration,
    margin: Duration,
    renew: Duration,
) -> Result<(), String> {
    let trusted = ttl.saturating_sub(margin);
    let room = trusted.saturating_sub(renew).saturating_sub(KILL_ALLOWANCE);
    if grace < room {
        return Ok(());
    }
    Err(format!(
        "--grace {} leaves no room: a child must be dead before the node's trust deadline, \
         --ttl {} minus --margin {} = {} after each heartbeat, and the next heartbeat goes {} \
         later (--renew); with {} for SIGKILL to take effect, --grace must be below {} (or \
         raise --ttl)",
        show(grace),
        show(ttl),
        show(margin),
        show(trusted),
        show(renew),
        show(KILL_ALLOWANCE),
        show(room)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_stop_signal_leaves_the_grace_and_the_kill_allowance_before_the_deadline() {
        let t = Timing { grace: ms(1000) };
        let now = Instant::now();
        let until = now + ms(5000);
        assert_eq!(t.kill_at(until), until - KILL_ALLOWANCE);
        assert_eq!(t.stop_at(until), until - KILL_ALLOWANCE - ms(1000));
        // Told to stop with plenty of trust left: the full grace.
        assert_eq!(t.kill_by(now, Some(until)), now + ms(1000));
        // Told late: SIGKILL still comes before the deadline.
        let late = until - ms(600);
        assert_eq!(t.kill_by(late, Some(until)), until - KILL_ALLOWANCE);
        // Past it, or with nothing trusted: at once.
        assert_eq!(t.kill_by(until, Some(until)), until);
        assert_eq!(t.kill_by(now, None), now);
    }

    #[test]
    fn a_grace_that_does_not_fit_between_renewals_is_refused_naming_the_flags() {
        // ttl 3s, margin 0.5s, renew 1s: 2.5s trusted, 1.5s after the next heartbeat goes.
        assert_eq!(check(ms(1000), ms(3000), ms(500), ms(1000)), Ok(()));
        assert_eq!(check(ms(1249), ms(3000), ms(500), ms(1000)), Ok(()));
        let refused = check(ms(1250), ms(3000), ms(500), ms(1000));
        assert_eq!(
            refused,
            Err(
                "--grace 1.25s leaves no room: a child must be dead before the node's trust \
                 deadline, --ttl 3s minus --margin 500ms = 2.5s after each heartbeat, and the \
                 next heartbeat goes 1s later (--renew); with 250ms for SIGKILL to take \
                 effect, --grace must be below 1.25s (or raise --ttl)"
                    .to_owned()
            )
        );
        // The defaults: ttl 30s, margin 5s, renew 10s: the default grace of 5s fits.
        assert_eq!(check(ms(5000), ms(30_000), ms(5000), ms(10_000)), Ok(()));
        assert!(check(ms(15_000), ms(30_000), ms(5000), ms(10_000)).is_err());
    }
}
