//! `leasectl status --group G --why BUCKET`: one paragraph on why a bucket is where it is,
//! from what the store holds: its owner and since when (the open tenure of its history), its
//! last moves with how each ended, and what the policy makes the members do next, computed
//! the way every worker computes it (`lease::policy::plan` on the group's view).

use lease::balance::{self, Balance, BalanceConfig};
use lease::policy;
use lease::store::resize as keys;
use lease::store::{
    BucketInfo, BucketState, EndReason, GroupSnapshot, GroupView, MemberMode, TENURES_KEPT, Tenure,
    Timestamp,
};
use lease::{Bucket, Load, NodeId};
use serde_json::{Value, json};

use crate::common::rfc3339;
use crate::resize::bucket_list;

/// Where the explanation's lines break.
const WIDTH: usize = 96;

/// The explanation of one bucket.
#[derive(Debug)]
pub struct Why {
    /// The paragraph, unwrapped.
    pub paragraph: String,
    /// What the policy makes the members do next, as said in the paragraph's last sentences.
    pub next: String,
}

impl Why {
    /// The paragraph, broken into lines of at most [`WIDTH`] columns, ending with a newline.
    pub fn text(&self) -> String {
        let mut text = wrap(&self.paragraph, WIDTH);
        text.push('\n');
        text
    }
}

/// Explain `bucket` of `snap`'s group from the snapshot and the bucket's `history`; `None` if
/// the snapshot has no such bucket (a resize between the two reads).
pub fn explain(snap: &GroupSnapshot, bucket: Bucket, history: &[Tenure]) -> Option<Why> {
    let info = snap.buckets.get(bucket.get() as usize)?;
    let at = snap.observed_at;
    let mut out = vec![place(snap, info, history)];
    // The current tenure is told by `place`; the moves are the ones before it.
    let earlier = match current(Some(info), history) {
        Some(_) => &history[..history.len() - 1],
        None => history,
    };
    out.push(moves(earlier, info.owner.is_some(), at));
    if let Some(until) = info.quarantined_until {
        out.push(format!(
            "It is under quarantine until {} (in {}): nobody may claim it before then, unless \
             `leasectl unquarantine` lifts it.{}",
            rfc3339(until),
            span(until - at),
            info.quarantine_reason
                .as_ref()
                .map_or_else(String::new, |r| format!(
                    " The quarantine's reason: {:?}.",
                    r.as_str()
                ))
        ));
    }
    let next = next(snap, info, history);
    out.push(next.clone());
    Some(Why {
        paragraph: out.join(" "),
        next,
    })
}

/// The explanation as JSON: the facts and the sentences.
pub fn json(snap: &GroupSnapshot, bucket: Bucket, history: &[Tenure], why: &Why) -> Value {
    let info = snap.buckets.get(bucket.get() as usize);
    json!({
        "group": snap.group.as_str(),
        "bucket": bucket.get(),
        "observed_at": rfc3339(snap.observed_at),
        "state": info.map(|b| b.state.as_str()),
        "owner": info.and_then(|b| b.owner).map(|w| w.to_string()),
        "token": info.map(|b| b.token.get()),
        "since": current(info, history).map(|t| rfc3339(t.began_at)),
        "quarantined_until": info.and_then(|b| b.quarantined_until).map(rfc3339),
        "quarantine_reason": info
            .and_then(|b| b.quarantine_reason.as_ref())
            .map(|r| r.as_str()),
        "load": info.map(|b| b.load.as_f64()),
        "history": history.iter().map(|t| json!({
            "owner": t.owner.to_string(),
            "token": t.token.get(),
            "began_at": rfc3339(t.began_at),
            "ended_at": t.ended.map(|e| rfc3339(e.at)),
            "reason": t.ended.map(|e| e.reason.as_str()),
        })).collect::<Vec<_>>(),
        "next": why.next,
        "why": why.paragraph,
    })
}

/// The tenure the bucket's recorded owner holds it by: the last one, if it is open and of the
/// recorded owner and token.
fn current<'h>(info: Option<&BucketInfo>, history: &'h [Tenure]) -> Option<&'h Tenure> {
    let info = info?;
    history
        .last()
        .filter(|t| t.ended.is_none() && Some(t.owner) == info.owner && t.token == info.token)
}

/// Who holds it and since when.
fn place(snap: &GroupSnapshot, info: &BucketInfo, history: &[Tenure]) -> String {
    let at = snap.observed_at;
    let name = format!("Bucket {} of {}", info.bucket, snap.group.as_str());
    let since = match current(Some(info), history) {
        Some(t) => format!(
            " since {} ({} ago, token {})",
            rfc3339(t.began_at),
            span(at - t.began_at),
            t.token.get()
        ),
        None => format!(
            " with token {}, since before its recorded history",
            info.token.get()
        ),
    };
    match (info.state, info.owner) {
        (BucketState::Live, Some(w)) => format!(
            "{name} is owned by {w}{since}; its session expires in {}.",
            info.expires_at
                .map_or_else(|| "an unknown time".to_owned(), |e| span(e - at))
        ),
        (_, Some(w)) => format!(
            "{name} is still recorded to {w}{since}, but that session is not live{}: {}.",
            info.expires_at.map_or_else(String::new, |e| format!(
                " (it expired {} ago)",
                span(at - e)
            )),
            if info.quarantined_until.is_some() {
                "a member may take it over once its quarantine is over"
            } else {
                "any member may take it over"
            }
        ),
        _ => format!("{name} is unowned."),
    }
}

/// The ended tenures, oldest first (`owned`: the bucket has a recorded owner now).
fn moves(history: &[Tenure], owned: bool, at: Timestamp) -> String {
    if history.is_empty() {
        let what = if owned {
            "No earlier holder"
        } else {
            "No claim of it"
        };
        return format!(
            "{what} is recorded (the store keeps the last {TENURES_KEPT} claims of a bucket \
             since the group's last resize)."
        );
    }
    let each: Vec<String> = history
        .iter()
        .map(|t| {
            let held = format!(
                "{} held it from {} ({} ago, token {})",
                t.owner,
                rfc3339(t.began_at),
                span(at - t.began_at),
                t.token.get()
            );
            match t.ended {
                None => format!("{held}, with no recorded end"),
                Some(e) => format!("{held} until {}, {}", ago(e.at, at), ended(e.reason)),
            }
        })
        .collect();
    let before = if owned { "Before that" } else { "Its moves" };
    format!("{before}: {}.", each.join("; "))
}

/// How a tenure ended, in words.
fn ended(reason: EndReason) -> &'static str {
    match reason {
        EndReason::Released => "released (shed to balance the group, or at weight 0)",
        EndReason::Drained => "released while an operator drained its worker",
        EndReason::Quarantined => "released because it was under quarantine",
        EndReason::Left => "released when its worker left the group",
        EndReason::Evicted => "released when an operator evicted its worker",
        EndReason::Expired => "taken by the next claim after its worker's session expired",
        _ => reason.as_str(),
    }
}

/// What the policy makes the members do next about the bucket.
fn next(snap: &GroupSnapshot, info: &BucketInfo, history: &[Tenure]) -> String {
    let view = snap.view();
    if info.state == BucketState::Live
        && let Some(w) = info.owner
    {
        if info.quarantined_until.is_some() {
            return format!(
                "Next: {w}'s next heartbeat lists it as quarantined, so {w} revokes it (reason \
                 quarantined) and releases it."
            );
        }
        let member = view.members.iter().find(|m| m.worker == w);
        let Some(member) = member else {
            return format!("Next: {w} is not a live member any more; the bucket waits for it.");
        };
        let held = planned_with(snap, w);
        if member.mode == MemberMode::Active
            && member.weight > 0
            && let Some(said) = load_next(snap, &view, info, w, &held, history)
        {
            return said;
        }
        let plan = policy::plan(&view, w, &held);
        // The worker's own rule: an operator's drain, or weight 0, is why it sheds.
        let reason = if member.weight == 0 {
            "drained"
        } else {
            "shed"
        };
        return match member.mode {
            MemberMode::Draining => format!(
                "Next: {w} is draining, so it revokes every bucket it holds, this one included \
                 (reason drained), and releases them for the others."
            ),
            MemberMode::Cordoned => format!(
                "Next: {w} is cordoned: it keeps this bucket (and the {} others it holds) and \
                 claims no more.",
                held.len().saturating_sub(1)
            ),
            _ if plan.shed.contains(&info.bucket) => format!(
                "Next: {w} holds {}, above its target of {} (weight {}), and sheds its \
                 highest-numbered excess, this bucket included (reason {reason}); then {}.",
                held.len(),
                plan.target,
                member.weight,
                claimers(snap, info, history)
            ),
            _ if !plan.shed.is_empty() => format!(
                "Next: {w} holds {}, above its target of {} (weight {}), and sheds {} of its \
                 highest-numbered buckets ({}), not this one: it stays with {w}.",
                held.len(),
                plan.target,
                member.weight,
                plan.shed.len(),
                bucket_list(&sorted(&plan.shed))
            ),
            _ => format!(
                "Next: it stays with {w}, which holds {} with a target of {} (weight {}){}.",
                held.len(),
                plan.target,
                member.weight,
                if plan.claim > 0 {
                    format!(" and claims {} more", plan.claim)
                } else {
                    String::new()
                }
            ),
        };
    }
    // Both hold a bucket back, each until its own end: a quarantine, and during a resize the
    // old buckets sharing its keys.
    let waits = waits_for(snap, info);
    let resize = (!waits.is_empty()).then(|| {
        format!(
            "old bucket(s) {} of the resize from {} are retired (released, or their owners' \
             sessions ended)",
            bucket_list(&waits),
            snap.previous.map_or(0, |p| p.get())
        )
    });
    match (info.quarantined_until, resize) {
        (Some(until), Some(resize)) => format!(
            "Next: nobody claims it before {}, nor until {resize}; then {}.",
            rfc3339(until),
            claimers(snap, info, history)
        ),
        (Some(until), None) => format!(
            "Next: nobody claims it before {}; then {}.",
            rfc3339(until),
            claimers(snap, info, history)
        ),
        (None, Some(resize)) => format!("Next: it cannot be claimed until {resize}."),
        (None, None) => format!("Next: {}.", claimers(snap, info, history)),
    }
}

/// What the load-aware policy makes the owner `w` of a live bucket do about it, once the
/// group has loads (`None` before: the count-fair policy says it).
fn load_next(
    snap: &GroupSnapshot,
    view: &GroupView,
    info: &BucketInfo,
    w: NodeId,
    held: &[Bucket],
    history: &[Tenure],
) -> Option<String> {
    if !snap.buckets.iter().any(|b| b.load > Load::ZERO) {
        return None;
    }
    let mine: Vec<(Bucket, Load)> = held.iter().map(|&b| (b, load_of(snap, b))).collect();
    let Balance::Load(plan) = balance::plan_loads(view, w, &mine, BalanceConfig::default()) else {
        return None;
    };
    let work: u64 = mine.iter().map(|(_, l)| l.micros()).sum();
    let (work, target, load) = (units(work), units(plan.target), units(info.load.micros()));
    Some(if plan.shed.contains(&info.bucket) {
        format!(
            "Next: {w} works {work} (the loads recorded on its buckets), above its load target \
             of {target} by more than the band, and sheds the hottest buckets that fit in its \
             excess, this one included (load {load}; reason shed); then {}.",
            claimers(snap, info, history)
        )
    } else if plan.isolated && mine.iter().all(|&(_, l)| l <= info.load) {
        format!(
            "Next: it stays with {w}: its load {load} alone is above a fair share, so {w} \
             keeps it (isolated) and gives up its other buckets."
        )
    } else if !plan.shed.is_empty() {
        format!(
            "Next: {w} works {work}, above its load target of {target} by more than the band, \
             and sheds bucket(s) {}, not this one: it stays with {w}.",
            bucket_list(&sorted(&plan.shed))
        )
    } else {
        format!(
            "Next: it stays with {w} (load {load}), whose work {work} is within the band of its \
             load target of {target}."
        )
    })
}

/// The load recorded on `bucket` of the current generation.
fn load_of(snap: &GroupSnapshot, bucket: Bucket) -> Load {
    snap.buckets
        .get(bucket.0 as usize)
        .map_or(Load::ZERO, |b| b.load)
}

/// Millionths as `status` shows them.
fn units(micros: u64) -> String {
    crate::status::shown(crate::status::units(micros))
}

/// Who claims the bucket next once it is claimable, by the policy's room: a clause.
fn claimers(snap: &GroupSnapshot, info: &BucketInfo, history: &[Tenure]) -> String {
    if info.load > Load::ZERO && info.quarantined_until.is_none() {
        // By load: the member whose plan names it (claimable buckets go hottest first to the
        // member furthest below its load target).
        let mut view = snap.view();
        if info.state == BucketState::Live {
            // Told for once its owner released it.
            view.loaded.push((info.bucket, info.load));
            view.loaded = lease::store::list_loaded(view.loaded.iter().copied());
        }
        let named = view.members.iter().find_map(|m| {
            let held = planned_with(snap, m.worker);
            let mine: Vec<(Bucket, Load)> = held.iter().map(|&b| (b, load_of(snap, b))).collect();
            match balance::plan_loads(&view, m.worker, &mine, BalanceConfig::default()) {
                Balance::Load(p) if p.claim.contains(&info.bucket) => Some(m.worker),
                _ => None,
            }
        });
        if let Some(w) = named {
            return format!(
                "{w} claims it by name at its next tick (load {}): the claimable buckets go \
                 hottest first to the members furthest below their load targets",
                units(info.load.micros())
            );
        }
    }
    let mut view = snap.view();
    if info.quarantined_until.is_some() {
        // Told for when the quarantine is over: the bucket is shared again then.
        view.quarantined = view.quarantined.saturating_sub(1);
        view.claimable += 1;
    }
    if view.members.is_empty() {
        return "no member is live, so the first worker to join claims it".to_owned();
    }
    let room: Vec<(NodeId, u32)> = view
        .members
        .iter()
        .filter(|m| Some(m.worker) != info.owner || info.state != BucketState::Live)
        .filter_map(|m| {
            let held = planned_with(snap, m.worker);
            let plan = policy::plan(&view, m.worker, &held);
            // Once this bucket is free, every member short of its target may take it.
            let short = plan.target.saturating_sub(held.len() as u32);
            (short > 0).then_some((m.worker, short))
        })
        .collect();
    let last = history.last().map(|t| t.owner);
    if let Some(&(w, _)) = room.iter().find(|(w, _)| Some(*w) == last) {
        return format!(
            "{w} held it last and has room, so its next claim takes it first (sticky claims)"
        );
    }
    match room.as_slice() {
        [] => "no live member has room for it (each holds its target), so it stays unowned \
               until a member joins, a weight changes or a cordoned member is uncordoned"
            .to_owned(),
        [(w, n)] => format!("{w} has room for {n} more and claims it at its next tick"),
        many => format!(
            "{} have room; one of them claims it at its next tick",
            many.iter()
                .map(|(w, n)| format!("{w} ({n} more)"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// What member `w` plans with, as its worker does: the buckets it holds, less the quarantined
/// ones it is letting go anyway.
fn planned_with(snap: &GroupSnapshot, w: NodeId) -> Vec<Bucket> {
    snap.buckets
        .iter()
        .filter(|b| b.state == BucketState::Live && b.owner == Some(w))
        .filter(|b| b.quarantined_until.is_none())
        .map(|b| b.bucket)
        .collect()
}

/// The old buckets a new bucket still waits for while a resize drains.
fn waits_for(snap: &GroupSnapshot, info: &BucketInfo) -> Vec<Bucket> {
    let Some(previous) = snap.previous.filter(|_| !snap.draining.is_empty()) else {
        return Vec::new();
    };
    keys::parents(previous, snap.shard_count, info.bucket)
        .into_iter()
        .filter(|p| {
            snap.draining
                .get(p.get() as usize)
                .is_some_and(|d| d.state == BucketState::Live)
        })
        .collect()
}

fn sorted(buckets: &[Bucket]) -> Vec<Bucket> {
    let mut v = buckets.to_vec();
    v.sort_unstable();
    v
}

/// A time and how long before `at` it was.
fn ago(t: Timestamp, at: Timestamp) -> String {
    format!("{} ({} ago)", rfc3339(t), span(at - t))
}

/// A duration as seconds with one decimal, or minutes/hours when long.
fn span(d: chrono::TimeDelta) -> String {
    let ms = d.num_milliseconds().max(0);
    if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1_000.0)
    } else if ms < 3_600_000 {
        format!("{}m{:02}s", ms / 60_000, ms % 60_000 / 1_000)
    } else {
        format!("{}h{:02}m", ms / 3_600_000, ms % 3_600_000 / 60_000)
    }
}

/// `text` broken at spaces into lines of at most `width` columns (a longer word stays whole).
fn wrap(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = 0usize;
    for word in text.split_whitespace() {
        let len = word.chars().count();
        if line > 0 && line + 1 + len > width {
            out.push('\n');
            line = 0;
        } else if line > 0 {
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += len;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use lease::memory::MemoryLeaseStore;
    use lease::store::{
        AdminStore, Incarnation, ManualClock, MemberControl, QuarantineFor, SessionId, Takeover,
        WorkerStore,
    };
    use lease::{GroupName, MemberMetadata, ShardCount, Ttl};

    use super::*;

    struct Group {
        store: MemoryLeaseStore,
        clock: ManualClock,
        name: GroupName,
    }

    /// Workers in id order, so the policy's ties are known.
    fn workers() -> (NodeId, NodeId) {
        (
            NodeId::from_uuid(uuid::Uuid::from_u128(0xA)),
            NodeId::from_uuid(uuid::Uuid::from_u128(0xB)),
        )
    }

    impl Group {
        async fn new(shards: u32) -> Self {
            let clock = ManualClock::new();
            let store = MemoryLeaseStore::with_clock(clock.clone());
            let name = GroupName::new("orders").expect("name");
            store
                .ensure_group(&name, ShardCount::new(shards).expect("count"))
                .await
                .expect("ensure");
            Self { store, clock, name }
        }

        async fn beat(&self, w: NodeId) -> SessionId {
            let ttl = Ttl::from_secs(10).expect("ttl");
            let inc = Incarnation::from_uuid(w.as_uuid());
            let meta = MemberMetadata::empty();
            let hb = self
                .store
                .heartbeat(w, inc, ttl, &meta, &[])
                .await
                .expect("heartbeat");
            if hb.group(&self.name).is_none() {
                self.store
                    .join(&self.name, w, hb.session)
                    .await
                    .expect("join");
            }
            hb.session
        }

        async fn claim(&self, w: NodeId, want: u32) {
            let s = self.beat(w).await;
            self.store
                .claim(&self.name, w, s, want, Takeover::Allowed)
                .await
                .expect("claim");
        }

        async fn release(&self, w: NodeId, buckets: &[u32]) {
            let s = self.beat(w).await;
            let bs: Vec<Bucket> = buckets.iter().copied().map(Bucket).collect();
            self.store
                .release(&self.name, w, s, &bs)
                .await
                .expect("release");
        }

        async fn weight(&self, w: NodeId, n: u32) {
            self.store
                .control(
                    &self.name,
                    w,
                    MemberControl::Weight(lease::Weight::new(n).expect("weight")),
                )
                .await
                .expect("weight");
        }

        async fn mode(&self, w: NodeId, m: MemberMode) {
            self.store
                .control(&self.name, w, MemberControl::Mode(m))
                .await
                .expect("control");
        }

        async fn why(&self, b: u32) -> Why {
            let history = self
                .store
                .history(&self.name, Bucket(b))
                .await
                .expect("history");
            let snap = self.store.snapshot(&self.name).await.expect("snapshot");
            let why = explain(&snap, Bucket(b), &history).expect("a bucket of the group");
            // The JSON form carries the same sentences.
            assert_eq!(json(&snap, Bucket(b), &history, &why)["why"], why.paragraph);
            why
        }
    }

    fn has(why: &Why, part: &str) {
        assert!(
            why.paragraph.contains(part),
            "{part:?} not in:\n{}",
            why.text()
        );
    }

    #[test]
    fn spans_read_as_seconds_minutes_or_hours() {
        let ms = chrono::TimeDelta::milliseconds;
        assert_eq!(span(ms(59_949)), "59.9s");
        assert_eq!(span(ms(61_000)), "1m01s");
        assert_eq!(span(ms(7_260_000)), "2h01m");
        assert_eq!(span(ms(-5)), "0.0s");
    }

    #[tokio::test]
    async fn a_bucket_the_owner_sheds_names_who_sheds_and_who_claims() {
        let g = Group::new(4).await;
        let (a, b) = workers();
        g.claim(a, 4).await;
        g.clock.advance(Duration::from_secs(2));
        g.beat(b).await;
        let why = g.why(3).await;
        has(&why, &format!("Bucket 3 of orders is owned by {a} since"));
        has(&why, "(2.0s ago, token 1)");
        has(&why, "No earlier holder is recorded");
        has(&why, "above its target of 2 (weight 1)");
        has(&why, "this bucket included (reason shed)");
        has(&why, &format!("then {b} has room for 2 more"));
        let why = g.why(0).await;
        has(
            &why,
            "sheds 2 of its highest-numbered buckets (2, 3), not this one",
        );
    }

    #[tokio::test]
    async fn the_owner_s_plan_leaves_out_what_it_lets_go_of() {
        let g = Group::new(4).await;
        let (a, b) = workers();
        g.claim(a, 4).await;
        g.beat(b).await;
        let ten = QuarantineFor::new(Duration::from_secs(60)).expect("quarantine");
        g.store
            .quarantine(&g.name, Bucket(1), Some(ten))
            .await
            .expect("quarantine");
        // a plans with 0, 2 and 3 (bucket 1 goes anyway): target 2 of the 3 shared, so it
        // sheds 3 only, as its worker does.
        let why = g.why(2).await;
        has(&why, "holds 3, above its target of 2");
        has(
            &why,
            "sheds 1 of its highest-numbered buckets (3), not this one",
        );
        // At weight 0 the worker revokes with reason drained.
        g.weight(a, 0).await;
        let why = g.why(2).await;
        has(&why, "this bucket included (reason drained)");
        // An owner gone with its session, the bucket under quarantine: nobody takes it yet.
        g.clock.advance(Duration::from_secs(11));
        let why = g.why(1).await;
        has(
            &why,
            "a member may take it over once its quarantine is over",
        );
    }

    #[tokio::test]
    async fn an_expired_owner_and_the_member_with_room_are_named() {
        let g = Group::new(2).await;
        let (a, b) = workers();
        g.claim(a, 2).await;
        g.clock.advance(Duration::from_secs(11));
        g.beat(b).await;
        let why = g.why(1).await;
        has(&why, &format!("is still recorded to {a}"));
        has(&why, "(it expired 1.0s ago)");
        has(&why, "any member may take it over");
        has(&why, &format!("Next: {b} has room for 2 more"));
    }

    #[tokio::test]
    async fn the_moves_say_how_each_tenure_ended() {
        let g = Group::new(2).await;
        let (a, b) = workers();
        g.claim(a, 2).await;
        g.mode(a, MemberMode::Draining).await;
        g.release(a, &[0, 1]).await;
        g.claim(b, 2).await;
        g.clock.advance(Duration::from_secs(11));
        g.mode(a, MemberMode::Active).await;
        g.claim(a, 1).await;
        let why = g.why(0).await;
        has(&why, "released while an operator drained its worker");
        has(
            &why,
            "taken by the next claim after its worker's session expired",
        );
        has(&why, &format!("owned by {a} since"));
        has(&why, "token 3);");
        has(&why, &format!("Before that: {a} held it from"));
        has(
            &why,
            &format!("Next: it stays with {a}, which holds 1 with a target of 2"),
        );
        has(&why, "and claims 1 more");
    }

    #[tokio::test]
    async fn quarantine_and_sticky_claims_are_explained() {
        let g = Group::new(2).await;
        let (a, b) = workers();
        g.claim(a, 2).await;
        g.beat(b).await;
        let ten = QuarantineFor::new(Duration::from_secs(10)).expect("quarantine");
        g.store
            .quarantine(&g.name, Bucket(0), Some(ten))
            .await
            .expect("quarantine");
        let why = g.why(0).await;
        has(&why, "under quarantine until");
        has(&why, "(in 10.0s)");
        has(
            &why,
            &format!("{a}'s next heartbeat lists it as quarantined"),
        );
        g.release(a, &[0]).await;
        let why = g.why(0).await;
        has(&why, "released because it was under quarantine");
        has(&why, "Next: nobody claims it before");
        // Told for when the quarantine is over: two buckets shared again, one each.
        has(&why, &format!("; then {b} has room for 1 more"));
        g.store
            .quarantine(&g.name, Bucket(0), None)
            .await
            .expect("lift");
        // a (target 1, holding 1) has no room; b has: it claims it.
        let why = g.why(0).await;
        has(&why, &format!("Next: {b} has room for 1 more"));
        // With a cordoned b, nobody has room... until a gets it back by sticky claims: a
        // alone shares the 2 buckets.
        g.mode(b, MemberMode::Cordoned).await;
        let why = g.why(0).await;
        has(&why, &format!("Next: {a} held it last and has room"));
        has(&why, "sticky claims");
    }

    /// A new bucket of a resize under quarantine waits for two things, each said: its
    /// quarantine, and the old buckets sharing its keys.
    #[tokio::test]
    async fn a_quarantined_new_bucket_waits_for_its_quarantine_and_its_old_buckets() {
        let g = Group::new(2).await;
        let (a, _) = workers();
        g.claim(a, 2).await;
        let n = |count| ShardCount::new(count).expect("count");
        g.store.resize(&g.name, n(2), n(4)).await.expect("resize");
        let ten = QuarantineFor::new(Duration::from_secs(10)).expect("quarantine");
        g.store
            .quarantine(&g.name, Bucket(3), Some(ten))
            .await
            .expect("quarantine");
        let why = g.why(3).await;
        has(&why, "Next: nobody claims it before");
        has(
            &why,
            "nor until old bucket(s) 1 of the resize from 2 are retired (released, or their \
             owners' sessions ended); then",
        );
        // Without the quarantine, only the old buckets hold it back.
        let why = g.why(2).await;
        has(
            &why,
            "Next: it cannot be claimed until old bucket(s) 0 of the resize from 2 are retired",
        );
    }

    #[tokio::test]
    async fn no_room_and_no_member_are_said() {
        let g = Group::new(2).await;
        let (a, _) = workers();
        let why = g.why(1).await;
        has(&why, "Bucket 1 of orders is unowned.");
        has(&why, "No claim of it is recorded");
        has(
            &why,
            "no member is live, so the first worker to join claims it",
        );
        g.claim(a, 1).await;
        g.weight(a, 0).await;
        let why = g.why(1).await;
        has(&why, "no live member has room for it");
        has(&why, "or a cordoned member is uncordoned");
        assert!(why.text().lines().all(|l| l.chars().count() <= WIDTH));
    }
}
