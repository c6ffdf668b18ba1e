//! Tick cost on Postgres: our steady-state tick against the seed's statements, on one server,
//! in one run, through the same client (diesel-async) and the same kind of pool.
//!
//! For each shape (100 groups x 64 buckets, 10 groups x 1,024 buckets; 8 workers per group
//! owning an equal share, ttl 1 h so nothing expires) and each client count (16, 64), every
//! client loops for a fixed time picking a random `(group, worker)` and running one tick:
//!
//! - **ours**: `PgLeaseStore::heartbeat` of the member's node (a node in one group, as
//!   `LeaseWorker` runs it), handing in the stamp of the view it last got, then `policy::plan`
//!   on that view. In steady state the store answers "unchanged" (H8: nothing joined, left,
//!   claimed, released or expired in the group) and the plan is empty (checked on each
//!   client's first ticks and counted on all), so that is the whole tick: one statement, one
//!   round trip, one row written.
//! - **bare UPDATE** and **SELECT 1**: the physical limits of the same client, pool and server:
//!   a prepared one-row `UPDATE` of the node's row (what a heartbeat must write at least) and
//!   a prepared `SELECT 1` (one round trip that does nothing). The tables print ours against
//!   the bare `UPDATE` on every run.
//! - **seed renew**: the seed's `renewLeaseStmt` alone (`UPDATE ... WHERE owner = $4
//!   RETURNING bucket`): the least a heartbeat can cost on the seed's schema.
//! - **seed pass**: the seed's pass as its pgbench script runs it: the ownership snapshot
//!   (`listShardOwnershipStmt`), then `BEGIN`, renew, claim-one (`claimShardsStmt`, `LIMIT 1`),
//!   `COMMIT`.
//! - **seed pass, no claim**: the pass as `acquireOwnedBuckets` runs it in steady state: it
//!   skips the claim when the worker already holds `ceil(N / live)` (`BEGIN`, renew,
//!   `COMMIT`). Not a target; shown because it is the cheaper pass.
//!
//! The seed's table is created in the same database from `benches/seed/seed_schema.sql` (a copy
//! of the seed's own script); its statements are the texts of `Schema.hs` with binds, prepared
//! once per connection like ours. The kinds of tick alternate in rounds so that drift on a shared
//! machine hits them alike, and each round starts at another kind (round `r` at kind
//! `r mod 6`, `r` counted over the whole invocation), so no kind always runs right after the
//! pool sat idle or right after the others heated the server. The claim is the ratio within
//! one run; one invocation makes `LEASE_BENCH_RUNS` complete runs and ends with the median and
//! the minimum of each ratio the engine has a target for (BENCHMARKS.md, "Targets: met or
//! missed"), the verdict taken on the median.
//!
//! Then, per run: rows written per tick (exact, by `xmin`, and as `pg_stat_user_tables`
//! counts), WAL written per tick (the records between the insert positions before and after,
//! read back with pg_walinspect, and the distance between the positions), and the scale check: heartbeat latency in one
//! group of 10,000 buckets and 500 members.
//!
//! Server: lease-testdb's throwaway cluster (fsync off; `LEASE_TESTDB_DURABLE=1` for a durable
//! one), or the server `DATABASE_URL` names. Knobs: `LEASE_BENCH_SECS` (measured seconds per
//! kind of tick per shape and client count, default 12), `LEASE_BENCH_ROUNDS` (default 3),
//! `LEASE_BENCH_RUNS` (complete runs, default 3).
//!
//! Run: `cargo bench --bench pg_tick` and `LEASE_TESTDB_DURABLE=1 cargo bench --bench pg_tick`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::pg::Pg;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease::postgres::{PgLeaseStore, ops};
use lease::store::{GroupBeat, GroupStamp, Incarnation, Takeover, WorkerStore};
use lease::{GroupName, MemberMetadata, NodeId, ShardCount, Ttl, policy};
use uuid::Uuid;

/// The seed's schema and its 100 x 64 population, as the seed's own script creates them.
const SEED_SCHEMA: &str = include_str!("seed/seed_schema.sql");

/// `renewLeaseStmt` of `Schema.hs`: `$1` name, `$2` now, `$3` now + ttl, `$4` worker.
const SEED_RENEW: &str = "
    UPDATE keiro.keiro_subscription_shards
    SET lease_expires_at = $3,
        heartbeat_at = $2,
        updated_at = $2
    WHERE subscription_name = $1
      AND owner_worker_id = $4
    RETURNING bucket
    ";

/// `claimShardsStmt` of `Schema.hs`: `$1` name, `$2` now, `$3` now + ttl, `$4` worker,
/// `$5` how many (the pass claims one).
const SEED_CLAIM: &str = "
    WITH claimable AS (
      SELECT bucket
      FROM keiro.keiro_subscription_shards
      WHERE subscription_name = $1
        AND (owner_worker_id IS NULL OR lease_expires_at < $2)
      ORDER BY bucket
      LIMIT $5
      FOR UPDATE SKIP LOCKED
    )
    UPDATE keiro.keiro_subscription_shards s
    SET owner_worker_id = $4,
        lease_expires_at = $3,
        heartbeat_at = $2,
        updated_at = $2
    FROM claimable c
    WHERE s.subscription_name = $1 AND s.bucket = c.bucket
    RETURNING s.bucket
    ";

/// `listShardOwnershipStmt` of `Schema.hs`: the pass's snapshot. `$1` name.
const SEED_SNAPSHOT: &str = "
    SELECT bucket, owner_worker_id, lease_expires_at
    FROM keiro.keiro_subscription_shards
    WHERE subscription_name = $1
    ORDER BY bucket
    ";

/// The bare one-row `UPDATE` of a node's row: the least a heartbeat writes. `$1` node,
/// `$2` ttl in microseconds.
const BARE_UPDATE: &str = "
    UPDATE lease.nodes
    SET heartbeat_at = pg_catalog.clock_timestamp(),
        expires_at = pg_catalog.clock_timestamp() + $2 * interval '1 microsecond'
    WHERE node_id = $1
    ";

/// One round trip that does nothing.
const SELECT_ONE: &str = "SELECT 1::bigint AS n";

/// Workers per group in every shape.
const WORKERS_PER_GROUP: u32 = 8;
/// Client counts (concurrent workers ticking).
const CLIENTS: [usize; 2] = [16, 64];
/// Unmeasured time at the start of each measurement (connections open, statements prepare).
const WARM_UP: Duration = Duration::from_millis(500);

/// A query whose SQL text never changes: let diesel-async cache its prepared statement, as
/// lease-diesel does for ours (diesel treats every `sql_query` as uncacheable otherwise).
#[derive(Debug, Clone)]
struct Prepared<Q>(Q);

impl<Q: QueryFragment<Pg>> QueryFragment<Pg> for Prepared<Q> {
    fn walk_ast<'b>(&'b self, pass: AstPass<'_, 'b, Pg>) -> diesel::QueryResult<()> {
        self.0.walk_ast(pass)
    }

    fn is_safe_to_cache_prepared(&self, _backend: &Pg) -> diesel::QueryResult<bool> {
        Ok(true)
    }
}

impl<Q> QueryId for Prepared<Q> {
    type QueryId = ();
    // Keyed by SQL text and bind types in the statement cache.
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<Q: Query> Query for Prepared<Q> {
    type SqlType = Q::SqlType;
}

#[derive(QueryableByName, Debug)]
struct BucketRow {
    #[diesel(sql_type = Integer)]
    #[allow(dead_code)] // decoded as the seed decodes it; only the count is used here
    bucket: i32,
}

#[derive(QueryableByName, Debug)]
struct OwnershipRow {
    #[diesel(sql_type = Integer)]
    #[allow(dead_code)] // decoded as the seed decodes it
    bucket: i32,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    owner_worker_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    lease_expires_at: Option<DateTime<Utc>>,
}

#[derive(QueryableByName, Debug)]
struct Scalar {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName, Debug)]
struct Setting {
    #[diesel(sql_type = Text)]
    value: String,
}

#[derive(QueryableByName, Debug, Default, Clone, Copy)]
struct TableStats {
    #[diesel(sql_type = BigInt)]
    ins: i64,
    #[diesel(sql_type = BigInt)]
    upd: i64,
    #[diesel(sql_type = BigInt)]
    hot: i64,
    #[diesel(sql_type = BigInt)]
    del: i64,
}

/// A small, fast PRNG (xorshift64*): each client draws its own `(group, worker)` sequence.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

/// The kinds of tick measured.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Ours,
    SeedRenew,
    SeedPass,
    SeedPassNoClaim,
    BareUpdate,
    SelectOne,
}

impl Kind {
    const ALL: [Kind; 6] = [
        Kind::Ours,
        Kind::SeedRenew,
        Kind::SeedPass,
        Kind::SeedPassNoClaim,
        Kind::BareUpdate,
        Kind::SelectOne,
    ];

    fn label(self) -> &'static str {
        match self {
            Kind::Ours => "ours: heartbeat + plan (1 statement)",
            Kind::BareUpdate => "limit: bare one-row UPDATE of the node row (1 statement)",
            Kind::SelectOne => "limit: SELECT 1 (1 statement)",
            Kind::SeedRenew => "seed: bare renew UPDATE (1 statement)",
            Kind::SeedPass => "seed: pass (snapshot; BEGIN; renew; claim one; COMMIT)",
            Kind::SeedPassNoClaim => "seed: pass at target (snapshot; BEGIN; renew; COMMIT)",
        }
    }
}

/// One shape of the pool: `groups` groups of `buckets` buckets, 8 workers each.
#[derive(Clone, Copy, Debug)]
struct Shape {
    groups: u32,
    buckets: u32,
}

/// Everything the clients share for one shape.
struct Bench {
    store: PgLeaseStore,
    ttl: Ttl,
    /// Seed lease length: as long as ours, so nothing expires during the run.
    seed_ttl: chrono::Duration,
    share: usize,
    /// Ours: every member, a node in one group.
    ours: Vec<Member>,
    /// Seed: `(subscription name, owner)` of every owner.
    seed: Vec<(String, Uuid)>,
    /// Ticks whose plan was not empty (must stay 0 in steady state).
    busy_plans: AtomicU64,
}

/// One of our members: a node in one group, with the group's view as it last got it.
struct Member {
    group: GroupName,
    node: NodeId,
    /// The last view given; an "unchanged" answer leaves it as it is. Locked only between
    /// awaits (a client ticks its own members only).
    last: Mutex<GroupBeat>,
}

impl Member {
    fn seen(&self) -> Vec<GroupStamp> {
        let last = self.last.lock().expect("a member's view");
        vec![GroupStamp {
            group: self.group.clone(),
            stamp: last.stamp,
        }]
    }

    /// Takes a heartbeat's answer for the group: the new view, or the stamp alone when
    /// unchanged. Returns whether the view was given.
    fn take(&self, beat: lease::store::Heartbeat) -> bool {
        let mut last = self.last.lock().expect("a member's view");
        if let Some(given) = beat.groups.into_iter().find(|g| g.group == self.group) {
            *last = given;
            return true;
        }
        let stamp = beat
            .unchanged
            .iter()
            .find(|g| g.group == self.group)
            .expect("the group answered, as a view or unchanged");
        last.stamp = stamp.stamp;
        false
    }
}

/// Our heartbeat of `node` on a connection, handing in `seen` (none: every view given).
async fn node_beat(
    conn: &mut AsyncPgConnection,
    node: NodeId,
    ttl: Ttl,
    seen: &[GroupStamp],
) -> lease::store::Heartbeat {
    ops::heartbeat(
        conn,
        None,
        node,
        Incarnation::from_uuid(node.as_uuid()),
        ttl,
        &MemberMetadata::empty(),
        seen,
    )
    .await
    .expect("heartbeat")
}

/// The bare one-row `UPDATE` of `node`'s row.
async fn bare_update(conn: &mut AsyncPgConnection, node: NodeId, ttl: Ttl) -> usize {
    Prepared(
        diesel::sql_query(BARE_UPDATE)
            .bind::<SqlUuid, _>(node.as_uuid())
            .bind::<BigInt, _>(ttl.as_micros()),
    )
    .execute(conn)
    .await
    .expect("bare update")
}

/// `SELECT 1`, prepared.
async fn select_one(conn: &mut AsyncPgConnection) -> i64 {
    Prepared(diesel::sql_query(SELECT_ONE))
        .get_result::<Scalar>(conn)
        .await
        .expect("select 1")
        .n
}

/// The seed's renew on a connection; returns the buckets renewed.
async fn seed_renew(
    conn: &mut AsyncPgConnection,
    name: &str,
    owner: Uuid,
    ttl: chrono::Duration,
) -> diesel::QueryResult<usize> {
    let now = Utc::now();
    let rows: Vec<BucketRow> = Prepared(
        diesel::sql_query(SEED_RENEW)
            .bind::<Text, _>(name)
            .bind::<Timestamptz, _>(now)
            .bind::<Timestamptz, _>(now + ttl)
            .bind::<SqlUuid, _>(owner),
    )
    .load(conn)
    .await?;
    Ok(rows.len())
}

/// The seed's pass on a connection; `always_claim` as the pgbench script does, otherwise
/// only below `ceil(N / live)` as `acquireOwnedBuckets` does. Returns `(held, claimed)`.
async fn seed_pass(
    conn: &mut AsyncPgConnection,
    name: &str,
    owner: Uuid,
    ttl: chrono::Duration,
    always_claim: bool,
) -> diesel::QueryResult<(usize, usize)> {
    let now = Utc::now();
    let snapshot: Vec<OwnershipRow> =
        Prepared(diesel::sql_query(SEED_SNAPSHOT).bind::<Text, _>(name))
            .load(conn)
            .await?;
    // The worker's estimate of the live pool: distinct owners with a live lease, plus self.
    let mut live: Vec<Uuid> = snapshot
        .iter()
        .filter(|r| r.lease_expires_at.is_some_and(|e| e > now))
        .filter_map(|r| r.owner_worker_id)
        .chain([owner])
        .collect();
    live.sort_unstable();
    live.dedup();
    let target = snapshot.len().div_ceil(live.len());
    conn.transaction::<_, diesel::result::Error, _>(async |c| {
        let held: Vec<BucketRow> = Prepared(
            diesel::sql_query(SEED_RENEW)
                .bind::<Text, _>(name)
                .bind::<Timestamptz, _>(now)
                .bind::<Timestamptz, _>(now + ttl)
                .bind::<SqlUuid, _>(owner),
        )
        .load(c)
        .await?;
        let mut claimed = 0;
        if always_claim || held.len() < target {
            let won: Vec<BucketRow> = Prepared(
                diesel::sql_query(SEED_CLAIM)
                    .bind::<Text, _>(name)
                    .bind::<Timestamptz, _>(now)
                    .bind::<Timestamptz, _>(now + ttl)
                    .bind::<SqlUuid, _>(owner)
                    .bind::<Integer, _>(1),
            )
            .load(c)
            .await?;
            claimed = won.len();
        }
        Ok((held.len(), claimed))
    })
    .await
}

impl Bench {
    /// One tick of `kind` for member `i`; `check` asserts the steady state on it.
    async fn tick(&self, kind: Kind, i: usize, check: bool) {
        match kind {
            Kind::Ours => {
                let member = &self.ours[i];
                let beat = self
                    .store
                    .heartbeat(
                        member.node,
                        Incarnation::from_uuid(member.node.as_uuid()),
                        self.ttl,
                        &MemberMetadata::empty(),
                        &member.seen(),
                    )
                    .await
                    .expect("heartbeat");
                let new_session = beat.new_session;
                let given = member.take(beat);
                let (plan, held) = {
                    let last = member.last.lock().expect("a member's view");
                    let plan = policy::plan(&last.view, member.node, &last.owned_buckets());
                    (plan, last.owned.len())
                };
                if given || plan.claim != 0 || !plan.shed.is_empty() {
                    self.busy_plans.fetch_add(1, Ordering::Relaxed);
                }
                if check {
                    assert!(!new_session, "a steady tick started a session");
                    assert!(!given, "a steady tick was answered with a view");
                    assert_eq!(held, self.share, "buckets held");
                    assert_eq!(plan.claim, 0, "steady state claims nothing");
                    assert!(plan.shed.is_empty(), "steady state sheds nothing");
                }
            }
            Kind::BareUpdate => {
                let node = self.ours[i].node;
                let mut conn = self.store.pool().get().await.expect("a pooled connection");
                let rows = bare_update(&mut conn, node, self.ttl).await;
                if check {
                    assert_eq!(rows, 1, "one node row updated");
                }
            }
            Kind::SelectOne => {
                let mut conn = self.store.pool().get().await.expect("a pooled connection");
                let one = select_one(&mut conn).await;
                if check {
                    assert_eq!(one, 1, "select 1");
                }
            }
            Kind::SeedRenew => {
                let (name, owner) = &self.seed[i];
                let mut conn = self.store.pool().get().await.expect("a pooled connection");
                let held = seed_renew(&mut conn, name, *owner, self.seed_ttl)
                    .await
                    .expect("seed renew");
                if check {
                    assert_eq!(held, self.share, "seed buckets renewed");
                }
            }
            Kind::SeedPass | Kind::SeedPassNoClaim => {
                let (name, owner) = &self.seed[i];
                let mut conn = self.store.pool().get().await.expect("a pooled connection");
                let (held, claimed) = seed_pass(
                    &mut conn,
                    name,
                    *owner,
                    self.seed_ttl,
                    kind == Kind::SeedPass,
                )
                .await
                .expect("seed pass");
                if check {
                    assert_eq!((held, claimed), (self.share, 0), "seed steady pass");
                }
            }
        }
    }
}

/// What one kind of tick measured, over all rounds.
#[derive(Default)]
struct Sample {
    ticks: u64,
    elapsed: Duration,
    /// Latencies in microseconds.
    latencies: Vec<u32>,
    /// This process's CPU time (the client's), and every tick it covers, warm-up included.
    client_cpu: Duration,
    all_ticks: u64,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.ticks as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn client_cpu_us(&self) -> f64 {
        self.client_cpu.as_secs_f64() * 1e6 / self.all_ticks.max(1) as f64
    }

    fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        self.latencies.sort_unstable();
        let i = ((self.latencies.len() as f64 * p).ceil() as usize).clamp(1, self.latencies.len());
        f64::from(self.latencies[i - 1]) / 1000.0
    }
}

/// Run `kind` with `clients` concurrent clients for `measure` after a warm-up; add to `sample`.
async fn measure(
    bench: &Arc<Bench>,
    kind: Kind,
    clients: usize,
    measure: Duration,
    seed: u64,
    sample: &mut Sample,
) {
    let members = bench.ours.len();
    assert!(clients <= members, "more clients than members");
    let cpu_before = process_cpu();
    let start = Instant::now();
    let (from, until) = (start + WARM_UP, start + WARM_UP + measure);
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let bench = bench.clone();
            tokio::spawn(async move {
                let mut rng = Rng::new(seed * 1_000 + c as u64 + 1);
                let mut latencies = Vec::new();
                let mut n = 0u64;
                loop {
                    let t0 = Instant::now();
                    if t0 >= until {
                        break;
                    }
                    // Each client ticks its own members only: a worker never runs two ticks
                    // at once (two concurrent seed renews of one owner can deadlock).
                    let pick = c + clients * rng.below((members - c).div_ceil(clients));
                    // Check the steady state on each client's first ticks of every run.
                    bench.tick(kind, pick, n < 3).await;
                    n += 1;
                    if t0 >= from {
                        latencies.push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
                    }
                }
                (latencies, n)
            })
        })
        .collect();
    for task in tasks {
        let (latencies, n) = task.await.expect("a client task");
        sample.ticks += latencies.len() as u64;
        sample.all_ticks += n;
        sample.latencies.extend(latencies);
    }
    sample.client_cpu += process_cpu().saturating_sub(cpu_before);
    // Ticks counted are those started in the window; the window is `measure` long.
    sample.elapsed += measure;
}

/// CPU time (user + system) this process has used: the client side of every tick.
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at field 3, `state`;
    // `utime` and `stime` are fields 14 and 15, in clock ticks of 1/100 s on Linux.
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .unwrap_or_default()
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

async fn scalar(conn: &mut AsyncPgConnection, sql: &str) -> i64 {
    diesel::sql_query(sql)
        .get_result::<Scalar>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

async fn setting(conn: &mut AsyncPgConnection, sql: &str) -> String {
    diesel::sql_query(sql)
        .get_result::<Setting>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .value
}

/// Create both sides' state for `shape` in a fresh database.
async fn setup(shape: Shape, pool_size: usize) -> (Arc<Bench>, AsyncPgConnection) {
    let db = lease_testdb::database().await;
    let mut admin = AsyncPgConnection::establish(&db.url)
        .await
        .expect("an admin connection");
    let store = PgLeaseStore::builder(db.url.clone())
        .max_connections(pool_size)
        .build()
        .expect("a store");
    let ttl = Ttl::from_secs(3_600).expect("ttl");
    let share = shape.buckets / WORKERS_PER_GROUP;
    let shards = ShardCount::new(shape.buckets).expect("shard count");
    let mut joined = Vec::new();
    for g in 1..=shape.groups {
        let group = GroupName::new(format!("sub-{g}")).expect("group name");
        store.ensure_group(&group, shards).await.expect("ensure");
        for _ in 0..WORKERS_PER_GROUP {
            let node = NodeId::new();
            let session = node_beat(&mut admin, node, ttl, &[]).await.session;
            store.join(&group, node, session).await.expect("join");
            let won = store
                .claim(&group, node, session, share, Takeover::Allowed)
                .await
                .expect("claim");
            assert_eq!(won.len() as u32, share, "setup claim");
            joined.push((group.clone(), node));
        }
    }
    // Every member's view once everybody has joined and claimed: from here on, nothing
    // changes in any group and every heartbeat can be answered "unchanged".
    let mut ours = Vec::new();
    for (group, node) in joined {
        let beat = node_beat(&mut admin, node, ttl, &[]).await;
        let last = beat
            .group(&group)
            .cloned()
            .expect("a full view of the member's group");
        assert_eq!(last.owned.len() as u32, share, "buckets held after set-up");
        ours.push(Member {
            group,
            node,
            last: Mutex::new(last),
        });
    }

    admin
        .batch_execute(SEED_SCHEMA)
        .await
        .expect("the seed's schema");
    if (shape.groups, shape.buckets) != (100, 64) {
        // The seed's script populates 100 x 64; other shapes the same way, with their sizes.
        admin
            .batch_execute(&format!(
                "TRUNCATE keiro.keiro_subscription_shards;
                 INSERT INTO keiro.keiro_subscription_shards
                        (subscription_name, bucket, shard_count, owner_worker_id,
                         lease_expires_at, heartbeat_at)
                 SELECT 'sub-' || s, b, {n}, md5('sub-' || s || '-w' || (b % {w}))::uuid,
                        now() + interval '1 hour', now()
                   FROM generate_series(1, {g}) s, generate_series(0, {n} - 1) b;",
                n = shape.buckets,
                g = shape.groups,
                w = WORKERS_PER_GROUP,
            ))
            .await
            .expect("populating the seed's table");
    }
    #[derive(QueryableByName)]
    struct Owner {
        #[diesel(sql_type = Text)]
        name: String,
        #[diesel(sql_type = SqlUuid)]
        owner: Uuid,
    }
    let seed: Vec<(String, Uuid)> = diesel::sql_query(
        "SELECT DISTINCT subscription_name AS name, owner_worker_id AS owner
           FROM keiro.keiro_subscription_shards ORDER BY 1, 2",
    )
    .load::<Owner>(&mut admin)
    .await
    .expect("the seed's owners")
    .into_iter()
    .map(|o| (o.name, o.owner))
    .collect();
    assert_eq!(seed.len(), ours.len(), "as many seed owners as our members");
    // Both sides start from freshly vacuumed, analysed tables and a clean checkpoint.
    for table in [
        "lease.nodes",
        "lease.members",
        "lease.shards",
        "lease.group_changes",
        "keiro.keiro_subscription_shards",
    ] {
        // One statement each: VACUUM cannot run in the implicit transaction of a batch.
        admin
            .batch_execute(&format!("VACUUM ANALYZE {table}"))
            .await
            .expect("vacuum");
    }
    // Needs superuser on an external server; the figures do not depend on it.
    admin.batch_execute("CHECKPOINT").await.ok();
    let bench = Bench {
        store,
        ttl,
        seed_ttl: chrono::Duration::hours(1),
        share: share as usize,
        ours,
        seed,
        busy_plans: AtomicU64::new(0),
    };
    (Arc::new(bench), admin)
}

/// Rows written by one tick of `kind`, run on a connection of our own: exact by `xmin`, and
/// `pg_stat_user_tables` counts (tuples inserted, updated, of which HOT, deleted) per tick.
async fn rows_written(bench: &Bench, admin: &mut AsyncPgConnection, kind: Kind) -> String {
    const TICKS: usize = 10;
    let ours = matches!(kind, Kind::Ours | Kind::BareUpdate | Kind::SelectOne);
    let tables = if ours {
        "'lease.nodes'::regclass, 'lease.members'::regclass, 'lease.shards'::regclass, \
         'lease.group_changes'::regclass"
    } else {
        "'keiro.keiro_subscription_shards'::regclass"
    };
    let stats_sql = format!(
        "SELECT coalesce(sum(n_tup_ins), 0)::bigint AS ins, coalesce(sum(n_tup_upd), 0)::bigint AS upd,
                coalesce(sum(n_tup_hot_upd), 0)::bigint AS hot, coalesce(sum(n_tup_del), 0)::bigint AS del
           FROM pg_stat_user_tables WHERE relid IN ({tables})"
    );
    let xmin_sql = if ours {
        "SELECT (SELECT count(*) FROM lease.nodes WHERE xmin::text::bigint > $1)
              + (SELECT count(*) FROM lease.members WHERE xmin::text::bigint > $1)
              + (SELECT count(*) FROM lease.shards WHERE xmin::text::bigint > $1)
              + (SELECT count(*) FROM lease.group_changes WHERE xmin::text::bigint > $1) AS n"
    } else {
        "SELECT count(*) AS n FROM keiro.keiro_subscription_shards WHERE xmin::text::bigint > $1"
    };
    // The ticks run on `conn`, which flushes its own statistics when asked.
    let pooled = bench.store.pool().get().await.expect("a pooled connection");
    let mut conn = deadpool_take(pooled);
    let stats = async |conn: &mut AsyncPgConnection| {
        conn.batch_execute("SELECT pg_stat_force_next_flush()")
            .await
            .expect("flush statistics");
        // A new transaction sees the flushed counters (statistics snapshots are per transaction).
        diesel::sql_query(&stats_sql)
            .get_result::<TableStats>(conn)
            .await
            .expect("table statistics")
    };
    let before = stats(&mut conn).await;
    let mut exact = 0;
    for i in 0..TICKS {
        let xid = scalar(admin, "SELECT txid_current() AS n").await;
        one_tick(bench, &mut conn, kind, i * 7 + 3).await;
        exact += diesel::sql_query(xmin_sql)
            .bind::<BigInt, _>(xid)
            .get_result::<Scalar>(admin)
            .await
            .expect("rows by xmin")
            .n;
    }
    let after = stats(&mut conn).await;
    let per = |a: i64, b: i64| (a - b) as f64 / TICKS as f64;
    format!(
        "| {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |",
        kind.label(),
        exact as f64 / TICKS as f64,
        per(after.ins, before.ins),
        per(after.upd, before.upd),
        per(after.hot, before.hot),
        per(after.del, before.del),
    )
}

/// A pooled connection taken out of the pool (dropped with it, not returned).
fn deadpool_take(
    conn: diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection>,
) -> AsyncPgConnection {
    diesel_async::pooled_connection::deadpool::Object::take(conn)
}

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

/// One ratio the engine has a target for, as one run measured it.
struct Ratio {
    target: String,
    got: f64,
    want: f64,
}

/// The tables of one shape in one run; returns the ratios the engine has targets for.
/// `first_round` numbers this row's first round within the invocation: round `r` runs the
/// kinds of tick starting at kind `r mod 6`, so no kind always runs first (after the pool's
/// connections were idle) or last (after the other kinds heated the server's caches).
async fn shape_tables(
    shape: Shape,
    clients: &[usize],
    secs: f64,
    rounds: u32,
    first_round: u32,
) -> Vec<Ratio> {
    let (bench, mut admin) = setup(shape, clients.iter().copied().max().unwrap_or(16)).await;
    println!(
        "\n#### {} groups x {} buckets, {WORKERS_PER_GROUP} workers per group owning {} each\n",
        shape.groups,
        shape.buckets,
        shape.buckets / WORKERS_PER_GROUP
    );
    println!("| clients | tick | ticks/s | p50 ms | p99 ms | client CPU µs/tick | ours / this |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    let kinds = Kind::ALL.len();
    for &c in clients {
        let mut samples: Vec<Sample> = Kind::ALL.iter().map(|_| Sample::default()).collect();
        let slice = Duration::from_secs_f64(secs / f64::from(rounds));
        for round in first_round..first_round + rounds {
            for j in 0..kinds {
                let k = (round as usize + j) % kinds;
                let seed = u64::from(round) * 10 + k as u64;
                measure(&bench, Kind::ALL[k], c, slice, seed, &mut samples[k]).await;
            }
        }
        let ours = samples[0].rate();
        for (k, kind) in Kind::ALL.iter().enumerate() {
            let rate = samples[k].rate();
            let (p50, p99) = (
                samples[k].percentile_ms(0.50),
                samples[k].percentile_ms(0.99),
            );
            println!(
                "| {c} | {} | {rate:.0} | {p50:.2} | {p99:.2} | {:.0} | {:.2}x |",
                kind.label(),
                samples[k].client_cpu_us(),
                ours / rate
            );
        }
        let ratio = |k: usize| ours / samples[k].rate();
        let name = |what: &str| {
            format!(
                "{} x {}, {c} clients: ours / {what}",
                shape.groups, shape.buckets
            )
        };
        // The node sessions' target: a steady heartbeat at 0.8x the bare one-row UPDATE.
        ratios.push(Ratio {
            target: name("bare one-row UPDATE"),
            got: ratio(4),
            want: 0.8,
        });
        if shape.buckets == 64 {
            ratios.push(Ratio {
                target: name("seed pass"),
                got: ratio(2),
                want: 2.5,
            });
            ratios.push(Ratio {
                target: name("seed bare renew"),
                got: ratio(1),
                want: 1.0,
            });
        } else {
            ratios.push(Ratio {
                target: name("seed bare renew"),
                got: ratio(1),
                want: 5.0,
            });
        }
    }
    println!(
        "\nOur ticks answered with a view or planning a move: {} (steady state: must be 0).",
        AtomicU64::load(&bench.busy_plans, Ordering::Relaxed)
    );
    println!("\nTargets (the bare-UPDATE ratio is the node sessions') at this shape, this run:\n");
    for r in &ratios {
        println!("- {}: {}", r.target, verdict(r.got, r.want));
    }
    println!(
        "\nRows written per tick (one client, 10 ticks): exact rows whose xmin is the tick's, \
         and pg_stat_user_tables counts per tick.\n"
    );
    println!("| tick | rows written (xmin) | inserted | updated | of which HOT | deleted |");
    println!("|---|---:|---:|---:|---:|---:|");
    for kind in Kind::ALL {
        println!("{}", rows_written(&bench, &mut admin, kind).await);
    }
    let walinspect = admin
        .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .await
        .is_ok();
    println!(
        "\nWAL written per tick (one client, {WAL_TICKS} ticks after one unmeasured tick of each \
         member they use): the records between the WAL insert positions before and after, as \
         pg_walinspect lists them (by resource manager; `other` is any record another process \
         wrote meanwhile), and the distance between the two positions (record alignment and \
         page headers included).\n"
    );
    println!(
        "| tick | WAL records | heap | btree | commit | other | with a full-page image | record \
         bytes | insert position moved, bytes |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for kind in Kind::ALL {
        println!(
            "{}",
            wal_written(&bench, &mut admin, kind, walinspect).await
        );
    }
    ratios
}

fn verdict(got: f64, want: f64) -> String {
    if got >= want {
        format!("met ({got:.2}x >= {want}x)")
    } else {
        format!(
            "MISSED ({got:.2}x < {want}x, short by {:.1}%)",
            (1.0 - got / want) * 100.0
        )
    }
}

/// Ticks per kind in the WAL table.
const WAL_TICKS: usize = 100;

#[derive(QueryableByName, Debug, Clone, Copy)]
struct WalRecords {
    #[diesel(sql_type = BigInt)]
    records: i64,
    #[diesel(sql_type = BigInt)]
    heap: i64,
    #[diesel(sql_type = BigInt)]
    btree: i64,
    #[diesel(sql_type = BigInt)]
    commit: i64,
    #[diesel(sql_type = BigInt)]
    fpi: i64,
    #[diesel(sql_type = BigInt)]
    bytes: i64,
}

/// WAL written by one tick of `kind`, run on a connection of our own while nothing else runs.
/// The records are read back from the WAL itself (pg_walinspect, when the server has it and
/// lets us create it), not from `pg_stat_wal`, whose counters other backends report lazily
/// and which so mixed WAL written before the window into it.
async fn wal_written(
    bench: &Bench,
    admin: &mut AsyncPgConnection,
    kind: Kind,
    walinspect: bool,
) -> String {
    let pooled = bench.store.pool().get().await.expect("a pooled connection");
    let mut conn = deadpool_take(pooled);
    let picks: Vec<usize> = (0..WAL_TICKS)
        .map(|i| (i * 7 + 3) % bench.ours.len())
        .collect();
    // The first change of a page after a checkpoint logs the whole page (full_page_writes):
    // one unmeasured tick of each member used first, so the table shows a steady tick.
    let mut warmed = std::collections::BTreeSet::new();
    for &pick in &picks {
        if warmed.insert(pick) {
            one_tick(bench, &mut conn, kind, pick).await;
        }
    }
    let lsn = "SELECT pg_current_wal_insert_lsn()::text AS value";
    let start = setting(&mut conn, lsn).await;
    for &pick in &picks {
        one_tick(bench, &mut conn, kind, pick).await;
    }
    let end = setting(&mut conn, lsn).await;
    let moved = scalar_bound(
        admin,
        "SELECT ($2::pg_lsn - $1::pg_lsn)::bigint AS n",
        &start,
        &end,
    )
    .await;
    let per = |n: i64| n as f64 / WAL_TICKS as f64;
    if moved == 0 {
        // Nothing written (SELECT 1): pg_walinspect refuses a range starting at the flush
        // position.
        return format!("| {} | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |", kind.label());
    }
    if !walinspect {
        return format!(
            "| {} | n/a | n/a | n/a | n/a | n/a | n/a | n/a | {:.0} |",
            kind.label(),
            per(moved)
        );
    }
    // pg_walinspect reads only flushed WAL; without synchronous commits the WAL writer
    // flushes within its delay (200 ms by default).
    let flushed = Instant::now();
    while diesel::sql_query("SELECT (pg_current_wal_flush_lsn() >= $1::pg_lsn)::int::bigint AS n")
        .bind::<Text, _>(&end)
        .get_result::<Scalar>(admin)
        .await
        .expect("the flushed WAL position")
        .n
        == 0
    {
        assert!(
            flushed.elapsed() < Duration::from_secs(10),
            "WAL not flushed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let w = diesel::sql_query(
        "SELECT count(*)::bigint AS records,
                count(*) FILTER (WHERE resource_manager IN ('Heap', 'Heap2'))::bigint AS heap,
                count(*) FILTER (WHERE resource_manager = 'Btree')::bigint AS btree,
                count(*) FILTER (WHERE resource_manager = 'Transaction')::bigint AS commit,
                count(*) FILTER (WHERE fpi_length > 0)::bigint AS fpi,
                coalesce(sum(record_length), 0)::bigint AS bytes
           FROM pg_get_wal_records_info($1::pg_lsn, $2::pg_lsn)",
    )
    .bind::<Text, _>(&start)
    .bind::<Text, _>(&end)
    .get_result::<WalRecords>(admin)
    .await
    .expect("WAL records");
    format!(
        "| {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |",
        kind.label(),
        per(w.records),
        per(w.heap),
        per(w.btree),
        per(w.commit),
        per(w.records - w.heap - w.btree - w.commit),
        per(w.fpi),
        per(w.bytes),
        per(moved),
    )
}

/// A bigint from `sql` with two text binds.
async fn scalar_bound(conn: &mut AsyncPgConnection, sql: &str, a: &str, b: &str) -> i64 {
    diesel::sql_query(sql)
        .bind::<Text, _>(a)
        .bind::<Text, _>(b)
        .get_result::<Scalar>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .n
}

/// One tick of `kind` for member `pick` on `conn`, outside the pool.
async fn one_tick(bench: &Bench, conn: &mut AsyncPgConnection, kind: Kind, pick: usize) {
    match kind {
        Kind::Ours => {
            let member = &bench.ours[pick % bench.ours.len()];
            let beat = node_beat(conn, member.node, bench.ttl, &member.seen()).await;
            member.take(beat);
        }
        Kind::BareUpdate => {
            let member = &bench.ours[pick % bench.ours.len()];
            bare_update(conn, member.node, bench.ttl).await;
        }
        Kind::SelectOne => {
            select_one(conn).await;
        }
        Kind::SeedRenew => {
            let (name, owner) = &bench.seed[pick % bench.seed.len()];
            seed_renew(conn, name, *owner, bench.seed_ttl)
                .await
                .expect("seed renew");
        }
        Kind::SeedPass | Kind::SeedPassNoClaim => {
            let (name, owner) = &bench.seed[pick % bench.seed.len()];
            seed_pass(conn, name, *owner, bench.seed_ttl, kind == Kind::SeedPass)
                .await
                .expect("seed pass");
        }
    }
}

/// Heartbeat latency in one big group: 10,000 buckets, 500 members owning 20 each. Returns
/// the median latency in ms.
async fn scale(heartbeats: usize) -> f64 {
    let db = lease_testdb::database().await;
    let store = PgLeaseStore::builder(db.url)
        .max_connections(4)
        .build()
        .expect("a store");
    let group = GroupName::new("big").expect("group name");
    let (n, members, share) = (10_000u32, 500usize, 20u32);
    store
        .ensure_group(&group, ShardCount::new(n).expect("shard count"))
        .await
        .expect("ensure");
    let ttl = Ttl::from_secs(3_600).expect("ttl");
    let beat = async |w: NodeId| {
        store
            .heartbeat(
                w,
                Incarnation::from_uuid(w.as_uuid()),
                ttl,
                &MemberMetadata::empty(),
                &[],
            )
            .await
            .expect("heartbeat")
    };
    let mut workers = Vec::new();
    for _ in 0..members {
        let w = NodeId::new();
        let session = beat(w).await.session;
        store.join(&group, w, session).await.expect("join");
        assert_eq!(
            store
                .claim(&group, w, session, share, Takeover::Allowed)
                .await
                .expect("claim")
                .len(),
            share as usize
        );
        workers.push(w);
    }
    let mut rng = Rng::new(42);
    // Warm the pool's connections (prepare the statement on each).
    for _ in 0..8 {
        beat(workers[rng.below(members)]).await;
    }
    let mut sample = Sample::default();
    let start = Instant::now();
    for _ in 0..heartbeats {
        let w = workers[rng.below(members)];
        let t0 = Instant::now();
        // No stamp handed in: the full view, which is what this row measures.
        let answer = beat(w).await;
        let beat = answer.group(&group).expect("the group's view");
        let plan = policy::plan(&beat.view, w, &beat.owned_buckets());
        sample
            .latencies
            .push(u32::try_from(t0.elapsed().as_micros()).unwrap_or(u32::MAX));
        assert_eq!(beat.view.members.len(), members, "members in the view");
        assert_eq!(beat.owned.len(), share as usize, "buckets held");
        assert!(plan.claim == 0 && plan.shed.is_empty(), "steady state");
        sample.ticks += 1;
    }
    sample.elapsed = start.elapsed();
    println!("\n#### Scale: one group of 10,000 buckets and 500 members owning 20 each\n");
    println!("| tick | heartbeats | p50 ms | p99 ms | max ms | ticks/s (1 client) |");
    println!("|---|---:|---:|---:|---:|---:|");
    let rate = sample.rate();
    let (p50, p99, max) = (
        sample.percentile_ms(0.50),
        sample.percentile_ms(0.99),
        sample.percentile_ms(1.0),
    );
    println!(
        "| ours: heartbeat + plan, view of 500 members | {heartbeats} | {p50:.2} | {p99:.2} | {max:.2} | {rate:.0} |"
    );
    p50
}

/// The middle value (the mean of the two middle ones for an even count) and the smallest.
fn median_min(values: &[f64]) -> (f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0])
}

fn main() {
    // `cargo bench` passes `--bench`; without it (`cargo test --benches`) run a short smoke
    // version, so a test run of every target stays quick.
    let full = std::env::args().any(|a| a == "--bench");
    let secs = env_f64("LEASE_BENCH_SECS", if full { 12.0 } else { 0.5 });
    let rounds = env_f64("LEASE_BENCH_ROUNDS", if full { 3.0 } else { 1.0 }).max(1.0) as u32;
    let runs = env_f64("LEASE_BENCH_RUNS", if full { 3.0 } else { 1.0 }).max(1.0) as u32;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let db = lease_testdb::database().await;
        let mut conn = AsyncPgConnection::establish(&db.url)
            .await
            .expect("a connection");
        let version = setting(&mut conn, "SELECT version() AS value").await;
        let mut durability = Vec::new();
        for name in ["fsync", "synchronous_commit", "full_page_writes"] {
            let value = setting(
                &mut conn,
                &format!("SELECT current_setting('{name}') AS value"),
            )
            .await;
            durability.push(format!("{name}={value}"));
        }
        println!("Tick cost on Postgres. Server: {version}");
        println!(
            "Settings: {} ({}). Client: diesel-async, one deadpool pool per shape, tokio on {} \
             threads. {runs} complete runs; in each, {secs} s measured per kind of tick per row, in \
             {rounds} rounds (round r runs the kinds from kind r mod 6 on, r counted over the \
             invocation), after {} ms of warm-up each.",
            durability.join(", "),
            if lease_testdb::durable() {
                "LEASE_TESTDB_DURABLE=1"
            } else {
                "lease-testdb default, or DATABASE_URL"
            },
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            WARM_UP.as_millis()
        );
        let shapes: &[(Shape, &[usize])] = if full {
            &[
                (
                    Shape {
                        groups: 100,
                        buckets: 64,
                    },
                    &CLIENTS,
                ),
                (
                    Shape {
                        groups: 10,
                        buckets: 1_024,
                    },
                    &CLIENTS,
                ),
            ]
        } else {
            &[(
                Shape {
                    groups: 10,
                    buckets: 64,
                },
                &CLIENTS[..1],
            )]
        };
        // Each run is complete (fresh databases, every shape, the scale check), so the spread
        // over runs shows how far one run's ratio can be trusted on this machine.
        let mut by_run: Vec<Vec<Ratio>> = Vec::new();
        let mut scale_p50 = Vec::new();
        for run in 0..runs {
            println!("\n### Run {} of {runs}", run + 1);
            let mut ratios = Vec::new();
            for (shape, clients) in shapes {
                ratios.extend(shape_tables(*shape, clients, secs, rounds, run * rounds).await);
            }
            scale_p50.push(scale(if full { 300 } else { 20 }).await);
            by_run.push(ratios);
        }
        println!(
            "\n### Targets over {runs} runs (verdict on the median; the minimum is the \
             worst run)\n"
        );
        let header: Vec<String> = (1..=runs).map(|r| format!("run {r}")).collect();
        println!(
            "| target | {} | median | min | verdict (median) | min meets it |",
            header.join(" | ")
        );
        println!("|---|{}---:|---:|---|---|", "---:|".repeat(runs as usize));
        for (i, first) in by_run[0].iter().enumerate() {
            let got: Vec<f64> = by_run.iter().map(|r| r[i].got).collect();
            let (median, min) = median_min(&got);
            let cells: Vec<String> = got.iter().map(|g| format!("{g:.2}x")).collect();
            println!(
                "| {} >= {}x | {} | {median:.2}x | {min:.2}x | {} | {} |",
                first.target,
                first.want,
                cells.join(" | "),
                verdict(median, first.want),
                if min >= first.want {
                    "yes".to_owned()
                } else {
                    format!("no, short by {:.1}%", (1.0 - min / first.want) * 100.0)
                }
            );
        }
        let (median, min) = median_min(&scale_p50);
        let cells: Vec<String> = scale_p50.iter().map(|p| format!("{p:.2}")).collect();
        println!(
            "\nHeartbeat p50 at 10,000 buckets x 500 members (full view, no stamps), ms: {} \
             (median {median:.2}, min \
             {min:.2})",
            cells.join(", ")
        );
    });
}
