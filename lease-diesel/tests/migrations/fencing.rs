//! Fencing with EXECUTE alone: `lease.is_current` needs no privilege on the engine's tables,
//! its lock holds off a takeover, and an upgrade keeps it callable for the roles that could.

use diesel_async::SimpleAsyncConnection;
use diesel_migrations::MigrationHarness;
use lease_core::{Bucket, BucketState, FencingToken, NodeId, Takeover};
use lease_diesel::ops;
use lease_diesel::privileges::RoleKind;

use crate::db::{
    LEGACY, connect, exec, flag, group, member_on, shards, store, sync, ttl_ms, wait_server_past,
};
use crate::roles::{make_role, role_of_kind, url_as};

/// A role with the fencing privileges (USAGE on the schema and EXECUTE on `lease.is_current`,
/// no privilege on the engine's tables), gets true and false right, and its `true` still holds off a takeover of the bucket
/// past the lease's expiry, until its transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn is_current_needs_only_execute_and_its_lock_holds_off_a_takeover() {
    let db = lease_testdb::database().await;
    let mut admin = connect(&db.url).await;
    let role = role_of_kind(&mut admin, &db.name, "fence", RoleKind::Fencing).await;
    let mut app = connect(&url_as(&db.url, &role)).await;
    assert!(
        app.batch_execute("SELECT 1 FROM lease.shards")
            .await
            .is_err(),
        "the fencing role can read lease.shards: the test would prove nothing"
    );

    let g = group("fenced");
    let mut conn = connect(&db.url).await;
    let mut ids = [NodeId::new(), NodeId::new()];
    ids.sort();
    let [a, b] = ids;
    ops::ensure_group(&mut conn, None, &g, shards(4))
        .await
        .expect("ensure");
    let first = member_on(&mut conn, &g, a, ttl_ms(1_000)).await;
    let leases = ops::claim(&mut conn, None, &g, a, first.session, 4, Takeover::Allowed)
        .await
        .expect("a claims");
    let b_join = member_on(&mut conn, &g, b, ttl_ms(60_000)).await;
    assert!(b_join.observed_at < first.expires_at, "b joined too late");
    let lease = leases[0];

    for (bucket, token, want) in [
        (lease.bucket, lease.token, true),
        (lease.bucket, FencingToken(lease.token.0 + 1), false),
        (Bucket(99), lease.token, false),
    ] {
        let got = ops::is_current(&mut app, None, &g, bucket, a, token)
            .await
            .expect("is_current with EXECUTE alone");
        assert_eq!(got, want, "is_current({bucket:?}, {token:?})");
    }

    exec(&mut app, "BEGIN").await;
    assert!(
        ops::is_current(&mut app, None, &g, lease.bucket, a, lease.token)
            .await
            .expect("is_current in a transaction")
    );
    wait_server_past(&mut admin, first.expires_at).await;
    let taken = ops::claim(&mut conn, None, &g, b, b_join.session, 4, Takeover::Allowed)
        .await
        .expect("b claims");
    assert_eq!(taken.len(), 3, "b took the bucket being written");
    assert!(taken.iter().all(|l| l.bucket != lease.bucket));
    exec(&mut app, "COMMIT").await;
    let taken = ops::claim(&mut conn, None, &g, b, b_join.session, 4, Takeover::Allowed)
        .await
        .expect("b claims again");
    assert_eq!(
        taken.iter().map(|l| l.bucket).collect::<Vec<_>>(),
        vec![lease.bucket]
    );
    let snap = ops::snapshot(&mut conn, None, &g).await.expect("snapshot");
    assert!(
        snap.buckets
            .iter()
            .all(|x| x.owner == Some(b) && x.state == BucketState::Live)
    );
}

/// Upgrading keeps `lease.is_current` callable for the roles that could call it before (with
/// UPDATE on lease.shards); the others need EXECUTE granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_keeps_is_current_for_the_roles_that_could_call_it() {
    let db = lease_testdb::empty_database().await;
    sync(&db.url, |c| {
        c.run_pending_migrations(LEGACY)
            .map(|v| v.len())
            .unwrap_or_else(|e| panic!("the earlier release's migrations: {e}"))
    })
    .await;
    let mut admin = connect(&db.url).await;
    let old_app = make_role(
        &mut admin,
        &db.name,
        "oldapp",
        "GRANT USAGE ON SCHEMA lease TO {role}; \
         GRANT SELECT, UPDATE ON lease.shards TO {role}; \
         GRANT SELECT ON lease.members TO {role};",
    )
    .await;
    let reader = make_role(
        &mut admin,
        &db.name,
        "reader",
        "GRANT USAGE ON SCHEMA lease TO {role}; GRANT SELECT ON lease.shards TO {role};",
    )
    .await;
    let call = "SELECT lease.is_current('g', 0, gen_random_uuid(), 1) = false AS yes";
    let mut old = connect(&url_as(&db.url, &old_app)).await;
    assert!(flag(&mut old, call).await, "before the upgrade");

    store(&db.url).migrate().await.expect("migrate");
    assert!(flag(&mut old, call).await, "after the upgrade");
    let mut read_only = connect(&url_as(&db.url, &reader)).await;
    let denied = read_only
        .batch_execute(call)
        .await
        .expect_err("a reader may take the fencing lock");
    assert!(denied.to_string().contains("permission denied"), "{denied}");
}
