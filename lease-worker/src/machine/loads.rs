//! The loads the applications measure on their buckets: smoothed in time, published to the
//! store only when they moved (rules P1-P5), and handed to the load-aware policy.
//!
//! A group nobody reported a load in publishes nothing and plans exactly as the count-fair
//! policy does ([`balance::plan_loads`] answers [`Balance::Count`] when no bucket has a load).

use lease_core::balance::{self, Balance, BalanceConfig};
use lease_core::load::worth_publishing;
use lease_core::{HalfLife, Smoothed};

use super::*;

/// How a node weighs its buckets' loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadRules {
    /// How fast a bucket's smoothed load forgets a sample.
    pub half_life: HalfLife,
    /// A bucket's smoothed load is published again once it moved by more than this percent
    /// of the larger of its last published value and the node's mean bucket load in the
    /// group; the node's work is published again whenever the buckets it holds changed.
    pub publish_threshold_percent: u32,
    /// The load-aware policy's band and move budget.
    pub balance: BalanceConfig,
}

impl Default for LoadRules {
    fn default() -> Self {
        Self {
            half_life: HalfLife::DEFAULT,
            publish_threshold_percent: 10,
            balance: BalanceConfig::default(),
        }
    }
}

/// One group's loads as the node measured and published them.
#[derive(Debug, Default)]
pub(super) struct GroupLoads {
    /// The origin of the samples' times: the first sample's instant.
    origin: Option<Instant>,
    /// The smoothed load of each bucket the application reported one for, while it is held.
    samples: BTreeMap<Bucket, Smoothed>,
    /// What the store recorded from this node, per bucket, as of the last answered
    /// publication.
    published: BTreeMap<Bucket, Load>,
    /// The buckets held at the last answered publication; `None` before the first.
    published_held: Option<BTreeSet<Bucket>>,
    /// The publication in flight.
    sending: Option<Sending>,
    /// When the loads are next looked at: at most once per [`CHECK_EVERY`], so that a node
    /// holding many buckets does not go over them at every step of a tick.
    next_check: Option<Instant>,
}

/// How often a group's loads are looked at for a publication.
const CHECK_EVERY: Duration = Duration::from_millis(250);

/// A publication in flight: its loads, and the buckets held when it was made.
#[derive(Debug)]
struct Sending {
    loads: Vec<(Bucket, Load)>,
    held: BTreeSet<Bucket>,
}

impl GroupLoads {
    /// Add a sample of `bucket`'s load taken at `now`.
    pub(super) fn sample(&mut self, now: Instant, bucket: Bucket, load: Load, half: HalfLife) {
        let origin = *self.origin.get_or_insert(now);
        let at = now.saturating_duration_since(origin);
        self.samples
            .entry(bucket)
            .and_modify(|s| {
                s.add(load, at, half);
            })
            .or_insert_with(|| Smoothed::first(load, at));
    }

    /// Whether the application ever reported a load in the group (under this membership).
    pub(super) fn reported(&self) -> bool {
        self.published_held.is_some() || !self.samples.is_empty()
    }

    /// Whether the loads are to be looked at now (then not again for [`CHECK_EVERY`]).
    fn check_now(&mut self, now: Instant) -> bool {
        if self.sending.is_some() || !self.reported() || self.next_check.is_some_and(|t| now < t) {
            return false;
        }
        self.next_check = Some(now + CHECK_EVERY);
        true
    }

    /// `bucket`'s smoothed load ([`Load::ZERO`] if none was reported).
    pub(super) fn smoothed(&self, bucket: Bucket) -> Load {
        self.samples.get(&bucket).map_or(Load::ZERO, Smoothed::get)
    }

    /// The publication due now, given the buckets `held` (current generation): the loads
    /// that moved beyond `threshold_percent` (or were never published), and `Some` even with
    /// none when the buckets held changed since the last publication (the work is computed
    /// again from them, P3). Samples of buckets no longer held are forgotten first.
    pub(super) fn due(
        &mut self,
        held: &BTreeSet<Bucket>,
        threshold_percent: u32,
    ) -> Option<Vec<(Bucket, Load)>> {
        if self.sending.is_some() || !self.reported() {
            return None;
        }
        self.samples.retain(|b, _| held.contains(b));
        self.published.retain(|b, _| held.contains(b));
        let total: u64 = self.samples.values().map(|s| s.get().micros()).sum();
        let mean = Load::from_micros(total / (held.len().max(1) as u64));
        let moved: Vec<(Bucket, Load)> = self
            .samples
            .iter()
            .map(|(&b, s)| (b, s.get()))
            .filter(|&(b, now)| {
                worth_publishing(
                    self.published.get(&b).copied(),
                    now,
                    mean,
                    threshold_percent,
                )
            })
            .collect();
        if moved.is_empty() && self.published_held.as_ref() == Some(held) {
            return None;
        }
        self.sending = Some(Sending {
            loads: moved.clone(),
            held: held.clone(),
        });
        Some(moved)
    }

    /// The publication in flight was answered: `ok` if the store recorded it.
    pub(super) fn answered(&mut self, ok: bool) {
        if let Some(Sending { loads, held }) = self.sending.take()
            && ok
        {
            self.published.extend(loads);
            self.published_held = Some(held);
        }
    }

    /// A new membership (a new session, a join): the store keeps loads on the buckets, but
    /// the node's work is published again once it holds anything.
    pub(super) fn rejoined(&mut self) {
        self.published_held = None;
        self.sending = None;
        self.published.clear();
    }
}

/// What a group's tick does for balance: the buckets to shed, how many to claim in claim
/// order, and which to claim by name.
pub(super) struct Moves {
    pub(super) shed: Vec<Bucket>,
    pub(super) claim: u32,
    pub(super) claim_named: Vec<Bucket>,
}

/// `node`'s moves in a group on `view`, keeping `keeping` with the loads in `loads`: by load
/// once a bucket has one, else exactly the count-fair policy's.
pub(super) fn moves(
    loads: &GroupLoads,
    view: &GroupView,
    node: NodeId,
    keeping: &[Bucket],
    config: BalanceConfig,
) -> Moves {
    let mine: Vec<(Bucket, Load)> = keeping.iter().map(|&b| (b, loads.smoothed(b))).collect();
    match balance::plan_loads(view, node, &mine, config) {
        Balance::Count(plan) => Moves {
            shed: plan.shed,
            claim: plan.claim,
            claim_named: Vec::new(),
        },
        Balance::Load(plan) => Moves {
            shed: plan.shed,
            claim: plan.claim_any,
            claim_named: plan.claim,
        },
    }
}

impl Machine {
    /// The next publication of loads: a group's whose loads moved, or whose buckets changed
    /// since its last one, once the node is a member there and the group is between ticks.
    pub(super) fn load_call(&mut self, now: Instant) -> Option<Output> {
        let session = self.session?;
        if self.winding_up() || !self.trusted(now) {
            return None;
        }
        let threshold = self.rules.loads.publish_threshold_percent;
        let (i, loads) = self.groups.iter_mut().enumerate().find_map(|(i, g)| {
            if !g.member || g.removing.is_some() || !g.is_idle() || !g.loads.check_now(now) {
                return None;
            }
            let held: BTreeSet<Bucket> = g
                .held
                .keys()
                .copied()
                .filter(|b| !g.draining.contains(b))
                .collect();
            g.loads.due(&held, threshold).map(|loads| (i, loads))
        })?;
        let call = StoreCall::PublishLoads {
            group: self.groups[i].name.clone(),
            node: self.rules.node,
            session,
            loads,
        };
        Some(self.call(now, call))
    }

    /// The answer to a publication of group `i`.
    pub(super) fn on_loads_published(
        &mut self,
        now: Instant,
        i: usize,
        result: Result<u32, StoreError>,
    ) {
        self.groups[i].loads.answered(result.is_ok());
        match result {
            Ok(_) => {}
            // The membership or the session ended: the next one publishes again.
            Err(StoreError::SessionExpired { .. }) => self.groups[i].loads.rejoined(),
            // Loads only steer the policy: a publication the store refused costs the group
            // nothing but the report; a transient failure backs off as any call does.
            Err(e) if e.is_transient() => {
                self.on_store_error(now, Some(i), Operation::PublishLoads, e);
            }
            Err(source) => self.reports.push_back(Report::Error {
                group: Some(self.groups[i].name.clone()),
                error: WorkerError::Store {
                    operation: Operation::PublishLoads,
                    source,
                },
            }),
        }
    }
}
