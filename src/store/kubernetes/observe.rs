//! `observe_change` for the Kubernetes store (`leaderrun watch`): one watch on the lock's
//! Lease, kept across calls, and nothing else.
//!
//! The watch starts from the resourceVersion of the last read (`status`): the Lease's own, or
//! the list's when there is no Lease, so that a change between the read and the watch is not
//! missed. Events the read already saw (a kept watch may bring them after the caller read
//! again) do not count. Every change to the record is a write to the Lease: an acquisition,
//! each renewal (renewTime), a revoke, a keep, a release, a `kubectl delete lease`. Nothing
//! on the server ends a lease (its holder's renewals stop, and standbys judge that on their
//! own clocks); `status` keeps showing the holder until a standby takes the Lease over, which
//! is a write. So the server says nothing at an expiry, and nothing in the record changes at
//! one either.
//!
//! A server ends a watch after its timeout (asked: `WATCH_FOR`) or when the version is too
//! old (410 Gone): the call returns, the caller reads again, and the next call watches anew.

use std::time::Duration;

use futures_util::StreamExt;
use kube::api::WatchEvent;

use super::api::Events;
use super::{lease, names, LeaseRecords};
use crate::store::Result;

/// How long one watch request lasts before the server ends it (then one more request).
const WATCH_FOR: Duration = Duration::from_secs(290);

/// What a watcher keeps between `observe_change` calls.
pub(super) struct Observed {
    lock: String,
    events: Events,
}

impl LeaseRecords {
    /// The resourceVersion a read of `lock` saw (the Lease's, or the list's without one).
    pub(super) fn note_read(&self, lock: &str, resource_version: Option<String>) {
        *self.read_at.lock().unwrap() = resource_version.map(|rv| (lock.to_string(), rv));
    }

    /// Return once the Lease changed after the last read of `lock`, or the watch ended or
    /// failed (the caller reads again).
    pub(super) async fn observe(&self, lock: &str) -> Result<()> {
        let read = self.read_at.lock().unwrap().clone().filter(|(l, _)| l == lock).map(|(_, rv)| rv);
        let mut slot = self.observed.lock().await;
        if slot.as_ref().is_some_and(|o| o.lock != lock) {
            *slot = None;
        }
        let observed = match slot.as_mut() {
            Some(observed) => observed,
            None => {
                let name = names::lease_name(lock);
                let events = self.api.watch(&name, read.as_deref().unwrap_or(""), WATCH_FOR).await?;
                slot.insert(Observed { lock: lock.to_string(), events })
            }
        };
        let read = lease::revision(read.as_deref());
        // Whatever came since the caller's read is ready at once: only what is newer counts.
        loop {
            let event = observed.events.next().await;
            match event {
                Some(Ok(WatchEvent::Added(lease) | WatchEvent::Modified(lease) | WatchEvent::Deleted(lease))) => {
                    if lease::revision(lease.metadata.resource_version.as_deref()) > read {
                        return Ok(());
                    }
                }
                Some(Ok(WatchEvent::Bookmark(_))) => {}
                // Ended by the server (its timeout, 410 Gone for a version too old) or failed.
                Some(Ok(WatchEvent::Error(_))) | Some(Err(_)) | None => {
                    *slot = None;
                    return Ok(());
                }
            }
        }
    }
}
