//! `leasectl status`: who owns which bucket of a group, the members, and the balance; while
//! a resize drains, the old buckets not retired yet and the new buckets waiting for them.
//! Without `--group` (or with `--nodes`): every node (process) the store knows, its session
//! and the groups it is in.

use clap::Args;
use lease::balance::{self, Balance, BalanceConfig};
use lease::policy;
use lease::store::resize as keys;
use lease::store::{
    AdminStore, BucketInfo, BucketState, GroupSnapshot, LeaseStore, MemberMode, NodeInfo,
    NodesSnapshot, Timestamp,
};
use lease::{Bucket, GroupName, Load, NodeId, ShardCount, StoreError};
use serde_json::{Value, json};

use crate::common::{DbArgs, group_arg, rfc3339, store_failure};
use crate::output;
use crate::output::Failure;
use crate::resize::{PAIRS_LIMIT, bucket_list, json_lists, not_retired, pairs};
use crate::why;

/// Lines of new buckets waiting shown in the text form; the rest are summed up in one line.
const WAITING_SHOWN: usize = 32;

/// `leasectl status`'s arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group to show; without it, the nodes.
    #[arg(long, conflicts_with = "nodes")]
    group: Option<String>,
    /// Show every node (process) the store knows: its session, when it expires, its metadata
    /// and its groups (the default without --group).
    #[arg(long)]
    nodes: bool,
    /// Explain why this bucket of the group is where it is: its owner and since when, its
    /// last moves and how each ended, and what the policy makes the members do next.
    #[arg(long, value_name = "BUCKET", requires = "group")]
    why: Option<u32>,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// Print the group's snapshot, or the nodes.
pub async fn run(args: StatusArgs) -> Result<(), Failure> {
    let Some(group) = &args.group else {
        let store = args.db.open().await?;
        let nodes = store.nodes().await.map_err(store_failure)?;
        if args.json {
            output::line(nodes_json(&nodes))?;
        } else {
            output::text(nodes_table(&nodes))?;
        }
        return Ok(());
    };
    let group = group_arg(group)?;
    let store = args.db.open().await?;
    if let Some(bucket) = args.why {
        return explain(&store, &group, Bucket(bucket), args.json).await;
    }
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    if args.json {
        output::line(status_json(&snap))?;
    } else {
        output::text(status_table(&snap))?;
    }
    Ok(())
}

/// How many times `--why` reads again when the bucket moved while it read.
const WHY_READS: usize = 3;

/// `--why`: the bucket's history read between two snapshots that agree on the bucket (and on
/// the generation), so that the history is of the state explained; read again if the bucket
/// moved meanwhile.
async fn explain(
    store: &dyn LeaseStore,
    group: &GroupName,
    bucket: Bucket,
    json: bool,
) -> Result<(), Failure> {
    let place = |snap: &GroupSnapshot| {
        let b = snap.buckets.get(bucket.get() as usize);
        (
            snap.generation,
            b.map(|b| (b.owner, b.session, b.token, b.state)),
        )
    };
    let mut reads = 0;
    let (snap, history) = loop {
        let before = store.snapshot(group).await.map_err(store_failure)?;
        let history = store.history(group, bucket).await.map_err(|e| match e {
            StoreError::BucketOutOfRange { shard_count, .. } => Failure::Usage(format!(
                "--why: group {:?} has buckets 0 to {}, not {bucket}",
                group.as_str(),
                shard_count.get() - 1
            )),
            other => store_failure(other),
        })?;
        let after = store.snapshot(group).await.map_err(store_failure)?;
        reads += 1;
        if place(&before) == place(&after) || reads == WHY_READS {
            break (after, history);
        }
    };
    let Some(why) = why::explain(&snap, bucket, &history) else {
        return Err(Failure::Runtime(format!(
            "bucket {bucket} is not in {} any more (its count changed to {} meanwhile)",
            group.as_str(),
            snap.shard_count
        )));
    };
    if json {
        output::line(why::json(&snap, bucket, &history, &why))?;
    } else {
        output::text(why.text())?;
    }
    Ok(())
}

fn expires_in(snap: &GroupSnapshot, t: Option<Timestamp>) -> String {
    left(snap.observed_at, t)
}

/// How long from `observed` until `t`, in seconds with one decimal (negative once past).
fn left(observed: Timestamp, t: Option<Timestamp>) -> String {
    match t {
        None => "-".into(),
        Some(t) => {
            let left = t - observed;
            if left.num_milliseconds() >= 0 {
                format!("{:.1}s", left.num_milliseconds() as f64 / 1_000.0)
            } else {
                format!("-{:.1}s", -left.num_milliseconds() as f64 / 1_000.0)
            }
        }
    }
}

/// The balance line: live members, buckets owned, and the spread of their loads; balanced
/// means every bucket not quarantined is owned and every live member owns its target (equal
/// shares, or by weight, cordoned members keeping what they hold, quarantined buckets left
/// out). Buckets unowned while no live member may claim (weight 0, draining, cordoned) are
/// said to be so, with that reason.
pub fn balance_line(snap: &GroupSnapshot) -> String {
    let view = snap.view();
    let live = &view.members;
    let owned: u32 = live.iter().map(|m| m.owned).sum();
    let min = live.iter().map(|m| m.owned).min().unwrap_or(0);
    let max = live.iter().map(|m| m.owned).max().unwrap_or(0);
    // Once a bucket has a load, the members share the work (the load-aware policy): on
    // target when no member's plan would move anything.
    let by_load = snap.buckets.iter().any(|b| b.load > Load::ZERO);
    let on_target = if by_load {
        live.iter().all(|m| load_quiet(snap, &view, m.worker))
    } else {
        policy::targets(policy::shareable(&view), live)
            .iter()
            .all(|t| t.owned == t.target)
    };
    let work = if by_load {
        let min = live.iter().map(|m| m.load).min().unwrap_or(0);
        let max = live.iter().map(|m| m.load).max().unwrap_or(0);
        format!(
            "; work (by load) min {}, max {}",
            shown(units(min)),
            shown(units(max))
        )
    } else {
        String::new()
    };
    let quarantined = if view.quarantined > 0 {
        format!(", {} quarantined", view.quarantined)
    } else {
        String::new()
    };
    let draining = not_retired(&snap.draining);
    let unowned = snap
        .shard_count
        .get()
        .saturating_sub(owned.saturating_add(view.quarantined));
    // Every target is 0 when no member may claim: on target, yet nothing is balanced.
    let can_claim = live
        .iter()
        .any(|m| m.mode == MemberMode::Active && m.weight > 0);
    // While a resize drains, the new buckets waiting for old ones cannot be owned: that, not
    // the workers, is why some bucket is not owned.
    let verdict = if live.is_empty() {
        "no live members".to_owned()
    } else if draining > 0 {
        format!("resize draining: {draining} old bucket(s) not retired")
    } else if unowned > 0 && !can_claim {
        format!(
            "{}: no live member can claim (each has weight 0, or is draining or cordoned)",
            if owned == 0 {
                "nothing owned".to_owned()
            } else {
                format!("{unowned} bucket(s) unowned")
            }
        )
    } else if unowned > 0 {
        "not every bucket owned".to_owned()
    } else if on_target {
        "balanced".to_owned()
    } else {
        "unbalanced".to_owned()
    };
    format!(
        "balance: {} live member(s), {owned}/{} buckets owned{quarantined}, min {min}, max \
         {max}{work}: {verdict}",
        live.len(),
        snap.shard_count
    )
}

/// Whether `worker`'s load-aware plan on the snapshot's view moves nothing (with the
/// default band and budget, and the loads recorded on its buckets).
fn load_quiet(snap: &GroupSnapshot, view: &lease::store::GroupView, worker: NodeId) -> bool {
    let mine: Vec<(Bucket, Load)> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(worker) && b.state == BucketState::Live)
        .map(|b| (b.bucket, b.load))
        .collect();
    match balance::plan_loads(view, worker, &mine, BalanceConfig::default()) {
        Balance::Count(p) => p.shed.is_empty() && p.claim == 0,
        Balance::Load(p) => p.shed.is_empty() && p.claim.is_empty() && p.claim_any == 0,
    }
}

fn bucket_json(b: &BucketInfo) -> Value {
    json!({
        "bucket": b.bucket.get(),
        "owner": b.owner.map(|w| w.to_string()),
        "session": b.session.map(|s| s.to_string()),
        "token": b.token.get(),
        "expires_at": b.expires_at.map(rfc3339),
        "state": b.state.as_str(),
        "quarantined_until": b.quarantined_until.map(rfc3339),
        "quarantine_reason": b.quarantine_reason.as_ref().map(|r| r.as_str()),
        "load": b.load.as_f64(),
    })
}

/// The new buckets waiting, each with the old buckets it waits for; `null` when there would be
/// more than [`PAIRS_LIMIT`] pairs to compute and print.
fn waiting_json(snap: &GroupSnapshot) -> Value {
    let Some(previous) = snap.previous.filter(|_| !snap.draining.is_empty()) else {
        return json!([]);
    };
    if pairs(previous, snap.shard_count) > PAIRS_LIMIT {
        return Value::Null;
    }
    snap.waiting()
        .into_iter()
        .map(|(bucket, parents)| {
            json!({
                "bucket": bucket.get(),
                "parents": parents.iter().map(|p| p.get()).collect::<Vec<_>>(),
            })
        })
        .collect()
}

fn status_json(snap: &GroupSnapshot) -> Value {
    json!({
        "group": snap.group.as_str(),
        "shard_count": snap.shard_count.get(),
        "observed_at": rfc3339(snap.observed_at),
        "members": snap.members.iter().map(|m| json!({
            "worker": m.worker.to_string(),
            "session": m.session.to_string(),
            "expires_at": rfc3339(m.expires_at),
            "owned": m.owned,
            "weight": m.weight,
            "mode": m.mode.as_str(),
            "load": units(m.load),
            "hottest": m.hottest.as_f64(),
        })).collect::<Vec<_>>(),
        "buckets": snap.buckets.iter().map(bucket_json).collect::<Vec<_>>(),
        "generation": snap.generation.get(),
        "previous": snap.previous.map(ShardCount::get),
        "draining": snap.draining.iter().map(bucket_json).collect::<Vec<_>>(),
        "waiting": waiting_json(snap),
    })
}

/// The line under the header: the generation, and whether and from what it was resized.
fn generation_line(snap: &GroupSnapshot) -> String {
    match snap.previous {
        None => format!("generation {}, never resized", snap.generation),
        Some(previous) if snap.draining.is_empty() => {
            format!("generation {}, resized from {previous}", snap.generation)
        }
        Some(previous) => format!(
            "generation {}, resizing from {previous} shards: {} of {previous} old bucket(s) \
             not retired yet",
            snap.generation,
            not_retired(&snap.draining)
        ),
    }
}

/// While a resize drains: the old buckets not retired yet, and the new buckets waiting for
/// them, a line per class of buckets congruent modulo gcd (every new bucket of a class waits
/// for the same old ones).
fn draining_lines(snap: &GroupSnapshot) -> Vec<String> {
    let Some(previous) = snap.previous.filter(|_| !snap.draining.is_empty()) else {
        return Vec::new();
    };
    let mut lines = vec![
        format!(
            "draining: generation {}'s buckets ({previous} shards) not retired yet; each is \
             retired when released or when its owner's session ends",
            snap.generation.get().saturating_sub(1)
        ),
        format!(
            "{:>6}  {:<36}  {:>6}  {:>10}  state",
            "bucket", "owner", "token", "expires in"
        ),
    ];
    for b in snap
        .draining
        .iter()
        .filter(|b| b.state == BucketState::Live)
    {
        lines.push(bucket_row(snap, b));
    }
    lines.push(String::new());
    let gcd = keys::gcd(previous, snap.shard_count);
    let waiting: Vec<(Vec<Bucket>, Vec<Bucket>)> = (0..gcd)
        .map(|r| {
            let old: Vec<Bucket> = keys::parents(previous, snap.shard_count, Bucket(r))
                .into_iter()
                .filter(|b| {
                    snap.draining
                        .get(b.0 as usize)
                        .is_some_and(|i| i.state == BucketState::Live)
                })
                .collect();
            (keys::children(previous, snap.shard_count, Bucket(r)), old)
        })
        .filter(|(_, old)| !old.is_empty())
        .collect();
    let new_count: usize = waiting.iter().map(|(new, _)| new.len()).sum();
    lines.push(format!(
        "waiting: {new_count} new bucket(s) wait for old buckets they share keys with \
         (congruent mod {gcd})"
    ));
    let rows: Vec<(String, String)> = waiting
        .iter()
        .map(|(new, old)| (bucket_list(new), bucket_list(old)))
        .collect();
    let width = rows
        .iter()
        .map(|(new, _)| new.chars().count())
        .max()
        .unwrap_or(0)
        .max("new".len());
    lines.push(format!("{:<width$}  waits for old", "new"));
    for (new, old) in rows.iter().take(WAITING_SHOWN) {
        lines.push(format!("{new:<width$}  {old}"));
    }
    if rows.len() > WAITING_SHOWN {
        lines.push(format!(
            "... and {} more line(s) like these ({})",
            rows.len() - WAITING_SHOWN,
            json_lists(previous, snap.shard_count, "waiting")
        ));
    }
    lines.push(String::new());
    lines
}

fn bucket_row(snap: &GroupSnapshot, b: &BucketInfo) -> String {
    let quarantine = b.quarantined_until.map_or_else(String::new, |until| {
        let reason = b
            .quarantine_reason
            .as_ref()
            .map_or_else(String::new, |r| format!(": {}", shortened(r.as_str())));
        format!(
            ", quarantined for {}{reason}",
            left(snap.observed_at, Some(until))
        )
    });
    // P4: a recorded load, shown once there is one (a group nobody reports loads in shows
    // none).
    let load = if b.load > Load::ZERO {
        format!(", load {}", shown(b.load.as_f64()))
    } else {
        String::new()
    };
    format!(
        "{:>6}  {:<36}  {:>6}  {:>10}  {}{load}{quarantine}",
        b.bucket,
        b.owner.map_or_else(|| "-".to_owned(), |w| w.to_string()),
        b.token,
        expires_in(snap, b.expires_at),
        b.state.as_str()
    )
}

/// A member's work (a sum of loads in millionths) in the application's unit.
pub(crate) fn units(micros: u64) -> f64 {
    micros as f64 / 1e6
}

/// A load as a table shows it: at most three decimals, no trailing zeros.
pub(crate) fn shown(units: f64) -> String {
    let text = format!("{units:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// A quarantine's reason as a table row shows it: its first line, at most
/// [`REASON_SHOWN`] characters (`status --why` and `--json` give all of it).
fn shortened(reason: &str) -> String {
    let line = reason.lines().next().unwrap_or_default();
    if line.chars().count() <= REASON_SHOWN && line.len() == reason.len() {
        return line.to_owned();
    }
    let mut short: String = line.chars().take(REASON_SHOWN).collect();
    short.push('…');
    short
}

/// How many characters of a quarantine's reason a table row shows.
const REASON_SHOWN: usize = 80;

fn status_table(snap: &GroupSnapshot) -> String {
    let mut lines = vec![
        format!(
            "group {:?}: {} shards, observed {} (store clock)",
            snap.group.as_str(),
            snap.shard_count,
            rfc3339(snap.observed_at)
        ),
        generation_line(snap),
        String::new(),
        format!(
            "{:>6}  {:<36}  {:>6}  {:>10}  state",
            "bucket", "owner", "token", "expires in"
        ),
    ];
    for b in &snap.buckets {
        lines.push(bucket_row(snap, b));
    }
    lines.push(String::new());
    lines.extend(draining_lines(snap));
    lines.push("members:".into());
    lines.push(format!(
        "{:<36}  {:>5}  {:>10}  {:<7}  {:>6}  {:<8}  {:>8}  metadata",
        "worker", "owned", "expires in", "state", "weight", "mode", "load"
    ));
    for m in &snap.members {
        lines.push(format!(
            "{:<36}  {:>5}  {:>10}  {:<7}  {:>6}  {:<8}  {:>8}  {}",
            m.worker,
            m.owned,
            expires_in(snap, Some(m.expires_at)),
            if m.live { "live" } else { "expired" },
            m.weight,
            m.mode.as_str(),
            shown(units(m.load)),
            m.metadata
        ));
    }
    lines.push(String::new());
    lines.push(balance_line(snap));
    lines.push(String::new());
    lines.join("\n")
}

fn node_json(n: &NodeInfo) -> Value {
    json!({
        "node": n.node.to_string(),
        "session": n.session.to_string(),
        "started_at": rfc3339(n.started_at),
        "heartbeat_at": rfc3339(n.heartbeat_at),
        "expires_at": rfc3339(n.expires_at),
        "live": n.live,
        "metadata": n.metadata.as_str(),
        "groups": n.groups.iter().map(|g| g.as_str()).collect::<Vec<_>>(),
        "handed_over": n.handed_over,
        "crossed": n.crossed,
    })
}

fn nodes_json(nodes: &NodesSnapshot) -> Value {
    json!({
        "observed_at": rfc3339(nodes.observed_at),
        "nodes": nodes.nodes.iter().map(node_json).collect::<Vec<_>>(),
    })
}

/// The groups a node is in, for a table: names as written, comma-separated, `-` for none.
fn group_list(n: &NodeInfo) -> String {
    if n.groups.is_empty() {
        return "-".to_owned();
    }
    n.groups
        .iter()
        .map(|g| g.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the last failover did to the sessions of the nodes listed: how many were kept with
/// their buckets, and the others with why each restarted; `None` when no listed session
/// crossed one.
pub(crate) fn crossed(nodes: &NodesSnapshot) -> Option<(usize, Vec<(NodeId, &str)>)> {
    let crossed: Vec<(NodeId, &str)> = nodes
        .nodes
        .iter()
        .filter_map(|n| n.crossed.as_deref().map(|c| (n.node, c)))
        .collect();
    if crossed.is_empty() {
        return None;
    }
    let kept = crossed.iter().filter(|(_, c)| *c == "kept").count();
    Some((
        kept,
        crossed.into_iter().filter(|(_, c)| *c != "kept").collect(),
    ))
}

/// [`crossed`] as lines under the nodes' table.
fn crossings(nodes: &NodesSnapshot) -> Vec<String> {
    let Some((kept, ended)) = crossed(nodes) else {
        return Vec::new();
    };
    let mut lines = vec![
        String::new(),
        format!(
            "after the last failover: {kept} session(s) kept with their buckets, {} restarted",
            ended.len()
        ),
    ];
    lines.extend(ended.iter().map(|(node, why)| format!("  {node}: {why}")));
    lines
}

fn nodes_table(nodes: &NodesSnapshot) -> String {
    let mut lines = vec![
        format!(
            "nodes, observed {} (store clock)",
            rfc3339(nodes.observed_at)
        ),
        String::new(),
    ];
    let width = nodes
        .nodes
        .iter()
        .map(|n| group_list(n).chars().count())
        .max()
        .unwrap_or(0)
        .max("groups".len());
    lines.push(format!(
        "{:<36}  {:<7}  {:>10}  {:<width$}  metadata",
        "node", "state", "expires in", "groups"
    ));
    for n in &nodes.nodes {
        lines.push(format!(
            "{:<36}  {:<7}  {:>10}  {:<width$}  {}",
            n.node,
            match (n.live, n.handed_over) {
                (true, true) => "handed",
                (true, false) => "live",
                (false, _) => "expired",
            },
            left(nodes.observed_at, Some(n.expires_at)),
            group_list(n),
            n.metadata
        ));
    }
    lines.extend(crossings(nodes));
    let live = nodes.nodes.iter().filter(|n| n.live).count();
    let memberships: usize = nodes
        .nodes
        .iter()
        .filter(|n| n.live)
        .map(|n| n.groups.len())
        .sum();
    lines.push(String::new());
    lines.push(format!(
        "{} node(s), {live} live, in {memberships} group membership(s); `leasectl status --group \
         NAME` shows a group's buckets",
        nodes.nodes.len()
    ));
    lines.push(String::new());
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use lease::memory::MemoryLeaseStore;
    use lease::store::WorkerStore;
    use lease::store::{
        Clock, Incarnation, ManualClock, MemberControl, SessionId, SystemClock, Takeover,
    };
    use lease::{GroupName, MemberMetadata, NodeId, Ttl, Weight};

    fn nodes() -> NodesSnapshot {
        let now = SystemClock.now();
        let node = |groups: &[&str], live: bool| NodeInfo {
            node: NodeId::new(),
            session: SessionId::new(),
            started_at: now,
            heartbeat_at: now,
            expires_at: now + chrono::TimeDelta::milliseconds(if live { 2_500 } else { -500 }),
            live,
            metadata: MemberMetadata::new("host=vm pid=7").expect("metadata"),
            groups: groups
                .iter()
                .map(|g| GroupName::new(*g).expect("a name"))
                .collect(),
            handed_over: false,
            crossed: None,
        };
        NodesSnapshot {
            observed_at: now,
            nodes: vec![node(&["billing", "orders"], true), node(&[], false)],
        }
    }

    /// A member of `group` in `store`, live for 10 s of its clock.
    async fn member(store: &MemoryLeaseStore, group: &GroupName, w: NodeId) -> SessionId {
        let ttl = Ttl::from_secs(10).expect("ttl");
        let meta = MemberMetadata::empty();
        let hb = store
            .heartbeat(w, Incarnation::from_uuid(w.as_uuid()), ttl, &meta, &[])
            .await
            .expect("heartbeat");
        store.join(group, w, hb.session).await.expect("join");
        hb.session
    }

    /// Every target is 0 when no live member may claim: that is no balance, and the line says
    /// what is unowned and why.
    #[tokio::test]
    async fn buckets_nobody_may_claim_are_not_balanced() {
        let store = MemoryLeaseStore::with_clock(ManualClock::new());
        let group = GroupName::new("orders").expect("name");
        let count = ShardCount::new(8).expect("count");
        store.ensure_group(&group, count).await.expect("group");
        let (a, b) = (NodeId::new(), NodeId::new());
        let control = |w, c| {
            let (store, group) = (&store, &group);
            async move { store.control(group, w, c).await.expect("control") }
        };
        let session = member(&store, &group, a).await;
        member(&store, &group, b).await;
        let zero = Weight::new(0).expect("weight");
        control(a, MemberControl::Weight(zero)).await;
        control(b, MemberControl::Mode(MemberMode::Draining)).await;
        let snap = store.snapshot(&group).await.expect("snapshot");
        assert_eq!(
            balance_line(&snap),
            "balance: 2 live member(s), 0/8 buckets owned, min 0, max 0: nothing owned: no \
             live member can claim (each has weight 0, or is draining or cordoned)"
        );
        // A cordoned member keeps its 4 (its target); the other 4 have nobody to claim them.
        control(a, MemberControl::Weight(Weight::new(1).expect("weight"))).await;
        store
            .claim(&group, a, session, 4, Takeover::Allowed)
            .await
            .expect("claim");
        control(a, MemberControl::Mode(MemberMode::Cordoned)).await;
        let snap = store.snapshot(&group).await.expect("snapshot");
        assert_eq!(
            balance_line(&snap),
            "balance: 2 live member(s), 4/8 buckets owned, min 0, max 4: 4 bucket(s) unowned: \
             no live member can claim (each has weight 0, or is draining or cordoned)"
        );
        // Once a member may claim again, unowned buckets are not balanced either.
        control(b, MemberControl::Mode(MemberMode::Active)).await;
        let snap = store.snapshot(&group).await.expect("snapshot");
        assert!(
            balance_line(&snap).ends_with(": not every bucket owned"),
            "{}",
            balance_line(&snap)
        );
    }

    #[test]
    fn the_nodes_table_lists_each_node_with_its_groups() {
        let nodes = nodes();
        let table = nodes_table(&nodes);
        let row = table
            .lines()
            .find(|l| l.starts_with(&nodes.nodes[0].node.to_string()))
            .expect("the first node's row");
        assert!(row.contains("live") && row.contains("2.5s"), "{row}");
        assert!(
            row.contains("billing, orders") && row.ends_with("host=vm pid=7"),
            "{row}"
        );
        let row = table
            .lines()
            .find(|l| l.starts_with(&nodes.nodes[1].node.to_string()))
            .expect("the second node's row");
        assert!(row.contains("expired") && row.contains("-0.5s"), "{row}");
        assert!(
            table.contains("2 node(s), 1 live, in 2 group membership(s)"),
            "{table}"
        );
    }

    #[test]
    fn the_nodes_json_has_the_documented_fields() {
        let json = nodes_json(&nodes());
        let node = json["nodes"][0].as_object().expect("a node");
        let keys: Vec<&str> = node.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "node",
                "session",
                "started_at",
                "heartbeat_at",
                "expires_at",
                "live",
                "metadata",
                "groups",
                "handed_over",
                "crossed"
            ]
        );
        assert_eq!(json["nodes"][0]["groups"], json!(["billing", "orders"]));
        assert_eq!(json["nodes"][1]["groups"], json!([]));
    }

    #[test]
    fn the_nodes_table_says_how_sessions_came_through_the_last_failover() {
        let mut nodes = nodes();
        assert!(!nodes_table(&nodes).contains("failover"), "no failover yet");
        nodes.nodes[0].crossed = Some("kept".to_owned());
        nodes.nodes[1].crossed = Some("ended: writes after the switch point".to_owned());
        let table = nodes_table(&nodes);
        assert!(
            table.contains(
                "after the last failover: 1 session(s) kept with their buckets, 1 restarted"
            ),
            "{table}"
        );
        let why = format!(
            "  {}: ended: writes after the switch point",
            nodes.nodes[1].node
        );
        assert!(table.lines().any(|l| l == why), "{table}");
    }
}
