//! Time as the store sees it: timestamps, lease durations and the clock a store decides
//! expiry by.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeZone, Utc};

use crate::invalid::InvalidInput;

/// A point in time on the store's clock, in UTC. Stores keep microseconds (as Postgres does).
pub type Timestamp = DateTime<Utc>;

/// Round a timestamp down to the microsecond, the precision every store keeps.
pub fn store_precision(t: Timestamp) -> Timestamp {
    t.trunc_subsecs(6)
}

/// How long a session stays live after a heartbeat: `1 ms ..= 1 day`, kept in whole
/// microseconds.
///
/// ```
/// use std::time::Duration;
/// use lease_core::Ttl;
/// let ttl = Ttl::new(Duration::from_secs(30))?;
/// assert_eq!(ttl.as_duration(), Duration::from_secs(30));
/// assert!(Ttl::new(Duration::ZERO).is_err());
/// # Ok::<(), lease_core::InvalidInput>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ttl(Duration);

impl Ttl {
    /// The shortest ttl accepted.
    pub const MIN: Duration = Duration::from_millis(1);
    /// The longest ttl accepted.
    pub const MAX: Duration = Duration::from_secs(24 * 60 * 60);

    /// Validate a ttl; sub-microsecond parts are dropped.
    pub fn new(d: Duration) -> Result<Self, InvalidInput> {
        let d = Duration::from_micros(u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        if d < Self::MIN || d > Self::MAX {
            return Err(InvalidInput::TtlOutOfRange {
                value: d,
                min: Self::MIN,
                max: Self::MAX,
            });
        }
        Ok(Self(d))
    }

    /// A ttl of whole seconds.
    pub fn from_secs(secs: u64) -> Result<Self, InvalidInput> {
        Self::new(Duration::from_secs(secs))
    }

    /// A ttl of whole milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self, InvalidInput> {
        Self::new(Duration::from_millis(ms))
    }

    /// The ttl as a standard duration.
    pub fn as_duration(self) -> Duration {
        self.0
    }

    /// The ttl in microseconds (fits easily: at most 86,400,000,000).
    pub fn as_micros(self) -> i64 {
        // The bound in `new` keeps this far below i64::MAX.
        self.0.as_micros() as i64
    }

    /// The ttl as a chrono duration, to add to a [`Timestamp`].
    pub fn as_chrono(self) -> chrono::Duration {
        chrono::Duration::microseconds(self.as_micros())
    }
}

impl fmt::Debug for Ttl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl TryFrom<Duration> for Ttl {
    type Error = InvalidInput;
    fn try_from(d: Duration) -> Result<Self, Self::Error> {
        Self::new(d)
    }
}

/// The clock a store decides expiry by. Exactly one clock decides: the store's. Workers never
/// compare their own wall clocks with each other's.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The host's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Utc::now()
    }
}

/// A clock that moves only when told to: for tests and deterministic simulations. Clones share
/// the same time.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{Clock, ManualClock};
/// let clock = ManualClock::new();
/// let start = clock.now();
/// clock.advance(Duration::from_secs(5));
/// assert_eq!((clock.now() - start).num_seconds(), 5);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    /// A clock starting at 2030-01-01T00:00:00Z, so runs are repeatable.
    pub fn new() -> Self {
        Self::starting_at(
            Utc.with_ymd_and_hms(2030, 1, 1, 0, 0, 0)
                .single()
                .unwrap_or_default(),
        )
    }

    /// A clock starting at `t` (rounded down to the microsecond).
    pub fn starting_at(t: Timestamp) -> Self {
        Self(Arc::new(Mutex::new(store_precision(t))))
    }

    /// Move the clock forward by `d` (rounded down to the microsecond).
    pub fn advance(&self, d: Duration) {
        let step = chrono::Duration::microseconds(i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        let mut now = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        *now += step;
    }

    /// Set the clock to `t`; it may move backwards, as a real wall clock can.
    pub fn set(&self, t: Timestamp) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = store_precision(t);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_bounds_and_precision() {
        assert!(Ttl::new(Duration::from_micros(999)).is_err());
        assert!(Ttl::new(Duration::from_millis(1)).is_ok());
        assert!(Ttl::new(Duration::from_secs(86_400)).is_ok());
        assert!(Ttl::new(Duration::from_secs(86_401)).is_err());
        let ttl = Ttl::new(Duration::from_nanos(1_500_999)).unwrap();
        assert_eq!(ttl.as_micros(), 1_500);
        assert_eq!(ttl.as_chrono(), chrono::Duration::microseconds(1_500));
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new();
        let t0 = clock.now();
        assert_eq!(clock.now(), t0);
        let shared = clock.clone();
        shared.advance(Duration::from_nanos(2_500));
        assert_eq!(clock.now() - t0, chrono::Duration::microseconds(2));
        clock.set(t0 - chrono::Duration::seconds(1));
        assert!(shared.now() < t0);
    }
}
