//! The load-aware policy: share the work, not the bucket count. Pure, no I/O, no clock, and
//! deterministic for a view: every member computes every member's target, and who claims
//! which released bucket, from the same numbers, so the pool agrees without a leader.
//!
//! # When loads count
//!
//! Loads count only when they tell buckets apart: when no bucket has a load, or every bucket
//! that has one has the same, this is exactly the count-fair [`policy::plan`] (with its own
//! shares, modes and weights), and [`plan_loads`] answers [`Balance::Count`].
//!
//! # Targets
//!
//! A member's load is the sum of its buckets' loads (the store adds them up from the loads
//! published per bucket); the buckets released but not claimed yet count with their last
//! loads. A cordoned member keeps what it holds, so its load is left out, as the count-fair
//! policy leaves out its buckets. The rest is shared by weight, as by the count-fair policy:
//! a member of weight `w` is owed `total x w / W`. A member whose hottest bucket alone is
//! above that share is **isolated**: its target is that bucket's load, and the others share
//! what is left (again, until no share is below a member's hottest bucket). A draining member,
//! or one of weight 0, has target 0 and sheds everything, at once, as with counts.
//!
//! # Moves
//!
//! - **Hysteresis.** Nothing moves for load while every sharing member's load is within the
//!   band around its target (`band_percent`, default 10 %).
//! - **Who sheds, and how much.** Otherwise the work to move is the larger of what the
//!   members above the band carry over their targets and what the members below it miss. The
//!   members above their targets give it up, the one most above first, each at most down to
//!   its target, so that after a round the members sit near the middle of the band, where
//!   noise does not push them out. An isolated member gives up all but its hottest bucket and
//!   at most a quarter of the band above it in other buckets (a few cold buckets are not worth
//!   a move each).
//! - **Which buckets.** A shedder gives up the hottest of its buckets whose load still fits in
//!   what it has left to give (never its hottest when isolated), so that few moves close the
//!   gap and nobody below is pushed over the band.
//! - **Budget.** At most `budget_percent` (default 10 %, at least 1) of the group's buckets
//!   are shed per tick in all, split between the shedders by what each gives up.
//! - **Hand-offs in flight.** A member sheds for load only when no released bucket with a load
//!   waits to be claimed: a round of hand-offs is claimed before the next one starts.
//! - **Who claims what.** Every claimable bucket is given to a member, hottest first (the
//!   longest-processing-time rule): each to the sharing, not isolated member with the lowest
//!   load per weight, counting what it was given before it. Claimable buckets with no load
//!   are given one by one to the member with the fewest buckets per weight. A member claims
//!   the buckets it was given by name, and the others it was given by count.
//!
//! Nothing here weakens a safety rule: a plan only sheds what the member holds, and claims go
//! through the store, which refuses what is not claimable; revocations and the trust deadline
//! are the runtime's, as with counts.

use crate::ids::{Bucket, NodeId};
use crate::load::Load;
use crate::policy::{self, Plan};
use crate::view::{GroupView, MemberLoad, MemberMode};

/// The load-aware policy's knobs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct BalanceConfig {
    /// The hysteresis band, in percent of each member's target: nothing moves for load while
    /// every member is within it.
    pub band_percent: u32,
    /// The most buckets shed for load per tick, in percent of the group's shareable buckets
    /// (at least one).
    pub budget_percent: u32,
}

impl Default for BalanceConfig {
    fn default() -> Self {
        Self {
            band_percent: 10,
            budget_percent: 10,
        }
    }
}

/// What one member should do this tick, by load.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct LoadPlan {
    /// Its target, in millionths of a unit.
    pub target: u64,
    /// Whether its hottest bucket alone is above a fair share: it keeps that bucket only.
    pub isolated: bool,
    /// Buckets to give up now, in the order they were chosen.
    pub shed: Vec<Bucket>,
    /// Claimable buckets to claim by name, hottest first.
    pub claim: Vec<Bucket>,
    /// How many claimable buckets with no load to claim, whichever.
    pub claim_any: u32,
}

/// The policy's answer: by count when loads tell no bucket apart, else by load.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Balance {
    /// The count-fair plan ([`policy::plan`]).
    Count(Plan),
    /// The load-aware plan.
    Load(LoadPlan),
}

/// One member as the policy weighs it.
#[derive(Clone, Copy, Debug)]
struct Member {
    worker: NodeId,
    weight: u64,
    mode: MemberMode,
    owned: u32,
    total: u64,
    hottest: u64,
}

impl Member {
    fn shares(&self) -> bool {
        self.mode == MemberMode::Active && self.weight > 0
    }
}

/// What `me` should do, given the group's loads and `mine`, the buckets it holds with their
/// loads now (the heartbeat's, with the loads it measured). The shared decisions (targets,
/// who sheds how much, who claims what) use only the view's numbers, so that every member
/// reaches the same ones; `mine` only chooses which of `me`'s buckets go.
pub fn plan_loads(
    view: &GroupView,
    me: NodeId,
    mine: &[(Bucket, Load)],
    config: BalanceConfig,
) -> Balance {
    let members = members(view, me, mine);
    if uniform(&members, &view.loaded) {
        let buckets: Vec<Bucket> = mine.iter().map(|&(b, _)| b).collect();
        return Balance::Count(policy::plan(view, me, &buckets));
    }
    let claimable_load = Load::sum(view.loaded.iter().map(|(_, l)| l));
    let (targets, isolated) = targets(&members, claimable_load);
    let i = members
        .iter()
        .position(|m| m.worker == me)
        .unwrap_or_default();
    let myself = members[i];
    let mut out = LoadPlan {
        target: targets[i],
        isolated: isolated[i],
        ..LoadPlan::default()
    };
    if !myself.shares() {
        if myself.mode != MemberMode::Cordoned {
            // Draining or weight 0: everything goes, at once, as with counts.
            let mut all: Vec<Bucket> = mine.iter().map(|&(b, _)| b).collect();
            all.sort_unstable_by(|a, b| b.cmp(a));
            out.shed = all;
        }
        return Balance::Load(out);
    }
    if view.loaded.is_empty() {
        let quotas = quotas(&members, &targets, &isolated, config);
        let budget = shed_budget(view, &quotas, config);
        out.shed = choose_shed(mine, quotas[i], budget[i], isolated[i], config.band_percent);
    }
    let (named, any) = assign_claimable(&members, &isolated, &view.loaded, view.claimable);
    out.claim = named
        .into_iter()
        .filter(|&(_, to)| to == i)
        .map(|(b, _)| b)
        .collect();
    out.claim_any = any[i];
    Balance::Load(out)
}

/// Every member of the view, and `me` (weight 1, active, if the view missed it), sorted by
/// node id. `me`'s count is `mine`'s, as in the count-fair policy; its work is the view's,
/// like everyone's, so that every member weighs it the same.
fn members(view: &GroupView, me: NodeId, mine: &[(Bucket, Load)]) -> Vec<Member> {
    let weigh = |m: &MemberLoad, owned: u32| Member {
        worker: m.worker,
        weight: if m.mode == MemberMode::Active {
            u64::from(m.weight)
        } else {
            0
        },
        mode: m.mode,
        owned,
        total: m.load,
        hottest: m.hottest.micros(),
    };
    let owned = u32::try_from(mine.len()).unwrap_or(u32::MAX);
    let mut out: Vec<Member> = view
        .members
        .iter()
        .map(|m| weigh(m, if m.worker == me { owned } else { m.owned }))
        .collect();
    if !out.iter().any(|m| m.worker == me) {
        out.push(weigh(&MemberLoad::new(me, owned), owned));
        out.sort_by_key(|m| m.worker);
    }
    out
}

/// Whether the loads tell no bucket apart: every bucket with a known load has the same one
/// (none at all included).
fn uniform(members: &[Member], claimable: &[(Bucket, Load)]) -> bool {
    let mut seen: Option<u64> = None;
    let mut same = |load: u64| *seen.get_or_insert(load) == load;
    for m in members.iter().filter(|m| m.owned > 0) {
        let even = u128::from(m.hottest) * u128::from(m.owned) == u128::from(m.total);
        if !even || !same(m.hottest) {
            return false;
        }
    }
    claimable.iter().all(|&(_, l)| same(l.micros()))
}

/// Every member's target and whether it is isolated, in the order of `members`.
fn targets(members: &[Member], claimable_load: u64) -> (Vec<u64>, Vec<bool>) {
    let mut target: Vec<u64> = members
        .iter()
        .map(|m| {
            if m.mode == MemberMode::Cordoned {
                m.total
            } else {
                0
            }
        })
        .collect();
    let mut isolated = vec![false; members.len()];
    let total = members
        .iter()
        .filter(|m| m.mode != MemberMode::Cordoned)
        .fold(claimable_load, |s, m| s.saturating_add(m.total));
    loop {
        let left = members
            .iter()
            .zip(&isolated)
            .filter(|&(_, &iso)| iso)
            .fold(total, |s, (m, _)| s.saturating_sub(m.hottest));
        let weight: u64 = members
            .iter()
            .zip(&isolated)
            .filter(|&(m, &iso)| m.shares() && !iso)
            .map(|(m, _)| m.weight)
            .sum();
        if weight == 0 {
            break;
        }
        // The member whose hottest bucket is furthest above its share (hottest / weight the
        // largest; by id between equals) is isolated first, then the shares are computed again.
        let above = members
            .iter()
            .enumerate()
            .filter(|&(i, m)| m.shares() && !isolated[i])
            .filter(|&(_, m)| {
                u128::from(m.hottest) * u128::from(weight) > u128::from(left) * u128::from(m.weight)
            })
            .max_by(|(_, a), (_, b)| {
                (u128::from(a.hottest) * u128::from(b.weight))
                    .cmp(&(u128::from(b.hottest) * u128::from(a.weight)))
                    .then(b.worker.cmp(&a.worker))
            })
            .map(|(i, _)| i);
        match above {
            Some(i) => isolated[i] = true,
            None => {
                for (i, m) in members.iter().enumerate() {
                    if m.shares() {
                        target[i] = if isolated[i] {
                            m.hottest
                        } else {
                            // At most `left`, so it fits.
                            u64::try_from(
                                u128::from(left) * u128::from(m.weight) / u128::from(weight),
                            )
                            .unwrap_or(u64::MAX)
                        };
                    }
                }
                break;
            }
        }
    }
    (target, isolated)
}

/// `load` compared with `target` widened by `percent` of it: above (`up`) or below.
fn beyond(load: u64, target: u64, percent: u32, up: bool) -> bool {
    let load = u128::from(load) * 100;
    if up {
        load > u128::from(target) * u128::from(100 + percent)
    } else {
        load < u128::from(target) * u128::from(100u32.saturating_sub(percent))
    }
}

/// How much load each member gives up this tick (0 for most), in the order of `members`: none
/// while every sharing member is within the band; otherwise the larger of the excess above
/// the band and the shortfall below it, taken from the members most above their targets, each
/// down to its target at most (an isolated one to a quarter of the band above its hottest
/// bucket).
fn quotas(
    members: &[Member],
    targets: &[u64],
    isolated: &[bool],
    config: BalanceConfig,
) -> Vec<u64> {
    let band = config.band_percent;
    let sharing = || members.iter().zip(targets).filter(|(m, _)| m.shares());
    let over: u64 = sharing()
        .filter(|&(m, &t)| beyond(m.total, t, band, true))
        .map(|(m, &t)| m.total - t)
        .sum();
    let under: u64 = sharing()
        .filter(|&(m, &t)| beyond(m.total, t, band, false))
        .map(|(m, &t)| t - m.total)
        .sum();
    let mut quota = vec![0u64; members.len()];
    let mut left = over.max(under);
    if left == 0 {
        return quota;
    }
    // What each member may give: down to its target, and an isolated member down to its
    // hottest bucket and a quarter of the band (a few cold buckets are not worth moving).
    let mut givers: Vec<(usize, u64)> = members
        .iter()
        .enumerate()
        .filter(|(_, m)| m.shares())
        .filter_map(|(i, m)| {
            let keep = if isolated[i] {
                u64::try_from(u128::from(m.hottest) * u128::from(400 + band) / 400)
                    .unwrap_or(u64::MAX)
            } else {
                targets[i]
            };
            m.total.checked_sub(keep).filter(|&g| g > 0).map(|g| (i, g))
        })
        .collect();
    givers.sort_by(|&(i, a), &(j, b)| b.cmp(&a).then(members[i].worker.cmp(&members[j].worker)));
    for (i, give) in givers {
        let q = give.min(left);
        quota[i] = q;
        left -= q;
        if left == 0 {
            break;
        }
    }
    quota
}

/// How many buckets each member may shed this tick: the group's budget split by quota
/// (largest remainder, by node id between equals).
fn shed_budget(group: &GroupView, quotas: &[u64], config: BalanceConfig) -> Vec<u32> {
    let budget =
        (u64::from(policy::shareable(group)) * u64::from(config.budget_percent) / 100).max(1);
    let sum: u128 = quotas.iter().map(|&q| u128::from(q)).sum();
    let mut out = vec![0u32; quotas.len()];
    if sum == 0 {
        return out;
    }
    let mut rests: Vec<(usize, u128)> = Vec::new();
    let mut given = 0u64;
    for (i, &q) in quotas.iter().enumerate() {
        let owed = u128::from(budget) * u128::from(q);
        let floor = u64::try_from(owed / sum).unwrap_or(u64::MAX);
        out[i] = u32::try_from(floor).unwrap_or(u32::MAX);
        given += floor;
        if q > 0 {
            rests.push((i, owed % sum));
        }
    }
    rests.sort_by(|&(i, a), &(j, b)| b.cmp(&a).then(i.cmp(&j)));
    let left = usize::try_from(budget.saturating_sub(given)).unwrap_or(0);
    for &(i, _) in rests.iter().take(left) {
        out[i] = out[i].saturating_add(1);
    }
    out
}

/// Which of `mine` to give up, at most `count` of them, when the member gives up `quota` (none
/// for 0). An isolated member keeps its hottest bucket and the coldest others whose loads add
/// up to at most a quarter of the band of it, and gives up the rest, hottest first. Any other
/// gives up the hottest buckets that still fit in what is left of `quota`. A bucket of no load
/// is never given up for load: it would close nothing.
fn choose_shed(
    mine: &[(Bucket, Load)],
    quota: u64,
    count: u32,
    isolated: bool,
    band_percent: u32,
) -> Vec<Bucket> {
    if quota == 0 {
        return Vec::new();
    }
    let mut sorted: Vec<(Bucket, Load)> = mine.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let count = usize::try_from(count).unwrap_or(usize::MAX);
    if isolated {
        let Some((&(_, hottest), rest)) = sorted.split_first() else {
            return Vec::new();
        };
        let allowance = u128::from(hottest.micros()) * u128::from(band_percent) / 400;
        let mut kept = 0u128;
        let mut end = rest.len();
        while let Some(&(_, l)) = end.checked_sub(1).and_then(|k| rest.get(k)) {
            if kept + u128::from(l.micros()) > allowance {
                break;
            }
            kept += u128::from(l.micros());
            end -= 1;
        }
        return rest[..end]
            .iter()
            .filter(|&&(_, l)| l > Load::ZERO)
            .take(count)
            .map(|&(b, _)| b)
            .collect();
    }
    let mut left = quota;
    let mut out = Vec::new();
    for &(b, l) in &sorted {
        if out.len() >= count || left == 0 {
            break;
        }
        if l > Load::ZERO && l.micros() <= left {
            left -= l.micros();
            out.push(b);
        }
    }
    out
}

/// Who claims which claimable bucket: the named ones (hottest first) to the sharing, not
/// isolated member with the lowest load per weight so far; then the `claimable` less the
/// named ones, which weigh nothing, one by one to the member with the fewest buckets per
/// weight. Returns (bucket, member index) and, per member, how many unnamed ones it claims.
fn assign_claimable(
    members: &[Member],
    isolated: &[bool],
    named: &[(Bucket, Load)],
    claimable: u32,
) -> (Vec<(Bucket, usize)>, Vec<u32>) {
    let mut load: Vec<u64> = members.iter().map(|m| m.total).collect();
    let mut count: Vec<u64> = members.iter().map(|m| u64::from(m.owned)).collect();
    let mut any = vec![0u32; members.len()];
    let mut takers: Vec<usize> = (0..members.len())
        .filter(|&i| members[i].shares() && !isolated[i])
        .collect();
    if takers.is_empty() {
        takers = (0..members.len())
            .filter(|&i| members[i].shares())
            .collect();
    }
    let mut out = Vec::new();
    if takers.is_empty() {
        return (out, any);
    }
    let per_weight = |x: &[u64], i: usize, j: usize| {
        (u128::from(x[i]) * u128::from(members[j].weight))
            .cmp(&(u128::from(x[j]) * u128::from(members[i].weight)))
    };
    let mut sorted = named.to_vec();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    for (b, l) in sorted {
        let to = takers
            .iter()
            .copied()
            .min_by(|&i, &j| {
                per_weight(&load, i, j)
                    .then(per_weight(&count, i, j))
                    .then(i.cmp(&j))
            })
            .unwrap_or(takers[0]);
        load[to] = load[to].saturating_add(l.micros());
        count[to] += 1;
        out.push((b, to));
    }
    let unnamed = claimable.saturating_sub(u32::try_from(out.len()).unwrap_or(u32::MAX));
    for _ in 0..unnamed {
        let to = takers
            .iter()
            .copied()
            .min_by(|&i, &j| {
                per_weight(&count, i, j)
                    .then(per_weight(&load, i, j))
                    .then(i.cmp(&j))
            })
            .unwrap_or(takers[0]);
        count[to] += 1;
        any[to] += 1;
    }
    (out, any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::ShardCount;
    use crate::view::MemberLoad;
    use proptest::prelude::*;
    use uuid::Uuid;

    fn worker(i: u32) -> NodeId {
        NodeId::from_uuid(Uuid::from_u128(u128::from(i) + 1))
    }

    fn units(v: u64) -> Load {
        Load::from_micros(v * 1_000_000)
    }

    /// A pool of members holding consecutive buckets with these loads (in units), and the
    /// claimable buckets after them with theirs, every load published.
    struct Pool {
        group: GroupView,
        held: Vec<Vec<(Bucket, Load)>>,
    }

    fn pool(held: &[&[u64]], claimable: &[u64]) -> Pool {
        let mut next = 0u32;
        let mut take = |loads: &[u64]| -> Vec<(Bucket, Load)> {
            loads
                .iter()
                .map(|&l| {
                    next += 1;
                    (Bucket(next - 1), units(l))
                })
                .collect()
        };
        let held: Vec<Vec<(Bucket, Load)>> = held.iter().map(|h| take(h)).collect();
        let claimable: Vec<(Bucket, Load)> = take(claimable);
        let members = held
            .iter()
            .enumerate()
            .map(|(i, h)| MemberLoad {
                load: Load::sum(h.iter().map(|(_, l)| l)),
                hottest: h.iter().map(|&(_, l)| l).max().unwrap_or(Load::ZERO),
                ..MemberLoad::new(worker(i as u32), h.len() as u32)
            })
            .collect();
        let group = GroupView {
            loaded: crate::view::list_loaded(claimable.iter().copied()),
            ..GroupView::new(
                ShardCount::new(next).unwrap(),
                members,
                claimable.len() as u32,
            )
        };
        Pool { group, held }
    }

    impl Pool {
        /// Member `i`'s plan, with no budget to speak of (the budget has a test of its own).
        fn plan(&self, i: usize) -> LoadPlan {
            self.plan_with(
                i,
                BalanceConfig {
                    budget_percent: 100,
                    ..BalanceConfig::default()
                },
            )
        }

        fn plan_with(&self, i: usize, config: BalanceConfig) -> LoadPlan {
            match plan_loads(&self.group, worker(i as u32), &self.held[i], config) {
                Balance::Load(p) => p,
                Balance::Count(p) => panic!("a count plan: {p:?}"),
            }
        }
    }

    #[test]
    fn a_hot_bucket_is_isolated_and_the_rest_shed() {
        // 20 units in all, 4 members: a share is 5, and the 9 alone is above it.
        let p = pool(&[&[9, 1, 1, 1], &[2, 2], &[2, 1], &[1]], &[]);
        let hot = p.plan(0);
        assert!(hot.isolated);
        assert_eq!(hot.target, 9_000_000);
        // It keeps the 9 and gives up the rest (3 units: a quarter of the band of 9 is 0.225).
        assert_eq!(hot.shed, vec![Bucket(3), Bucket(2), Bucket(1)]);
        // The others share the 11 left: 3.67 each, and nobody else sheds.
        for i in 1..4 {
            let q = p.plan(i);
            assert!(!q.isolated);
            assert_eq!(q.target, 11_000_000 / 3);
            assert!(q.shed.is_empty(), "{i}: {q:?}");
        }
    }

    #[test]
    fn nothing_moves_while_every_member_is_within_the_band() {
        // Targets 10 each; 11 and 9 are on the band's edges, still within it.
        let p = pool(&[&[5, 5, 1], &[5, 4], &[6, 4]], &[]);
        for i in 0..3 {
            assert_eq!(p.plan(i).target, 10_000_000);
            assert!(p.plan(i).shed.is_empty(), "{i}");
        }
        // One above the band: it sheds what fits in its excess (4), hottest first.
        let q = pool(&[&[6, 5, 2, 1], &[4, 4], &[4, 4]], &[]);
        let plan = q.plan(0);
        assert_eq!(plan.target, 10_000_000);
        assert_eq!(plan.shed, vec![Bucket(2), Bucket(3)]);
        assert!(q.plan(1).shed.is_empty() && q.plan(2).shed.is_empty());
    }

    #[test]
    fn claimable_buckets_go_hottest_first_to_the_least_loaded() {
        let p = pool(&[&[3], &[1], &[2]], &[5, 2, 1]);
        // 5 to member 1 (at 1), then 2 to member 2 (at 2), then 1 to member 0 (at 3, where
        // member 2 is at 4 by then).
        assert_eq!(p.plan(1).claim, vec![Bucket(3)]);
        assert_eq!(p.plan(2).claim, vec![Bucket(4)]);
        assert_eq!(p.plan(0).claim, vec![Bucket(5)]);
        // While they wait, nobody sheds for load.
        assert!((0..3).all(|i| p.plan(i).shed.is_empty()));
    }

    #[test]
    fn claimable_buckets_of_no_load_go_by_count() {
        let mut p = pool(&[&[3, 3], &[4]], &[5]);
        // Three more claimable buckets nobody published a load for.
        p.group.claimable += 3;
        p.group.shard_count = ShardCount::new(7).unwrap();
        let (a, b) = (p.plan(0), p.plan(1));
        assert_eq!(
            (a.claim.clone(), b.claim.clone()),
            (vec![], vec![Bucket(3)])
        );
        assert_eq!(a.claim_any + b.claim_any, 3);
        assert_eq!((a.claim_any, b.claim_any), (2, 1));
    }

    #[test]
    fn a_draining_member_sheds_everything_and_a_cordoned_one_nothing() {
        let mut p = pool(&[&[9, 1], &[1, 1], &[1]], &[]);
        p.group.members[0].mode = MemberMode::Draining;
        p.group.members[1].mode = MemberMode::Cordoned;
        let d = p.plan(0);
        assert_eq!((d.target, d.shed), (0, vec![Bucket(1), Bucket(0)]));
        let c = p.plan(1);
        assert_eq!((c.target, c.shed.len(), c.claim.len()), (2_000_000, 0, 0));
        // The cordoned member's load is left out: the third member's target is 11 (all but 2).
        assert_eq!(p.plan(2).target, 11_000_000);
    }

    #[test]
    fn the_budget_caps_the_sheds_of_a_tick() {
        // 40 buckets: a budget of 4 (10 %), though member 0 is 36.7 above its share (18
        // buckets of 2 fit in that).
        let hot: Vec<u64> = vec![2; 30];
        let p = pool(&[&hot, &[1; 5], &[1; 5]], &[]);
        assert_eq!(p.plan_with(0, BalanceConfig::default()).shed.len(), 4);
        let half = BalanceConfig {
            budget_percent: 25,
            ..BalanceConfig::default()
        };
        assert_eq!(p.plan_with(0, half).shed.len(), 10);
        assert_eq!(p.plan(0).shed.len(), 18);
    }

    #[test]
    fn weights_share_load_as_they_share_counts() {
        let mut p = pool(&[&[4, 4, 4], &[4, 4, 4]], &[]);
        p.held[1][0].1 = units(5);
        p.group.members[1].load = 13_000_000;
        p.group.members[1].hottest = units(5);
        p.group.members[0].weight = 3;
        // 25 over 3:1.
        assert_eq!(p.plan(0).target, 18_750_000);
        assert_eq!(p.plan(1).target, 6_250_000);
        // 6.75 above: the 5 fits, a 4 then no longer does.
        assert_eq!(p.plan(1).shed, vec![Bucket(3)]);
    }

    fn arb_view() -> impl Strategy<Value = (u32, Vec<u32>, Vec<(u32, MemberMode)>)> {
        (1u32..=64, 1usize..=6).prop_flat_map(|(n, w)| {
            (
                Just(n),
                proptest::collection::vec(0..=n, w),
                proptest::collection::vec(
                    (
                        0u32..=3,
                        prop_oneof![
                            Just(MemberMode::Active),
                            Just(MemberMode::Cordoned),
                            Just(MemberMode::Draining)
                        ],
                    ),
                    w,
                ),
            )
        })
    }

    proptest! {
        /// With no loads, or the same load on every bucket that has one, the plan is the
        /// count-fair one, whatever the modes and weights.
        #[test]
        fn without_loads_that_differ_it_is_count_fair(
            (n, owned, controls) in arb_view(),
            load in prop_oneof![Just(0u64), 1u64..1_000_000_000],
        ) {
            let mut left = n;
            let mut next = 0;
            let mut members = Vec::new();
            let mut held = Vec::new();
            for (i, (&o, &(weight, mode))) in owned.iter().zip(&controls).enumerate() {
                let o = o.min(left);
                left -= o;
                let published = load > 0 && o > 0;
                members.push(MemberLoad {
                    weight,
                    mode,
                    load: if published { load * u64::from(o) } else { 0 },
                    hottest: Load::from_micros(if published { load } else { 0 }),
                    ..MemberLoad::new(worker(i as u32), o)
                });
                held.push((next..next + o).map(|b| (Bucket(b), Load::from_micros(load))).collect::<Vec<_>>());
                next += o;
            }
            let group = GroupView {
                loaded: crate::view::list_loaded((next..n).map(|b| (Bucket(b), Load::from_micros(load)))),
                ..GroupView::new(ShardCount::new(n).unwrap(), members, left)
            };
            for (i, h) in held.iter().enumerate() {
                let buckets: Vec<Bucket> = h.iter().map(|&(b, _)| b).collect();
                let expected = policy::plan(&group, worker(i as u32), &buckets);
                prop_assert_eq!(plan_loads(&group, worker(i as u32), h, BalanceConfig::default()), Balance::Count(expected));
            }
        }

        /// Every member's plan of one view: sheds only what it holds, within the budget;
        /// every named claimable bucket is claimed by exactly one member, and the unnamed
        /// ones are all given out, when some member shares.
        #[test]
        fn plans_of_one_view_agree(
            loads in proptest::collection::vec(proptest::collection::vec(0u64..50, 0..12), 1..6),
            free in proptest::collection::vec(0u64..50, 0..8),
        ) {
            let held: Vec<&[u64]> = loads.iter().map(|l| l.as_slice()).collect();
            prop_assume!(held.iter().map(|h| h.len()).sum::<usize>() + free.len() > 0);
            let p = pool(&held, &free);
            let mut named: Vec<Bucket> = p.group.loaded.iter().map(|&(b, _)| b).collect();
            named.sort();
            let budget = (p.group.shard_count.get() / 10).max(1) as usize;
            let (mut claimed, mut any, mut shed) = (Vec::new(), 0, 0);
            for (i, h) in p.held.iter().enumerate() {
                let Balance::Load(l) = plan_loads(&p.group, worker(i as u32), h, BalanceConfig::default()) else {
                    // Every load the same: the count-fair plan, tested above.
                    return Ok(());
                };
                prop_assert!(l.shed.iter().all(|b| h.iter().any(|&(x, _)| x == *b)));
                prop_assert!(l.shed.is_empty() || p.group.loaded.is_empty());
                prop_assert!(l.shed.iter().all(|b| !l.claim.contains(b)));
                shed += l.shed.len();
                claimed.extend(l.claim);
                any += l.claim_any;
            }
            prop_assert!(shed <= budget);
            claimed.sort();
            prop_assert_eq!(&claimed, &named);
            prop_assert_eq!(any as usize, free.len() - named.len());
        }
    }
}
