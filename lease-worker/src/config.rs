//! Node and worker configurations, validated when they are built.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use lease_core::balance::BalanceConfig;
use lease_core::{HalfLife, Ttl};

use crate::machine::{LoadRules, Rules};
use crate::registry::RunFlag;
use lease_core::{GroupName, Incarnation, MemberMetadata, NodeId, ShardCount};

/// A configuration the worker cannot run with. Each rule has its own variant.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The renew interval must be positive.
    #[error("renew interval must be positive")]
    RenewIntervalZero,
    /// A hand-over on stop is for a successor with the same node id: without a stable one
    /// (`node_id`), nobody could take the session over and its buckets would only wait.
    #[error(
        "keep_on_stop needs a stable node id (node_id): a successor takes the session over by it"
    )]
    KeepOnStopNeedsNodeId,
    /// The ttl must exceed twice the renew interval, so one lost heartbeat is survived.
    #[error(
        "ttl {ttl:?} must be more than twice the renew interval {renew_interval:?}, \
         so that one failed heartbeat does not lose the leases"
    )]
    TtlTooShort {
        /// The ttl.
        ttl: Duration,
        /// The renew interval.
        renew_interval: Duration,
    },
    /// The safety margin must be below `ttl - 1.5 x renew_interval`: the leases are trusted for
    /// `ttl - margin` after a heartbeat is sent, which must cover the renew interval and leave
    /// half an interval for the next heartbeat's round trip.
    #[error(
        "safety margin {margin:?} must be below ttl - 1.5 x renew interval ({limit:?}), \
         or the worker would fence itself between two renewals"
    )]
    MarginTooLarge {
        /// The margin.
        margin: Duration,
        /// `ttl - 1.5 x renew_interval`.
        limit: Duration,
    },
    /// The safety margin must be positive: it absorbs clock-rate drift and scheduling delays.
    #[error("safety margin must be positive")]
    MarginZero,
    /// The wake-up debounce must be shorter than the renew interval.
    #[error(
        "wake-up debounce {debounce:?} must be shorter than the renew interval {renew_interval:?}"
    )]
    DebounceTooLong {
        /// The debounce.
        debounce: Duration,
        /// The renew interval.
        renew_interval: Duration,
    },
    /// The ttl itself is invalid.
    #[error(transparent)]
    Ttl(#[from] lease_core::InvalidInput),
    /// The hand-over's keep time is out of a ttl's bounds.
    #[error("keep_on_stop: {0}")]
    KeepOnStop(lease_core::InvalidInput),
    /// The loads' half-life is out of its bounds.
    #[error("load_half_life: {0}")]
    LoadHalfLife(lease_core::InvalidInput),
}

/// A validated worker configuration: a node ([`LeaseNode`]) of one group, the group fixed;
/// [`start`](LeaseWorker::start) runs it.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{GroupName, ShardCount};
/// use lease_worker::LeaseWorker;
/// let worker = LeaseWorker::builder(GroupName::new("orders")?, ShardCount::new(64)?)
///     .ttl(Duration::from_secs(30))
///     .renew_interval(Duration::from_secs(10))
///     .build()?;
/// assert_eq!(worker.safety_margin(), Duration::from_secs(5));
/// let bad = LeaseWorker::builder(GroupName::new("orders")?, ShardCount::new(64)?)
///     .ttl(Duration::from_secs(10))
///     .renew_interval(Duration::from_secs(5))
///     .build();
/// assert!(bad.is_err()); // ttl must exceed twice the renew interval
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct LeaseWorker {
    pub(crate) group: GroupName,
    pub(crate) shards: ShardCount,
    /// The node it runs as.
    pub(crate) node: LeaseNode,
}

/// Builds a [`LeaseWorker`]: a [`LeaseNodeBuilder`] and the group. Every setting is the
/// node's (see there); only the group and its count are the worker's own.
#[derive(Debug, Clone)]
pub struct LeaseWorkerBuilder {
    group: GroupName,
    shards: ShardCount,
    node: LeaseNodeBuilder,
}

impl LeaseWorker {
    /// Default ttl: 30 s.
    pub const DEFAULT_TTL: Duration = LeaseNode::DEFAULT_TTL;
    /// Default renew interval: 10 s.
    pub const DEFAULT_RENEW_INTERVAL: Duration = LeaseNode::DEFAULT_RENEW_INTERVAL;
    /// Default pause after a wake-up before re-planning, to fold bursts together: 10 ms.
    pub const DEFAULT_WAKE_DEBOUNCE: Duration = LeaseNode::DEFAULT_WAKE_DEBOUNCE;

    /// A builder for a worker of `group`, split into `shards` buckets.
    pub fn builder(group: GroupName, shards: ShardCount) -> LeaseWorkerBuilder {
        LeaseWorkerBuilder {
            group,
            shards,
            node: LeaseNode::builder(),
        }
    }

    /// The group.
    pub fn group(&self) -> &GroupName {
        &self.group
    }

    /// The shard count.
    pub fn shard_count(&self) -> ShardCount {
        self.shards
    }

    /// The node the worker runs as.
    pub fn node(&self) -> &LeaseNode {
        &self.node
    }

    /// The worker's id.
    pub fn node_id(&self) -> NodeId {
        self.node.node_id()
    }

    /// The session ttl.
    pub fn ttl(&self) -> Ttl {
        self.node.ttl()
    }

    /// The renew interval.
    pub fn renew_interval(&self) -> Duration {
        self.node.renew_interval()
    }

    /// The safety margin of self-fencing.
    pub fn safety_margin(&self) -> Duration {
        self.node.safety_margin()
    }
}

impl LeaseWorkerBuilder {
    /// See [`LeaseNodeBuilder::ttl`].
    pub fn ttl(self, ttl: Duration) -> Self {
        self.with(|n| n.ttl(ttl))
    }

    /// See [`LeaseNodeBuilder::renew_interval`].
    pub fn renew_interval(self, interval: Duration) -> Self {
        self.with(|n| n.renew_interval(interval))
    }

    /// See [`LeaseNodeBuilder::safety_margin`].
    pub fn safety_margin(self, margin: Duration) -> Self {
        self.with(|n| n.safety_margin(margin))
    }

    /// See [`LeaseNodeBuilder::node_id`].
    pub fn node_id(self, node: NodeId) -> Self {
        self.with(|n| n.node_id(node))
    }

    /// See [`LeaseNodeBuilder::metadata`].
    pub fn metadata(self, metadata: MemberMetadata) -> Self {
        self.with(|n| n.metadata(metadata))
    }

    /// See [`LeaseNodeBuilder::wake_debounce`].
    pub fn wake_debounce(self, debounce: Duration) -> Self {
        self.with(|n| n.wake_debounce(debounce))
    }

    /// See [`LeaseNodeBuilder::revoke_ack_limit`].
    pub fn revoke_ack_limit(self, limit: Duration) -> Self {
        self.with(|n| n.revoke_ack_limit(limit))
    }

    /// See [`LeaseNodeBuilder::cancellation_token`]; each run stops on a child token of its
    /// own ([`WorkerHandle::cancellation_token`](crate::WorkerHandle::cancellation_token)).
    pub fn cancellation_token(self, token: CancellationToken) -> Self {
        self.with(|n| n.cancellation_token(token))
    }

    fn with(mut self, set: impl FnOnce(LeaseNodeBuilder) -> LeaseNodeBuilder) -> Self {
        self.node = set(self.node);
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<LeaseWorker, ConfigError> {
        Ok(LeaseWorker {
            group: self.group,
            shards: self.shards,
            node: self.node.build()?,
        })
    }
}

/// The rules every node's timing follows, each with its error; the margin, the
/// acknowledgement limit and the call timeout get their defaults here. The result is the
/// machine's [`Rules`], with a placeholder incarnation (each start draws its own).
fn validate(b: &LeaseNodeBuilder) -> Result<Rules, ConfigError> {
    let renew_interval = b.renew_interval;
    if renew_interval.is_zero() {
        return Err(ConfigError::RenewIntervalZero);
    }
    let ttl = Ttl::new(b.ttl)?;
    let ttl_d = ttl.as_duration();
    if ttl_d <= renew_interval * 2 {
        return Err(ConfigError::TtlTooShort {
            ttl: ttl_d,
            renew_interval,
        });
    }
    let limit = ttl_d - renew_interval * 3 / 2;
    let margin = b.margin.unwrap_or_else(|| (ttl_d / 6).min(limit / 2));
    if margin.is_zero() {
        return Err(ConfigError::MarginZero);
    }
    if margin >= limit {
        return Err(ConfigError::MarginTooLarge { margin, limit });
    }
    if b.wake_debounce >= renew_interval {
        return Err(ConfigError::DebounceTooLong {
            debounce: b.wake_debounce,
            renew_interval,
        });
    }
    let keep_on_stop = match b.keep_on_stop {
        Some(_) if b.node.is_none() => return Err(ConfigError::KeepOnStopNeedsNodeId),
        Some(keep) => Some(Ttl::new(keep).map_err(ConfigError::KeepOnStop)?),
        None => None,
    };
    Ok(Rules {
        node: b.node.unwrap_or_default(),
        incarnation: Incarnation::new(),
        metadata: b.metadata.clone(),
        ttl,
        renew_interval,
        safety_margin: margin,
        wake_debounce: b.wake_debounce,
        call_timeout: renew_interval.max(ttl_d / 2),
        ack_limit: Some(b.ack_limit.unwrap_or(ttl_d)),
        keep_on_stop,
        loads: LoadRules {
            half_life: HalfLife::new(b.load_half_life).map_err(ConfigError::LoadHalfLife)?,
            balance: b.balance,
            ..LoadRules::default()
        },
    })
}

/// A validated node configuration: one process's session, shared by the groups it is added
/// to at run time. [`start`](LeaseNode::start) runs it; groups are added and removed on the
/// [`NodeHandle`](crate::NodeHandle) it returns, each with its own shard count and its own
/// handler (or per-bucket leases).
///
/// One heartbeat per renew interval renews the node's session and answers for every group;
/// the trust deadline is the node's, so a missed renewal fences every group at once, before
/// any of its buckets can be taken.
///
/// ```
/// use std::time::Duration;
/// use lease_core::{GroupName, OwnershipEvent, ShardCount};
/// use lease_worker::{LeaseNode, event_channel};
/// use lease_memory::MemoryLeaseStore;
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let node = LeaseNode::builder()
///     .ttl(Duration::from_secs(3))
///     .renew_interval(Duration::from_secs(1))
///     .build()?
///     .start(MemoryLeaseStore::new())?;
/// let (orders, mut orders_events) = event_channel(64);
/// let (billing, mut billing_events) = event_channel(64);
/// let o = node.add_group(GroupName::new("orders")?, ShardCount::new(2)?, orders).await?;
/// let b = node.add_group(GroupName::new("billing")?, ShardCount::new(3)?, billing).await?;
/// // Alone in both groups, the node is assigned every bucket of each.
/// for _ in 0..2 {
///     assert!(matches!(orders_events.recv().await, Some(OwnershipEvent::Assigned(_))));
/// }
/// for _ in 0..3 {
///     assert!(matches!(billing_events.recv().await, Some(OwnershipEvent::Assigned(_))));
/// }
/// assert_eq!((o.owned().borrow().len(), b.owned().borrow().len()), (2, 3));
/// b.remove().await?; // revoke billing's buckets, leave billing; orders goes on
/// node.shutdown().await?; // revoke everything, leave every group
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct LeaseNode {
    /// The machine's rules, validated; each start draws a fresh incarnation.
    pub(crate) rules: Rules,
    pub(crate) cancel: CancellationToken,
    /// Shared with clones: one of them runs at a time.
    pub(crate) running: RunFlag,
}

/// Builds a [`LeaseNode`].
#[derive(Debug, Clone)]
pub struct LeaseNodeBuilder {
    ttl: Duration,
    renew_interval: Duration,
    margin: Option<Duration>,
    node: Option<NodeId>,
    metadata: MemberMetadata,
    wake_debounce: Duration,
    ack_limit: Option<Duration>,
    cancel: Option<CancellationToken>,
    keep_on_stop: Option<Duration>,
    load_half_life: Duration,
    balance: BalanceConfig,
}

impl LeaseNode {
    /// Default ttl: 30 s.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// Default renew interval: 10 s.
    pub const DEFAULT_RENEW_INTERVAL: Duration = Duration::from_secs(10);
    /// Default pause after a wake-up before re-planning, to fold bursts together: 10 ms.
    pub const DEFAULT_WAKE_DEBOUNCE: Duration = Duration::from_millis(10);

    /// A builder of a node, with the default timing.
    pub fn builder() -> LeaseNodeBuilder {
        LeaseNodeBuilder {
            ttl: Self::DEFAULT_TTL,
            renew_interval: Self::DEFAULT_RENEW_INTERVAL,
            margin: None,
            node: None,
            metadata: MemberMetadata::empty(),
            wake_debounce: Self::DEFAULT_WAKE_DEBOUNCE,
            ack_limit: None,
            cancel: None,
            keep_on_stop: None,
            load_half_life: HalfLife::DEFAULT.get(),
            balance: BalanceConfig::default(),
        }
    }

    /// The node's id.
    pub fn node_id(&self) -> NodeId {
        self.rules.node
    }

    /// The session ttl.
    pub fn ttl(&self) -> Ttl {
        self.rules.ttl
    }

    /// The renew interval.
    pub fn renew_interval(&self) -> Duration {
        self.rules.renew_interval
    }

    /// The safety margin of self-fencing.
    pub fn safety_margin(&self) -> Duration {
        self.rules.safety_margin
    }

    /// The rules a [`Machine`](crate::machine::Machine) of this node follows, with a fresh
    /// incarnation: for an application that drives the machine itself.
    pub fn rules(&self) -> Rules {
        Rules {
            incarnation: Incarnation::new(),
            ..self.rules.clone()
        }
    }
}

impl LeaseNodeBuilder {
    /// How long the session lives after a heartbeat (default 30 s).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How often to heartbeat and re-plan (default 10 s).
    pub fn renew_interval(mut self, interval: Duration) -> Self {
        self.renew_interval = interval;
        self
    }

    /// How long before the store could expire a lease the node stops trusting it: a lease
    /// is trusted until `sent + ttl - margin`, `sent` being when the last successful heartbeat
    /// was sent (default: a sixth of the ttl, at most half of `ttl - 1.5 x renew_interval`).
    /// It absorbs clock-rate drift between this host and the store, scheduling delays and
    /// handler time; it must be positive and below `ttl - 1.5 x renew_interval`.
    pub fn safety_margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }

    /// The node's id (default: a fresh UUID v7). Use a fresh id for every process start, or
    /// a stable one per process slot (a stateful-set pod's): a second process with the id of
    /// a live one is refused until that one's session ends.
    pub fn node_id(mut self, node: NodeId) -> Self {
        self.node = Some(node);
        self
    }

    /// What to show about this node in `leasectl status` (host, pid, version...).
    pub fn metadata(mut self, metadata: MemberMetadata) -> Self {
        self.metadata = metadata;
        self
    }

    /// Pause after a wake-up before re-planning, so a burst of changes (in any of the node's
    /// groups) costs one tick (default 10 ms).
    pub fn wake_debounce(mut self, debounce: Duration) -> Self {
        self.wake_debounce = debounce;
        self
    }

    /// How long the application may take to stop working on a revoked bucket (to drop its
    /// [`BucketLease`](crate::BucketLease)) before the node reports the bucket stuck and keeps
    /// it, never released, out of the store's hands until its session ends (default: the
    /// ttl). A handler's revocation is acknowledged when `on_revoked` returns, which the node
    /// awaits whatever this says.
    pub fn revoke_ack_limit(mut self, limit: Duration) -> Self {
        self.ack_limit = Some(limit);
        self
    }

    /// Stop gracefully when `token` is cancelled (default: a token of the node's own). Each
    /// run of the configuration stops on a child token of its own
    /// ([`NodeHandle::cancellation_token`](crate::NodeHandle::cancellation_token)).
    pub fn cancellation_token(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// On a graceful stop, revoke everything in the application (reason `shutdown`), then
    /// hand the session over for `keep` instead of leaving the groups: a process started with
    /// the same [`node_id`](Self::node_id) within `keep` takes over the session and its
    /// buckets with their tokens (nobody else can have held them in between), and no other
    /// node claims them meanwhile; with no successor they become claimable when the session
    /// expires. For rolling restarts that move nothing. Needs a stable node id.
    pub fn keep_on_stop(mut self, keep: Duration) -> Self {
        self.keep_on_stop = Some(keep);
        self
    }

    /// How fast a bucket's smoothed load forgets a sample the application reported with
    /// [`GroupHandle::report_load`](crate::GroupHandle::report_load): after one half-life a
    /// sample weighs half (default 10 s).
    pub fn load_half_life(mut self, half_life: Duration) -> Self {
        self.load_half_life = half_life;
        self
    }

    /// The load-aware policy's hysteresis band and move budget (default: 10 % and 10 % of
    /// the group's buckets per tick). Used once a bucket of the group has a load.
    pub fn balance(mut self, balance: BalanceConfig) -> Self {
        self.balance = balance;
        self
    }

    /// Validate and build.
    pub fn build(self) -> Result<LeaseNode, ConfigError> {
        Ok(LeaseNode {
            rules: validate(&self)?,
            cancel: self.cancel.unwrap_or_default(),
            running: RunFlag::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> LeaseWorkerBuilder {
        LeaseWorker::builder(GroupName::new("g").unwrap(), ShardCount::new(8).unwrap())
    }

    #[test]
    fn defaults_are_valid() {
        let w = builder().build().unwrap();
        assert_eq!(w.ttl().as_duration(), Duration::from_secs(30));
        assert_eq!(w.renew_interval(), Duration::from_secs(10));
        assert_eq!(w.safety_margin(), Duration::from_secs(5));
    }

    #[test]
    fn each_rule_has_its_error() {
        assert_eq!(
            builder()
                .renew_interval(Duration::ZERO)
                .build()
                .unwrap_err(),
            ConfigError::RenewIntervalZero
        );
        assert_eq!(
            builder()
                .ttl(Duration::from_secs(20))
                .renew_interval(Duration::from_secs(10))
                .build()
                .unwrap_err(),
            ConfigError::TtlTooShort {
                ttl: Duration::from_secs(20),
                renew_interval: Duration::from_secs(10)
            }
        );
        assert_eq!(
            builder()
                .safety_margin(Duration::from_secs(15))
                .build()
                .unwrap_err(),
            ConfigError::MarginTooLarge {
                margin: Duration::from_secs(15),
                limit: Duration::from_secs(15)
            }
        );
        assert_eq!(
            builder().safety_margin(Duration::ZERO).build().unwrap_err(),
            ConfigError::MarginZero
        );
        assert_eq!(
            builder()
                .wake_debounce(Duration::from_secs(10))
                .build()
                .unwrap_err(),
            ConfigError::DebounceTooLong {
                debounce: Duration::from_secs(10),
                renew_interval: Duration::from_secs(10)
            }
        );
        assert!(matches!(
            builder().ttl(Duration::ZERO).build().unwrap_err(),
            ConfigError::Ttl(_)
        ));
        assert!(
            builder()
                .safety_margin(Duration::from_millis(14_999))
                .build()
                .is_ok()
        );
    }

    #[test]
    fn a_node_follows_the_same_rules() {
        let node = LeaseNode::builder().build().unwrap();
        assert_eq!(node.safety_margin(), Duration::from_secs(5));
        assert_eq!(
            LeaseNode::builder()
                .ttl(Duration::from_secs(20))
                .renew_interval(Duration::from_secs(10))
                .build()
                .unwrap_err(),
            ConfigError::TtlTooShort {
                ttl: Duration::from_secs(20),
                renew_interval: Duration::from_secs(10)
            }
        );
        assert_eq!(
            LeaseNode::builder()
                .wake_debounce(Duration::from_secs(10))
                .build()
                .unwrap_err(),
            ConfigError::DebounceTooLong {
                debounce: Duration::from_secs(10),
                renew_interval: Duration::from_secs(10)
            }
        );
    }

    #[test]
    fn the_default_margin_fits_short_ttls() {
        let w = builder()
            .ttl(Duration::from_millis(2_100))
            .renew_interval(Duration::from_secs(1))
            .build()
            .unwrap();
        assert_eq!(w.safety_margin(), Duration::from_millis(300));
        let w = builder()
            .ttl(Duration::from_secs(3))
            .renew_interval(Duration::from_millis(1_400))
            .build()
            .unwrap();
        assert!(w.safety_margin() < Duration::from_millis(900));
    }
}
