//! A TLS-only server for the tests of TLS settings, with the files a client needs.

use std::path::PathBuf;
use std::sync::OnceLock;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

use crate::{Cluster, ClusterOptions, ServerTls, TestCa, write_private};

/// A TLS-only server and the files a client needs.
#[derive(Debug)]
pub struct TlsServer {
    /// The server.
    pub cluster: Cluster,
    /// The CA that signed the server's certificate (and the client certificate).
    pub ca: PathBuf,
    /// A CA that signed nothing the server has.
    pub other_ca: PathBuf,
    /// A client certificate for role `certuser`.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

/// A server that accepts only TLS connections over TCP (`ssl = on`, `pg_hba.conf` with
/// `hostssl` lines only; the unix socket stays trusted for set-up), with a certificate for
/// `localhost` signed by a CA of the test's own, database `app`, and role `certuser` that
/// logs in with a client certificate only. One per test process (a cluster takes about a
/// second to start).
///
/// # Panics
///
/// If the server cannot be started or set up.
pub fn tls_server() -> &'static TlsServer {
    static SERVER: OnceLock<TlsServer> = OnceLock::new();
    SERVER.get_or_init(|| {
        let ca = TestCa::new("lease test CA");
        let other = TestCa::new("some other CA");
        // The certificate names `localhost` only: 127.0.0.1 is the same server under a name
        // the certificate does not list.
        let cluster = Cluster::start(ClusterOptions {
            tls: Some(ServerTls {
                server: ca.server(&["localhost"]),
                client_ca_pem: Some(ca.cert_pem()),
            }),
            hba: Some(vec![
                "local all all trust".into(),
                "hostssl all certuser 127.0.0.1/32 cert".into(),
                "hostssl all certuser ::1/128 cert".into(),
                "hostssl all all 127.0.0.1/32 trust".into(),
                "hostssl all all ::1/128 trust".into(),
            ]),
            ..ClusterOptions::default()
        })
        .unwrap_or_else(|e| panic!("starting a TLS-only server: {e}"));
        // In the cluster's directory, so they go when it goes.
        let dir = cluster.dir().join("client");
        std::fs::create_dir_all(&dir).expect("a directory for the client's files");
        let client = ca.client("certuser");
        let files = TlsServer {
            ca: write_private(&dir, "ca.pem", &ca.cert_pem()),
            other_ca: write_private(&dir, "other-ca.pem", &other.cert_pem()),
            client_cert: write_private(&dir, "client.crt", &client.cert_pem),
            client_key: write_private(&dir, "client.key", &client.key_pem),
            cluster,
        };
        // Set up over the unix socket, which the policy trusts; on a thread of its own, as
        // the first caller is inside a runtime.
        let admin_url = files.cluster.socket_url("postgres");
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async {
                let mut admin = AsyncPgConnection::establish(&admin_url)
                    .await
                    .expect("connecting over the socket");
                for sql in [
                    "CREATE DATABASE app",
                    "CREATE ROLE certuser LOGIN SUPERUSER",
                ] {
                    admin
                        .batch_execute(sql)
                        .await
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            });
        })
        .join()
        .expect("setting the server up");
        files
    })
}

impl TlsServer {
    /// A URL for database `app` on `host` (`localhost`, which the certificate names, or
    /// `127.0.0.1`, which it does not) as `user`, with `query` (e.g. `sslmode=require`).
    pub fn url(&self, host: &str, user: &str, query: &str) -> String {
        format!(
            "postgres://{user}@{host}:{}/app?{query}",
            self.cluster.port()
        )
    }
}
