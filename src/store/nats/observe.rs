//! `observe_change` for the NATS store (`leaderrun watch`): one KV watch on the lock's key,
//! kept across calls, and nothing else.
//!
//! The watch starts with the key's last message (the "history" policy), and only messages
//! newer than the last `status` read count: a change between that read and the watch is not
//! missed, and one the read saw already does not wake the watcher. Every write to the record
//! is a message on the key: an acquisition, each renewal (a republish), a revoke, a keep, a
//! release (a delete marker). Where the bucket lets the server expire entries itself with a
//! marker (per-message TTL with `subject_delete_marker_ttl`, as in buckets leaderrun creates),
//! an expiry is a message too; where it expires them by max age alone (a Choria bucket), the
//! entry just goes, silently: `observing` then says `PushesWrites`, and `watch` reads again
//! when the lease it saw would lapse.
//!
//! It joins no queue group (a standby's membership there decides whose turn a release is), so
//! a release is never delivered to the watcher as a choice.

use std::pin::Pin;
use std::time::Duration;

use async_nats::jetstream::kv;
use futures_util::{Stream, StreamExt};

use super::keys::key_of;
use super::{describe, NatsStore};
use crate::store::Result;

/// What a watcher keeps between `observe_change` calls.
pub(super) struct Observed {
    lock: String,
    /// The key's messages, each by its stream sequence (the KV revision).
    watch: Pin<Box<dyn Stream<Item = std::result::Result<u64, String>> + Send>>,
}

/// How often a watcher looks for a bucket that does not exist yet (nothing to watch till then).
const NO_BUCKET_PAUSE: Duration = Duration::from_secs(1);

impl NatsStore {
    /// The sequence of the key's last message as the last `status` of `lock` read it (0: none).
    pub(super) fn note_read(&self, lock: &str, seq: u64) {
        *self.read_seq.lock().unwrap() = Some((lock.to_string(), seq));
    }

    /// Return once the key has a message newer than the last `status` read of `lock` (or the
    /// watch failed or ended: the caller reads again).
    pub(super) async fn observe(&self, lock: &str) -> Result<()> {
        let Some(bucket) = self.bucket().await? else {
            tokio::time::sleep(NO_BUCKET_PAUSE).await;
            return Ok(());
        };
        let read = self.read_seq.lock().unwrap().clone().filter(|(l, _)| l == lock).map_or(0, |(_, seq)| seq);
        let mut slot = self.observed.lock().await;
        if slot.as_ref().is_some_and(|o| o.lock != lock) {
            *slot = None;
        }
        let observed = match slot.as_mut() {
            Some(observed) => observed,
            None => {
                let watch = self.call("watch", bucket.kv.watch_with_history(key_of(lock))).await?;
                let watch = watch.map(|entry: std::result::Result<kv::Entry, kv::WatcherError>| {
                    entry.map(|entry| entry.revision).map_err(|e| describe(&e))
                });
                slot.insert(Observed { lock: lock.to_string(), watch: Box::pin(watch) })
            }
        };
        // Whatever came since the caller's read is ready at once: only what is newer counts.
        loop {
            let next = observed.watch.next().await;
            match next {
                Some(Ok(seq)) if seq <= read => {}
                Some(Ok(_)) => return Ok(()),
                Some(Err(why)) => {
                    *slot = None;
                    return Err(self.error(why));
                }
                None => {
                    *slot = None;
                    return Ok(());
                }
            }
        }
    }
}
