//! Loads: how busy a bucket is, as the application measures it (events per second, CPU
//! seconds per second, lag), smoothed over time and published only when it moved.
//!
//! A load is stored as a whole number of millionths of the application's unit ([`Load`]), so
//! that every worker adds and compares loads exactly and reaches the same plan from the same
//! view, and so that stores keep them as plain integers. The unit is the application's: the
//! policy only compares loads of one group with each other.

use std::time::Duration;

use crate::invalid::InvalidInput;

/// Millionths of a unit in one unit.
const MICROS_PER_UNIT: f64 = 1_000_000.0;

/// How busy one bucket is, `0..=`[`Load::MAX`] in the application's unit, to a millionth.
///
/// A bucket nobody reported a load for weighs [`Load::ZERO`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Load(u64);

impl Load {
    /// No load.
    pub const ZERO: Load = Load(0);

    /// The largest load, 10^8 units: the loads of 65,536 buckets at this size still add up
    /// without overflow, and no application measures one bucket in more.
    pub const MAX: Load = Load(100_000_000 * 1_000_000);

    /// A load of `value` units, rounded to a millionth; [`InvalidInput::LoadOutOfRange`] for a
    /// negative, infinite or NaN value or one above [`Load::MAX`].
    pub fn new(value: f64) -> Result<Self, InvalidInput> {
        let micros = (value * MICROS_PER_UNIT).round();
        // NaN fails both comparisons.
        if (0.0..=Self::MAX.0 as f64).contains(&micros) {
            // In range and whole, so the cast is exact.
            Ok(Self(micros as u64))
        } else {
            Err(InvalidInput::LoadOutOfRange {
                value: value.to_string(),
                max: Self::MAX.0 / 1_000_000,
            })
        }
    }

    /// A load of `micros` millionths of a unit, at most [`Load::MAX`].
    pub fn from_micros(micros: u64) -> Self {
        Self(micros.min(Self::MAX.0))
    }

    /// The load in millionths of a unit.
    pub fn micros(self) -> u64 {
        self.0
    }

    /// The load in units.
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / MICROS_PER_UNIT
    }

    /// The sum of `loads` (which cannot overflow for the loads of one group's buckets).
    pub fn sum<'a>(loads: impl IntoIterator<Item = &'a Load>) -> u64 {
        loads.into_iter().fold(0u64, |s, l| s.saturating_add(l.0))
    }
}

impl std::fmt::Display for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

/// How fast a smoothed load forgets: after one half-life a sample's weight is halved.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct HalfLife(Duration);

impl HalfLife {
    /// The default: 10 s, one renew interval of the default worker, so that a load that
    /// changed for good is three quarters seen two ticks later, while noise from one sample to
    /// the next is damped.
    pub const DEFAULT: HalfLife = HalfLife(Duration::from_secs(10));

    /// A half-life of `d`; [`InvalidInput::HalfLifeOutOfRange`] when it is zero or longer
    /// than a day.
    pub fn new(d: Duration) -> Result<Self, InvalidInput> {
        let max = Duration::from_secs(24 * 3600);
        if d.is_zero() || d > max {
            return Err(InvalidInput::HalfLifeOutOfRange { value: d, max });
        }
        Ok(Self(d))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl Default for HalfLife {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// An exponentially weighted moving average of one bucket's load samples, in time: a sample
/// taken `dt` after the previous one moves the average by `1 - 2^(-dt / half_life)` of the
/// difference, however often samples come. Time is handed in (any monotonic origin), so the
/// average is a pure function of its samples.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Smoothed {
    value: f64,
    at: Duration,
}

impl Smoothed {
    /// The average of one sample, `load` at `at`.
    pub fn first(load: Load, at: Duration) -> Self {
        Self {
            value: load.as_f64(),
            at,
        }
    }

    /// Add the sample `load` taken at `at` (a sample from before the last one counts as taken
    /// with it) and return the new average.
    pub fn add(&mut self, load: Load, at: Duration, half_life: HalfLife) -> Load {
        let dt = at.saturating_sub(self.at);
        let keep = (-(dt.as_secs_f64() / half_life.get().as_secs_f64())).exp2();
        self.value = load.as_f64() + (self.value - load.as_f64()) * keep;
        self.at = self.at.max(at);
        self.get()
    }

    /// The average now.
    pub fn get(&self) -> Load {
        // Between two valid loads, so in range; `new` only fails on NaN, which cannot arise.
        Load::new(self.value).unwrap_or(Load::ZERO)
    }
}

/// When a bucket's smoothed load is worth publishing again: it moved from the value last
/// published by more than `threshold_percent` of the larger of that value and `reference`
/// (the member's mean bucket load), so a cold bucket's small wobbles stay unpublished. A
/// bucket never published is published once it weighs anything.
pub fn worth_publishing(
    published: Option<Load>,
    now: Load,
    reference: Load,
    threshold_percent: u32,
) -> bool {
    match published {
        None => now > Load::ZERO,
        Some(before) => {
            let moved = u128::from(now.0.abs_diff(before.0)) * 100;
            moved > u128::from(before.0.max(reference.0)) * u128::from(threshold_percent)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_are_millionths_and_refuse_what_is_not_a_load() {
        assert_eq!(Load::new(1.5).unwrap().micros(), 1_500_000);
        assert_eq!(Load::new(0.0000004).unwrap(), Load::ZERO);
        assert_eq!(Load::new(1e8).unwrap(), Load::MAX);
        for bad in [-0.001, f64::NAN, f64::INFINITY, 1.1e8] {
            let e = Load::new(bad).unwrap_err();
            assert!(
                matches!(e, InvalidInput::LoadOutOfRange { .. }),
                "{bad}: {e}"
            );
        }
        assert_eq!(Load::from_micros(u64::MAX), Load::MAX);
        assert_eq!(Load::new(2.25).unwrap().to_string(), "2.25");
    }

    #[test]
    fn one_half_life_halves_the_distance() {
        let h = HalfLife::new(Duration::from_secs(10)).unwrap();
        let mut s = Smoothed::first(Load::new(100.0).unwrap(), Duration::ZERO);
        assert_eq!(s.add(Load::ZERO, Duration::from_secs(10), h).as_f64(), 50.0);
        assert_eq!(s.add(Load::ZERO, Duration::from_secs(20), h).as_f64(), 25.0);
        // A sample at the same time replaces nothing of the past: weight 0 for the new one.
        assert_eq!(s.add(Load::MAX, Duration::from_secs(20), h).as_f64(), 25.0);
        // Two samples 5 s apart move as far as one 10 s later.
        let mut a = Smoothed::first(Load::new(100.0).unwrap(), Duration::ZERO);
        a.add(Load::ZERO, Duration::from_secs(5), h);
        let two = a.add(Load::ZERO, Duration::from_secs(10), h);
        assert_eq!(two.as_f64(), 50.0);
        assert!(HalfLife::new(Duration::ZERO).is_err());
        assert!(HalfLife::new(Duration::from_secs(86_401)).is_err());
    }

    #[test]
    fn only_moves_beyond_the_threshold_are_published() {
        let l = |v: f64| Load::new(v).unwrap();
        assert!(!worth_publishing(None, Load::ZERO, l(1.0), 10));
        assert!(worth_publishing(None, l(0.1), l(1.0), 10));
        assert!(!worth_publishing(Some(l(10.0)), l(10.9), l(1.0), 10));
        assert!(worth_publishing(Some(l(10.0)), l(11.1), l(1.0), 10));
        assert!(worth_publishing(Some(l(10.0)), l(8.9), l(1.0), 10));
        // A cold bucket moves by a share of the member's mean, not of its own load.
        assert!(!worth_publishing(Some(l(0.01)), l(0.05), l(1.0), 10));
        assert!(worth_publishing(Some(l(0.01)), l(0.2), l(1.0), 10));
    }
}
