//! The reference side of the differential test: the model with its clock, run through the
//! same [`apply_to_store`] as the stores, and the state machine proptest drives it with.

use std::fmt;
use std::time::Duration;

use futures_util::FutureExt;
use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;

use lease_core::{Clock, ManualClock, ResizeOutcome, Timestamp};

use super::{
    Op, Outcome, Reach, SHARD_COUNTS, SessionNames, Sessions, Views, apply_to_store, group,
    op_strategy, shards, won,
};
use crate::model::{Model, ModelStore};

/// The reference side: the model (with its clock) and the outcome of the last operation.
#[derive(Clone)]
pub struct Reference {
    /// The model, as a store, at its clock's time.
    pub model: ModelStore,
    /// The shard count of each group of [`GROUPS`](super::GROUPS), created before the first
    /// operation.
    pub shard_counts: [u32; 2],
    /// The last operation's outcome, normalized.
    pub last: Option<Outcome>,
    /// The risky states the sequence reached so far.
    pub reach: Reach,
    /// Every `(group, bucket, token, worker)` a claim has issued.
    pub(super) issued: Vec<(usize, u32, i64, usize)>,
    sessions: Sessions,
    views: Views,
    names: SessionNames,
}

impl Reference {
    /// The model's time.
    pub fn now(&self) -> Timestamp {
        self.model.clock().now()
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Shrunk failures print the op sequence; the model's internals would only bury it.
        f.debug_struct("Reference")
            .field("now", &self.now())
            .field("shard_counts", &self.shard_counts)
            .finish()
    }
}

/// The reference state machine of the differential test.
pub struct ReferenceModel;

impl ReferenceStateMachine for ReferenceModel {
    type State = Reference;
    type Transition = Op;

    fn init_state() -> BoxedStrategy<Reference> {
        let count = prop::sample::select(SHARD_COUNTS.to_vec());
        (count.clone(), count)
            .prop_map(|(a, b)| {
                let mut model = Model::new();
                for (i, n) in [a, b].into_iter().enumerate() {
                    model
                        .ensure_group(&group(i), shards(n))
                        .expect("a new group is created");
                }
                Reference {
                    model: ModelStore::new(model, ManualClock::new()),
                    shard_counts: [a, b],
                    last: None,
                    reach: Reach::default(),
                    issued: Vec::new(),
                    sessions: Sessions::default(),
                    views: Views::default(),
                    names: SessionNames::default(),
                }
            })
            .boxed()
    }

    fn transitions(state: &Reference) -> BoxedStrategy<Op> {
        op_strategy(state)
    }

    fn apply(mut state: Reference, op: &Op) -> Reference {
        if let Op::Advance { ms } = op {
            state.model.clock().advance(Duration::from_millis(*ms));
        }
        let before = state.model.model();
        let mut out = apply_to_store(&state.model, &mut state.sessions, &mut state.views, op)
            .now_or_never()
            .expect("the model answers at once");
        state.reach.count(&before, op, &out, state.now());
        if let (Op::Resize { group, to, .. }, Outcome::Resized(ResizeOutcome::Started { .. })) =
            (op, &out)
        {
            state.shard_counts[*group] = *to;
        }
        if let Op::Tick { group, worker, .. }
        | Op::Claim { group, worker, .. }
        | Op::ClaimBuckets { group, worker, .. } = op
        {
            let (g, w) = (*group, *worker);
            state
                .issued
                .extend(won(&out).iter().map(|l| (g, l.bucket.0, l.token.0, w)));
        }
        state.names.normalize(&mut out);
        state.last = Some(out);
        state
    }
}
