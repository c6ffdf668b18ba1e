//! One run of a scenario: the failover and what it cost.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lease::store::{Clock, SystemClock, Timestamp};
use lease::testing::{OwnershipLog, coverage};
use lease::{OwnershipEvent, ShardCount};
use lease_testdb::{Cluster, Replication};

use crate::fleet::{BUCKETS, DB, Fleet, Timing, primary_and_standby};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Asynchronous; the primary stopped cleanly (`pg_ctl stop -m fast`) in steady state.
    Switchover,
    /// Synchronous; the primary killed (`pg_ctl stop -m immediate`) in steady state.
    SyncSteady,
    /// Synchronous; a fourth worker joins, and the primary is killed at the first shed.
    SyncJoin,
    /// Asynchronous; replication cut, a fourth worker takes its share on the primary alone,
    /// then the primary is killed.
    AsyncLost,
}

impl Scenario {
    pub const ALL: [Self; 4] = [
        Self::Switchover,
        Self::SyncSteady,
        Self::SyncJoin,
        Self::AsyncLost,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Switchover => "switchover",
            Self::SyncSteady => "sync kill, steady",
            Self::SyncJoin => "sync kill during joins",
            Self::AsyncLost => "async, writes lost",
        }
    }

    fn replication(self) -> Replication {
        match self {
            Self::SyncSteady | Self::SyncJoin => Replication::Synchronous,
            Self::Switchover | Self::AsyncLost => Replication::Asynchronous,
        }
    }
}

/// One run's figures. Moves and unowned time are counted from the stop (or kill) of the
/// primary to the settling.
pub struct Run {
    /// From the stop (or kill) of the primary until `pg_ctl promote -w` returned.
    pub to_promoted: Duration,
    /// From the promotion to settled.
    pub settled: Duration,
    /// Bucket-seconds without a holder in the applications' ownership log.
    pub unowned: f64,
    pub assigned: usize,
    /// Revocations, by reason.
    pub revoked: BTreeMap<&'static str, usize>,
    /// `lease.nodes.crossed` of every node row on the new primary ("none" for NULL), by
    /// worker in the order they started (`w4` joined last).
    pub crossed: Vec<(String, String)>,
    /// Overlaps in the whole log (there must be none).
    pub overlaps: usize,
    /// The log's own check (tokens rising from holder to holder), if it failed.
    pub check: Option<String>,
}

pub async fn run(scenario: Scenario, timing: Timing) -> Run {
    let (primary, standby) = primary_and_standby(scenario.replication()).await;
    let url = Cluster::multi_host_url(
        &[&primary, &standby],
        "postgres",
        DB,
        "target_session_attrs=read-write",
    );
    let mut fleet = Fleet::new(url, timing);
    for _ in 0..3 {
        fleet.start().await;
    }
    let setup_limit = timing.ttl + timing.renew + Duration::from_secs(20);
    fleet
        .until_settled_on(&primary, SystemClock.now(), Instant::now(), setup_limit)
        .await;
    fleet.renewed_after_standby_start(&primary, &standby).await;
    let wait_limit = 2 * timing.renew + Duration::from_secs(5);
    let waiting = Instant::now();
    match scenario {
        Scenario::Switchover | Scenario::SyncSteady => {}
        Scenario::SyncJoin => {
            // The moment the first of the others is told to shed a bucket for the joiner:
            // revocations, releases and the joiner's claims are under way.
            let joined = SystemClock.now();
            fleet.start().await;
            while !fleet.shed_since(joined) {
                assert!(waiting.elapsed() < wait_limit, "nobody shed for the joiner");
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
        Scenario::AsyncLost => {
            tokio::task::block_in_place(|| standby.cut_replication()).expect("cutting replication");
            fleet.start().await;
            while fleet.last_holds() < (BUCKETS / 4) as usize {
                assert!(
                    waiting.elapsed() < wait_limit,
                    "the joiner never got its share"
                );
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    let stop = match scenario {
        Scenario::Switchover => Cluster::stop,
        _ => Cluster::kill,
    };
    let (stopped, stopped_wall) = (Instant::now(), SystemClock.now());
    tokio::task::block_in_place(|| {
        stop(&primary).expect("stopping the primary");
        standby.promote().expect("promoting the standby");
    });
    let (promoted, promoted_wall) = (Instant::now(), SystemClock.now());
    let to_promoted = promoted - stopped;
    // Kept sessions renew within a renew interval; ended ones wait out the quiet period of
    // one ttl, then claim on their next tick.
    let bound = timing.ttl + timing.renew + Duration::from_secs(5);
    let settled = fleet
        .until_settled_on(&standby, promoted_wall, promoted, bound)
        .await;
    let settled_wall = SystemClock.now();
    let ids = fleet.ids();
    let mut crossed: Vec<(String, String)> = standby
        .psql_in(
            DB,
            "SELECT node_id, COALESCE(crossed, 'none') FROM lease.nodes",
        )
        .expect("reading the node rows")
        .lines()
        .map(|row| {
            let (node, how) = row.split_once('|').expect("two columns");
            let who = ids.iter().position(|id| id.to_string() == node);
            (
                who.map_or(format!("node {node}"), |i| format!("w{}", i + 1)),
                how.to_owned(),
            )
        })
        .collect();
    crossed.sort();
    let log = fleet.shutdown().await;
    let (assigned, revoked) = moves(&log, stopped_wall, settled_wall);
    Run {
        to_promoted,
        settled,
        unowned: coverage::unowned(
            &log,
            ShardCount::new(BUCKETS).expect("n"),
            stopped_wall,
            settled_wall,
        )
        .expect("a well-formed log")
        .values()
        .map(Duration::as_secs_f64)
        .sum(),
        assigned,
        revoked,
        crossed,
        overlaps: coverage::overlaps(&log, SystemClock.now())
            .expect("a well-formed log")
            .len(),
        check: log.check().err(),
    }
}

/// Assignments, and revocations by reason, in the log between `from` and `until`.
fn moves(
    log: &OwnershipLog<Timestamp>,
    from: Timestamp,
    until: Timestamp,
) -> (usize, BTreeMap<&'static str, usize>) {
    let mut assigned = 0;
    let mut revoked = BTreeMap::new();
    for e in log
        .entries()
        .iter()
        .filter(|e| e.at >= from && e.at <= until)
    {
        match e.event {
            OwnershipEvent::Assigned(_) => assigned += 1,
            OwnershipEvent::Revoked { reason, .. } => {
                *revoked.entry(reason.as_str()).or_default() += 1;
            }
        }
    }
    (assigned, revoked)
}
