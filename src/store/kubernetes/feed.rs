//! A waiting standby's feed of one Lease: a watch kept open, each change passed on as a
//! record, so the core learns every renewal without reading the Lease again.
//!
//! A watch from a resourceVersion the server no longer keeps history for ends with 410
//! Gone; reopening it from the same version would be refused again (and again: nothing
//! else moves it), so the feed lists the Lease by name instead, passes it on if it
//! changed, and watches on from the list's resourceVersion, as client-go's informers do.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::WatchEvent;
use tokio::sync::mpsc;

use super::api::LeaseApi;
use super::lease;
use super::LastSeen;
use crate::store::client_timed::{Read, Version};

/// How long one watch request lasts before the server ends it (the core then reopens
/// it from the last version). Servers cap it anyway; client-go's reflectors ask about 5 min.
const WATCH_FOR: Duration = Duration::from_secs(290);

/// One feed: the Lease `name` (lock `lock`) from `version`, into `tx`, until the watch
/// ends, the Lease is deleted, or the core drops the feed.
pub(super) struct FeedTask {
    pub api: Arc<LeaseApi>,
    pub seen: Arc<LastSeen>,
    pub lock: String,
    pub name: String,
    pub version: Version,
    pub tx: mpsc::Sender<Read>,
}

impl FeedTask {
    /// Run the feed (spawned). Returns, closing the feed, when the server ends the watch,
    /// on any error, or once the Lease is deleted.
    pub async fn run(mut self, mut events: super::api::Events) {
        loop {
            let event = tokio::select! {
                _ = self.tx.closed() => return,
                event = events.next() => event,
            };
            let next = match event {
                None | Some(Err(_)) => return,
                Some(Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease))) => self.changed(lease).await,
                Some(Ok(WatchEvent::Deleted(lease))) => {
                    let floor = lease::revision(lease.metadata.resource_version.as_deref());
                    let _ = self.tx.send(Read { found: None, server_time: None, floor }).await;
                    return;
                }
                Some(Ok(WatchEvent::Bookmark(_))) => Ok(()),
                Some(Ok(WatchEvent::Error(status))) if status.code == 410 => match self.relist().await {
                    Some(reopened) => {
                        events = reopened;
                        Ok(())
                    }
                    None => return,
                },
                Some(Ok(WatchEvent::Error(_))) => return,
            };
            if next.is_err() {
                return;
            }
        }
    }

    /// Pass a changed Lease on (a watch from a version may repeat it: skip what was sent).
    async fn changed(&mut self, lease: Lease) -> Result<(), ()> {
        let floor = lease::revision(lease.metadata.resource_version.as_deref());
        let Some(found) = self.seen.found(&self.lock, lease) else { return Ok(()) };
        if found.version == self.version {
            return Ok(());
        }
        self.version = found.version.clone();
        let read = Read { found: Some(found), server_time: None, floor };
        self.tx.send(read).await.map_err(drop)
    }

    /// After a 410: the Lease as it is now (passed on if it changed) and a watch from the
    /// list's resourceVersion; `None` if either fails or the Lease is gone (the feed
    /// then closes, after saying so).
    async fn relist(&mut self) -> Option<super::api::Events> {
        let listed = self.api.list(Some(&self.name)).await.ok()?.value;
        let Some(lease) = listed.items.into_iter().next() else {
            let floor = lease::revision(listed.resource_version.as_deref());
            let _ = self.tx.send(Read { found: None, server_time: None, floor }).await;
            return None;
        };
        self.changed(lease).await.ok()?;
        let from = listed.resource_version?;
        self.api.watch(&self.name, &from, WATCH_FOR).await.ok()
    }
}

/// Open a feed of `lock`'s Lease from `version`: the watch request, then a task that
/// passes its events on. `Err` if the watch cannot be opened.
pub(super) async fn open(
    api: Arc<LeaseApi>,
    seen: Arc<LastSeen>,
    lock: &str,
    version: &Version,
) -> crate::store::Result<mpsc::Receiver<Read>> {
    let name = super::names::lease_name(lock);
    let from = lease::parts(version).map(|(resource_version, _)| resource_version.to_string()).unwrap_or_default();
    let events = api.watch(&name, &from, WATCH_FOR).await?;
    let (tx, rx) = mpsc::channel(16);
    let task = FeedTask { api, seen, lock: lock.to_string(), name, version: version.clone(), tx };
    tokio::spawn(task.run(events));
    Ok(rx)
}
