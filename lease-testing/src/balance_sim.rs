//! A deterministic simulation of a pool balancing skewed loads, tick by tick, for the
//! convergence benchmark and the load policy's property tests: no store, no clock, no
//! randomness but a seeded generator.
//!
//! **A tick** is one renew interval. Each bucket's true load is sampled (with the noise asked
//! for), smoothed by its owner ([`Smoothed`], half-life one tick) and published when it moved
//! beyond the threshold ([`worth_publishing`]); a bucket nobody holds keeps its last published
//! load. Then every member, in node-id order, plans on the view of the tick's start and does
//! what its plan says, and then, as the releases wake them (the change feed), every member plans
//! again on the view as it is now and does that. A move is a bucket given up by a live owner.
//!
//! Three rules can run: ours ([`balance::plan_loads`]), the count-fair one ([`policy::plan`](lease_core::policy::plan)), and
//! one written after KCL 3.x's description: every third tick, one leader looks at every
//! worker's load; if any is outside a band of +-10 % of the mean, every worker above the mean
//! gives up 60 % of its excess, hottest lease first among those that still fit, each lease to
//! the least loaded worker at that point.

use lease_core::balance::{self, Balance, BalanceConfig};
use lease_core::load::worth_publishing;
use lease_core::{
    Bucket, GroupView, HalfLife, Load, MemberLoad, NodeId, ShardCount, Smoothed, list_loaded,
};
use std::time::Duration;

/// Which rule balances the pool.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Rule {
    /// [`balance::plan_loads`] with this configuration.
    Ours(BalanceConfig),
    /// [`lease_core::policy::plan`]: counts only.
    CountFair,
    /// The KCL-3.x-like leader rule (see the module docs).
    KclLike,
}

/// What one tick did and left.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct TickOutcome {
    /// Buckets given up by a live owner this tick.
    pub moves: u32,
    /// The busiest member's true load over the mean member's.
    pub max_over_mean: f64,
    /// Bucket rows written by publications this tick.
    pub published: u32,
    /// Buckets nobody held at the end of the tick.
    pub unowned: u32,
}

/// Loads following Zipf's law with exponent `s` over `n` buckets, shuffled by `seed`, scaled so
/// that the mean bucket weighs one unit.
pub fn zipf(n: u32, s: f64, seed: u64) -> Vec<f64> {
    let raw: Vec<f64> = (1..=n).map(|k| 1.0 / f64::from(k).powf(s)).collect();
    let sum: f64 = raw.iter().sum();
    let mut loads: Vec<f64> = raw.iter().map(|l| l * f64::from(n) / sum).collect();
    let mut rng = SplitMix(seed);
    for i in (1..loads.len()).rev() {
        let j = (rng.next() % (i as u64 + 1)) as usize;
        loads.swap(i, j);
    }
    loads
}

/// A pool of `members` (node ids sorting as their indices) holding buckets with loads.
pub struct Sim {
    rule: Rule,
    members: Vec<NodeId>,
    owner: Vec<Option<usize>>,
    base: Vec<f64>,
    smoothed: Vec<Smoothed>,
    published: Vec<Option<Load>>,
    noise: f64,
    threshold_percent: u32,
    rng: SplitMix,
    tick: u32,
}

impl Sim {
    /// `base.len()` buckets with these loads, shared count-fair in contiguous blocks by
    /// `members` members, every load already smoothed and published (the pool has run a while).
    pub fn new(rule: Rule, members: usize, base: Vec<f64>, seed: u64) -> Self {
        let n = base.len();
        let owner = (0..n).map(|b| Some(b * members / n)).collect();
        let smoothed = base
            .iter()
            .map(|&l| Smoothed::first(load(l), Duration::ZERO))
            .collect();
        let published = base.iter().map(|&l| Some(load(l))).collect();
        Self {
            rule,
            members: (0..members).map(node).collect(),
            owner,
            base,
            smoothed,
            published,
            noise: 0.0,
            threshold_percent: 10,
            rng: SplitMix(seed),
            tick: 0,
        }
    }

    /// From now on, every sample is the true load times a factor uniform in `1 +- noise`.
    pub fn set_noise(&mut self, noise: f64) {
        self.noise = noise;
    }

    /// From now on, publish a bucket's load when it moved by more than `percent` (10 at
    /// first; 0 publishes every change, so that the noise reaches the policy unfiltered).
    pub fn set_threshold(&mut self, percent: u32) {
        self.threshold_percent = percent;
    }

    /// Give bucket `a`'s true load to `b` and `b`'s to `a` (a hot key moving).
    pub fn swap_loads(&mut self, a: usize, b: usize) {
        self.base.swap(a, b);
    }

    /// The true loads.
    pub fn base(&self) -> &[f64] {
        &self.base
    }

    /// Each bucket's owner (member index), if any.
    pub fn owners(&self) -> &[Option<usize>] {
        &self.owner
    }

    /// The lower bound of max/mean over members: 1, or the hottest bucket's share times the
    /// member count when one bucket alone is above the mean.
    pub fn bound(&self) -> f64 {
        let total: f64 = self.base.iter().sum();
        let hottest = self.base.iter().copied().fold(0.0, f64::max);
        (hottest * self.members.len() as f64 / total).max(1.0)
    }

    /// The busiest member's true load over the mean.
    pub fn max_over_mean(&self) -> f64 {
        let mut per = vec![0.0; self.members.len()];
        for (b, o) in self.owner.iter().enumerate() {
            if let Some(o) = o {
                per[*o] += self.base[b];
            }
        }
        let total: f64 = self.base.iter().sum();
        per.iter().copied().fold(0.0, f64::max) * self.members.len() as f64 / total
    }

    /// Run one tick.
    pub fn tick(&mut self) -> TickOutcome {
        self.tick += 1;
        let published = self.sample();
        let moves = match self.rule {
            Rule::Ours(config) => self.round_ours(config) + self.round_ours(config),
            Rule::CountFair => self.round_count() + self.round_count(),
            Rule::KclLike => self.round_kcl(),
        };
        TickOutcome {
            moves,
            max_over_mean: self.max_over_mean(),
            published,
            unowned: self.owner.iter().filter(|o| o.is_none()).count() as u32,
        }
    }

    /// Sample, smooth and publish every held bucket's load; returns the rows published.
    fn sample(&mut self) -> u32 {
        let at = Duration::from_secs(u64::from(self.tick) * 10);
        let half = HalfLife::DEFAULT;
        let mut rows = 0;
        for m in 0..self.members.len() {
            let held: Vec<usize> = (0..self.base.len())
                .filter(|&b| self.owner[b] == Some(m))
                .collect();
            for &b in &held {
                let factor = 1.0 + self.noise * (2.0 * self.rng.unit() - 1.0);
                self.smoothed[b].add(load(self.base[b] * factor), at, half);
            }
            let mean = held
                .iter()
                .map(|&b| self.smoothed[b].get().micros())
                .sum::<u64>()
                / (held.len().max(1) as u64);
            for &b in &held {
                let now = self.smoothed[b].get();
                if worth_publishing(
                    self.published[b],
                    now,
                    Load::from_micros(mean),
                    self.threshold_percent,
                ) {
                    self.published[b] = Some(now);
                    rows += 1;
                }
            }
        }
        rows
    }

    fn held(&self, m: usize) -> Vec<usize> {
        (0..self.base.len())
            .filter(|&b| self.owner[b] == Some(m))
            .collect()
    }

    fn group_view(&self) -> GroupView {
        let members = (0..self.members.len())
            .map(|m| MemberLoad::new(self.members[m], self.held(m).len() as u32))
            .collect();
        let unowned = self.owner.iter().filter(|o| o.is_none()).count() as u32;
        let n = ShardCount::new(self.base.len() as u32).expect("a valid shard count");
        GroupView::new(n, members, unowned)
    }

    /// One round of our rule: every member plans on the view at the round's start, then acts.
    /// Each member's work is as of the round's start: a worker publishes again after its
    /// buckets changed.
    fn round_ours(&mut self, config: BalanceConfig) -> u32 {
        let mut view = self.group_view();
        for (m, member) in view.members.iter_mut().enumerate() {
            let loads: Vec<Load> = self
                .held(m)
                .iter()
                .map(|&b| self.published_load(b))
                .collect();
            member.load = Load::sum(&loads);
            member.hottest = loads.iter().copied().max().unwrap_or(Load::ZERO);
        }
        view.loaded = list_loaded(
            (0..self.base.len())
                .filter(|&b| self.owner[b].is_none())
                .map(|b| (Bucket(b as u32), self.published_load(b))),
        );
        let plans: Vec<Balance> = (0..self.members.len())
            .map(|m| {
                let mine: Vec<(Bucket, Load)> = self
                    .held(m)
                    .iter()
                    .map(|&b| (Bucket(b as u32), self.smoothed[b].get()))
                    .collect();
                balance::plan_loads(&view, self.members[m], &mine, config)
            })
            .collect();
        let mut moves = 0;
        for (m, p) in plans.into_iter().enumerate() {
            match p {
                Balance::Count(p) => {
                    moves += self.release(m, &p.shed);
                    self.claim_any(m, p.claim);
                }
                Balance::Load(p) => {
                    moves += self.release(m, &p.shed);
                    for b in p.claim {
                        if self.owner[b.0 as usize].is_none() {
                            self.owner[b.0 as usize] = Some(m);
                        }
                    }
                    self.claim_any(m, p.claim_any);
                }
            }
        }
        moves
    }

    fn round_count(&mut self) -> u32 {
        let group = self.group_view();
        let mut moves = 0;
        for m in 0..self.members.len() {
            let mine: Vec<Bucket> = self.held(m).iter().map(|&b| Bucket(b as u32)).collect();
            let p = lease_core::policy::plan(&group, self.members[m], &mine);
            moves += self.release(m, &p.shed);
            self.claim_any(m, p.claim);
        }
        moves
    }

    /// The KCL-3.x-like leader: acts on ticks 1, 4, 7, ... (every third run).
    fn round_kcl(&mut self) -> u32 {
        if self.tick % 3 != 1 {
            return 0;
        }
        let w = self.members.len();
        let mut per: Vec<f64> = (0..w)
            .map(|m| {
                self.held(m)
                    .iter()
                    .map(|&b| self.published_load(b).as_f64())
                    .sum()
            })
            .collect();
        let mean = per.iter().sum::<f64>() / w as f64;
        if per.iter().all(|&l| (l - mean).abs() <= 0.1 * mean) {
            return 0;
        }
        let mut moves = 0;
        for m in 0..w {
            if per[m] <= mean {
                continue;
            }
            let mut left = (per[m] - mean) * 0.6;
            let mut held = self.held(m);
            held.sort_by(|&a, &b| {
                self.published_load(b)
                    .cmp(&self.published_load(a))
                    .then(b.cmp(&a))
            });
            for b in held {
                let l = self.published_load(b).as_f64();
                if l > left || l == 0.0 {
                    continue;
                }
                let to = (0..w)
                    .min_by(|&i, &j| per[i].total_cmp(&per[j]).then(i.cmp(&j)))
                    .unwrap_or(m);
                if to == m {
                    break;
                }
                self.owner[b] = Some(to);
                per[m] -= l;
                per[to] += l;
                left -= l;
                moves += 1;
            }
        }
        moves
    }

    fn published_load(&self, b: usize) -> Load {
        self.published[b].unwrap_or(Load::ZERO)
    }

    fn release(&mut self, m: usize, shed: &[Bucket]) -> u32 {
        let mut n = 0;
        for b in shed {
            let b = b.0 as usize;
            if self.owner[b] == Some(m) {
                self.owner[b] = None;
                n += 1;
            }
        }
        n
    }

    /// Claim `want` unowned buckets, lowest first (those of no load first, as the store's
    /// claim by count takes what nobody named).
    fn claim_any(&mut self, m: usize, want: u32) {
        let mut free: Vec<usize> = (0..self.base.len())
            .filter(|&b| self.owner[b].is_none())
            .collect();
        free.sort_by_key(|&b| (self.published_load(b) > Load::ZERO, b));
        for b in free.into_iter().take(want as usize) {
            self.owner[b] = Some(m);
        }
    }
}

/// A node id sorting as `i`.
pub fn node(i: usize) -> NodeId {
    NodeId::from_uuid(uuid::Uuid::from_u128(i as u128 + 1))
}

fn load(units: f64) -> Load {
    Load::new(units.clamp(0.0, Load::MAX.as_f64())).unwrap_or(Load::ZERO)
}

/// splitmix64: small, seeded, and the same on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}
