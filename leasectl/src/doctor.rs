//! `leasectl doctor`: check a database the way a worker would use it, and say what each
//! finding means for the leases.
//!
//! Each check ends `ok`, `warn` (workers run, but something is weaker than it could be) or
//! `FAIL` (workers cannot run, or would refuse to). Exit 0 when nothing failed, 1 otherwise.
//!
//! On etcd (the `etcd` feature) it checks what applies there: that the members answer a read
//! of the nodes' sessions (which needs a leader, and writes nothing). The Postgres checks
//! (TLS, server version, schema, privileges, primary, clock, replication, wake-ups) do not
//! apply and are not printed; the connection line says so.

use clap::Args;
use lease::postgres::diagnose::{Diagnosis, Replication};
use lease::postgres::privileges::{RoleKind, RoleName};
use lease::postgres::{PgLeaseStore, PgSetupError, TlsMode, Verification};
use lease::store::Chain;
use serde_json::json;

use crate::common::{Backend, DbArgs};
use crate::output;
use crate::output::Failure;

/// The oldest server the engine's SQL runs on (covering indexes with `INCLUDE`).
const MIN_SERVER_VERSION: u32 = 110_000;
/// Skew beyond which the clocks are reported as apart.
const SKEW_WARNING: chrono::TimeDelta = chrono::TimeDelta::seconds(1);

/// `leasectl doctor`'s arguments.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    db: DbArgs,
    /// Print one JSON object instead of lines.
    #[arg(long)]
    json: bool,
}

/// How a check ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
        }
    }
}

/// One finding.
#[derive(Debug)]
struct Check {
    name: &'static str,
    status: Status,
    detail: String,
}

fn check(name: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        name,
        status,
        detail: detail.into(),
    }
}

/// Run the checks and print them.
pub async fn run(args: DoctorArgs) -> Result<(), Failure> {
    let checks = match args.db.backend()? {
        Backend::Postgres(store) => postgres(&store).await,
        #[cfg(feature = "etcd")]
        Backend::Etcd(url) => etcd(&url).await,
    };
    let failed = checks.iter().any(|c| c.status == Status::Fail);
    if args.json {
        output::line(json!({
            "ok": !failed,
            "checks": checks.iter().map(|c| json!({
                "check": c.name,
                "status": c.status.as_str().to_ascii_lowercase(),
                "detail": c.detail,
            })).collect::<Vec<_>>(),
        }))?;
    } else {
        for c in &checks {
            output::line(format!(
                "{:<4}  {:<12} {}",
                c.status.as_str(),
                c.name,
                c.detail
            ))?;
        }
    }
    if failed {
        let names: Vec<&str> = checks
            .iter()
            .filter(|c| c.status == Status::Fail)
            .map(|c| c.name)
            .collect();
        return Err(Failure::Runtime(format!(
            "workers cannot run here as configured: {} failed",
            names.join(", ")
        )));
    }
    Ok(())
}

/// The checks on a Postgres database.
async fn postgres(store: &PgLeaseStore) -> Vec<Check> {
    // One attempt: the doctor reports an unreachable server rather than wait for it.
    match store.diagnose().await {
        Ok(diagnosis) => {
            let mut checks = judge(&diagnosis);
            let at = checks
                .iter()
                .position(|c| c.name == "schema")
                .map_or(checks.len(), |i| i + 1);
            checks.insert(at, privileges(store, &diagnosis).await);
            checks.push(failover(store).await);
            checks
        }
        Err(e) => vec![unreachable(&e)],
    }
}

/// The checks on an etcd cluster: the members answer a read of the nodes' sessions (one
/// attempt, no write, no heartbeat).
#[cfg(feature = "etcd")]
async fn etcd(url: &lease_etcd::EtcdUrl) -> Vec<Check> {
    use lease::store::AdminStore;

    let members = url.endpoints.join(",");
    let store = match lease_etcd::EtcdLeaseStore::connect(url).await {
        Ok(store) => store,
        Err(e) => return vec![check("connection", Status::Fail, Chain(&e).to_string())],
    };
    match store.nodes().await {
        Ok(nodes) => {
            let live = nodes.nodes.iter().filter(|n| n.live).count();
            vec![
                check(
                    "connection",
                    Status::Ok,
                    format!(
                        "etcd members {members}, key prefix {:?} (the Postgres checks: TLS, \
                         schema, privileges, replication, pooler, do not apply to etcd)",
                        url.prefix
                    ),
                ),
                check(
                    "sessions",
                    Status::Ok,
                    format!(
                        "the cluster has a leader and answers reads: {} nodes known under the \
                         prefix, {live} live",
                        nodes.nodes.len()
                    ),
                ),
            ]
        }
        Err(e) => {
            let hint = if e.is_transient() {
                " (this may pass once the cluster is up and has a leader: retry)"
            } else {
                ""
            };
            vec![check(
                "connection",
                Status::Fail,
                format!("etcd members {members}: {}{hint}", Chain(&e)),
            )]
        }
    }
}

/// The connected role against what a worker needs (`leasectl grant` prints the statements).
async fn privileges(store: &PgLeaseStore, d: &Diagnosis) -> Check {
    const NAME: &str = "privileges";
    if d.schema
        .as_ref()
        .is_err_and(|e| !matches!(e, PgSetupError::PermissionDenied { .. }))
    {
        return check(
            NAME,
            Status::Warn,
            "not checked: the schema is not as expected",
        );
    }
    let role = match RoleName::new(&d.role) {
        Ok(role) => role,
        Err(e) => return check(NAME, Status::Warn, format!("not checked: {e}")),
    };
    match store.missing_privileges(&role, RoleKind::Worker).await {
        Ok(missing) if missing.is_empty() => check(
            NAME,
            Status::Ok,
            format!("role {:?} holds every privilege a worker uses", d.role),
        ),
        Ok(missing) => {
            let lacking: Vec<String> = missing
                .iter()
                .map(|g| format!("{} on {}", g.privileges.join(", "), g.on.name()))
                .collect();
            check(
                NAME,
                Status::Fail,
                format!(
                    "role {:?} lacks what a worker uses: {}; `leasectl grant --role {}` prints \
                     the statements that give it",
                    d.role,
                    lacking.join("; "),
                    d.role
                ),
            )
        }
        Err(e) => check(NAME, Status::Warn, format!("not checked: {}", Chain(&e))),
    }
}

fn unreachable(e: &PgSetupError) -> Check {
    let hint = if e.is_transient() {
        " (this may pass once the server is up: retry)"
    } else {
        ""
    };
    check("connection", Status::Fail, format!("{}{hint}", Chain(e)))
}

fn judge(d: &Diagnosis) -> Vec<Check> {
    vec![
        check(
            "connection",
            Status::Ok,
            format!(
                "database {:?} as role {:?}{}",
                d.database,
                d.role,
                if d.over_socket {
                    " over a unix socket"
                } else {
                    ""
                }
            ),
        ),
        tls(d),
        version(d),
        schema(d),
        primary(d),
        clock(d),
        replication(&d.replication),
        listen(d),
    ]
}

fn tls(d: &Diagnosis) -> Check {
    if d.over_socket {
        return check(
            "tls",
            Status::Ok,
            "not used over a unix socket (local only)",
        );
    }
    let settings = d.tls.settings.as_ref();
    if !d.tls.in_use {
        let asked = settings.map_or(String::new(), |s| format!(" ({s})"));
        return check(
            "tls",
            Status::Warn,
            format!(
                "not in use{asked}: credentials and leases cross the network in the clear; set \
                 sslmode=verify-full with sslrootcert"
            ),
        );
    }
    let version = d.tls.version.as_deref().unwrap_or("TLS");
    match settings.map(|s| (s.mode, s.verification)) {
        Some((_, Verification::Full)) => check(
            "tls",
            Status::Ok,
            format!("{version}, the server's certificate and host name verified (verify-full)"),
        ),
        Some((_, Verification::Chain)) => check(
            "tls",
            Status::Warn,
            format!(
                "{version}, the server's certificate chain verified but not its host name \
                 (verify-ca): use verify-full"
            ),
        ),
        Some((mode, _)) => check(
            "tls",
            Status::Warn,
            format!(
                "{version}, the server's certificate not verified (sslmode={}): anyone in the \
                 path could pose as the server; use verify-full with sslrootcert",
                if mode == TlsMode::Prefer {
                    "prefer"
                } else {
                    mode.as_str()
                }
            ),
        ),
        None => check("tls", Status::Ok, format!("{version} (settings unknown)")),
    }
}

fn version(d: &Diagnosis) -> Check {
    if d.server_version_num < MIN_SERVER_VERSION {
        return check(
            "server",
            Status::Fail,
            format!(
                "PostgreSQL {}: the engine needs 11 or newer",
                d.server_version
            ),
        );
    }
    check(
        "server",
        Status::Ok,
        format!("PostgreSQL {}", d.server_version),
    )
}

fn schema(d: &Diagnosis) -> Check {
    match &d.schema {
        Ok(()) => check(
            "schema",
            Status::Ok,
            "schema `lease` is installed and matches this build",
        ),
        Err(e) => check("schema", Status::Fail, Chain(e).to_string()),
    }
}

fn primary(d: &Diagnosis) -> Check {
    if d.in_recovery {
        return check(
            "primary",
            Status::Fail,
            "this server is a standby (in recovery): workers write, so they need the primary; \
             list every host in the URL with target_session_attrs=read-write",
        );
    }
    if d.read_only {
        return check(
            "primary",
            Status::Fail,
            "connections are read-only here (default_transaction_read_only is on): workers \
             cannot write their leases",
        );
    }
    check("primary", Status::Ok, "a writable primary")
}

fn clock(d: &Diagnosis) -> Check {
    let skew = d.clock.skew;
    let text = format!(
        "the server's clock is {:+.3} s from this host's (to within {:.1} ms)",
        skew.as_seconds_f64(),
        d.clock.round_trip.as_secs_f64() * 500.0
    );
    if skew.abs() > SKEW_WARNING {
        check(
            "clock",
            Status::Warn,
            format!(
                "{text}: the server's clock alone decides expiry, so leases stay safe, but \
                 times in `status` and in the workers' logs disagree by that much; check NTP"
            ),
        )
    } else {
        check("clock", Status::Ok, text)
    }
}

fn replication(r: &Replication) -> Check {
    let names: Vec<String> = r
        .standbys
        .iter()
        .map(|s| {
            format!(
                "{} ({})",
                if s.name.is_empty() { "?" } else { &s.name },
                s.sync_state
                    .as_deref()
                    .unwrap_or("state not visible to this role")
            )
        })
        .collect();
    if r.standbys.is_empty() {
        return check(
            "replication",
            Status::Warn,
            "no streaming standby is connected (or this role may not see it): if this server is \
             lost, so are the leases until it is restored",
        );
    }
    if r.commits_wait_for_a_standby() {
        return check(
            "replication",
            Status::Ok,
            format!(
                "synchronous (synchronous_commit={}, standbys: {}): every lease the primary \
                 acknowledges is on a standby, so a failover loses none",
                r.synchronous_commit,
                names.join(", ")
            ),
        );
    }
    if r.configured_synchronous() && r.standbys.iter().all(|s| s.sync_state.is_none()) {
        return check(
            "replication",
            Status::Ok,
            format!(
                "synchronous by its settings (synchronous_commit={}, synchronous_standby_names={:?}, \
                 standbys: {}): commits wait for a named standby, so a failover to it loses \
                 no lease; which standby is in sync is visible to members of pg_monitor",
                r.synchronous_commit,
                r.synchronous_standby_names,
                names.join(", ")
            ),
        );
    }
    check(
        "replication",
        Status::Warn,
        format!(
            "asynchronous (synchronous_commit={}, synchronous_standby_names={:?}, standbys: \
             {}): a promoted standby may lack the last claims and sessions the primary \
             acknowledged; the engine keeps leases exclusive and tokens rising across it (no \
             claim for one ttl after the failover), but set synchronous_standby_names for \
             failovers that lose nothing",
            r.synchronous_commit,
            r.synchronous_standby_names,
            names.join(", ")
        ),
    )
}

/// How the sessions came through the last failover: kept with their buckets, or restarted
/// and why (rule V4), as the node rows say.
async fn failover(store: &PgLeaseStore) -> Check {
    use lease::store::AdminStore;
    let nodes = match store.nodes().await {
        Ok(nodes) => nodes,
        Err(e) => {
            return check(
                "failover",
                Status::Warn,
                format!("the nodes could not be read: {}", Chain(&e)),
            );
        }
    };
    match crate::status::crossed(&nodes) {
        None => check(
            "failover",
            Status::Ok,
            "no session listed came through a failover",
        ),
        Some((kept, ended)) if ended.is_empty() => check(
            "failover",
            Status::Ok,
            format!("after the last failover every session ({kept}) was kept with its buckets"),
        ),
        Some((kept, ended)) => check(
            "failover",
            Status::Warn,
            format!(
                "after the last failover {kept} session(s) were kept with their buckets and {} \
                 restarted ({}): a session restarts when the new primary may lack one of its \
                 writes (asynchronous replication, a write in flight) or cannot tell (a \
                 promoted server restarted, or running for less than a second before the old \
                 primary's last heartbeat it replayed)",
                ended.len(),
                ended
                    .iter()
                    .map(|(node, why)| format!("{node}: {why}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
    }
}

fn listen(d: &Diagnosis) -> Check {
    if let Some(direct) = &d.direct_listen {
        return if direct.works {
            check(
                "wake-ups",
                Status::Ok,
                format!(
                    "LISTEN/NOTIFY works over the direct URL ({:.1} ms round trip), which \
                     workers listen on{}",
                    direct.waited.as_secs_f64() * 1_000.0,
                    if d.listen.works {
                        ""
                    } else {
                        "; through the main URL it does not (a pooler is in the way)"
                    }
                ),
            )
        } else {
            check(
                "wake-ups",
                Status::Warn,
                "a NOTIFY did not reach a LISTEN over the direct URL: is it a pooler too? \
                 Workers re-plan only at their renew interval",
            )
        };
    }
    if d.transaction_pooler {
        return check(
            "wake-ups",
            Status::Warn,
            "behind a transaction pooler without --direct-url: workers cannot LISTEN, so they \
             re-plan only at their renew interval; give a direct URL for prompt wake-ups",
        );
    }
    if d.listen.works {
        check(
            "wake-ups",
            Status::Ok,
            format!(
                "LISTEN/NOTIFY works ({:.1} ms round trip): workers re-plan at once on joins, \
                 leaves and releases",
                d.listen.waited.as_secs_f64() * 1_000.0
            ),
        )
    } else {
        check(
            "wake-ups",
            Status::Warn,
            format!(
                "a NOTIFY did not reach this client's LISTEN within {:.1} s: a transaction \
                 pooler (PgBouncer) is probably in the way; workers then re-plan only at their \
                 renew interval unless given a direct URL for wake-ups",
                d.listen.waited.as_secs_f64()
            ),
        )
    }
}
