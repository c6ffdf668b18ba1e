//! The fair-share policy: pure, no I/O, no clock. Every worker computes the same targets from
//! the same view, so the pool agrees on the split without talking.
//!
//! With `N` buckets and `W` live members (idle members count), each member's target is
//! `base = N / W`, and `N % W` members get one more: first the members that own more than
//! `base` right now, then the others; within each class by worker id. Giving the extra slots
//! to members already above `base` keeps the number of moves minimal (a bucket only moves from
//! a member above its target to one below, and no member above `base` is cut below `base + 1`
//! while a slot is left). Ranking by class and id, not by exact load, keeps targets stable
//! while the pool converges: a member climbing from `base - 1` to `base` by claiming does not
//! take an extra slot from the member that was about to claim it, so every claimable bucket is
//! claimed in the same round of ticks instead of waiting a renew interval.
//!
//! ```
//! use lease_core::{policy, Bucket, GroupView, MemberLoad, ShardCount, WorkerId};
//! let (a, b) = (WorkerId::new(), WorkerId::new());
//! let view = GroupView::new(
//!     ShardCount::new(12)?,
//!     vec![MemberLoad::new(a, 12), MemberLoad::new(b, 0)],
//!     0,
//! );
//! let mine: Vec<Bucket> = (0..12).map(Bucket).collect();
//! let plan = policy::plan(&view, a, &mine);
//! assert_eq!(plan.target, 6);
//! assert_eq!(plan.shed.len(), 6); // a gives up six buckets...
//! let plan = policy::plan(&view, b, &[]);
//! assert_eq!(plan.claim, 0); // ...which b claims once they are released
//! # Ok::<(), lease_core::InvalidInput>(())
//! ```

use crate::ids::{Bucket, WorkerId};
use crate::view::{GroupView, MemberLoad};

/// What one worker should do this tick.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Plan {
    /// The worker's fair share.
    pub target: u32,
    /// How many buckets to claim now (never more than are claimable, nor past `target`).
    pub claim: u32,
    /// Buckets to give up now: the excess over `target`, highest numbers first.
    pub shed: Vec<Bucket>,
}

/// One member's share.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Target {
    /// The member.
    pub worker: WorkerId,
    /// What it owns now.
    pub owned: u32,
    /// What it should own.
    pub target: u32,
}

/// Every live member's target, in the order of `members` (sorted by worker id in a
/// [`GroupView`]). Targets sum to the shard count, and differ by at most one.
pub fn targets(shard_count: u32, members: &[MemberLoad]) -> Vec<Target> {
    let w = u32::try_from(members.len()).unwrap_or(u32::MAX);
    if w == 0 {
        return Vec::new();
    }
    let base = shard_count / w;
    let extra = (shard_count % w) as usize;
    // Members above base first, then the rest; by id within each. The first `extra` get one
    // more.
    let mut ranked: Vec<usize> = (0..members.len()).collect();
    ranked.sort_by(|&i, &j| {
        let above = |k: usize| members[k].owned > base;
        above(j)
            .cmp(&above(i))
            .then(members[i].worker.cmp(&members[j].worker))
    });
    let mut out: Vec<Target> = members
        .iter()
        .map(|m| Target {
            worker: m.worker,
            owned: m.owned,
            target: base,
        })
        .collect();
    for &i in ranked.iter().take(extra) {
        out[i].target += 1;
    }
    out
}

/// What `me` should do, given the group's view and the buckets it owns now (`mine`, as the
/// heartbeat returned them). `me` counts as a member even if the view missed it.
pub fn plan(view: &GroupView, me: WorkerId, mine: &[Bucket]) -> Plan {
    let owned = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let mut members: Vec<MemberLoad> = view
        .members
        .iter()
        .filter(|m| m.worker != me)
        .copied()
        .collect();
    members.push(MemberLoad::new(me, owned));
    let target = targets(view.shard_count.get(), &members)
        .into_iter()
        .find(|t| t.worker == me)
        .map_or(0, |t| t.target);

    if owned > target {
        let mut sorted = mine.to_vec();
        sorted.sort_unstable();
        let excess = (owned - target) as usize;
        let shed = sorted.split_off(sorted.len() - excess);
        Plan {
            target,
            claim: 0,
            shed: shed.into_iter().rev().collect(),
        }
    } else {
        Plan {
            target,
            claim: (target - owned).min(view.claimable),
            shed: Vec::new(),
        }
    }
}

/// The fewest bucket moves that reach balance from `loads` (the sum of every member's excess
/// over its target). Every worker following [`plan`] moves exactly this many in total.
pub fn minimum_moves(shard_count: u32, members: &[MemberLoad]) -> u32 {
    targets(shard_count, members)
        .iter()
        .map(|t| t.owned.saturating_sub(t.target))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ShardCount;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn worker(i: u32) -> WorkerId {
        WorkerId::from_uuid(Uuid::from_u128(u128::from(i) + 1))
    }

    fn loads(owned: &[u32]) -> Vec<MemberLoad> {
        owned
            .iter()
            .enumerate()
            .map(|(i, &o)| MemberLoad::new(worker(i as u32), o))
            .collect()
    }

    fn view(n: u32, owned: &[u32]) -> GroupView {
        let sum: u32 = owned.iter().sum();
        GroupView {
            shard_count: ShardCount::new(n).unwrap(),
            members: loads(owned),
            claimable: n - sum,
            generation: Default::default(),
            previous: None,
            draining: 0,
            quarantined: 0,
        }
    }

    fn target_list(n: u32, owned: &[u32]) -> Vec<u32> {
        targets(n, &loads(owned)).iter().map(|t| t.target).collect()
    }

    fn mine(from: u32, count: u32) -> Vec<Bucket> {
        (from..from + count).map(Bucket).collect()
    }

    #[test]
    fn twelve_over_five_is_three_three_two_two_two() {
        let mut t = target_list(12, &[0, 0, 0, 0, 0]);
        t.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(t, vec![3, 3, 2, 2, 2]);
        // The seed's ceil(12 / 5) = 3 for everyone settles at 3/3/3/3/0; here the member that
        // owns nothing still gets its two.
        assert_eq!(target_list(12, &[3, 3, 3, 3, 0]), vec![3, 3, 2, 2, 2]);
        let v = view(12, &[3, 3, 3, 3, 0]);
        assert_eq!(plan(&v, worker(4), &[]).target, 2);
        assert_eq!(plan(&v, worker(2), &mine(6, 3)).shed, vec![Bucket(8)]);
        assert_eq!(plan(&v, worker(3), &mine(9, 3)).shed, vec![Bucket(11)]);
        assert!(plan(&v, worker(0), &mine(0, 3)).shed.is_empty());
    }

    #[test]
    fn seven_over_three_and_one_over_four() {
        assert_eq!(target_list(7, &[0, 0, 0]), vec![3, 2, 2]);
        // The extra slot follows the load, not the id.
        assert_eq!(target_list(7, &[2, 2, 3]), vec![2, 2, 3]);
        assert_eq!(target_list(1, &[0, 0, 0, 0]), vec![1, 0, 0, 0]);
        assert_eq!(target_list(1, &[0, 0, 1, 0]), vec![0, 0, 1, 0]);
    }

    #[test]
    fn ties_break_by_worker_id() {
        let members = vec![MemberLoad::new(worker(9), 2), MemberLoad::new(worker(3), 2)];
        let t = targets(3, &members);
        assert_eq!((t[0].target, t[1].target), (1, 2));
    }

    #[test]
    fn cold_start_claims_the_whole_share_at_once() {
        let v = view(64, &[0; 8]);
        let p = plan(&v, worker(5), &[]);
        assert_eq!((p.target, p.claim), (8, 8));
    }

    #[test]
    fn claims_no_more_than_is_claimable() {
        let mut v = view(12, &[12, 0]);
        assert_eq!(plan(&v, worker(1), &[]).claim, 0);
        v.claimable = 4;
        v.members[0].owned = 8;
        assert_eq!(plan(&v, worker(1), &[]).claim, 4);
    }

    #[test]
    fn a_worker_missing_from_the_view_counts_itself() {
        let v = view(10, &[10]);
        let p = plan(&v, worker(7), &[]);
        assert_eq!(p.target, 5);
    }

    #[test]
    fn sheds_the_highest_buckets_first() {
        let v = view(4, &[4, 0]);
        let p = plan(&v, worker(0), &[Bucket(3), Bucket(0), Bucket(2), Bucket(1)]);
        assert_eq!(p.shed, vec![Bucket(3), Bucket(2)]);
        assert_eq!(p.claim, 0);
    }

    /// The fewest moves from `owned` to any balanced split, by trying every choice of which
    /// members get the extra slots (independent of `targets`' ranking).
    fn brute_force_minimum(n: u32, owned: &[u32]) -> u32 {
        let w = owned.len() as u32;
        let (base, extra) = (n / w, n % w);
        (0u32..(1 << w))
            .filter(|mask| mask.count_ones() == extra)
            .map(|mask| {
                owned
                    .iter()
                    .enumerate()
                    .map(|(i, &o)| {
                        let t = base + (mask >> i & 1);
                        o.saturating_sub(t)
                    })
                    .sum::<u32>()
            })
            .min()
            .unwrap_or(0)
    }

    /// Loads of a random snapshot: `w` members owning at most `n` buckets in all.
    fn snapshot_strategy() -> impl Strategy<Value = (u32, Vec<u32>)> {
        (1u32..=200, 1usize..=12).prop_flat_map(|(n, w)| {
            (Just(n), proptest::collection::vec(0..=n, w)).prop_map(|(n, mut owned)| {
                // Scale down so the members own at most n in total.
                let mut left = n;
                for o in &mut owned {
                    *o = (*o).min(left);
                    left -= *o;
                }
                (n, owned)
            })
        })
    }

    proptest! {
        #[test]
        fn targets_sum_to_n_and_differ_by_at_most_one((n, owned) in snapshot_strategy()) {
            let t = target_list(n, &owned);
            prop_assert_eq!(t.iter().sum::<u32>(), n);
            let (min, max) = (t.iter().min().unwrap(), t.iter().max().unwrap());
            prop_assert!(max - min <= 1);
        }

        #[test]
        fn plans_stay_within_target((n, owned) in snapshot_strategy()) {
            let v = view(n, &owned);
            let mut next = 0;
            for (i, &o) in owned.iter().enumerate() {
                let p = plan(&v, worker(i as u32), &mine(next, o));
                next += o;
                let after = o + p.claim - p.shed.len() as u32;
                prop_assert!(p.claim == 0 || p.shed.is_empty());
                prop_assert!(p.claim <= v.claimable);
                if p.claim > 0 { prop_assert!(after <= p.target); }
                if !p.shed.is_empty() { prop_assert_eq!(after, p.target); }
                prop_assert!(o <= p.target || !p.shed.is_empty());
            }
        }

        #[test]
        fn every_member_agrees_on_every_target((n, owned) in snapshot_strategy()) {
            let v = view(n, &owned);
            let all = targets(n, &v.members);
            let mut next = 0;
            for (i, &o) in owned.iter().enumerate() {
                let p = plan(&v, worker(i as u32), &mine(next, o));
                next += o;
                prop_assert_eq!(p.target, all[i].target);
            }
        }

        #[test]
        fn moves_after_a_join_are_minimal(n in 1u32..=200, w in 1usize..=8) {
            // A balanced, fully owned pool (what the policy itself settles at)...
            let settled = target_list(n, &vec![0; w]);
            // ...that a new, idle member joins.
            let mut owned = settled.clone();
            owned.push(0);
            let v = view(n, &owned);
            let mut next = 0;
            let mut shed = 0;
            for (i, &o) in owned.iter().enumerate() {
                let p = plan(&v, worker(i as u32), &mine(next, o));
                next += o;
                shed += p.shed.len() as u32;
            }
            prop_assert_eq!(shed, brute_force_minimum(n, &owned));
            prop_assert_eq!(shed, minimum_moves(n, &loads(&owned)));
            // Every shed bucket lands on the newcomer, and it reaches its target.
            let newcomer = targets(n, &loads(&owned))[w].target;
            prop_assert_eq!(shed, newcomer);
        }

        /// From any split, with members ticking one after another in any order (each seeing
        /// the others' moves so far), two rounds of ticks reach an even split with every
        /// bucket owned: shedders may come after claimers in the first round, never in the
        /// second, and targets do not shift under the claimers.
        #[test]
        fn two_rounds_of_ticks_balance_any_split(
            (n, owned) in snapshot_strategy(),
            orders in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 12), 2),
        ) {
            let w = owned.len();
            // Each member's buckets as numbers; unowned buckets in a pool.
            let mut held: Vec<Vec<Bucket>> = Vec::new();
            let mut next = 0;
            for &o in &owned {
                held.push(mine(next, o));
                next += o;
            }
            let mut free: Vec<Bucket> = (next..n).map(Bucket).collect();
            for order in &orders {
                let mut turn: Vec<usize> = (0..w).collect();
                turn.sort_by_key(|&i| order[i]);
                for i in turn {
                    let v = GroupView {
                        shard_count: ShardCount::new(n).unwrap(),
                        members: held
                            .iter()
                            .enumerate()
                            .map(|(k, h)| MemberLoad::new(worker(k as u32), h.len() as u32))
                            .collect(),
                        claimable: free.len() as u32,
                        generation: Default::default(),
                        previous: None,
                        draining: 0,
                        quarantined: 0,
                    };
                    let p = plan(&v, worker(i as u32), &held[i]);
                    for b in &p.shed {
                        held[i].retain(|x| x != b);
                        free.push(*b);
                    }
                    for _ in 0..p.claim {
                        held[i].push(free.pop().expect("claim within claimable"));
                    }
                }
            }
            let loads: Vec<usize> = held.iter().map(Vec::len).collect();
            prop_assert!(free.is_empty(), "unowned after two rounds: {free:?}, loads {loads:?}");
            let (min, max) = (loads.iter().min().unwrap(), loads.iter().max().unwrap());
            prop_assert!(max - min <= 1, "unbalanced after two rounds: {loads:?}");
        }

        #[test]
        fn minimum_moves_matches_brute_force((n, owned) in snapshot_strategy()) {
            prop_assert_eq!(minimum_moves(n, &loads(&owned)), brute_force_minimum(n, &owned));
        }
    }
}
