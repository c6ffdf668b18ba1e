//! Differential property testing: the same random operation sequence runs on the reference
//! [`Model`](crate::Model) and on every store under test, in lockstep, comparing every result
//! and checking the invariants after every step.
//!
//! A backend plugs in with a [`StoreFactory`] and proptest-state-machine's macro:
//!
//! ```ignore
//! struct Memory;
//! impl StoreFactory for Memory {
//!     fn stores(_rt: &Runtime, clock: &ManualClock) -> Vec<(String, Box<dyn LeaseStore>)> {
//!         vec![("memory".into(), Box::new(MemoryLeaseStore::with_clock(clock.clone())))]
//!     }
//! }
//! proptest_state_machine::prop_state_machine! {
//!     #![proptest_config(lease_testing::differential::config(64))]
//!     #[test]
//!     fn memory_matches_the_model(sequential 1..40 => Differential<Memory>);
//! }
//! ```
//!
//! The generator aims at the states where stores go wrong: both groups exist from the start
//! (with a generated shard count each), buckets are drawn below the shard count (now and then
//! one past it), tokens among those already issued, and a [`Op::Tick`] (a heartbeat, then a
//! claim under the session it returned, as the worker runtime does) is the most frequent
//! operation. Each node id is run by up to [`PROCESSES`] processes ([`Incarnation`]s), so a
//! second process with the same node id is exercised too. [`Reach`] counts how often a
//! sequence gets to each risky state; `the_generator_reaches_the_risky_states` in
//! `lease-memory` holds it to a floor.
//!
//! Checked after every step, on every store:
//! - every result equals the model's, errors included with all their fields (session ids
//!   compared by order of appearance);
//! - no bucket is believed held by two processes at once: each process's leases, as the
//!   results of its own calls told it, are disjoint from every other process's until they
//!   expire;
//! - fencing tokens never decrease, and each claim returns a token above every one seen;
//! - across resizes ([`Op::Resize`]), per key (hashes `0..KEYS`, routed by
//!   [`ShardCount::bucket_of`]): no key lies in buckets of either generation held by two live
//!   processes (as they believe) or two live sessions (as the store's snapshot says), and
//!   every claim of a bucket returns a token above every token seen for each of its keys;
//! - every recorded owner is one of the workers of the test, and every live lease is known to
//!   exactly the process that holds it, with its token.
//! - after an operation that can begin or end a tenure, every bucket's history in its group
//!   equals the model's (T1-T4).
//!
//! The harness lives in one file per concern: `ops` (what a sequence is made of, [`Op`]),
//! `generate` (the operation generator, [`op_strategy`]), `apply` (running an operation on a
//! store as a process would, [`apply_to_store`]), `outcomes` (answers in a form two stores are
//! compared by, [`Outcome`] and [`SessionNames`]), `reference` (the model's side, the state
//! machine [`ReferenceModel`]), `subjects` (the stores under test, the invariants checked on
//! them and [`Differential`]) and `reach` (the risky states a sequence reached, [`Reach`], and
//! the runs checked to reach them all, [`run`]). This file holds the test's fixed cast: its
//! groups, workers, processes, shard counts and keys.

use lease_core::{GroupName, Incarnation, NodeId, ShardCount};
use uuid::Uuid;

mod apply;
mod generate;
mod ops;
mod outcomes;
mod reach;
mod reference;
mod subjects;
pub use apply::*;
pub use generate::*;
pub use ops::*;
pub use outcomes::*;
pub use reach::*;
pub use reference::*;
pub use subjects::*;

/// The groups operations pick from: a plain name and one full of quotes and SQL.
pub const GROUPS: [&str; 2] = ["orders", "it's \"odd\"; DROP TABLE lease.shards; --"];

/// How many workers operations pick from.
pub const WORKERS: usize = 3;

/// How many processes may run each node id (process 0 is the usual one; process 1 is a
/// second process started with the same id).
pub const PROCESSES: usize = 2;

/// The shard counts groups are created with.
const SHARD_COUNTS: [u32; 5] = [1, 2, 3, 5, 8];

/// The shard counts resizes go to: splits, merges, and counts sharing no factor.
const RESIZE_COUNTS: [u32; 7] = [1, 2, 3, 4, 5, 6, 8];

/// The key hashes the per-key checks look at: `0..KEYS` covers every pair of buckets of any
/// two of the shard counts groups are created and resized with (a multiple of their lcm, 120).
pub const KEYS: u64 = 120;

/// The group named by index `i` of [`GROUPS`].
pub fn group(i: usize) -> GroupName {
    GroupName::new(GROUPS[i % GROUPS.len()]).expect("the test group names are valid")
}

/// The index in [`GROUPS`] of a group's name.
fn group_index(name: &GroupName) -> usize {
    GROUPS
        .iter()
        .position(|g| *g == name.as_str())
        .expect("only the test's groups exist")
}

/// Worker `i` of the test: fixed ids, so runs are repeatable.
pub fn worker(i: usize) -> NodeId {
    NodeId::from_uuid(Uuid::from_u128(0xA000 + i as u128))
}

/// Process `p` of worker `w`: fixed ids, so runs are repeatable.
pub fn incarnation(w: usize, p: usize) -> Incarnation {
    Incarnation::from_uuid(Uuid::from_u128(0xB000 + (w * PROCESSES + p) as u128))
}

/// A generated shard count (every one the generator draws is valid).
fn shards(n: u32) -> ShardCount {
    ShardCount::new(n).expect("generated shard counts are valid")
}
