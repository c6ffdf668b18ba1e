//! Server processes that stop answering: frozen with `SIGSTOP` while the server goes on
//! accepting connections, and the server's own view of who serves a database.

use std::process::Command;

use diesel_async::AsyncPgConnection;

/// Server processes frozen with `SIGSTOP` (a server process that stops answering while the
/// server goes on accepting connections); they are resumed with `SIGCONT` when this is dropped,
/// however the test ends.
#[derive(Debug)]
pub struct Frozen {
    pids: Vec<i32>,
}

impl Frozen {
    /// Freeze the processes `pids` (the tests run as root, or as the server's user).
    ///
    /// # Panics
    ///
    /// If `kill` cannot be run or refuses.
    pub fn freeze(pids: Vec<i32>) -> Self {
        signal(&pids, "STOP");
        Self { pids }
    }

    /// The frozen processes.
    pub fn pids(&self) -> &[i32] {
        &self.pids
    }

    /// Whether every frozen process is still stopped (state `T` in `/proc/<pid>/stat`).
    pub fn all_stopped(&self) -> bool {
        self.pids.iter().all(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit(')')
                    .next()
                    .and_then(|rest| rest.split_whitespace().next())
                    == Some("T")
            })
        })
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(&self.pids, "CONT");
    }
}

fn signal(pids: &[i32], signal: &str) {
    if pids.is_empty() {
        return;
    }
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(ToString::to_string))
        .status()
        .unwrap_or_else(|e| panic!("running kill: {e}"));
    assert!(status.success(), "kill -{signal} {pids:?} failed");
}

/// One server process serving a database, as `pg_stat_activity` shows it.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct Backend {
    /// Its process id.
    #[diesel(sql_type = diesel::sql_types::Integer)]
    pub pid: i32,
    /// `idle`, `active`, `idle in transaction`...
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub state: String,
    /// The last statement it ran (or runs).
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub query: String,
}

/// The server processes serving database `db`, but the one `admin` is connected to.
///
/// # Panics
///
/// If the query fails.
pub async fn backends(admin: &mut AsyncPgConnection, db: &str) -> Vec<Backend> {
    use diesel_async::RunQueryDsl;
    diesel::sql_query(
        "SELECT pid, COALESCE(state, '') AS state, COALESCE(query, '') AS query \
           FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
    )
    .bind::<diesel::sql_types::Text, _>(db)
    .load(admin)
    .await
    .unwrap_or_else(|e| panic!("reading pg_stat_activity: {e}"))
}
