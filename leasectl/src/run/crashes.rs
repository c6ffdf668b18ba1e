//! A bucket's crash loop: when its child is restarted, and when it has crashed often enough
//! that the bucket is quarantined instead. Pure: the times are arguments.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// The longest wait before a restart, however many crashes came before (unless
/// `--restart-backoff` alone is longer).
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// `--restart-backoff`, `--crash-limit` and `--crash-window`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CrashRules {
    /// The wait before the first restart; doubled at each crash in the window, up to
    /// [`MAX_BACKOFF`].
    pub backoff: Duration,
    /// How many crashes within `window` quarantine the bucket.
    pub limit: u32,
    /// How far back crashes count.
    pub window: Duration,
}

/// What to do after a child ended on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Start it again after this long.
    Restart(Duration),
    /// It crashed `crashes` times within the window: quarantine the bucket.
    Quarantine {
        /// The crashes counted, the limit or more.
        crashes: u32,
    },
}

impl Next {
    /// How long until the next child may start: the restart's wait, or the longest backoff
    /// when a quarantine was due (it could not be set, or there is no bucket to blame).
    pub fn delay(self) -> Duration {
        match self {
            Next::Restart(after) => after,
            Next::Quarantine { .. } => MAX_BACKOFF,
        }
    }
}

/// The crashes of one bucket's children on this supervisor.
#[derive(Debug)]
pub struct Crashes {
    rules: CrashRules,
    at: VecDeque<Instant>,
}

impl Crashes {
    /// No crash yet.
    pub fn new(rules: CrashRules) -> Self {
        Self {
            rules,
            at: VecDeque::new(),
        }
    }

    /// A child ended on its own at `now`: `crashed` when by a signal or with a non-zero
    /// status. An exit with 0 is restarted after the first backoff and not counted: a
    /// consumer is not meant to end, but ending cleanly is no sign of poison.
    pub fn ended(&mut self, now: Instant, crashed: bool) -> Next {
        if !crashed {
            return Next::Restart(self.rules.backoff);
        }
        self.at.push_back(now);
        while self
            .at
            .front()
            .is_some_and(|&t| now.duration_since(t) >= self.rules.window)
        {
            self.at.pop_front();
        }
        let crashes = u32::try_from(self.at.len()).unwrap_or(u32::MAX);
        if crashes >= self.rules.limit {
            return Next::Quarantine { crashes };
        }
        // 1x, 2x, 4x ... the backoff for the 1st, 2nd, 3rd crash in the window.
        let doubled = self
            .rules
            .backoff
            .checked_mul(
                1u32.checked_shl(crashes.saturating_sub(1))
                    .unwrap_or(u32::MAX),
            )
            .unwrap_or(Duration::MAX);
        Next::Restart(doubled.min(MAX_BACKOFF.max(self.rules.backoff)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: CrashRules = CrashRules {
        backoff: Duration::from_secs(1),
        limit: 3,
        window: Duration::from_secs(600),
    };

    #[test]
    fn crashes_back_off_doubling_then_quarantine_at_the_limit() {
        let mut crashes = Crashes::new(RULES);
        let t0 = Instant::now();
        assert_eq!(
            crashes.ended(t0, true),
            Next::Restart(Duration::from_secs(1))
        );
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(
            crashes.ended(t1, true),
            Next::Restart(Duration::from_secs(2))
        );
        // A clean exit is restarted after the first backoff and does not count.
        assert_eq!(
            crashes.ended(t1, false),
            Next::Restart(Duration::from_secs(1))
        );
        let t2 = t1 + Duration::from_secs(5);
        assert_eq!(crashes.ended(t2, true), Next::Quarantine { crashes: 3 });
    }

    #[test]
    fn crashes_older_than_the_window_do_not_count() {
        let mut crashes = Crashes::new(RULES);
        let t0 = Instant::now();
        crashes.ended(t0, true);
        crashes.ended(t0 + Duration::from_secs(1), true);
        // The first crash is 10 minutes old by the third: two in the window.
        let late = t0 + Duration::from_secs(600);
        assert_eq!(
            crashes.ended(late, true),
            Next::Restart(Duration::from_secs(2))
        );
    }

    #[test]
    fn the_backoff_is_capped() {
        let mut crashes = Crashes::new(CrashRules {
            limit: 100,
            ..RULES
        });
        let t0 = Instant::now();
        let mut last = Next::Restart(Duration::ZERO);
        for i in 0..40 {
            last = crashes.ended(t0 + Duration::from_millis(i), true);
        }
        assert_eq!(last, Next::Restart(MAX_BACKOFF));
        // A backoff longer than the cap is kept as given.
        let mut slow = Crashes::new(CrashRules {
            backoff: Duration::from_secs(90),
            ..RULES
        });
        assert_eq!(slow.ended(t0, true), Next::Restart(Duration::from_secs(90)));
    }
}
