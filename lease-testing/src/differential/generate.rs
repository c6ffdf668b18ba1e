//! The operation generator: which operations a sequence is drawn from, weighted towards the
//! states where stores go wrong.

use std::time::Duration;

use proptest::prelude::*;

use lease_core::{MemberMode, Takeover};

use super::{GROUPS, Op, RESIZE_COUNTS, Reference, SHARD_COUNTS, WORKERS};

/// A process to act: process 0 four times in five, so most sequences are about sessions that
/// live and die, and a second process of one node id shows up in many of them.
fn process() -> impl Strategy<Value = usize> {
    prop_oneof![4 => Just(0usize), 1 => Just(1usize)]
}

/// Claim scopes: mostly allowed, some deferred, some bounded by how far the store's clock
/// moved since the claimer's renewal (the generated clock moves make both outcomes happen).
fn takeovers() -> impl Strategy<Value = Takeover> {
    prop_oneof![
        5 => Just(Takeover::Allowed),
        2 => Just(Takeover::Deferred),
        2 => (0u64..4_000).prop_map(|ms| Takeover::AllowedWithin(Duration::from_millis(ms))),
    ]
}

/// A strategy for one operation in `state`: buckets below the shard count of the group they
/// name (now and then one past it), tokens among those issued.
pub fn op_strategy(state: &Reference) -> BoxedStrategy<Op> {
    let g = 0..GROUPS.len();
    let w = 0..WORKERS;
    let counts = state.shard_counts;
    let issued: Vec<(usize, u32, i64, usize)> = state.issued.clone();
    // Controls half the time name a worker that was issued a lease in the group, so that a
    // drained worker's releases (T2: `drained`) happen.
    let controlled = if issued.is_empty() {
        (g.clone(), w.clone()).boxed()
    } else {
        prop_oneof![
            1 => (g.clone(), w.clone()),
            1 => prop::sample::select(issued.clone()).prop_map(|(group, _, _, owner)| (group, owner)),
        ]
        .boxed()
    };
    let ttls = prop::sample::select(vec![1_000u64, 3_000]);
    let bucket_in = move |group: usize| {
        let n = counts[group];
        prop_oneof![9 => 0..n, 1 => Just(n)]
    };
    let buckets = (g.clone())
        .prop_flat_map(move |group| (Just(group), prop::collection::vec(bucket_in(group), 0..4)));
    // Fencing checks and releases mostly name a lease some claim issued (to the worker it was
    // issued to, with its token, or one below), so that they can succeed.
    let (is_current, owned_release) = if issued.is_empty() {
        let check = (g.clone(), 0u32..9, w.clone(), 0i64..3)
            .prop_map(|(group, bucket, worker, token)| Op::IsCurrent {
                group,
                bucket,
                worker,
                token,
            })
            .boxed();
        (check.clone(), check)
    } else {
        let check = (
            prop::sample::select(issued.clone()),
            prop_oneof![3 => Just(None), 1 => w.clone().prop_map(Some)],
            prop_oneof![3 => Just(0i64), 1 => Just(-1i64)],
        )
            .prop_map(
                |((group, bucket, token, owner), other, delta)| Op::IsCurrent {
                    group,
                    bucket,
                    worker: other.unwrap_or(owner),
                    token: token + delta,
                },
            )
            .boxed();
        let release = (prop::sample::select(issued), process(), 0u32..3)
            .prop_map(|((group, bucket, _, worker), process, extra)| Op::Release {
                group,
                worker,
                process,
                buckets: (0..=extra).map(|k| bucket + k).collect(),
            })
            .boxed();
        (check, release)
    };
    prop_oneof![
        1 => (g.clone(), prop::sample::select(SHARD_COUNTS.to_vec()))
            .prop_map(|(group, shards)| Op::Ensure { group, shards }),
        3 => (w.clone(), process(), ttls.clone())
            .prop_map(|(worker, process, ttl_ms)| Op::Heartbeat { worker, process, ttl_ms }),
        2 => (g.clone(), w.clone(), process())
            .prop_map(|(group, worker, process)| Op::Join { group, worker, process }),
        1 => Just(Op::Nodes),
        8 => (prop_oneof![3 => Just(0usize), 1 => Just(1usize)], w.clone(), process(), ttls, 1u32..6)
            .prop_map(|(group, worker, process, ttl_ms, want)| Op::Tick { group, worker, process, ttl_ms, want }),
        2 => (g.clone(), w.clone(), process(), 0u32..6, takeovers())
            .prop_map(|(group, worker, process, want, takeover)| Op::Claim { group, worker, process, want, takeover }),
        1 => (buckets.clone(), w.clone(), process())
            .prop_map(|((group, buckets), worker, process)| Op::Release { group, worker, process, buckets }),
        1 => (buckets.clone(), w.clone(), process(), takeovers())
            .prop_map(|((group, buckets), worker, process, takeover)| Op::ClaimBuckets { group, worker, process, buckets, takeover }),
        1 => (buckets, w.clone(), process(), prop::collection::vec(0u64..4, 4))
            .prop_map(|((group, buckets), worker, process, units)| Op::PublishLoads {
                group,
                worker,
                process,
                loads: buckets.into_iter().zip(units).collect(),
            }),
        3 => owned_release,
        2 => (g.clone(), w.clone(), prop_oneof![3 => process().prop_map(Some), 1 => Just(None)])
            .prop_map(|(group, worker, process)| Op::Leave { group, worker, process }),
        1 => g.clone().prop_map(|group| Op::Snapshot { group }),
        3 => is_current,
        3 => prop::sample::select(vec![1u64, 500, 1_000, 2_999, 3_000, 7_000])
            .prop_map(|ms| Op::Advance { ms }),
        2 => (controlled, prop_oneof![2 => (0u32..4).prop_map(Some), 3 => Just(None)],
              prop::sample::select(vec![MemberMode::Active, MemberMode::Cordoned, MemberMode::Draining]))
            .prop_map(|((group, worker), weight, mode)| Op::Control { group, worker, weight, mode }),
        2 => (g.clone().prop_flat_map(move |group| (Just(group), bucket_in(group))),
              prop_oneof![3 => prop::sample::select(vec![500u64, 3_000]).prop_map(Some), 1 => Just(None)],
              any::<bool>())
            .prop_map(|((group, bucket), ms, reason)| Op::Quarantine { group, bucket, ms, reason }),
        2 => g.clone().prop_flat_map(move |group| (Just(group), bucket_in(group)))
            .prop_map(|(group, bucket)| Op::History { group, bucket }),
        1 => (w.clone(), process(), prop::sample::select(vec![1_000u64, 3_000]))
            .prop_map(|(worker, process, keep_ms)| Op::HandOver { worker, process, keep_ms }),
        // Mostly from the group's count (a resize that can start), now and then from another.
        3 => (g.clone(), prop::bool::weighted(0.85), prop::sample::select(RESIZE_COUNTS.to_vec()), prop::sample::select(RESIZE_COUNTS.to_vec()))
            .prop_map(move |(group, current, other, to)| Op::Resize {
                group,
                from: if current { counts[group] } else { other },
                to,
            }),
    ]
    .boxed()
}
