//! Upgrades from the previous release (migrations 7 to 13, each undone with its `down.sql`):
//! the rows it left are kept and the roles its `leasectl grant` set up keep working.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Integer, Timestamptz};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use lease_core::{
    AdminStore, Bucket, FencingToken, GroupName, MemberMetadata, NodeId, ShardCount, Takeover,
    Timestamp, Ttl, WorkerStore,
};
use lease_diesel::ops;
use lease_diesel::privileges::{self, RoleKind, RoleName};

use crate::db::{connect, exec, flag, member_on, store};
use crate::roles::{REVOKE_PUBLIC_DEFAULTS, make_role, url_as};
use crate::support;
use crate::support::process;

/// The newest migrations' versions and `down.sql`, newest first: what a test undoes to stand
/// where the previous release left the schema.
const DOWNS: &[(&str, &str)] = &[
    (
        "20261211000013",
        include_str!("../../../migrations/2026-12-11-000013_bucket_loads/down.sql"),
    ),
    (
        "20261210000012",
        include_str!("../../../migrations/2026-12-10-000012_quarantine_reasons/down.sql"),
    ),
    (
        "20261209000011",
        include_str!(
            "../../../migrations/2026-12-09-000011_sessions_kept_across_failovers/down.sql"
        ),
    ),
    (
        "20261208000010",
        include_str!("../../../migrations/2026-12-08-000010_draining_counts/down.sql"),
    ),
    (
        "20261207000009",
        include_str!("../../../migrations/2026-12-07-000009_bucket_history/down.sql"),
    ),
    (
        "20261206000008",
        include_str!("../../../migrations/2026-12-06-000008_operators_controls/down.sql"),
    ),
    (
        "20261205000007",
        include_str!("../../../migrations/2026-12-05-000007_node_sessions/down.sql"),
    ),
];

/// The objects each of [`DOWNS`]' migrations added, as the privilege list names them: the
/// previous release's grants are today's without them.
const ADDED: &[(&str, &[&str])] = &[
    ("20261211000013", &[]),
    (
        "20261210000012",
        &["lease.quarantine(text, bigint, interval, timestamptz, text)"],
    ),
    (
        "20261209000011",
        &[
            "lease.wal_offset(",
            "lease.revivable(",
            "lease.record_timeline(",
            "timestamptz[], uuid, bigint, bigint)",
        ],
    ),
    ("20261208000010", &[]),
    ("20261207000009", &["lease.tenures", "lease.mode_of("]),
    (
        "20261206000008",
        &[
            "lease.member_controls",
            "lease.quarantines",
            "lease.may_claim(",
            "lease.control(",
            "lease.quarantine(",
            "lease.hand_over(",
        ],
    ),
    (
        "20261205000007",
        &[
            "lease.nodes",
            "lease.group_changes",
            "lease.heartbeat(",
            "lease.group_view(",
            "lease.leave(",
            "lease.renewal_too_late(",
        ],
    ),
];

/// Undo the engine's migrations from the newest down to `version` included, each with its
/// `down.sql`, and forget their versions: the schema of the release before `version`.
/// Undo only the migration `version` with its `down.sql`, and forget its version: for a test
/// whose statements need the later migrations' objects (`down.sql` files of later migrations
/// do not depend on it).
async fn undo_only(admin: &mut AsyncPgConnection, version: &str) {
    let Some((v, down)) = DOWNS.iter().find(|(v, _)| *v == version) else {
        panic!("no down.sql for {version}");
    };
    exec(admin, down).await;
    exec(
        admin,
        &format!("DELETE FROM lease.engine_migrations WHERE version = '{v}'"),
    )
    .await;
}

async fn undo_through(admin: &mut AsyncPgConnection, version: &str) {
    for (v, down) in DOWNS {
        exec(admin, down).await;
        exec(
            admin,
            &format!("DELETE FROM lease.engine_migrations WHERE version = '{v}'"),
        )
        .await;
        if *v == version {
            return;
        }
    }
    panic!("no down.sql for {version}");
}

/// The grants of `kind` the release before migration `version` printed: today's, less the
/// objects `version` and later migrations added (the old lease.members, which migration 7
/// replaces, was granted as the new one is).
fn grants_before(kind: RoleKind, role: &RoleName, version: &str) -> Vec<String> {
    let newer: Vec<&str> = ADDED
        .iter()
        .filter(|(v, _)| *v >= version)
        .flat_map(|(_, objects)| objects.iter().copied())
        .collect();
    privileges::grants(kind, role)
        .into_iter()
        .filter(|g| !newer.iter().any(|new| g.contains(new)))
        .collect()
}

/// Migration 7 (node sessions) under its documented rollout (stop the old workers, migrate,
/// start the new ones): a worker role set up by the previous release's `leasectl grant` runs
/// the new release's heartbeats, joins and claims once migrated (the migration gives such
/// roles what the node statements use). Migration 5 did the same for its objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_worker_roles_of_the_previous_release_working() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    // The previous release's schema: migrations 8 and 7 undone.
    undo_through(&mut admin, "20261205000007").await;
    let role = make_role(&mut admin, &db.name, "oldwkr", "").await;
    let name = RoleName::new(&role).expect("a role name");
    let previous = grants_before(RoleKind::Worker, &name, "20261205000007");
    exec(&mut admin, &previous.join("\n")).await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.nodes') IS NULL AND to_regclass('lease.group_changes') IS NULL AS yes"
        )
        .await,
        "migration 7 is not undone: the test would prove nothing"
    );

    store(&db.url).migrate().await.expect("migrate");

    let worker = store(&url_as(&db.url, &role));
    let g = GroupName::new("upgraded").expect("name");
    worker
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group as the old worker role");
    let me = NodeId::new();
    let beat = support::beat_as(
        &worker,
        &g,
        me,
        lease_core::Incarnation::new(),
        Ttl::from_secs(10).expect("ttl"),
        &MemberMetadata::empty(),
    )
    .await
    .expect("a heartbeat as the old worker role");
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(won.len(), 4);
    let missing = store(&db.url)
        .missing_privileges(&name, RoleKind::Worker)
        .await
        .expect("checking the role");
    assert!(missing.is_empty(), "the role lacks {missing:?}");
}

/// Migration 8 (operators' controls) under its documented rollout: what the previous release
/// left is kept (sessions, owners, tokens; each owned bucket's last owner is its owner), its
/// `down.sql` undoes it and migrating again restores it, and roles set up by the previous
/// release's `leasectl grant` run the new release: a worker role its heartbeats, claims,
/// controls and quarantines (the migration grants them the new tables and functions, and the
/// heartbeat again, which it drops and creates), a monitor role its snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_8_keeps_the_rows_and_the_roles_of_the_previous_release() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("controlled").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(30).expect("ttl");
    // Claims from bucket 0: it holds 0 and 1.
    let held = support::worker();
    let beat = support::beat(&owner, &g, held, ttl, &MemberMetadata::empty())
        .await
        .expect("a member");
    let won = owner
        .claim(&g, held, beat.session, 2, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 2);

    // The previous release's schema, and its roles.
    undo_through(&mut admin, "20261206000008").await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.member_controls') IS NULL
                    AND to_regclass('lease.quarantines') IS NULL
                    AND to_regprocedure('lease.hand_over(uuid, uuid, interval, timestamptz)')
                        IS NULL
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'shards'
                                       AND column_name IN ('last_node', 'quarantined_until'))
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'nodes'
                                       AND column_name = 'handed_over')
                    AS yes"
        )
        .await,
        "migration 8 is not undone: the test would prove nothing"
    );
    let worker_role = make_role(&mut admin, &db.name, "m8wkr", "").await;
    let monitor_role = make_role(&mut admin, &db.name, "m8mon", "").await;
    let (worker_name, monitor_name) = (
        RoleName::new(&worker_role).expect("a role name"),
        RoleName::new(&monitor_role).expect("a role name"),
    );
    let mut previous = grants_before(RoleKind::Worker, &worker_name, "20261206000008");
    previous.extend(grants_before(
        RoleKind::Monitor,
        &monitor_name,
        "20261206000008",
    ));
    exec(&mut admin, &previous.join("\n")).await;

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        [
            "20261206000008",
            "20261207000009",
            "20261208000010",
            "20261209000011",
            "20261210000012",
            "20261211000013"
        ],
        "only migrations 8 to 13 (undone with it) were missing"
    );
    // From here the roles hold only what they were granted, by the previous release's grants
    // and by the migration (Postgres lets PUBLIC execute every new function by default).
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    assert!(
        flag(
            &mut admin,
            &format!(
                "SELECT count(*) FILTER (WHERE last_node = '{held}') = 2
                        AND count(*) FILTER (WHERE last_node IS NULL) = 2
                        AND bool_and(quarantined_until IS NULL) AS yes
                   FROM lease.shards WHERE group_name = 'controlled'"
            ),
        )
        .await,
        "each owned bucket's last owner is its owner, the others have none"
    );
    assert!(
        flag(
            &mut admin,
            "SELECT count(*) = 1 AND bool_and(NOT handed_over) AS yes FROM lease.nodes",
        )
        .await,
        "the previous release's session is kept, not handed over"
    );
    let snap = owner.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.live_leases()
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        won.iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        "the migration moved a bucket"
    );

    let worker = store(&url_as(&db.url, &worker_role));
    let me = NodeId::new();
    let beat = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a heartbeat as the old worker role");
    assert_eq!(beat.view.members.len(), 2);
    worker
        .control(
            &g,
            me,
            lease_core::MemberControl::Weight(lease_core::Weight::new(3).expect("weight")),
        )
        .await
        .expect("a control as the old worker role");
    worker
        .quarantine(
            &g,
            Bucket(3),
            Some(lease_core::QuarantineFor::new(Duration::from_secs(60)).expect("duration")),
        )
        .await
        .expect("a quarantine as the old worker role");
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(
        won.iter().map(|l| l.bucket).collect::<Vec<_>>(),
        [Bucket(2)],
        "the free bucket, not the quarantined one"
    );
    let view = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a view as the old worker role")
        .view;
    assert_eq!(view.quarantined, 1);
    assert_eq!(
        view.members
            .iter()
            .find(|m| m.worker == me)
            .map(|m| m.weight),
        Some(3)
    );
    let monitor = store(&url_as(&db.url, &monitor_role));
    let snap = monitor
        .snapshot(&g)
        .await
        .expect("a snapshot as the old monitor role");
    assert!(snap.buckets[3].quarantined_until.is_some());
    assert_eq!(snap.view(), view);
    // The worker role hands its session over (HO1: only the incarnation holding it), a monitor
    // role sees it handed over, and the node's next process takes it over (HO3).
    assert!(
        worker
            .hand_over(me, lease_core::Incarnation::new(), ttl)
            .await
            .expect("a hand-over as the old worker role")
            .is_none(),
        "another incarnation's session was handed over"
    );
    assert!(
        worker
            .hand_over(me, support::process(me), ttl)
            .await
            .expect("a hand-over as the old worker role")
            .is_some(),
        "the live session was not handed over"
    );
    let listed = monitor
        .nodes()
        .await
        .expect("nodes as the old monitor role");
    assert!(listed.nodes.iter().any(|n| n.node == me && n.handed_over));
    let next = worker
        .heartbeat(
            me,
            lease_core::Incarnation::new(),
            ttl,
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("the next process's heartbeat as the old worker role");
    assert_eq!((next.session, next.new_session), (beat.session, false));
    for (name, kind) in [
        (&worker_name, RoleKind::Worker),
        (&monitor_name, RoleKind::Monitor),
    ] {
        let missing = owner
            .missing_privileges(name, kind)
            .await
            .expect("checking the role");
        assert!(missing.is_empty(), "{kind} role {name} lacks {missing:?}");
    }
}

/// Migration 9 (a bucket's history), additive: it keeps every row, and each owned bucket shows
/// its current tenure with no ring row written for it (the open tenure is the bucket row: its
/// owner and token, begun at its `updated_at`, which the claim that took it wrote), none for a
/// bucket released before it; its `down.sql` undoes it; and roles set up by the previous
/// release's `leasectl grant` run the new release: a worker role's claims, releases and leaves
/// (an eviction too) end tenures into the ring (the migration grants it the table and
/// `lease.mode_of`; `lease.leave` keeps its grant), a monitor role reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_9_gives_owned_buckets_their_tenure_and_keeps_the_roles() {
    use lease_core::EndReason::{Evicted, Left, Released};
    #[derive(QueryableByName)]
    struct Claimed {
        #[diesel(sql_type = Integer)]
        bucket: i32,
        #[diesel(sql_type = Timestamptz)]
        updated_at: Timestamp,
    }
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("remembered").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(4).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(30).expect("ttl");
    let held = support::worker();
    let beat = support::beat(&owner, &g, held, ttl, &MemberMetadata::empty())
        .await
        .expect("a member");
    let won = owner
        .claim(&g, held, beat.session, 3, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 3);
    let gone = won[2].bucket;
    assert_eq!(
        owner
            .release(&g, held, beat.session, &[gone])
            .await
            .expect("release"),
        [gone]
    );
    let claimed: Vec<Claimed> = diesel::sql_query(
        "SELECT bucket, updated_at FROM lease.shards
          WHERE group_name = 'remembered' AND owner_node IS NOT NULL ORDER BY bucket",
    )
    .load(&mut admin)
    .await
    .expect("the owned buckets");
    assert_eq!(claimed.len(), 2);

    // The previous release's schema, and its roles.
    undo_through(&mut admin, "20261207000009").await;
    assert!(
        flag(
            &mut admin,
            "SELECT to_regclass('lease.tenures') IS NULL
                    AND to_regprocedure('lease.mode_of(text, uuid)') IS NULL
                    AND NOT EXISTS (SELECT 1 FROM information_schema.columns
                                     WHERE table_schema = 'lease' AND table_name = 'shards'
                                       AND column_name = 'tenures')
                    AS yes"
        )
        .await,
        "migration 9 is not undone: the test would prove nothing"
    );
    let worker_role = make_role(&mut admin, &db.name, "m9wkr", "").await;
    let monitor_role = make_role(&mut admin, &db.name, "m9mon", "").await;
    let (worker_name, monitor_name) = (
        RoleName::new(&worker_role).expect("a role name"),
        RoleName::new(&monitor_role).expect("a role name"),
    );
    let mut previous = grants_before(RoleKind::Worker, &worker_name, "20261207000009");
    previous.extend(grants_before(
        RoleKind::Monitor,
        &monitor_name,
        "20261207000009",
    ));
    exec(&mut admin, &previous.join("\n")).await;

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        [
            "20261207000009",
            "20261208000010",
            "20261209000011",
            "20261210000012",
            "20261211000013"
        ],
        "only migrations 9 to 13 (undone with it) were missing"
    );
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let monitor = store(&url_as(&db.url, &monitor_role));
    let history = async |bucket: Bucket| {
        monitor
            .history(&g, bucket)
            .await
            .expect("history as the old monitor role")
            .iter()
            .map(|t| (t.owner, t.token, t.began_at, t.ended.map(|e| e.reason)))
            .collect::<Vec<_>>()
    };
    for (lease, row) in won.iter().zip(&claimed) {
        assert_eq!(lease.bucket.0 as i32, row.bucket);
        assert_eq!(
            history(lease.bucket).await,
            [(held, lease.token, row.updated_at, None)],
            "owned bucket {}",
            row.bucket
        );
    }
    assert_eq!(
        history(gone).await,
        [],
        "a bucket released before the migration"
    );
    let snap = owner.snapshot(&g).await.expect("snapshot");
    assert_eq!(
        snap.live_leases()
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        won[..2]
            .iter()
            .map(|l| (l.bucket, l.owner, l.token))
            .collect::<Vec<_>>(),
        "the migration moved a bucket"
    );

    // The old worker role: a new node claims what is free, releases one, leaves; the first
    // node is evicted.
    let worker = store(&url_as(&db.url, &worker_role));
    let me = NodeId::new();
    let beat = support::beat(&worker, &g, me, ttl, &MemberMetadata::empty())
        .await
        .expect("a heartbeat as the old worker role");
    let mine = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("a claim as the old worker role");
    assert_eq!(mine.len(), 2, "the two free buckets");
    assert_eq!(
        worker
            .release(&g, me, beat.session, &[mine[0].bucket])
            .await
            .expect("a release as the old worker role"),
        [mine[0].bucket]
    );
    assert_eq!(
        worker
            .leave(&g, me, beat.session)
            .await
            .expect("a leave as the old worker role"),
        [mine[1].bucket]
    );
    assert_eq!(
        worker
            .evict(&g, held)
            .await
            .expect("an eviction as the old worker role")
            .len(),
        2
    );
    let ended = |h: Vec<(NodeId, FencingToken, Timestamp, _)>| {
        h.into_iter()
            .map(|(w, t, _, e)| (w, t, e))
            .collect::<Vec<_>>()
    };
    for l in &won[..2] {
        assert_eq!(
            ended(history(l.bucket).await),
            [(held, l.token, Some(Evicted))]
        );
    }
    let reasons = [Released, Left];
    for (l, reason) in mine.iter().zip(reasons) {
        assert_eq!(
            ended(history(l.bucket).await),
            [(me, l.token, Some(reason))],
            "bucket {}",
            l.bucket.0
        );
    }
    for (name, kind) in [
        (&worker_name, RoleKind::Worker),
        (&monitor_name, RoleKind::Monitor),
    ] {
        let missing = owner
            .missing_privileges(name, kind)
            .await
            .expect("checking the role");
        assert!(missing.is_empty(), "{kind} role {name} lacks {missing:?}");
    }
}

/// Old rows of `lease.draining_shards` read (index entries and sequential reads) by `node`'s
/// heartbeat giving every view, on `conn` in a transaction of its own, and the view's count of
/// old buckets not retired in `g`.
async fn draining_seen_by(
    conn: &mut AsyncPgConnection,
    g: &GroupName,
    node: NodeId,
    ttl: Ttl,
) -> (u32, i64) {
    #[derive(QueryableByName)]
    struct Read {
        #[diesel(sql_type = diesel::sql_types::BigInt)]
        n: i64,
    }
    const READ: &str = "SELECT (pg_stat_get_xact_tuples_returned('lease.draining_shards'::regclass)
                               + (SELECT COALESCE(sum(pg_stat_get_xact_tuples_returned(i.indexrelid)), 0)
                                    FROM pg_index i
                                   WHERE i.indrelid = 'lease.draining_shards'::regclass))::bigint
                              AS n";
    exec(conn, "BEGIN").await;
    let before = diesel::sql_query(READ)
        .get_result::<Read>(conn)
        .await
        .expect("rows read")
        .n;
    let beat = ops::heartbeat(
        conn,
        None,
        node,
        process(node),
        ttl,
        &MemberMetadata::empty(),
        &[],
    )
    .await
    .expect("heartbeat");
    let after = diesel::sql_query(READ)
        .get_result::<Read>(conn)
        .await
        .expect("rows read")
        .n;
    exec(conn, "COMMIT").await;
    (beat.group(g).expect("a view").view.draining, after - before)
}

/// Migration 10 under its documented rollout, in the middle of a drain: member rows get the
/// count of their sessions' old buckets, so the view's `draining` is the same before and after
/// the migration and no longer reads the others' old rows; its `down.sql` gives back the
/// previous view. A member whose count is not of the group's generation (as a resize by a
/// binary of the previous release leaves it) is counted row by row, rightly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_10_counts_the_old_buckets_of_a_drain_in_progress() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let owner = store(&db.url);
    let g = GroupName::new("merging").expect("name");
    owner
        .ensure_group(&g, ShardCount::new(64).expect("count"))
        .await
        .expect("ensure_group");
    let ttl = Ttl::from_secs(600).expect("ttl");
    let (a, b, idle) = (support::worker(), support::worker(), support::worker());
    for w in [a, b, idle] {
        member_on(&mut admin, &g, w, ttl).await;
    }
    for w in [a, b] {
        let session = support::beat(&owner, &g, w, ttl, &MemberMetadata::empty())
            .await
            .expect("heartbeat")
            .session;
        let won = owner
            .claim(&g, w, session, 32, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), 32);
    }
    owner
        .resize(
            &g,
            ShardCount::new(64).expect("count"),
            ShardCount::new(4).expect("count"),
        )
        .await
        .expect("resize");
    let a_beat = support::beat(&owner, &g, a, ttl, &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    let some: Vec<Bucket> = a_beat.owned.iter().take(5).map(|l| l.bucket).collect();
    assert_eq!(
        owner
            .release(&g, a, a_beat.session, &some)
            .await
            .expect("release"),
        some
    );

    // Only migration 10: the heartbeat of this release (migration 11's) stays to be called.
    undo_only(&mut admin, "20261208000010").await;
    assert!(
        flag(
            &mut admin,
            "SELECT NOT EXISTS (SELECT 1 FROM information_schema.columns
                                 WHERE table_schema = 'lease' AND table_name = 'members'
                                   AND column_name IN ('old_owned', 'old_generation')) AS yes"
        )
        .await,
        "migration 10 is not undone: the test would prove nothing"
    );
    let (counted, read) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59);
    assert!(
        read >= 59,
        "the previous view counts the old rows: {read} read"
    );

    assert_eq!(
        owner.migrate().await.expect("migrate"),
        ["20261208000010"],
        "only migration 10 was missing"
    );
    let (counted, read) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59, "the counts the migration set");
    assert!(read <= 4, "{read} old rows read with the counts set");

    // A count of another generation is not used: the member's rows are counted.
    exec(
        &mut admin,
        &format!(
            "UPDATE lease.members SET old_owned = 1000, old_generation = NULL
              WHERE node_id = '{}'",
            b.as_uuid()
        ),
    )
    .await;
    let (counted, _) = draining_seen_by(&mut admin, &g, idle, ttl).await;
    assert_eq!(counted, 59, "a count of no known generation was used");
}
