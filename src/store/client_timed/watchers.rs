//! Feeds kept open while this client waits for a lock, so that an idle standby makes
//! no request beyond its watch: every change arrives on the feed, and the core judges
//! the latest record it brought instead of reading the record again. A store that cannot
//! watch (an object store) gets a feed of polls: one read each time, nothing else. Without
//! it, every renewal a poll noticed cost a second read when the standby re-checked.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::polls;
use super::records::{Feed, Read, Records, Version};
use crate::clock::Clock;

/// What one lock's feed has shown: the latest record and when it came.
pub struct Watched {
    latest: Mutex<Option<(Read, Duration)>>,
    /// Bumped at every change the feed brings, and when the feed is gone.
    changes: watch::Sender<u64>,
}

impl Watched {
    /// The latest record the feed brought and when it came; `None` once the feed is gone
    /// (the caller then reads the store).
    pub fn latest(&self) -> Option<(Read, Duration)> {
        self.latest.lock().unwrap().clone()
    }

    fn version(&self) -> Option<Version> {
        let latest = self.latest.lock().unwrap();
        latest.as_ref().map(|(read, _)| read.found.as_ref().map(|f| f.version.clone()))?
    }

    fn is_live(&self) -> bool {
        self.latest.lock().unwrap().is_some()
    }

    /// Return once the feed shows a version other than `seen`, it is gone, or `max_wait` passed.
    pub async fn moved_from(&self, seen: &Version, max_wait: Duration) {
        let mut changes = self.changes.subscribe();
        let wait = async {
            while self.is_live() && self.version().as_ref() == Some(seen) {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(max_wait, wait).await;
    }
}

/// The open feeds, one per lock at most.
#[derive(Default)]
pub struct Watchers(Mutex<HashMap<String, Arc<Watched>>>);

impl Watchers {
    /// The lock's live feed, if one is open.
    pub fn get(&self, lock: &str) -> Option<Arc<Watched>> {
        self.0.lock().unwrap().get(lock).filter(|w| w.is_live()).cloned()
    }

    /// The lock's live feed, opened from `read` (which must carry a record) if none is.
    /// `None` if the store cannot watch, or the watch could not be opened.
    pub async fn open(
        &self,
        records: &Arc<dyn Records>,
        clock: &Arc<dyn Clock>,
        lock: &str,
        read: Read,
    ) -> Option<Arc<Watched>> {
        if let Some(live) = self.get(lock) {
            return Some(live);
        }
        let version = read.found.as_ref()?.version.clone();
        let feed = open_feed(records, lock, &version).await?;
        let watched = Arc::new(Watched { latest: Mutex::new(Some((read, clock.now()))), changes: watch::channel(0).0 });
        self.0.lock().unwrap().insert(lock.to_string(), watched.clone());
        tokio::spawn(drain(records.clone(), clock.clone(), lock.to_string(), feed, watched.clone()));
        Some(watched)
    }

    /// This client holds the lock now, or no longer waits for it: close its feed.
    pub fn close(&self, lock: &str) {
        if let Some(watched) = self.0.lock().unwrap().remove(lock) {
            watched.latest.lock().unwrap().take();
            watched.changes.send_modify(|n| *n += 1);
        }
    }
}

/// Keep `watched` up to date from `feed`, reopening it from the last version when the
/// store ends it, until it cannot be reopened, the record is deleted, or it is closed.
async fn drain(
    records: Arc<dyn Records>,
    clock: Arc<dyn Clock>,
    lock: String,
    mut feed: super::records::Feed,
    watched: Arc<Watched>,
) {
    loop {
        while let Some(read) = feed.recv().await {
            let deleted = read.found.is_none();
            {
                let mut latest = watched.latest.lock().unwrap();
                if latest.is_none() {
                    return; // closed meanwhile
                }
                *latest = Some((read, clock.now()));
            }
            watched.changes.send_modify(|n| *n += 1);
            if deleted {
                break; // a record to create, not to watch: the core reads
            }
        }
        let reopened = match watched.version() {
            Some(version) => open_feed(&records, &lock, &version).await,
            None => None,
        };
        match reopened {
            Some(next) => feed = next,
            None => break,
        }
    }
    watched.latest.lock().unwrap().take();
    watched.changes.send_modify(|n| *n += 1);
}

/// The lock's changes after `version`: the store's watch, or polls where it has none.
async fn open_feed(records: &Arc<dyn Records>, lock: &str, version: &Version) -> Option<Feed> {
    match records.watch(lock, version).await.ok()? {
        Some(feed) => Some(feed),
        None => Some(polls::feed(records.clone(), lock.to_string(), version.clone(), records.poll_every()?)),
    }
}
