//! Measures over an ownership log, for failover tests and benchmarks: every instant two
//! workers held one bucket (with how long), and how long each bucket had no holder within a
//! window. [`OwnershipLog::check`] stops at the first overlap; these report all of them.

use std::collections::BTreeMap;
use std::time::Duration;

use lease_core::ownership_log::{Holding, OwnershipLog};
use lease_core::{Bucket, ShardCount, Timestamp};

/// Two holdings of one bucket by different workers that overlap in time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overlap {
    /// The bucket.
    pub bucket: Bucket,
    /// The holding that began first.
    pub first: Holding<Timestamp>,
    /// The one that began while the first was still held.
    pub second: Holding<Timestamp>,
    /// How long both were held (to `end` for a holding still open).
    pub duration: Duration,
}

/// Every overlap in `log`, a holding still open counted as held until `end`.
///
/// # Errors
///
/// If the log's per-worker order is broken (see [`OwnershipLog::holdings`]).
pub fn overlaps(log: &OwnershipLog<Timestamp>, end: Timestamp) -> Result<Vec<Overlap>, String> {
    let mut found = Vec::new();
    for (bucket, holdings) in log.holdings()? {
        for (i, first) in holdings.iter().enumerate() {
            for second in &holdings[i + 1..] {
                if second.worker == first.worker {
                    continue;
                }
                let until = first.until.unwrap_or(end).min(second.until.unwrap_or(end));
                if second.from < until {
                    found.push(Overlap {
                        bucket,
                        first: first.clone(),
                        second: second.clone(),
                        duration: (until - second.from).to_std().unwrap_or_default(),
                    });
                }
            }
        }
    }
    Ok(found)
}

/// For each of the group's buckets, how long within `[from, until)` no worker held it, a
/// holding still open counted as held to the end.
///
/// # Errors
///
/// If the log's per-worker order is broken (see [`OwnershipLog::holdings`]).
pub fn unowned(
    log: &OwnershipLog<Timestamp>,
    shards: ShardCount,
    from: Timestamp,
    until: Timestamp,
) -> Result<BTreeMap<Bucket, Duration>, String> {
    let holdings = log.holdings()?;
    let mut gaps = BTreeMap::new();
    for b in 0..shards.get() {
        let bucket = Bucket(b);
        // The held spans clipped to the window, in order of their start.
        let mut spans: Vec<(Timestamp, Timestamp)> = holdings
            .get(&bucket)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|h| (h.from.max(from), h.until.unwrap_or(until).min(until)))
            .filter(|(start, end)| start < end)
            .collect();
        spans.sort();
        let mut covered_to = from;
        let mut gap = chrono::Duration::zero();
        for (start, end) in spans {
            if start > covered_to {
                gap += start - covered_to;
            }
            covered_to = covered_to.max(end);
        }
        if until > covered_to {
            gap += until - covered_to;
        }
        gaps.insert(bucket, gap.to_std().unwrap_or_default());
    }
    Ok(gaps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease_core::{FencingToken, NodeId, OwnershipEvent, RevokeReason};

    fn t(ms: i64) -> Timestamp {
        chrono::DateTime::UNIX_EPOCH + chrono::Duration::milliseconds(ms)
    }

    fn assigned(b: u32, token: i64) -> OwnershipEvent {
        OwnershipEvent::Assigned(lease_core::Assignment {
            bucket: Bucket(b),
            token: FencingToken(token),
            shards: ShardCount::new(8).expect("a valid count"),
            resized_from: None,
        })
    }

    fn revoked(b: u32, token: i64) -> OwnershipEvent {
        OwnershipEvent::Revoked {
            bucket: Bucket(b),
            token: FencingToken(token),
            reason: RevokeReason::Lost,
        }
    }

    #[test]
    fn overlaps_and_gaps_are_measured() {
        let (a, b) = (NodeId::new(), NodeId::new());
        let mut log = OwnershipLog::new();
        log.record(a, assigned(0, 1), t(0));
        log.record(b, assigned(0, 2), t(40));
        log.record(a, revoked(0, 1), t(50));
        log.record(a, assigned(1, 1), t(0));
        log.record(a, revoked(1, 1), t(20));
        log.record(b, assigned(1, 2), t(70));
        let found = overlaps(&log, t(100)).expect("a well-formed log");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].bucket, found[0].duration),
            (Bucket(0), Duration::from_millis(10))
        );
        let shards = ShardCount::new(3).expect("n");
        let gaps = unowned(&log, shards, t(10), t(100)).expect("a well-formed log");
        assert_eq!(gaps[&Bucket(0)], Duration::ZERO);
        assert_eq!(gaps[&Bucket(1)], Duration::from_millis(50));
        assert_eq!(gaps[&Bucket(2)], Duration::from_millis(90), "never held");
    }
}
