//! `leasectl migrate`: apply the embedded migrations (creates schema `lease`); idempotent.

use clap::Args;

use crate::common::{DbArgs, Failure, retry_while_unreachable};
use crate::output;

/// `leasectl migrate`'s arguments.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
}

/// Apply what is missing and say what was applied.
pub async fn run(args: MigrateArgs) -> Result<(), Failure> {
    let store = args.db.store_to_migrate()?;
    let applied = retry_while_unreachable(|| store.migrate()).await?;
    if applied.is_empty() {
        return Ok(output::line("the lease schema is up to date")?);
    }
    let done = format!("applied migrations: {}", applied.join(", "));
    output::line(&done).map_err(|e| e.failure_after(&done))
}
