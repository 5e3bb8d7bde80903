//! The waiters' queue of a lock, and the watch a waiting store keeps: each waiter watches the one
//! just ahead of it, the first the lock's holder, so a release wakes one waiter, not all.
//!
//! The queue is a hint only: what decides who holds the lock is the lowest lease child, as ever.
//! A queue node is EPHEMERAL_SEQUENTIAL on its store's reads session, under `{lock}/queue` (a
//! name no lease child has: its own child counter, so lease tokens do not move on with it, and
//! `list` never sees it, being under a lock's node, not the root). Its name carries the reads
//! session's id: a create whose answer never came (a wait that ended during it) is found again.
//! A store keeps its node while it holds the lock and deletes it with its lease in one step, so
//! the next waiter wakes to a free lock.

use std::time::Duration;

use zookeeper_client::{CreateMode, Error as ZkError};

use super::nodes::MAX_RACES;
use super::sessions::{request, Zk};
use super::value::now_ms;
use super::ZooKeeperStore;
use crate::store::Result;

/// The node under a lock's node whose children are the queue.
const QUEUE: &str = "queue";
/// A queue node's name, before the reads session's id and the sequence number.
const PLACE_PREFIX: &str = "w-";

/// This store's place in a lock's queue.
pub(super) struct Place {
    lock: String,
    /// The reads session that owns the node (its ephemeral owner).
    session: i64,
    /// The node's sequence number; `None` while its create is unanswered: the node may exist.
    seq: Option<i64>,
}

/// A watch on the node ahead of this store (a waiter's, or the lock's holder's), kept while
/// this store waits for that lock.
pub(super) struct Watching {
    lock: String,
    /// Becomes true once the watch fired (the node was deleted or changed, or the session ended).
    fired: tokio::sync::watch::Receiver<bool>,
    /// The task waiting for the watch to fire.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A queue node's sequence number, from its name (`w-{session}-{seq}`).
fn queue_sequence(name: &str) -> Option<i64> {
    let rest = name.strip_prefix(PLACE_PREFIX)?;
    rest.rsplit_once('-').and_then(|(_, seq)| seq.parse::<i64>().ok()).filter(|n| *n >= 0)
}

/// The name of the reads session `session`'s queue nodes, before the sequence number.
fn place_prefix(session: i64) -> String {
    format!("{PLACE_PREFIX}{:016x}-", session as u64)
}

impl ZooKeeperStore {
    fn queue(&self, lock: &str) -> String {
        format!("{}/{QUEUE}", self.parent(lock))
    }

    /// The path of this store's node in the lock's queue, if it has one.
    pub(super) fn place_path(&self, lock: &str) -> Option<String> {
        let place = self.place.lock().unwrap();
        let place = place.as_ref().filter(|p| p.lock == lock)?;
        Some(format!("{}/{}{:010}", self.queue(lock), place_prefix(place.session), place.seq?))
    }

    /// This store left the lock's queue (its node was deleted with its lease).
    pub(super) fn forget_place(&self, lock: &str) {
        let mut place = self.place.lock().unwrap();
        if place.as_ref().is_some_and(|p| p.lock == lock) {
            *place = None;
        }
    }

    /// Return once the lock may have changed: the node ahead of this store in the queue, or the
    /// holder's child if none is, was deleted or changed. ZooKeeper watches fire once: the watch
    /// is waited for by a task of its own and kept in `watching` until it fires, so a wait that
    /// ends at the caller's bound leaves it for the next one, and an idle standby sends nothing.
    /// The first wait joins the queue.
    pub(super) async fn wait_change(&self, lock: &str) -> Result<()> {
        let mut slot = self.watching.lock().await;
        if let Some(watching) = slot.as_mut().filter(|w| w.lock == lock) {
            // Err: the task is gone without telling (aborted): the caller re-reads all the same.
            let _ = watching.fired.wait_for(|fired| *fired).await;
            *slot = None;
            return Ok(());
        }
        *slot = None;
        if !self.ready_lease_session().await? {
            // The servers grant this store's leases too short a session: the next acquire says so.
            return Ok(());
        }
        let zk = self.watch_session().await?;
        for _ in 0..MAX_RACES {
            let (ours, waiters) = self.join(&zk, lock).await?;
            let ahead = waiters.iter().filter(|(seq, _)| *seq < ours).max_by_key(|(seq, _)| *seq);
            let path = match ahead {
                Some((_, name)) => format!("{}/{name}", self.queue(lock)),
                // First in the queue: the holder's child.
                None => match self.children("list", &zk, lock).await?.and_then(|(seqs, _)| seqs.first().copied()) {
                    Some(holder) => self.child(lock, holder),
                    // The lock is free: the caller reads it again.
                    None => return Ok(()),
                },
            };
            let (stat, watcher) = match request("watch", &zk, |c| c.check_and_watch_stat(&path)).await {
                Ok((Some(stat), watcher)) => (stat, watcher),
                // Gone between the two requests: look again.
                Ok((None, _)) => continue,
                Err(e) => return Err(self.error("watch", &e)),
            };
            if ahead.is_some() || stat.ephemeral_owner != 0 {
                let (tell, fired) = tokio::sync::watch::channel(false);
                let task = tokio::spawn(async move {
                    watcher.changed().await;
                    let _ = tell.send(true);
                });
                let watching = slot.insert(Watching { lock: lock.to_string(), fired, task });
                let _ = watching.fired.wait_for(|fired| *fired).await;
                *slot = None;
                return Ok(());
            }
            drop(slot);
            // A --min-hold child: it frees the lock when its time passes, or when deleted.
            let Some((value, _)) = self.read_child("get", &zk, &path).await? else {
                return Ok(());
            };
            let left = Duration::from_millis(value.keep_until_ms.unwrap_or(0).saturating_sub(now_ms()));
            tokio::select! {
                _ = watcher.changed() => {}
                _ = tokio::time::sleep(left) => {}
            }
            return Ok(());
        }
        Ok(())
    }

    /// This store's node in the lock's queue (created on the first wait), and the queue as read
    /// after: our sequence number, and the queue's nodes (sequence number, name), lowest first.
    async fn join(&self, zk: &Zk, lock: &str) -> Result<(i64, Vec<(i64, String)>)> {
        self.leave_other_queues(lock).await;
        let prefix = place_prefix(zk.id());
        for _ in 0..MAX_RACES {
            let known = {
                let place = self.place.lock().unwrap();
                place.as_ref().filter(|p| p.lock == lock && p.session == zk.id()).map(|p| p.seq)
            };
            let mut created = None;
            if known.is_none() {
                *self.place.lock().unwrap() = Some(Place { lock: lock.to_string(), session: zk.id(), seq: None });
                let path = format!("{}/{prefix}", self.queue(lock));
                let options = CreateMode::EphemeralSequential.with_acls(self.acls());
                match request("join", zk, |c| c.create(&path, &[], &options)).await {
                    Ok((_, seq)) => created = Some(seq.into_i64()),
                    Err(ZkError::NoNode) => {
                        // The first wait on this lock: its queue is made.
                        *self.place.lock().unwrap() = None;
                        self.ensure_node(zk, &self.queue(lock)).await?;
                        continue;
                    }
                    // The node may exist (an answer that never came): found by its name next time.
                    Err(e) => return Err(self.error("join", &e)),
                }
            }
            let waiters = self.read_queue(zk, lock).await?;
            let ours = match created.or(known.flatten()) {
                Some(seq) => waiters.iter().any(|(s, _)| *s == seq).then_some(seq),
                // A create whose answer never came: our node, if it was made.
                None => waiters.iter().filter(|(_, name)| name.starts_with(&prefix)).map(|(s, _)| *s).min(),
            };
            let mut place = self.place.lock().unwrap();
            match ours {
                Some(seq) => {
                    *place = Some(Place { lock: lock.to_string(), session: zk.id(), seq: Some(seq) });
                    return Ok((seq, waiters));
                }
                // Gone (the session that owned it ended): join again.
                None => *place = None,
            }
        }
        Err(crate::store::StoreError::unavailable(format!(
            "zookeeper store {}: the queue of lock {lock:?} kept changing",
            self.shown
        )))
    }

    /// The lock's queue: the sequence number and name of each node, lowest first.
    async fn read_queue(&self, zk: &Zk, lock: &str) -> Result<Vec<(i64, String)>> {
        let queue = self.queue(lock);
        let names = match request("queue", zk, |c| c.list_children(&queue)).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => Vec::new(),
            Err(e) => return Err(self.error("queue", &e)),
        };
        let mut waiters: Vec<(i64, String)> =
            names.into_iter().filter_map(|name| queue_sequence(&name).map(|seq| (seq, name))).collect();
        waiters.sort_unstable();
        Ok(waiters)
    }

    /// A place in another lock's queue is given up (a store waits for one lock at a time).
    async fn leave_other_queues(&self, lock: &str) {
        let other = {
            let place = self.place.lock().unwrap();
            place.as_ref().filter(|p| p.lock != lock).map(|p| p.lock.clone())
        };
        if let Some(other) = other {
            self.leave_place(&other).await;
        }
    }

    /// Give up the place in `lock`'s queue (`Store::stop_waiting`): the watch and the node, if
    /// this store waits for that lock. The node's session outlives the wait, so a place left
    /// behind would hold up the waiter watching it for as long as this store lives.
    pub(super) async fn leave_queue(&self, lock: &str) {
        {
            let mut slot = self.watching.lock().await;
            if slot.as_ref().is_some_and(|w| w.lock == lock) {
                *slot = None;
            }
        }
        self.leave_place(lock).await;
    }

    /// Delete this store's node in `lock`'s queue, and forget it (nothing if its place is in
    /// another lock's queue, or it has none).
    async fn leave_place(&self, lock: &str) {
        let reads = self.inner.lock().unwrap().reads.clone();
        if let (Some(path), Some(zk)) = (self.place_path(lock), reads) {
            let _ = request("leave", &zk, |c| c.delete(&path, None)).await;
        }
        self.forget_place(lock);
    }

    /// A waiting campaign is over (this store holds the lock now): drop the watch. The place in
    /// the queue is kept until the lease is released, so the next waiter wakes then.
    pub(super) fn stop_watching(&self) {
        if let Ok(mut slot) = self.watching.try_lock() {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names() {
        let prefix = place_prefix(0x0123_4567_89ab_cdef);
        assert_eq!(prefix, "w-0123456789abcdef-");
        assert_eq!(queue_sequence(&format!("{prefix}0000000042")), Some(42));
        assert_eq!(queue_sequence(&place_prefix(-1)), None);
        assert_eq!(queue_sequence("lease-0000000001"), None);
        assert_eq!(super::super::names::sequence(&format!("{prefix}0000000042")), None, "never a lease child");
    }
}
