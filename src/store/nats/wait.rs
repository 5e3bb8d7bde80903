//! `changed` for the NATS store: a waiting campaign's watch on the lock's key and its place in
//! the key's queue group, kept across calls (see `turn` for whose turn it is, and why).
//!
//! What a waiting store sends: at its first wait, one watch (an ordered consumer), one queue
//! subscription and one read. Then nothing while it waits, releases and new holders included:
//! every message on the key reaches it on the watch, and the queue brings it, now and then,
//! one of the messages published there. Once it holds the lock it closes both (two
//! unsubscribes, answered by nothing).

use std::pin::Pin;

use async_nats::jetstream::kv;
use async_nats::Message;
use futures_util::{FutureExt, Stream, StreamExt};
use tokio::time::{sleep_until, Instant};

use super::keys::key_of;
use super::turn::{stagger, Turn, Turns};
use super::{describe, NatsStore, EXPECTED, KV_OPERATION, REQUEST_TIMEOUT};
use crate::store::Result;

/// The queue group every leaderrun waiter joins on its lock's key. The subject is the key's
/// own, so one name serves every lock.
const QUEUE_GROUP: &str = "leaderrun";

/// One message the watch showed: its stream sequence, and whether it frees the lock (a
/// delete, purge or expiry marker); or why the watch failed.
type Watched = std::result::Result<(u64, bool), String>;

/// What a waiting campaign keeps between `changed` calls on one lock.
pub(super) struct Watching {
    pub lock: String,
    /// The KV watch on the key.
    watch: Pin<Box<dyn Stream<Item = Watched> + Send>>,
    /// The queue subscription on the key's subject. `None` when it could not be made: this
    /// waiter is never chosen and always staggers. (A subscription the server refuses for want
    /// of permission is kept, and stays silent: the server delivers nothing to it, and
    /// chooses among the other waiters.)
    queue: Option<Pin<Box<dyn Stream<Item = Message> + Send>>>,
    turns: Turns,
    /// The marker the last `changed` returned for (its turn came): the next acquire expects it
    /// to be the key's last message still, and publishes without reading first.
    pub woke: Option<u64>,
}

/// What came first while waiting.
enum Sign {
    Watched(Option<Watched>),
    Queued(Option<Message>),
    Timer,
}

/// The watch's entries as the turn logic needs them.
fn watched(entry: std::result::Result<kv::Entry, kv::WatcherError>) -> Watched {
    entry.map(|entry| (entry.revision, entry.operation != kv::Operation::Put)).map_err(|e| describe(&e))
}

impl Watching {
    fn new(
        lock: &str,
        watch: Pin<Box<dyn Stream<Item = Watched> + Send>>,
        queue: Option<Pin<Box<dyn Stream<Item = Message> + Send>>>,
        turns: Turns,
    ) -> Self {
        Self { lock: lock.to_string(), watch, queue, turns, woke: None }
    }

    /// Wait until it is this waiter's turn; the marker that freed the lock, or why the watch
    /// failed.
    async fn turn(&mut self) -> std::result::Result<u64, String> {
        loop {
            // What came while the caller was away: a turn may have come and gone.
            self.drain()?;
            let until = match self.turns.turn(Instant::now()) {
                Turn::Go { marker } => return Ok(marker),
                Turn::Wait { until } => until,
            };
            let Watching { watch, queue, .. } = self;
            let queued = async {
                match queue.as_mut() {
                    Some(queue) => queue.next().await,
                    None => std::future::pending().await,
                }
            };
            let sign = tokio::select! {
                entry = watch.next() => Sign::Watched(entry),
                message = queued => Sign::Queued(message),
                () = sleep_until(until.unwrap_or_else(Instant::now)), if until.is_some() => Sign::Timer,
            };
            match sign {
                Sign::Watched(entry) => self.see(entry)?,
                Sign::Queued(message) => self.hear(message),
                Sign::Timer => {}
            }
        }
    }

    /// Take in every message already there, the watch's first.
    fn drain(&mut self) -> std::result::Result<(), String> {
        while let Some(entry) = self.watch.next().now_or_never() {
            self.see(entry)?;
        }
        while let Some(message) = self.queue.as_mut().and_then(|queue| queue.next().now_or_never()) {
            self.hear(message);
        }
        Ok(())
    }

    /// One message on the watch.
    fn see(&mut self, entry: Option<Watched>) -> std::result::Result<(), String> {
        match entry {
            Some(Ok((seq, gone))) => {
                self.turns.watched(seq, gone, Instant::now(), stagger());
                Ok(())
            }
            Some(Err(why)) => Err(why),
            None => Err("the watch ended".to_string()),
        }
    }

    /// One message from the queue: a delete chooses this waiter; anything else (a holder's
    /// write) is not its business.
    fn hear(&mut self, message: Option<Message>) {
        let Some(message) = message else {
            // The client is closing: wait on the watch alone.
            self.queue = None;
            return;
        };
        let header = |name: &str| message.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str().trim());
        if matches!(header(KV_OPERATION), Some("DEL" | "PURGE")) {
            let deleted = header(EXPECTED).and_then(|seq| seq.parse().ok());
            self.turns.chosen(deleted, Instant::now());
        }
    }
}

impl NatsStore {
    /// Return when it may be this store's turn to take `lock` (see `turn`), or when the watch
    /// failed or ended (dropped, to be opened anew by the next call; the caller re-reads).
    pub(super) async fn wait_turn(&self, lock: &str) -> Result<()> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(());
        };
        let mut slot = self.watching.lock().await;
        if slot.as_ref().is_some_and(|w| w.lock != lock) {
            *slot = None;
        }
        let watching = match slot.as_mut() {
            Some(watching) => watching,
            None => slot.insert(self.open_watch(bucket, lock).await?),
        };
        watching.woke = None;
        match watching.turn().await {
            Ok(marker) => {
                watching.woke = Some(marker);
                Ok(())
            }
            Err(why) => {
                *slot = None;
                Err(self.error(why))
            }
        }
    }

    /// Set up the wait: watch the key, join its queue group, then read it, so that nothing
    /// after the read is missed by either.
    async fn open_watch(&self, bucket: &super::Bucket, lock: &str) -> Result<Watching> {
        let watch = self.call("watch", bucket.kv.watch(key_of(lock))).await?.map(watched);
        let queue = self.join_queue(lock).await;
        let entry = self.read(bucket, lock).await?;
        let (seq, gone) = entry.map_or((0, true), |e| (e.seq, e.gone));
        let turns = Turns::read(seq, gone, Instant::now());
        Ok(Watching::new(lock, Box::pin(watch), queue.map(|q| Box::pin(q) as _), turns))
    }

    /// Subscribe to the key's subject in the waiters' queue group. The subscription is sent
    /// before the read that follows, on the same connection, so the server has it first.
    async fn join_queue(&self, lock: &str) -> Option<async_nats::Subscriber> {
        tracing::trace!(op = "queue-subscribe", "store request");
        let client = self.js().client();
        let join = client.queue_subscribe(self.subject(lock), QUEUE_GROUP.to_string());
        match tokio::time::timeout(REQUEST_TIMEOUT, join).await {
            Ok(Ok(queue)) => Some(queue),
            Ok(Err(e)) => {
                tracing::debug!("waiting without the queue group (every release costs a stagger): {e}");
                None
            }
            Err(_) => {
                tracing::debug!("waiting without the queue group: the client did not take the subscription");
                None
            }
        }
    }

    /// The marker this store's last wait on `lock` ended at, once: the acquire that follows
    /// expects it and sends no read first.
    pub(super) fn take_wake(&self, lock: &str) -> Option<u64> {
        let mut slot = self.watching.try_lock().ok()?;
        slot.as_mut().filter(|w| w.lock == lock).and_then(|w| w.woke.take())
    }

    /// An acquire found `lock` held by the message `seq`: if this store waits on it, the turn
    /// its watch may still show as open is over.
    pub(super) fn note_held(&self, lock: &str, seq: u64) {
        if let Ok(mut slot) = self.watching.try_lock() {
            if let Some(watching) = slot.as_mut().filter(|w| w.lock == lock) {
                watching.turns.held_at(seq);
            }
        }
    }

    /// A waiting campaign is over (this store holds the lock now): close the watch, and leave
    /// the queue group, so that its own release is never delivered to it as a choice.
    pub(super) fn stop_watching(&self) {
        if let Ok(mut slot) = self.watching.try_lock() {
            *slot = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::HeaderMap;
    use futures_util::stream;

    use super::super::turn::{STAGGER_FROM, STAGGER_TO};
    use super::*;

    /// A message on the key's subject, as the queue delivers it.
    fn queued(operation: Option<&str>, expected: Option<u64>) -> Message {
        let mut headers = HeaderMap::new();
        if let Some(operation) = operation {
            headers.insert(KV_OPERATION, operation);
        }
        if let Some(expected) = expected {
            headers.insert(EXPECTED, expected.to_string());
        }
        Message {
            subject: "$KV.leaderrun.lock".into(),
            reply: None,
            payload: Default::default(),
            headers: Some(headers),
            status: None,
            description: None,
            length: 0,
        }
    }

    /// A waiter that read the lock held by message 5, whose watch shows `watch` (then nothing
    /// more) and whose queue, if it has one, brings `queue`.
    fn waiter(watch: Vec<Watched>, queue: Option<Vec<Message>>) -> Watching {
        let watch = stream::iter(watch).chain(stream::pending());
        let queue = queue.map(|q| Box::pin(stream::iter(q).chain(stream::pending())) as _);
        Watching::new("lock", Box::pin(watch), queue, Turns::read(5, false, Instant::now()))
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_delivered_by_the_queue_is_taken_at_once() {
        let started = Instant::now();
        let mut waiter = waiter(vec![Ok((6, true))], Some(vec![queued(Some("DEL"), Some(5))]));
        assert_eq!(waiter.turn().await, Ok(6));
        assert_eq!(started.elapsed(), Duration::ZERO, "no stagger for the chosen waiter");
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_not_chosen_staggers() {
        // The queue brought it only a holder's write and a refused delete of an older message.
        let others = vec![queued(None, Some(4)), queued(Some("DEL"), Some(3))];
        for queue in [Some(others), None] {
            let started = Instant::now();
            let mut waiter = waiter(vec![Ok((6, true))], queue);
            assert_eq!(waiter.turn().await, Ok(6));
            assert!((STAGGER_FROM..STAGGER_TO).contains(&started.elapsed()), "{:?}", started.elapsed());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_holder_seen_during_the_stagger_keeps_the_waiter_waiting() {
        let put_soon = stream::once(async {
            tokio::time::sleep(STAGGER_FROM / 2).await;
            Ok((7, false))
        });
        let watch = stream::iter(vec![Ok((6, true))]).chain(put_soon).chain(stream::pending());
        let mut waiter = Watching::new("lock", Box::pin(watch), None, Turns::read(5, false, Instant::now()));
        assert!(tokio::time::timeout(Duration::from_secs(3600), waiter.turn()).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_watch_ends_the_wait() {
        let mut waiter = waiter(vec![Err("gone away".into())], None);
        assert_eq!(waiter.turn().await, Err("gone away".to_string()));
        let mut ended = Watching::new("lock", Box::pin(stream::empty()), None, Turns::read(5, false, Instant::now()));
        assert_eq!(ended.turn().await, Err("the watch ended".to_string()));
    }
}
