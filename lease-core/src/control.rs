//! Operators' controls on members and buckets: weights, cordon and drain, quarantine.
//!
//! Each is stored in the store, not in a worker: it works from any host, survives restarts of
//! the workers and of the operator's tool, and every member sees it at its next heartbeat (the
//! write moves the group's change counter, H8).

use std::time::Duration;

use crate::invalid::InvalidInput;
use crate::view::MemberMode;

/// The largest weight a member may have: far above any sensible ratio, and small enough that
/// the policy's integer apportionment (`buckets x weight`) cannot overflow.
pub const MAX_WEIGHT: u32 = 1_000_000;

/// The longest quarantine: a year. A bucket that must stay out longer is better taken out of
/// the application.
pub const MAX_QUARANTINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A member's weight, `0..=`[`MAX_WEIGHT`]: its target is proportional to it.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Weight(u32);

impl Weight {
    /// Weight 1, every member's until told otherwise.
    pub const DEFAULT: Weight = Weight(1);

    /// A weight, or [`InvalidInput::WeightOutOfRange`] above [`MAX_WEIGHT`].
    pub fn new(value: u32) -> Result<Self, InvalidInput> {
        if value > MAX_WEIGHT {
            return Err(InvalidInput::WeightOutOfRange {
                value: u64::from(value),
                max: MAX_WEIGHT,
            });
        }
        Ok(Self(value))
    }

    /// The value.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for Weight {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl std::fmt::Display for Weight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::str::FromStr for Weight {
    type Err = InvalidInput;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let value: u64 = s
            .trim()
            .parse()
            .map_err(|_| InvalidInput::WeightNotANumber {
                value: s.chars().take(64).collect(),
            })?;
        let value = u32::try_from(value).map_err(|_| InvalidInput::WeightOutOfRange {
            value,
            max: MAX_WEIGHT,
        })?;
        Self::new(value)
    }
}

/// What [`control`](crate::AdminStore::control) sets on a member of a group.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum MemberControl {
    /// Its weight.
    Weight(Weight),
    /// Whether it claims, keeps or sheds: `leasectl cordon` sets
    /// [`MemberMode::Cordoned`], `drain` [`MemberMode::Draining`], `uncordon`
    /// [`MemberMode::Active`].
    Mode(MemberMode),
}

impl MemberControl {
    /// The weight and mode a member has once this control is applied to `current`: what
    /// every store keeps (K1).
    pub fn apply(self, current: (u32, MemberMode)) -> (u32, MemberMode) {
        match self {
            Self::Weight(w) => (w.get(), current.1),
            Self::Mode(m) => (current.0, m),
        }
    }
}

/// How long [`quarantine`](crate::AdminStore::quarantine) keeps a bucket out, `1 ms..=`
/// [`MAX_QUARANTINE`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct QuarantineFor(Duration);

impl QuarantineFor {
    /// A quarantine of `d`, or [`InvalidInput::QuarantineOutOfRange`].
    pub fn new(d: Duration) -> Result<Self, InvalidInput> {
        if d < Duration::from_millis(1) || d > MAX_QUARANTINE {
            return Err(InvalidInput::QuarantineOutOfRange {
                value: d,
                max: MAX_QUARANTINE,
            });
        }
        Ok(Self(d))
    }

    /// The duration.
    pub fn get(self) -> Duration {
        self.0
    }

    /// The duration, to add to a store timestamp.
    pub fn as_chrono(self) -> chrono::TimeDelta {
        // In range by construction: at most a year.
        chrono::TimeDelta::from_std(self.0).unwrap_or(chrono::TimeDelta::MAX)
    }
}

/// Why a bucket is under quarantine, as whoever set it said (`leasectl quarantine --reason`,
/// or `leasectl run` after a crash loop: the exit and the child's last stderr line): 1 to
/// [`QuarantineReason::MAX`] characters, kept with the quarantine and shown with it.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct QuarantineReason(String);

impl QuarantineReason {
    /// The most characters a reason holds.
    pub const MAX: usize = 1000;

    /// `text` as a reason, or [`InvalidInput::QuarantineReasonLength`].
    pub fn new(text: impl Into<String>) -> Result<Self, InvalidInput> {
        let text = text.into();
        let len = text.chars().count();
        if len == 0 || len > Self::MAX {
            return Err(InvalidInput::QuarantineReasonLength {
                len,
                max: Self::MAX,
            });
        }
        Ok(Self(text))
    }

    /// `text` as a reason, cut to its first [`MAX`](Self::MAX) characters (the last of them
    /// an ellipsis when cut); `None` when empty.
    pub fn truncated(text: &str) -> Option<Self> {
        if text.chars().count() <= Self::MAX {
            return Self::new(text).ok();
        }
        let mut cut: String = text.chars().take(Self::MAX - 1).collect();
        cut.push('…');
        Self::new(cut).ok()
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for QuarantineReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_bounded_and_cut_when_asked() {
        assert_eq!(
            QuarantineReason::new("exit code 3").map(|r| r.to_string()),
            Ok("exit code 3".to_owned())
        );
        assert!(QuarantineReason::new("").is_err());
        let long = "x".repeat(QuarantineReason::MAX + 5);
        assert_eq!(
            QuarantineReason::new(long.clone()),
            Err(InvalidInput::QuarantineReasonLength {
                len: QuarantineReason::MAX + 5,
                max: QuarantineReason::MAX
            })
        );
        let cut = QuarantineReason::truncated(&long).map(|r| r.as_str().to_owned());
        assert_eq!(
            cut.as_ref().map(|c| c.chars().count()),
            Some(QuarantineReason::MAX)
        );
        assert!(cut.is_some_and(|c| c.ends_with('…')));
        assert_eq!(QuarantineReason::truncated(""), None);
    }

    #[test]
    fn weights_are_bounded_and_parsed() {
        assert_eq!(Weight::new(0).map(Weight::get), Ok(0));
        assert_eq!("3".parse::<Weight>().map(Weight::get), Ok(3));
        assert!(matches!(
            Weight::new(MAX_WEIGHT + 1),
            Err(InvalidInput::WeightOutOfRange { .. })
        ));
        assert!(matches!(
            "99999999999".parse::<Weight>(),
            Err(InvalidInput::WeightOutOfRange { .. })
        ));
        assert!(matches!(
            "-1".parse::<Weight>(),
            Err(InvalidInput::WeightNotANumber { .. })
        ));
        assert_eq!(Weight::default().get(), 1);
    }

    #[test]
    fn quarantines_are_bounded() {
        assert!(QuarantineFor::new(Duration::from_secs(300)).is_ok());
        assert!(QuarantineFor::new(Duration::ZERO).is_err());
        assert!(QuarantineFor::new(MAX_QUARANTINE + Duration::from_secs(1)).is_err());
    }
}
