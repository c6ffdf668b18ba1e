//! Connection failures say their cause once and whether to retry.

use lease_diesel::PgSetupError;

use crate::db::store;
use crate::roles::{fresh_role, url_as};

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
