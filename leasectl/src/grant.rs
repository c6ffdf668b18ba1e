//! `leasectl grant`: the privileges a role needs to run workers, read groups or fence writes,
//! printed as SQL (by default) or applied. The list is the library's
//! (`lease::postgres::privileges`), the one place that says what the engine uses.

use clap::{Args, ValueEnum};
use lease::postgres::privileges::{self, RoleKind, RoleName};

use crate::common::{DbArgs, retry_while_unreachable};
use crate::output;
use crate::output::Failure;

/// What the role is for.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum Kind {
    /// Runs workers (`leasectl worker`, `leasectl run`, the library's LeaseWorker) and
    /// `leasectl release`; quarantines buckets (`leasectl run`'s crash loops need it).
    Worker,
    /// Reads groups: `leasectl status`, monitoring.
    Monitor,
    /// An application fencing its writes with `lease.is_current`.
    Fencing,
}

impl From<Kind> for RoleKind {
    fn from(kind: Kind) -> Self {
        match kind {
            Kind::Worker => RoleKind::Worker,
            Kind::Monitor => RoleKind::Monitor,
            Kind::Fencing => RoleKind::Fencing,
        }
    }
}

/// `leasectl grant`'s arguments.
#[derive(Args, Debug)]
pub struct GrantArgs {
    #[command(flatten)]
    db: DbArgs,
    /// The role to grant to, spelled as the catalogs spell it (case-sensitive; it is quoted).
    #[arg(long)]
    role: String,
    /// What the role is for.
    #[arg(long, value_enum, default_value_t = Kind::Worker)]
    kind: Kind,
    /// Apply the statements on the database (connecting as the owner of schema `lease`, the
    /// role that ran `leasectl migrate`) instead of printing them.
    #[arg(long)]
    apply: bool,
}

/// Print the statements, or apply them and print what was applied.
pub async fn run(args: GrantArgs) -> Result<(), Failure> {
    let role = RoleName::new(&args.role).map_err(|e| Failure::Usage(format!("--role: {e}")))?;
    let kind = RoleKind::from(args.kind);
    if !args.apply {
        let mut lines = vec![
            format!("-- Privileges of a {kind} role: {}.", kind.describe()),
            "-- Run as the owner of schema lease (the role that ran leasectl migrate), or apply \
             them with --apply."
                .to_owned(),
            "-- The role also needs CONNECT on the database, which PUBLIC has unless revoked."
                .to_owned(),
        ];
        lines.extend(privileges::grants(kind, &role));
        lines.push(String::new());
        return Ok(output::text(lines.join("\n"))?);
    }
    let store = args.db.open_postgres("grant --apply").await?;
    let applied = retry_while_unreachable(|| store.grant_privileges(&role, kind)).await?;
    let mut lines = vec![format!("-- granted to {role}, a {kind} role:")];
    lines.extend(applied);
    lines.push(String::new());
    let done = lines.join("\n");
    output::text(&done).map_err(|e| e.failure_after(&format!("granted to {role}")))
}
