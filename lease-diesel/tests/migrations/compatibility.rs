//! Versions and compatibility: newer additive migrations are accepted and breaking ones
//! refused, each recorded with its compatibility, and the engine's statements survive added
//! columns.

use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel_async::AsyncPgConnection;
use lease_core::{MemberMetadata, NodeId, Takeover};
use lease_diesel::{Compatibility, ExtraMigration, MIGRATIONS, PgSetupError, ops};

use crate::db::{connect, exec, flag, group, member_on, names, objects, shards, store, ttl_ms};
use crate::support::process;

/// Columns, with defaults or nullable, on each of the engine's tables, and an index: what a
/// newer release might add (a drain request, a paused bucket, a group's note).
const ADD_COLUMNS: &str = "
    ALTER TABLE lease.members ADD COLUMN drain_requested_at timestamptz;
    ALTER TABLE lease.shards ADD COLUMN paused boolean NOT NULL DEFAULT false;
    ALTER TABLE lease.groups ADD COLUMN note text NOT NULL DEFAULT '';
    CREATE INDEX members_draining_idx ON lease.members (group_name)
        WHERE drain_requested_at IS NOT NULL;
";

/// A migration of a newer release, as its runner would apply it.
fn newer(version: &str, up: &str, compatibility: Compatibility) -> ExtraMigration {
    ExtraMigration {
        version: version.to_owned(),
        name: format!("{version}_test_{}", compatibility.as_str()),
        up: up.to_owned(),
        compatibility,
    }
}

fn additive() -> ExtraMigration {
    newer("29990101000001", ADD_COLUMNS, Compatibility::Additive)
}

fn breaking() -> ExtraMigration {
    newer(
        "29990101000002",
        "COMMENT ON TABLE lease.shards IS 'a breaking change, for the test'",
        Compatibility::Breaking,
    )
}

/// `version: additive` for every row of the version table.
async fn recorded(conn: &mut AsyncPgConnection) -> Vec<String> {
    names(
        conn,
        "SELECT version || ': ' || additive AS name FROM lease.engine_migrations ORDER BY version",
    )
    .await
}

/// A build accepts a schema with newer additive migrations (reporting them) and needs its own;
/// a breaking migration it does not know makes it refuse the schema, and its `migrate` writes
/// nothing. Each migration is recorded with its compatibility.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_additive_migrations_are_accepted_and_breaking_ones_refused() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let this = store(&db.url);
    let (add, brk) = (additive(), breaking());

    match this.schema_status_with(std::slice::from_ref(&add)).await {
        Err(PgSetupError::SchemaOutdated { missing }) => {
            assert_eq!(missing, std::slice::from_ref(&add.version))
        }
        other => panic!("a newer build before its migration: got {other:?}"),
    }
    assert_eq!(
        this.migrate_with(std::slice::from_ref(&add))
            .await
            .expect("the newer release migrates"),
        [add.version.as_str()]
    );
    let status = this
        .schema_status()
        .await
        .expect("this build on the newer schema");
    assert_eq!(status.newer_additive, [add.version.as_str()]);
    assert_eq!(status.applied.last(), Some(&add.version));
    this.check_schema().await.expect("check_schema accepts it");
    let before = objects(&mut admin).await;
    assert!(
        this.migrate()
            .await
            .expect("this build's migrate")
            .is_empty()
    );
    assert_eq!(objects(&mut admin).await, before, "a no-op migrate wrote");
    assert_eq!(
        this.schema_status_with(std::slice::from_ref(&add))
            .await
            .expect("the newer build")
            .newer_additive,
        Vec::<String>::new()
    );

    assert_eq!(
        this.migrate_with(&[add.clone(), brk.clone()])
            .await
            .expect("a breaking migration"),
        [brk.version.as_str()]
    );
    for (what, result) in [
        ("check", this.check_schema().await),
        ("migrate", this.migrate().await.map(drop)),
    ] {
        match result {
            Err(e @ PgSetupError::SchemaNewer { .. }) => {
                assert!(!e.is_transient());
                let text = e.to_string();
                assert!(
                    text.contains(&brk.version) && text.contains("upgrade"),
                    "{text}"
                );
                assert!(
                    !text.contains(&add.version),
                    "an additive one is named: {text}"
                );
            }
            other => panic!("{what} with a newer breaking migration: got {other:?}"),
        }
    }
    let before = objects(&mut admin).await;
    let versions = recorded(&mut admin).await;
    assert!(matches!(
        this.migrate().await,
        Err(PgSetupError::SchemaNewer { .. })
    ));
    assert_eq!(objects(&mut admin).await, before);
    assert_eq!(recorded(&mut admin).await, versions);
    this.schema_status_with(&[add.clone(), brk.clone()])
        .await
        .expect("the build that knows it");

    let mut want: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
        .expect("the migrations")
        .iter()
        .map(|m| {
            let name = m.name().to_string();
            // As the migrations' first lines say.
            let additive = !["create_lease_schema", "node_sessions", "operators_controls"]
                .iter()
                .any(|breaking| name.ends_with(breaking));
            format!("{}: {additive}", m.name().version())
        })
        .collect();
    want.sort();
    want.push(format!("{}: true", add.version));
    want.push(format!("{}: false", brk.version));
    assert_eq!(recorded(&mut admin).await, want);
}

/// A version table made before migrations carried their compatibility (no `additive`
/// column) still serves the check; its rows count as breaking to a build that does not know
/// them; it gets the column when a runner next records a migration, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_table_from_before_the_rule_gets_its_column_when_a_migration_is_recorded() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(
        &mut admin,
        "ALTER TABLE lease.engine_migrations DROP COLUMN additive",
    )
    .await;
    let has_column = "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                       WHERE table_schema = 'lease' AND table_name = 'engine_migrations'
                         AND column_name = 'additive') AS yes";
    let this = store(&db.url);
    this.check_schema().await.expect("an old version table");
    assert!(this.migrate().await.expect("nothing to do").is_empty());
    assert!(
        !flag(&mut admin, has_column).await,
        "a no-op migrate altered it"
    );

    exec(
        &mut admin,
        "INSERT INTO lease.engine_migrations (version, name) VALUES ('29990101000009', 'old')",
    )
    .await;
    match this.check_schema().await {
        Err(PgSetupError::SchemaNewer { unknown }) => assert_eq!(unknown, ["29990101000009"]),
        other => panic!("an unknown row without a compatibility: got {other:?}"),
    }
    exec(
        &mut admin,
        "DELETE FROM lease.engine_migrations WHERE version = '29990101000009'",
    )
    .await;

    let add = additive();
    assert_eq!(
        this.migrate_with(std::slice::from_ref(&add))
            .await
            .expect("migrate"),
        [add.version.as_str()]
    );
    assert!(flag(&mut admin, has_column).await);
    let rows = recorded(&mut admin).await;
    assert_eq!(rows.last(), Some(&format!("{}: true", add.version)));
    assert!(
        rows[..rows.len() - 1]
            .iter()
            .all(|r| r.ends_with(": false"))
    );
    assert_eq!(
        this.schema_status().await.expect("check").newer_additive,
        [add.version]
    );
}

/// Every statement of the engine, prepared on a connection before columns are added to each
/// of its tables, runs on that connection afterwards: they name their columns, so a cached
/// plan never changes its result type ("cached plan must not change result type").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engines_statements_survive_added_columns_on_connections_that_prepared_them() {
    let db = lease_testdb::database().await;
    let mut conn = connect(&db.url).await;
    let g = group("prepared");
    let me = NodeId::new();
    let round = async |conn: &mut AsyncPgConnection| {
        // Twice: creating, then finding the group, are two statements.
        for _ in 0..2 {
            ops::ensure_group(conn, None, &g, shards(4))
                .await
                .expect("ensure");
        }
        let beat = member_on(conn, &g, me, ttl_ms(30_000)).await;
        // A full view, then the same group answered "unchanged" (H8's path).
        let full = ops::heartbeat(
            conn,
            None,
            me,
            process(me),
            ttl_ms(30_000),
            &MemberMetadata::empty(),
            &[],
        )
        .await
        .expect("heartbeat with a view");
        let seen: Vec<lease_core::GroupStamp> = full
            .groups
            .iter()
            .map(|b| lease_core::GroupStamp {
                group: b.group.clone(),
                stamp: b.stamp,
            })
            .collect();
        let steady = ops::heartbeat(
            conn,
            None,
            me,
            process(me),
            ttl_ms(30_000),
            &MemberMetadata::empty(),
            &seen,
        )
        .await
        .expect("a steady heartbeat");
        assert_eq!(steady.unchanged.len(), 1, "the steady heartbeat's answer");
        let won = ops::claim(conn, None, &g, me, beat.session, 4, Takeover::Allowed)
            .await
            .expect("claim");
        assert_eq!(won.len(), 4);
        assert!(
            ops::is_current(conn, None, &g, won[0].bucket, me, won[0].token)
                .await
                .expect("is_current")
        );
        ops::release(conn, None, &g, me, beat.session, &[won[0].bucket])
            .await
            .expect("release");
        let snap = ops::snapshot(conn, None, &g).await.expect("snapshot");
        assert_eq!(snap.members.len(), 1);
        let nodes = ops::nodes(conn, None).await.expect("nodes");
        assert!(!nodes.nodes.is_empty(), "the node is listed");
        ops::leave(conn, None, &g, me, beat.session)
            .await
            .expect("leave");
    };
    round(&mut conn).await;
    store(&db.url)
        .migrate_with(&[additive()])
        .await
        .expect("the additive migration");
    round(&mut conn).await;
    round(&mut conn).await;
}

/// Runners of this build and of a newer one, and checks, at once on a migrated database: the
/// newer migration is applied once, every runner and check succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_runners_of_two_releases_and_checks() {
    let db = lease_testdb::database().await;
    let add = additive();
    let mut tasks = Vec::new();
    for i in 0..9 {
        let (s, add) = (store(&db.url), add.clone());
        tasks.push(tokio::spawn(async move {
            match i % 3 {
                0 => s.migrate_with(&[add]).await,
                1 => s.migrate().await,
                _ => s.check_schema().await.map(|()| Vec::new()),
            }
        }));
    }
    let mut applied = Vec::new();
    for t in tasks {
        applied.extend(
            t.await
                .expect("task")
                .expect("a concurrent runner or check"),
        );
    }
    assert_eq!(applied, [add.version.as_str()]);
    let mut admin = connect(&db.url).await;
    assert_eq!(
        recorded(&mut admin)
            .await
            .iter()
            .filter(|r| r.starts_with(&add.version))
            .count(),
        1
    );
}
