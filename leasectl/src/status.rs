//! `leasectl status`: who owns which bucket of a group, the members, and the balance.

use clap::Args;
use lease::{GroupSnapshot, LeaseStore, Timestamp};
use serde_json::json;

use crate::common::{DbArgs, Failure, group_arg, rfc3339, store_failure};
use crate::output;

/// `leasectl status`'s arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group to show.
    #[arg(long)]
    group: String,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// Print the group's snapshot.
pub async fn run(args: StatusArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let store = args.db.open().await?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    if args.json {
        output::line(status_json(&snap))?;
    } else {
        output::text(status_table(&snap))?;
    }
    Ok(())
}

fn expires_in(snap: &GroupSnapshot, t: Option<Timestamp>) -> String {
    match t {
        None => "-".into(),
        Some(t) => {
            let left = t - snap.observed_at;
            if left.num_milliseconds() >= 0 {
                format!("{:.1}s", left.num_milliseconds() as f64 / 1_000.0)
            } else {
                format!("-{:.1}s", -left.num_milliseconds() as f64 / 1_000.0)
            }
        }
    }
}

/// The balance line: live members, buckets owned, and the spread of their loads.
pub fn balance_line(snap: &GroupSnapshot) -> String {
    let live = snap.live_members();
    let owned: u32 = live.iter().map(|m| m.owned).sum();
    let min = live.iter().map(|m| m.owned).min().unwrap_or(0);
    let max = live.iter().map(|m| m.owned).max().unwrap_or(0);
    let verdict = if live.is_empty() {
        "no live members"
    } else if owned == snap.shard_count.get() && max - min <= 1 {
        "balanced"
    } else if owned < snap.shard_count.get() {
        "not every bucket owned"
    } else {
        "unbalanced"
    };
    format!(
        "balance: {} live member(s), {owned}/{} buckets owned, min {min}, max {max}: {verdict}",
        live.len(),
        snap.shard_count
    )
}

fn status_json(snap: &GroupSnapshot) -> serde_json::Value {
    json!({
        "group": snap.group.as_str(),
        "shard_count": snap.shard_count.get(),
        "observed_at": rfc3339(snap.observed_at),
        "members": snap.members.iter().map(|m| json!({
            "worker": m.worker.to_string(),
            "session": m.session.to_string(),
            "expires_at": rfc3339(m.expires_at),
            "owned": m.owned,
        })).collect::<Vec<_>>(),
        "buckets": snap.buckets.iter().map(|b| json!({
            "bucket": b.bucket.get(),
            "owner": b.owner.map(|w| w.to_string()),
            "session": b.session.map(|s| s.to_string()),
            "token": b.token.get(),
            "expires_at": b.expires_at.map(rfc3339),
            "state": b.state.as_str(),
        })).collect::<Vec<_>>(),
    })
}

fn status_table(snap: &GroupSnapshot) -> String {
    let mut lines = vec![
        format!(
            "group {:?}: {} shards, observed {} (store clock)",
            snap.group.as_str(),
            snap.shard_count,
            rfc3339(snap.observed_at)
        ),
        String::new(),
        format!(
            "{:>6}  {:<36}  {:>6}  {:>10}  state",
            "bucket", "owner", "token", "expires in"
        ),
    ];
    for b in &snap.buckets {
        lines.push(format!(
            "{:>6}  {:<36}  {:>6}  {:>10}  {}",
            b.bucket,
            b.owner.map_or_else(|| "-".to_owned(), |w| w.to_string()),
            b.token,
            expires_in(snap, b.expires_at),
            b.state.as_str()
        ));
    }
    lines.push(String::new());
    lines.push("members:".into());
    lines.push(format!(
        "{:<36}  {:>5}  {:>10}  {:<7}  metadata",
        "worker", "owned", "expires in", "state"
    ));
    for m in &snap.members {
        lines.push(format!(
            "{:<36}  {:>5}  {:>10}  {:<7}  {}",
            m.worker,
            m.owned,
            expires_in(snap, Some(m.expires_at)),
            if m.live { "live" } else { "expired" },
            m.metadata
        ));
    }
    lines.push(String::new());
    lines.push(balance_line(snap));
    lines.push(String::new());
    lines.join("\n")
}
