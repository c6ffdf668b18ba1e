//! The fair-share policy: pure, no I/O, no clock. Every worker computes the same targets from
//! the same view, so the pool agrees on the split without talking.
//!
//! # What is shared
//!
//! Of a group's `N` buckets, the policy shares `N' = N - quarantined - (held by cordoned
//! members)` (never below 0). Quarantined buckets are nobody's to claim, so counting them would
//! set targets nobody can reach. What a cordoned member holds stays with it, so counting it in
//! the others' shares would have them wait for buckets that never come.
//!
//! # Weights: largest remainder
//!
//! The sharing members are the ones not cordoned. Each has an effective weight: its weight when
//! active (0 allowed: it asks for no bucket), 0 when draining. With `W` the sum of those, a
//! member of weight `w` is owed exactly `N' * w / W`. Its target is the floor of that, and the
//! `N'` less the floors left over go one each to the members with the largest fractional part
//! (largest-remainder apportionment). The fractional parts are compared as the integers
//! `N' * w mod W`, never as floats, so every worker ranks them the same. Every target is then
//! within one bucket of its exact share, and the targets sum to exactly `N'`. A member of
//! weight 0 has no fractional part and so never gets a slot.
//!
//! Between equal remainders the slots go first to the members that own more than their floor
//! right now, then to the others; within each class by node id. Giving them to members
//! already above their floor keeps the number of moves minimal (a bucket only moves from a
//! member above its target to one below, and no member above its floor is cut to its floor
//! while a slot it could take is left). Ranking by class and id, not by exact load, keeps
//! targets stable while the pool converges: a member climbing to its floor by claiming does
//! not take a slot from the member that was about to claim it, so every claimable bucket is
//! claimed in the same round of ticks instead of waiting a renew interval. With equal weights
//! every remainder is equal and this is the plain rule: `N' / W` each, and `N' % W` members
//! get one more.
//!
//! If `W` is 0 (every sharing member has weight 0 or drains), every sharing target is 0: the
//! shared buckets are left without an owner, which the unowned gauge shows. That is what an
//! operator who sets every weight to 0 asked for; the policy does not second-guess it.
//!
//! # Modes
//!
//! An active member claims up to its target and sheds its excess. A cordoned member's target
//! is what it owns: it claims nothing and sheds nothing. A draining member's target is 0: it
//! claims nothing and sheds everything, and its buckets go to the others' shares. Why a member
//! sheds (drained, weight 0, plain rebalancing) is for the runtime to say; the policy only
//! says how many and which.
//!
//! ```
//! use lease_core::{policy, Bucket, GroupView, MemberLoad, ShardCount, NodeId};
//! let (a, b) = (NodeId::new(), NodeId::new());
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
//!
//! // With b at weight 2, b is owed two thirds.
//! let mut view = view;
//! view.members.iter_mut().filter(|m| m.worker == b).for_each(|m| m.weight = 2);
//! assert_eq!(policy::plan(&view, a, &mine).target, 4);
//! # Ok::<(), lease_core::InvalidInput>(())
//! ```

use crate::ids::{Bucket, NodeId};
use crate::view::{GroupView, MemberLoad, MemberMode};

/// What one worker should do this tick.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Plan {
    /// The worker's share: its fair share when active, what it owns when cordoned, 0 when
    /// draining.
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
    pub worker: NodeId,
    /// What it owns now.
    pub owned: u32,
    /// What it should own.
    pub target: u32,
}

/// The buckets of `view` the policy hands to [`targets`]: its shard count less the quarantined
/// ones, which nobody may claim (what cordoned members hold, `targets` leaves out itself).
pub fn shareable(view: &GroupView) -> u32 {
    view.shard_count.get().saturating_sub(view.quarantined)
}

/// A member's weight in the split: cordoned and draining members claim nothing, so they weigh
/// nothing, whatever their configured weight.
fn effective_weight(m: &MemberLoad) -> u64 {
    match m.mode {
        MemberMode::Active => u64::from(m.weight),
        MemberMode::Cordoned | MemberMode::Draining => 0,
    }
}

/// Every live member's target, in the order of `members` (sorted by node id in a
/// [`GroupView`]), splitting `shareable` buckets: a view's shard count less its quarantined
/// buckets ([`shareable`]). A cordoned member's target is what it owns, and what cordoned
/// members own is taken out of `shareable` first; the rest is shared in proportion to the
/// effective weights by largest remainder (see the [module docs](self)). When some sharing
/// member weighs more than 0, the targets sum to `shareable` (or to what the cordoned members
/// own, if that is more); each sharing target is within one of its exact share. When none
/// does, every sharing target is 0.
pub fn targets(shareable: u32, members: &[MemberLoad]) -> Vec<Target> {
    let cordoned = members
        .iter()
        .filter(|m| m.mode == MemberMode::Cordoned)
        .fold(0u32, |sum, m| sum.saturating_add(m.owned));
    let n = u64::from(shareable.saturating_sub(cordoned));
    // Saturating only past 2^32 members, far beyond anything a view can hold.
    let total = members
        .iter()
        .map(effective_weight)
        .fold(0u64, u64::saturating_add);
    let mut out: Vec<Target> = members
        .iter()
        .map(|m| Target {
            worker: m.worker,
            owned: m.owned,
            target: if m.mode == MemberMode::Cordoned {
                m.owned
            } else {
                0
            },
        })
        .collect();
    if total == 0 {
        return out;
    }
    // (index, floor, remainder) of the members with a fractional part: only they can get a
    // slot, as the fractional parts sum to the slots left and each is below one.
    let mut fractional: Vec<(usize, u32, u64)> = Vec::new();
    let mut given = 0u64;
    for (i, m) in members.iter().enumerate() {
        let w = effective_weight(m);
        if w == 0 {
            continue;
        }
        // Both factors are below 2^32, so the product fits.
        let owed = n * w;
        let floor = owed / total;
        given += floor;
        // floor <= n, which came from a u32.
        let floor = u32::try_from(floor).unwrap_or(u32::MAX);
        out[i].target = floor;
        let remainder = owed % total;
        if remainder > 0 {
            fractional.push((i, floor, remainder));
        }
    }
    let left = usize::try_from(n.saturating_sub(given)).unwrap_or(usize::MAX);
    // Largest remainder first; between equals, members above their floor first, then by id.
    fractional.sort_by(|&(i, fi, ri), &(j, fj, rj)| {
        rj.cmp(&ri)
            .then((members[j].owned > fj).cmp(&(members[i].owned > fi)))
            .then(members[i].worker.cmp(&members[j].worker))
    });
    for &(i, _, _) in fractional.iter().take(left) {
        out[i].target = out[i].target.saturating_add(1);
    }
    out
}

/// What `me` should do, given the group's view and the buckets it owns now (`mine`, as the
/// heartbeat returned them). `me` counts as a member even if the view missed it (weight 1,
/// active, until a view lists it); its weight and mode come from its entry in the view, and
/// its load from `mine`, which is fresher.
///
/// An active `me` claims up to its target and sheds the highest-numbered excess; a cordoned
/// one does neither (its target is what it owns); a draining one sheds everything.
pub fn plan(view: &GroupView, me: NodeId, mine: &[Bucket]) -> Plan {
    let owned = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let mut myself = MemberLoad::new(me, owned);
    let mut members: Vec<MemberLoad> = Vec::with_capacity(view.members.len() + 1);
    for m in &view.members {
        if m.worker == me {
            myself.weight = m.weight;
            myself.mode = m.mode;
        } else {
            members.push(*m);
        }
    }
    members.push(myself);
    // Every mode goes through `targets`, so that `me` and the others agree on its target:
    // cordoned gives what it owns (no claim, no shed), draining gives 0 (shed everything).
    let target = targets(shareable(view), &members)
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

/// The fewest bucket moves that reach balance from `members`' loads (the sum of every member's
/// excess over its target), with `shareable` as for [`targets`]. Every worker following
/// [`plan`] moves exactly this many in total.
pub fn minimum_moves(shareable: u32, members: &[MemberLoad]) -> u32 {
    targets(shareable, members)
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

    fn worker(i: u32) -> NodeId {
        NodeId::from_uuid(Uuid::from_u128(u128::from(i) + 1))
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
            loaded: Vec::new(),
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
    fn ties_break_by_node_id() {
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

    fn member(i: u32, owned: u32, weight: u32, mode: MemberMode) -> MemberLoad {
        MemberLoad {
            worker: worker(i),
            owned,
            weight,
            mode,
            load: 0,
            hottest: Default::default(),
        }
    }

    fn targets_of(shareable: u32, members: &[MemberLoad]) -> Vec<u32> {
        targets(shareable, members)
            .iter()
            .map(|t| t.target)
            .collect()
    }

    /// A view of `n` buckets, `quarantined` of them, with these members; what they do not own
    /// and is not quarantined is claimable.
    fn weighted_view(n: u32, quarantined: u32, members: &[MemberLoad]) -> GroupView {
        let owned: u32 = members.iter().map(|m| m.owned).sum();
        GroupView {
            quarantined,
            claimable: n - quarantined - owned,
            ..GroupView::new(ShardCount::new(n).unwrap(), members.to_vec(), 0)
        }
    }

    use MemberMode::{Active, Cordoned, Draining};

    #[test]
    fn weights_two_one_one_over_twelve_are_six_three_three() {
        let m = [
            member(0, 0, 2, Active),
            member(1, 0, 1, Active),
            member(2, 0, 1, Active),
        ];
        assert_eq!(targets_of(12, &m), vec![6, 3, 3]);
        let v = weighted_view(12, 0, &m);
        assert_eq!(plan(&v, worker(0), &[]).claim, 6);
        assert_eq!(plan(&v, worker(1), &[]).claim, 3);
    }

    #[test]
    fn a_larger_remainder_beats_a_larger_load() {
        // 10 over 2:1 is 6.67 / 3.33: the weight-2 member's remainder is larger, so it gets the
        // slot even though the other owns everything.
        let m = [member(0, 0, 2, Active), member(1, 10, 1, Active)];
        assert_eq!(targets_of(10, &m), vec![7, 3]);
        assert_eq!(minimum_moves(10, &m), 7);
    }

    #[test]
    fn a_cordoned_members_holding_is_left_out_of_the_others_shares() {
        // 12 buckets, a cordoned member holds 5: the other two share 7.
        let m = [
            member(0, 5, 1, Cordoned),
            member(1, 0, 1, Active),
            member(2, 0, 1, Active),
        ];
        assert_eq!(targets_of(12, &m), vec![5, 4, 3]);
        // Between equal remainders, the member above its floor keeps the extra one.
        let m = [
            member(0, 5, 1, Cordoned),
            member(1, 3, 1, Active),
            member(2, 4, 1, Active),
        ];
        assert_eq!(targets_of(12, &m), vec![5, 3, 4]);
        assert_eq!(minimum_moves(12, &m), 0);
        // Its weight does not count while it is cordoned.
        let m = [
            member(0, 5, 9, Cordoned),
            member(1, 0, 1, Active),
            member(2, 0, 1, Active),
        ];
        assert_eq!(targets_of(12, &m), vec![5, 4, 3]);
    }

    #[test]
    fn a_cordoned_member_keeps_its_buckets_and_claims_nothing() {
        // Far above the even split, with buckets to claim: it still neither sheds nor claims.
        let m = [member(0, 9, 1, Cordoned), member(1, 0, 1, Active)];
        let v = weighted_view(12, 0, &m);
        let p = plan(&v, worker(0), &mine(0, 9));
        assert_eq!((p.target, p.claim, p.shed.len()), (9, 0, 0));
        assert_eq!(plan(&v, worker(1), &[]).target, 3);
        let m = [member(0, 0, 1, Cordoned), member(1, 0, 1, Active)];
        let v = weighted_view(12, 0, &m);
        assert_eq!(plan(&v, worker(0), &[]), Plan::default());
        assert_eq!(plan(&v, worker(1), &[]).claim, 12);
    }

    #[test]
    fn quarantined_buckets_are_nobodys_share() {
        let v = GroupView {
            quarantined: 2,
            ..view(12, &[0, 0])
        };
        assert_eq!(shareable(&v), 10);
        assert_eq!(plan(&v, worker(0), &[]).target, 5);
        assert_eq!(plan(&v, worker(1), &[]).target, 5);
        let m = [member(0, 0, 1, Active), member(1, 0, 1, Active)];
        assert_eq!(targets_of(shareable(&v), &m), vec![5, 5]);
    }

    #[test]
    fn cordoned_holdings_beyond_the_shareable_leave_the_others_nothing() {
        // 4 of 12 quarantined and a cordoned member holding 10: nothing is left to share.
        let m = [member(0, 10, 1, Cordoned), member(1, 0, 1, Active)];
        assert_eq!(targets_of(8, &m), vec![10, 0]);
    }

    #[test]
    fn a_draining_member_sheds_everything_to_the_others() {
        let m = [
            member(0, 4, 1, Draining),
            member(1, 4, 1, Active),
            member(2, 4, 1, Active),
        ];
        assert_eq!(targets_of(12, &m), vec![0, 6, 6]);
        assert_eq!(minimum_moves(12, &m), 4);
        let v = weighted_view(12, 0, &m);
        let p = plan(&v, worker(0), &[Bucket(7), Bucket(2), Bucket(9), Bucket(0)]);
        assert_eq!(p.shed, vec![Bucket(9), Bucket(7), Bucket(2), Bucket(0)]);
        assert_eq!((p.target, p.claim), (0, 0));
        // With nothing left it claims nothing, however much is claimable.
        let m = [member(0, 0, 1, Draining), member(1, 4, 1, Active)];
        assert_eq!(
            plan(&weighted_view(12, 0, &m), worker(0), &[]),
            Plan::default()
        );
    }

    #[test]
    fn weight_zero_asks_for_nothing() {
        let m = [member(0, 6, 0, Active), member(1, 6, 1, Active)];
        assert_eq!(targets_of(12, &m), vec![0, 12]);
        let p = plan(&weighted_view(12, 0, &m), worker(0), &mine(0, 6));
        assert_eq!((p.target, p.claim, p.shed.len()), (0, 0, 6));
    }

    #[test]
    fn no_weight_at_all_leaves_every_shared_bucket_unowned() {
        let m = [
            member(0, 3, 0, Active),
            member(1, 2, 1, Draining),
            member(2, 4, 1, Cordoned),
        ];
        assert_eq!(targets_of(12, &m), vec![0, 0, 4]);
        assert_eq!(minimum_moves(12, &m), 5);
        let v = weighted_view(12, 0, &m);
        let p = plan(&v, worker(0), &mine(0, 3));
        assert_eq!((p.target, p.claim, p.shed.len()), (0, 0, 3));
    }

    #[test]
    fn me_takes_its_weight_and_mode_from_the_view() {
        // The view lists me at weight 3: 3 of 4 parts of 12.
        let m = [member(0, 0, 3, Active), member(1, 0, 1, Active)];
        let v = weighted_view(12, 0, &m);
        assert_eq!(plan(&v, worker(0), &[]).target, 9);
        // A view that missed me: weight 1, active, so 12 over 3 + 1 + 1 parts.
        let p = plan(&v, worker(7), &[]);
        assert_eq!(p.target, 2);
        // Its load is what it owns, not the view's stale count.
        let m = [member(0, 12, 1, Cordoned), member(1, 0, 1, Active)];
        let v = GroupView {
            claimable: 5,
            ..weighted_view(12, 0, &m)
        };
        let p = plan(&v, worker(0), &mine(0, 7));
        assert_eq!((p.target, p.claim, p.shed.len()), (7, 0, 0));
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
                        loaded: Vec::new(),
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

    /// A proptest config with `default_cases` cases unless `PROPTEST_CASES` says otherwise, and
    /// no failure persistence files (shrunk failures are printed instead).
    fn config(default_cases: u32) -> ProptestConfig {
        ProptestConfig {
            cases: std::env::var("PROPTEST_CASES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(default_cases),
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    /// The rule before weights, modes and quarantine: `n / w` each, and `n % w` members get
    /// one more, those above `n / w` first, then by id. Kept as the oracle for equal weights.
    fn old_targets(shard_count: u32, members: &[MemberLoad]) -> Vec<u32> {
        let w = members.len() as u32;
        if w == 0 {
            return Vec::new();
        }
        let base = shard_count / w;
        let extra = (shard_count % w) as usize;
        let mut ranked: Vec<usize> = (0..members.len()).collect();
        ranked.sort_by(|&i, &j| {
            let above = |k: usize| members[k].owned > base;
            above(j)
                .cmp(&above(i))
                .then(members[i].worker.cmp(&members[j].worker))
        });
        let mut out = vec![base; members.len()];
        for &i in ranked.iter().take(extra) {
            out[i] += 1;
        }
        out
    }

    fn mode_strategy() -> impl Strategy<Value = MemberMode> {
        prop_oneof![2 => Just(Active), 1 => Just(Cordoned), 1 => Just(Draining)]
    }

    /// A random group: `n` buckets (up to `max_n`), `quarantined` of them, and up to
    /// `max_members` members of weights up to `max_weight` in any mode, owning at most
    /// `n - quarantined` buckets in all.
    fn weighted_strategy(
        max_n: u32,
        max_members: usize,
        max_weight: u32,
    ) -> impl Strategy<Value = (u32, u32, Vec<MemberLoad>)> {
        (1u32..=max_n, 1usize..=max_members).prop_flat_map(move |(n, w)| {
            (
                Just(n),
                0..=n,
                proptest::collection::vec((0..=n, 0..=max_weight, mode_strategy()), w),
            )
                .prop_map(|(n, quarantined, spec)| {
                    let mut left = n - quarantined;
                    let members = spec
                        .into_iter()
                        .enumerate()
                        .map(|(i, (owned, weight, mode))| {
                            let owned = owned.min(left);
                            left -= owned;
                            member(i as u32, owned, weight, mode)
                        })
                        .collect();
                    (n, quarantined, members)
                })
        })
    }

    /// What `targets` shares and with what weight in all: `(N', W)`.
    fn shared(shareable: u32, members: &[MemberLoad]) -> (u64, u64) {
        let cordoned: u32 = members
            .iter()
            .filter(|m| m.mode == Cordoned)
            .map(|m| m.owned)
            .sum();
        let weight = members
            .iter()
            .filter(|m| m.mode == Active)
            .map(|m| u64::from(m.weight))
            .sum();
        (u64::from(shareable.saturating_sub(cordoned)), weight)
    }

    /// The fewest moves from `members`' loads to any target vector the largest-remainder rule
    /// allows (each sharing member at the floor of its exact share or one more, summing to
    /// `N'`, and no member left at its floor with a strictly larger remainder than one given
    /// more), by trying every choice; also whether `ours` is one of those vectors.
    fn brute_force_weighted(shareable: u32, members: &[MemberLoad], ours: &[u32]) -> (u32, bool) {
        let (n, total) = shared(shareable, members);
        let weight = |m: &MemberLoad| {
            if m.mode == Active {
                u64::from(m.weight)
            } else {
                0
            }
        };
        let excess = |t: &[u32]| -> u32 {
            members
                .iter()
                .zip(t)
                .map(|(m, &t)| m.owned.saturating_sub(t))
                .sum()
        };
        let fixed = |m: &MemberLoad| if m.mode == Cordoned { m.owned } else { 0 };
        if total == 0 {
            let only: Vec<u32> = members.iter().map(fixed).collect();
            return (excess(&only), ours == only.as_slice());
        }
        let sharing: Vec<usize> = (0..members.len())
            .filter(|&i| members[i].mode != Cordoned)
            .collect();
        let floor = |i: usize| (n * weight(&members[i]) / total) as u32;
        let remainder = |i: usize| n * weight(&members[i]) % total;
        let mut best = u32::MAX;
        let mut found = false;
        for mask in 0u32..(1 << sharing.len()) {
            let plus = |k: usize| mask >> k & 1 == 1;
            let mut t: Vec<u32> = members.iter().map(fixed).collect();
            for (k, &i) in sharing.iter().enumerate() {
                t[i] = floor(i) + u32::from(plus(k));
            }
            let sum: u64 = sharing.iter().map(|&i| u64::from(t[i])).sum();
            let largest_first = sharing.iter().enumerate().all(|(k, &i)| {
                plus(k)
                    || sharing
                        .iter()
                        .enumerate()
                        .all(|(l, &j)| !plus(l) || remainder(i) <= remainder(j))
            });
            if sum != n || !largest_first {
                continue;
            }
            best = best.min(excess(&t));
            found |= ours == t.as_slice();
        }
        (best, found)
    }

    /// Ticks members one after another in the orders given (each seeing the others' moves so
    /// far), with buckets numbered as `owned` lists them and the top `quarantined` ones out of
    /// reach; returns each member's buckets and the unowned claimable ones after each round.
    fn tick_rounds(
        n: u32,
        quarantined: u32,
        members: &[MemberLoad],
        orders: &[Vec<u32>],
    ) -> Vec<(Vec<Vec<Bucket>>, Vec<Bucket>)> {
        let mut held: Vec<Vec<Bucket>> = Vec::new();
        let mut next = 0;
        for m in members {
            held.push(mine(next, m.owned));
            next += m.owned;
        }
        let mut free: Vec<Bucket> = (next..n - quarantined).map(Bucket).collect();
        let mut rounds = Vec::new();
        for order in orders {
            let mut turn: Vec<usize> = (0..members.len()).collect();
            turn.sort_by_key(|&i| order[i]);
            for i in turn {
                let loads: Vec<MemberLoad> = members
                    .iter()
                    .zip(&held)
                    .map(|(m, h)| MemberLoad {
                        owned: h.len() as u32,
                        ..*m
                    })
                    .collect();
                let v = GroupView {
                    claimable: free.len() as u32,
                    ..weighted_view(n, quarantined, &loads)
                };
                let p = plan(&v, members[i].worker, &held[i]);
                for b in &p.shed {
                    held[i].retain(|x| x != b);
                    free.push(*b);
                }
                for _ in 0..p.claim {
                    held[i].push(free.pop().expect("claim within claimable"));
                }
            }
            rounds.push((held.clone(), free.clone()));
        }
        rounds
    }

    proptest! {
        #![proptest_config(config(256))]

        /// Targets sum to N' plus the cordoned holdings, each sharing target is within one of
        /// its exact share, cordoned members keep what they own and draining ones get 0.
        #[test]
        fn weighted_targets_apportion_within_one(
            (n, quarantined, members) in weighted_strategy(200, 12, 1000),
        ) {
            let shareable = n - quarantined;
            let t = targets_of(shareable, &members);
            let (n_shared, total) = shared(shareable, &members);
            let cordoned: u64 = members
                .iter()
                .filter(|m| m.mode == Cordoned)
                .map(|m| u64::from(m.owned))
                .sum();
            if total > 0 {
                prop_assert_eq!(t.iter().map(|&t| u64::from(t)).sum::<u64>(), n_shared + cordoned);
            }
            for (m, &t) in members.iter().zip(&t) {
                match m.mode {
                    Cordoned => prop_assert_eq!(t, m.owned),
                    Draining => prop_assert_eq!(t, 0),
                    _ if total == 0 => prop_assert_eq!(t, 0),
                    _ => {
                        let gap = i128::from(t) * i128::from(total)
                            - i128::from(n_shared) * i128::from(m.weight);
                        prop_assert!(gap.unsigned_abs() < u128::from(total), "{m:?} got {t}");
                    }
                }
            }
        }

        /// Equal weights, all active, no quarantine: exactly the targets of the rule before
        /// weights.
        #[test]
        fn equal_weights_reproduce_the_old_rule((n, owned) in snapshot_strategy(), weight in 1u32..=5) {
            let members: Vec<MemberLoad> = loads(&owned)
                .into_iter()
                .map(|m| MemberLoad { weight, ..m })
                .collect();
            prop_assert_eq!(targets_of(n, &members), old_targets(n, &members));
        }

        /// Every member's plan follows its mode, and agrees with the targets every other member
        /// computes.
        #[test]
        fn plans_follow_each_members_mode(
            (n, quarantined, members) in weighted_strategy(200, 12, 5),
        ) {
            let v = weighted_view(n, quarantined, &members);
            let all = targets(shareable(&v), &members);
            let mut next = 0;
            for (i, m) in members.iter().enumerate() {
                let held = mine(next, m.owned);
                next += m.owned;
                let p = plan(&v, m.worker, &held);
                prop_assert_eq!(p.target, all[i].target);
                prop_assert!(p.claim <= v.claimable);
                prop_assert!(p.claim == 0 || p.shed.is_empty());
                match m.mode {
                    Cordoned => {
                        prop_assert_eq!(p.claim, 0);
                        prop_assert!(p.shed.is_empty());
                    }
                    Draining => {
                        prop_assert_eq!(p.claim, 0);
                        let mut everything = held.clone();
                        everything.reverse();
                        prop_assert_eq!(p.shed, everything);
                    }
                    _ => {
                        let after = m.owned + p.claim - p.shed.len() as u32;
                        if p.claim > 0 { prop_assert!(after <= p.target); }
                        if !p.shed.is_empty() { prop_assert_eq!(after, p.target); }
                        prop_assert!(m.owned <= p.target || !p.shed.is_empty());
                    }
                }
            }
        }
    }

    proptest! {
        #![proptest_config(config(128))]

        /// On small groups, `minimum_moves` of our targets is the fewest moves to any target
        /// vector the largest-remainder rule allows, and our targets are one of them.
        #[test]
        fn weighted_minimum_moves_match_brute_force(
            (n, quarantined, members) in weighted_strategy(12, 5, 4),
        ) {
            let shareable = n - quarantined;
            let ours = targets_of(shareable, &members);
            let (best, found) = brute_force_weighted(shareable, &members, &ours);
            prop_assert!(found, "targets {ours:?} break the largest-remainder rule");
            prop_assert_eq!(minimum_moves(shareable, &members), best);
        }

        /// From any split, in any modes and weights, with members ticking one after another in
        /// any order, two rounds of ticks reach the targets: every member at its target, and,
        /// when some member weighs anything, every bucket not quarantined owned. A third round
        /// moves nothing.
        #[test]
        fn two_rounds_of_ticks_reach_any_weighted_split(
            (n, quarantined, members) in weighted_strategy(200, 12, 5),
            orders in proptest::collection::vec(proptest::collection::vec(any::<u32>(), 12), 3),
        ) {
            let rounds = tick_rounds(n, quarantined, &members, &orders);
            let (held, free) = &rounds[1];
            let settled: Vec<MemberLoad> = members
                .iter()
                .zip(held)
                .map(|(m, h)| MemberLoad { owned: h.len() as u32, ..*m })
                .collect();
            let loads: Vec<u32> = settled.iter().map(|m| m.owned).collect();
            prop_assert_eq!(&loads, &targets_of(n - quarantined, &settled), "free {:?}", free);
            for (m, &l) in members.iter().zip(&loads) {
                match m.mode {
                    Cordoned => prop_assert_eq!(l, m.owned),
                    Draining => prop_assert_eq!(l, 0),
                    _ => {}
                }
            }
            if shared(n - quarantined, &members).1 > 0 {
                prop_assert!(free.is_empty(), "unowned after two rounds: {free:?}, loads {loads:?}");
            }
            prop_assert_eq!(&rounds[2], &rounds[1]);
        }
    }
}
