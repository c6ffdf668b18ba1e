//! Sessions on etcd leases: keeping a session's lease alive, granting and revoking leases,
//! reading their times, and the heartbeat that does all of these around its rule.

use std::collections::BTreeMap;
use std::time::Duration;

use lease_core::{
    GroupStamp, Heartbeat, Incarnation, MemberMetadata, NodeId, Operation, StoreError, Timestamp,
    Ttl,
};

use super::send::{Resend, send};
use super::{ATTEMPTS, EtcdLeaseStore, LivePuts, Loaded, Scope, lost_races};
use crate::codec::NodeExtra;

/// A ttl in whole seconds of an etcd lease, rounded up (a lease outlives the worker's trust,
/// never the reverse), at least 1.
fn lease_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

impl EtcdLeaseStore {
    /// Keep `lease` alive; whether it still was.
    pub(super) async fn keep_alive(&self, op: Operation, lease: i64) -> Result<bool, StoreError> {
        let answer = send(op, Resend::Repeatable, || {
            let mut leases = self.client.lease_client();
            async move {
                let (mut keeper, mut answers) = leases.keep_alive(lease).await?;
                keeper.keep_alive().await?;
                match answers.message().await {
                    // etcd answers a lease that ran out with a ttl of 0; the client turns that
                    // into this error.
                    Err(etcd_client::Error::LeaseKeepAliveError(e)) if e.contains("not found") => {
                        Ok(None)
                    }
                    answer => answer,
                }
            }
        })
        .await?;
        Ok(answer.is_some_and(|a| a.ttl() > 0))
    }

    pub(super) fn renewing(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<(NodeId, Incarnation), i64>> {
        self.renewing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn renewing_lease(&self, process: (NodeId, Incarnation)) -> Option<i64> {
        self.renewing().get(&process).copied()
    }

    pub(super) fn remember_lease(&self, process: (NodeId, Incarnation), lease: i64) {
        self.renewing().insert(process, lease);
    }

    pub(super) fn forget_lease(&self, process: (NodeId, Incarnation)) {
        self.renewing().remove(&process);
    }

    /// A new etcd lease for a session of `ttl`.
    pub(super) async fn grant(
        &self,
        op: Operation,
        ttl: Ttl,
    ) -> Result<etcd_client::LeaseGrantResponse, StoreError> {
        send(op, Resend::IfUnapplied, || {
            let mut leases = self.client.lease_client();
            async move { leases.grant(lease_secs(ttl.as_duration()), None).await }
        })
        .await
    }

    /// Revoke a lease no session uses (any more). A failure is left alone: the lease runs
    /// out by itself and keeps nothing alive meanwhile.
    pub(super) async fn revoke(&self, lease: i64) {
        send(Operation::Heartbeat, Resend::Repeatable, || {
            let mut leases = self.client.lease_client();
            async move { leases.revoke(lease).await }
        })
        .await
        .ok();
    }

    /// Lease mode: when each live session was last renewed and when it ends, as etcd says
    /// (its time-to-live is in whole seconds, so an expiry is told up to a second early; the
    /// rules judge liveness by the liveness keys, not by these).
    pub(super) async fn lease_times(
        &self,
        op: Operation,
        loaded: &Loaded,
        now: Timestamp,
        wanted: impl Fn(NodeId) -> bool,
    ) -> Result<BTreeMap<NodeId, (Timestamp, Timestamp)>, StoreError> {
        let asked = loaded
            .lives
            .iter()
            .filter(|&(&w, &(session, _, _))| {
                wanted(w)
                    && loaded
                        .state
                        .nodes
                        .get(&w)
                        .is_some_and(|r| r.session == session)
            })
            .map(|(&w, &(_, _, lease))| async move {
                let answer = send(op, Resend::Repeatable, || {
                    let mut leases = self.client.lease_client();
                    async move { leases.time_to_live(lease, None).await }
                })
                .await?;
                let (left, granted) = (answer.ttl(), answer.granted_ttl());
                // Still live with less than a second left: it ends after now.
                let expires = if left > 0 {
                    now + chrono::TimeDelta::seconds(left)
                } else {
                    now + chrono::TimeDelta::microseconds(1)
                };
                let renewed = expires - chrono::TimeDelta::seconds(granted.max(left));
                Ok::<_, StoreError>((w, (renewed.min(now), expires)))
            });
        // One request per session, all at once: a snapshot waits for one round trip.
        Ok(futures_util::future::try_join_all(asked)
            .await?
            .into_iter()
            .collect())
    }

    /// The heartbeat: the rule run first on the groups' documents alone, and only if that
    /// cannot answer (a group changed, or the rule would write to a group) again on the whole
    /// groups. In lease mode, around the rule, the session's etcd lease is kept alive, or one
    /// is granted for a new (or taken over) session.
    ///
    /// Why the documents alone can answer: a group the rule answers unchanged (H8) is
    /// answered by its stamp, made of the document's change counter and the members'
    /// expiries and quarantine ends, never of its buckets; the stand-in buckets (see
    /// `take_group`) give ownership, loads and the drain as the pages would; and if the rule
    /// would change a group (H2, H3, the end of a drain), that group differs from what was
    /// read and the whole read is done instead. Node records are read whole either way.
    pub(super) async fn beat(
        &self,
        node: NodeId,
        incarnation: Incarnation,
        ttl: Ttl,
        metadata: &MemberMetadata,
        seen: &[GroupStamp],
    ) -> Result<Heartbeat, StoreError> {
        let op = Operation::Heartbeat;
        let scope = Scope::Node(node, seen);
        let process = (node, incarnation);
        for _ in 0..ATTEMPTS {
            let now = self.now();
            // A lease this process holds is kept alive while the read runs: one round trip.
            // Extending it early is what the renewal below would do; if the read shows the
            // session is not this process's to renew any more (handed over and taken over),
            // its lease was moved off and revoked, and the keep-alive finds nothing.
            let early = self.renewing_lease(process);
            let (loaded, kept) = match early {
                Some(held) => {
                    let (loaded, kept) =
                        tokio::join!(self.load(op, &scope, now, false), self.keep_alive(op, held));
                    // A lease that ran out may be refused with an error rather than a ttl of
                    // 0: then the renewal below asks again, if the read says to.
                    (loaded?, kept.ok().map(|kept| (held, kept)))
                }
                None => (self.load(op, &scope, now, false).await?, None),
            };
            let mine = loaded.state.nodes.get(&node).filter(|r| r.is_live(now));
            let lease = loaded.extras.get(&node).and_then(|e| e.lease);
            // Renewal: the lease must still be there when the keep-alive reaches the leader;
            // if it is not, the session is over (read again: a new one starts).
            if let (true, Some(row), Some(lease)) = (self.leases(), mine, lease)
                && row.incarnation == incarnation
                && !row.handed_over
            {
                let alive = match kept {
                    Some((held, alive)) if held == lease => alive,
                    _ => self.keep_alive(op, lease).await?,
                };
                if !alive {
                    // Expired between the read and the keep-alive.
                    self.forget_lease(process);
                    continue;
                }
                self.remember_lease(process, lease);
            }
            let mut state = loaded.state.clone();
            let mut result = state.heartbeat(now, node, incarnation, ttl, metadata, seen, None);
            let quiet = result.as_ref().is_ok_and(|b| b.groups.is_empty())
                && state.groups == loaded.state.groups
                && state.outbox.is_empty();
            let loaded = if quiet {
                loaded
            } else {
                let whole = self.load(op, &scope, now, true).await?;
                state = whole.state.clone();
                result = state.heartbeat(now, node, incarnation, ttl, metadata, seen, None);
                whole
            };
            let beat = match result {
                Ok(beat) => beat,
                // H7: say when the other process's session ends as etcd knows it.
                Err(StoreError::NodeIdInUse { worker, expires_at }) => {
                    // The refusal matters more than the exactness of its time.
                    let told = self
                        .lease_times(op, &loaded, now, |w| w == worker)
                        .await
                        .ok()
                        .and_then(|times| times.get(&worker).map(|t| t.1));
                    return Err(StoreError::NodeIdInUse {
                        worker,
                        expires_at: told.unwrap_or(expires_at),
                    });
                }
                Err(e) => return Err(e),
            };
            // What the lease must do is decided on the read the rule last ran on (a hand-over
            // may have landed between the two reads): a session this process takes over
            // (HO3) moves to a lease of its own ttl, off the predecessor's short one.
            let before = loaded.state.nodes.get(&node);
            let takes_over = !beat.new_session
                && before.is_some_and(|r| r.handed_over || r.incarnation != incarnation);
            let old_lease = loaded.extras.get(&node).and_then(|e| e.lease);
            let mut extras = loaded.extras.clone();
            let mut lives: LivePuts = Vec::new();
            let mut granted = None;
            if self.leases() && (beat.new_session || takes_over) {
                let grant = self.grant(op, ttl).await?;
                granted = Some(grant.id());
                let rev = loaded.lives.get(&node).map_or(0, |l| l.1);
                lives.push((node, beat.session, grant.id(), rev));
                extras.insert(
                    node,
                    NodeExtra {
                        lease: Some(grant.id()),
                        ttl: Some(ttl.as_micros()),
                    },
                );
            }
            let stored = self.store(op, &loaded, &state, &extras, &lives).await;
            match (stored, granted) {
                (Ok(true), _) => {
                    if let Some(new) = granted {
                        self.remember_lease(process, new);
                    }
                    // The old lease (a handed-over session's) is not needed any more; if this
                    // fails it runs out by itself.
                    if let (true, Some(old)) = (takes_over, old_lease) {
                        self.revoke(old).await;
                    }
                    return Ok(beat);
                }
                (outcome, Some(new)) => {
                    // Not written: the lease granted for it would keep nothing alive.
                    self.revoke(new).await;
                    outcome?;
                }
                (outcome, None) => {
                    outcome?;
                }
            }
        }
        Err(lost_races(op))
    }
}
