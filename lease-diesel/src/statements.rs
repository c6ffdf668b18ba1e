//! The SQL of each operation: one statement each, one round trip each, but for the heartbeat
//! (its steady statement first, the function when that finds something to look at) and the
//! resize (its steps in one transaction).
//!
//! Every statement takes the client clock as a nullable parameter and reads time as
//! `COALESCE(<that>, clock_timestamp())`: one SQL text for both clock modes. Expiry is compared
//! with `clock_timestamp()`, never with `now()` (the transaction's start): a renewal that began
//! before expiry must not extend a session a claimer has already judged dead. Where a decision
//! on a node's liveness leads to an action (a claim's own liveness, a claimer taking a dead
//! node's buckets, a heartbeat starting a session), the clock is read once the node row is
//! locked (a CTE reading the row a `FOR SHARE` locked, a statement after `FOR UPDATE` in a
//! function); a `FOR UPDATE` condition alone is not enough, Postgres tests it before waiting
//! for the lock and does not test it again if the row was locked but not changed meanwhile.
//! The renewal, a plain `UPDATE`, reads its clock before it locks; it reads it again once it
//! holds the lock, and a session that expired meanwhile is over (see `lease.heartbeat` in
//! migration 7).
//!
//! Every statement locks in one order: the node row, member rows, bucket rows, and last the
//! group's change counter (`lease.group_changes`). An operation on one group holds that lock
//! from its statement's end to its commit; the heartbeat function, which may move several
//! groups' counters, and a new session take them in the order of the groups' names by bytes.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use diesel::QueryableByName;
use diesel::sql_types::{
    Array, BigInt, Bool, Integer, Nullable, Text, Timestamptz, Uuid as SqlUuid,
};
use uuid::Uuid;

/// Create a group and its bucket rows in one statement, or do nothing if the name is taken.
/// `$1` name, `$2` shard count, `$3` client time. Returns one row if the group was created.
pub(crate) const ENSURE_GROUP: &str = r#"
WITH ins AS (
    INSERT INTO lease.groups (name, shard_count, created_at)
    VALUES ($1, $2, COALESCE($3, clock_timestamp()))
    ON CONFLICT (name) DO NOTHING
    RETURNING shard_count
), buckets AS (
    INSERT INTO lease.shards (group_name, bucket, updated_at)
    SELECT $1, b, COALESCE($3, clock_timestamp())
      FROM ins, generate_series(0, ins.shard_count - 1) AS b
), changes AS (
    INSERT INTO lease.group_changes (group_name) SELECT $1 FROM ins
)
SELECT shard_count FROM ins
"#;

/// The stored shard count of a group and the count it was last resized from. `$1` name.
pub(crate) const GROUP_SHARD_COUNT: &str =
    "SELECT shard_count, previous_count FROM lease.groups WHERE name = $1";

/// Row of [`GROUP_SHARD_COUNT`].
#[derive(QueryableByName, Debug)]
pub(crate) struct GroupCountsRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = Nullable<Integer>)]
    pub previous_count: Option<i32>,
}

/// A node's heartbeat: `lease.heartbeat` (migration 11) extends the node's live session if this
/// incarnation began it, or starts a new one (`$2` becomes its id), and answers for each group
/// the node is a member of, "unchanged" or its view (rules H1-H10, V1, V4). `$1` node, `$2`
/// candidate session id, `$3` ttl, `$4` metadata, `$5` client time, `$6` incarnation, `$7`
/// the groups of the stamps handed in, sorted by bytes, `$8` their versions, `$9` their
/// untils; the bound of the session's writes (V4): `$10` the session, `$11` the timeline and
/// `$12` the WAL offset (nulls for none).
///
/// Rows: one with the session and the groups answered unchanged (`group_name` null), and one
/// per group whose view is given. `mine` false: another incarnation holds the live session
/// (nothing was written; `expires_at` is that session's). A function rather than a statement
/// of CTEs: a statement with the views' CTEs paid for initialising all of them on every call
/// (measured: 7x the server time of a one-row `UPDATE`; the function: about 2.5x). A steady
/// tick outside a transaction does not come here: [`STEADY_RENEWAL`] answers it.
pub(crate) const HEARTBEAT: &str = r#"
SELECT h.session_id, h.heartbeat_at, h.expires_at, h.started, h.mine, h.timeline, h.recorded,
       h.unchanged_groups, h.unchanged_versions, h.unchanged_until, h.group_name,
       h.stamp_version, h.until, h.shard_count, h.generation, h.previous_count, h.draining,
       h.workers, h.loads, h.buckets, h.tokens, h.old_buckets, h.old_tokens, h.weights,
       h.modes, h.my_weight, h.my_mode, h.quarantined, h.quarantined_held, h.position_offset,
       h.crossed, gl.member_loads, gl.member_hottest, gl.my_load, gl.my_hottest,
       gl.loaded_buckets, gl.loaded_loads
  FROM lease.heartbeat($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) AS h
  LEFT JOIN LATERAL (
    -- P3, P4: the members' work at their last publications (parallel to h.workers), the
    -- node's own, and the claimable buckets with a load (as C2 and C10 say what is claimable:
    -- no live member's session holds it, no quarantine runs at the heartbeat's time), hottest
    -- first, at most 256 (LOADED_LISTED). Read with this statement's snapshot, which
    -- lease.heartbeat's own queries may postdate: loads only steer the policy, and a claim
    -- judges claimability again.
    SELECT ARRAY(SELECT COALESCE(m.load, 0)
                   FROM unnest(h.workers) WITH ORDINALITY AS w(node_id, i)
                   LEFT JOIN lease.members m
                     ON m.group_name = h.group_name AND m.node_id = w.node_id
                  ORDER BY w.i) AS member_loads,
           ARRAY(SELECT COALESCE(m.hottest, 0)
                   FROM unnest(h.workers) WITH ORDINALITY AS w(node_id, i)
                   LEFT JOIN lease.members m
                     ON m.group_name = h.group_name AND m.node_id = w.node_id
                  ORDER BY w.i) AS member_hottest,
           COALESCE((SELECT m.load FROM lease.members m
                      WHERE m.group_name = h.group_name AND m.node_id = $1), 0) AS my_load,
           COALESCE((SELECT m.hottest FROM lease.members m
                      WHERE m.group_name = h.group_name AND m.node_id = $1), 0) AS my_hottest,
           COALESCE(f.buckets, '{}') AS loaded_buckets, COALESCE(f.loads, '{}') AS loaded_loads
      FROM (SELECT array_agg(c.bucket ORDER BY c.load DESC, c.bucket) AS buckets,
                   array_agg(c.load ORDER BY c.load DESC, c.bucket) AS loads
              FROM (SELECT s.bucket, s.load FROM lease.shards s
                     WHERE s.group_name = h.group_name AND s.load > 0
                       AND (s.quarantined_until IS NULL OR s.quarantined_until <= h.heartbeat_at)
                       AND NOT EXISTS (SELECT 1 FROM lease.nodes y
                                         JOIN lease.members x
                                           ON x.group_name = s.group_name
                                          AND x.node_id = y.node_id
                                        WHERE y.node_id = s.owner_node
                                          AND y.session_id = s.owner_session
                                          AND y.expires_at > h.heartbeat_at)
                     ORDER BY s.load DESC, s.bucket
                     LIMIT 256) AS c) AS f
  ) AS gl ON h.group_name IS NOT NULL
"#;

/// A steady heartbeat as one plain statement (rule H8's fast path): renew node `$1`'s live
/// session of incarnation `$2` on this timeline (`$3` ttl, `$4` metadata, `$5` client time) and
/// say whether its groups and their change counters are those of the stamps handed in (`$6`
/// groups sorted by bytes, `$7` their versions) with no stamp's `until` reached (`$8` the
/// earliest, null if none has one). No row: no live session of this node, incarnation and
/// timeline, or not steady; nothing was written, and [`HEARTBEAT`] renews and looks at the
/// groups. The groups are read with the statement's snapshot, taken before it waits for the
/// row's lock: a join, claim or release committed during that wait is seen at the next tick
/// (the counter then differs). One clock reading for liveness and the new expiry; the clock
/// is read again once the row is locked (RETURNING runs after the lock), and a session that
/// expired while this waited for the lock makes the statement fail through
/// `lease.renewal_too_late()`, which undoes the renewal. A session handed over (HO1) is never
/// renewed here, even by the incarnation that handed it over: the take-over (HO3) is the full
/// heartbeat's, which clears the mark. A hand-over moves the node's groups' counters, but this
/// statement reads them with its snapshot, taken before it waits for the hand-over's lock;
/// `NOT n.handed_over` is checked again on the row's new version once the lock is free. The
/// same work as [`HEARTBEAT`]'s steady path without a function call: a plpgsql function per
/// tick cost about half the rate of a bare one-row `UPDATE`.
pub(crate) const STEADY_RENEWAL: &str = r#"
WITH t AS (SELECT COALESCE($5::timestamptz, pg_catalog.clock_timestamp()) AS v)
UPDATE lease.nodes n
   SET heartbeat_at = t.v, expires_at = t.v + $3, metadata = $4,
       prior_expires_at = n.expires_at
  FROM t
 WHERE n.node_id = $1 AND n.incarnation = $2 AND n.expires_at > t.v
   AND n.timeline = lease.timeline() AND NOT n.handed_over
   AND ($8::timestamptz IS NULL OR $8::timestamptz > t.v)
   AND (SELECT COALESCE(array_agg(m.group_name ORDER BY m.group_name COLLATE "C"), '{}')
                 = $6::text[]
               AND COALESCE(array_agg(c.version ORDER BY m.group_name COLLATE "C"), '{}')
                 = $7::bigint[]
          FROM lease.members m
          JOIN lease.group_changes c ON c.group_name = m.group_name
         WHERE m.node_id = $1)
RETURNING n.session_id, n.heartbeat_at, n.expires_at, n.timeline,
          lease.wal_offset() AS position_offset,
          CASE WHEN COALESCE($5::timestamptz, pg_catalog.clock_timestamp()) >= n.prior_expires_at
               THEN lease.renewal_too_late() ELSE false END AS late
"#;

/// Row of [`STEADY_RENEWAL`].
#[derive(QueryableByName, Debug)]
pub(crate) struct SteadyRow {
    #[diesel(sql_type = SqlUuid)]
    pub session_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub heartbeat_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub expires_at: DateTime<Utc>,
    #[diesel(sql_type = BigInt)]
    pub timeline: i64,
    /// Where the WAL stood (H10), as a byte offset.
    #[diesel(sql_type = BigInt)]
    pub position_offset: i64,
}

/// The message of `lease.renewal_too_late()`.
pub(crate) const RENEWAL_TOO_LATE: &str = "lease.renewal_too_late";

/// Row of [`HEARTBEAT`].
#[derive(QueryableByName, Debug)]
pub(crate) struct HeartbeatRow {
    #[diesel(sql_type = SqlUuid)]
    pub session_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub heartbeat_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub expires_at: DateTime<Utc>,
    #[diesel(sql_type = Bool)]
    pub started: bool,
    #[diesel(sql_type = Bool)]
    pub mine: bool,
    #[diesel(sql_type = BigInt)]
    pub timeline: i64,
    #[diesel(sql_type = Bool)]
    pub recorded: bool,
    #[diesel(sql_type = Nullable<Array<Text>>)]
    pub unchanged_groups: Option<Vec<String>>,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub unchanged_versions: Option<Vec<i64>>,
    #[diesel(sql_type = Nullable<Array<Nullable<Timestamptz>>>)]
    pub unchanged_until: Option<Vec<Option<DateTime<Utc>>>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub group_name: Option<String>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub stamp_version: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub until: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub shard_count: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub generation: Option<i64>,
    #[diesel(sql_type = Nullable<Integer>)]
    pub previous_count: Option<i32>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub draining: Option<i64>,
    #[diesel(sql_type = Nullable<Array<SqlUuid>>)]
    pub workers: Option<Vec<Uuid>>,
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub loads: Option<Vec<i32>>,
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub buckets: Option<Vec<i32>>,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub tokens: Option<Vec<i64>>,
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub old_buckets: Option<Vec<i32>>,
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub old_tokens: Option<Vec<i64>>,
    /// The other live members' weights, parallel to `workers` (K1).
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub weights: Option<Vec<i32>>,
    /// The other live members' modes, parallel to `workers`.
    #[diesel(sql_type = Nullable<Array<Text>>)]
    pub modes: Option<Vec<String>>,
    /// The node's own weight.
    #[diesel(sql_type = Nullable<Integer>)]
    pub my_weight: Option<i32>,
    /// The node's own mode.
    #[diesel(sql_type = Nullable<Text>)]
    pub my_mode: Option<String>,
    /// The group's buckets under quarantine at the heartbeat's time, sorted (Q1).
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub quarantined: Option<Vec<i32>>,
    /// How many of them a live member holds (Q2).
    #[diesel(sql_type = Nullable<BigInt>)]
    pub quarantined_held: Option<i64>,
    /// Where the WAL stood (H10), as a byte offset; null when another process's session
    /// refused the call.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub position_offset: Option<i64>,
    /// On the session's first heartbeat on a new timeline, how it fared: `kept`, or `ended:`
    /// and why (V4).
    #[diesel(sql_type = Nullable<Text>)]
    pub crossed: Option<String>,
    /// The other live members' work at their last publications (P3), parallel to `workers`.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub member_loads: Option<Vec<i64>>,
    /// Their hottest buckets' loads, parallel to `workers`.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub member_hottest: Option<Vec<i64>>,
    /// The node's own work at its last publication.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub my_load: Option<i64>,
    /// The node's own hottest bucket's load then.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub my_hottest: Option<i64>,
    /// The claimable buckets with a load (P4), hottest first.
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub loaded_buckets: Option<Vec<i32>>,
    /// Their loads, parallel to `loaded_buckets`.
    #[diesel(sql_type = Nullable<Array<BigInt>>)]
    pub loaded_loads: Option<Vec<i64>>,
}

/// Make node `$2` a member of group `$1` under its live session `$3` (rules J1-J3). `$4` client
/// time. No row: no such group; `live` false: `$3` is not the node's live session (nothing
/// written); `joined`: a member row was created (the group's counter moved, it heard Joined).
///
/// The node row is share-locked: a renewal, a new session, or a claimer ending the session
/// waits for the join (and the join for them: its liveness is judged again once it holds the
/// lock, as in CLAIM). A new member's load counts the buckets of the group its session already
/// holds (one left behind by an eviction that skipped a fenced bucket), so loads stay exact;
/// likewise its count of the draining generation's buckets (`old_owned`, migration 10), as of
/// the group's generation in its snapshot (a resize committing meanwhile makes the view count
/// the member's old buckets instead: see `lease.group_view`).
pub(crate) const JOIN: &str = r#"
WITH grp AS (
    SELECT g.name, g.generation FROM lease.groups g WHERE g.name = $1
), me AS (
    SELECT n.session_id, n.expires_at FROM lease.nodes n, grp
     WHERE n.node_id = $2 AND n.session_id = $3
       AND n.expires_at > COALESCE($4, clock_timestamp())
       FOR SHARE OF n
), mine AS (
    SELECT me.session_id, c.t
      FROM me, (SELECT COALESCE($4, clock_timestamp()) AS t) AS c
     WHERE me.expires_at > c.t
), joined AS (
    INSERT INTO lease.members AS m
           (group_name, node_id, joined_at, owned, old_owned, old_generation)
    SELECT $1, $2, mine.t,
           (SELECT count(*) FROM lease.shards s
             WHERE s.group_name = $1 AND s.owner_session = mine.session_id),
           (SELECT count(*) FROM lease.draining_shards d
             WHERE d.group_name = $1 AND d.owner_session = mine.session_id),
           grp.generation
      FROM mine, grp
    ON CONFLICT (group_name, node_id) DO NOTHING
    RETURNING m.node_id
), bumped AS (
    UPDATE lease.group_changes c SET version = c.version + 1
     WHERE c.group_name = $1 AND EXISTS (SELECT 1 FROM joined)
)
SELECT EXISTS (SELECT 1 FROM mine) AS live, EXISTS (SELECT 1 FROM joined) AS joined,
       (SELECT count(pg_notify(lease.channel($1), 'J' || $2::text)) FROM joined) AS notified
  FROM grp
"#;

/// Row of [`JOIN`].
#[derive(QueryableByName, Debug)]
pub(crate) struct JoinRow {
    #[diesel(sql_type = Bool)]
    pub live: bool,
}

/// Claim up to `$3` claimable buckets for node `$2`'s live session `$5`: those the node last
/// held first (C9), then the others, each kind in its claim order (from `$6 % shard_count` up,
/// then from 0: C3), raising each one's token. `$1` group, `$2` node, `$3` how many, `$4`
/// client time, `$5` session, `$6` the node's claim seed, `$7` whether dead sessions' buckets
/// may be taken, `$8` if not null, only if the server's clock advanced by at most `$8` since
/// the session's last renewal (C7: otherwise `owners` is empty, so only unowned buckets are),
/// `$9` null, or the buckets the claim names (C12: only those, `$3` their number; C13: none
/// is taken if one is out of range, and the caller tells it by the shard count). No row: the group does not exist; a null session: `$5` is not the node's live session, or
/// the node is no member of the group (C1).
///
/// The node's row is share-locked first (a renewal, or a claimer ending the session, waits for
/// this claim; claims of the node in other groups do not), then its member row (its counter is
/// updated; an eviction waits). A claim that took something moves the group's change counter,
/// the last lock it takes: claims of one group that take buckets serialize there, from their
/// end to their commit. Its cost follows what it takes and the owners it inspects, never the
/// shard count:
///
/// - `owners` steps through the distinct owner sessions of the group, one descent of the owner
///   index each; the snapshot-based `NOT IN live` filter narrows them to suspects, and whether
///   a suspect is dead is decided once per session by `lease.owner_is_dead` on the latest
///   committed state, which also share-locks a dead owner's node row so that a racing renewal
///   waits and then finds itself expired.
/// - Candidates come from ordered index walks that each take at most what is still wanted and
///   skip rows other claimers hold (`FOR UPDATE SKIP LOCKED`): unowned buckets (a partial
///   index) and each dead session's buckets (the owner index), first from the start bucket up;
///   the walks below the start bucket run only for what the upper ones did not find. Workers
///   claiming at once start at different buckets, so they rarely walk over each other's
///   locked rows (when they all started at 0, the k-th of them stepped over the rows of the
///   k-1 before it, a cost growing with the number of workers times the share). The eight
///   walks are built from two templates, `unowned_walk` and `orphaned_walk`, so each rule a
///   walk obeys (below) is written once.
/// - Sticky claims (C9): the same walks run first for the buckets the node last held, unowned
///   ones with `last_node = $2` (their own partial index) and those of the node's own dead
///   sessions (a restart with a stable node id); the other walks then look only for what
///   those did not find, and skip the node's unowned buckets. `won` sets `last_node`.
/// - Quarantine (C10): every walk skips a bucket whose `quarantined_until` is after the
///   claim's clock reading. The condition is on the bucket row, which `lease.quarantine`
///   writes: a row quarantined after this statement's snapshot is re-checked by Postgres
///   against its new version when the walk locks it (as below), and one a quarantine in
///   flight holds is skipped. A check of `lease.quarantines` would use this statement's
///   snapshot and take a bucket quarantined after it.
/// - Cordoned or draining (C11): `may` is empty, so nothing is taken or written. The mode is
///   judged once the member row is locked, on the latest committed state
///   (`lease.may_claim`): a control of this member share-locks that row, so it either waits
///   for this claim to commit or commits before this claim holds the row and is seen.
/// - The first `$3` candidates (the sticky ones first, each kind in claim order) are taken;
///   the others stay locked only until this statement commits. A bucket row that another
///   session claimed after this statement's snapshot is re-checked by Postgres against its new
///   version, which is neither unowned nor a dead session's: it is skipped.
/// - While a resize drains (C8, Z5), an unowned bucket of the new generation is taken only if
///   no old bucket sharing keys with it (`old - new` divisible by `gcd(N, M)`: the same class
///   `bucket % gcd`) blocks it (`old_block`, the blocked classes, which the walks test with a
///   hashed `NOT IN`): one owned (not released) and, with takeover allowed, whose owner is not
///   judged dead or whose row another transaction holds (an open fencing transaction on the
///   old bucket: `FOR UPDATE SKIP LOCKED` in `old_dead`); with takeover deferred, any owned
///   one while some old owner lives. Each old owner's session is judged once
///   (`old_live_owners`, by `lease.owner_is_dead` on the latest committed state, over a loose
///   index scan of the old owners), never each old bucket: a merge from 65,536 buckets held
///   by three workers made every claim call that function 65,536 times (2 s); the old rows
///   are then read once, with no call per row. Dead owners' rows are locked only in classes
///   no live owner blocks anyway. One released after this statement's snapshot still blocks
///   (conservative). Once every old bucket is retired (`old_dead` covers every owned one) the
///   old generation's rows are deleted (`old_gone`). With no resize draining this costs one
///   index probe of `lease.draining_shards`.
/// - After a failover (`epoch`): nothing is taken while the server's timeline is unrecorded or
///   was first seen less than the longest ttl of the group's members' nodes ago, and every
///   token is raised to at least the timeline's floor.
/// - History (T1-T3, migration 9): the open tenure is the bucket row (owner, token, and
///   `updated_at`, the claim's time), so taking a free bucket writes no ring row. A bucket an
///   orphaned walk took ends its dead session's tenure as expired at the claim's time: `won`
///   raises the row's count of ended tenures, and `expired` writes the ended tenure into its
///   ring slot (`lease.tenures`, slot = count % 8) from the row's values as the walk locked
///   them (carried through `picked`).
pub(crate) static CLAIM: LazyLock<String> = LazyLock::new(|| {
    // What each pair of walks may still take: `$3` less what the walks before it found (the
    // lower walks run only for what the upper ones missed; `picked` keeps the first `$3`).
    let sticky_up = still_wanted(&[]);
    let sticky_down = still_wanted(&["sticky_up"]);
    let up = still_wanted(&["sticky"]);
    let down = still_wanted(&["sticky", "up"]);
    [
        CLAIM_HEAD.to_owned(),
        // C9 first: the unowned buckets this node last held (released or left) and those of
        // its own dead sessions, from the start bucket up, then below.
        unowned_walk("sticky_unowned_up", true, Side::Up, &sticky_up),
        orphaned_walk("sticky_orphaned_up", true, Side::Up, &sticky_up),
        union_all("sticky_up", &["sticky_unowned_up", "sticky_orphaned_up"]),
        unowned_walk("sticky_unowned_down", true, Side::Down, &sticky_down),
        orphaned_walk("sticky_orphaned_down", true, Side::Down, &sticky_down),
        union_all(
            "sticky",
            &["sticky_up", "sticky_unowned_down", "sticky_orphaned_down"],
        ),
        unowned_walk("unowned_up", false, Side::Up, &up),
        orphaned_walk("orphaned_up", false, Side::Up, &up),
        union_all("up", &["unowned_up", "orphaned_up"]),
        unowned_walk("unowned_down", false, Side::Down, &down),
        orphaned_walk("orphaned_down", false, Side::Down, &down),
        CLAIM_TAIL.to_owned(),
    ]
    .join(", ")
});

/// [`CLAIM`] up to its walks: the claimer's session and mode, the failover epoch, the dead
/// owners, the start bucket and the resize barrier (`old_block`).
const CLAIM_HEAD: &str = r#"
WITH RECURSIVE me AS (
    SELECT n.session_id, n.expires_at, n.heartbeat_at
      FROM lease.nodes n JOIN lease.members m ON m.group_name = $1 AND m.node_id = n.node_id
     WHERE n.node_id = $2 AND n.session_id = $5
       AND n.expires_at > COALESCE($4, clock_timestamp())
       FOR SHARE OF n FOR UPDATE OF m
), mine AS (
    -- Postgres tests the condition above before waiting for a lock another transaction holds
    -- (a claimer judging this session dead) and does not test it again if the row did not
    -- change: judge liveness again, once, now that the row is locked, and use that instant
    -- for the whole statement.
    SELECT me.session_id, me.expires_at, me.heartbeat_at, c.t
      FROM me, (SELECT COALESCE($4, clock_timestamp()) AS t) AS c
     WHERE me.expires_at > c.t
), may AS (
    -- C11: a cordoned or draining member claims nothing, judged on the latest committed
    -- state now that the member row is locked. C13: nor does a claim that names a bucket out
    -- of range (the caller tells it by the shard count returned).
    SELECT mine.t FROM mine WHERE lease.may_claim($1, $2)
       AND ($9::int[] IS NULL
            OR NOT EXISTS (SELECT 1 FROM unnest($9::int[]) AS named(b), lease.groups g
                            WHERE g.name = $1 AND (named.b < 0 OR named.b >= g.shard_count)))
), epoch AS (
    -- Failover: nothing is claimed until the server's timeline was first seen (by a heartbeat)
    -- one maximum ttl of the group's members ago, so that every worker of an old primary has
    -- fenced itself; tokens on timeline T are at least ((T - base) << 32) + 1, above every
    -- token of an earlier timeline. (No failover: the base timeline, no quiet period, floor 1.)
    SELECT ((e.timeline - (SELECT min(b.timeline) FROM lease.server_epochs b)) << 32) + 1
           AS floor
      FROM lease.server_epochs e, may, (SELECT lease.timeline() AS timeline) AS tl
     WHERE e.timeline = tl.timeline
       -- On the base timeline (first seen at -infinity) the members are not scanned.
       AND (e.first_seen = '-infinity'
            OR e.first_seen + COALESCE((SELECT max(y.expires_at - y.heartbeat_at)
                                          FROM lease.members x
                                          JOIN lease.nodes y ON y.node_id = x.node_id
                                         WHERE x.group_name = $1),
                                       interval '0') <= may.t)
), takes AS (
    -- C7: whether dead sessions' buckets may be taken (and retire old ones, C8) by this claim.
    SELECT ($7 AND ($8::interval IS NULL OR mine.t - mine.heartbeat_at <= $8)) AS dead
      FROM mine
), live AS (
    -- Set-shaped references to the CTEs only (joins, IN, EXISTS, count), never a scalar
    -- subquery that could return several rows: when a row a walk below locks was changed
    -- meanwhile, Postgres re-checks it and may run these CTEs again.
    SELECT y.session_id
      FROM lease.members x JOIN lease.nodes y ON y.node_id = x.node_id, mine
     WHERE x.group_name = $1 AND y.expires_at > mine.t
), owners AS (
    -- A loose index scan: the smallest owner session, then the next one above it, and so on.
    (SELECT s.owner_session, s.owner_node FROM lease.shards s
      WHERE s.group_name = $1 AND s.owner_session IS NOT NULL AND EXISTS (SELECT 1 FROM epoch)
        AND EXISTS (SELECT 1 FROM takes WHERE takes.dead)
      ORDER BY s.owner_session
      LIMIT 1)
    UNION ALL
    SELECT n.owner_session, n.owner_node
      FROM owners o,
           LATERAL (SELECT s.owner_session, s.owner_node FROM lease.shards s
                     WHERE s.group_name = $1 AND s.owner_session > o.owner_session
                     ORDER BY s.owner_session
                     LIMIT 1) AS n
), dead AS (
    -- A dead session's buckets were last held by its node (a claim sets both): the node's
    -- own earlier sessions' are sticky (C9).
    SELECT o.owner_session, o.owner_node = $2 AS sticky FROM owners o
     WHERE o.owner_session NOT IN (SELECT session_id FROM live)
       AND o.owner_session NOT IN (SELECT session_id FROM mine)
       AND lease.owner_is_dead($1, o.owner_node, o.owner_session, $4)
), start AS (
    SELECT $6 % g.shard_count AS b,
           gcd(g.shard_count, COALESCE(g.previous_count, g.shard_count)) AS g, may.t
      FROM lease.groups g, may WHERE g.name = $1
), old_owners AS (
    -- The draining generation's owner sessions (none without a resize in progress), one
    -- descent of its owner index each: a loose index scan, as `owners` does.
    (SELECT d.owner_session, d.owner_node FROM lease.draining_shards d, may
      WHERE d.group_name = $1 AND d.owner_session IS NOT NULL
      ORDER BY d.owner_session
      LIMIT 1)
    UNION ALL
    SELECT n.owner_session, n.owner_node
      FROM old_owners o,
           LATERAL (SELECT d.owner_session, d.owner_node FROM lease.draining_shards d
                     WHERE d.group_name = $1 AND d.owner_session > o.owner_session
                     ORDER BY d.owner_session
                     LIMIT 1) AS n
), old_live_owners AS (
    -- Judged live once per session, never once per bucket, on the latest committed state (a
    -- renewal in flight counts as live: owner_is_dead skips a node row it cannot lock).
    SELECT o.owner_session FROM old_owners o
     WHERE NOT lease.owner_is_dead($1, o.owner_node, o.owner_session, $4)
), old_owned AS (
    -- The draining generation's buckets not released, each with its class (mod gcd: the new
    -- buckets sharing keys with it are those of its class) and whether its owner is live.
    SELECT d.bucket, d.bucket % start.g AS r,
           d.owner_session IN (SELECT owner_session FROM old_live_owners) AS live
      FROM lease.draining_shards d, start
     WHERE d.group_name = $1 AND d.owner_session IS NOT NULL
), old_live AS (
    -- The classes an old bucket of a live owner holds back.
    SELECT DISTINCT o.r FROM old_owned o WHERE o.live
), old_dead AS (
    -- Retired by its owner's death, and held by no other transaction (a fencing transaction
    -- on the old bucket holds its children back until it ends). Only in the classes no live
    -- owner holds back (so never a live owner's bucket): a stopped owner's buckets are not
    -- locked by every claim while a live owner's hold their children back anyway.
    SELECT d.bucket FROM lease.draining_shards d
     WHERE d.group_name = $1 AND d.owner_session IS NOT NULL
       AND d.bucket IN (SELECT o.bucket FROM old_owned o
                         WHERE o.r NOT IN (SELECT r FROM old_live))
       FOR UPDATE OF d SKIP LOCKED
), old_block AS (
    -- The classes (mod gcd) whose new buckets wait: those of the live owners' old buckets,
    -- and those of dead owners' ones another transaction holds or, when this claim may not
    -- take dead sessions' buckets (C7), while some old owner lives.
    SELECT l.r FROM old_live l
    UNION
    SELECT o.r FROM old_owned o
     WHERE NOT o.live
       AND CASE WHEN EXISTS (SELECT 1 FROM takes WHERE takes.dead)
                THEN o.bucket NOT IN (SELECT bucket FROM old_dead)
                ELSE EXISTS (SELECT 1 FROM old_live) END
), old_gone AS (
    -- Every old bucket retired: the old generation goes.
    DELETE FROM lease.draining_shards d
     WHERE d.group_name = $1
       AND EXISTS (SELECT 1 FROM old_owned)
       AND NOT EXISTS (SELECT 1 FROM old_owned o WHERE o.bucket NOT IN (SELECT bucket FROM old_dead))
)"#;

/// [`CLAIM`] from its walks' candidates on: what is taken, and what that writes.
const CLAIM_TAIL: &str = r#"picked AS (
    SELECT c.bucket, c.orphaned, c.was_node, c.was_token, c.was_since
      FROM (SELECT bucket, orphaned, was_node, was_token, was_since, true AS sticky FROM sticky
            UNION ALL SELECT bucket, orphaned, was_node, was_token, was_since, false FROM up
            UNION ALL SELECT bucket, orphaned, was_node, was_token, was_since, false FROM unowned_down
            UNION ALL SELECT bucket, orphaned, was_node, was_token, was_since, false FROM orphaned_down) AS c, start
     ORDER BY c.sticky DESC, c.bucket < start.b, c.bucket
     LIMIT $3
), won AS (
    -- The counter counts ended tenures: raised only for a bucket whose dead session's tenure
    -- this claim ends (below); a free bucket's row is taken with no tenure write at all, its
    -- open tenure being the row itself (owner_node, token, updated_at).
    UPDATE lease.shards s
       SET owner_node = $2, owner_session = mine.session_id, last_node = $2,
           token = greatest(s.token + 1, epoch.floor), updated_at = mine.t,
           tenures = s.tenures + CASE WHEN picked.orphaned THEN 1 ELSE 0 END
      FROM picked, mine, epoch
     WHERE s.group_name = $1 AND s.bucket = picked.bucket
    RETURNING s.bucket, s.token, s.tenures, picked.orphaned, picked.was_node,
              picked.was_token, picked.was_since
), expired AS (
    -- T2, T3: a bucket taken from a session that is not live (an orphaned walk's): that
    -- session's tenure ends as expired at the claim's time, written into the ring slot of its
    -- number (the counter as won left it: the row's latest version, which Postgres re-reads
    -- when the row changed since this statement's snapshot), replacing the ended tenure 8
    -- before it. Owner, token and start are the row's as the walk locked it (carried through
    -- picked), before won changed them. No other statement writes the bucket's ring
    -- meanwhile: every writer holds the bucket row, which this claim holds to its commit.
    INSERT INTO lease.tenures AS t
           (group_name, bucket, slot, seq, token, owner_node, began_at, ended_at, reason)
    SELECT $1, won.bucket, won.tenures % 8, won.tenures, won.was_token, won.was_node,
           won.was_since, mine.t, 'expired'
      FROM won, mine
     WHERE won.orphaned
    ON CONFLICT (group_name, bucket, slot) DO UPDATE
       SET seq = excluded.seq, token = excluded.token, owner_node = excluded.owner_node,
           began_at = excluded.began_at, ended_at = excluded.ended_at, reason = excluded.reason
    RETURNING t.bucket
), counted AS (
    UPDATE lease.members m SET owned = m.owned + (SELECT count(*) FROM won)
     WHERE m.group_name = $1 AND m.node_id = $2 AND EXISTS (SELECT 1 FROM won)
), bumped AS (
    -- H8: a view of the group changed. Last: the counter's lock is held from here to commit.
    -- Counting the tenure ends runs them to completion first: Postgres runs the CTEs the
    -- query below does not read after it, in the reverse of their order here, so this one
    -- would otherwise lock the counter before them and hold it while they write.
    UPDATE lease.group_changes c SET version = c.version + 1
     WHERE c.group_name = $1 AND EXISTS (SELECT 1 FROM won)
       AND (SELECT count(*) FROM expired) >= 0
)
SELECT g.shard_count, mine.session_id, mine.expires_at,
       ARRAY(SELECT bucket FROM won ORDER BY bucket) AS buckets,
       ARRAY(SELECT token FROM won ORDER BY bucket) AS tokens
  FROM lease.groups g LEFT JOIN mine ON true
 WHERE g.name = $1
"#;

/// The columns every walk of [`CLAIM`] returns: a candidate bucket, whether a dead session
/// holds it, and if so that session's tenure (node, token, start) as the walk locked it.
const CANDIDATE: &str = "bucket, orphaned, was_node, was_token, was_since";

/// Where a walk of [`CLAIM`] looks: from the start bucket up, or below it.
#[derive(Clone, Copy)]
enum Side {
    Up,
    Down,
}

impl Side {
    fn condition(self) -> &'static str {
        match self {
            Side::Up => "s.bucket >= start.b",
            Side::Down => "s.bucket < start.b",
        }
    }
}

/// C10, in every walk: a bucket under quarantine at the claim's clock reading is skipped.
const NOT_QUARANTINED: &str = "(s.quarantined_until IS NULL OR s.quarantined_until <= start.t)";

/// C12, in every walk: when the claim names its buckets (`$9`, null for a claim by count),
/// only those.
const NAMED: &str = "($9::int[] IS NULL OR s.bucket = ANY($9::int[]))";

/// A walk's `LIMIT`: `$3` less the candidates the walks named found (never below 0: the
/// orphaned walks take up to their limit per dead session, so they may find more than `$3`).
fn still_wanted(found_before: &[&str]) -> String {
    if found_before.is_empty() {
        return "$3".to_owned();
    }
    let found: String = found_before
        .iter()
        .map(|cte| format!(" - (SELECT count(*) FROM {cte})"))
        .collect();
    format!("greatest($3{found}, 0)")
}

/// A walk of [`CLAIM`] over the group's unowned bucket rows (C4: an owned row is never a
/// candidate), in bucket order from `side`'s end: those the node last held (`sticky`, C9) or
/// the others, none under quarantine (C10), none until a failover's quiet period is over
/// (`epoch`), and no new bucket whose class the draining generation blocks (C8).
fn unowned_walk(name: &str, sticky: bool, side: Side, limit: &str) -> String {
    let last_node = if sticky {
        "s.last_node = $2"
    } else {
        "s.last_node IS DISTINCT FROM $2"
    };
    let side = side.condition();
    format!(
        r#"{name} AS (
    SELECT s.bucket, false AS orphaned, NULL::uuid AS was_node, NULL::bigint AS was_token,
           NULL::timestamptz AS was_since
      FROM lease.shards s, start
     WHERE s.group_name = $1 AND s.owner_session IS NULL AND {last_node}
       AND {side}
       AND {NOT_QUARANTINED}
       AND {NAMED}
       AND EXISTS (SELECT 1 FROM epoch)
       AND s.bucket % start.g NOT IN (SELECT r FROM old_block)
     ORDER BY s.bucket
     LIMIT {limit}
       FOR UPDATE OF s SKIP LOCKED
)"#
    )
}

/// A walk of [`CLAIM`] over each dead session's bucket rows (C4: only the rows of a session
/// `dead` judged dead), the node's own earlier sessions' (`sticky`, C9) or the others', in
/// bucket order from `side`'s end, none under quarantine (C10). `dead` is empty until a
/// failover's quiet period is over (`owners` tests `epoch`), and no barrier is needed: a new
/// bucket a dead session holds was claimed once its old buckets were retired.
fn orphaned_walk(name: &str, sticky: bool, side: Side, limit: &str) -> String {
    let which = if sticky { "d.sticky" } else { "NOT d.sticky" };
    let side = side.condition();
    format!(
        r#"{name} AS (
    SELECT o.bucket, true AS orphaned, o.owner_node AS was_node, o.token AS was_token,
           o.updated_at AS was_since
      FROM dead d, start,
           LATERAL (SELECT s.bucket, s.owner_node, s.token, s.updated_at FROM lease.shards s
                     WHERE s.group_name = $1 AND s.owner_session = d.owner_session
                       AND {side}
                       AND {NOT_QUARANTINED}
                       AND {NAMED}
                     ORDER BY s.bucket
                     LIMIT {limit}
                       FOR UPDATE OF s SKIP LOCKED) AS o
     WHERE {which}
)"#
    )
}

/// `name`, the candidates of `walks` as one set.
fn union_all(name: &str, walks: &[&str]) -> String {
    let selects: Vec<String> = walks
        .iter()
        .map(|walk| format!("SELECT {CANDIDATE} FROM {walk}"))
        .collect();
    format!("{name} AS (\n    {}\n)", selects.join("\n    UNION ALL "))
}

/// Row of [`CLAIM`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ClaimRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub session_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Array<Integer>)]
    pub buckets: Vec<i32>,
    #[diesel(sql_type = Array<BigInt>)]
    pub tokens: Vec<i64>,
}

/// Release those of `$3` that node `$2`'s live session `$5` owns, the node a member of the
/// group, in either generation, unless a bucket is out of range (then nothing is written and
/// `max_bucket >= range` tells why: the shard count, or while a resize drains the larger of it
/// and the old count). `$1` group, `$2` node, `$3` buckets (bigint[], any u32 fits), `$4`
/// client time, `$5` session. No row: no such group. Releasing an old bucket clears its owner
/// in `lease.draining_shards` (retiring it) and lowers the member's `old_owned`, not its
/// `owned` (new generation only). Each bucket asked for is found by its number (`asked`):
/// the cost follows the buckets asked for. Locks as CLAIM does; a release that released
/// something moves the group's change counter. Each bucket of the current generation it releases ends its tenure (T2:
/// `ended`), quarantined, drained or released; the owner's mode is read by `lease.mode_of`
/// once the member row is locked, the quarantine from the bucket row it updates.
pub(crate) const RELEASE: &str = r#"
WITH grp AS (
    SELECT g.shard_count,
           greatest(g.shard_count,
                    CASE WHEN EXISTS (
                        SELECT 1 FROM lease.draining_shards d
                          JOIN lease.members x
                            ON x.group_name = d.group_name AND x.node_id = d.owner_node
                          JOIN lease.nodes y
                            ON y.node_id = d.owner_node AND y.session_id = d.owner_session
                         WHERE d.group_name = $1 AND d.owner_session IS NOT NULL
                           AND y.expires_at > COALESCE($4, clock_timestamp()))
                         THEN g.previous_count ELSE 0 END) AS range
      FROM lease.groups g WHERE g.name = $1
), req AS (
    SELECT max(b) AS max_bucket FROM unnest($3::bigint[]) AS b
), me AS (
    SELECT n.session_id, n.expires_at
      FROM lease.nodes n JOIN lease.members m ON m.group_name = $1 AND m.node_id = n.node_id
     WHERE n.node_id = $2 AND n.session_id = $5
       AND n.expires_at > COALESCE($4, clock_timestamp())
       AND (SELECT COALESCE(max_bucket, -1) FROM req) < (SELECT range FROM grp)
       FOR SHARE OF n FOR UPDATE OF m
), mine AS (
    -- Liveness again once the row is locked (see CLAIM), at the instant the statement uses
    -- throughout.
    SELECT me.session_id, c.t
      FROM me, (SELECT COALESCE($4, clock_timestamp()) AS t) AS c
     WHERE me.expires_at > c.t
), asked AS (
    -- The buckets asked for, once each. Each is looked up by its number (an index probe per
    -- bucket: a release costs what it asks for), never matched against the whole list per
    -- owned row (`= ANY` of a parameter is a linear scan of the list: quadratic).
    SELECT DISTINCT a.b FROM unnest($3::bigint[]) AS a (b)
), freed AS (
    -- Rows another transaction holds (an application's fencing check) are skipped, not
    -- waited for: waiting could deadlock with that transaction's next check, and the caller
    -- retries what was not released. The held rows' owner, token and updated_at (the open
    -- tenure, as locked) are carried to `ended`; the count of ended tenures goes up by one.
    UPDATE lease.shards s
       SET owner_node = NULL, owner_session = NULL, updated_at = mine.t,
           tenures = s.tenures + 1
      FROM mine,
           (SELECT x.bucket, x.owner_node, x.token, x.updated_at
              FROM asked, mine AS m,
                   LATERAL (SELECT y.bucket, y.owner_node, y.token, y.updated_at
                              FROM lease.shards y
                             WHERE y.group_name = $1 AND y.bucket = asked.b
                               AND y.owner_session = m.session_id
                               FOR UPDATE OF y SKIP LOCKED) AS x) AS h
     WHERE s.group_name = $1 AND s.bucket = h.bucket
    RETURNING s.bucket, s.tenures, s.quarantined_until > mine.t AS quarantined,
              h.owner_node AS was_node, h.token AS was_token, h.updated_at AS was_since
), mode AS (
    -- T2: the owner's mode, judged on the latest committed state now that its member row is
    -- locked (lease.mode_of, a fresh snapshot), as a claim judges it (C11): a control of the
    -- member share-locks that row, so a drain this release waited for is seen, and one that
    -- waits for this release is not. Only when something was released.
    SELECT lease.mode_of($1, $2) AS mode FROM mine WHERE EXISTS (SELECT 1 FROM freed)
), ended AS (
    -- T2, T3: each released bucket's tenure ends at the release's time, written into the
    -- ring slot of its number (replacing the ended tenure 8 before it): quarantined if the
    -- bucket is under quarantine then (judged on the row `freed` updated, its latest
    -- version, which lease.quarantine writes: a quarantine committed after this statement's
    -- snapshot counts), else drained if the owner is draining, else released. The draining
    -- generation's buckets record nothing (T4).
    INSERT INTO lease.tenures AS t
           (group_name, bucket, slot, seq, token, owner_node, began_at, ended_at, reason)
    SELECT $1, f.bucket, f.tenures % 8, f.tenures, f.was_token, f.was_node, f.was_since,
           mine.t,
           CASE WHEN f.quarantined THEN 'quarantined'
                WHEN mode.mode = 'draining' THEN 'drained'
                ELSE 'released' END
      FROM freed f, mine, mode
    ON CONFLICT (group_name, bucket, slot) DO UPDATE
       SET seq = excluded.seq, token = excluded.token, owner_node = excluded.owner_node,
           began_at = excluded.began_at, ended_at = excluded.ended_at, reason = excluded.reason
    RETURNING t.bucket
), freed_old AS (
    UPDATE lease.draining_shards d
       SET owner_node = NULL, owner_session = NULL
     WHERE d.group_name = $1
       AND d.bucket IN (SELECT x.bucket
                          FROM asked, mine,
                               LATERAL (SELECT y.bucket FROM lease.draining_shards y
                                         WHERE y.group_name = $1 AND y.bucket = asked.b
                                           AND y.owner_session = mine.session_id
                                           FOR UPDATE OF y SKIP LOCKED) AS x)
    RETURNING d.bucket
), counted AS (
    -- The member's counts of both generations (the old one's never below 0: a binary of the
    -- release before it may have released old buckets without lowering it).
    UPDATE lease.members m
       SET owned = m.owned - (SELECT count(*) FROM freed),
           old_owned = greatest(m.old_owned - (SELECT count(*) FROM freed_old), 0)
     WHERE m.group_name = $1 AND m.node_id = $2
       AND (EXISTS (SELECT 1 FROM freed) OR EXISTS (SELECT 1 FROM freed_old))
), bumped AS (
    -- Last, after the tenure writes (counting them runs them to completion: see CLAIM).
    UPDATE lease.group_changes c SET version = c.version + 1
     WHERE c.group_name = $1
       AND (EXISTS (SELECT 1 FROM freed) OR EXISTS (SELECT 1 FROM freed_old))
       AND (SELECT count(*) FROM ended) >= 0
)
SELECT grp.shard_count, grp.range,
       ARRAY(SELECT bucket FROM freed UNION ALL SELECT bucket FROM freed_old
             ORDER BY bucket) AS buckets,
       (SELECT count(pg_notify(lease.channel($1), 'R' || $2::text))
          FROM (SELECT 1 WHERE EXISTS (SELECT 1 FROM freed)
                            OR EXISTS (SELECT 1 FROM freed_old)) AS x) AS notified
  FROM grp
"#;

/// Row of [`RELEASE`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ReleaseRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = Integer)]
    pub range: i32,
    #[diesel(sql_type = Array<Integer>)]
    pub buckets: Vec<i32>,
}

/// Leave a group: `lease.leave` (migration 7; migration 9 ends tenures) deletes node `$2`'s
/// member row of group `$1` if `$3` is its node's session (any session when `$3` is null),
/// releases the buckets of the group its live session holds, ending each one's tenure as left
/// (evicted when `$3` is null: T2), and deletes the node's row if it is a member of no group
/// any more (L1-L4). `$4` client time. A null `buckets`: no such group.
pub(crate) const LEAVE: &str = "SELECT lease.leave($1, $2, $3, $4) AS buckets";

/// Row of [`LEAVE`].
#[derive(QueryableByName, Debug)]
pub(crate) struct LeaveRow {
    #[diesel(sql_type = Nullable<Array<Integer>>)]
    pub buckets: Option<Vec<i32>>,
}

/// An operator's control of a member (K1-K3): `lease.control` (migration 8) sets node `$2`'s
/// weight (`$3`, when not null) or mode (`$4`, when not null) in group `$1`. A null outcome: no
/// such group; 0: the node is no member and has no control stored there (K2); 1: the value
/// was the one stored (nothing written); 2: set (the counter moved, 'C' notified). It
/// share-locks the member row (claims of the member serialize with it) and reads the stored
/// value under the control row's lock (concurrent controls of one member lose nothing).
pub(crate) const CONTROL: &str = "SELECT lease.control($1, $2, $3, $4) AS outcome";

/// Row of [`CONTROL`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ControlRow {
    #[diesel(sql_type = Nullable<Integer>)]
    pub outcome: Option<i32>,
}

/// A node's own weight (K4): `lease.control` for node `$2`'s weight `$3` in group `$1`, only
/// while `$4` is the node's live session (`$5` client time) and the node a member. Liveness is
/// judged on a clock read once the node row is share-locked, and `lease.control` key-share
/// locks the member row: a heartbeat that starts the node's next session (which locks the node
/// row and deletes the member rows) waits until this commits, so a weight judged under a
/// session is never written after the next one began. Either lock alone orders the two (the
/// race test holds with the node row's lock removed). `found` false: no such group; `outcome` null: not
/// the node's live session or not a member (nothing written); otherwise as [`CONTROL`].
pub(crate) const SET_WEIGHT: &str = r#"
WITH me AS (
    SELECT n.expires_at FROM lease.nodes n
     WHERE n.node_id = $2 AND n.session_id = $4
       FOR SHARE OF n
), live AS (
    SELECT 1 FROM me JOIN lease.members m ON m.group_name = $1 AND m.node_id = $2
     WHERE me.expires_at > COALESCE($5, clock_timestamp())
)
SELECT EXISTS (SELECT 1 FROM lease.groups g WHERE g.name = $1) AS found,
       CASE WHEN EXISTS (SELECT 1 FROM live) THEN lease.control($1, $2, $3, NULL) END
           AS outcome
"#;

/// Row of [`SET_WEIGHT`].
#[derive(QueryableByName, Debug)]
pub(crate) struct SetWeightRow {
    #[diesel(sql_type = diesel::sql_types::Bool)]
    pub found: bool,
    #[diesel(sql_type = Nullable<Integer>)]
    pub outcome: Option<i32>,
}

/// A bucket's quarantine (Q1-Q4): `lease.quarantine` (migration 8) puts bucket `$2` of group
/// `$1` under quarantine for `$3` from the store's time (`$4` client time), or lifts it (`$3`
/// null). No row: no such group; otherwise the group's count (a bucket at or above it was out
/// of range: nothing written) and whether anything changed.
pub(crate) const QUARANTINE: &str =
    "SELECT q.shard_count, q.changed FROM lease.quarantine($1, $2, $3, $4, $5) AS q";

/// Row of [`QUARANTINE`].
#[derive(QueryableByName, Debug)]
pub(crate) struct QuarantineRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = Bool)]
    pub changed: bool,
}

/// A hand-over (HO1, HO2): `lease.hand_over` (migration 8) hands node `$1`'s live session of
/// incarnation `$2` over to the node id's next process, expiring `$3` after the store's time
/// (`$4` client time). Null: nothing written (no live session, or another incarnation's);
/// otherwise the new expiry. It locks the node row, judges liveness on a clock read under
/// that lock, and moves the change counters of the node's groups in the heartbeat's order.
pub(crate) const HAND_OVER: &str = "SELECT lease.hand_over($1, $2, $3, $4) AS expires_at";

/// Row of [`HAND_OVER`].
#[derive(QueryableByName, Debug)]
pub(crate) struct HandOverRow {
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
}

/// A bucket's history (T1-T5): the group's shard count, and the last 8 tenures of bucket `$2`
/// of group `$1`'s current generation, oldest first (by `seq`): when the bucket row has an
/// owner (a live session's or a dead one's), the last 7 ended tenures of its ring and the open
/// one, which is the row itself (owner, token, begun at `updated_at`, numbered one past the
/// ended ones); otherwise the last 8 ended. No row: no such group; one row with a null
/// `owner_node`: the group, and no tenure (a bucket at or above the count, T5, or one never
/// claimed). One statement, one snapshot: the count, the row and the ring agree (a resize
/// deletes the group's tenures in the transaction that changes the count). Reads only: a role
/// that may read `lease.groups`, `lease.shards` and `lease.tenures` runs it (a monitor's).
pub(crate) const HISTORY: &str = r#"
SELECT g.shard_count, h.owner_node, h.token, h.began_at, h.ended_at, h.reason
  FROM lease.groups g
  LEFT JOIN lease.shards s
    ON s.group_name = g.name AND s.bucket = $2 AND $2 < g.shard_count
  LEFT JOIN LATERAL (
      (SELECT t.seq, t.owner_node, t.token, t.began_at, t.ended_at, t.reason
         FROM lease.tenures t
        WHERE t.group_name = g.name AND t.bucket = s.bucket
        ORDER BY t.seq DESC
        LIMIT CASE WHEN s.owner_node IS NULL THEN 8 ELSE 7 END)
      UNION ALL
      SELECT s.tenures + 1, s.owner_node, s.token, s.updated_at, NULL, NULL
       WHERE s.owner_node IS NOT NULL
  ) AS h ON true
 WHERE g.name = $1
 ORDER BY h.seq
"#;

/// Row of [`HISTORY`].
#[derive(QueryableByName, Debug)]
pub(crate) struct HistoryRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub owner_node: Option<Uuid>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub token: Option<i64>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub began_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub ended_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub reason: Option<String>,
}

/// The fencing check. `$1` group, `$2` bucket, `$3` worker, `$4` token, `$5` client time.
pub(crate) const IS_CURRENT: &str = "SELECT lease.is_current($1, $2, $3, $4, $5) AS current";

/// Row of [`IS_CURRENT`].
#[derive(QueryableByName, Debug)]
pub(crate) struct IsCurrentRow {
    #[diesel(sql_type = Bool)]
    pub current: bool,
}

/// The store's time for a snapshot. `$1` client time.
pub(crate) const NOW: &str = "SELECT COALESCE($1, clock_timestamp()) AS now";

/// Row of [`NOW`].
#[derive(QueryableByName, Debug)]
pub(crate) struct NowRow {
    #[diesel(sql_type = Timestamptz)]
    pub now: DateTime<Utc>,
}

/// A group's member rows with their nodes' sessions and their controls (K1: weight 1 and
/// active without a row), by node id. `$1` group.
pub(crate) const SNAPSHOT_MEMBERS: &str = r#"
SELECT m.node_id, n.session_id, m.joined_at, n.heartbeat_at, n.expires_at, m.owned, n.metadata,
       COALESCE(k.weight, 1) AS weight, COALESCE(k.mode, 'active') AS mode, m.load, m.hottest
  FROM lease.members m JOIN lease.nodes n ON n.node_id = m.node_id
  LEFT JOIN lease.member_controls k ON k.group_name = m.group_name AND k.node_id = m.node_id
 WHERE m.group_name = $1
 ORDER BY m.node_id
"#;

/// Row of [`SNAPSHOT_MEMBERS`].
#[derive(QueryableByName, Debug)]
pub(crate) struct SnapshotMemberRow {
    #[diesel(sql_type = SqlUuid)]
    pub node_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub session_id: Uuid,
    #[diesel(sql_type = Timestamptz)]
    pub joined_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub heartbeat_at: DateTime<Utc>,
    #[diesel(sql_type = Timestamptz)]
    pub expires_at: DateTime<Utc>,
    #[diesel(sql_type = Integer)]
    pub owned: i32,
    #[diesel(sql_type = Text)]
    pub metadata: String,
    #[diesel(sql_type = Integer)]
    pub weight: i32,
    #[diesel(sql_type = Text)]
    pub mode: String,
    /// Its work at its last publication (P3).
    #[diesel(sql_type = BigInt)]
    pub load: i64,
    /// Its hottest bucket's load then.
    #[diesel(sql_type = BigInt)]
    pub hottest: i64,
}

/// Every node row (whether its session was handed over too) with the groups it is a member of
/// (sorted by bytes), by node id, and the store's time. `$1` client time.
pub(crate) const NODES: &str = r#"
SELECT c.now, n.node_id, n.session_id, n.started_at, n.heartbeat_at, n.expires_at, n.metadata,
       n.handed_over, n.crossed,
       ARRAY(SELECT m.group_name FROM lease.members m WHERE m.node_id = n.node_id
              ORDER BY m.group_name COLLATE "C") AS groups
  FROM (SELECT COALESCE($1, clock_timestamp()) AS now) AS c
  LEFT JOIN lease.nodes n ON true
 ORDER BY n.node_id
"#;

/// Row of [`NODES`]; the node columns are null when there is no node at all.
#[derive(QueryableByName, Debug)]
pub(crate) struct NodeRow {
    #[diesel(sql_type = Timestamptz)]
    pub now: DateTime<Utc>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub node_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub session_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub started_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub heartbeat_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    pub expires_at: Option<DateTime<Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub metadata: Option<String>,
    #[diesel(sql_type = Nullable<Bool>)]
    pub handed_over: Option<bool>,
    /// How the session came through the last failover (migration 11).
    #[diesel(sql_type = Nullable<Text>)]
    pub crossed: Option<String>,
    #[diesel(sql_type = Array<Text>)]
    pub groups: Vec<String>,
}

/// The NOTIFY channel of a group. `$1` group.
pub(crate) const CHANNEL: &str = "SELECT lease.channel($1) AS channel";

/// Row of [`CHANNEL`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ChannelRow {
    #[diesel(sql_type = Text)]
    pub channel: String,
}

/// Row holding one shard count ([`ENSURE_GROUP`], [`GROUP_SHARD_COUNT`]).
#[derive(QueryableByName, Debug)]
pub(crate) struct ShardCountRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
}

/// [`resize`](lease_core::AdminStore::resize), first statement of its transaction: lock the
/// group's row (resizes of one group serialize here; claims never wait for it) and count the
/// old buckets still owned by a session judged live on the latest committed state, each
/// session judged once (a loose index scan of the old owners, as in CLAIM), not each bucket.
/// `$1` group, `$2` client time. No row: no such group.
pub(crate) const RESIZE_LOCK: &str = r#"
WITH RECURSIVE old_owners AS (
    (SELECT d.owner_session, d.owner_node FROM lease.draining_shards d
      WHERE d.group_name = $1 AND d.owner_session IS NOT NULL
      ORDER BY d.owner_session
      LIMIT 1)
    UNION ALL
    SELECT n.owner_session, n.owner_node
      FROM old_owners o,
           LATERAL (SELECT d.owner_session, d.owner_node FROM lease.draining_shards d
                     WHERE d.group_name = $1 AND d.owner_session > o.owner_session
                     ORDER BY d.owner_session
                     LIMIT 1) AS n
), old_live_owners AS (
    SELECT o.owner_session FROM old_owners o
     WHERE NOT lease.owner_is_dead($1, o.owner_node, o.owner_session, $2)
)
SELECT g.shard_count, g.generation, g.previous_count,
       (SELECT count(*) FROM lease.draining_shards d
         WHERE d.group_name = $1
           AND d.owner_session IN (SELECT owner_session FROM old_live_owners)) AS draining
  FROM lease.groups g WHERE g.name = $1
   FOR UPDATE OF g
"#;

/// Row of [`RESIZE_LOCK`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ResizeLockRow {
    #[diesel(sql_type = Integer)]
    pub shard_count: i32,
    #[diesel(sql_type = BigInt)]
    pub generation: i64,
    #[diesel(sql_type = Nullable<Integer>)]
    pub previous_count: Option<i32>,
    #[diesel(sql_type = BigInt)]
    pub draining: i64,
}

/// [`resize`](lease_core::AdminStore::resize), second statement, once [`RESIZE_LOCK`] found
/// the count `$2` and nothing draining: drop the retired old generation, if any, and lift
/// every quarantine of the group (Q4: bucket numbers change meaning; the new bucket rows open
/// without one). `$1` group. The quarantine rows go before the bucket rows move, the order
/// `lease.quarantine` locks them in (its row, then the bucket's).
pub(crate) const RESIZE_DROP_OLD: &str = r#"
WITH lifted AS (
    DELETE FROM lease.quarantines q WHERE q.group_name = $1
)
DELETE FROM lease.draining_shards d WHERE d.group_name = $1
"#;

/// [`resize`](lease_core::AdminStore::resize), third statement: move the current bucket rows
/// into `lease.draining_shards` with their owners and tokens. `$1` group.
///
/// The move is a `DELETE ... RETURNING`: it waits for a claim holding a bucket row and moves
/// the row as that claim left it, never as a snapshot saw it (a claim committed meanwhile
/// would otherwise own an old bucket the draining generation calls unowned, and its children
/// would not wait for it). Claims that start meanwhile skip the rows it holds.
pub(crate) const RESIZE_MOVE: &str = r#"
WITH moved AS (
    DELETE FROM lease.shards s WHERE s.group_name = $1
    RETURNING s.bucket, s.owner_node, s.owner_session, s.token
)
INSERT INTO lease.draining_shards (group_name, bucket, owner_node, owner_session, token)
SELECT $1, m.bucket, m.owner_node, m.owner_session, m.token FROM moved m
"#;

/// [`resize`](lease_core::AdminStore::resize), last statement: delete the group's tenures
/// (T4), open `$3` unowned rows, each starting at the highest token of its parents (Z4: the
/// old buckets congruent to it mod gcd) and at tenure 0, bump the generation, zero the
/// members' loads (they count the new generation; what each held becomes its count of old
/// buckets, which the heartbeat's view sums instead of counting them) and wake the group. `$1` group, `$2` from,
/// `$3` to, `$4` client time.
pub(crate) const RESIZE_OPEN: &str = r#"
WITH cleared AS (
    -- T4: the new generation starts with no history. In a statement after RESIZE_MOVE, whose
    -- snapshot is taken once the move has waited for every claim, release and leave holding a
    -- bucket row: the tenures they wrote are all seen here, and none is written after it (the
    -- moved rows stay locked to this commit, the new ones are not visible before it).
    DELETE FROM lease.tenures t WHERE t.group_name = $1
), classes AS (
    SELECT d.bucket % gcd($2::integer, $3::integer) AS r, max(d.token) AS token
      FROM lease.draining_shards d WHERE d.group_name = $1 GROUP BY 1
), opened AS (
    INSERT INTO lease.shards (group_name, bucket, token, updated_at)
    SELECT $1, b, COALESCE(c.token, 0), COALESCE($4, clock_timestamp())
      FROM generate_series(0, $3 - 1) AS b
      LEFT JOIN classes c ON c.r = b % gcd($2::integer, $3::integer)
), grp AS (
    UPDATE lease.groups g
       SET shard_count = $3, previous_count = $2, generation = g.generation + 1
     WHERE g.name = $1
    RETURNING g.generation
), loads AS (
    -- Loads count the new generation; the buckets a member held move into the draining
    -- generation, and its count of those (`old_owned`, of this generation) is what it held.
    UPDATE lease.members m
       SET owned = 0, old_owned = m.owned, old_generation = grp.generation
      FROM grp
     WHERE m.group_name = $1
)
SELECT grp.generation,
       (SELECT count(pg_notify(lease.channel($1), 'Z' || x.g::text))
          FROM (SELECT grp.generation AS g) AS x) AS notified
  FROM grp
"#;

/// Row of [`RESIZE_OPEN`].
#[derive(QueryableByName, Debug)]
pub(crate) struct ResizeOpenRow {
    #[diesel(sql_type = BigInt)]
    pub generation: i64,
}

/// [`resize`](lease_core::AdminStore::resize), after [`RESIZE_OPEN`]: move the group's change
/// counter (H8). A statement of its own, the transaction's last: every statement takes that
/// row's lock last, so a resize holding the group's row, bucket rows and member rows never
/// waits for a claim that holds the counter and waits for one of those. `$1` group.
pub(crate) const RESIZE_BUMP: &str =
    "UPDATE lease.group_changes SET version = version + 1 WHERE group_name = $1";
