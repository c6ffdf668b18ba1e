//! `leasectl migrate`: apply the embedded migrations (creates schema `lease`); idempotent, and
//! safe to run from many processes at once. On etcd there is no schema: it says so and does
//! nothing.

use clap::Args;
use lease::postgres::PgLeaseStore;

use crate::common::{Backend, DbArgs, retry_while_unreachable};
use crate::output;
use crate::output::Failure;

/// `leasectl migrate`'s arguments.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    #[command(flatten)]
    db: DbArgs,
}

/// Apply what is missing and say what was applied, and which migrations of a newer release
/// (all additive, or migrate would have refused) the schema has besides.
pub async fn run(args: MigrateArgs) -> Result<(), Failure> {
    match args.db.backend()? {
        Backend::Postgres(store) => migrate(args.db.store_to_migrate(store)?).await,
        #[cfg(feature = "etcd")]
        Backend::Etcd(url) => {
            let done = format!(
                "nothing to migrate: the etcd store has no schema (its keys under prefix {:?} \
                 are written as workers run)",
                url.prefix
            );
            output::line(&done).map_err(|e| e.failure_after(&done))
        }
    }
}

async fn migrate(store: PgLeaseStore) -> Result<(), Failure> {
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
