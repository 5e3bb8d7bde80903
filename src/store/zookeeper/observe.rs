//! `observe_change` for the ZooKeeper store (`leaderrun watch`): watches on what `status` reads,
//! kept across calls, and never a node of its own.
//!
//! `status` reads the lock's children and the lowest one's data: the watcher sets a children
//! watch on the lock's node (an acquisition creates a child; a release, a revoke of a kept
//! lease and a session's expiry delete one: the holder's ephemeral child vanishes with its
//! session) and a data watch on the lowest child (a revoke writes it). A lock never taken has
//! no node yet: an exists watch on it fires when the first acquire makes it. The watches are
//! set on the reads session, after a `sync` and a read that is compared with the last `status`
//! (the parent's pzxid, the lowest child and its mzxid): a change between the two returns at
//! once, so none is missed. ZooKeeper's watches fire once and are set again (on the same
//! server or another, by the client library) when the session moves: kept across calls while
//! they have not fired, an idle watcher sends nothing. A renewal reads, it writes nothing:
//! the watcher sees no renewals, and needs not.
//!
//! One change is silent: a lease kept for --min-hold is a persistent child that stays after its
//! keep ends (`status` then calls the lock free, and the next acquirer deletes it). The wait is
//! cut at the keep's end, so that the watcher reads again then.
//!
//! It joins no queue (a standby's place there decides whose turn a release is), so it takes
//! no turn and spends no one's wake-up.

use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, OneshotWatcher};

use super::names::sequence;
use super::sessions::request;
use super::value::{now_ms, Value};
use super::ZooKeeperStore;
use crate::store::Result;

/// What a read of a lock saw, to tell whether the lock changed since: the last change to the
/// lock node's children (its pzxid; 0 when it has no node), and the lowest lease child with
/// its last write (mzxid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Mark {
    pub(super) children: i64,
    pub(super) lowest: Option<(i64, i64)>,
}

/// The watches a watcher keeps between `observe_change` calls.
pub(super) struct Observed {
    lock: String,
    /// Becomes true once a watch fired.
    fired: tokio::sync::watch::Receiver<bool>,
    /// The task waiting for the watches.
    task: tokio::task::JoinHandle<()>,
    /// When the kept lease the watches were set on ends its keep (unannounced).
    keep_ends: Option<Instant>,
}

impl Drop for Observed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ZooKeeperStore {
    /// What the last `status` of `lock` saw.
    pub(super) fn note_read(&self, lock: &str, mark: Mark) {
        *self.read.lock().unwrap() = Some((lock.to_string(), mark));
    }

    /// Return once the lock may have changed since the last `status` read (or the watches
    /// could not be set: the caller reads again).
    pub(super) async fn observe(&self, lock: &str) -> Result<()> {
        let mut slot = self.observed.lock().await;
        if slot.as_ref().is_some_and(|o| o.lock != lock) {
            *slot = None;
        }
        if slot.is_none() {
            match self.set_watches(lock).await? {
                Some(observed) => *slot = Some(observed),
                None => return Ok(()),
            }
        }
        let Some(observed) = slot.as_mut() else { return Ok(()) };
        let keep_ends = observed.keep_ends.filter(|end| *end > Instant::now());
        let fired = async {
            // Err: the task is gone (aborted); the caller reads again all the same.
            let _ = observed.fired.wait_for(|fired| *fired).await;
        };
        match keep_ends {
            Some(end) => tokio::select! {
                () = fired => *slot = None,
                () = tokio::time::sleep_until(end) => {}
            },
            None => {
                fired.await;
                *slot = None;
            }
        }
        Ok(())
    }

    /// Set the watches on what `status` reads; `None` if the lock changed since the last
    /// `status` (the caller reads again at once).
    async fn set_watches(&self, lock: &str) -> Result<Option<Observed>> {
        let zk = self.watch_session().await?;
        let parent = self.parent(lock);
        // Reads on this session then see at least what the last `status` saw.
        match request("sync", &zk, |c| c.sync(&parent)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        // The lock node's (its children, or its creation), and the lowest child's data.
        let node: OneshotWatcher;
        let mut lowest: Option<OneshotWatcher> = None;
        let mut mark = Mark { children: 0, lowest: None };
        let mut keep_until_ms = None;
        match request("watch", &zk, |c| c.get_and_watch_children(&parent)).await {
            Ok((names, stat, watcher)) => {
                node = watcher;
                mark.children = stat.pzxid;
                if let Some(seq) = names.iter().filter_map(|n| sequence(n)).min() {
                    let child = self.child(lock, seq);
                    match request("watch", &zk, |c| c.get_and_watch_data(&child)).await {
                        Ok((data, stat, watcher)) => {
                            lowest = Some(watcher);
                            mark.lowest = Some((seq, stat.mzxid));
                            if stat.ephemeral_owner == 0 {
                                keep_until_ms =
                                    serde_json::from_slice::<Value>(&data).ok().and_then(|v| v.keep_until_ms);
                            }
                        }
                        // Deleted since the list: changed.
                        Err(ZkError::NoNode) => return Ok(None),
                        Err(e) => return Err(self.error("watch", &e)),
                    }
                }
            }
            // Never taken: the first acquire creates the lock's node.
            Err(ZkError::NoNode) => match request("watch", &zk, |c| c.check_and_watch_stat(&parent)).await {
                Ok((None, watcher)) => node = watcher,
                Ok((Some(_), _)) => return Ok(None),
                Err(e) => return Err(self.error("watch", &e)),
            },
            Err(e) => return Err(self.error("watch", &e)),
        }
        let read = self.read.lock().unwrap().clone();
        if read.is_some_and(|(l, seen)| l == lock && seen != mark) {
            return Ok(None);
        }
        let (tell, fired) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            match lowest {
                Some(lowest) => tokio::select! {
                    _ = node.changed() => {}
                    _ = lowest.changed() => {}
                },
                None => {
                    let _ = node.changed().await;
                }
            }
            let _ = tell.send(true);
        });
        let keep_ends = keep_until_ms.map(|until| {
            // A little after the keep's end on this host's clock, as `status` judges it.
            Instant::now() + Duration::from_millis(until.saturating_sub(now_ms()) + 50)
        });
        Ok(Some(Observed { lock: lock.to_string(), fired, task, keep_ends }))
    }
}
