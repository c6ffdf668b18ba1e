//! TLS against a real Postgres that accepts only TLS connections over TCP (`ssl = on`,
//! `pg_hba.conf` with `hostssl` lines only), with a CA and certificates made by the test.
//! Each `sslmode` does what libpq's does; a certificate problem is reported at once, as a
//! permanent error naming its cause; the pool's connections and the listening connection all
//! use TLS.

use std::time::{Duration, Instant};

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Bool};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lease_core::{
    GroupName, Incarnation, MemberMetadata, NodeId, ShardCount, Takeover, Ttl, WorkerStore,
};
use lease_diesel::{PgLeaseStore, PgSetupError, TlsMode, Verification};
mod support;
use lease_testdb::{Cluster, ClusterOptions, tls_server as server};

fn url(host: &str, user: &str, query: &str) -> String {
    server().url(host, user, query)
}

fn store(url: &str) -> Result<PgLeaseStore, PgSetupError> {
    PgLeaseStore::builder(url)
        .max_connections(4)
        .timeout(Duration::from_secs(5))
        .build()
}

#[derive(QueryableByName)]
struct Ssl {
    #[diesel(sql_type = Bool)]
    ssl: bool,
}

/// Whether the store's connection uses TLS, as the server sees it.
async fn uses_tls(store: &PgLeaseStore) -> bool {
    let mut conn = store.pool().get().await.expect("a pooled connection");
    diesel::sql_query("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .get_result::<Ssl>(&mut *conn)
        .await
        .expect("reading pg_stat_ssl")
        .ssl
}

/// Migrate (first caller) and check the schema through `store`.
async fn works(store: &PgLeaseStore) {
    store.migrate().await.expect("migrating over TLS");
    store.check_schema().await.expect("the schema is there");
}

#[tokio::test(flavor = "multi_thread")]
async fn require_encrypts_without_checking_the_certificate() {
    // The certificate names localhost, and 127.0.0.1 is not checked under `require`.
    let store = store(&url("127.0.0.1", "postgres", "sslmode=require")).expect("a store");
    works(&store).await;
    assert!(uses_tls(&store).await, "sslmode=require connected in plain");
    let tls = store.tls().expect("settings");
    assert_eq!(
        (tls.mode, tls.verification),
        (TlsMode::Require, Verification::None)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn verify_full_checks_the_ca_and_the_host_name() {
    let ca = server().ca.display().to_string();
    let store = store(&url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .expect("a store");
    works(&store).await;
    assert!(uses_tls(&store).await);
    assert_eq!(
        store.tls().map(|t| t.verification),
        Some(Verification::Full)
    );
    // `verify-ca` checks the chain only: 127.0.0.1 is fine.
    let chain_only = self::store(&url(
        "127.0.0.1",
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ))
    .expect("a store");
    works(&chain_only).await;
    assert!(uses_tls(&chain_only).await);
    // libpq: `require` with a root certificate checks the chain as `verify-ca` does.
    let require_with_ca = self::store(&url(
        "127.0.0.1",
        "postgres",
        &format!(
            "sslmode=require&sslrootcert={}",
            server().other_ca.display()
        ),
    ))
    .expect("a store");
    let refused = require_with_ca
        .check_schema()
        .await
        .expect_err("require with a root certificate checks the chain");
    assert!(matches!(refused, PgSetupError::Tls { .. }), "{refused:?}");
}

/// A permanent TLS failure: classified as such, said in words, and found in one attempt.
async fn refused_at_once(url: &str) -> String {
    let store = store(url).expect("a store");
    let started = Instant::now();
    let error = store
        .check_schema()
        .await
        .expect_err("the connection must be refused");
    assert!(
        matches!(error, PgSetupError::Tls { .. }),
        "not a TLS error: {error:?}"
    );
    assert!(!error.is_transient(), "a TLS failure is retried: {error}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "took {:?}: the failure should be found in one attempt",
        started.elapsed()
    );
    let message = error.to_string();
    assert!(
        !message.contains("error performing TLS handshake") || message.contains("certificate"),
        "the message does not name the cause: {message}"
    );
    message
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_for_another_host_is_refused_naming_the_cause() {
    let ca = server().ca.display().to_string();
    let message = refused_at_once(&url(
        "127.0.0.1",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .await;
    assert!(message.contains("not valid for the host name"), "{message}");
    assert!(message.contains("127.0.0.1"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_signed_by_another_ca_is_refused_naming_the_cause() {
    let other = server().other_ca.display().to_string();
    let message = refused_at_once(&url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={other}"),
    ))
    .await;
    assert!(message.contains("not signed by a trusted CA"), "{message}");
    assert!(message.contains(&other), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_connection_is_refused_by_the_server_with_what_to_do() {
    let store = store(&url("127.0.0.1", "postgres", "sslmode=disable")).expect("a store");
    let error = store
        .check_schema()
        .await
        .expect_err("the server accepts only TLS");
    assert!(
        matches!(error, PgSetupError::AuthenticationFailed { .. }),
        "{error:?}"
    );
    assert!(!error.is_transient());
    let message = error.to_string();
    assert!(message.contains("no encryption"), "{message}");
    assert!(message.contains("sslmode=require"), "{message}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_certificate_is_offered_when_given() {
    let ca = server().ca.display().to_string();
    let without = store(&url(
        "localhost",
        "certuser",
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    ))
    .expect("a store");
    let error = without
        .check_schema()
        .await
        .expect_err("certificate authentication without a certificate");
    assert!(!error.is_transient(), "{error}");
    let with = store(&url(
        "localhost",
        "certuser",
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            server().client_cert.display(),
            server().client_key.display()
        ),
    ))
    .expect("a store");
    works(&with).await;
    assert!(with.tls().is_some_and(|t| t.client_certificate));
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[tokio::test(flavor = "multi_thread")]
async fn workers_and_the_listening_connection_use_tls() {
    let ca = server().ca.display().to_string();
    let store = store(&url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={ca}&application_name=tls_listen"),
    ))
    .expect("a store");
    works(&store).await;
    let group = GroupName::new("tls").expect("name");
    store
        .ensure_group(&group, ShardCount::new(4).expect("n"))
        .await
        .expect("a group");
    // Subscribing opens the listening connection.
    let _feed = store.changes(&group).await.expect("a change feed");
    let me = NodeId::new();
    let beat = support::beat_as(
        &store,
        &group,
        me,
        Incarnation::new(),
        Ttl::from_secs(30).expect("ttl"),
        &MemberMetadata::empty(),
    )
    .await
    .expect("a heartbeat over TLS");
    store
        .claim(&group, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim over TLS");
    let mut admin = AsyncPgConnection::establish(&server().cluster.socket_url("postgres"))
        .await
        .expect("admin");
    let listening: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
          WHERE a.application_name = 'tls_listen' AND a.query ILIKE 'LISTEN%' AND s.ssl",
    )
    .get_result(&mut admin)
    .await
    .expect("pg_stat_activity");
    assert_eq!(listening.n, 1, "the listening connection is not on TLS");
    let plain: Count = diesel::sql_query(
        "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
          WHERE a.application_name = 'tls_listen' AND NOT s.ssl",
    )
    .get_result(&mut admin)
    .await
    .expect("pg_stat_ssl");
    assert_eq!(plain.n, 0, "a connection of the store is not on TLS");
}

#[tokio::test(flavor = "multi_thread")]
async fn requiring_tls_from_a_server_without_it_says_so() {
    let plain = Cluster::start(ClusterOptions {
        tcp: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a server without TLS: {e}"));
    let store = store(&plain.tcp_url("postgres", "postgres", "sslmode=require")).expect("a store");
    let error = store.check_schema().await.expect_err("no TLS there");
    assert!(matches!(error, PgSetupError::Tls { .. }), "{error:?}");
    assert!(error.to_string().contains("does not accept TLS"), "{error}");
    // `prefer` (the default) connects in plain.
    let store = self::store(&plain.tcp_url("postgres", "postgres", "")).expect("a store");
    let error = store.check_schema().await.expect_err("no schema yet");
    assert!(matches!(error, PgSetupError::NotInstalled), "{error:?}");
}
