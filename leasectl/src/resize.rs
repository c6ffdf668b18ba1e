//! `leasectl resize`: change a group's shard count while its workers run. Without `--apply`,
//! check what the store would check and print the plan: which new buckets wait for which old
//! ones, and who holds those now.
//!
//! Key `h` lives in bucket `h mod N`; going from `N` to `M` buckets, new bucket `b` shares keys
//! with old bucket `b'` iff `b ≡ b' (mod gcd(N, M))` ([`lease::store::resize::parents`]), and
//! waits until each of those is released or its owner's session ends. The buckets congruent to
//! `r` form a class: every new bucket of the class waits for every old bucket of it, so the
//! plan is printed one class at a time.

use clap::Args;
use lease::store::resize as keys;
use lease::store::{
    AdminStore, BackendFailure, BucketInfo, BucketState, Chain, Generation, GroupSnapshot,
    ResizeOutcome,
};
use lease::{Bucket, ShardCount, StoreError};
use serde_json::{Value, json};

use crate::common::{DbArgs, group_arg, store_failure};
use crate::output;
use crate::output::Failure;

/// Old buckets up to which the text plan shows one row each; above it, [`ROWS_SHOWN`] rows and
/// a summary line.
const ROWS_ALL: u32 = 64;

/// Rows of the text plan shown when the old generation has more than [`ROWS_ALL`] buckets.
const ROWS_SHOWN: usize = 32;

/// The most (new bucket, old bucket) pairs sharing keys that `--json` lists, and `status
/// --json` computes: `lcm(N, M)` of them. Splits and merges have `max(N, M)`, at most 65,536;
/// only counts with a small gcd and large values (`1024 -> 1025`: over a million) go past it,
/// and then the list would be gigabytes. Above it `waits` is `null`: the rule, `gcd`, says it.
pub const PAIRS_LIMIT: u64 = 1 << 20;

/// `leasectl resize`'s arguments.
#[derive(Args, Debug)]
#[command(after_long_help = "\
The plan, one row per old bucket: the new buckets that wait for it (all of its class: new and \
old buckets congruent modulo gcd(N, M)), then its owner, token and state now. A live old bucket \
holds its new buckets back until it is released or its owner's session ends; an unowned or \
expired one holds nothing back. With more than 64 old buckets, the first 32 rows and a \
summary line; --json lists every new bucket with its parents (null when there are more than \
1,048,576 pairs: then gcd says it).

--json prints one object: group, from, to, generation (now), next_generation (after the \
resize; the same when from = to), gcd, applied, outcome (\"started\", \"unchanged\", or null \
for a dry run), waits ([{bucket, parents}], every new bucket; null above 1,048,576 pairs).

On Postgres, --apply runs as the owner of schema lease (the role that runs leasectl migrate): \
a resize deletes and inserts bucket rows, which the roles of workers may not.

Exit codes: 0 planned, done or unchanged; 2 bad input, including a --from that is not the \
group's count (the message names the count) and an unknown --group; 1 a runtime failure, \
including an earlier resize still draining (run again once its old buckets are retired).")]
pub struct ResizeArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The group to resize.
    #[arg(long)]
    group: String,
    /// The group's shard count now: the resize is refused, changing nothing, if it is not.
    #[arg(long)]
    from: u32,
    /// The new shard count (1 to 65536).
    #[arg(long)]
    to: u32,
    /// Do it. Without this flag, only check and print the plan.
    #[arg(long)]
    apply: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Check the resize against the group, print the plan and, with `--apply`, resize.
pub async fn run(args: ResizeArgs) -> Result<(), Failure> {
    let group = group_arg(&args.group)?;
    let from = ShardCount::new(args.from).map_err(|e| Failure::Usage(format!("--from: {e}")))?;
    let to = ShardCount::new(args.to).map_err(|e| Failure::Usage(format!("--to: {e}")))?;
    let store = args.db.open().await?;
    // The plan shows the old buckets' owners as this snapshot saw them; with --apply the
    // store checks again, atomically, and its answer is the one reported.
    let snap = store.snapshot(&group).await.map_err(store_failure)?;
    let outcome = if args.apply {
        Some(
            store
                .resize(&group, from, to)
                .await
                .map_err(resize_failure)?,
        )
    } else {
        check(&snap, from, to).map_err(resize_failure)?;
        None
    };
    let plan = Plan::new(&snap, from, to, outcome);
    if args.json {
        output::line(plan.json()).map_err(|e| plan.output_failure(&e))
    } else {
        output::text(plan.text()).map_err(|e| plan.output_failure(&e))
    }
}

/// What [`AdminStore::resize`] would answer on `snap`, without writing: `Ok` when it would
/// resize or change nothing (`from == to`), else the error it would fail with (Z1).
fn check(snap: &GroupSnapshot, from: ShardCount, to: ShardCount) -> Result<(), StoreError> {
    if snap.shard_count != from {
        return Err(StoreError::ResizeFromMismatch {
            group: snap.group.clone(),
            from,
            found: snap.shard_count,
        });
    }
    let draining = not_retired(&snap.draining);
    match snap.previous {
        Some(previous) if from != to && draining > 0 => Err(StoreError::ResizeInProgress {
            group: snap.group.clone(),
            from: previous,
            to: snap.shard_count,
            draining,
        }),
        _ => Ok(()),
    }
}

/// How many (old bucket, new bucket) pairs share keys going from `from` to `to` buckets:
/// `lcm(from, to)`, each new bucket with its `from / gcd` parents.
pub fn pairs(from: ShardCount, to: ShardCount) -> u64 {
    u64::from(from.get()) / u64::from(keys::gcd(from, to)) * u64::from(to.get())
}

/// What `--json` gives of the waits from `from` to `to` buckets, for the text to say: every
/// new bucket, or, above [`PAIRS_LIMIT`] pairs, `null` in `field`.
pub fn json_lists(from: ShardCount, to: ShardCount, field: &str) -> String {
    let pairs = pairs(from, to);
    if pairs > PAIRS_LIMIT {
        format!(
            "--json gives \"{field}\": null here: {pairs} pairs of new and old buckets are \
             more than it lists; the rule, mod gcd, says them all"
        )
    } else {
        "--json lists every new bucket with the old ones it waits for".to_owned()
    }
}

/// Buckets of a draining generation not retired yet.
pub fn not_retired(draining: &[BucketInfo]) -> u32 {
    let live = draining
        .iter()
        .filter(|b| b.state == BucketState::Live)
        .count();
    u32::try_from(live).unwrap_or(u32::MAX)
}

/// A refused resize as the command line reports it: a `--from` that is not the group's count
/// is bad input (exit 2, like a worker's `--shards` that is not the group's); a resize still
/// draining is a state that passes (exit 1: run again later).
fn resize_failure(e: StoreError) -> Failure {
    match e {
        StoreError::ResizeFromMismatch { group, from, found } => Failure::Usage(format!(
            "--from: group {:?} has {found} shards, not {from}; nothing was changed \
             (leasectl status shows the count)",
            group.as_str()
        )),
        StoreError::ResizeInProgress {
            group,
            from,
            to,
            draining,
        } => Failure::Runtime(format!(
            "group {:?} is still draining its resize from {from} to {to} shards: {draining} \
             old bucket(s) not retired yet; nothing was changed. Run again once they are \
             released or their owners' sessions end (leasectl status --group {} shows them)",
            group.as_str(),
            group.as_str()
        )),
        StoreError::Backend {
            failure: BackendFailure::PermissionDenied,
            ..
        } => Failure::Runtime(format!(
            "{}: a resize deletes bucket rows and updates the group, which the roles of \
             workers may not; run it as the owner of schema lease (the role that runs \
             leasectl migrate)",
            Chain(&e)
        )),
        other => store_failure(other),
    }
}

/// What a resize does to a group: its classes of old and new buckets, and what was done.
struct Plan<'a> {
    snap: &'a GroupSnapshot,
    from: ShardCount,
    to: ShardCount,
    gcd: u32,
    /// `None` for a dry run.
    outcome: Option<ResizeOutcome>,
}

impl<'a> Plan<'a> {
    fn new(
        snap: &'a GroupSnapshot,
        from: ShardCount,
        to: ShardCount,
        outcome: Option<ResizeOutcome>,
    ) -> Self {
        Self {
            snap,
            from,
            to,
            gcd: keys::gcd(from, to),
            outcome,
        }
    }

    fn unchanged(&self) -> bool {
        self.from == self.to
    }

    /// The generation the group has after the call: the store's answer, or for a dry run the
    /// one a resize would open (the same when nothing changes).
    fn next_generation(&self) -> Generation {
        match self.outcome {
            Some(
                ResizeOutcome::Started { generation } | ResizeOutcome::Unchanged { generation },
            ) => generation,
            // An outcome of a later kind (`ResizeOutcome` is non-exhaustive): what a resize
            // of these counts does.
            Some(_) | None if self.unchanged() => self.snap.generation,
            Some(_) | None => self.snap.generation.next(),
        }
    }

    /// The state of old bucket `b` as the snapshot saw it; `None` if the snapshot saw another
    /// count (a concurrent resize got there between the snapshot and `--apply`'s resize).
    fn old(&self, b: Bucket) -> Option<&BucketInfo> {
        if self.snap.shard_count != self.from {
            return None;
        }
        self.snap.buckets.get(b.0 as usize)
    }

    fn outcome_name(&self) -> Value {
        match self.outcome {
            None => Value::Null,
            Some(ResizeOutcome::Started { .. }) => "started".into(),
            Some(ResizeOutcome::Unchanged { .. }) => "unchanged".into(),
            Some(_) => "other".into(),
        }
    }

    fn json(&self) -> Value {
        let waits = if self.unchanged() {
            json!([])
        } else if pairs(self.from, self.to) > PAIRS_LIMIT {
            Value::Null
        } else {
            self.to
                .buckets()
                .map(|b| {
                    json!({
                        "bucket": b.get(),
                        "parents": keys::parents(self.from, self.to, b)
                            .iter()
                            .map(|p| p.get())
                            .collect::<Vec<_>>(),
                    })
                })
                .collect()
        };
        json!({
            "group": self.snap.group.as_str(),
            "from": self.from.get(),
            "to": self.to.get(),
            "generation": self.snap.generation.get(),
            "next_generation": self.next_generation().get(),
            "gcd": self.gcd,
            "applied": self.outcome.is_some(),
            "outcome": self.outcome_name(),
            "waits": waits,
        })
    }

    fn text(&self) -> String {
        let group = self.snap.group.as_str();
        if self.unchanged() {
            let first = format!(
                "group {group:?} has {} shards already: nothing to change (generation {})",
                self.from, self.snap.generation
            );
            return if self.outcome.is_some() {
                format!("{first}; the store answered unchanged\n")
            } else {
                format!("{first}\n")
            };
        }
        let mut lines = Vec::new();
        match self.outcome {
            Some(ResizeOutcome::Started { generation }) => lines.push(format!(
                "group {group:?}: resized from {} to {} shards; generation {generation} \
                 started, the old buckets drain (leasectl status --group {group} shows them)",
                self.from, self.to
            )),
            Some(_) => lines.push(format!(
                "group {group:?}: the store answered {} to the resize from {} to {} shards",
                self.outcome_name(),
                self.from,
                self.to
            )),
            None => {}
        }
        let (live, expired, unowned) = self.old_states();
        lines.push(format!(
            "{}group {group:?}: {} -> {} shards, generation {} -> {}, gcd {}",
            if self.outcome.is_some() {
                "plan: "
            } else {
                "resize plan: "
            },
            self.from,
            self.to,
            self.snap.generation,
            self.next_generation(),
            self.gcd
        ));
        lines.push(if self.gcd == 1 {
            // Coprime counts: every key of an old bucket is spread over every new bucket.
            "every new bucket waits for every old bucket (they all share keys) until it is \
             released or its owner's session ends"
                .to_owned()
        } else {
            format!(
                "new bucket b waits for each old bucket b' with b ≡ b' (mod {}) until b' is \
                 released or its owner's session ends",
                self.gcd
            )
        });
        lines.push(format!(
            "old buckets{}: {live} live (their new buckets wait), {expired} expired and \
             {unowned} unowned (hold nothing back)",
            if self.outcome.is_some() {
                " just before the resize"
            } else {
                " now"
            }
        ));
        lines.push(String::new());
        let rows = self.rows();
        let width = rows
            .iter()
            .map(|(new, _)| new.chars().count())
            .max()
            .unwrap_or(0)
            .max("new".len());
        lines.push(format!(
            "{:<width$}  {:>3}  {:<36}  {:>6}  state",
            "new", "old", "owner", "token"
        ));
        let shown = if self.from.get() <= ROWS_ALL {
            rows.len()
        } else {
            ROWS_SHOWN
        };
        for (new, old) in rows.iter().take(shown) {
            let info = self.old(*old);
            lines.push(format!(
                "{new:<width$}  {:>3}  {:<36}  {:>6}  {}",
                old,
                info.and_then(|i| i.owner)
                    .map_or_else(|| "-".to_owned(), |w| w.to_string()),
                info.map_or(0, |i| i.token.get()),
                info.map_or("unknown", |i| i.state.as_str()),
            ));
        }
        if rows.len() > shown {
            lines.push(format!(
                "... {} more old bucket(s), the same way: the new buckets congruent to each \
                 (mod {}) wait for it ({})",
                rows.len() - shown,
                self.gcd,
                json_lists(self.from, self.to, "waits")
            ));
        }
        lines.push(String::new());
        if self.outcome.is_none() {
            lines.push("dry run: nothing changed; run again with --apply to resize".into());
        }
        let mut text = lines.join("\n");
        text.push('\n');
        text
    }

    /// One row per old bucket, class by class: the new buckets of its class (on the class's
    /// first row only) and the old bucket.
    fn rows(&self) -> Vec<(String, Bucket)> {
        let mut rows = Vec::with_capacity(self.from.get() as usize);
        for r in 0..self.gcd {
            // Class r: the old and the new buckets congruent to r modulo the gcd, each new
            // one waiting for every old one.
            let new = bucket_list(&keys::children(self.from, self.to, Bucket(r)));
            for (i, old) in keys::parents(self.from, self.to, Bucket(r))
                .into_iter()
                .enumerate()
            {
                rows.push((if i == 0 { new.clone() } else { String::new() }, old));
            }
        }
        rows
    }

    /// The old buckets that are live, expired and unowned.
    fn old_states(&self) -> (usize, usize, usize) {
        let count = |s: BucketState| {
            self.from
                .buckets()
                .filter_map(|b| self.old(b))
                .filter(|b| b.state == s)
                .count()
        };
        (
            count(BucketState::Live),
            count(BucketState::Expired),
            count(BucketState::Unowned),
        )
    }

    /// The failure for output lost after a resize was applied: say it was.
    fn output_failure(&self, e: &output::OutputError) -> Failure {
        match self.outcome {
            Some(ResizeOutcome::Started { generation }) => e.failure_after(&format!(
                "resized group {:?} from {} to {} shards (generation {generation})",
                self.snap.group.as_str(),
                self.from,
                self.to
            )),
            _ => e.failure(),
        }
    }
}

/// Buckets in order, short: every one up to 4, then a range (`0-16`), a progression
/// (`1, 5, ..., 61 (16 buckets)`) or the first few and how many.
pub fn bucket_list(buckets: &[Bucket]) -> String {
    let join = |bs: &[Bucket]| {
        bs.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (Some(first), Some(second), Some(last)) = (buckets.first(), buckets.get(1), buckets.last())
    else {
        return join(buckets);
    };
    if buckets.len() <= 4 {
        return join(buckets);
    }
    let step = second.0 - first.0;
    let progression = buckets.windows(2).all(|w| w[1].0 - w[0].0 == step);
    match (progression, step) {
        (true, 1) => format!("{first}-{last}"),
        (true, _) => format!("{first}, {second}, ..., {last} ({} buckets)", buckets.len()),
        (false, _) => format!("{}, ... ({} buckets)", join(&buckets[..3]), buckets.len()),
    }
}

#[cfg(test)]
mod tests {
    use lease::memory::MemoryLeaseStore;

    use super::*;
    use lease::store::WorkerStore;

    /// The text's promise of what `--json` lists holds: above the limit of pairs, where `waits`
    /// is null, the text says so instead of promising every new bucket.
    #[tokio::test]
    async fn the_text_says_what_json_lists() {
        let store = MemoryLeaseStore::new();
        let n = |count| ShardCount::new(count).expect("count");
        for (from, to, listed) in [(128, 256, true), (1024, 1025, false)] {
            let name = lease::GroupName::new(format!("g{from}")).expect("name");
            store.ensure_group(&name, n(from)).await.expect("group");
            let snap = store.snapshot(&name).await.expect("snapshot");
            let plan = Plan::new(&snap, n(from), n(to), None);
            let waits = &plan.json()["waits"];
            let summary = plan
                .text()
                .lines()
                .find(|l| l.starts_with("... "))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("no summary line:\n{}", plan.text()));
            assert_eq!(waits.is_array(), listed, "{from} -> {to}");
            assert_eq!(
                summary.contains("--json lists every new bucket"),
                listed,
                "{from} -> {to}: {summary}"
            );
            if !listed {
                assert!(waits.is_null(), "{waits}");
                assert!(
                    summary.contains("--json gives \"waits\": null here: 1049600 pairs"),
                    "{summary}"
                );
            }
        }
    }

    fn bs(v: &[u32]) -> Vec<Bucket> {
        v.iter().copied().map(Bucket).collect()
    }

    #[test]
    fn lists_stay_short() {
        assert_eq!(bucket_list(&[]), "");
        assert_eq!(bucket_list(&bs(&[3])), "3");
        assert_eq!(bucket_list(&bs(&[0, 4, 8, 12])), "0, 4, 8, 12");
        assert_eq!(bucket_list(&bs(&[0, 1, 2, 3, 4, 5, 6])), "0-6");
        assert_eq!(
            bucket_list(&bs(&[1, 5, 9, 13, 17])),
            "1, 5, ..., 17 (5 buckets)"
        );
        assert_eq!(
            bucket_list(&bs(&[1, 2, 5, 9, 13])),
            "1, 2, 5, ... (5 buckets)"
        );
    }
}
