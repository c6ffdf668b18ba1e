//! The change feed: a watch on a group's document, each write's changes as it lands.

use futures_util::StreamExt;
use lease_core::{Change, ChangeFeed, GroupName, Operation, StoreError};

use super::EtcdLeaseStore;
use super::send::{Resend, send};
use crate::codec;

impl EtcdLeaseStore {
    /// [`WorkerStore::changes`](lease_core::WorkerStore::changes): the group document's watch.
    pub(super) async fn feed(&self, group: &GroupName) -> Result<Option<ChangeFeed>, StoreError> {
        let key = self.keys.doc(group);
        // Returns once etcd confirmed the watch: every later write is seen (W1).
        let (watcher, stream) = send(Operation::Changes, Resend::Repeatable, || {
            let mut watch = self.client.watch_client();
            let key = key.clone();
            async move { watch.watch(key, None).await }
        })
        .await?;
        let changes = futures_util::stream::unfold(Some((watcher, stream)), |open| async move {
            let (watcher, mut stream) = open?;
            match stream.message().await {
                Ok(Some(resp)) => {
                    let changes: Vec<Change> = if resp.canceled() {
                        vec![Change::Missed]
                    } else {
                        resp.events()
                            .iter()
                            .filter_map(|e| e.kv())
                            .flat_map(|kv| codec::changes_of(kv.value()))
                            .collect()
                    };
                    let next = (!resp.canceled()).then_some((watcher, stream));
                    Some((futures_util::stream::iter(changes), next))
                }
                // The watch broke: say so once; the worker re-plans and polls.
                Ok(None) | Err(_) => Some((futures_util::stream::iter(vec![Change::Missed]), None)),
            }
        })
        .flatten();
        Ok(Some(ChangeFeed::new(changes)))
    }
}
