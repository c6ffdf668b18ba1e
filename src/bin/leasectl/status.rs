//! `migrate`, `status` and `release`: operating a group on Postgres.

use std::time::Duration;

use chrono::{SecondsFormat, Utc};
use lease::diesel::{PgLeaseStore, PgSetupError};
use lease::{BucketState, GroupName, GroupSnapshot, LeaseStore, StoreError, Timestamp, WorkerId};
use serde_json::json;

use crate::output;
use crate::{DbArgs, Failure, ReleaseArgs, StatusArgs};

/// Connection attempts at start-up before giving up.
const ATTEMPTS: u32 = 5;

fn rfc3339(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Now on the local clock, formatted like the JSON events' times.
pub fn now_rfc3339() -> String {
    rfc3339(Utc::now())
}

pub fn group_arg(name: &str) -> Result<GroupName, Failure> {
    GroupName::new(name).map_err(|e| Failure::Usage(format!("--group: {e}")))
}

fn store_for(db: &DbArgs) -> Result<PgLeaseStore, Failure> {
    PgLeaseStore::builder(db.url()?)
        .max_connections(8)
        .timeout(Duration::from_secs(3))
        .build()
        .map_err(|e| Failure::Usage(format!("--database-url: {e}")))
}

/// Whether waiting may help: a server that cannot be reached or cannot take connections yet.
/// A wrong password, a missing database or schema, a missing privilege are reported at once.
fn unreachable(e: &PgSetupError) -> bool {
    e.is_transient()
}

/// A store on `db` whose schema is in place, retrying while the database is unreachable.
pub async fn open(db: &DbArgs) -> Result<PgLeaseStore, Failure> {
    let store = store_for(db)?;
    let mut pause = Duration::from_millis(250);
    let mut attempt = 1;
    loop {
        match store.check_schema().await {
            Ok(()) => return Ok(store),
            Err(e) if unreachable(&e) && attempt < ATTEMPTS => {
                tracing::warn!(attempt, error = %e, "database unreachable; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            Err(e) if unreachable(&e) => {
                return Err(Failure::Runtime(format!(
                    "database unreachable after {attempt} attempts: {e}"
                )));
            }
            Err(e) => return Err(Failure::Runtime(e.to_string())),
        }
    }
}

/// A store failure as a runtime failure, or as a usage error for contract refusals that come
/// from the command line (unknown group, shard-count mismatch).
pub fn store_failure(e: StoreError) -> Failure {
    match e {
        StoreError::GroupNotFound { group } => Failure::Usage(format!(
            "--group: group {group:?} does not exist (a worker creates it when it starts)"
        )),
        StoreError::ShardCountMismatch {
            group,
            configured,
            found,
        } => Failure::Usage(format!(
            "--shards: group {group:?} exists with {found} shards, not {configured}; \
             a group's shard count cannot change"
        )),
        other => Failure::Runtime(lease::Chain(&other).to_string()),
    }
}

pub async fn migrate(db: DbArgs) -> Result<(), Failure> {
    let store = store_for(&db)?;
    let mut pause = Duration::from_millis(250);
    let mut attempt = 1;
    loop {
        match store.migrate().await {
            Ok(applied) if applied.is_empty() => {
                return Ok(output::line("the lease schema is up to date")?);
            }
            Ok(applied) => {
                let done = format!("applied migrations: {}", applied.join(", "));
                return output::line(&done).map_err(|e| e.failure_after(&done));
            }
            Err(e) if unreachable(&e) && attempt < ATTEMPTS => {
                tracing::warn!(attempt, error = %e, "database unreachable; retrying");
                tokio::time::sleep(pause).await;
                pause *= 2;
                attempt += 1;
            }
            Err(e) if unreachable(&e) => {
                return Err(Failure::Runtime(format!(
                    "database unreachable after {attempt} attempts: {e}"
                )));
            }
            Err(e) => return Err(Failure::Runtime(e.to_string())),
        }
    }
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

pub fn status_json(snap: &GroupSnapshot) -> serde_json::Value {
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

pub fn status_table(snap: &GroupSnapshot) -> String {
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

pub async fn status(args: StatusArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let store = open(&args.db).await?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    if args.json {
        output::line(status_json(&snap))?;
    } else {
        output::text(status_table(&snap))?;
    }
    Ok(())
}

/// `'text'` for a POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

pub async fn release(args: ReleaseArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let worker: WorkerId = args
        .worker
        .parse()
        .map_err(|e| Failure::Usage(format!("--worker: {e}")))?;
    let store = open(&args.db).await?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    let held: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(worker) && b.state == BucketState::Live)
        .map(|b| b.bucket.get())
        .collect();
    let member = snap.members.iter().find(|m| m.worker == worker);
    let live = member.is_some_and(|m| m.live);
    // Evicting a live worker hands its buckets to others at once, while it goes on trusting
    // them until its next heartbeat: only fencing tokens keep its writes out meanwhile.
    let warning = "warning: this worker's session is live. Others will take its buckets at once, \
                   while it keeps working on them until its next heartbeat (up to its renew \
                   interval, longer if it is paused); only fencing tokens stop its writes in \
                   between. Prefer stopping it (SIGTERM); evict a live worker only if it \
                   cannot be stopped.";
    if !args.force {
        match member {
            None => output::line(format!(
                "worker {worker} is not a member of group {:?}",
                group.as_str()
            ))?,
            Some(m) => {
                output::line(format!(
                    "would release {} bucket(s) {held:?} of worker {worker} ({}) in group {:?} \
                     and remove its membership; its next heartbeat would start a new session \
                     and revoke everything it held.",
                    held.len(),
                    if m.live { "live" } else { "expired" },
                    group.as_str()
                ))?;
                if live {
                    output::line(warning)?;
                }
                output::line(format!(
                    "To do it, run:\n  leasectl release --group {} --worker {worker} --force",
                    shell_quote(group.as_str())
                ))?;
            }
        }
        return Ok(());
    }
    if live {
        output::error_line(warning);
    }
    let released = store
        .leave(&group, worker, None)
        .await
        .map_err(store_failure)?;
    let released: Vec<u32> = released.iter().map(|b| b.get()).collect();
    let done = format!(
        "released {} bucket(s) {released:?} of worker {worker} in group {:?}{}",
        released.len(),
        group.as_str(),
        if member.is_some() {
            "; its membership is removed"
        } else {
            " (it was not a member)"
        }
    );
    output::line(&done).map_err(|e| e.failure_after(&done))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(shell_quote("plain"), "'plain'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
