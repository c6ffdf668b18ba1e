//! The harness itself: a standby streams, loses exactly what it did not receive once
//! replication is cut, and takes over when promoted; a synchronous one has every commit; a
//! server under libfaketime steps its wall clock when told to.

use lease_testdb::{Cluster, ClusterOptions, Replication};

fn primary() -> Cluster {
    Cluster::start(ClusterOptions {
        tcp: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a primary: {e}"))
}

#[test]
fn an_asynchronous_standby_promoted_after_a_cut_lacks_what_came_later() {
    let primary = primary();
    primary
        .psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
        .expect("a table");
    let standby = primary
        .start_standby(Replication::Asynchronous)
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    assert_eq!(
        standby.psql("SELECT pg_is_in_recovery()").as_deref(),
        Ok("t")
    );
    primary.psql("INSERT INTO t VALUES (2)").expect("insert");
    standby.cut_replication().expect("cutting replication");
    // Acknowledged by the primary, never sent to the standby.
    primary.psql("INSERT INTO t VALUES (3)").expect("insert");
    primary.kill().expect("killing the primary");
    standby.promote().expect("promoting");
    assert_eq!(
        standby.psql("SELECT pg_is_in_recovery()").as_deref(),
        Ok("f")
    );
    let seen = standby
        .psql("SELECT string_agg(n::text, ',' ORDER BY n) FROM t")
        .expect("reading");
    // Row 2 may or may not have streamed before the cut; row 3 never did.
    assert!(
        seen == "1" || seen == "1,2",
        "the promoted standby has {seen}"
    );
    standby
        .psql("INSERT INTO t VALUES (4)")
        .expect("the promoted standby takes writes");
}

#[test]
fn a_synchronous_standby_has_every_acknowledged_commit() {
    let primary = primary();
    let standby = primary
        .start_standby(Replication::Synchronous)
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    primary
        .psql("CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 100)")
        .expect("writes");
    primary.kill().expect("killing the primary");
    standby.promote().expect("promoting");
    assert_eq!(standby.psql("SELECT count(*) FROM t").as_deref(), Ok("100"));
}

#[test]
fn a_fake_clock_steps_when_told_and_only_then() {
    let cluster = Cluster::start(ClusterOptions {
        fake_clock: true,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("a cluster under libfaketime: {e}"));
    let server_minus_real = || -> f64 {
        let real = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let server: f64 = cluster
            .psql("SELECT extract(epoch FROM clock_timestamp())")
            .expect("reading the clock")
            .parse()
            .expect("a number");
        server - real
    };
    assert!(server_minus_real().abs() < 1.0, "the clock starts real");
    cluster.set_clock_offset(15).expect("stepping forward");
    let ahead = server_minus_real();
    assert!((14.0..16.0).contains(&ahead), "{ahead} s ahead, not 15");
    cluster.set_clock_offset(-5).expect("stepping back");
    let behind = server_minus_real();
    assert!((-6.0..-4.0).contains(&behind), "{behind} s, not -5");
}

#[test]
fn an_old_primary_rejoins_as_a_standby_and_takes_over_again() {
    let first = primary();
    let second = first
        .start_standby(Replication::Synchronous)
        .unwrap_or_else(|e| panic!("a standby: {e}"));
    first
        .psql("CREATE TABLE t (n int); INSERT INTO t VALUES (1)")
        .expect("writes");
    first.kill().expect("killing the primary");
    second.promote().expect("promoting");
    second.psql("INSERT INTO t VALUES (2)").expect("insert");
    first
        .rejoin_as_standby(&second, Replication::Synchronous)
        .unwrap_or_else(|e| panic!("rejoining: {e}"));
    assert_eq!(first.psql("SELECT pg_is_in_recovery()").as_deref(), Ok("t"));
    // Synchronous: acknowledged once the rebuilt standby has it.
    second.psql("INSERT INTO t VALUES (3)").expect("insert");
    second.kill().expect("killing the second primary");
    first.promote().expect("promoting the first again");
    assert_eq!(
        first
            .psql("SELECT string_agg(n::text, ',' ORDER BY n) FROM t")
            .as_deref(),
        Ok("1,2,3")
    );
    // Three timelines: the first, the second's, the first's again.
    assert_eq!(
        first
            .psql("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")
            .as_deref(),
        Ok("00000003")
    );
    let url = Cluster::multi_host_url(&[&second, &first], "postgres", "postgres", "x=1");
    assert_eq!(
        url,
        format!(
            "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/postgres?x=1",
            second.port(),
            first.port()
        )
    );
}
