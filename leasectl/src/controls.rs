//! The operators' controls: `cordon`, `drain`, `uncordon` and `weight` on a member of a group,
//! `quarantine` and `unquarantine` on a bucket. Each is stored in the database, so it works
//! from any host on live workers, survives their restarts, and takes effect at each member's
//! next heartbeat (at once with wake-ups). They work on Postgres and on etcd alike.

use std::time::{Duration, Instant};

use clap::Args;
use lease::store::{
    GroupSnapshot, MAX_WEIGHT, MemberControl, MemberMode, NodesSnapshot, QuarantineFor,
    QuarantineReason,
};
use lease::{Bucket, GroupName, NodeId, Weight};

use crate::common::{DbArgs, Store, group_arg, rfc3339, store_failure};
use crate::output::Failure;
use crate::{duration, output};

/// How often `drain --wait` looks.
const WAIT_POLL: Duration = Duration::from_millis(20);

/// A member of a group: what `cordon`, `drain`, `uncordon` and `weight` act on.
#[derive(Args, Debug)]
pub struct MemberArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group.
    #[arg(long)]
    group: String,
    /// The worker (its UUID, as `status` shows it).
    #[arg(long)]
    worker: String,
}

impl MemberArgs {
    async fn open(&self) -> Result<(Store, GroupName, NodeId), Failure> {
        let group = group_arg(&self.group)?;
        let worker: NodeId = self
            .worker
            .parse()
            .map_err(|e| Failure::Usage(format!("--worker: {e}")))?;
        Ok((self.db.open().await?, group, worker))
    }
}

/// `leasectl drain`'s arguments.
#[derive(Args, Debug)]
pub struct DrainArgs {
    #[command(flatten)]
    member: MemberArgs,
    /// Wait until the worker holds nothing in the group and say how long that took (at most
    /// this long, e.g. `30s`; then exit 1).
    #[arg(long, value_name = "DURATION", value_parser = duration::parse)]
    wait: Option<Duration>,
}

/// `leasectl weight`'s arguments.
#[derive(Args, Debug)]
pub struct WeightArgs {
    #[command(flatten)]
    member: MemberArgs,
    /// The weight: targets are proportional to it (default 1 for every member; 0 asks for
    /// no bucket).
    #[arg(long, value_parser = parse_weight)]
    weight: Weight,
}

/// `leasectl quarantine`'s and `unquarantine`'s arguments.
#[derive(Args, Debug)]
pub struct BucketArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group.
    #[arg(long)]
    group: String,
    /// The bucket.
    #[arg(long)]
    bucket: u32,
}

/// `leasectl quarantine`'s arguments.
#[derive(Args, Debug)]
pub struct QuarantineArgs {
    #[command(flatten)]
    bucket: BucketArgs,
    /// How long, e.g. `5m` (at most a year).
    #[arg(long = "for", value_name = "DURATION", value_parser = parse_quarantine)]
    duration: QuarantineFor,
    /// Why, kept with the quarantine and shown by `status` and `status --why` (1 to 1000
    /// characters).
    #[arg(long, value_parser = parse_reason)]
    reason: Option<QuarantineReason>,
}

/// A `--reason` value.
fn parse_reason(text: &str) -> Result<QuarantineReason, String> {
    QuarantineReason::new(text).map_err(|e| e.to_string())
}

/// A `--weight` value: a whole number from 0 to [`MAX_WEIGHT`]. A number outside that range
/// (`-1`, `99999999999999999999`) is said to be out of range, with the range; anything else is
/// not a whole number.
pub fn parse_weight(text: &str) -> Result<Weight, String> {
    let value = text.trim();
    let unsigned = value.strip_prefix(['-', '+']).unwrap_or(value);
    let number = !unsigned.is_empty() && unsigned.bytes().all(|b| b.is_ascii_digit());
    match value.parse::<Weight>() {
        Ok(weight) => Ok(weight),
        _ if number => Err(format!(
            "weight {value} is out of range; it must be a whole number from 0 to {MAX_WEIGHT}"
        )),
        _ => Err(format!(
            "weight {value:?} is not a whole number; it must be one from 0 to {MAX_WEIGHT}"
        )),
    }
}

fn parse_quarantine(text: &str) -> Result<QuarantineFor, String> {
    QuarantineFor::new(duration::parse(text)?).map_err(|e| e.to_string())
}

/// What the member holds in the group's snapshot, and whether it is live.
fn held(snap: &GroupSnapshot, worker: NodeId) -> Option<(u32, bool)> {
    snap.members
        .iter()
        .find(|m| m.worker == worker)
        .map(|m| (m.owned, m.live))
}

/// Where a member's node is, as the controls' messages say it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodeState {
    /// A process runs it: it heartbeats.
    Live,
    /// Its process stopped and handed the session over to the next process with its id: the
    /// session is live, but nobody heartbeats until such a process takes it over.
    HandedOver,
    /// Its session ended (or it never had one).
    Stopped,
}

impl NodeState {
    /// How `worker` runs, from the group's snapshot and the store's nodes.
    fn of(snap: &GroupSnapshot, nodes: &NodesSnapshot, worker: NodeId) -> Self {
        let live = held(snap, worker).is_some_and(|(_, live)| live);
        let handed_over = nodes
            .nodes
            .iter()
            .any(|n| n.node == worker && n.live && n.handed_over);
        match (live, handed_over) {
            (true, true) => Self::HandedOver,
            (true, false) => Self::Live,
            (false, _) => Self::Stopped,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::HandedOver => "handed over: no process runs it until the next one with its id",
            Self::Stopped => "not running",
        }
    }
}

/// The members of the group, other than `worker`, a process runs that may claim: live, not
/// handed over, active and of weight above 0.
fn claimers(snap: &GroupSnapshot, nodes: &NodesSnapshot, worker: NodeId) -> usize {
    snap.members
        .iter()
        .filter(|m| m.worker != worker && m.live && m.mode == MemberMode::Active && m.weight > 0)
        .filter(|m| NodeState::of(snap, nodes, m.worker) == NodeState::Live)
        .count()
}

/// Set the member's mode and say what it means; the store, group and worker, for a caller
/// that goes on (`drain --wait`).
async fn set_mode(
    args: &MemberArgs,
    mode: MemberMode,
) -> Result<(Store, GroupName, NodeId), Failure> {
    let (store, group, worker) = args.open().await?;
    store
        .control(&group, worker, MemberControl::Mode(mode))
        .await
        .map_err(store_failure)?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    let nodes = store.nodes().await.map_err(store_failure)?;
    let (owned, _) = held(&snap, worker).unwrap_or((0, false));
    let node = NodeState::of(&snap, &nodes, worker);
    let state = node.as_str();
    let g = group.as_str();
    let done = match mode {
        MemberMode::Cordoned => format!(
            "cordoned worker {worker} ({state}) in group {g:?}: it keeps its {owned} bucket(s) \
             and claims no more; the others share the rest. `leasectl uncordon` undoes it."
        ),
        MemberMode::Draining if node == NodeState::HandedOver => format!(
            "draining worker {worker} ({state}) in group {g:?}: the process that takes its \
             session over revokes (reason drained) and releases its {owned} bucket(s), and \
             claims none until `leasectl uncordon`; if none does, they pass on when the \
             hand-over ends."
        ),
        MemberMode::Draining => format!(
            "draining worker {worker} ({state}) in group {g:?}: it revokes (reason drained) and \
             releases its {owned} bucket(s) at its next heartbeat, and claims none until \
             `leasectl uncordon`."
        ),
        _ => format!(
            "uncordoned worker {worker} ({state}) in group {g:?}: it claims its share again at \
             its next heartbeat (it holds {owned} bucket(s) now)."
        ),
    };
    output::line(&done).map_err(|e| e.failure_after(&done))?;
    if mode == MemberMode::Draining && claimers(&snap, &nodes, worker) == 0 {
        output::error_line(format!(
            "leasectl: warning: no other live member of group {g:?} can take its buckets (none \
             is running, active and of weight above 0): they stay unowned until a worker joins \
             the group, or `leasectl uncordon` (or `leasectl weight`) lets a member claim again."
        ));
    }
    Ok((store, group, worker))
}

/// `leasectl cordon`.
pub async fn cordon(args: MemberArgs) -> Result<(), Failure> {
    set_mode(&args, MemberMode::Cordoned).await.map(drop)
}

/// `leasectl uncordon`.
pub async fn uncordon(args: MemberArgs) -> Result<(), Failure> {
    set_mode(&args, MemberMode::Active).await.map(drop)
}

/// `leasectl drain`, and with `--wait` the wait until the worker holds nothing.
pub async fn drain(args: DrainArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let (store, group, worker) = set_mode(&args.member, MemberMode::Draining).await?;
    let Some(limit) = args.wait else {
        return Ok(());
    };
    loop {
        let snap = store.snapshot(&group).await.map_err(store_failure)?;
        let (owned, live) = held(&snap, worker).unwrap_or((0, false));
        let waited = started.elapsed();
        let left_behind = snap
            .buckets
            .iter()
            .filter(|b| b.owner == Some(worker) && b.state != lease::store::BucketState::Unowned)
            .count();
        if !live && left_behind > 0 {
            return Err(Failure::Runtime(format!(
                "worker {worker} is not running: its {left_behind} bucket(s) of group {:?} pass \
                 on when its session expires, not by draining",
                group.as_str()
            )));
        }
        if owned == 0 {
            return output::line(format!(
                "worker {worker} holds nothing in group {:?}: drained in {} ms",
                group.as_str(),
                waited.as_millis()
            ))
            .map_err(|e| e.failure());
        }
        if waited >= limit {
            return Err(Failure::Runtime(format!(
                "worker {worker} still holds {owned} bucket(s) of group {:?} after {}; is it \
                 running? (a stopped worker's buckets pass on when its session expires)",
                group.as_str(),
                duration::show(limit)
            )));
        }
        tokio::time::sleep(WAIT_POLL).await;
    }
}

/// `leasectl weight`.
pub async fn weight(args: WeightArgs) -> Result<(), Failure> {
    let (store, group, worker) = args.member.open().await?;
    store
        .control(&group, worker, MemberControl::Weight(args.weight))
        .await
        .map_err(store_failure)?;
    let done = format!(
        "worker {worker} has weight {} in group {:?}: targets follow at the members' next \
         heartbeats",
        args.weight,
        group.as_str()
    );
    output::line(&done).map_err(|e| e.failure_after(&done))
}

async fn set_quarantine(
    args: &BucketArgs,
    duration: Option<QuarantineFor>,
    reason: Option<QuarantineReason>,
) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let store = args.db.open().await?;
    let bucket = Bucket(args.bucket);
    store
        .quarantine_with_reason(&group, bucket, duration, reason)
        .await
        .map_err(store_failure)?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    let info = snap.buckets.get(bucket.get() as usize);
    let owner = info
        .filter(|b| b.state == lease::store::BucketState::Live)
        .and_then(|b| b.owner);
    let g = group.as_str();
    let done = match (duration, info.and_then(|b| b.quarantined_until)) {
        (Some(d), None) => format!(
            "bucket {bucket} of group {g:?}: its quarantine of {} has already ended.",
            duration::show(d.get())
        ),
        (None, _) => format!(
            "bucket {bucket} of group {g:?} is not under quarantine: {}",
            match owner {
                Some(w) => format!("it stays with its owner {w}."),
                None => "it is claimable again.".to_owned(),
            }
        ),
        (Some(_), Some(until)) => format!(
            "bucket {bucket} of group {g:?} is quarantined until {} (store clock): {} nobody \
             claims it until then or `leasectl unquarantine`.",
            rfc3339(until),
            match owner {
                Some(w) =>
                    format!("its owner {w} revokes it (reason quarantined) at its next heartbeat;"),
                None => "it has no live owner;".to_owned(),
            }
        ),
    };
    output::line(&done).map_err(|e| e.failure_after(&done))
}

/// `leasectl quarantine`.
pub async fn quarantine(args: QuarantineArgs) -> Result<(), Failure> {
    set_quarantine(&args.bucket, Some(args.duration), args.reason).await
}

/// `leasectl unquarantine`.
pub async fn unquarantine(args: BucketArgs) -> Result<(), Failure> {
    set_quarantine(&args, None, None).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A number past the range is out of range, with the range, however large; only what is
    /// no number at all is "not a whole number".
    #[test]
    fn a_weight_out_of_range_says_the_range() {
        assert_eq!(parse_weight("7").map(|w| w.get()), Ok(7));
        assert_eq!(parse_weight(" 0 ").map(|w| w.get()), Ok(0));
        for value in ["99999999999999999999", "1000001", "-1"] {
            let said = parse_weight(value).map(|w| w.get());
            assert_eq!(
                said,
                Err(format!(
                    "weight {value} is out of range; it must be a whole number from 0 to \
                     1000000"
                ))
            );
        }
        for value in ["x", "1.5", "", "-"] {
            let said = parse_weight(value).map(|w| w.get());
            assert!(
                said.as_ref()
                    .is_err_and(|e| e.contains("is not a whole number") && e.contains("0 to")),
                "{value:?}: {said:?}"
            );
        }
    }
}
