//! Throwaway etcd clusters for tests, started from the system's `etcd` (Debian package
//! `etcd-server`; tested with 3.4.23).
//!
//! - [`EtcdCluster::start`] starts `n` members on 127.0.0.1, each on a client and a peer port
//!   of its own, with its data directory in one directory under [`data_root`] (memory, where
//!   the machine has `/dev/shm`), with fast elections
//!   (heartbeat 50 ms, election timeout 500 ms), and returns once every member is healthy and
//!   all agree on a leader. A test may [`kill`](EtcdCluster::kill) a member (SIGKILL) and
//!   [`restart`](EtcdCluster::restart) it on its ports and data, ask who the
//!   [`leader`](EtcdCluster::leader) is and [`wait_for_leader`](EtcdCluster::wait_for_leader).
//!   Dropping the cluster kills every member and removes the directory; a watchdog process
//!   does the same when the test process exits however it exits (a panic, SIGKILL).
//! - [`cluster`] is one three-member cluster per test process, started on first use, for the
//!   many tests that only need a store: each takes a key [`prefix`] of its own, as each
//!   Postgres test takes a database of its own. Its members are never killed (`kill` and
//!   `restart` need `&mut`, which a shared reference does not give); a test that kills
//!   members starts a cluster of its own.
//! - `etcd` is looked up in `LEASE_ETCD_BIN` (the binary or its directory), then `PATH`,
//!   then `/usr/bin`. Without it, starting a cluster fails with a message naming the
//!   package: the etcd tests fail, they never pass by skipping.
//!
//! Ports are taken from below the kernel's ephemeral port range, so that no client
//! connection can take a killed member's port as its local port before the member restarts.
//!
//! The harness talks to the members through etcd's JSON gateway on their client ports, with
//! std only: it needs no async runtime and builds without `protoc`.

mod bins;
mod cluster;
mod http;
mod ports;

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

pub use cluster::{EtcdCluster, EtcdOptions, data_root};
pub use http::MemberStatus;

static SHARED: OnceLock<EtcdCluster> = OnceLock::new();
static NEXT_PREFIX: AtomicU32 = AtomicU32::new(0);

/// The test process's shared three-member cluster, started on first use (with the default
/// [`EtcdOptions`]); its watchdog removes it when the process exits.
///
/// # Panics
///
/// If `etcd` is not installed (the message names the Debian package `etcd-server`) or the
/// cluster does not start (the message has the members' logs).
pub fn cluster() -> &'static EtcdCluster {
    SHARED
        .get_or_init(|| EtcdCluster::start_with(shared_options()).unwrap_or_else(|e| panic!("{e}")))
}

/// The shared cluster's options: etcd's default timings (heartbeat 100 ms, election timeout
/// 1 s), not the fast elections of [`EtcdOptions::default`]. Its members are never killed, and
/// on a loaded machine (many tests, two cores) a 500 ms election timeout is missed now and
/// then: an election nobody asked for stalls every test on the cluster for a second.
pub fn shared_options() -> EtcdOptions {
    EtcdOptions {
        heartbeat: std::time::Duration::from_millis(100),
        election_timeout: std::time::Duration::from_millis(1000),
        ..EtcdOptions::default()
    }
}

/// A key prefix no other call of this process returns (`/lease-test/<pid>-<n>/`), for a
/// test's keys in the shared [`cluster`].
pub fn prefix() -> String {
    let n = NEXT_PREFIX.fetch_add(1, Ordering::SeqCst);
    format!("/lease-test/{}-{n}/", std::process::id())
}
