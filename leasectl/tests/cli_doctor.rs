//! `leasectl doctor` against real servers: a healthy database, one without the schema, a
//! read-only one, TLS with and without verification, and no server at all. Each finding
//! is asserted by its status and words, and the exit code follows the failures.

mod support;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use serde_json::Value;
use support::leasectl;

/// Run `leasectl doctor --json` on `url`: the exit code and each check's (status, detail).
fn doctor(url: &str) -> (i32, Vec<(String, String, String)>) {
    let out = leasectl()
        .args(["doctor", "--json"])
        .env("DATABASE_URL", url)
        .output()
        .expect("running leasectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("doctor --json printed no JSON ({e}): {stdout}"));
    let checks = report["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("no checks: {report}"))
        .iter()
        .map(|c| {
            (
                c["check"].as_str().unwrap_or_default().to_owned(),
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect::<Vec<_>>();
    let code = out.status.code().unwrap_or(-1);
    assert_eq!(
        report["ok"].as_bool(),
        Some(code == 0),
        "\"ok\" disagrees with the exit code {code}: {report}"
    );
    (code, checks)
}

/// The status and detail of check `name`.
#[track_caller]
fn finding<'a>(checks: &'a [(String, String, String)], name: &str) -> (&'a str, &'a str) {
    checks
        .iter()
        .find(|c| c.0 == name)
        .map(|c| (c.1.as_str(), c.2.as_str()))
        .unwrap_or_else(|| panic!("no {name:?} check in {checks:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healthy_database_passes_and_says_what_it_found() {
    let db = lease_testdb::database().await;
    let (code, checks) = doctor(&db.url);
    assert_eq!(code, 0, "{checks:?}");
    for name in [
        "connection",
        "tls",
        "server",
        "schema",
        "privileges",
        "primary",
        "clock",
        "wake-ups",
    ] {
        assert_eq!(finding(&checks, name).0, "ok", "{name}: {checks:?}");
    }
    assert!(finding(&checks, "server").1.contains("PostgreSQL"));
    // The test server has no standby: reported, not failed.
    let (status, detail) = finding(&checks, "replication");
    assert_eq!(status, "warn");
    assert!(detail.contains("no streaming standby"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_without_the_schema_fails_saying_to_migrate() {
    let db = lease_testdb::empty_database().await;
    let (code, checks) = doctor(&db.url);
    assert_eq!(code, 1, "{checks:?}");
    let (status, detail) = finding(&checks, "schema");
    assert_eq!(status, "fail");
    assert!(detail.contains("leasectl migrate"), "{detail}");
    // The rest is still checked.
    assert_eq!(finding(&checks, "wake-ups").0, "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_fails_the_primary_check() {
    let db = lease_testdb::database().await;
    let mut admin = AsyncPgConnection::establish(&db.url)
        .await
        .expect("connecting");
    admin
        .batch_execute(&format!(
            "ALTER DATABASE \"{}\" SET default_transaction_read_only = on",
            db.name
        ))
        .await
        .expect("making the database read-only");
    let (code, checks) = doctor(&db.url);
    assert_eq!(code, 1, "{checks:?}");
    let (status, detail) = finding(&checks, "primary");
    assert_eq!(status, "fail");
    assert!(detail.contains("read-only"), "{detail}");
}

#[test]
fn tls_is_reported_with_what_was_verified() {
    let tls = lease_testdb::tls_server();
    let ca = tls.ca.display().to_string();
    let verified = tls.url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let migrated = leasectl()
        .arg("migrate")
        .env("DATABASE_URL", &verified)
        .output()
        .expect("running leasectl migrate");
    assert!(migrated.status.success(), "{migrated:?}");
    let (code, checks) = doctor(&verified);
    assert_eq!(code, 0, "{checks:?}");
    let (status, detail) = finding(&checks, "tls");
    assert_eq!(status, "ok");
    assert!(detail.contains("verify-full"), "{detail}");
    let (code, checks) = doctor(&tls.url("127.0.0.1", "postgres", "sslmode=require"));
    assert_eq!(
        code, 0,
        "unverified TLS is a warning, not a failure: {checks:?}"
    );
    let (status, detail) = finding(&checks, "tls");
    assert_eq!(status, "warn");
    assert!(detail.contains("not verified"), "{detail}");
}

#[test]
fn no_server_fails_the_connection_check_at_once() {
    // A port nobody listens on.
    let port = support::free_port();
    let started = std::time::Instant::now();
    let (code, checks) = doctor(&format!("postgres://postgres@127.0.0.1:{port}/x"));
    assert_eq!(code, 1);
    assert_eq!(checks.len(), 1, "{checks:?}");
    let (status, detail) = finding(&checks, "connection");
    assert_eq!(status, "fail");
    assert!(detail.contains("retry"), "{detail}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "the doctor waited {:?} for a server that is not there",
        started.elapsed()
    );
}

/// The replication finding against a real streaming standby: synchronous as a superuser sees
/// it; synchronous by its settings as a role that may not see which standby is in sync (it
/// was reported as asynchronous before); asynchronous, a warning, once the primary stops
/// naming the standby.
#[test]
fn replication_is_judged_by_what_the_role_can_see() {
    use lease_testdb::{Cluster, ClusterOptions, Replication};
    let primary = Cluster::start(ClusterOptions {
        tcp: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a primary: {e}"));
    let _standby = primary
        .start_standby(Replication::Synchronous)
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    primary
        .psql("CREATE ROLE plain LOGIN")
        .expect("a role outside pg_monitor");

    let (_, checks) = doctor(&primary.tcp_url("postgres", "postgres", ""));
    let (status, detail) = finding(&checks, "replication");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.starts_with("synchronous ("), "{detail}");
    assert!(detail.contains("(sync)"), "{detail}");

    let (_, checks) = doctor(&primary.tcp_url("plain", "postgres", ""));
    let (status, detail) = finding(&checks, "replication");
    assert_eq!(status, "ok", "{detail}");
    assert!(detail.contains("synchronous by its settings"), "{detail}");
    assert!(detail.contains("not visible to this role"), "{detail}");

    primary
        .psql("ALTER SYSTEM SET synchronous_standby_names = ''")
        .and_then(|_| primary.psql("SELECT pg_reload_conf()"))
        .expect("making replication asynchronous");
    // A reload is asynchronous: wait until a new session sees the setting.
    for _ in 0..100 {
        if primary.psql("SHOW synchronous_standby_names").as_deref() == Ok("") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let (_, checks) = doctor(&primary.tcp_url("plain", "postgres", ""));
    let (status, detail) = finding(&checks, "replication");
    assert_eq!(status, "warn", "{detail}");
    assert!(detail.starts_with("asynchronous"), "{detail}");
}
