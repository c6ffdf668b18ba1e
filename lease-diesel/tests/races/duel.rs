//! The duel: one connection per side, and the conditions the server reports that each step
//! waits for (a backend blocked on a lock, one backend waiting for another, the server clock
//! past an expiry), never a guessed time.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{Bool, Integer, Timestamptz};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use lease_core::Timestamp;
use tokio::task::JoinHandle;

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

async fn wait_blocked_on_lock(admin: &mut AsyncPgConnection, pid: i32) {
    let sql = format!(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
         WHERE pid = {pid} AND wait_event_type = 'Lock') AS yes"
    );
    wait_for(admin, "the backend to block on a lock", &sql, None).await;
}

/// Whether backend `pid` waits for a lock backend `holder` holds (one boolean `yes`).
fn blocked_by_sql(pid: i32, holder: i32) -> String {
    format!("SELECT {holder} = ANY (pg_blocking_pids({pid})) AS yes")
}

/// Poll until backend `pid` waits for a lock backend `holder` holds.
pub async fn wait_blocked_by(admin: &mut AsyncPgConnection, pid: i32, holder: i32) {
    let sql = blocked_by_sql(pid, holder);
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

/// The backend pids of two sides' connections, `a`'s first.
pub async fn pids(a: &mut AsyncPgConnection, b: &mut AsyncPgConnection) -> (i32, i32) {
    (backend_pid(a).await, backend_pid(b).await)
}

/// Side A holds a row: begins a transaction on `gate` that locks the row of `table` whose
/// `column` is `key` (`lock`: `FOR UPDATE`, `FOR SHARE`), held until the test ends it.
pub async fn hold_row(
    gate: &mut AsyncPgConnection,
    table: &str,
    column: &str,
    key: impl Display,
    lock: &str,
) {
    exec(
        gate,
        &format!("BEGIN; SELECT 1 FROM {table} WHERE {column} = '{key}' {lock}"),
    )
    .await;
}

/// Side B's step, run in a task of its own (which hands back whatever the step returns,
/// its connection too): the task, once backend `pid`, the step's, is blocked on a lock.
pub async fn blocked<T: Send + 'static>(
    admin: &mut AsyncPgConnection,
    pid: i32,
    step: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let task = tokio::spawn(step);
    wait_blocked_on_lock(admin, pid).await;
    task
}

/// [`blocked`], once backend `pid` waits for a lock backend `holder` holds.
pub async fn blocked_by<T: Send + 'static>(
    admin: &mut AsyncPgConnection,
    pid: i32,
    holder: i32,
    step: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let task = tokio::spawn(step);
    wait_blocked_by(admin, pid, holder).await;
    task
}

/// [`blocked_by`], or once the step has finished, for a step that may answer at once (judging
/// an older version of a row) instead of waiting: the test then checks what it answered. Gives
/// up waiting after 20 s without failing.
pub async fn blocked_by_or_done<T: Send + 'static>(
    admin: &mut AsyncPgConnection,
    pid: i32,
    holder: i32,
    step: impl Future<Output = T> + Send + 'static,
) -> JoinHandle<T> {
    let task = tokio::spawn(step);
    let blocked = blocked_by_sql(pid, holder);
    for _ in 0..2_000 {
        if task.is_finished() || flag(admin, &blocked, None).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    task
}
