//! Running one operation on a store, as a process would: each process's memory of the session
//! and the views it was last given ([`Sessions`], [`Views`]) and [`apply_to_store`], which
//! both the model and every store under test answer through.

use std::collections::BTreeMap;

use lease_core::{
    Bucket, FencingToken, GroupBeat, GroupName, GroupStamp, Heartbeat, LeaseStore, Load,
    MemberMetadata, SessionId, StoreError, Takeover, Ttl, ViewStamp,
};
use uuid::Uuid;

use super::{Op, Outcome, group, incarnation, shards, worker};

/// The session each process last got from a heartbeat: what it names in joins, claims,
/// releases and leaves.
#[derive(Clone, Debug, Default)]
pub struct Sessions(BTreeMap<(usize, usize), SessionId>);

impl Sessions {
    /// The session of `process` of `worker`, or a never-used id if it has none.
    fn of(&self, worker: usize, process: usize) -> SessionId {
        self.0
            .get(&(worker, process))
            .copied()
            .unwrap_or_else(|| SessionId::from_uuid(Uuid::nil()))
    }

    fn learn(&mut self, worker: usize, process: usize, session: SessionId) {
        self.0.insert((worker, process), session);
    }

    /// The process handed its session over (HO1): it makes no more calls under it.
    fn forget(&mut self, worker: usize, process: usize) {
        self.0.remove(&(worker, process));
    }
}

/// The views each process was last given, per group, with their stamps: handed in with its
/// next heartbeat, and what an `unchanged` answer stands for.
#[derive(Clone, Debug, Default)]
pub struct Views(BTreeMap<(usize, usize), BTreeMap<GroupName, GroupBeat>>);

impl Views {
    /// The stamps `process` of `worker` hands in.
    fn seen(&self, worker: usize, process: usize) -> Vec<GroupStamp> {
        self.0
            .get(&(worker, process))
            .map(|views| {
                views
                    .values()
                    .map(|v| GroupStamp {
                        group: v.group.clone(),
                        stamp: v.stamp,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Make `hb` whole: each group answered unchanged gets the view last given (its leases
    /// now expiring with the session); remember every view given. Stamps are then cleared,
    /// as they are the store's own. Panics on an `unchanged` for a view never given.
    fn expand(&mut self, worker: usize, process: usize, hb: &mut Heartbeat) {
        let views = self.0.entry((worker, process)).or_default();
        if hb.new_session {
            views.clear();
        }
        let mut whole: BTreeMap<GroupName, GroupBeat> = BTreeMap::new();
        for given in &hb.groups {
            whole.insert(given.group.clone(), given.clone());
        }
        for u in &hb.unchanged {
            let mut last = views.get(&u.group).cloned().unwrap_or_else(|| {
                panic!("{:?} answered unchanged but never given before", u.group)
            });
            for l in &mut last.owned {
                l.expires_at = hb.expires_at;
            }
            last.stamp = u.stamp;
            whole.insert(u.group.clone(), last);
        }
        *views = whole.clone();
        hb.groups = whole
            .into_values()
            .map(|mut g| {
                g.stamp = ViewStamp::default();
                g
            })
            .collect();
        hb.unchanged.clear();
    }
}

fn ttl(ms: u64) -> Ttl {
    Ttl::from_millis(ms).expect("generated ttls are valid")
}

fn failed(e: &StoreError) -> Outcome {
    Outcome::Failed(format!("{:?}: {e}", e.kind()))
}

fn outcome<T>(r: Result<T, StoreError>, ok: impl FnOnce(T) -> Outcome) -> Outcome {
    match r {
        Ok(v) => ok(v),
        Err(e) => failed(&e),
    }
}

/// Apply `op` to a store (clock moves are the caller's business); `sessions` and `views` are
/// the processes' memory of their sessions and views on this store. A heartbeat's outcome is
/// made whole: each group answered unchanged counts as the view [`Views`] last recorded for
/// that process, so a wrong "unchanged" differs from the model.
pub async fn apply_to_store(
    store: &dyn LeaseStore,
    sessions: &mut Sessions,
    views: &mut Views,
    op: &Op,
) -> Outcome {
    let meta = MemberMetadata::empty();
    match *op {
        Op::Ensure {
            group: g,
            shards: n,
        } => outcome(store.ensure_group(&group(g), shards(n)).await, |()| {
            Outcome::Done
        }),
        Op::Heartbeat {
            worker: w,
            process: p,
            ttl_ms,
        } => {
            let seen = views.seen(w, p);
            let mut r = store
                .heartbeat(worker(w), incarnation(w, p), ttl(ttl_ms), &meta, &seen)
                .await;
            if let Ok(hb) = &mut r {
                sessions.learn(w, p, hb.session);
                views.expand(w, p, hb);
            }
            outcome(r, Outcome::Heartbeat)
        }
        Op::Join {
            group: g,
            worker: w,
            process: p,
        } => outcome(
            store.join(&group(g), worker(w), sessions.of(w, p)).await,
            |()| Outcome::Done,
        ),
        Op::Nodes => outcome(store.nodes().await, Outcome::Nodes),
        Op::Tick {
            group: g,
            worker: w,
            process: p,
            ttl_ms,
            want,
        } => {
            let beat = Box::pin(apply_to_store(
                store,
                sessions,
                views,
                &Op::Heartbeat {
                    worker: w,
                    process: p,
                    ttl_ms,
                },
            ))
            .await;
            let join = match &beat {
                Outcome::Heartbeat(hb) if !hb.is_member(&group(g)) => Some(Box::new(
                    Box::pin(apply_to_store(
                        store,
                        sessions,
                        views,
                        &Op::Join {
                            group: g,
                            worker: w,
                            process: p,
                        },
                    ))
                    .await,
                )),
                _ => None,
            };
            let joined = matches!(beat, Outcome::Heartbeat(_))
                && join.as_deref().is_none_or(|j| *j == Outcome::Done);
            let claim = if joined {
                let session = sessions.of(w, p);
                Some(Box::new(outcome(
                    store
                        .claim(&group(g), worker(w), session, want, Takeover::Allowed)
                        .await,
                    Outcome::Leases,
                )))
            } else {
                None
            };
            Outcome::Tick(Box::new(beat), join, claim)
        }
        Op::Claim {
            group: g,
            worker: w,
            process: p,
            want,
            takeover,
        } => outcome(
            store
                .claim(&group(g), worker(w), sessions.of(w, p), want, takeover)
                .await,
            Outcome::Leases,
        ),
        Op::ClaimBuckets {
            group: g,
            worker: w,
            process: p,
            ref buckets,
            takeover,
        } => {
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            outcome(
                store
                    .claim_buckets(&group(g), worker(w), sessions.of(w, p), &bs, takeover)
                    .await,
                Outcome::Leases,
            )
        }
        Op::PublishLoads {
            group: g,
            worker: w,
            process: p,
            ref loads,
        } => {
            let loads: Vec<(Bucket, Load)> = loads
                .iter()
                .map(|&(b, units)| (Bucket(b), Load::from_micros(units * 1_000_000)))
                .collect();
            outcome(
                store
                    .publish_loads(&group(g), worker(w), sessions.of(w, p), &loads)
                    .await,
                Outcome::Recorded,
            )
        }
        Op::Release {
            group: g,
            worker: w,
            process: p,
            ref buckets,
        } => {
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            outcome(
                store
                    .release(&group(g), worker(w), sessions.of(w, p), &bs)
                    .await,
                Outcome::Buckets,
            )
        }
        Op::Leave {
            group: g,
            worker: w,
            process,
        } => {
            let left = match process.map(|p| sessions.of(w, p)) {
                Some(session) => store.leave(&group(g), worker(w), session).await,
                None => store.evict(&group(g), worker(w)).await,
            };
            outcome(left, Outcome::Buckets)
        }
        Op::Snapshot { group: g } => outcome(store.snapshot(&group(g)).await, Outcome::Snapshot),
        Op::IsCurrent {
            group: g,
            bucket,
            worker: w,
            token,
        } => outcome(
            store
                .is_current(&group(g), Bucket(bucket), worker(w), FencingToken(token))
                .await,
            Outcome::Bool,
        ),
        Op::Resize { group: g, from, to } => outcome(
            store.resize(&group(g), shards(from), shards(to)).await,
            Outcome::Resized,
        ),
        Op::Advance { .. } => Outcome::Done,
        Op::Control {
            group: g,
            worker: w,
            weight,
            mode,
        } => outcome(
            store
                .control(&group(g), worker(w), Op::member_control(weight, mode))
                .await,
            |()| Outcome::Done,
        ),
        Op::Quarantine {
            group: g,
            bucket,
            ms,
            reason,
        } => outcome(
            store
                .quarantine_with_reason(
                    &group(g),
                    Bucket(bucket),
                    Op::quarantine_for(ms),
                    Op::quarantine_reason(bucket, ms, reason),
                )
                .await,
            |()| Outcome::Done,
        ),
        Op::History { group: g, bucket } => outcome(
            store.history(&group(g), Bucket(bucket)).await,
            Outcome::History,
        ),
        Op::HandOver {
            worker: w,
            process: p,
            keep_ms,
        } => {
            let r = store
                .hand_over(worker(w), incarnation(w, p), ttl(keep_ms))
                .await;
            if matches!(r, Ok(Some(_))) {
                sessions.forget(w, p);
            }
            outcome(r, Outcome::HandedOver)
        }
    }
}
