//! The duel: one connection per side, and the conditions the server reports that each step
//! waits for (a backend blocked on a lock, one backend waiting for another, the server clock
//! past an expiry), never a guessed time.

use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Integer, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_core::Timestamp;

pub async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"))
}

pub async fn exec(conn: &mut AsyncPgConnection, sql: &str) {
    conn.batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    yes: bool,
}

pub async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    diesel::sql_query("SELECT pg_backend_pid() AS pid")
        .get_result::<Pid>(conn)
        .await
        .expect("pg_backend_pid")
        .pid
}

pub async fn flag(conn: &mut AsyncPgConnection, sql: &str, t: Option<Timestamp>) -> bool {
    let q = diesel::sql_query(sql).bind::<diesel::sql_types::Nullable<Timestamptz>, _>(t);
    q.get_result::<Flag>(conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .yes
}

/// Poll until `cond` holds (as the server reports it), failing after 20 s.
async fn wait_for(admin: &mut AsyncPgConnection, what: &str, sql: &str, t: Option<Timestamp>) {
    for _ in 0..2_000 {
        if flag(admin, sql, t).await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

pub async fn wait_blocked_on_lock(admin: &mut AsyncPgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
         WHERE pid = {pid} AND wait_event_type = 'Lock') AS yes"
    );
    wait_for(admin, "the backend to block on a lock", &sql, None).await;
}

/// Poll until backend `pid` waits for a lock backend `holder` holds.
pub async fn wait_blocked_by(admin: &mut AsyncPgConnection, pid: i32, holder: i32) {
    let sql = format!("SELECT {holder} = ANY (pg_blocking_pids({pid})) AS yes");
    wait_for(admin, "the backend to wait for the holder", &sql, None).await;
}

pub async fn wait_server_past(admin: &mut AsyncPgConnection, t: Timestamp) {
    wait_for(
        admin,
        "the server clock to pass the expiry",
        "SELECT clock_timestamp() >= $1 AS yes",
        Some(t),
    )
    .await;
}
