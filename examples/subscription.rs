//! A sharded event-store subscription on Postgres: the use case the engine was made for.
//!
//! An append-only `app.events` table; every event belongs to a stream, and a stream's events
//! go to one bucket (`ShardCount::bucket_of` of the stream name's hash), so each stream is
//! handled in order by one process at a time. Any number of `consume` processes share the
//! group's buckets. For each bucket it owns, a process reads the bucket's events in order and,
//! **in one transaction**, checks its lease with `lease.is_current` (which share-locks the
//! bucket's row until the transaction ends, so nobody can take the bucket meanwhile), writes
//! what handling the events produced (here a row per event in `app.handled`) and moves the
//! bucket's checkpoint. A paused process whose lease was taken over (a zombie) finds
//! `is_current` false and rolls back: nothing it does after losing the bucket commits.
//!
//! After an online resize (`leasectl resize` or `LeaseStore::resize`), a new bucket continues
//! where its parents stopped: an event is handled by the new bucket only if it is past the
//! checkpoint of the old bucket its stream belonged to (`Assignment::parents`). The resize
//! barrier hands the new bucket out only once every parent is released or dead, and a
//! parent's last fenced transaction holds it back until it ends, so the parents' checkpoints
//! are final when it starts.
//!
//! Appends take a transaction-scoped advisory lock, so event ids commit in order: a reader
//! never passes an id whose transaction has yet to commit.
//!
//! ```text
//! DATABASE_URL=postgres://... cargo run --example subscription -- setup
//! DATABASE_URL=postgres://... cargo run --example subscription -- append 1000
//! DATABASE_URL=postgres://... cargo run --example subscription -- consume   # several of these
//! ```
//!
//! Settings from the environment: `LEASE_GROUP` (default `subscription`), `LEASE_SHARDS`
//! (default 4; a consumer started after a resize may say either count), `LEASE_TTL_MS`
//! (default 30000) and `LEASE_RENEW_MS` (default a third of the ttl). `tests/subscription.rs`
//! runs three consumers, SIGKILLs one, resizes the group and checks that every event was
//! handled exactly once.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease::postgres::PgLeaseStore;
use lease::{Assignment, BucketLease, GroupName, LeaseWorker, NodeId, ShardCount};

type Error = Box<dyn std::error::Error + Send + Sync>;

const SCHEMA: &str = "
CREATE SCHEMA IF NOT EXISTS app;
CREATE TABLE IF NOT EXISTS app.events (
    id       bigserial PRIMARY KEY,
    stream   text   NOT NULL,
    key_hash bigint NOT NULL CHECK (key_hash >= 0),
    payload  text   NOT NULL
);
-- Where each bucket of each generation (its shard count) got to: every event of its keys up
-- to `position` is handled.
CREATE TABLE IF NOT EXISTS app.checkpoints (
    shards   integer NOT NULL,
    bucket   integer NOT NULL,
    position bigint  NOT NULL,
    PRIMARY KEY (shards, bucket)
);
-- What handling an event wrote. No unique key on purpose: a duplicate would show.
CREATE TABLE IF NOT EXISTS app.handled (
    event_id bigint  NOT NULL,
    shards   integer NOT NULL,
    bucket   integer NOT NULL,
    token    bigint  NOT NULL
);
";

/// The most events one transaction handles.
const BATCH: i64 = 100;

#[tokio::main]
async fn main() -> Result<(), Error> {
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    match <[String]>::first(&args).map(String::as_str) {
        Some("setup") => setup(&url).await,
        Some("append") => {
            let count = args.get(1).map_or(Ok(100), |n| n.parse())?;
            append(&url, count).await
        }
        Some("consume") => consume(&url).await,
        _ => Err("usage: subscription setup | append N | consume".into()),
    }
}

fn setting<T: std::str::FromStr>(name: &str, default: T) -> Result<T, Error> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("{name}={v}: not valid").into()),
        Err(_) => Ok(default),
    }
}

/// The lease schema and the application's tables.
async fn setup(url: &str) -> Result<(), Error> {
    PgLeaseStore::builder(url).build()?.migrate().await?;
    let mut conn = AsyncPgConnection::establish(url).await?;
    conn.batch_execute(SCHEMA).await?;
    Ok(())
}

/// A stream's key: 63 bits of its name's FNV-1a hash (non-negative, so that SQL's `%` agrees
/// with `ShardCount::bucket_of`).
fn key_hash(stream: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in stream.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// Append `count` events, spread over 32 streams, in one transaction.
async fn append(url: &str, count: u32) -> Result<(), Error> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    conn.transaction::<_, Error, _>(async |c| {
        // Ids commit in the order they are drawn: one appender at a time.
        c.batch_execute("SELECT pg_advisory_xact_lock(4242)")
            .await?;
        let (streams, hashes): (Vec<String>, Vec<i64>) = (0..count)
            .map(|i| {
                let stream = format!("stream-{}", i % 32);
                let hash = key_hash(&stream);
                (stream, hash)
            })
            .unzip();
        diesel::sql_query(
            "INSERT INTO app.events (stream, key_hash, payload)
             SELECT s, h, 'event of ' || s FROM unnest($1::text[], $2::bigint[]) AS u(s, h)",
        )
        .bind::<Array<Text>, _>(&streams)
        .bind::<Array<BigInt>, _>(&hashes)
        .execute(c)
        .await?;
        Ok(())
    })
    .await
}

/// Run a worker of the group until SIGTERM or Ctrl-C, handling each owned bucket's events.
async fn consume(url: &str) -> Result<(), Error> {
    let group = GroupName::new(setting("LEASE_GROUP", "subscription".to_owned())?)?;
    let shards = ShardCount::new(setting("LEASE_SHARDS", 4)?)?;
    let ttl = Duration::from_millis(setting("LEASE_TTL_MS", 30_000)?);
    let renew = Duration::from_millis(setting("LEASE_RENEW_MS", ttl.as_millis() as u64 / 3)?);
    let store = PgLeaseStore::builder(url).build()?;
    let config = LeaseWorker::builder(group.clone(), shards)
        .ttl(ttl)
        .renew_interval(renew)
        .build()?;
    let node = config.node_id();
    let (worker, mut leases) = config.start_leases(store).await?;
    let stop = worker.cancellation_token();
    tokio::spawn(async move {
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let terminated = async {
            match term.as_mut() {
                Some(t) => {
                    t.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = terminated => {}
        }
        stop.cancel();
    });
    while let Some(lease) = leases.recv().await {
        let (url, group) = (url.to_owned(), group.clone());
        tokio::spawn(async move {
            let bucket = lease.bucket();
            if let Err(e) = work(&url, &group, node, lease).await {
                eprintln!("bucket {bucket}: {e}");
            }
        });
    }
    worker.shutdown().await?;
    Ok(())
}

/// Handle bucket `lease` until it is revoked; dropping the lease acknowledges the revocation.
async fn work(url: &str, group: &GroupName, node: NodeId, lease: BucketLease) -> Result<(), Error> {
    let mut conn = AsyncPgConnection::establish(url).await?;
    let assignment = lease.assignment();
    loop {
        let handled = tokio::select! {
            biased;
            _ = lease.revoked() => return Ok(()),
            handled = handle_batch(&mut conn, group, node, assignment) => handled?,
        };
        match handled {
            // The lease was taken over: this process must not write for the bucket again.
            None => return Ok(()),
            Some(0) => {
                tokio::select! {
                    _ = lease.revoked() => return Ok(()),
                    () = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
            }
            Some(_) => {}
        }
    }
}

#[derive(QueryableByName)]
struct Current {
    #[diesel(sql_type = Bool)]
    current: bool,
}

#[derive(QueryableByName)]
struct Position {
    #[diesel(sql_type = Nullable<BigInt>)]
    position: Option<i64>,
}

#[derive(QueryableByName)]
struct EventId {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

/// One transaction: the fence, the next events of the bucket, what handling them writes, the
/// checkpoint. `None` when the lease is not current any more (the transaction rolls back).
async fn handle_batch(
    conn: &mut AsyncPgConnection,
    group: &GroupName,
    node: NodeId,
    a: Assignment,
) -> Result<Option<usize>, Error> {
    let (shards, bucket) = (a.shards.get() as i32, a.bucket.0 as i32);
    let from = a.resized_from.map(|f| f.get() as i32);
    conn.transaction::<_, Error, _>(async |c| {
        // The fence first: it share-locks the bucket's row until this transaction ends, so the
        // lease cannot pass to anyone before the writes below commit.
        let fence = diesel::sql_query("SELECT lease.is_current($1, $2, $3, $4) AS current")
            .bind::<Text, _>(group.as_str())
            .bind::<BigInt, _>(i64::from(a.bucket.0))
            .bind::<diesel::sql_types::Uuid, _>(node.as_uuid())
            .bind::<BigInt, _>(a.token.0)
            .get_result::<Current>(c)
            .await?;
        if !fence.current {
            return Err(Fenced.into());
        }
        // Where the bucket got to; a bucket new after a resize starts at the lowest of its
        // parents' checkpoints (each event is then checked against its own parent's, below).
        let mine = diesel::sql_query(
            "SELECT position FROM app.checkpoints WHERE shards = $1 AND bucket = $2 FOR UPDATE",
        )
        .bind::<Integer, _>(shards)
        .bind::<Integer, _>(bucket)
        .get_results::<Position>(c)
        .await?;
        let start = match (<[Position]>::first(&mine), from) {
            (Some(p), _) => p.position.unwrap_or(0),
            (None, Some(from)) => {
                let parents: Vec<i32> = a.parents().iter().map(|p| p.0 as i32).collect();
                diesel::sql_query(
                    "SELECT min(COALESCE(c.position, 0)) AS position
                       FROM unnest($2::integer[]) AS p(bucket)
                       LEFT JOIN app.checkpoints c ON c.shards = $1 AND c.bucket = p.bucket",
                )
                .bind::<Integer, _>(from)
                .bind::<Array<Integer>, _>(&parents)
                .get_result::<Position>(c)
                .await?
                .position
                .unwrap_or(0)
            }
            (None, None) => 0,
        };
        let events = diesel::sql_query(
            "SELECT e.id FROM app.events e
              WHERE e.key_hash % $1 = $2 AND e.id > $3
                AND ($4::integer IS NULL
                     OR e.id > COALESCE((SELECT c.position FROM app.checkpoints c
                                          WHERE c.shards = $4 AND c.bucket = e.key_hash % $4),
                                        0))
              ORDER BY e.id
              LIMIT $5",
        )
        .bind::<Integer, _>(shards)
        .bind::<Integer, _>(bucket)
        .bind::<BigInt, _>(start)
        .bind::<Nullable<Integer>, _>(from)
        .bind::<BigInt, _>(BATCH)
        .get_results::<EventId>(c)
        .await?;
        let Some(last) = events.last().map(|e| e.id) else {
            return Ok(0);
        };
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        diesel::sql_query(
            "INSERT INTO app.handled (event_id, shards, bucket, token)
             SELECT id, $2, $3, $4 FROM unnest($1::bigint[]) AS id",
        )
        .bind::<Array<BigInt>, _>(&ids)
        .bind::<Integer, _>(shards)
        .bind::<Integer, _>(bucket)
        .bind::<BigInt, _>(a.token.0)
        .execute(c)
        .await?;
        diesel::sql_query(
            "INSERT INTO app.checkpoints (shards, bucket, position) VALUES ($1, $2, $3)
             ON CONFLICT (shards, bucket) DO UPDATE SET position = excluded.position",
        )
        .bind::<Integer, _>(shards)
        .bind::<Integer, _>(bucket)
        .bind::<BigInt, _>(last)
        .execute(c)
        .await?;
        Ok(ids.len())
    })
    .await
    .map(Some)
    .or_else(|e| if e.is::<Fenced>() { Ok(None) } else { Err(e) })
}

/// The lease was not current: the transaction rolls back.
#[derive(Debug)]
struct Fenced;

impl std::fmt::Display for Fenced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lease is not current any more")
    }
}

impl std::error::Error for Fenced {}
