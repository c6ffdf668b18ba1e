//! Setting the backend up on real Postgres: connection failures are reported with their cause
//! and whether to retry.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use lease_diesel::{PgLeaseStore, PgSetupError};

/// The password of the roles the tests make (the test cluster trusts local connections; a
/// server named by `DATABASE_URL` may not).
const PASSWORD: &str = "lease-test-pw";

fn store(url: &str) -> PgLeaseStore {
    PgLeaseStore::builder(url)
        .max_connections(2)
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a store")
}

/// A role name of its own (roles are cluster-wide).
fn fresh_role(what: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "lease_{what}_{}_{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

/// `url` logging in as `role` instead.
fn url_as(url: &str, role: &str) -> String {
    match url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))
    {
        Some(rest) => {
            let scheme = &url[..url.len() - rest.len()];
            let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let host = match rest[..authority_end].rfind('@') {
                Some(at) => &rest[at + 1..],
                None => rest,
            };
            format!("{scheme}{role}:{PASSWORD}@{host}")
        }
        None => format!("{url} user={role} password={PASSWORD}"),
    }
}

// ---- item 10: connection failures ----------------------------------------------------------

/// A missing database and an unknown role are permanent, a refused connection transient; each
/// message says its cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_say_their_cause_and_whether_to_retry() {
    let server = lease_testdb::server();
    let missing = format!("lease_missing_{}", std::process::id());
    let s = store(&server.url_for(&missing));
    for (what, result) in [
        ("check", s.check_schema().await),
        ("migrate", s.migrate().await.map(drop)),
    ] {
        match result {
            Err(e @ PgSetupError::DatabaseNotFound { .. }) => {
                assert!(!e.is_transient());
                let text = e.to_string();
                assert!(
                    text.contains(&missing) && text.contains("does not exist"),
                    "{text}"
                );
            }
            other => panic!("{what} on a missing database: got {other:?}"),
        }
    }

    let nobody = fresh_role("nobody"); // never created
    let db = lease_testdb::database().await;
    match store(&url_as(&db.url, &nobody)).check_schema().await {
        Err(e @ PgSetupError::AuthenticationFailed { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains(&nobody), "{e}");
        }
        other => panic!("an unknown role: got {other:?}"),
    }

    // Nothing listens on a port just given back by the kernel.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let refused = store(&format!(
        "postgres://postgres@127.0.0.1:{port}/postgres?connect_timeout=5"
    ));
    match refused.check_schema().await {
        Err(e @ PgSetupError::Unreachable { .. }) => {
            assert!(e.is_transient());
            let text = e.to_string();
            assert_eq!(
                text.matches("Connection refused").count(),
                1,
                "the cause, once: {text}"
            );
            assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        }
        other => panic!("a refused connection: got {other:?}"),
    }
}
