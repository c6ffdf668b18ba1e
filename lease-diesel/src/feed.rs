//! Wake-ups over `LISTEN/NOTIFY`: one listening connection per store, one channel per group.
//!
//! The statements that change membership, release buckets, resize or set an operator's
//! control `NOTIFY lease.channel(group)` in the same transaction, so a notification is
//! delivered when, and only if, the change commits.
//! One task holds a connection taken out of the pool, `LISTEN`s on every channel asked for,
//! and fans notifications out to the group's broadcast. If the connection breaks it reconnects,
//! listens again and sends [`Change::Missed`] to every feed: notifications may have been lost
//! meanwhile, and a worker that hears it simply re-plans.
//!
//! The listening connection comes from the store's pool, or from the direct URL when one is
//! given (`PgLeaseStore::direct_url`): `LISTEN` is session state, which a transaction pooler
//! does not keep. A store behind a transaction pooler without a direct URL has no source at
//! all: it offers no feed, and its workers re-plan on their renew interval.
//!
//! A listening connection only reads, so a server process that stops answering (frozen, or
//! behind a network that drops packets silently) would go unnoticed for ever: every
//! `check_every` the task sends a trivial query and, without an answer within as long again,
//! treats the connection as broken.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use lease_core::{BackendFailure, Change, ChangeFeed, NodeId, Operation, StoreError};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio_stream::wrappers::BroadcastStream;
use uuid::Uuid;

use crate::connect::Connector;

/// Unread changes a feed buffers before it reports [`Change::Missed`].
const FEED_CAPACITY: usize = 256;
/// How long `subscribe` waits for the listener to be `LISTEN`ing.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest pause between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

struct Listen {
    channel: String,
    ack: oneshot::Sender<Result<(), StoreError>>,
}

#[derive(Default)]
struct Routes {
    /// Per channel, the broadcast its feeds receive from.
    senders: HashMap<String, broadcast::Sender<Change>>,
    /// The listener task, while it runs.
    task: Option<mpsc::UnboundedSender<Listen>>,
}

/// Where the listening connection comes from.
#[derive(Clone)]
pub(crate) enum Source {
    /// Taken out of the store's pool for good.
    Pool(Pool<AsyncPgConnection>),
    /// Opened on the direct URL, within `timeout`.
    Direct {
        connector: Arc<Connector>,
        timeout: Duration,
    },
}

/// The store's listening side. Dropping the last store clone stops the task.
pub(crate) struct Notifier {
    routes: Arc<Mutex<Routes>>,
    /// How often the listening connection is checked.
    check_every: Duration,
    /// Where listening connections come from; `None`: nowhere (behind a transaction pooler
    /// without a direct URL), so there are no feeds.
    source: Option<Source>,
}

impl Notifier {
    /// A notifier listening on connections from `source` (none: it offers no feeds), checked
    /// every `check_every`.
    pub(crate) fn new(check_every: Duration, source: Option<Source>) -> Self {
        Self {
            routes: Arc::default(),
            check_every,
            source,
        }
    }

    /// Whether it can push wake-ups at all.
    pub(crate) fn can_listen(&self) -> bool {
        self.source.is_some()
    }
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

impl Notifier {
    /// A feed of `channel`, returned once the listener is `LISTEN`ing on it; `None` if it has
    /// nowhere to listen.
    pub(crate) async fn subscribe(
        &self,
        channel: String,
    ) -> Result<Option<ChangeFeed>, StoreError> {
        let Some(source) = &self.source else {
            return Ok(None);
        };
        let (rx, ack) = {
            let mut routes = self.routes.lock().unwrap_or_else(PoisonError::into_inner);
            let rx = routes
                .senders
                .entry(channel.clone())
                .or_insert_with(|| broadcast::channel(FEED_CAPACITY).0)
                .subscribe();
            let task = match &routes.task {
                Some(tx) if !tx.is_closed() => tx.clone(),
                _ => {
                    let (tx, rx) = mpsc::unbounded_channel();
                    tokio::spawn(listen_loop(
                        source.clone(),
                        Arc::downgrade(&self.routes),
                        rx,
                        self.check_every,
                    ));
                    routes.task = Some(tx.clone());
                    tx
                }
            };
            let (ack_tx, ack_rx) = oneshot::channel();
            task.send(Listen {
                channel,
                ack: ack_tx,
            })
            .map_err(|_| stopped("the LISTEN task stopped"))?;
            (rx, ack_rx)
        };
        match tokio::time::timeout(SUBSCRIBE_TIMEOUT, ack).await {
            Ok(Ok(result)) => result.map(|()| {
                // A receiver that fell behind hears `Missed` and re-plans.
                Some(ChangeFeed::new(
                    BroadcastStream::new(rx).map(|c| c.unwrap_or(Change::Missed)),
                ))
            }),
            Ok(Err(_)) => Err(stopped("the LISTEN task stopped before listening")),
            Err(_) => Err(StoreError::backend_detail(
                Operation::Changes,
                BackendFailure::Timeout,
                format!("LISTEN did not succeed within {SUBSCRIBE_TIMEOUT:?}"),
            )),
        }
    }
}

/// The listening task is gone: it ends only when its connection cannot be had at all or the
/// store is dropped.
fn stopped(detail: &str) -> StoreError {
    StoreError::backend_detail(Operation::Changes, BackendFailure::Unavailable, detail)
}

fn parse(payload: &str) -> Change {
    let worker = |rest: &str| Uuid::parse_str(rest).ok().map(NodeId::from_uuid);
    let mut chars = payload.chars();
    match (chars.next(), worker(chars.as_str())) {
        (Some('J'), Some(w)) => Change::Joined(w),
        (Some('L'), Some(w)) => Change::Left(w),
        (Some('R'), Some(w)) => Change::Released(w),
        // A resize: 'Z' and the new generation.
        (Some('Z'), _) => Change::Resized,
        // An operator's control of a member ('C' and the node) or a bucket's quarantine ('C'
        // and the bucket).
        (Some('C'), _) => Change::Controlled,
        _ => Change::Missed,
    }
}

fn broadcast_all(routes: &Mutex<Routes>, change: Change) {
    let routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
    for tx in routes.senders.values() {
        // A channel nobody listens to any more is not an error.
        tx.send(change).ok();
    }
}

async fn connect(source: &Source) -> Result<AsyncPgConnection, StoreError> {
    match source {
        Source::Pool(pool) => pool
            .get()
            .await
            .map(Object::take)
            .map_err(|e| crate::error::from_pool(Operation::Changes, e)),
        Source::Direct { connector, timeout } => {
            match tokio::time::timeout(*timeout, connector.connect()).await {
                Ok(Ok(conn)) => Ok(conn),
                Ok(Err(e)) => Err(crate::error::from_connection(Operation::Changes, e)),
                Err(_) => Err(StoreError::backend_detail(
                    Operation::Changes,
                    BackendFailure::Unavailable,
                    format!("no connection on the direct URL within {timeout:?}"),
                )),
            }
        }
    }
}

fn listen_sql(channel: &str) -> String {
    // Channels come from lease.channel(): 'lease_' and 32 hex digits, safe to quote.
    format!("LISTEN \"{channel}\"")
}

enum Event {
    Command(Option<Listen>),
    Notification(Option<diesel::QueryResult<diesel::pg::PgNotification>>),
    Check,
}

async fn listen_loop(
    source: Source,
    routes: std::sync::Weak<Mutex<Routes>>,
    mut commands: mpsc::UnboundedReceiver<Listen>,
    check_every: Duration,
) {
    let mut listening: HashSet<String> = HashSet::new();
    let mut backoff = Duration::from_millis(50);
    let mut reconnecting = false;
    'connect: loop {
        if routes.strong_count() == 0 {
            // The store is gone; nobody can subscribe or listen any more.
            return;
        }
        let mut conn = match connect(&source).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "change feed: cannot connect; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        for channel in &listening {
            if let Err(e) = conn.batch_execute(&listen_sql(channel)).await {
                tracing::warn!(error = %e, "change feed: LISTEN failed; reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue 'connect;
            }
        }
        backoff = Duration::from_millis(50);
        if reconnecting {
            let Some(routes) = routes.upgrade() else {
                return;
            };
            broadcast_all(&routes, Change::Missed);
        }
        reconnecting = true;
        let mut checks = tokio::time::interval(check_every);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        checks.reset();
        loop {
            let event = {
                let mut notes = std::pin::pin!(conn.notifications_stream());
                tokio::select! {
                    command = commands.recv() => Event::Command(command),
                    note = notes.next() => Event::Notification(note),
                    _ = checks.tick() => Event::Check,
                }
            };
            match event {
                Event::Command(None) => return,
                Event::Command(Some(Listen { channel, ack })) => {
                    let result = if listening.contains(&channel) {
                        Ok(())
                    } else {
                        conn.batch_execute(&listen_sql(&channel))
                            .await
                            .map_err(|e| crate::error::from_diesel(Operation::Changes, e))
                    };
                    let failed = result.is_err();
                    if !failed {
                        listening.insert(channel);
                    }
                    // The subscriber may have given up waiting; nothing to tell it then.
                    ack.send(result).ok();
                    if failed {
                        continue 'connect;
                    }
                }
                Event::Notification(Some(Ok(note))) => {
                    let Some(routes) = routes.upgrade() else {
                        return;
                    };
                    let routes = routes.lock().unwrap_or_else(PoisonError::into_inner);
                    if let Some(tx) = routes.senders.get(&note.channel) {
                        tx.send(parse(&note.payload)).ok();
                    }
                }
                Event::Notification(Some(Err(e))) => {
                    tracing::warn!(error = %e, "change feed: connection lost; reconnecting");
                    continue 'connect;
                }
                Event::Notification(None) => {
                    tracing::warn!("change feed: connection closed; reconnecting");
                    continue 'connect;
                }
                Event::Check => {
                    let answered =
                        tokio::time::timeout(check_every, conn.batch_execute("SELECT 1")).await;
                    if !matches!(answered, Ok(Ok(()))) {
                        tracing::warn!(
                            "change feed: the listening connection did not answer within \
                             {check_every:?}; reconnecting"
                        );
                        continue 'connect;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse() {
        let w = Uuid::from_u128(7);
        assert_eq!(
            parse(&format!("J{w}")),
            Change::Joined(NodeId::from_uuid(w))
        );
        assert_eq!(parse(&format!("L{w}")), Change::Left(NodeId::from_uuid(w)));
        assert_eq!(
            parse(&format!("R{w}")),
            Change::Released(NodeId::from_uuid(w))
        );
        assert_eq!(parse("Z3"), Change::Resized);
        assert_eq!(parse(&format!("C{w}")), Change::Controlled);
        assert_eq!(parse("C17"), Change::Controlled);
        assert_eq!(parse("X"), Change::Missed);
        assert_eq!(parse(""), Change::Missed);
        assert_eq!(parse("Jnot-a-uuid"), Change::Missed);
        assert_eq!(parse("é"), Change::Missed);
    }
}
