//! The demo's verdict: the time to balance after each phase, the handoffs, and what the
//! ownership log found. An overlap, or a crashed worker's bucket taken before its lease
//! expired, fails the command.

use std::time::Duration;

use lease::Bucket;
use lease::audit::OwnershipLog;
use lease::store::Timestamp;

use super::TTL;
use super::phases::{Crash, Took};
use super::story::{Story, lock};
use crate::output;
use crate::output::Failure;

/// What the phases measured.
pub struct Outcome {
    /// How many workers the cold start began with.
    pub workers: u32,
    /// Cold start: time to balance.
    pub cold: Took,
    /// The joiner and the time to balance.
    pub join: (char, Took),
    /// The crash.
    pub crash: Crash,
    /// The graceful stop: who, and the time to balance.
    pub stop: (char, Took),
    /// The hot bucket: the time until it was alone on its worker.
    pub hot: Took,
}

/// How many holdings of the crashed worker's `buckets` began after the crash but before its
/// lease expired.
fn taken_before_expiry(
    log: &OwnershipLog<Timestamp>,
    buckets: &[Bucket],
    crashed_at: Timestamp,
    expiry: Timestamp,
) -> Result<usize, Failure> {
    let holdings = log
        .holdings()
        .map_err(|e| Failure::Runtime(format!("the ownership log is inconsistent: {e}")))?;
    Ok(buckets
        .iter()
        .filter_map(|b| holdings.get(b))
        .flat_map(|hs| {
            hs.iter()
                .filter(|h| h.from >= crashed_at && h.from < expiry)
        })
        .count())
}

fn fmt_took(took: Took) -> String {
    took.map_or_else(
        || "not within this phase".to_owned(),
        |d: Duration| format!("{} ms", d.as_millis()),
    )
}

/// Print the summary and judge the run.
pub fn print(story: &Story, outcome: &Outcome) -> Result<(), Failure> {
    let log = lock(&story.log).clone();
    let crash = &outcome.crash;
    // The crashed worker's buckets: every holding that began after the crash must begin
    // after its lease expired.
    let early = taken_before_expiry(&log, &crash.buckets, crash.at, crash.expiry)?;
    let mut summary = vec![
        String::new(),
        "summary".to_owned(),
        format!(
            "  cold start ({} workers, {} buckets): balanced after {}",
            outcome.workers,
            story.shards,
            fmt_took(outcome.cold)
        ),
        format!(
            "  {} joined: balanced after {}",
            outcome.join.0,
            fmt_took(outcome.join.1)
        ),
        format!(
            "  {} crashed holding {} buckets: re-owned and balanced after {} (they wait for \
             its lease, ttl {}s, to expire); taken before expiry: {early}",
            crash.letter,
            crash.buckets.len(),
            fmt_took(crash.took),
            TTL.as_secs()
        ),
        format!(
            "  {} stopped gracefully: its buckets re-owned and balanced after {}",
            outcome.stop.0,
            fmt_took(outcome.stop.1)
        ),
        format!(
            "  bucket 0 ran hot (10x each other bucket): the others share the rest, and its \
             worker is down to it (and at most one cold bucket, within the 10 % band) after {}",
            fmt_took(outcome.hot)
        ),
    ];
    let verdict = match log.check() {
        Ok(checked) => {
            let reasons: Vec<String> = checked
                .revocations
                .iter()
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            summary.push(format!(
                "  {} assignments, {} handoffs, revocations: {}",
                checked.assignments,
                checked.handoffs,
                reasons.join(", ")
            ));
            summary.push(format!(
                "  overlaps found: 0 (no bucket held by two workers at once, over {} events)",
                log.entries().len()
            ));
            if early > 0 {
                Err(Failure::Runtime(format!(
                    "{early} of the crashed worker's buckets moved before its lease expired"
                )))
            } else {
                Ok(())
            }
        }
        Err(overlap) => {
            summary.push(format!("  overlaps found: 1 or more: {overlap}"));
            Err(Failure::Runtime(
                "the ownership log found an overlap".into(),
            ))
        }
    };
    for line in summary {
        if let Err(lost) = output::line(line) {
            // A defect found outranks a reader that went away.
            return verdict.and(Err(lost.failure()));
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use lease::store::{Clock, MemberInfo, SessionId, SystemClock};
    use lease::{GroupName, MemberMetadata, ShardCount};

    use super::*;
    use crate::demo::phases::session_expiry;
    use lease::NodeId;
    use lease::store::GroupSnapshot;

    fn snapshot_with(members: &[NodeId]) -> GroupSnapshot {
        let now = SystemClock.now();
        GroupSnapshot {
            group: GroupName::new("demo").expect("name"),
            shard_count: ShardCount::new(4).expect("n"),
            observed_at: now,
            members: members
                .iter()
                .map(|&worker| MemberInfo {
                    worker,
                    session: SessionId::new(),
                    joined_at: now,
                    heartbeat_at: now,
                    expires_at: now + TTL,
                    live: true,
                    owned: 0,
                    metadata: MemberMetadata::empty(),
                    weight: 1,
                    mode: Default::default(),
                    load: 0,
                    hottest: Default::default(),
                })
                .collect(),
            buckets: Vec::new(),
            generation: Default::default(),
            previous: None,
            draining: Vec::new(),
        }
    }

    #[test]
    fn a_crashed_worker_without_an_expiry_is_an_error_not_zero_early() {
        let victim = NodeId::new();
        let snap = snapshot_with(&[NodeId::new()]);
        assert!(matches!(
            session_expiry(&snap, victim),
            Err(Failure::Runtime(message)) if message.contains("no member row")
        ));
        let snap = snapshot_with(&[victim]);
        assert_eq!(
            session_expiry(&snap, victim).ok(),
            Some(snap.members[0].expires_at)
        );
    }
}
