//! Least privilege: monitor and worker roles run on exactly the privileges listed for them,
//! the list covers every object of schema `lease`, and what a role lacks is named.

use std::collections::BTreeSet;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use lease_core::{AdminStore, MemberMetadata, NodeId, Takeover, WorkerStore};
use lease_diesel::PgSetupError;
use lease_diesel::privileges::{self, Grant, Object, RoleKind, RoleName};

use crate::db::{
    connect, engine_versions, exec, flag, group, names, objects, schema_exists, shards, store,
    ttl_ms, wait_server_past,
};
use crate::roles::{REVOKE_PUBLIC_DEFAULTS, fresh_role, make_role, role_of_kind, url_as};
use crate::support;

/// A monitoring role with the monitor's privileges, whose transactions are read-only (as on a
/// hot standby), checks the schema and reads a group; nothing is created anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monitor_role_on_a_read_only_connection_checks_and_reads() {
    let db = lease_testdb::database().await;
    let owner = store(&db.url);
    let g = group("watched");
    owner.ensure_group(&g, shards(4)).await.expect("ensure");
    let me = NodeId::new();
    let beat = support::beat(&owner, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    owner
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("claim");

    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let role = role_of_kind(&mut admin, &db.name, "mon", RoleKind::Monitor).await;
    exec(
        &mut admin,
        &format!("ALTER ROLE {role} SET default_transaction_read_only = on"),
    )
    .await;
    let url = url_as(&db.url, &role);
    let mut as_role = connect(&url).await;
    assert!(
        flag(
            &mut as_role,
            "SELECT current_setting('transaction_read_only') = 'on' AS yes"
        )
        .await,
        "the role's connections are not read-only: the test would prove nothing"
    );
    assert!(
        as_role
            .batch_execute("SET transaction_read_only = off; DELETE FROM lease.members")
            .await
            .is_err(),
        "the monitor may delete members: the test would prove nothing"
    );
    let before = objects(&mut admin).await;

    let monitor = store(&url);
    monitor
        .check_schema()
        .await
        .expect("check as a monitor role");
    let snap = monitor
        .snapshot(&g)
        .await
        .expect("snapshot as a monitor role");
    assert!(snap.buckets.iter().all(|b| b.owner == Some(me)));
    assert_eq!(objects(&mut admin).await, before);
}

/// A worker's role with exactly the worker's privileges (PUBLIC's defaults revoked, no right
/// to create anything) runs every operation and every path of the engine's statements: the
/// start-up check, a claim judging a dead owner (which share-locks its member row), a
/// heartbeat removing a dead member's row, releases, operators' controls and quarantines,
/// leaves, wake-ups, fencing, snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_role_with_the_workers_privileges_runs_the_engine() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let role = role_of_kind(&mut admin, &db.name, "wkr", RoleKind::Worker).await;
    assert!(
        !flag(
            &mut admin,
            &format!(
                "SELECT has_database_privilege('{role}', current_database(), 'CREATE')
                     OR EXISTS (SELECT 1 FROM pg_namespace n
                                 WHERE has_schema_privilege('{role}', n.oid, 'CREATE')) AS yes"
            ),
        )
        .await,
        "the worker role may create something: the test would prove less"
    );
    let before = objects(&mut admin).await;
    let worker = store(&url_as(&db.url, &role));
    worker
        .check_schema()
        .await
        .expect("check as the worker role");
    let g = group("work");
    worker.ensure_group(&g, shards(4)).await.expect("ensure");
    worker
        .ensure_group(&g, shards(4))
        .await
        .expect("ensure an existing group");
    let (short, me) = (NodeId::new(), NodeId::new());
    let brief = support::beat(&worker, &g, short, ttl_ms(300), &MemberMetadata::empty())
        .await
        .expect("a short-lived member joins");
    let held = worker
        .claim(&g, short, brief.session, 2, Takeover::Allowed)
        .await
        .expect("the short-lived member claims");
    assert_eq!(held.len(), 2);
    let beat = support::beat(&worker, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("heartbeat");
    wait_server_past(&mut admin, brief.expires_at).await;
    // The dead member's row is still there: the claim judges it dead in lease.owner_is_dead,
    // share-locking it.
    let won = worker
        .claim(&g, me, beat.session, 4, Takeover::Allowed)
        .await
        .expect("claim");
    assert_eq!(won.len(), 4, "the free and the dead member's buckets");
    support::beat(&worker, &g, me, ttl_ms(30_000), &MemberMetadata::empty())
        .await
        .expect("a heartbeat removing the dead member");
    assert_eq!(
        worker.snapshot(&g).await.expect("snapshot").members.len(),
        1,
        "the dead member's row was not removed"
    );
    assert!(
        worker
            .is_current(&g, won[0].bucket, me, won[0].token)
            .await
            .expect("is_current")
    );
    worker
        .release(&g, me, beat.session, &[won[0].bucket])
        .await
        .expect("release");
    // Operators' controls: a weight, a cordon and its lift (a claim judging the mode), a
    // quarantine and its lift.
    let weight = lease_core::MemberControl::Weight(lease_core::Weight::new(2).expect("weight"));
    worker.control(&g, me, weight).await.expect("a weight");
    for mode in [
        lease_core::MemberMode::Cordoned,
        lease_core::MemberMode::Active,
    ] {
        worker
            .control(&g, me, lease_core::MemberControl::Mode(mode))
            .await
            .expect("a mode");
        worker
            .claim(&g, me, beat.session, 1, Takeover::Allowed)
            .await
            .expect("a claim under a mode");
    }
    let minute = lease_core::QuarantineFor::new(Duration::from_secs(60)).expect("duration");
    worker
        .quarantine(&g, won[1].bucket, Some(minute))
        .await
        .expect("a quarantine");
    worker
        .quarantine(&g, won[1].bucket, None)
        .await
        .expect("a lift");
    worker.changes(&g).await.expect("changes");
    worker.leave(&g, me, beat.session).await.expect("leave");
    assert!(
        worker
            .snapshot(&g)
            .await
            .expect("snapshot")
            .members
            .is_empty()
    );
    assert_eq!(objects(&mut admin).await, before);
}

/// The objects of schema `lease` (relations and functions, as `relation lease.x`,
/// `sequence lease.x`, `function lease.f(args)`) that the privilege list does not account
/// for, and the list's entries that name nothing in the database.
async fn uncovered(conn: &mut AsyncPgConnection) -> (Vec<String>, Vec<String>) {
    let in_schema: BTreeSet<String> = names(
        conn,
        "SELECT CASE c.relkind WHEN 'S' THEN 'sequence ' ELSE 'relation ' END
                || c.oid::regclass::text AS name
           FROM pg_class c
          WHERE c.relnamespace = 'lease'::regnamespace
            AND c.relkind IN ('r', 'p', 'v', 'm', 'f', 'S')
         UNION ALL
         SELECT 'function ' || p.oid::regprocedure::text
           FROM pg_proc p WHERE p.pronamespace = 'lease'::regnamespace",
    )
    .await
    .into_iter()
    .collect();
    let mut listed = BTreeSet::new();
    let mut dangling = Vec::new();
    for object in privileges::objects() {
        let (label, lookup) = match object {
            Object::Schema(name) => {
                if !flag(
                    conn,
                    &format!("SELECT to_regnamespace('{name}') IS NOT NULL AS yes"),
                )
                .await
                {
                    dangling.push(format!("schema {name}"));
                }
                continue;
            }
            Object::Table(name) => ("relation", format!("to_regclass('{name}')::text")),
            Object::Sequence(name) => ("sequence", format!("to_regclass('{name}')::text")),
            Object::Function(sig) => ("function", format!("to_regprocedure('{sig}')::text")),
        };
        let found = names(
            conn,
            &format!("SELECT {lookup} AS name WHERE {lookup} IS NOT NULL"),
        )
        .await;
        match found.into_iter().next() {
            Some(canonical) => {
                listed.insert(format!("{label} {canonical}"));
            }
            None => dangling.push(format!("{object}")),
        }
    }
    let missing = in_schema.difference(&listed).cloned().collect();
    (missing, dangling)
}

/// Every table, sequence and function of schema `lease` after migrating is in the privilege
/// list (decided: which kinds of role need what on it), and everything the list names exists:
/// a migration that adds an object fails here until the grants say who may use it. The
/// check itself is shown to notice an object added to the schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_grants_cover_every_object_of_schema_lease() {
    let db = lease_testdb::empty_database().await;
    store(&db.url).migrate().await.expect("migrate");
    let mut admin = connect(&db.url).await;
    let (missing, dangling) = uncovered(&mut admin).await;
    assert!(
        missing.is_empty(),
        "objects of schema lease that lease_diesel::privileges does not cover: {missing:?}. \
         Add each to its list (NEEDS in lease-diesel/src/privileges.rs) with what each kind of \
         role needs on it (nothing, if only the owner uses it), and the README's table of roles"
    );
    assert!(
        dangling.is_empty(),
        "lease_diesel::privileges names objects the migrations do not create: {dangling:?}"
    );

    exec(
        &mut admin,
        "CREATE TABLE lease.drain_requests (worker uuid PRIMARY KEY);
         CREATE SEQUENCE lease.drain_seq;
         CREATE FUNCTION lease.drain(p uuid) RETURNS void LANGUAGE sql AS $$ SELECT $$;",
    )
    .await;
    let (missing, _) = uncovered(&mut admin).await;
    assert_eq!(
        missing,
        [
            "function lease.drain(uuid)",
            "relation lease.drain_requests",
            "sequence lease.drain_seq",
        ],
        "the coverage check missed new objects"
    );
}

/// What a role lacks is named object by object and privilege by privilege; a role that does
/// not exist is an error of its own; granting gives exactly what was missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_privileges_name_what_a_role_lacks() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    exec(&mut admin, REVOKE_PUBLIC_DEFAULTS).await;
    let owner = store(&db.url);
    let bare = make_role(&mut admin, &db.name, "bare", "").await;
    let bare = RoleName::new(&bare).expect("a name");
    for kind in RoleKind::ALL {
        assert_eq!(
            owner
                .missing_privileges(&bare, kind)
                .await
                .expect("missing privileges"),
            privileges::required(kind),
            "a role without grants lacks everything a {kind} needs"
        );
    }

    let granted = owner
        .grant_privileges(&bare, RoleKind::Worker)
        .await
        .expect("granting as the owner");
    assert_eq!(granted, privileges::grants(RoleKind::Worker, &bare));
    for kind in RoleKind::ALL {
        assert_eq!(
            owner
                .missing_privileges(&bare, kind)
                .await
                .expect("missing"),
            [],
            "a worker's role is a {kind} too"
        );
    }

    exec(
        &mut admin,
        &format!("REVOKE UPDATE ON lease.shards FROM {}", bare.as_str()),
    )
    .await;
    assert_eq!(
        owner
            .missing_privileges(&bare, RoleKind::Worker)
            .await
            .expect("missing"),
        [Grant {
            on: Object::Table("lease.shards"),
            privileges: vec!["UPDATE"],
        }]
    );
    // The check is read-only: the role itself may ask.
    let as_bare = store(&url_as(&db.url, bare.as_str()));
    assert_eq!(
        as_bare
            .missing_privileges(&bare, RoleKind::Monitor)
            .await
            .expect("asking about itself"),
        []
    );

    // A role that holds the privileges without the grant option cannot pass them on: Postgres
    // only warns, and nothing is granted.
    let other = RoleName::new(&make_role(&mut admin, &db.name, "other", "").await).expect("name");
    exec(
        &mut admin,
        &format!("GRANT UPDATE ON lease.shards TO {}", bare.as_str()),
    )
    .await;
    match as_bare.grant_privileges(&other, RoleKind::Worker).await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("owner of schema lease"), "{e}");
        }
        other => panic!("granting as a non-owner: got {other:?}"),
    }
    assert_eq!(
        owner
            .missing_privileges(&other, RoleKind::Worker)
            .await
            .expect("missing"),
        privileges::required(RoleKind::Worker),
        "a refused grant left something granted"
    );

    let ghost = RoleName::new(&fresh_role("ghost")).expect("a name");
    for result in [
        owner.missing_privileges(&ghost, RoleKind::Worker).await,
        owner
            .grant_privileges(&ghost, RoleKind::Worker)
            .await
            .map(|_| Vec::new()),
    ] {
        match result {
            Err(e @ PgSetupError::UnknownRole { .. }) => {
                assert!(e.to_string().contains(ghost.as_str()), "{e}")
            }
            other => panic!("an unknown role: got {other:?}"),
        }
    }
}

/// Missing, older and newer schemas, and a role that may not read the schema, are typed,
/// permanent, and say what to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_mismatches_are_typed_and_say_what_to_do() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let store = store(&db.url);
    let all = engine_versions();
    let newest = all.last().expect("a migration").clone();

    exec(
        &mut admin,
        &format!("DELETE FROM lease.engine_migrations WHERE version = '{newest}'"),
    )
    .await;
    match store.check_schema().await {
        Err(e @ PgSetupError::SchemaOutdated { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("run `leasectl migrate`"), "{e}");
            let PgSetupError::SchemaOutdated { missing } = e else {
                unreachable!()
            };
            assert_eq!(missing, vec![newest.clone()]);
        }
        other => panic!("an older schema: got {other:?}"),
    }
    exec(
        &mut admin,
        &format!(
            "INSERT INTO lease.engine_migrations (version, name) VALUES \
             ('{newest}', 'back'), ('29991231000000', 'from_the_future')"
        ),
    )
    .await;
    match store.check_schema().await {
        Err(e @ PgSetupError::SchemaNewer { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("upgrade"), "{e}");
        }
        other => panic!("a newer schema: got {other:?}"),
    }
    let before = objects(&mut admin).await;
    match store.migrate().await {
        Err(PgSetupError::SchemaNewer { unknown }) => assert_eq!(unknown, ["29991231000000"]),
        other => panic!("migrate on a newer schema: got {other:?}"),
    }
    assert_eq!(objects(&mut admin).await, before);
    exec(
        &mut admin,
        "DELETE FROM lease.engine_migrations WHERE version = '29991231000000'",
    )
    .await;
    store.check_schema().await.expect("as it was");

    let role = make_role(&mut admin, &db.name, "nousage", "").await;
    match self::store(&url_as(&db.url, &role)).check_schema().await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(!e.is_transient());
            assert!(e.to_string().contains("GRANT USAGE ON SCHEMA lease"), "{e}");
        }
        other => panic!("a role without USAGE: got {other:?}"),
    }
    // Nor may it migrate a database it cannot create a schema in.
    let empty = lease_testdb::empty_database().await;
    let mut empty_admin = connect(&empty.url).await;
    exec(
        &mut empty_admin,
        &format!("GRANT CONNECT ON DATABASE \"{}\" TO {role}", empty.name),
    )
    .await;
    match self::store(&url_as(&empty.url, &role)).migrate().await {
        Err(e @ PgSetupError::PermissionDenied { .. }) => {
            assert!(e.to_string().contains("may not create schemas"), "{e}")
        }
        other => panic!("migrate without CREATE: got {other:?}"),
    }
    assert!(!schema_exists(&mut empty_admin).await);
}

/// A migration with work to do on a read-only connection is refused as such, not as an
/// unreachable database; on an up-to-date one, migrating is a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrating_a_read_only_database() {
    let fresh = lease_testdb::empty_database().await;
    let done = lease_testdb::database().await;
    let mut admin = connect(&fresh.url).await;
    for name in [&fresh.name, &done.name] {
        exec(
            &mut admin,
            &format!("ALTER DATABASE \"{name}\" SET default_transaction_read_only = on"),
        )
        .await;
    }
    match store(&fresh.url).migrate().await {
        Err(e @ PgSetupError::ReadOnly) => assert!(!e.is_transient()),
        other => panic!("migrate on a read-only database: got {other:?}"),
    }
    assert!(!schema_exists(&mut admin).await);
    assert!(store(&done.url).migrate().await.expect("no-op").is_empty());
}
