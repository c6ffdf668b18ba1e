//! A connection checked out of the pool for one operation, and what happens to it when the
//! operation does not finish: the server is asked to cancel the statement the connection may
//! still be running, then the connection is closed.
//!
//! A caller that gives up on an operation (the store's own call timeout, or a worker's
//! deadline dropping the future) closes the connection, but closing the socket does not stop
//! the server: a backend running a statement, or waiting for a lock, notices a vanished client
//! only when it next writes to it, at the end of the statement (up to the statement timeout).
//! Meanwhile it keeps its locks: an abandoned claim or release holds its node row, and the
//! node's next heartbeat waits for it (a merge from 65,536 buckets showed heartbeats waiting
//! 8-9 s on the server for calls their client had given up at 1.5 s). So an abandoned
//! operation sends a cancel request (the protocol's `CancelRequest`, on a connection of its
//! own, naming the backend and its secret key) before the connection is closed. The
//! connection is kept open until the request is sent, so that a pooler in front of the
//! server (which forwards a cancel to the server connection linked to the client) can still
//! find it. An operation that ended with an answer, an error included, sends none: its
//! backend is idle.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use diesel_async::pooled_connection::deadpool::Object;
use lease_core::{BackendFailure, Operation, StoreError};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long a cancel request may take (connecting included) before it is given up: a server
/// that does not answer (a frozen host, a cut network) must not keep a task alive.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);

/// What a cancel request needs: the TLS connector connections are made with (`None`: plain,
/// or a pool built elsewhere, whose settings are unknown; the server accepts a cancel request
/// in plain whatever its `pg_hba.conf` says of connections).
#[derive(Clone, Default)]
pub(crate) struct Canceller {
    pub(crate) tls: Option<MakeRustlsConnect>,
}

impl std::fmt::Debug for Canceller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canceller")
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Canceller {
    /// Ask the server to cancel what `token`'s backend runs, within [`CANCEL_TIMEOUT`].
    /// Failures are only logged: the connection is closed anyway.
    async fn cancel(&self, token: tokio_postgres::CancelToken) {
        let sent = match &self.tls {
            Some(tls) => {
                tokio::time::timeout(CANCEL_TIMEOUT, token.cancel_query(tls.clone())).await
            }
            None => {
                tokio::time::timeout(CANCEL_TIMEOUT, token.cancel_query(tokio_postgres::NoTls))
                    .await
            }
        };
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "a cancel request failed"),
            Err(_) => tracing::debug!("a cancel request timed out"),
        }
    }
}

type Pooled = Object<AsyncPgConnection>;

/// A pooled connection that returns to the pool only when [`keep`](Self::keep) says so;
/// otherwise dropping it closes the connection, and cancels the statement it may still run
/// unless [`finished`](Self::finished) said the operation got its answer.
pub(crate) struct Checkout {
    conn: Option<Pooled>,
    /// Set while the operation has not finished: what to cancel, and how.
    cancel: Option<(tokio_postgres::CancelToken, Canceller)>,
}

impl Checkout {
    pub(crate) fn new(conn: Pooled, canceller: &Canceller) -> Self {
        let token = conn.cancel_token();
        Self {
            conn: Some(conn),
            cancel: Some((token, canceller.clone())),
        }
    }

    pub(crate) fn conn(&mut self, op: Operation) -> Result<&mut AsyncPgConnection, StoreError> {
        self.conn.as_deref_mut().ok_or_else(|| {
            StoreError::backend_detail(
                op,
                BackendFailure::Corrupt,
                "a connection was used after it was given back",
            )
        })
    }

    /// The operation got the server's answer (a result or an error): nothing to cancel.
    pub(crate) fn finished(&mut self) {
        self.cancel = None;
    }

    /// The operation finished cleanly: the connection may serve the next one.
    pub(crate) fn keep(mut self) {
        self.cancel = None;
        drop(self.conn.take());
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        // Detached from the pool, the connection closes when dropped.
        let conn = Object::take(conn);
        let Some((token, canceller)) = self.cancel.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    canceller.cancel(token).await;
                    drop(conn);
                });
            }
            // No runtime to send it from (the caller's was shut down): close it only.
            Err(_) => drop(conn),
        }
    }
}
