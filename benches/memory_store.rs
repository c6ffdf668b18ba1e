//! The in-memory backend's operations: a steady heartbeat, a claim and a release (as one
//! claim-then-release cycle, so the state stays the same from one iteration to the next).
//! Throughput is reported in operations per second.
//!
//! Run: `cargo bench --bench memory_store`.

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lease::memory::MemoryLeaseStore;
use lease::store::{Incarnation, SessionId, Takeover, WorkerStore};
use lease::{GroupName, MemberMetadata, NodeId, ShardCount, Ttl};

/// `(N, W)`: a small group and a large one.
const SIZES: [(u32, u32); 3] = [(64, 8), (1_024, 8), (10_000, 500)];

/// A store with one group of `n` buckets split evenly by `w` live members (all but the last,
/// which stays one bucket short, so it has something to claim); returns that last member.
async fn settled(n: u32, w: u32) -> (MemoryLeaseStore, GroupName, NodeId, SessionId) {
    let store = MemoryLeaseStore::new();
    let group = GroupName::new("bench").expect("group name");
    store
        .ensure_group(&group, ShardCount::new(n).expect("shard count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(3_600).expect("ttl");
    let mut last = NodeId::new();
    let mut session = SessionId::new();
    for i in 0..w {
        last = NodeId::new();
        let beat = store
            .heartbeat(
                last,
                Incarnation::from_uuid(last.as_uuid()),
                ttl,
                &MemberMetadata::empty(),
                &[],
            )
            .await
            .expect("heartbeat");
        session = beat.session;
        store.join(&group, last, session).await.expect("join");
        let share = n / w - u32::from(i == w - 1);
        store
            .claim(&group, last, session, share, Takeover::Allowed)
            .await
            .expect("claim");
    }
    (store, group, last, session)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let ttl = Ttl::from_secs(3_600).expect("ttl");
    let meta = MemberMetadata::empty();

    let mut group = c.benchmark_group("memory");
    group.throughput(Throughput::Elements(1));
    for (n, w) in SIZES {
        let (store, name, me, session) = rt.block_on(settled(n, w));
        group.bench_function(BenchmarkId::new("heartbeat", format!("N={n},W={w}")), |b| {
            b.to_async(&rt).iter(|| async {
                // The full view every time (no stamp handed in): the worst steady tick.
                store
                    .heartbeat(me, Incarnation::from_uuid(me.as_uuid()), ttl, &meta, &[])
                    .await
                    .expect("heartbeat")
            });
        });
        // One claim (of the one claimable bucket) and its release: two operations.
        group.throughput(Throughput::Elements(2));
        group.bench_function(
            BenchmarkId::new("claim+release", format!("N={n},W={w}")),
            |b| {
                b.to_async(&rt).iter(|| async {
                    let won = store
                        .claim(&name, me, session, 1, Takeover::Allowed)
                        .await
                        .expect("claim");
                    assert_eq!(won.len(), 1, "one bucket was claimable");
                    store
                        .release(&name, me, session, &[won[0].bucket])
                        .await
                        .expect("release")
                });
            },
        );
        group.throughput(Throughput::Elements(1));
    }
    group.finish();
}

criterion_group! {
    name = benches;
    // Short by default: microsecond-scale operations on a shared machine.
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20);
    targets = bench
}
criterion_main!(benches);
