//! `leasectl` against databases that are not ready for it: permanent failures (no such
//! database or role, a schema that is missing or not the engine's) are reported at once with
//! exit code 1 and their cause, transient ones (a refused connection) after the retries with
//! their cause once; `status` needs no right to create anything and creates nothing.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease::postgres::{Compatibility, ExtraMigration, PgLeaseStore};
use lease::store::WorkerStore;
use lease::{GroupName, ShardCount};
use serde_json::Value;
use std::time::Duration;

use support::{WorkerProcess, leasectl, wait_for};

/// The retry warning `leasectl` logs (at `warn`) before each new attempt.
const RETRYING: &str = "retrying";
const PASSWORD: &str = "lease-test-pw";

/// Run `leasectl` with `DATABASE_URL=url`, logging warnings: (exit code, stdout, stderr).
fn run(args: &[&str], url: &str) -> (i32, String, String) {
    let out = leasectl()
        .args(args)
        .env("DATABASE_URL", url)
        .env("LEASE_LOG", "warn")
        .output()
        .expect("running leasectl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A failure reported at once: exit 1, no retry, a message containing each of `says`.
#[track_caller]
fn fails_at_once(args: &[&str], url: &str, says: &[&str]) {
    let (code, out, err) = run(args, url);
    assert_eq!(code, 1, "leasectl {args:?}: {err}");
    assert!(
        !err.contains(RETRYING),
        "leasectl {args:?} retried a permanent failure: {err}"
    );
    assert!(
        !err.contains("unreachable"),
        "leasectl {args:?} called a permanent failure unreachable: {err}"
    );
    for s in says {
        assert!(err.contains(s), "leasectl {args:?}: {s:?} not in: {err}");
    }
    assert!(out.is_empty(), "leasectl {args:?} printed: {out}");
}

async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[derive(QueryableByName)]
struct Name {
    #[diesel(sql_type = Text)]
    name: String,
}

/// Every schema and relation outside the system schemas.
async fn objects(conn: &mut AsyncPgConnection) -> BTreeSet<String> {
    diesel::sql_query(
        r"SELECT n.nspname || '.' || COALESCE(c.relname, '') AS name
            FROM pg_namespace n LEFT JOIN pg_class c ON c.relnamespace = n.oid
           WHERE n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema'",
    )
    .load::<Name>(conn)
    .await
    .expect("listing objects")
    .into_iter()
    .map(|n| n.name)
    .collect()
}

fn fresh_role(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "leasectl_{what}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// `url` logging in as `role` instead.
fn url_as(url: &str, role: &str) -> String {
    lease_testdb::url_as(url, role, PASSWORD)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_database_or_role_is_reported_at_once() {
    let server = lease_testdb::server();
    let missing = format!("leasectl_missing_{}", std::process::id());
    let url = server.url_for(&missing);
    for args in [&["status", "--group", "g"][..], &["migrate"]] {
        fails_at_once(args, &url, &["does not exist", &missing]);
    }
    let db = lease_testdb::database().await;
    let nobody = fresh_role("nobody"); // never created
    fails_at_once(
        &["worker", "--group", "g", "--shards", "4"],
        &url_as(&db.url, &nobody),
        &[&nobody],
    );
}

#[test]
fn a_refused_connection_is_retried_and_named_once() {
    // Nothing listens on a port just given back by the kernel.
    let port = support::free_port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
    let (code, _, err) = run(&["status", "--group", "g"], &url);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(RETRYING),
        "a refused connection is transient: {err}"
    );
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("leasectl: database unreachable after 5 attempts"),
        "{err}"
    );
    assert_eq!(
        last.matches("Connection refused").count(),
        1,
        "the cause, once: {last}"
    );
    assert!(last.contains(&format!("127.0.0.1:{port}")), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_a_database_without_the_schema_creates_nothing() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    let before = objects(&mut admin).await;
    let (code, _, err) = run(&["status", "--group", "g"], &db.url);
    assert_eq!(
        objects(&mut admin).await,
        before,
        "status created something"
    );
    assert_eq!(code, 1, "{err}");
    fails_at_once(
        &["status", "--group", "g"],
        &db.url,
        &["no `lease` schema", "leasectl migrate"],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_works_for_a_select_only_role_on_a_read_only_connection() {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::connect(db.url.clone()).expect("a store");
    let group = GroupName::new("watched").expect("name");
    store
        .ensure_group(&group, ShardCount::new(3).expect("count"))
        .await
        .expect("ensure");
    let mut admin = connect(&db.url).await;
    let role = fresh_role("mon");
    exec(
        &mut admin,
        &format!(
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'; \
             GRANT CONNECT ON DATABASE \"{}\" TO {role}; \
             GRANT USAGE ON SCHEMA lease TO {role}; \
             GRANT SELECT ON lease.groups, lease.nodes, lease.members, lease.shards, \
              lease.draining_shards, lease.member_controls TO {role}; \
             ALTER ROLE {role} SET default_transaction_read_only = on",
            db.name
        ),
    )
    .await;
    let before = objects(&mut admin).await;
    let (code, out, err) = run(
        &["status", "--group", "watched", "--json"],
        &url_as(&db.url, &role),
    );
    assert_eq!(code, 0, "{err}");
    let status: Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(status["shard_count"], 3, "{out}");
    assert_eq!(objects(&mut admin).await, before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_refuses_a_lease_schema_it_did_not_create() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "CREATE SCHEMA lease; CREATE TABLE lease.invoices (id int)",
    )
    .await;
    let before = objects(&mut admin).await;
    fails_at_once(
        &["migrate"],
        &db.url,
        &["not created by the lease engine", "lease.invoices"],
    );
    assert_eq!(objects(&mut admin).await, before, "a refused migrate wrote");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_on_a_read_only_database_says_so_at_once() {
    let db = lease_testdb::empty_database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        &format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name
        ),
    )
    .await;
    fails_at_once(&["migrate"], &db.url, &["read-only", "against the primary"]);
}

/// Against a server that accepts only TLS: the URL's `sslmode` and `sslrootcert` are honoured,
/// and a certificate that fails verification, or a plain connection the server refuses, is
/// reported at once (exit 1, no retry) with its cause; a mode that does not exist is bad
/// input (exit 2).
#[test]
fn tls_settings_are_honoured_and_failures_named_at_once() {
    let tls = lease_testdb::tls_server();
    let ca = tls.ca.display().to_string();
    let verified = tls.url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let (code, out, err) = run(&["migrate"], &verified);
    assert_eq!(code, 0, "migrate over verify-full: {err}");
    assert!(
        out.contains("migrations") || out.contains("up to date"),
        "{out}"
    );
    let (code, _, err) = run(&["status", "--group", "g"], &verified);
    // The group does not exist: the schema check and the query went through TLS.
    assert_eq!(code, 2, "status over verify-full: {err}");
    assert!(err.contains("does not exist"), "{err}");

    let other = tls.other_ca.display().to_string();
    fails_at_once(
        &["migrate"],
        &tls.url(
            "localhost",
            "postgres",
            &format!("sslmode=verify-full&sslrootcert={other}"),
        ),
        &["not signed by a trusted CA", &other],
    );
    fails_at_once(
        &["status", "--group", "g"],
        &tls.url(
            "127.0.0.1",
            "postgres",
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ),
        &["not valid for the host name", "127.0.0.1"],
    );
    fails_at_once(
        &["migrate"],
        &tls.url("127.0.0.1", "postgres", "sslmode=disable"),
        &["no encryption", "sslmode=require"],
    );
    let (code, _, err) = run(
        &["migrate"],
        &tls.url("localhost", "postgres", "sslmode=verify"),
    );
    assert_eq!(code, 2, "an unknown sslmode is bad input: {err}");
    assert!(err.contains("invalid sslmode"), "{err}");
}

/// Whether `role` may create anything in the database `conn` is on: the database (schemas),
/// any schema, temporary tables.
async fn may_create_anything(conn: &mut AsyncPgConnection, role: &str) -> bool {
    #[derive(QueryableByName)]
    struct Flag {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        yes: bool,
    }
    diesel::sql_query(
        "SELECT has_database_privilege($1::name, current_database(), 'CREATE')
             OR has_database_privilege($1::name, current_database(), 'TEMPORARY')
             OR EXISTS (SELECT 1 FROM pg_namespace n
                         WHERE has_schema_privilege($1::name, n.oid, 'CREATE')) AS yes",
    )
    .bind::<Text, _>(role)
    .get_result::<Flag>(conn)
    .await
    .expect("checking the role's CREATE privileges")
    .yes
}

/// Nothing for PUBLIC beyond connecting: no CREATE on schema public, no temporary tables, and
/// none of the defaults on the engine's objects (EXECUTE on its functions, SELECT on its
/// version table), so a role holds exactly what it is granted.
async fn revoke_public(conn: &mut AsyncPgConnection, db: &str, migrated: bool) {
    exec(
        conn,
        &format!(
            "REVOKE CREATE ON SCHEMA public FROM PUBLIC; \
             REVOKE TEMPORARY ON DATABASE \"{db}\" FROM PUBLIC"
        ),
    )
    .await;
    if migrated {
        exec(
            conn,
            "REVOKE SELECT ON lease.engine_migrations FROM PUBLIC; \
             REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA lease FROM PUBLIC",
        )
        .await;
    }
}

async fn create_login_role(conn: &mut AsyncPgConnection, role: &str) {
    exec(
        conn,
        &format!("CREATE ROLE {role} LOGIN PASSWORD '{PASSWORD}'"),
    )
    .await;
}

/// A role given exactly what `leasectl grant` prints for a worker, and no right to create
/// anything anywhere, runs `leasectl worker` processes, `status` and `release --force`; a
/// monitor's role given its privileges by `grant --apply` runs `status`. Nothing is created.
/// `migrate` as the worker's role on a database without the schema fails at once, exit 1,
/// saying permission denied, and creates nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_the_printed_grants_runs_workers_status_and_release() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    revoke_public(&mut admin, &db.name, true).await;
    let (worker_role, monitor_role) = (fresh_role("wkr"), fresh_role("mon"));
    create_login_role(&mut admin, &worker_role).await;
    create_login_role(&mut admin, &monitor_role).await;

    // The statements as printed, run as they would be piped into psql.
    let (code, printed, err) = run(&["grant", "--role", &worker_role], &db.url);
    assert_eq!(code, 0, "grant: {err}");
    assert!(
        printed.contains(&format!(
            "GRANT USAGE ON SCHEMA lease TO \"{worker_role}\";"
        )),
        "{printed}"
    );
    let doctor_as_worker = || {
        let (code, out, err) = run(&["doctor", "--json"], &url_as(&db.url, &worker_role));
        let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {err}"));
        let privileges = report["checks"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["check"] == "privileges").cloned())
            .unwrap_or_else(|| panic!("no privileges check: {out}"));
        (code, privileges)
    };
    let (code, privileges) = doctor_as_worker();
    assert_eq!(code, 1, "doctor passed a role with no grants: {privileges}");
    assert_eq!(privileges["status"], "fail", "{privileges}");
    let detail = privileges["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("lease.shards") && detail.contains("leasectl grant --role"),
        "{detail}"
    );
    exec(&mut admin, &printed).await;
    let (code, privileges) = doctor_as_worker();
    assert_eq!(privileges["status"], "ok", "{privileges}");
    assert_eq!(code, 0, "doctor as a role with the grants: {privileges}");
    let (code, applied, err) = run(
        &[
            "grant",
            "--role",
            &monitor_role,
            "--kind",
            "monitor",
            "--apply",
        ],
        &db.url,
    );
    assert_eq!(code, 0, "grant --apply: {err}");
    assert!(
        applied.contains(&format!(
            "GRANT SELECT ON TABLE lease.shards TO \"{monitor_role}\";"
        )),
        "{applied}"
    );
    for role in [&worker_role, &monitor_role] {
        assert!(
            !may_create_anything(&mut admin, role).await,
            "{role} may create something: the test would prove less"
        );
    }
    let before = objects(&mut admin).await;

    let url = url_as(&db.url, &worker_role);
    let mut a = WorkerProcess::spawn("a", &url, "roles", 8, "3s", "1s");
    let mut b = WorkerProcess::spawn("b", &url, "roles", 8, "3s", "1s");
    wait_for(
        "each worker to hold 4 buckets",
        Duration::from_secs(30),
        || a.owned().len() == 4 && b.owned().len() == 4,
    );
    for role in [&worker_role, &monitor_role] {
        let (code, out, err) = run(
            &["status", "--group", "roles", "--json"],
            &url_as(&db.url, role),
        );
        assert_eq!(code, 0, "status as {role}: {err}");
        let status: Value = serde_json::from_str(&out).expect("status --json");
        assert_eq!(status["members"].as_array().map(Vec::len), Some(2), "{out}");
        assert!(
            status["buckets"]
                .as_array()
                .is_some_and(|b| b.iter().all(|b| b["state"] == "live")),
            "{out}"
        );
    }

    // Evict a killed worker as the worker's role; the survivor takes over its buckets.
    let evicted = a.worker().expect("a announced itself");
    a.signal("KILL");
    a.wait(Duration::from_secs(10));
    let (code, out, err) = run(
        &[
            "release",
            "--group",
            "roles",
            "--worker",
            &evicted.to_string(),
            "--force",
        ],
        &url,
    );
    assert_eq!(code, 0, "release --force: {err}");
    assert!(out.contains("released 4 bucket(s)"), "{out}");
    wait_for("b to hold every bucket", Duration::from_secs(10), || {
        b.owned().len() == 8
    });
    b.signal("TERM");
    assert!(b.wait(Duration::from_secs(15)).success(), "b's exit");
    for w in [&a, &b] {
        let errors: Vec<_> = w
            .events()
            .into_iter()
            .filter(|e| e.event == "error")
            .collect();
        assert!(errors.is_empty(), "{}: {errors:?}", w.name);
        assert!(w.bad_lines().is_empty(), "{}: {:?}", w.name, w.bad_lines());
    }
    assert_eq!(objects(&mut admin).await, before, "something was created");

    // migrate as the worker's role: a no-op where the schema is up to date; refused where it
    // would have to create the schema.
    let (code, out, err) = run(&["migrate"], &url);
    assert_eq!(code, 0, "migrate on an up-to-date schema: {err}");
    assert!(out.contains("up to date"), "{out}");
    let empty = lease_testdb::empty_database().await;
    let mut empty_admin = connect(&empty.url).await;
    revoke_public(&mut empty_admin, &empty.name, false).await;
    assert!(!may_create_anything(&mut empty_admin, &worker_role).await);
    let before = objects(&mut empty_admin).await;
    fails_at_once(
        &["migrate"],
        &url_as(&empty.url, &worker_role),
        &["permission denied", "may not create schemas", &worker_role],
    );
    assert_eq!(
        objects(&mut empty_admin).await,
        before,
        "a refused migrate wrote"
    );
}

/// `grant` refuses a name that is not a role's (exit 2), a role that does not exist and a
/// connecting role that may not grant (exit 1, nothing granted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grant_refuses_what_it_cannot_grant() {
    let db = lease_testdb::database().await;
    let (code, _, err) = run(&["grant", "--role", "public"], &db.url);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--role") && err.contains("PUBLIC"), "{err}");
    let ghost = fresh_role("ghost"); // never created
    fails_at_once(
        &["grant", "--role", &ghost, "--apply"],
        &db.url,
        &["does not exist", &ghost],
    );
    let mut admin = connect(&db.url).await;
    let (lesser, other) = (fresh_role("lesser"), fresh_role("other"));
    create_login_role(&mut admin, &lesser).await;
    create_login_role(&mut admin, &other).await;
    let (code, _, err) = run(
        &["grant", "--role", &lesser, "--kind", "monitor", "--apply"],
        &db.url,
    );
    assert_eq!(code, 0, "{err}");
    fails_at_once(
        &["grant", "--role", &other, "--kind", "monitor", "--apply"],
        &url_as(&db.url, &lesser),
        &["permission denied", "owner of schema lease"],
    );
    let (code, out, err) = run(&["status", "--group", "g"], &url_as(&db.url, &other));
    assert_eq!(code, 1, "{out}");
    assert!(
        err.contains("permission denied"),
        "a refused grant granted: {err}"
    );
}

async fn yes(conn: &mut AsyncPgConnection, sql: &str) -> bool {
    #[derive(QueryableByName)]
    struct Flag {
        #[diesel(sql_type = diesel::sql_types::Bool)]
        yes: bool,
    }
    diesel::sql_query(sql)
        .get_result::<Flag>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .yes
}

/// A migration of a newer release that only adds: columns, with defaults or nullable, on each
/// of the engine's tables, and an index.
fn newer_additive() -> ExtraMigration {
    ExtraMigration {
        version: "29990101000001".into(),
        name: "29990101000001_test_additive".into(),
        up: "ALTER TABLE lease.members ADD COLUMN drain_requested_at timestamptz;
             ALTER TABLE lease.nodes ADD COLUMN zone text;
             ALTER TABLE lease.shards ADD COLUMN paused boolean NOT NULL DEFAULT false;
             ALTER TABLE lease.groups ADD COLUMN note text NOT NULL DEFAULT '';
             CREATE INDEX members_draining_idx ON lease.members (group_name)
                 WHERE drain_requested_at IS NOT NULL;"
            .into(),
        compatibility: Compatibility::Additive,
    }
}

/// A migration of a newer release declared breaking (harmless here, so that the running
/// workers can still be stopped gracefully).
fn newer_breaking() -> ExtraMigration {
    ExtraMigration {
        version: "29990101000002".into(),
        name: "29990101000002_test_breaking".into(),
        up: "COMMENT ON TABLE lease.shards IS 'a breaking change, for the test'".into(),
        compatibility: Compatibility::Breaking,
    }
}

fn events_named(w: &WorkerProcess, name: &str) -> Vec<support::Event> {
    w.events().into_iter().filter(|e| e.event == name).collect()
}

/// A rolling deploy of a release whose migration is additive: it is applied while `leasectl
/// worker` processes run, and they keep every lease (no revocation, tokens unchanged, no
/// error), renewing, releasing and claiming on connections that prepared their statements
/// before columns were added to every table; this (now older) binary still starts a worker,
/// and its `status` and `migrate` work, saying the schema is newer. Then a breaking migration
/// makes a freshly started worker refuse at once, exit 1, saying to upgrade, while the running
/// ones stop gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_keep_their_leases_while_a_newer_release_migrates() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let newer = PgLeaseStore::connect(db.url.clone()).expect("a store");
    let mut a = WorkerProcess::spawn("a", &db.url, "rolling", 8, "3s", "1s");
    let mut b = WorkerProcess::spawn("b", &db.url, "rolling", 8, "3s", "1s");
    wait_for(
        "each worker to hold 4 buckets",
        Duration::from_secs(30),
        || a.owned().len() == 4 && b.owned().len() == 4,
    );
    let held = [a.owned(), b.owned()];
    // What they said while converging (a shed to b) is not the test's business.
    let seen = [a.events().len(), b.events().len()];

    let add = newer_additive();
    assert_eq!(
        newer
            .migrate_with(std::slice::from_ref(&add))
            .await
            .expect("the newer release migrates"),
        [add.version.as_str()]
    );
    // Three renewals each on the altered tables.
    let migrated_at = diesel::sql_query("SELECT clock_timestamp()::text AS name")
        .get_result::<Name>(&mut admin)
        .await
        .expect("the server clock")
        .name;
    let renewed = format!(
        "SELECT count(*) = 2 AS yes FROM lease.members m JOIN lease.nodes n USING (node_id)
          WHERE m.group_name = 'rolling'
            AND n.heartbeat_at > '{migrated_at}'::timestamptz + interval '2.5 s'"
    );
    let mut waited = 0;
    while !yes(&mut admin, &renewed).await {
        waited += 1;
        assert!(
            waited < 1_000,
            "the workers stopped renewing after the migration"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!([a.owned(), b.owned()], held, "a lease changed hands");
    for (w, seen) in [&a, &b].into_iter().zip(seen) {
        let since: Vec<_> = w.events().into_iter().skip(seen).collect();
        assert!(
            since.is_empty(),
            "{} across the migration: {since:?}",
            w.name
        );
    }

    // This binary is older than the schema now, and still works with it.
    let (code, out, err) = run(&["status", "--group", "rolling", "--json"], &db.url);
    assert_eq!(code, 0, "status: {err}");
    assert!(
        err.contains("newer release") && err.contains(&add.version),
        "status does not say the schema is newer: {err}"
    );
    let status: Value = serde_json::from_str(&out).expect("status --json");
    assert_eq!(status["members"].as_array().map(Vec::len), Some(2), "{out}");
    let (code, out, err) = run(&["migrate"], &db.url);
    assert_eq!(code, 0, "migrate: {err}");
    assert!(
        out.contains("up to date") && out.contains(&add.version),
        "migrate on a newer additive schema: {out}"
    );
    let mut c = WorkerProcess::spawn("c", &db.url, "rolling", 8, "3s", "1s");
    wait_for("c to get its share", Duration::from_secs(30), || {
        let owned = [a.owned().len(), b.owned().len(), c.owned().len()];
        owned.iter().sum::<usize>() == 8 && owned.iter().all(|&n| (2..=3).contains(&n))
    });
    // a and b claim c's buckets back with the claim they prepared before the migration.
    c.signal("TERM");
    assert!(c.wait(Duration::from_secs(15)).success(), "c's exit");
    wait_for("a and b to hold 4 again", Duration::from_secs(30), || {
        a.owned().len() == 4 && b.owned().len() == 4
    });
    for w in [&a, &b, &c] {
        assert!(events_named(w, "error").is_empty(), "{}: errors", w.name);
        assert!(w.bad_lines().is_empty(), "{}: {:?}", w.name, w.bad_lines());
    }
    for w in [&a, &b] {
        let reasons: Vec<_> = events_named(w, "revoked")
            .into_iter()
            .filter_map(|e| e.reason)
            .collect();
        // Shed to the other at the start, and to c when it joined.
        assert!(
            reasons.iter().all(|r| r == "shed"),
            "{}: revoked for {reasons:?}",
            w.name
        );
    }

    // A breaking migration: a freshly started worker refuses the schema.
    let brk = newer_breaking();
    assert_eq!(
        newer
            .migrate_with(&[add.clone(), brk.clone()])
            .await
            .expect("the breaking migration"),
        [brk.version.as_str()]
    );
    let mut d = WorkerProcess::spawn("d", &db.url, "rolling", 8, "3s", "1s");
    let exit = d.wait(Duration::from_secs(20));
    assert_eq!(exit.code(), Some(1), "d's exit");
    let said = d.stderr().join("\n");
    assert!(
        said.contains("newer than this build")
            && said.contains(&brk.version)
            && said.contains("upgrade"),
        "{said}"
    );
    assert!(d.events().is_empty(), "d started: {:?}", d.events());
    for args in [&["migrate"][..], &["status", "--group", "rolling"]] {
        fails_at_once(args, &db.url, &["newer than this build", "upgrade"]);
    }
    for w in [&a, &b] {
        w.signal("TERM");
    }
    for w in [&mut a, &mut b] {
        assert!(
            w.wait(Duration::from_secs(15)).success(),
            "{}'s exit",
            w.name
        );
    }
}

/// Several `leasectl migrate` processes at once on a fresh database: each succeeds, one applies
/// the migrations, the others find them applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrate_processes_apply_each_migration_once() {
    let db = lease_testdb::empty_database().await;
    let children: Vec<_> = (0..4)
        .map(|_| {
            leasectl()
                .arg("migrate")
                .env("DATABASE_URL", &db.url)
                .env("LEASE_LOG", "warn")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawning leasectl migrate")
        })
        .collect();
    let mut outputs = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("leasectl migrate");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(out.status.success(), "{stdout}{stderr}");
        outputs.push(stdout);
    }
    assert_eq!(
        outputs
            .iter()
            .filter(|o| o.starts_with("applied migrations"))
            .count(),
        1,
        "{outputs:?}"
    );
    assert_eq!(
        outputs.iter().filter(|o| o.contains("up to date")).count(),
        3,
        "{outputs:?}"
    );
    let mut admin = connect(&db.url).await;
    assert!(
        yes(
            &mut admin,
            "SELECT count(*) = count(DISTINCT version) AND count(*) > 0 AS yes
               FROM lease.engine_migrations"
        )
        .await
    );
}

/// A schema older than the binary (a migration missing) or newer (a breaking migration it does
/// not know) is refused at once by every command, exit 1, saying what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_older_or_newer_than_the_binary_is_refused_at_once() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let commands: [&[&str]; 3] = [
        &["worker", "--group", "g", "--shards", "4"],
        &["status", "--group", "g"],
        &[
            "release",
            "--group",
            "g",
            "--worker",
            "01a22d03-a421-7285-847b-ba67e0f12f6c",
        ],
    ];
    exec(
        &mut admin,
        "CREATE TABLE saved AS SELECT * FROM lease.engine_migrations
           WHERE version = (SELECT max(version) FROM lease.engine_migrations);
         DELETE FROM lease.engine_migrations WHERE version IN (SELECT version FROM saved)",
    )
    .await;
    for args in commands {
        fails_at_once(
            args,
            &db.url,
            &["older than this build", "leasectl migrate"],
        );
    }
    exec(
        &mut admin,
        "INSERT INTO lease.engine_migrations SELECT * FROM saved;
         INSERT INTO lease.engine_migrations (version, name, additive)
             VALUES ('29990101000002', 'from_the_future', false)",
    )
    .await;
    for args in commands.iter().chain([&&["migrate"][..]]) {
        fails_at_once(args, &db.url, &["newer than this build", "upgrade"]);
    }
}
