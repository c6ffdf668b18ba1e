//! Sending a request to etcd: which failed requests are sent again, and when.

use std::time::Duration;

use etcd_client::Txn;
use lease_core::{Operation, StoreError};

use super::EtcdLeaseStore;
use crate::error::classify;

/// How often a request that never reached a member is sent again at once before the call
/// fails (the client picked a member that is down; the next pick is likely another).
const UNSENT_RETRIES: usize = 6;

/// Which failed requests are sent again: a write only when it cannot have been applied, a
/// repeatable request (a read) whenever a member was unavailable.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Resend {
    /// A write: only when nothing can have been applied.
    IfUnapplied,
    /// A read, a keep-alive, a revoke: whenever a member was unavailable.
    Repeatable,
}

/// Whether a failed request may be sent again, and after how long.
fn resend(error: &etcd_client::Error, kind: Resend, tries: usize) -> Option<Duration> {
    let backoff = Duration::from_millis(25 << tries.min(4));
    match error {
        etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable => {
            let message = status.message();
            let from_etcd = message.starts_with("etcdserver:");
            if !from_etcd
                && (message == "tcp connect error" || message.contains("error trying to connect"))
            {
                // The client could not reach the member it picked: nothing was sent, and the
                // next pick is likely a live member. (Not etcd's "request timed out, possibly
                // due to connection lost": that request was proposed and may be applied.)
                Some(Duration::ZERO)
            } else if (from_etcd && message.contains("no leader")) || kind == Resend::Repeatable {
                // `require_leader`: a member without a leader refuses before proposing
                // anything. Or a read during an election.
                Some(backoff)
            } else {
                None
            }
        }
        etcd_client::Error::TransportError(_) => Some(Duration::ZERO),
        _ => None,
    }
}

/// Run the request `f` makes; again (at most [`UNSENT_RETRIES`] times) while [`resend`] says
/// it may be.
pub(super) async fn send<T, Fut>(
    op: Operation,
    kind: Resend,
    mut f: impl FnMut() -> Fut,
) -> Result<T, StoreError>
where
    Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
{
    let mut tries = 0;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => match resend(&e, kind, tries) {
                Some(wait) if tries < UNSENT_RETRIES => {
                    tries += 1;
                    tokio::time::sleep(wait).await;
                }
                _ => return Err(classify(op, e)),
            },
        }
    }
}

impl EtcdLeaseStore {
    /// One transaction, sent again as [`resend`] allows for its `kind`.
    pub(super) async fn txn(
        &self,
        op: Operation,
        kind: Resend,
        txn: Txn,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        send(op, kind, || {
            let mut kv = self.client.kv_client();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }
}

#[cfg(test)]
mod resending {
    use super::*;

    fn unavailable(message: &str) -> etcd_client::Error {
        etcd_client::Error::GRpcStatus(tonic::Status::unavailable(message))
    }

    #[test]
    fn writes_are_sent_again_only_when_nothing_was_applied() {
        let w = Resend::IfUnapplied;
        assert_eq!(
            resend(&unavailable("tcp connect error"), w, 0),
            Some(Duration::ZERO)
        );
        assert!(resend(&unavailable("etcdserver: no leader"), w, 0).is_some());
        // Proposed, then the leader changed or the connection was lost: it may have been
        // applied.
        let lost = "etcdserver: request timed out, possibly due to connection lost";
        assert_eq!(resend(&unavailable(lost), w, 0), None);
        assert_eq!(
            resend(&unavailable("etcdserver: leader changed"), w, 0),
            None
        );
        let timeout = etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("x"));
        assert_eq!(resend(&timeout, w, 0), None);
    }

    #[test]
    fn reads_are_sent_again_whenever_a_member_was_unavailable_with_a_growing_wait() {
        let r = Resend::Repeatable;
        let changed = unavailable("etcdserver: leader changed");
        assert_eq!(resend(&changed, r, 0), Some(Duration::from_millis(25)));
        assert_eq!(resend(&changed, r, 2), Some(Duration::from_millis(100)));
        assert_eq!(resend(&changed, r, 9), Some(Duration::from_millis(400)));
        let denied = etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("x"));
        assert_eq!(resend(&denied, r, 0), None);
    }
}
