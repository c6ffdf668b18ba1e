//! What the etcd client's errors mean for the engine: each becomes a
//! [`StoreError::Backend`] with the [`BackendFailure`] that says whether retrying can help.

use lease_core::{BackendFailure, Operation, StoreError};
use tonic::Code;

/// `error`, from `operation`, as the store error the engine handles.
///
/// Transient: no member reachable, a member without a leader (`require_leader`), a leader
/// change, a request that timed out (its outcome unknown: the next heartbeat says what the
/// store holds), a broken stream. Permanent: a request etcd refuses as malformed or too
/// large, credentials or permissions it refuses, a database over its space quota (an
/// operator must compact and defragment), an invalid endpoint.
pub fn classify(operation: Operation, error: etcd_client::Error) -> StoreError {
    let failure = failure(&error);
    StoreError::backend(operation, failure, error)
}

fn failure(error: &etcd_client::Error) -> BackendFailure {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) => match status.code() {
            Code::Unavailable | Code::Unknown => BackendFailure::Unavailable,
            Code::DeadlineExceeded | Code::Cancelled => BackendFailure::Timeout,
            Code::Aborted => BackendFailure::Conflict,
            Code::PermissionDenied => BackendFailure::PermissionDenied,
            Code::Unauthenticated => BackendFailure::Authentication,
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::ResourceExhausted
            | Code::Unimplemented => BackendFailure::Misconfigured,
            Code::DataLoss => BackendFailure::Corrupt,
            _ => BackendFailure::Other,
        },
        E::TransportError(_) | E::IoError(_) | E::LeaseKeepAliveError(_) | E::WatchError(_) => {
            BackendFailure::Unavailable
        }
        E::InvalidArgs(_) | E::InvalidUri(_) | E::InvalidHeaderValue(_) | E::EndpointError(_) => {
            BackendFailure::Misconfigured
        }
        E::Utf8Error(_) => BackendFailure::Corrupt,
        _ => BackendFailure::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_client::Error as E;
    use tonic::Status;

    fn of(error: etcd_client::Error) -> (BackendFailure, bool) {
        match classify(Operation::Claim, error) {
            StoreError::Backend {
                failure, operation, ..
            } => {
                assert_eq!(operation, Operation::Claim);
                (failure, failure.is_transient())
            }
            other => panic!("not a backend error: {other:?}"),
        }
    }

    #[test]
    fn what_the_research_runs_saw_is_classified() {
        // After a leader kill, a majority loss, a request to a dead member, a timeout.
        let seen = [
            (
                Status::unavailable("etcdserver: leader changed"),
                BackendFailure::Unavailable,
            ),
            (
                Status::unavailable("etcdserver: no leader"),
                BackendFailure::Unavailable,
            ),
            (
                Status::unavailable("tcp connect error"),
                BackendFailure::Unavailable,
            ),
            (
                Status::unknown("transport error"),
                BackendFailure::Unavailable,
            ),
            (
                Status::cancelled("Timeout expired"),
                BackendFailure::Timeout,
            ),
            (
                Status::invalid_argument("etcdserver: too many operations in txn request"),
                BackendFailure::Misconfigured,
            ),
            (
                Status::resource_exhausted("etcdserver: mvcc: database space exceeded"),
                BackendFailure::Misconfigured,
            ),
            (
                Status::unauthenticated("bad token"),
                BackendFailure::Authentication,
            ),
        ];
        for (status, want) in seen {
            let text = status.message().to_owned();
            assert_eq!(of(E::GRpcStatus(status)).0, want, "{text}");
        }
        assert_eq!(
            of(E::LeaseKeepAliveError("channel closed".into())),
            (BackendFailure::Unavailable, true)
        );
        assert_eq!(
            of(E::InvalidArgs("no endpoint".into())),
            (BackendFailure::Misconfigured, false)
        );
    }
}
