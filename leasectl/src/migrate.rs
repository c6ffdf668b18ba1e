//! `leasectl migrate`: apply the embedded migrations (creates schema `lease`); idempotent, and
//! safe to run from many processes at once.

use clap::Args;

use crate::common::{DbArgs, Failure, retry_while_unreachable};
use crate::output;

/// `leasectl migrate`'s arguments.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
}

/// Apply what is missing and say what was applied, and which migrations of a newer release
/// (all additive, or migrate would have refused) the schema has besides.
pub async fn run(args: MigrateArgs) -> Result<(), Failure> {
    let store = args.db.store_to_migrate()?;
    let applied = retry_while_unreachable(|| store.migrate()).await?;
    let mut lines = vec![if applied.is_empty() {
        "the lease schema is up to date".to_owned()
    } else {
        format!("applied migrations: {}", applied.join(", "))
    }];
    // A courtesy: what was applied is said even if this read fails.
    if let Ok(status) = store.schema_status().await
        && !status.newer_additive.is_empty()
    {
        lines.push(format!(
            "the schema also has migrations of a newer release, all additive: {} (this \
             leasectl works with them)",
            status.newer_additive.join(", ")
        ));
    }
    let done = lines.join("\n");
    output::line(&done).map_err(|e| e.failure_after(&lines[0]))
}
