//! The groups a worker runs, from `--group` (and `--shards`): read, validated, and checked
//! against the store before anything is written.

use std::collections::BTreeSet;

use lease::store::{Chain, LeaseStore};
use lease::{GroupName, ShardCount, StoreError};

use super::WorkerArgs;
use crate::common::{group_arg, store_failure};
use crate::output::Failure;

/// A group of the command line: its name, its shard count, and how the user wrote it (for
/// messages that name the flag).
pub struct GroupArg {
    pub group: GroupName,
    pub shards: ShardCount,
    /// `--shards` for the plain form, `--group NAME:SHARDS` for the other.
    pub flag: String,
}

/// The groups of `--group` (and `--shards`). A value is `NAME:SHARDS` when it ends with a colon
/// and digits (a name may contain colons: `ns:orders:16` is group `ns:orders`); otherwise it
/// is a plain name, which needs `--shards` and must be the only `--group`.
pub fn group_args(args: &WorkerArgs) -> Result<Vec<GroupArg>, Failure> {
    if args.shards.is_none()
        && let Some((value, count)) = args
            .group
            .iter()
            .find_map(|g| not_a_count(g).map(|count| (g, count)))
    {
        // `x:-1`, `x:1.5`: a count was meant, not a group named so.
        return Err(Failure::Usage(format!(
            "--group {value}: the shard count must be a whole number from 1 to {}, not {count}",
            ShardCount::MAX
        )));
    }
    let counted = args.group.iter().filter(|g| split(g).is_some()).count();
    let groups = match (args.group.as_slice(), args.shards) {
        ([plain], Some(shards)) if counted == 0 => {
            let group = group_arg(plain)?;
            let shards =
                ShardCount::new(shards).map_err(|e| Failure::Usage(format!("--shards: {e}")))?;
            vec![GroupArg {
                group,
                shards,
                flag: "--shards".to_owned(),
            }]
        }
        (_, None) if counted == args.group.len() => args
            .group
            .iter()
            .map(|value| {
                let (name, n) = split(value).unwrap_or((value.as_str(), ""));
                let flag = format!("--group {value}");
                let group =
                    GroupName::new(name).map_err(|e| Failure::Usage(format!("{flag}: {e}")))?;
                // Digits only (`split`): a number too large for u32 is out of range too.
                let shards =
                    ShardCount::new(n.parse::<u32>().unwrap_or(u32::MAX)).map_err(|_| {
                        Failure::Usage(format!(
                            "{flag}: shard count {n} is out of range; it must be between 1 and {}",
                            ShardCount::MAX
                        ))
                    })?;
                Ok(GroupArg {
                    group,
                    shards,
                    flag,
                })
            })
            .collect::<Result<Vec<_>, Failure>>()?,
        ([plain], None) => {
            return Err(Failure::Usage(format!(
                "--shards: group {plain:?} needs its shard count: --group {plain} --shards N, \
                 or --group {plain}:N"
            )));
        }
        _ => {
            return Err(Failure::Usage(
                "--group: give either one --group NAME with --shards N, or every group as \
                 --group NAME:SHARDS (repeatable, e.g. --group orders:16 --group billing:64), \
                 not a mix"
                    .to_owned(),
            ));
        }
    };
    let mut seen = BTreeSet::new();
    for g in &groups {
        if !seen.insert(g.group.clone()) {
            return Err(Failure::Usage(format!(
                "--group: group {:?} is given twice",
                g.group.as_str()
            )));
        }
    }
    Ok(groups)
}

/// `NAME:SHARDS` split, when `value` ends with a colon and digits.
fn split(value: &str) -> Option<(&str, &str)> {
    value
        .rsplit_once(':')
        .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// What follows the last colon of `value` when it looks like a shard count but is none: a sign
/// or a decimal point with digits (`-1`, `+4`, `1.5`), or digits with a suffix (`16k`).
fn not_a_count(value: &str) -> Option<&str> {
    let (_, tail) = value.rsplit_once(':')?;
    let unsigned = tail.trim_start_matches(['+', '-']);
    let numeric = unsigned.starts_with(|c: char| c.is_ascii_digit() || c == '.')
        && unsigned.bytes().any(|b| b.is_ascii_digit());
    (numeric && !tail.bytes().all(|b| b.is_ascii_digit())).then_some(tail)
}

/// A store's refusal of group `g` at start, or while it runs, naming the flag.
pub fn group_failure(g: &GroupArg, e: &StoreError) -> Failure {
    match e {
        StoreError::ShardCountMismatch {
            group,
            configured,
            found,
        } => Failure::Usage(format!(
            "{}: group {group:?} exists with {found} shards, not {configured}; a group's shard \
             count changes only with leasectl resize",
            g.flag
        )),
        other => Failure::Runtime(format!("group {:?}: {}", g.group.as_str(), Chain(other))),
    }
}

/// What creating group `g` ([`WorkerStore::ensure_group`](lease::store::WorkerStore::ensure_group)) would answer, without writing: `Ok`
/// for a group not created yet, or stored with `g`'s count or the count it was last resized
/// from (E3); else the mismatch, naming the flag.
pub async fn check_group(store: &dyn LeaseStore, g: &GroupArg) -> Result<(), Failure> {
    match store.snapshot(&g.group).await {
        Ok(snap) if snap.shard_count != g.shards && snap.previous != Some(g.shards) => {
            Err(group_failure(
                g,
                &StoreError::ShardCountMismatch {
                    group: g.group.clone(),
                    configured: g.shards,
                    found: snap.shard_count,
                },
            ))
        }
        Ok(_) | Err(StoreError::GroupNotFound { .. }) => Ok(()),
        Err(other) => Err(store_failure(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    /// The groups `leasectl worker` would run for these flags, or the usage error's message.
    fn groups(flags: &[&str]) -> Result<Vec<(String, u32)>, String> {
        let cli = Cli::try_parse_from(std::iter::once("worker").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?;
        match group_args(&cli.args) {
            Ok(groups) => Ok(groups
                .into_iter()
                .map(|g| (g.group.as_str().to_owned(), g.shards.get()))
                .collect()),
            Err(Failure::Usage(message)) => Err(message),
            Err(_) => Err("not a usage error".to_owned()),
        }
    }

    #[test]
    fn groups_are_given_plain_or_with_their_counts() {
        assert_eq!(
            groups(&["--group", "orders", "--shards", "16"]),
            Ok(vec![("orders".to_owned(), 16)])
        );
        assert_eq!(
            groups(&["--group", "orders:16", "--group", "billing:64"]),
            Ok(vec![("orders".to_owned(), 16), ("billing".to_owned(), 64)])
        );
        // A name may hold colons: the count is what follows the last one.
        assert_eq!(
            groups(&["--group", "ns:orders:8"]),
            Ok(vec![("ns:orders".to_owned(), 8)])
        );
        assert_eq!(
            groups(&["--group", "ns:orders", "--shards", "8"]),
            Ok(vec![("ns:orders".to_owned(), 8)])
        );
    }

    #[test]
    fn a_mix_or_a_missing_count_is_a_usage_error_naming_the_flag() {
        let mix = groups(&[
            "--group",
            "orders",
            "--group",
            "billing:64",
            "--shards",
            "16",
        ]);
        assert!(
            mix.as_ref().is_err_and(|m| m.contains("not a mix")),
            "{mix:?}"
        );
        let mix = groups(&["--group", "orders:16", "--shards", "16"]);
        assert!(
            mix.as_ref().is_err_and(|m| m.contains("not a mix")),
            "{mix:?}"
        );
        let two_plain = groups(&["--group", "orders", "--group", "billing", "--shards", "16"]);
        assert!(two_plain.is_err(), "{two_plain:?}");
        let missing = groups(&["--group", "orders"]);
        assert!(
            missing
                .as_ref()
                .is_err_and(|m| m.starts_with("--shards") && m.contains("orders:N")),
            "{missing:?}"
        );
        let zero = groups(&["--group", "orders:0"]);
        assert!(
            zero.as_ref()
                .is_err_and(|m| m.starts_with("--group orders:0")),
            "{zero:?}"
        );
        let twice = groups(&["--group", "orders:4", "--group", "orders:4"]);
        assert!(
            twice.as_ref().is_err_and(|m| m.contains("given twice")),
            "{twice:?}"
        );
        let none = groups(&[]);
        assert!(none.is_err(), "{none:?}");
    }

    /// `x:-1`, `x:1.5`: a count was meant. The message says what a count is, instead of taking
    /// the value for a group's name and suggesting `x:-1:N`.
    #[test]
    fn a_count_that_is_no_whole_number_says_what_a_count_is() {
        let rule = "the shard count must be a whole number from 1 to 65536";
        for (value, count) in [
            ("x:-1", "-1"),
            ("x:1.5", "1.5"),
            ("ns:x:+4", "+4"),
            ("x:16k", "16k"),
        ] {
            assert_eq!(
                groups(&["--group", value]),
                Err(format!("--group {value}: {rule}, not {count}"))
            );
        }
        assert_eq!(
            groups(&["--group", "a:4", "--group", "x:-1"]),
            Err(format!("--group x:-1: {rule}, not -1"))
        );
        assert_eq!(
            groups(&["--group", "x:99999999999"]),
            Err(
                "--group x:99999999999: shard count 99999999999 is out of range; it must be \
                 between 1 and 65536"
                    .to_owned()
            )
        );
        // With --shards the value is a name, colons and all.
        assert_eq!(
            groups(&["--group", "x:-1", "--shards", "4"]),
            Ok(vec![("x:-1".to_owned(), 4)])
        );
    }
}
