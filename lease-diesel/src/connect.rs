//! Opening connections: the URL's settings, the engine's defaults for detecting a dead peer,
//! and the per-connection statement timeout.
//!
//! A connection goes through `tokio_postgres` directly (diesel-async's own `establish` takes
//! only a URL), so the engine can add what a URL rarely says: TCP keepalives that notice a
//! silent peer within seconds instead of the kernel's two hours, and a `tcp_user_timeout`
//! that drops a connection whose sent data goes unacknowledged (a network black hole). A URL
//! that sets either keeps its own value.
//!
//! Through a transaction pooler ([`Connector::new`]'s `transaction_pooler`) a connection keeps
//! no session state: no statement timeout is `SET` on it (each operation sets its own with
//! `SET LOCAL`, see `PgLeaseStore::with_conn`), its prepared statements are never cached (a
//! statement prepared in one transaction may be missing from the server connection the
//! pooler hands out for the next), and diesel-async's own set-up statements run inside one
//! transaction, so that their two round trips each (prepare, then execute) reach one server
//! connection.

use std::time::Duration;

use diesel::ConnectionError;
use diesel::connection::CacheSize;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

use crate::error;
use crate::tls::{Tls, TlsSummary};

/// Idle time before the first keepalive probe, unless the URL says otherwise.
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);
/// Time between unanswered keepalive probes.
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(2);
/// Unanswered probes before the connection is dropped.
const KEEPALIVES_RETRIES: u32 = 3;
/// How long sent data may stay unacknowledged before the connection is dropped, unless the URL
/// says otherwise.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening the socket to one host of a URL with several may take before the next
/// host is tried, unless the URL sets `connect_timeout`: a host whose packets vanish (a dead
/// primary's address) must not use up the whole connection timeout before the new primary
/// is tried.
const CONNECT_TIMEOUT_PER_HOST: Duration = Duration::from_secs(2);

/// How to open a connection: the parsed URL with the engine's defaults applied.
#[derive(Clone, Debug)]
pub(crate) struct Connector {
    config: tokio_postgres::Config,
    /// The URL without its TLS keys, to name its target in errors (never its password).
    url: String,
    tls: Tls,
    set_statement_timeout: String,
    /// The URL reaches the server through a transaction pooler: no session state.
    transaction_pooler: bool,
}

impl Connector {
    /// `url` (validated, its TLS and engine keys taken out), with keepalives and a TCP user
    /// timeout where the URL sets none, and `statement_timeout` set on every connection
    /// unless it goes through a `transaction_pooler` (then each transaction sets its own).
    pub(crate) fn new(
        mut config: tokio_postgres::Config,
        url: &str,
        tls: Tls,
        statement_timeout: Duration,
        transaction_pooler: bool,
    ) -> Self {
        // As in libpq, TLS is never used over a unix socket (the server does not offer it
        // there): a URL with `sslmode=require` and a socket directory connects in plain.
        let only_sockets = config
            .get_hosts()
            .iter()
            .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)));
        config.ssl_mode(if only_sockets && !config.get_hosts().is_empty() {
            tokio_postgres::config::SslMode::Disable
        } else {
            tls.ssl_mode
        });
        config.keepalives(true);
        if !mentions(url, "keepalives_idle") {
            config.keepalives_idle(KEEPALIVES_IDLE);
        }
        if !mentions(url, "keepalives_interval") {
            config.keepalives_interval(KEEPALIVES_INTERVAL);
        }
        if !mentions(url, "keepalives_retries") {
            config.keepalives_retries(KEEPALIVES_RETRIES);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        let hosts = config.get_hosts().len().max(config.get_hostaddrs().len());
        if hosts > 1 && config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT_PER_HOST);
        }
        Self {
            config,
            url: url.to_owned(),
            tls,
            set_statement_timeout: format!(
                "SET statement_timeout = {}",
                statement_timeout.as_millis().max(1)
            ),
            transaction_pooler,
        }
    }

    /// Open a connection and set it up. A failure keeps its cause and SQLSTATE, classified
    /// (see [`PgSetupError`](crate::PgSetupError)), which diesel-async's own `establish` would
    /// reduce to "error connecting to server".
    pub(crate) async fn connect(&self) -> Result<AsyncPgConnection, ConnectionError> {
        match &self.tls.connector {
            None => {
                let (client, connection) = self
                    .config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .map_err(|e| self.failed(&e))?;
                self.set_up(client, connection).await
            }
            Some(tls) => {
                let (client, connection) = self
                    .config
                    .connect(tls.clone())
                    .await
                    .map_err(|e| self.failed(&e))?;
                self.set_up(client, connection).await
            }
        }
    }

    /// A failure to connect, classified (see [`PgSetupError`](crate::PgSetupError)).
    fn failed(&self, e: &tokio_postgres::Error) -> ConnectionError {
        error::into_connection_error(error::from_connect(&self.url, Some(&self.tls.summary), e))
    }

    /// Hand a new connection to diesel-async and set it up for the way it reaches the server.
    async fn set_up<T>(
        &self,
        client: tokio_postgres::Client,
        mut connection: tokio_postgres::Connection<tokio_postgres::Socket, T>,
    ) -> Result<AsyncPgConnection, ConnectionError>
    where
        T: tokio_postgres::tls::TlsStream + Unpin + Send + 'static,
    {
        if self.transaction_pooler {
            // diesel-async's set-up (`SET TIME ZONE`, `SET CLIENT_ENCODING`) prepares and then
            // executes each statement, two round trips a pooler may send to two server
            // connections: hold one server connection for it. The connection is not driven by
            // diesel-async yet, so it is driven here until the `BEGIN` is answered.
            let begin = std::pin::pin!(client.batch_execute("BEGIN"));
            tokio::select! {
                began = begin => began.map_err(|e| self.failed(&e))?,
                ended = &mut connection => {
                    return Err(match ended {
                        Err(e) => self.failed(&e),
                        Ok(()) => error::into_connection_error(crate::PgSetupError::Unreachable {
                            message: "the connection closed while it was set up".to_owned(),
                        }),
                    });
                }
            }
        }
        let mut conn =
            AsyncPgConnection::try_from_client_and_connection(client, connection).await?;
        if self.transaction_pooler {
            conn.set_prepared_statement_cache_size(CacheSize::Disabled);
            conn.batch_execute("COMMIT")
                .await
                .map_err(ConnectionError::CouldntSetupConfiguration)?;
        } else {
            conn.batch_execute(&self.set_statement_timeout)
                .await
                .map_err(ConnectionError::CouldntSetupConfiguration)?;
        }
        Ok(conn)
    }

    /// The TLS settings in effect.
    pub(crate) fn tls(&self) -> &TlsSummary {
        &self.tls.summary
    }

    /// The TLS connector connections are made with, if any (for cancel requests).
    pub(crate) fn tls_connector(&self) -> Option<tokio_postgres_rustls::MakeRustlsConnect> {
        self.tls.connector.clone()
    }
}

/// Whether a URL (`postgres://…?k=v`) or key-value string (`k=v …`) sets `key`.
fn mentions(url: &str, key: &str) -> bool {
    url.split(['?', '&', ' '])
        .any(|part| part.trim_start().starts_with(&format!("{key}=")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_tls() -> Tls {
        let (_, params) = crate::tls::split("postgres://h/db?sslmode=disable").expect("url");
        params.build().expect("no TLS")
    }

    #[test]
    fn defaults_apply_only_where_the_url_is_silent() {
        let url = "postgres://u@h/db?keepalives_idle=30&tcp_user_timeout=1";
        let c = Connector::new(
            url.parse().expect("url"),
            url,
            no_tls(),
            Duration::from_secs(1),
            false,
        );
        assert_eq!(c.config.get_keepalives_idle(), Duration::from_secs(30));
        assert_eq!(
            c.config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(1))
        );
        assert_eq!(
            c.config.get_keepalives_interval(),
            Some(KEEPALIVES_INTERVAL)
        );
        let url = "host=/tmp user=u keepalives_retries=9";
        let c = Connector::new(
            url.parse().expect("url"),
            url,
            no_tls(),
            Duration::from_secs(1),
            false,
        );
        assert_eq!(c.config.get_keepalives_idle(), KEEPALIVES_IDLE);
        assert_eq!(c.config.get_keepalives_retries(), Some(9));
        assert_eq!(c.config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert!(c.config.get_keepalives());
        assert_eq!(
            c.config.get_connect_timeout(),
            None,
            "one host: no timeout of ours"
        );
    }

    #[test]
    fn several_hosts_get_a_connect_timeout_each_unless_the_url_sets_one() {
        let connector = |url: &str| {
            Connector::new(
                url.parse().expect("url"),
                url,
                no_tls(),
                Duration::from_secs(1),
                false,
            )
        };
        let c = connector("postgres://u@h1:5432,h2:5433/db?target_session_attrs=read-write");
        assert_eq!(c.config.get_hosts().len(), 2);
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&CONNECT_TIMEOUT_PER_HOST)
        );
        let c = connector("postgres://u@h1,h2/db?connect_timeout=7");
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&Duration::from_secs(7))
        );
        let c = connector("host=h1,h2 port=5432,5433 user=u");
        assert_eq!(
            c.config.get_connect_timeout(),
            Some(&CONNECT_TIMEOUT_PER_HOST)
        );
    }
}
