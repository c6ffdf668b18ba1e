//! Assignments as per-bucket leases: the application receives a [`BucketLease`] for each
//! bucket it owns, works on it until [`BucketLease::revoked`] fires, and acknowledges the
//! revocation by dropping the lease (or [`BucketLease::complete`]).
//!
//! `revoked` fires when the worker revokes the bucket (shed, lost, shutdown...) **or** when
//! the lease's trust deadline passes, whichever comes first, even if the worker task is busy:
//! a loop that `select!`s on it stops writing in time. The worker releases a shed bucket only
//! once its lease is dropped; an application that holds a revoked lease longer than the
//! worker's [`revoke_ack_limit`](crate::LeaseWorkerBuilder::revoke_ack_limit) gets the bucket
//! reported stuck: the worker keeps it (its session holds it, nobody else can take it), neither
//! releasing it nor assigning it again, until the lease is dropped.
//!
//! ```
//! use std::time::Duration;
//! use lease_core::{GroupName, ShardCount};
//! use lease_memory::MemoryLeaseStore;
//! use lease_worker::LeaseWorker;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let (worker, mut leases) = LeaseWorker::builder(GroupName::new("orders")?, ShardCount::new(2)?)
//!     .ttl(Duration::from_secs(3))
//!     .renew_interval(Duration::from_secs(1))
//!     .build()?
//!     .start_leases(MemoryLeaseStore::new())
//!     .await?;
//! let lease = leases.recv().await.expect("a bucket");
//! let work = tokio::spawn(async move {
//!     // Work until told to stop; dropping the lease then tells the worker it stopped.
//!     let why = lease.revoked().await;
//!     (lease.bucket(), why)
//! });
//! worker.shutdown().await?; // revokes everything: the task above stops
//! let (bucket, why) = work.await?;
//! assert_eq!(why, lease_core::RevokeReason::Shutdown);
//! # let _ = bucket;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use futures_util::stream::{FuturesUnordered, StreamExt};
use lease_core::{Assignment, Bucket, FencingToken, RevokeReason};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::application::Application;
use crate::events::WorkerError;

/// How long the leases are trusted: the driver updates it after every heartbeat.
pub(crate) type Trust = watch::Receiver<Option<std::time::Instant>>;

/// One bucket the application owns, until [`revoked`](Self::revoked) fires. Dropping it tells
/// the worker the application stopped working on the bucket.
#[derive(Debug)]
pub struct BucketLease {
    assignment: Assignment,
    trust: Trust,
    revoked: CancellationToken,
    reason: Arc<Mutex<Option<RevokeReason>>>,
    /// Dropped with the lease: the worker reads that as the acknowledgement.
    _ack: oneshot::Sender<()>,
}

impl BucketLease {
    /// The bucket.
    pub fn bucket(&self) -> Bucket {
        self.assignment.bucket
    }

    /// Its fencing token: pass it with every write the bucket's work makes.
    pub fn token(&self) -> FencingToken {
        self.assignment.token
    }

    /// The bucket, its token, its generation's shard count and, after a resize, its parents
    /// ([`Assignment::parents`]), whose checkpoints its keys continue.
    pub fn assignment(&self) -> Assignment {
        self.assignment
    }

    /// Until when the lease is trusted, as of the worker's last renewal (`None`: not any
    /// more).
    pub fn trusted_until(&self) -> Option<Instant> {
        (*self.trust.borrow()).map(Instant::from_std)
    }

    /// Whether the application may still work on the bucket: not revoked, and before the
    /// trust deadline.
    pub fn is_valid(&self) -> bool {
        !self.revoked.is_cancelled()
            && self
                .trusted_until()
                .is_some_and(|until| Instant::now() < until)
    }

    /// Why the application must stop, once it must: the worker revoked the bucket (with its
    /// reason), or the trust deadline passed ([`RevokeReason::Fenced`]), whichever comes
    /// first. Cancel-safe; it may be awaited again and answers at once after it fired.
    pub async fn revoked(&self) -> RevokeReason {
        let mut trust = self.trust.clone();
        loop {
            let deadline = (*trust.borrow_and_update()).map(Instant::from_std);
            let Some(deadline) = deadline else {
                return self.reason().unwrap_or(RevokeReason::Fenced);
            };
            tokio::select! {
                biased;
                () = self.revoked.cancelled() => {
                    return self.reason().unwrap_or(RevokeReason::Lost);
                }
                () = tokio::time::sleep_until(deadline) => {
                    // A renewal may have moved the deadline meanwhile.
                    if trust.has_changed().unwrap_or(false) {
                        continue;
                    }
                    return RevokeReason::Fenced;
                }
                changed = trust.changed() => {
                    if changed.is_err() {
                        // The worker is gone: nothing it held can be trusted.
                        return self.reason().unwrap_or(RevokeReason::Fenced);
                    }
                }
            }
        }
    }

    fn reason(&self) -> Option<RevokeReason> {
        *self.reason.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Say the application stopped working on the bucket (dropping the lease says the same).
    pub fn complete(self) {}
}

/// The leases a worker hands the application, in order.
#[derive(Debug)]
pub struct Leases {
    rx: mpsc::Receiver<BucketLease>,
}

impl Leases {
    /// The next lease; `None` once the worker stopped.
    pub async fn recv(&mut self) -> Option<BucketLease> {
        self.rx.recv().await
    }
}

/// What the driver keeps of a lease it handed out.
struct Handed {
    revoked: CancellationToken,
    reason: Arc<Mutex<Option<RevokeReason>>>,
    ack: oneshot::Receiver<()>,
}

type AckFuture = Pin<Box<dyn std::future::Future<Output = Bucket> + Send>>;

/// The driver's side: hands out leases, revokes them, collects acknowledgements.
pub(crate) struct LeaseSender {
    tx: mpsc::Sender<BucketLease>,
    trust: Trust,
    handed: BTreeMap<Bucket, Handed>,
    acks: FuturesUnordered<AckFuture>,
}

impl LeaseSender {
    pub(crate) fn new(capacity: usize, trust: Trust) -> (Self, Leases) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Self {
                tx,
                trust,
                handed: BTreeMap::new(),
                acks: FuturesUnordered::new(),
            },
            Leases { rx },
        )
    }
}

#[async_trait]
impl Application for LeaseSender {
    async fn assign(&mut self, assignment: Assignment) {
        let bucket = assignment.bucket;
        let (ack_tx, ack_rx) = oneshot::channel();
        let revoked = CancellationToken::new();
        let reason = Arc::new(Mutex::new(None));
        let lease = BucketLease {
            assignment,
            trust: self.trust.clone(),
            revoked: revoked.clone(),
            reason: reason.clone(),
            _ack: ack_tx,
        };
        // An application that stopped receiving leases owns nothing: the lease is dropped at
        // once, which acknowledges any revocation of it in advance.
        self.tx.send(lease).await.ok();
        self.handed.insert(
            bucket,
            Handed {
                revoked,
                reason,
                ack: ack_rx,
            },
        );
    }

    async fn revoke(&mut self, bucket: Bucket, _token: FencingToken, reason: RevokeReason) -> bool {
        let Some(handed) = self.handed.remove(&bucket) else {
            return true;
        };
        *handed.reason.lock().unwrap_or_else(PoisonError::into_inner) = Some(reason);
        handed.revoked.cancel();
        let mut ack = handed.ack;
        if ack
            .try_recv()
            .is_err_and(|e| e == oneshot::error::TryRecvError::Closed)
        {
            // Dropped already.
            return true;
        }
        self.acks.push(Box::pin(async move {
            // The sender only ever closes (the lease dropped): that is the acknowledgement.
            let _ = ack.await;
            bucket
        }));
        false
    }

    async fn error(&mut self, _error: &WorkerError) {}

    async fn next_ack(&mut self) -> Bucket {
        match self.acks.next().await {
            Some(bucket) => bucket,
            None => std::future::pending().await,
        }
    }
}
