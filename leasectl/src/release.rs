//! `leasectl release`: release every bucket of a worker and remove its membership (for a
//! stuck or decommissioned worker); without `--force`, only say what would happen.

use clap::Args;
use lease::NodeId;
use lease::store::BucketState;

use crate::common::{DbArgs, group_arg, store_failure};
use crate::output;
use crate::output::Failure;

/// `leasectl release`'s arguments.
#[derive(Args, Debug)]
pub struct ReleaseArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group.
    #[arg(long)]
    group: String,
    /// The worker whose buckets to release (its UUID, as `status` shows it).
    #[arg(long)]
    worker: String,
    /// Do it. Without this flag, only show what would be released.
    #[arg(long)]
    force: bool,
}

/// `'text'` for a POSIX shell.
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// Release the worker's buckets, or say what that would do.
pub async fn run(args: ReleaseArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let worker: NodeId = args
        .worker
        .parse()
        .map_err(|e| Failure::Usage(format!("--worker: {e}")))?;
    let store = args.db.open().await?;
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    let held: Vec<u32> = snap
        .buckets
        .iter()
        .filter(|b| b.owner == Some(worker) && b.state == BucketState::Live)
        .map(|b| b.bucket.get())
        .collect();
    // Old buckets of a resize still draining: released as well, and their new buckets freed.
    let draining: Vec<u32> = snap
        .draining_leases()
        .iter()
        .filter(|l| l.owner == worker)
        .map(|l| l.bucket.get())
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
                let old = if draining.is_empty() {
                    String::new()
                } else {
                    format!(
                        " and {} old bucket(s) {draining:?} of the resize from {} still draining",
                        draining.len(),
                        snap.previous.map_or(0, |n| n.get())
                    )
                };
                output::line(format!(
                    "would release {} bucket(s) {held:?}{old} of worker {worker} ({}) in group \
                     {:?} and remove its membership; its next heartbeat would revoke what it \
                     held in this group and join it again (with a new session if this was the \
                     only group it was in).",
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
    let released = store.evict(&group, worker).await.map_err(store_failure)?;
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
