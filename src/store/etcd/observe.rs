//! `observe_change` for the etcd store (`leaderrun watch`): one watcher on the lock key,
//! kept across calls, and nothing else.
//!
//! It is opened from the revision after the last `status` read of the lock, so that a change
//! between that read and the watch is not missed, and it is kept open while the caller reads
//! again: an idle watcher sends nothing. Everything that changes the record is a write to the
//! lock key that the watch shows: an acquisition, a revoke (a re-put), a keep (a re-put on a
//! new lease), a release (the key deleted with its lease), and an expiry (etcd deletes the key
//! when its lease lapses). A renewal is a LeaseKeepAlive, which does not touch the key: the
//! watcher does not see renewals, and needs not (the record it shows does not change).
//!
//! It never writes: no queue entry (a standby's `changed` has one, and its place in line is
//! what decides whose turn a release is), no lease.

use tonic::{Status, Streaming};

use super::client::store_error;
use super::wire::{self, WatchResponse};
use super::EtcdStore;
use crate::store::Result;

/// What a watcher keeps between `observe_change` calls.
pub(super) struct Observed {
    lock: String,
    stream: Streaming<WatchResponse>,
}

/// What one message on the watch means to a watcher that has read the record at `read`.
enum Seen {
    /// Nothing newer than the read (the watcher's creation, or events the read already saw).
    Nothing,
    /// The record changed after the read.
    Change,
    /// The watch is over (cancelled, as after a compaction, or the stream ended).
    Ended,
}

fn judge(message: std::result::Result<Option<WatchResponse>, Status>, read: i64) -> std::result::Result<Seen, Status> {
    Ok(match message? {
        Some(answer) if answer.canceled => Seen::Ended,
        Some(answer) => {
            let newer = answer.events.iter().any(|e| e.kv.as_ref().is_none_or(|kv| kv.mod_revision > read));
            if newer {
                Seen::Change
            } else {
                Seen::Nothing
            }
        }
        None => Seen::Ended,
    })
}

impl EtcdStore {
    /// The revision of the last `status` read of `lock`, if it was the last lock read.
    pub(super) fn note_read(&self, lock: &str, revision: Option<i64>) {
        if let Some(revision) = revision {
            *self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((lock.to_string(), revision));
        }
    }

    fn last_read(&self, lock: &str) -> Option<i64> {
        let read = self.read.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        read.as_ref().filter(|(l, _)| l == lock).map(|&(_, revision)| revision)
    }

    /// Return once the lock key changed after the last `status` read (or the watch ended or
    /// failed: the caller reads again). Without a read of this lock first, the watch starts
    /// from etcd's current revision.
    pub(super) async fn observe(&self, lock: &str) -> Result<()> {
        let mut slot = self.observed.lock().await;
        let read = self.last_read(lock);
        if slot.as_ref().is_some_and(|o| o.lock != lock) {
            *slot = None;
        }
        let observed = match slot.as_mut() {
            Some(observed) => observed,
            None => {
                let start_revision = read.map_or(0, |r| r + 1);
                let key = self.lock_key(lock).into_bytes();
                let create = wire::WatchCreateRequest { key, range_end: vec![], start_revision };
                let stream = self.call("watch", self.connection.watch(vec![create])).await?;
                slot.insert(Observed { lock: lock.to_string(), stream })
            }
        };
        let read = read.unwrap_or(0);
        // Whatever came since the caller's read is ready at once: only what is newer counts.
        loop {
            let message = observed.stream.message().await;
            match judge(message, read) {
                Ok(Seen::Nothing) => {}
                Ok(Seen::Change) => return Ok(()),
                Ok(Seen::Ended) => {
                    *slot = None;
                    return Ok(());
                }
                Err(status) => {
                    *slot = None;
                    return Err(store_error(&self.shown, &status));
                }
            }
        }
    }
}
