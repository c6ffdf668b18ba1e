//! What a sequence is made of: the operations the generator draws and every store runs.

use std::time::Duration;

use lease_core::{MemberControl, MemberMode, QuarantineFor, QuarantineReason, Takeover, Weight};

/// One operation of a sequence. `process` picks which process of the node id acts; joins,
/// claims, releases and leaves name the session that process last got from a heartbeat (a
/// never-used id if it has none), as a real process would.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `ensure_group(group, shards)`: both groups exist already, so this checks E2 or E3.
    Ensure {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Shard count.
        shards: u32,
    },
    /// `heartbeat(worker, incarnation, ttl, seen)`, handing in the stamps of the views the
    /// process was last given.
    Heartbeat {
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Ttl in milliseconds.
        ttl_ms: u64,
    },
    /// `join(group, worker, session)`.
    Join {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
    },
    /// `nodes()`.
    Nodes,
    /// A node's tick in one group: a heartbeat, a join if the heartbeat does not list the
    /// group, then, if those succeeded, a claim of `want` under the session.
    Tick {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Ttl in milliseconds.
        ttl_ms: u64,
        /// How many to claim.
        want: u32,
    },
    /// `claim(group, worker, session, want, takeover)`.
    Claim {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// How many to claim.
        want: u32,
        /// Which claimable buckets it may take (C7).
        takeover: Takeover,
    },
    /// `claim_buckets(group, worker, session, buckets, takeover)`.
    ClaimBuckets {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Buckets named (some may be out of range).
        buckets: Vec<u32>,
        /// Which claimable buckets it may take (C7).
        takeover: Takeover,
    },
    /// `publish_loads(group, worker, session, loads)`: whole units, so that equal loads
    /// (and ties in views' lists) happen.
    PublishLoads {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// (bucket, load in units); buckets may be out of range.
        loads: Vec<(u32, u64)>,
    },
    /// `release(group, worker, session, buckets)`.
    Release {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// Buckets (some may be out of range).
        buckets: Vec<u32>,
    },
    /// `leave(group, worker, session)`: the session of `process`, or any session (an
    /// operator's eviction) when `None`.
    Leave {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// Process index, `None` for an eviction.
        process: Option<usize>,
    },
    /// `snapshot(group)`.
    Snapshot {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
    },
    /// `is_current(group, bucket, worker, token)`.
    IsCurrent {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Bucket.
        bucket: u32,
        /// Worker index.
        worker: usize,
        /// Token.
        token: i64,
    },
    /// `resize(group, from, to)`.
    Resize {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// The count the caller believes the group has.
        from: u32,
        /// The new count.
        to: u32,
    },
    /// Move the shared clock forward.
    Advance {
        /// Milliseconds.
        ms: u64,
    },
    /// `control(group, worker, control)`: a weight (`Some`) or a mode.
    Control {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Worker index.
        worker: usize,
        /// The weight to set, or `None` to set `mode`.
        weight: Option<u32>,
        /// The mode to set when `weight` is `None`.
        mode: MemberMode,
    },
    /// `hand_over(worker, incarnation, keep)`: the process stops, keeping its session for a
    /// successor for `keep_ms`.
    HandOver {
        /// Worker index.
        worker: usize,
        /// Process index.
        process: usize,
        /// How long the session is kept, in milliseconds.
        keep_ms: u64,
    },
    /// `quarantine_with_reason(group, bucket, duration, reason)`: for `ms` milliseconds, or
    /// lift (`None`), with a reason naming the bucket when `reason`.
    Quarantine {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Bucket (now and then one past the count).
        bucket: u32,
        /// Milliseconds, `None` to lift.
        ms: Option<u64>,
        /// Whether it is given a reason (Q5).
        reason: bool,
    },
    /// `history(group, bucket)`.
    History {
        /// Index into [`GROUPS`](super::GROUPS).
        group: usize,
        /// Bucket (now and then one past the count).
        bucket: u32,
    },
}

impl Op {
    /// The control a [`Op::Control`] sets.
    pub(super) fn member_control(weight: Option<u32>, mode: MemberMode) -> MemberControl {
        match weight.map(Weight::new) {
            Some(Ok(w)) => MemberControl::Weight(w),
            _ => MemberControl::Mode(mode),
        }
    }

    /// The duration a [`Op::Quarantine`] sets.
    pub(super) fn quarantine_for(ms: Option<u64>) -> Option<QuarantineFor> {
        ms.and_then(|ms| QuarantineFor::new(Duration::from_millis(ms)).ok())
    }

    /// The reason a [`Op::Quarantine`] sets: one per bucket and duration, so a replacement
    /// changes it.
    pub(super) fn quarantine_reason(
        bucket: u32,
        ms: Option<u64>,
        reason: bool,
    ) -> Option<QuarantineReason> {
        let ms = ms.filter(|_| reason)?;
        QuarantineReason::new(format!("bucket {bucket}, {ms} ms")).ok()
    }
}

pub(super) fn op_group(op: &Op) -> usize {
    match *op {
        Op::Ensure { group, .. }
        | Op::Join { group, .. }
        | Op::Tick { group, .. }
        | Op::Claim { group, .. }
        | Op::ClaimBuckets { group, .. }
        | Op::PublishLoads { group, .. }
        | Op::Release { group, .. }
        | Op::Leave { group, .. }
        | Op::Snapshot { group }
        | Op::IsCurrent { group, .. }
        | Op::Resize { group, .. }
        | Op::Control { group, .. }
        | Op::Quarantine { group, .. }
        | Op::History { group, .. } => group,
        Op::Advance { .. } | Op::Heartbeat { .. } | Op::Nodes | Op::HandOver { .. } => 0,
    }
}

pub(super) fn op_worker(op: &Op) -> usize {
    match *op {
        Op::Heartbeat { worker, .. }
        | Op::Join { worker, .. }
        | Op::Tick { worker, .. }
        | Op::Claim { worker, .. }
        | Op::ClaimBuckets { worker, .. }
        | Op::PublishLoads { worker, .. }
        | Op::Release { worker, .. }
        | Op::Leave { worker, .. }
        | Op::IsCurrent { worker, .. } => worker,
        _ => 0,
    }
}
