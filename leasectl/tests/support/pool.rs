//! A pool of `leasectl worker --json` processes on one group, judged from their event streams
//! and from the store.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use lease::GroupName;
use lease::audit::OwnershipLog;
use lease::postgres::PgLeaseStore;
use lease::store::{AdminStore, BucketState, GroupSnapshot};

use super::{Event, WorkerProcess, record, wait_for};

/// How long any one phase may take.
pub const LONG: Duration = Duration::from_secs(30);

/// Workers of one group, running or gone, and a store to look at it.
pub struct Pool {
    pub url: String,
    pub store: PgLeaseStore,
    pub group: GroupName,
    pub shards: u32,
    pub running: BTreeMap<String, WorkerProcess>,
    pub gone: Vec<WorkerProcess>,
}

impl Pool {
    /// An empty pool of `group` (`shards` buckets) on `url`.
    pub fn new(url: &str, group: &str, shards: u32) -> Self {
        let store = PgLeaseStore::builder(url.to_owned())
            .max_connections(2)
            .timeout(Duration::from_secs(2))
            .build()
            .expect("store");
        Self {
            url: url.to_owned(),
            store,
            group: GroupName::new(group).expect("name"),
            shards,
            running: BTreeMap::new(),
            gone: Vec::new(),
        }
    }

    /// Start worker `name` (ttl 3 s, renew 1 s).
    pub fn start(&mut self, name: &str) {
        self.start_with_shards(name, self.shards);
    }

    /// Start worker `name` configured with `shards` buckets (another count than the group's
    /// after a resize).
    pub fn start_with_shards(&mut self, name: &str, shards: u32) {
        let w = WorkerProcess::spawn(name, &self.url, self.group.as_str(), shards, "3s", "1s");
        self.running.insert(name.to_owned(), w);
    }

    /// The running workers' applications own every bucket, once each, evenly.
    pub fn balanced(&self) -> bool {
        let mut seen = BTreeSet::new();
        let mut loads = Vec::new();
        for w in self.running.values() {
            let owned = w.owned();
            loads.push(owned.len());
            for b in owned.keys() {
                if !seen.insert(*b) {
                    return false;
                }
            }
        }
        let spread = loads
            .iter()
            .max()
            .zip(loads.iter().min())
            .map(|(a, b)| a - b);
        seen.len() == self.shards as usize && spread.is_some_and(|s| s <= 1)
    }

    /// Wait until every running worker's session was renewed after `t` (the store's record of
    /// its last heartbeat), so a disruption at `t` was really lived through.
    pub async fn until_renewed_after(&self, t: DateTime<Utc>, what: &str) -> Duration {
        let ids: BTreeSet<_> = self
            .running
            .values()
            .filter_map(WorkerProcess::worker)
            .collect();
        let start = Instant::now();
        loop {
            let snap = self.snapshot().await;
            let renewed = snap
                .members
                .iter()
                .filter(|m| ids.contains(&m.worker) && m.live && m.heartbeat_at > t)
                .count();
            if renewed == ids.len() {
                return start.elapsed();
            }
            assert!(start.elapsed() < LONG, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn until_balanced(&self, what: &str) -> Duration {
        wait_for(what, LONG, || self.balanced())
    }

    pub async fn snapshot(&self) -> GroupSnapshot {
        // The server may be restarting: retry for a while.
        for _ in 0..300 {
            if let Ok(s) = self.store.snapshot(&self.group).await {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no snapshot within 30 s");
    }

    /// Every assignment, after `since`, of one of `buckets` by a worker other than `name`.
    pub fn reassignments(
        &self,
        name: &str,
        buckets: &BTreeSet<u32>,
        since: DateTime<Utc>,
    ) -> Vec<Event> {
        self.running
            .iter()
            .filter(|(n, _)| n.as_str() != name)
            .flat_map(|(_, w)| w.events())
            .filter(|e| e.event == "assigned" && e.at >= since)
            .filter(|e| e.bucket.is_some_and(|b| buckets.contains(&b)))
            .collect()
    }

    /// What the store records of each of `buckets` now: its owner, token, and the server's time
    /// of its last change (`updated_at`, which a claim sets to the server's clock of the claim).
    pub async fn bucket_rows(&self, buckets: &BTreeSet<u32>) -> BTreeMap<u32, BucketRow> {
        let mut conn = AsyncPgConnection::establish(&self.url)
            .await
            .expect("a connection");
        let wanted: Vec<i32> = buckets.iter().map(|&b| b as i32).collect();
        diesel::sql_query(
            "SELECT bucket, owner_node AS owner_worker, token, updated_at FROM lease.shards \
             WHERE group_name = $1 AND bucket = ANY($2)",
        )
        .bind::<Text, _>(self.group.as_str())
        .bind::<diesel::sql_types::Array<Integer>, _>(wanted)
        .load::<BucketRow>(&mut conn)
        .await
        .expect("the bucket rows")
        .into_iter()
        .map(|r| (r.bucket as u32, r))
        .collect()
    }

    /// The store agrees with the running workers: every bucket live, owned by a running
    /// worker, evenly, with the tokens the workers were told.
    pub async fn check_store(&self) {
        let snap = self.snapshot().await;
        let running_ids: BTreeSet<_> = self
            .running
            .values()
            .filter_map(WorkerProcess::worker)
            .collect();
        for b in &snap.buckets {
            assert_eq!(
                b.state,
                BucketState::Live,
                "bucket {} is not owned at the end",
                b.bucket
            );
            assert!(b.owner.is_some_and(|o| running_ids.contains(&o)));
        }
        let loads: Vec<u32> = snap.live_members().iter().map(|m| m.owned).collect();
        assert_eq!(loads.len(), self.running.len());
        assert!(
            loads
                .iter()
                .max()
                .zip(loads.iter().min())
                .is_some_and(|(a, b)| a - b <= 1)
        );
        for w in self.running.values() {
            let id = w.worker().expect("started");
            let store_view: BTreeMap<u32, i64> = snap
                .buckets
                .iter()
                .filter(|b| b.owner == Some(id))
                .map(|b| (b.bucket.get(), b.token.get()))
                .collect();
            assert_eq!(w.owned(), store_view, "{} and the store disagree", w.name);
        }
    }

    /// Every worker's events, running or gone, merged into one log (each under its worker
    /// id), after `adjust` may re-date those of one worker; malformed lines fail the test.
    pub fn merged_log(
        &self,
        mut adjust: impl FnMut(&WorkerProcess, &mut Vec<Event>),
    ) -> OwnershipLog<DateTime<Utc>> {
        let mut log = OwnershipLog::new();
        let mut bad = Vec::new();
        for w in self.running.values().chain(self.gone.iter()) {
            bad.extend(w.bad_lines());
            let mut events = w.events();
            adjust(w, &mut events);
            record(&mut log, w.worker().expect("started"), &events);
        }
        assert!(bad.is_empty(), "malformed JSON lines: {bad:?}");
        log
    }

    /// How many `error` events every worker reported.
    pub fn error_events(&self) -> usize {
        self.running
            .values()
            .chain(self.gone.iter())
            .map(|w| w.events().iter().filter(|e| e.event == "error").count())
            .sum()
    }

    /// SIGTERM every running worker; each must exit 0.
    pub fn stop_all(&mut self) {
        for w in self.running.values_mut() {
            w.signal("TERM");
            assert!(w.wait(LONG).success(), "{} did not stop cleanly", w.name);
        }
    }
}

/// A row of `lease.shards`, as [`Pool::bucket_rows`] reads it.
#[derive(QueryableByName, Debug, Clone)]
pub struct BucketRow {
    #[diesel(sql_type = Integer)]
    pub bucket: i32,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub owner_worker: Option<uuid::Uuid>,
    #[diesel(sql_type = BigInt)]
    pub token: i64,
    #[diesel(sql_type = Timestamptz)]
    pub updated_at: DateTime<Utc>,
}
