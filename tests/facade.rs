//! The facade's layout, held in place.
//!
//! At compile time: [`names`] imports every item of the facade by the path it has there (the
//! root, `store`, `policy`, `machine`, `audit`) and each backend's key items, so that removing
//! or moving one breaks this build.
//!
//! At run time: [`every_item_of_the_inner_crates_has_one_home`] reads what `lease-core` and
//! `lease-worker` export (their `pub use` lists and the items of their public modules) and
//! what `src/lib.rs` re-exports, and checks that each inner item is re-exported exactly once,
//! that the facade re-exports nothing else, and that [`names`] lists each at its home. A new
//! item in an inner crate fails it until it is given a home here. It reads the workspace's
//! sources, so it runs from the workspace, not from a packaged crate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every facade item at its home, as plain `use` lists (no nested braces): the run-time test
/// parses them.
#[allow(unused_imports)]
mod names {
    // The root: what an application touches.
    use lease::{
        Assignment, Bucket, BucketLease, ConfigError, ErrorKind, EventSender, FencingToken,
        GroupError, GroupHandle, GroupName, InvalidInput, LeaseNode, LeaseNodeBuilder, LeaseWorker,
        LeaseWorkerBuilder, Leases, Load, LoadReporter, MemberMetadata, NodeHandle, NodeId, Owned,
        OwnershipEvent, OwnershipHandler, RevokeReason, ShardCount, StartError, StoreError, Ttl,
        Weight, WorkerError, WorkerFailed, WorkerHandle, event_channel,
    };

    // The store contract and what its signatures name.
    use lease::store::resize::{children, gcd, parents, shares_keys};
    use lease::store::{
        AdminStore, BackendFailure, BucketInfo, BucketState, Chain, Change, ChangeFeed, Clock,
        EndReason, Generation, GroupBeat, GroupSnapshot, GroupStamp, GroupView, Heartbeat,
        Incarnation, Lease, LeaseStore, LogPosition, MAX_QUARANTINE, MAX_WEIGHT, ManualClock,
        MemberControl, MemberInfo, MemberLoad, MemberMode, NodeInfo, NodesSnapshot, Operation,
        QuarantineFor, QuarantineReason, ResizeOutcome, SessionBound, SessionId, SystemClock,
        TENURES_KEPT, Takeover, Tenure, TenureEnd, Tenures, Timestamp, ViewStamp, WorkerStore,
        store_precision,
    };
    use lease::store::{LOADED_LISTED, list_loaded};
    #[cfg(feature = "mock")]
    use lease::store::{MockAdminStore, MockWorkerStore};

    // The policy, the machine, the ownership-log checker.
    use lease::audit::{Entry, Holding, OwnershipLog, Summary};
    use lease::balance::{
        Balance, BalanceConfig, HalfLife, LoadPlan, Smoothed, plan_loads, worth_publishing,
    };
    use lease::machine::{
        Answered, CLAIM_BATCH, ClockStep, Delivery, Input, LoadRules, Machine, Output,
        RELEASE_BATCH, Report, Rules, StoreCall,
    };
    use lease::policy::{Plan, Target, minimum_moves, plan, shareable, targets};

    // The backends and the test support: their key items (each module is its crate, whole).
    #[cfg(feature = "etcd")]
    use lease::etcd::{EtcdLeaseStore, EtcdUrl};
    use lease::memory::MemoryLeaseStore;
    use lease::postgres::{MIGRATIONS, PgLeaseStore, PgLeaseStoreBuilder, PgSetupError};
    use lease::testing::{FaultyStore, RecordingHandler};
}

/// The facade modules that are a backend (or the test support) whole, not part of the split.
const WHOLE_CRATES: [&str; 4] = ["postgres", "memory", "etcd", "testing"];

/// The workspace root (this crate's directory).
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    let file = root().join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
}

/// `text` without its `//` comments (doc comments included).
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The names a `use` body brings in, with the path they come from: `a::b::{C, D as E}` gives
/// `("a::b", "C")` and `("a::b", "E")`; `a::b::*` gives `("a::b", "*")`.
fn use_names(body: &str) -> Vec<(String, String)> {
    let body: String = body.split_whitespace().collect::<Vec<_>>().join(" ");
    let (prefix, list) = match body.find('{') {
        Some(open) => (
            body[..open].trim_end_matches("::").to_string(),
            body[open + 1..body.rfind('}').expect("a closing brace")].to_string(),
        ),
        None => match body.rfind("::") {
            Some(sep) => (body[..sep].to_string(), body[sep + 2..].to_string()),
            None => (String::new(), body.clone()),
        },
    };
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| {
            let name = n.rsplit(" as ").next().unwrap_or(n).trim().to_string();
            (prefix.clone(), name)
        })
        .collect()
}

/// Every `pub use` (or, with `public == false`, every `use`) of `src` with the module path it
/// sits in (`""` for the top): `(module, source path, name)`.
fn uses_by_module(src: &str, public: bool) -> Vec<(String, String, String)> {
    let src = code(src);
    let keyword = if public { "pub use " } else { "use " };
    let mut found = Vec::new();
    let mut modules: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < src.len() {
        let rest = &src[i..];
        let at_word = i == 0 || !src[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_');
        if at_word && rest.starts_with("pub mod ") {
            let name = ident(&rest["pub mod ".len()..]);
            let after = rest["pub mod ".len() + name.len()..].trim_start();
            if after.starts_with('{') {
                modules.push((name, depth));
                depth += 1;
                i = src.len() - after.len() + 1;
                continue;
            }
        }
        if at_word && rest.starts_with(keyword) && !src[..i].ends_with("pub ") {
            let end = rest.find(';').expect("a use ends with ;");
            let module = modules
                .iter()
                .map(|(m, _)| m.as_str())
                .collect::<Vec<_>>()
                .join("::");
            for (from, name) in use_names(&rest[keyword.len()..end]) {
                found.push((module.clone(), from, name));
            }
            i += end + 1;
            continue;
        }
        let c = rest.chars().next().expect("a char");
        if c == '{' {
            depth += 1;
        } else if c == '}' {
            depth -= 1;
            if modules.last().is_some_and(|(_, d)| *d == depth) {
                modules.pop();
            }
        }
        i += c.len_utf8();
    }
    found
}

/// The public items of a module file: those declared at its top (`pub fn`, `pub struct`, ...)
/// and those it re-exports from its own submodules (`pub use calls::{Input, Output};`).
fn module_items(path: &str) -> BTreeSet<String> {
    let source = read(path);
    let mut items = declared_items(&source);
    items.extend(
        uses_by_module(&source, true)
            .into_iter()
            .map(|(_, _, name)| name)
            .filter(|name| name != "*"),
    );
    items
}

/// The public items declared at the top of a module's source.
fn declared_items(source: &str) -> BTreeSet<String> {
    let kinds = [
        "fn ",
        "async fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "const ",
        "static ",
    ];
    source
        .lines()
        .filter_map(|line| line.strip_prefix("pub "))
        .filter_map(|rest| kinds.iter().find_map(|k| rest.strip_prefix(k)).map(ident))
        .collect()
}

/// What an inner crate exports: its `pub use` names and the items of its public modules, each
/// with the path it has there (`lease_core::GroupBeat`, `lease_core::policy::Target`). Also
/// returns each public module's items, to expand the facade's globs.
fn inner_api(
    krate: &str,
    dir: &str,
) -> (BTreeMap<String, String>, BTreeMap<String, BTreeSet<String>>) {
    let lib = read(&format!("{dir}/src/lib.rs"));
    let mut api = BTreeMap::new();
    let mut modules = BTreeMap::new();
    for line in code(&lib).lines() {
        if let Some(rest) = line.trim().strip_prefix("pub mod ") {
            let module = ident(rest);
            let items = module_items(&format!("{dir}/src/{module}.rs"));
            assert!(!items.is_empty(), "{krate}::{module} declares no item");
            for item in &items {
                api.insert(item.clone(), format!("{krate}::{module}::{item}"));
            }
            modules.insert(format!("{krate}::{module}"), items);
        }
    }
    for (_, from, name) in uses_by_module(&lib, true) {
        api.entry(name.clone())
            .or_insert_with(|| format!("{krate}::{from}::{name}"));
    }
    (api, modules)
}

#[test]
fn every_item_of_the_inner_crates_has_one_home() {
    let (mut inner, mut modules) = inner_api("lease_core", "lease-core");
    let (worker, worker_modules) = inner_api("lease_worker", "lease-worker");
    for (name, path) in worker {
        if let Some(other) = inner.insert(name.clone(), path.clone()) {
            panic!("{name} is both {other} and {path}: this check keys items by name");
        }
    }
    modules.extend(worker_modules);
    assert!(inner.len() > 90, "too few inner items found: {inner:?}");

    // Where the facade puts each: `src/lib.rs`'s `pub use`s, globs expanded.
    let mut homes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (module, from, name) in uses_by_module(&read("src/lib.rs"), true) {
        if WHOLE_CRATES.contains(&module.as_str()) {
            continue;
        }
        let names = if name == "*" {
            modules
                .get(&from)
                .unwrap_or_else(|| panic!("a glob of {from}, which is no public module"))
                .iter()
                .cloned()
                .collect()
        } else {
            vec![name]
        };
        for name in names {
            assert!(
                inner.contains_key(&name),
                "the facade exports {module}::{name}, which no inner crate exports"
            );
            homes.entry(name).or_default().push(module.clone());
        }
    }
    let lost: Vec<&String> = inner
        .iter()
        .filter(|(name, _)| !homes.contains_key(*name))
        .map(|(_, path)| path)
        .collect();
    assert!(lost.is_empty(), "inner items the facade lost: {lost:?}");
    let twice: Vec<_> = homes.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(twice.is_empty(), "items with more than one home: {twice:?}");

    // The compile-time list above names each at its home, and nothing else.
    let this = include_str!("facade.rs");
    let start = this.find("\nmod names {").expect("the module `names`");
    let end = start + this[start..].find("\n}\n").expect("the end of `names`");
    let listed: BTreeSet<(String, String)> = uses_by_module(&this[start..end], false)
        .into_iter()
        .filter_map(|(_, from, name)| {
            let module = match from.as_str() {
                "lease" => String::new(),
                other => other.strip_prefix("lease::")?.to_string(),
            };
            (!WHOLE_CRATES.contains(&module.as_str())).then_some((module, name))
        })
        .collect();
    let homed: BTreeSet<(String, String)> = homes
        .into_iter()
        .map(|(name, at)| (at[0].clone(), name))
        .collect();
    let unlisted: Vec<_> = homed.difference(&listed).collect();
    assert!(
        unlisted.is_empty(),
        "facade items `names` does not list: {unlisted:?}"
    );
    let stray: Vec<_> = listed.difference(&homed).collect();
    assert!(
        stray.is_empty(),
        "`names` lists what the facade does not export: {stray:?}"
    );
}
