//! Login roles made with exactly the grants each test is about (roles are cluster-wide: each
//! has a name of its own), and PUBLIC's default privileges taken away.

use std::sync::atomic::{AtomicU32, Ordering};

use diesel_async::AsyncPgConnection;
use lease_diesel::privileges::{self, RoleKind, RoleName};

use crate::db::exec;

/// The password of the roles the tests make (the test cluster trusts local connections; a
/// server named by `DATABASE_URL` may not).
pub const PASSWORD: &str = "lease-test-pw";

/// A role name of its own (roles are cluster-wide).
pub fn fresh_role(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "lease_{what}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// `url` logging in as `role` instead.
pub fn url_as(url: &str, role: &str) -> String {
    lease_testdb::url_as(url, role, PASSWORD)
}

/// A login role with `grants` (each `{role}` replaced by its name), on database `db`.
pub async fn make_role(
    admin: &mut AsyncPgConnection,
    db: &str,
    what: &str,
    grants: &str,
) -> String {
    let role = fresh_role(what);
    exec(
        admin,
        &format!(
            "CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'; \
             GRANT CONNECT ON DATABASE \"{db}\" TO {role}; {}",
            grants.replace("{role}", &role)
        ),
    )
    .await;
    role
}

/// A login role with exactly the privileges `lease_diesel::privileges` lists for `kind` (the
/// statements `leasectl grant` prints), on database `db`.
pub async fn role_of_kind(
    admin: &mut AsyncPgConnection,
    db: &str,
    what: &str,
    kind: RoleKind,
) -> String {
    let role = make_role(admin, db, what, "").await;
    let name = RoleName::new(&role).expect("a role name");
    exec(admin, &privileges::grants(kind, &name).join("\n")).await;
    role
}

/// Take from PUBLIC what Postgres and the runner give it by default on the engine's objects
/// (EXECUTE on functions, SELECT on the version table), so that a role holds only what it was
/// granted and the privilege list is all a test runs on.
pub const REVOKE_PUBLIC_DEFAULTS: &str = "
    REVOKE CREATE ON SCHEMA public FROM PUBLIC;
    REVOKE SELECT ON lease.engine_migrations FROM PUBLIC;
    REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC;
";
