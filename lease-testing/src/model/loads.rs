//! The model's loads: claims of named buckets (C12, C13) and published loads (P1-P5), as
//! plain data manipulation (see the parent module).

use super::*;

impl Model {
    /// See [`WorkerStore::claim_buckets`](lease_core::WorkerStore::claim_buckets).
    pub fn claim_buckets(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        buckets: &[Bucket],
        takeover: Takeover,
        now: Timestamp,
    ) -> Result<Vec<Lease>, StoreError> {
        self.take(group, worker, session, Ok(buckets), takeover, now)
    }

    /// See [`WorkerStore::publish_loads`](lease_core::WorkerStore::publish_loads).
    pub fn publish_loads(
        &mut self,
        group: &GroupName,
        worker: NodeId,
        session: SessionId,
        loads: &[(Bucket, Load)],
        now: Timestamp,
    ) -> Result<u32, StoreError> {
        let now = store_precision(now);
        let nodes = &self.nodes;
        let g = self
            .groups
            .get_mut(group)
            .ok_or_else(|| StoreError::GroupNotFound {
                group: group.clone(),
            })?;
        // P2: out of range fails first.
        if let Some(&(bucket, _)) = loads.iter().find(|(b, _)| !g.shards.contains(*b)) {
            return Err(StoreError::BucketOutOfRange {
                group: group.clone(),
                bucket,
                shard_count: g.shards,
            });
        }
        // P1.
        if g.live_as(nodes, worker, session, now).is_none() {
            return Err(StoreError::SessionExpired {
                group: group.clone(),
                worker,
            });
        }
        // P2: the buckets it owns live get the load listed last for them.
        let mine = g.owned_by(nodes, worker, now);
        let last: std::collections::BTreeMap<Bucket, Load> = loads.iter().copied().collect();
        let mut recorded = 0;
        for (bucket, load) in last {
            if mine.contains(&bucket) {
                g.buckets[bucket.0 as usize].load = load;
                recorded += 1;
            }
        }
        // P3: the work of what it owns now.
        let of_mine = || mine.iter().map(|b| g.buckets[b.0 as usize].load);
        let total = of_mine().map(Load::micros).sum::<u64>();
        let hottest = of_mine().max().unwrap_or(Load::ZERO);
        g.work.insert(worker, (total, hottest));
        Ok(recorded)
    }
}
