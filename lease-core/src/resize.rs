//! Changing a group's shard count: the routing rule, generations and the key overlap between
//! the buckets of two generations.
//!
//! A key with hash `h` lives in bucket `h mod N` ([`ShardCount::bucket_of`]). Going from `N`
//! to `M` buckets, old bucket `b` and new bucket `b'` share keys if and only if
//! `b ≡ b' (mod gcd(N, M))` (Chinese remainder theorem): a split `N -> 2N` gives every new
//! bucket one parent, a merge `2N -> N` two, `16 -> 24` two, and `16 -> 17` every old bucket.
//!
//! ```
//! use lease_core::{resize, Bucket, ShardCount};
//! let (n16, n24) = (ShardCount::new(16)?, ShardCount::new(24)?);
//! assert_eq!(resize::parents(n16, n24, Bucket(5)), vec![Bucket(5), Bucket(13)]);
//! assert_eq!(resize::children(n16, n24, Bucket(5)), vec![Bucket(5), Bucket(13), Bucket(21)]);
//! # Ok::<(), lease_core::InvalidInput>(())
//! ```

use std::fmt;

use crate::ids::{Bucket, ShardCount};

/// A group's generation: 0 when [`ensure_group`](crate::WorkerStore::ensure_group) creates it,
/// one more at every [`resize`](crate::AdminStore::resize) that changes its shard count.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Generation(pub u64);

impl Generation {
    /// The generation number.
    pub fn get(self) -> u64 {
        self.0
    }

    /// The generation after this one.
    pub fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }
}

impl fmt::Display for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What a [`resize`](crate::AdminStore::resize) did.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
#[non_exhaustive]
pub enum ResizeOutcome {
    /// Generation `generation` was opened with the new count; the old generation drains.
    Started {
        /// The new generation.
        generation: Generation,
    },
    /// `from` and `to` were the same count, which is the group's: nothing was written.
    Unchanged {
        /// The group's generation, as it was.
        generation: Generation,
    },
}

/// The greatest common divisor of two shard counts.
pub fn gcd(a: ShardCount, b: ShardCount) -> u32 {
    let (mut x, mut y) = (a.get(), b.get());
    while y != 0 {
        (x, y) = (y, x % y);
    }
    x
}

/// Whether old bucket `old` (of `from` buckets) and new bucket `new` (of `to`) hold a key in
/// common: `old ≡ new (mod gcd(from, to))`.
pub fn shares_keys(from: ShardCount, to: ShardCount, old: Bucket, new: Bucket) -> bool {
    let g = gcd(from, to);
    old.0 % g == new.0 % g
}

/// The old buckets (of `from`) that new bucket `new` (of `to`) shares keys with, in order: the
/// buckets it waits for during a resize, whose checkpoints its keys continue.
pub fn parents(from: ShardCount, to: ShardCount, new: Bucket) -> Vec<Bucket> {
    let g = gcd(from, to);
    (new.0 % g..from.get())
        .step_by(g as usize)
        .map(Bucket)
        .collect()
}

/// The new buckets (of `to`) that old bucket `old` (of `from`) shares keys with, in order.
pub fn children(from: ShardCount, to: ShardCount, old: Bucket) -> Vec<Bucket> {
    parents(to, from, old)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn n(x: u32) -> ShardCount {
        ShardCount::new(x).expect("valid")
    }

    #[test]
    fn examples_of_the_design_note() {
        // Split: each new bucket has one parent.
        assert_eq!(parents(n(16), n(32), Bucket(0)), vec![Bucket(0)]);
        assert_eq!(parents(n(16), n(32), Bucket(16)), vec![Bucket(0)]);
        // Merge: two parents.
        assert_eq!(
            parents(n(32), n(16), Bucket(5)),
            vec![Bucket(5), Bucket(21)]
        );
        // A coprime change is a global barrier.
        assert_eq!(parents(n(16), n(17), Bucket(3)).len(), 16);
        assert_eq!(gcd(n(16), n(24)), 8);
    }

    proptest! {
        /// Parents are exactly the old buckets some key shares with the new bucket.
        #[test]
        fn parents_are_the_key_overlap(from in 1u32..40, to in 1u32..40) {
            let (f, t) = (n(from), n(to));
            let lcm = from / gcd(f, t) * to;
            for new in t.buckets() {
                let by_keys: Vec<Bucket> = f
                    .buckets()
                    .filter(|&old| (0..u64::from(lcm)).any(|k| f.bucket_of(k) == old && t.bucket_of(k) == new))
                    .collect();
                prop_assert_eq!(parents(f, t, new), by_keys);
            }
        }
    }
}
