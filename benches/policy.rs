//! The pure policy's cost: `plan` (what one worker runs every tick) and `targets` (every
//! member's share), at pool sizes from a small group up to the limits (N = 65,536, W = 1,000).
//!
//! Run: `cargo bench --bench policy`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use lease::policy;
use lease::store::{GroupView, MemberLoad};
use lease::{Bucket, NodeId, ShardCount};
use uuid::Uuid;

/// `(N, W)` pairs: a small group, the Postgres bench's two shapes, a wide pool, the limits.
const SIZES: [(u32, u32); 5] = [
    (64, 8),
    (1_024, 8),
    (10_000, 500),
    (65_536, 100),
    (65_536, 1_000),
];

/// A settled group of `w` members splitting `n` buckets (as the policy leaves it), and the
/// middle member's id and buckets: the steady-state input of `plan`.
fn settled(n: u32, w: u32) -> (GroupView, NodeId, Vec<Bucket>) {
    let members: Vec<MemberLoad> = (0..w)
        .map(|i| {
            MemberLoad::new(
                NodeId::from_uuid(Uuid::from_u128(u128::from(i) + 1)),
                n / w + u32::from(i < n % w),
            )
        })
        .collect();
    let me = w / 2;
    let first: u32 = members[..me as usize].iter().map(|m| m.owned).sum();
    let mine = (first..first + members[me as usize].owned)
        .map(Bucket)
        .collect();
    let view = GroupView {
        shard_count: ShardCount::new(n).expect("shard count"),
        members: members.clone(),
        claimable: 0,
        generation: Default::default(),
        previous: None,
        draining: 0,
        quarantined: 0,
        loaded: Vec::new(),
    };
    (view, members[me as usize].worker, mine)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan");
    for (n, w) in SIZES {
        let (view, me, mine) = settled(n, w);
        assert_eq!(policy::plan(&view, me, &mine).claim, 0, "a settled view");
        group.bench_with_input(
            BenchmarkId::new("steady", format!("N={n},W={w}")),
            &(view, me, mine),
            |b, (view, me, mine)| b.iter(|| policy::plan(black_box(view), *me, black_box(mine))),
        );
    }
    // A joiner's first plan: the view lists every member but it owns nothing yet.
    for (n, w) in SIZES {
        let (mut view, _, _) = settled(n, w);
        let me = NodeId::from_uuid(Uuid::from_u128(u128::MAX));
        view.members.push(MemberLoad::new(me, 0));
        group.bench_with_input(
            BenchmarkId::new("joiner", format!("N={n},W={}", w + 1)),
            &(view, me),
            |b, (view, me)| b.iter(|| policy::plan(black_box(view), *me, &[])),
        );
    }
    group.finish();

    let mut group = c.benchmark_group("targets");
    for (n, w) in SIZES {
        let (view, _, _) = settled(n, w);
        group.bench_with_input(
            BenchmarkId::from_parameter(format!("N={n},W={w}")),
            &view.members,
            |b, members| b.iter(|| policy::targets(n, black_box(members))),
        );
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short by default: these are microsecond-scale functions, and the machine is shared.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
