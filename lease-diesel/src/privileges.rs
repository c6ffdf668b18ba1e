//! The privileges each kind of role needs on the engine's schema, in one place: the GRANT
//! statements `leasectl grant` prints or applies, the check of what a role lacks, and the list
//! a test compares with the objects of schema `lease` after migrating (a migration that adds a
//! table or a function fails it until this list says who needs what on it).
//!
//! Exactly what the engine's statements use, no more: a worker's role may not delete groups or
//! buckets (nothing a worker runs does; `resize`, which moves bucket rows, is the operator's
//! and runs as the schema's owner or a role granted more), a monitor's may only read, a fencing application's
//! may only call `lease.is_current` (which runs with its owner's rights). No kind may create
//! anything: only `migrate` does, as the schema's owner. The roles also need `CONNECT` on the
//! database, which `PUBLIC` has unless it was revoked.

use std::fmt;

use diesel::QueryableByName;
use diesel::sql_types::{Array, Bool, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

use crate::PgLeaseStore;
use crate::error::PgSetupError;

/// What a role is for; each kind has its own list of privileges ([`required`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoleKind {
    /// Runs workers (`leasectl worker`, the library's `LeaseWorker`), `leasectl release` and
    /// operators' controls (`PgLeaseStore::control`, `quarantine`): reads and writes the
    /// engine's tables, calls its functions.
    Worker,
    /// Reads who owns what (`leasectl status`, `PgLeaseStore::snapshot`); writes nothing, so
    /// it works against a hot standby too.
    Monitor,
    /// An application fencing its own writes with `lease.is_current`, and nothing else.
    Fencing,
}

impl RoleKind {
    /// Every kind, in order.
    pub const ALL: [RoleKind; 3] = [RoleKind::Worker, RoleKind::Monitor, RoleKind::Fencing];

    /// Its name on the command line (`worker`, `monitor`, `fencing`).
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Worker => "worker",
            RoleKind::Monitor => "monitor",
            RoleKind::Fencing => "fencing",
        }
    }

    /// What a role of this kind runs, for comments and messages.
    pub fn describe(self) -> &'static str {
        match self {
            RoleKind::Worker => {
                "runs workers (leasectl worker, leasectl run, the library's LeaseWorker) and \
                 leasectl release; quarantines buckets (leasectl run's crash loops)"
            }
            RoleKind::Monitor => "reads groups (leasectl status, PgLeaseStore::snapshot)",
            RoleKind::Fencing => "fences an application's writes with lease.is_current",
        }
    }
}

impl fmt::Display for RoleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An object of schema `lease` that privileges are granted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Object {
    /// The schema itself (`lease`).
    Schema(&'static str),
    /// A table, by its qualified name (`lease.shards`).
    Table(&'static str),
    /// A sequence, by its qualified name. The engine has none today (no serial or identity
    /// column); one added later belongs in the list like any table.
    Sequence(&'static str),
    /// A function, by its qualified signature as `GRANT ... ON FUNCTION` and
    /// `has_function_privilege` take it (`lease.channel(text)`).
    Function(&'static str),
}

impl Object {
    /// The object as `GRANT` names it: `SCHEMA lease`, `TABLE lease.shards`, ...
    pub fn sql(&self) -> String {
        match self {
            Object::Schema(name) => format!("SCHEMA {name}"),
            Object::Table(name) => format!("TABLE {name}"),
            Object::Sequence(name) => format!("SEQUENCE {name}"),
            Object::Function(signature) => format!("FUNCTION {signature}"),
        }
    }

    /// Its name (a function's: its signature).
    pub fn name(&self) -> &'static str {
        match self {
            Object::Schema(n) | Object::Table(n) | Object::Sequence(n) | Object::Function(n) => n,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Object::Schema(_) => "schema",
            Object::Table(_) => "table",
            Object::Sequence(_) => "sequence",
            Object::Function(_) => "function",
        }
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.sql())
    }
}

/// Privileges on one object.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// On what.
    pub on: Object,
    /// Which privileges (`SELECT`, `USAGE`, `EXECUTE`, ...), in the order `GRANT` lists them.
    pub privileges: Vec<&'static str>,
}

impl Grant {
    /// The `GRANT` statement giving these privileges to `role` (with its `;`).
    pub fn sql(&self, role: &RoleName) -> String {
        format!(
            "GRANT {} ON {} TO {role};",
            self.privileges.join(", "),
            self.on
        )
    }
}

impl fmt::Display for Grant {
    /// `SELECT, INSERT on TABLE lease.groups`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {}", self.privileges.join(", "), self.on)
    }
}

/// What each kind needs on one object; an object no kind needs (one only the owner uses) is
/// listed with three empty lists, so that the coverage test knows it was decided.
struct Need {
    on: Object,
    worker: &'static [&'static str],
    monitor: &'static [&'static str],
    fencing: &'static [&'static str],
}

/// THE list. Extend it with every table, sequence and function a migration adds to schema
/// `lease` (the test `the_grants_cover_every_object_of_schema_lease` fails until it is here).
const NEEDS: &[Need] = &[
    Need {
        on: Object::Schema("lease"),
        worker: &["USAGE"],
        monitor: &["USAGE"],
        fencing: &["USAGE"],
    },
    // ensure_group inserts a group (ON CONFLICT DO NOTHING) and reads its shard count.
    Need {
        on: Object::Table("lease.groups"),
        worker: &["SELECT", "INSERT"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // The heartbeat updates the node's row, inserts it, starts sessions and deletes dead
    // nodes' rows; claims, releases, joins and owner_is_dead share-lock rows (FOR SHARE needs
    // UPDATE); leave deletes a node in no group.
    Need {
        on: Object::Table("lease.nodes"),
        worker: &["SELECT", "INSERT", "UPDATE", "DELETE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // join inserts the node's row; claims and releases update the owned count and lock it
    // (FOR UPDATE: UPDATE); the heartbeat deletes dead members' rows and a new session's;
    // leave deletes the node's row; resize zeroes the counts (as the schema's owner).
    Need {
        on: Object::Table("lease.members"),
        worker: &["SELECT", "INSERT", "UPDATE", "DELETE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // Each group's change counter: ensure_group inserts it, the heartbeat reads it, joins,
    // claims, releases, leaves and the heartbeat's removals move it.
    Need {
        on: Object::Table("lease.group_changes"),
        worker: &["SELECT", "INSERT", "UPDATE"],
        monitor: &[],
        fencing: &[],
    },
    // ensure_group inserts the bucket rows; claims, releases and leaves update and lock them.
    // No worker deletes a bucket row (resize, which moves them, is not a worker's operation).
    Need {
        on: Object::Table("lease.shards"),
        worker: &["SELECT", "INSERT", "UPDATE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // A draining generation (resize inserts it): heartbeats and snapshots read it, releases
    // and leaves clear owners, claims lock old rows whose owner died (FOR UPDATE: UPDATE) and
    // delete the generation once every row is retired. Its migration grants this to the roles
    // that could update (read) lease.shards, so an upgrade stops no worker.
    Need {
        on: Object::Table("lease.draining_shards"),
        worker: &["SELECT", "UPDATE", "DELETE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // The start-up check (PgLeaseStore::check_schema) reads the versions. The runner grants
    // SELECT to PUBLIC when it creates the table; listed so a role keeps it where that grant
    // was revoked.
    Need {
        on: Object::Table("lease.engine_migrations"),
        worker: &["SELECT"],
        monitor: &["SELECT"],
        fencing: &["SELECT"],
    },
    // The heartbeat records a timeline it is the first to run on (INSERT ... ON CONFLICT DO
    // NOTHING RETURNING); claims read when the current one was first seen, and the base.
    Need {
        on: Object::Table("lease.server_epochs"),
        worker: &["SELECT", "INSERT"],
        monitor: &[],
        fencing: &[],
    },
    // The server's timeline: the heartbeat and claims read it.
    Need {
        on: Object::Function("lease.timeline()"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // Where the WAL stands: every heartbeat reads it (H10).
    Need {
        on: Object::Function("lease.wal_offset()"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // Whether a session of an earlier timeline may still be kept though expired (V4): the
    // heartbeat and its view of a group ask before they remove a dead node.
    Need {
        on: Object::Function("lease.revivable(bigint, timestamptz, timestamptz, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The first heartbeat on a timeline records it with its switch point (V2, V4).
    Need {
        on: Object::Function("lease.record_timeline(bigint, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The NOTIFY channel: the heartbeat, release and leave notify it, the feed listens on it.
    Need {
        on: Object::Function("lease.channel(text)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // Claims judge a dead owner with it.
    Need {
        on: Object::Function("lease.owner_is_dead(text, uuid, uuid, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The heartbeat (it runs with its caller's rights: the tables' privileges above).
    Need {
        on: Object::Function(
            "lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[], \
             timestamptz[], uuid, bigint, bigint)",
        ),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The heartbeat of the previous release (migration 8), which its binaries call until they
    // are rolled: it keeps no session across a failover.
    Need {
        on: Object::Function(
            "lease.heartbeat(uuid, uuid, interval, text, timestamptz, uuid, text[], bigint[], \
             timestamptz[])",
        ),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The heartbeat's view of one group.
    Need {
        on: Object::Function("lease.group_view(text, uuid, uuid, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The steady renewal fails through it when its session expired while it waited.
    Need {
        on: Object::Function("lease.renewal_too_late()"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // Leaving a group (leasectl release --force evicts with it).
    Need {
        on: Object::Function("lease.leave(text, uuid, uuid, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // Operators' controls (migration 8): lease.control writes a member's row here; the
    // heartbeat's views and snapshots read it, claims read it through lease.may_claim. The
    // migration grants this to the roles that could update (read) lease.shards.
    Need {
        on: Object::Table("lease.member_controls"),
        worker: &["SELECT", "INSERT", "UPDATE", "DELETE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // Quarantines: lease.quarantine sets, replaces and lifts them; the heartbeat's views read
    // them (a snapshot reads the bucket rows' quarantined_until instead).
    Need {
        on: Object::Table("lease.quarantines"),
        worker: &["SELECT", "INSERT", "UPDATE", "DELETE"],
        monitor: &[],
        fencing: &[],
    },
    // Claims judge their member's mode with it (C11).
    Need {
        on: Object::Function("lease.may_claim(text, uuid)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // An operator's control of a member (it runs with its caller's rights: FOR KEY SHARE of
    // the member row needs UPDATE on lease.members, which a worker has).
    Need {
        on: Object::Function("lease.control(text, uuid, integer, text)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // A bucket's quarantine (it writes the bucket row's quarantined_until: UPDATE on
    // lease.shards, which a worker has).
    Need {
        on: Object::Function("lease.quarantine(text, bigint, interval, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The same with the quarantine's reason (migration 12), which this release calls; the
    // one above stays for the previous release's binaries.
    Need {
        on: Object::Function("lease.quarantine(text, bigint, interval, timestamptz, text)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // A node's hand-over of its session to its next process (HO1: it locks the node row and
    // moves its groups' counters, which a worker may update).
    Need {
        on: Object::Function("lease.hand_over(uuid, uuid, interval, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // A bucket's history (migration 9): the tenures that ended. Claims (of a dead session's
    // buckets), releases and lease.leave write each end into its ring slot (an insert, or an
    // update of the slot: ON CONFLICT DO UPDATE reads it); history reads them with the bucket
    // rows, whose owner is the open tenure (a monitor's leasectl status --why). No worker
    // deletes one: a resize (the operator's, as the schema's owner) does. The migration grants
    // this to the roles that could update (read) lease.shards.
    Need {
        on: Object::Table("lease.tenures"),
        worker: &["SELECT", "INSERT", "UPDATE"],
        monitor: &["SELECT"],
        fencing: &[],
    },
    // Releases judge their member's mode with it, to say how a tenure ended (T2).
    Need {
        on: Object::Function("lease.mode_of(text, uuid)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &[],
    },
    // The fencing check (SECURITY DEFINER: EXECUTE is all a caller needs);
    // PgLeaseStore::is_current calls it.
    Need {
        on: Object::Function("lease.is_current(text, bigint, uuid, bigint, timestamptz)"),
        worker: &["EXECUTE"],
        monitor: &[],
        fencing: &["EXECUTE"],
    },
];

/// The privileges a role of `kind` needs, object by object, in the order to grant them (the
/// schema first).
pub fn required(kind: RoleKind) -> Vec<Grant> {
    NEEDS
        .iter()
        .filter_map(|n| {
            let privileges = match kind {
                RoleKind::Worker => n.worker,
                RoleKind::Monitor => n.monitor,
                RoleKind::Fencing => n.fencing,
            };
            (!privileges.is_empty()).then(|| Grant {
                on: n.on,
                privileges: privileges.to_vec(),
            })
        })
        .collect()
}

/// The `GRANT` statements giving `role` what a role of `kind` needs, one per object.
pub fn grants(kind: RoleKind, role: &RoleName) -> Vec<String> {
    required(kind).iter().map(|g| g.sql(role)).collect()
}

/// Every object of schema `lease` the list accounts for (whether or not some kind needs a
/// privilege on it): what the coverage test compares with the catalogs.
pub fn objects() -> Vec<Object> {
    NEEDS.iter().map(|n| n.on).collect()
}

/// A role name, as the catalogs spell it (case-sensitive: `App` and `app` are two roles);
/// shown as a quoted identifier.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RoleName(String);

/// Why a role name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidRoleName(String);

impl RoleName {
    /// The longest name Postgres keeps (`NAMEDATALEN - 1`); a longer one would be truncated
    /// and the grants would go to another name.
    pub const MAX_BYTES: usize = 63;

    /// `name`, checked: not empty, at most [`MAX_BYTES`](Self::MAX_BYTES) bytes, no NUL, and
    /// not a word Postgres reads as something other than a role even when quoted (`public`:
    /// every role; `none`).
    pub fn new(name: &str) -> Result<Self, InvalidRoleName> {
        if name.is_empty() {
            return Err(InvalidRoleName("a role name may not be empty".into()));
        }
        if name.len() > Self::MAX_BYTES {
            return Err(InvalidRoleName(format!(
                "role name {name:?} is {} bytes long; Postgres keeps at most {}",
                name.len(),
                Self::MAX_BYTES
            )));
        }
        if name.contains('\0') {
            return Err(InvalidRoleName(
                "a role name may not contain a NUL character".into(),
            ));
        }
        match name {
            "public" => Err(InvalidRoleName(
                "\"public\" is not a role: it means every role (PUBLIC); name the role to grant to"
                    .into(),
            )),
            "none" => Err(InvalidRoleName(
                "\"none\" is reserved and cannot be a role name".into(),
            )),
            _ => Ok(Self(name.to_owned())),
        }
    }

    /// The name itself, unquoted.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RoleName {
    /// A quoted identifier: `"app"`, `"my ""odd"" role"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.replace('"', "\"\""))
    }
}

#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = Text)]
    object: String,
    #[diesel(sql_type = diesel::sql_types::Nullable<Bool>)]
    held: Option<bool>,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

/// Each (kind, object, privilege) asked about, and whether `$1` holds it, in one query. The
/// `has_*_privilege` functions count what the role holds directly, through the roles it
/// inherits from, and through PUBLIC (a superuser holds everything).
// Objects are found by their oids in the catalogs, which every role may read, and not by
// name: looking a name up needs USAGE on its schema, which is one of the privileges asked
// about. An object that is not there answers NULL.
const HOLDS: &str = r#"
WITH r AS (
  SELECT kind, object, privilege, n,
         CASE kind
           WHEN 'schema' THEN (SELECT oid FROM pg_namespace WHERE nspname = object)
           WHEN 'function' THEN (SELECT p.oid FROM pg_proc p
                                   JOIN pg_namespace s ON s.oid = p.pronamespace
                                  WHERE s.nspname = split_part(object, '.', 1)
                                    AND p.oid::regprocedure::text =
                                        split_part(object, '(', 1) || '(' ||
                                        (SELECT coalesce(string_agg(t::regtype::text, ',' ORDER BY i), '')
                                           FROM unnest(string_to_array(rtrim(split_part(object, '(', 2), ')'), ','))
                                                WITH ORDINALITY AS a (t, i)) || ')')
           ELSE (SELECT c.oid FROM pg_class c
                   JOIN pg_namespace s ON s.oid = c.relnamespace
                  WHERE s.nspname = split_part(object, '.', 1)
                    AND c.relname = split_part(object, '.', 2))
         END AS id
    FROM unnest($2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS u (kind, object, privilege, n)
)
SELECT r.object,
       CASE WHEN r.id IS NULL THEN NULL
            WHEN r.kind = 'schema' THEN has_schema_privilege($1::name, r.id, r.privilege)
            WHEN r.kind = 'table' THEN has_table_privilege($1::name, r.id, r.privilege)
            WHEN r.kind = 'sequence' THEN has_sequence_privilege($1::name, r.id, r.privilege)
            WHEN r.kind = 'function' THEN has_function_privilege($1::name, r.id, r.privilege)
       END AS held
  FROM r
 ORDER BY r.n
"#;

/// Whether role `role` exists.
async fn role_exists(conn: &mut AsyncPgConnection, role: &RoleName) -> Result<bool, PgSetupError> {
    diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1) AS yes")
        .bind::<Text, _>(role.as_str())
        .get_result::<Flag>(conn)
        .await
        .map(|f| f.yes)
        .map_err(|e| query_failed("looking the role up", e))
}

fn query_failed(what: &str, e: diesel::result::Error) -> PgSetupError {
    let message = format!("{what}: {e}");
    match e {
        diesel::result::Error::DatabaseError(
            diesel::result::DatabaseErrorKind::UnableToSendCommand
            | diesel::result::DatabaseErrorKind::ClosedConnection,
            _,
        ) => PgSetupError::Unreachable { message },
        _ => PgSetupError::SchemaCheck { message },
    }
}

/// What `role` lacks of what a role of `kind` needs, object by object (empty: nothing). The
/// schema must be the one this build checks ([`PgLeaseStore::check_schema`]): an object the
/// list names and the database lacks is an error, not a missing grant.
pub async fn missing_on(
    conn: &mut AsyncPgConnection,
    role: &RoleName,
    kind: RoleKind,
) -> Result<Vec<Grant>, PgSetupError> {
    if !role_exists(conn, role).await? {
        return Err(PgSetupError::UnknownRole {
            role: role.as_str().to_owned(),
        });
    }
    let wanted = required(kind);
    let mut kinds = Vec::new();
    let mut objects = Vec::new();
    let mut privileges = Vec::new();
    for grant in &wanted {
        for privilege in &grant.privileges {
            kinds.push(grant.on.kind());
            objects.push(grant.on.name());
            privileges.push(*privilege);
        }
    }
    let held: Vec<Held> = diesel::sql_query(HOLDS)
        .bind::<Text, _>(role.as_str())
        .bind::<Array<Text>, _>(&kinds)
        .bind::<Array<Text>, _>(&objects)
        .bind::<Array<Text>, _>(&privileges)
        .load(conn)
        .await
        .map_err(|e| query_failed("checking the role's privileges", e))?;
    if let Some(absent) = held.iter().find(|h| h.held.is_none()) {
        return Err(PgSetupError::SchemaCheck {
            message: format!(
                "{} is not in the database: is the schema this build's? (leasectl migrate)",
                absent.object
            ),
        });
    }
    // One answer per privilege asked about, in the order asked.
    let mut held = held.into_iter().map(|h| h.held);
    let mut missing = Vec::new();
    for grant in wanted {
        let mut lacking = Vec::new();
        for privilege in &grant.privileges {
            if held.next() != Some(Some(true)) {
                lacking.push(*privilege);
            }
        }
        if !lacking.is_empty() {
            missing.push(Grant {
                on: grant.on,
                privileges: lacking,
            });
        }
    }
    Ok(missing)
}

impl PgLeaseStore {
    /// What `role` lacks of the privileges a role of `kind` needs ([`required`]), after
    /// checking the schema as [`check_schema`](Self::check_schema) does (a role that may not
    /// read it is asked about all the same): empty when it has everything. Read-only; any role may ask about any role. Counts privileges held
    /// directly, through inherited roles and through PUBLIC.
    pub async fn missing_privileges(
        &self,
        role: &RoleName,
        kind: RoleKind,
    ) -> Result<Vec<Grant>, PgSetupError> {
        match self.check_schema().await {
            // The schema is there and the engine's, but this role may not read it: the
            // privileges are exactly what to report.
            Ok(()) | Err(PgSetupError::PermissionDenied { .. }) => {}
            Err(e) => return Err(e),
        }
        let mut conn = self.setup_connection().await?;
        missing_on(&mut conn, role, kind).await
    }

    /// Grant `role` what a role of `kind` needs ([`grants`]), in one transaction; returns the
    /// statements run. Run it as the owner of schema `lease` (the role that migrated) or a
    /// role holding these privileges with the grant option. Postgres only warns when a role
    /// may not grant what it holds, so the transaction checks the result before it commits:
    /// if anything is still missing it rolls back with [`PgSetupError::PermissionDenied`].
    pub async fn grant_privileges(
        &self,
        role: &RoleName,
        kind: RoleKind,
    ) -> Result<Vec<String>, PgSetupError> {
        self.check_schema().await?;
        let mut conn = self.setup_connection().await?;
        if !role_exists(&mut conn, role).await? {
            return Err(PgSetupError::UnknownRole {
                role: role.as_str().to_owned(),
            });
        }
        let statements = grants(kind, role);
        let script = statements.join("\n");
        // A refusal decided inside the transaction is an error of the closure: it rolls back.
        let outcome = conn
            .transaction::<_, Refusal, _>(async |c| {
                c.batch_execute(&script)
                    .await
                    .map_err(|e| Refusal(grant_failed(role, e)))?;
                let missing = missing_on(c, role, kind).await.map_err(Refusal)?;
                if missing.is_empty() {
                    return Ok(());
                }
                let lacking: Vec<String> = missing.iter().map(ToString::to_string).collect();
                Err(Refusal(PgSetupError::PermissionDenied {
                    message: format!(
                        "the connecting role may not grant {} to {role} (Postgres only warns); \
                         nothing was granted. Run it as the owner of schema lease (the role \
                         that ran leasectl migrate)",
                        lacking.join("; ")
                    ),
                }))
            })
            .await;
        outcome.map(|()| statements).map_err(|Refusal(e)| e)
    }
}

/// Why granting rolled back.
struct Refusal(PgSetupError);

impl From<diesel::result::Error> for Refusal {
    /// BEGIN, COMMIT or ROLLBACK failed.
    fn from(e: diesel::result::Error) -> Self {
        Refusal(query_failed("granting", e))
    }
}

/// A `GRANT` the server refused.
fn grant_failed(role: &RoleName, e: diesel::result::Error) -> PgSetupError {
    let text = e.to_string();
    if text.contains("permission denied") {
        PgSetupError::PermissionDenied {
            message: format!(
                "granting to {role}: {text}; run it as the owner of schema lease (the role \
                 that ran leasectl migrate)"
            ),
        }
    } else {
        query_failed(&format!("granting to {role}"), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn role_names_are_quoted_and_checked() {
        let odd = RoleName::new(r#"my "odd" Role"#).expect("a name");
        assert_eq!(odd.to_string(), r#""my ""odd"" Role""#);
        assert_eq!(odd.as_str(), r#"my "odd" Role"#);
        for bad in ["", "public", "none", "a\0b", &"x".repeat(64)] {
            assert!(RoleName::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(
            RoleName::new("PUBLIC").is_ok(),
            "a quoted PUBLIC is a role name"
        );
        assert!(RoleName::new(&"x".repeat(63)).is_ok());
    }

    #[test]
    fn statements_name_each_object_once() {
        let role = RoleName::new("app").expect("a name");
        assert_eq!(
            grants(RoleKind::Fencing, &role),
            [
                r#"GRANT USAGE ON SCHEMA lease TO "app";"#,
                r#"GRANT SELECT ON TABLE lease.engine_migrations TO "app";"#,
                r#"GRANT EXECUTE ON FUNCTION lease.is_current(text, bigint, uuid, bigint, timestamptz) TO "app";"#,
            ]
        );
        for kind in RoleKind::ALL {
            let objects: Vec<Object> = required(kind).iter().map(|g| g.on).collect();
            let unique: std::collections::HashSet<&Object> = objects.iter().collect();
            assert_eq!(objects.len(), unique.len(), "{kind}: {objects:?}");
            assert_eq!(
                <[Object]>::first(&objects),
                Some(&Object::Schema("lease")),
                "{kind}"
            );
        }
    }

    #[test]
    fn no_kind_may_create_anything() {
        for kind in RoleKind::ALL {
            for grant in required(kind) {
                for p in &grant.privileges {
                    assert!(
                        ["USAGE", "SELECT", "INSERT", "UPDATE", "DELETE", "EXECUTE"].contains(p),
                        "{kind} gets {p} on {}",
                        grant.on
                    );
                }
            }
        }
    }
}
