//! `changed` for stores that announce releases on a channel every waiter shares
//! (PostgreSQL's LISTEN/NOTIFY, Redis pub/sub): written once here.
//!
//! A store keeps one feed (a connection that listens), opened on the first wait and
//! kept across waits, and hands it to `wait_for_release` in a mutex slot. The feed is
//! only a hint: an announcement can be missed while the connection is down, and an
//! expiry is never announced, so the elector re-reads after every return anyway. What
//! this adds is the care around the gaps:
//!
//! - Right after (re)connecting, the lock is read once: a release between the caller's
//!   last read and the subscription would otherwise go unheard until `max_wait`.
//! - A lost connection ends the wait at once (a release may have been missed) and drops
//!   the feed; the next wait connects again.
//! - While the feed cannot be opened, or another task of this process is already
//!   listening, the wait polls (`poll_until_free`) instead.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::{timeout, Instant};

use super::Store;

/// What a feed heard.
pub enum Heard {
    /// This lock was released.
    Released(String),
    /// Something else (a confirmation, another channel's message).
    Nothing,
    /// The connection is gone: announcements may have been missed.
    Lost,
}

/// A connection on which a store hears of releases.
#[async_trait]
pub trait ReleaseFeed: Send {
    /// The next thing heard (waits for it).
    async fn next(&mut self) -> Heard;
}

/// Return when `lock` was announced released, may have been, or after `max_wait`.
///
/// `slot` holds the store's feed between waits; `open` makes a new one, bounded by
/// `open_timeout`; `poll_every` paces the polling fallback.
pub async fn wait_for_release<S, F, Fut>(
    store: &S,
    slot: &Mutex<Option<F>>,
    open: impl FnOnce() -> Fut,
    lock: &str,
    max_wait: Duration,
    open_timeout: Duration,
    poll_every: Duration,
) where
    S: Store + ?Sized,
    F: ReleaseFeed,
    Fut: Future<Output = std::result::Result<F, String>>,
{
    let deadline = Instant::now() + max_wait;
    let poll = |deadline: Instant| {
        super::poll_until_free(store, lock, deadline.saturating_duration_since(Instant::now()), poll_every)
    };
    // Another task of this process is listening: poll rather than queue behind it.
    let Ok(mut guard) = slot.try_lock() else {
        return poll(deadline).await;
    };
    let mut open = Some(open);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let feed = match (guard.as_mut(), open.take()) {
            (Some(feed), _) => feed,
            (None, Some(open)) => match timeout(left.min(open_timeout), open()).await {
                Ok(Ok(feed)) => {
                    let feed = guard.insert(feed);
                    if !matches!(store.status(lock).await, Ok(record) if record.is_held()) {
                        tracing::trace!("free (or unknown) when the feed opened");
                        return;
                    }
                    feed
                }
                // Poll for this wait; the next one tries to open a feed again.
                Ok(Err(why)) => {
                    tracing::debug!("cannot hear releases, polling: {why}");
                    return poll(deadline).await;
                }
                Err(_) => return poll(deadline).await,
            },
            // Opened once already in this wait, and lost again: let the caller re-read.
            (None, None) => return,
        };
        match timeout(left, feed.next()).await {
            Err(_) => return,
            Ok(Heard::Released(name)) if name == lock => return,
            Ok(Heard::Released(_)) | Ok(Heard::Nothing) => continue,
            Ok(Heard::Lost) => {
                tracing::debug!("the connection that hears releases was lost");
                *guard = None;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

    use super::*;
    use crate::clock::{Clock, TokioClock};
    use crate::store::memory::MemoryStore;

    /// A feed whose announcements the test sends.
    struct Scripted(UnboundedReceiver<Heard>);

    #[async_trait]
    impl ReleaseFeed for Scripted {
        async fn next(&mut self) -> Heard {
            self.0.recv().await.unwrap_or(Heard::Lost)
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const SECOND: Duration = Duration::from_secs(1);

    /// A store where `lock` is held, an empty feed slot, and the sender of a feed to open.
    async fn held_lock() -> (MemoryStore, Mutex<Option<Scripted>>, UnboundedSender<Heard>, Scripted) {
        let clock: Arc<dyn Clock> = Arc::new(TokioClock::new());
        let store = MemoryStore::new(clock);
        store.acquire("lock", "holder", HOUR).await.unwrap();
        let (send, receive) = unbounded_channel();
        (store, Mutex::new(None), send, Scripted(receive))
    }

    /// Wait on `lock` for up to an hour; return how long it took.
    async fn wait(store: &MemoryStore, slot: &Mutex<Option<Scripted>>, feed: Option<Scripted>) -> Duration {
        let started = Instant::now();
        let open = || async move { feed.ok_or_else(|| "refused".to_string()) };
        wait_for_release(store, slot, open, "lock", HOUR, SECOND, SECOND).await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn only_this_locks_release_ends_the_wait_and_the_feed_is_kept() {
        let (store, slot, send, feed) = held_lock().await;
        send.send(Heard::Nothing).unwrap();
        send.send(Heard::Released("another lock".into())).unwrap();
        let announcer = {
            let send = send.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(60)).await;
                send.send(Heard::Released("lock".into())).unwrap();
            })
        };
        assert_eq!(wait(&store, &slot, Some(feed)).await, Duration::from_secs(60));
        announcer.await.unwrap();
        assert!(slot.lock().await.is_some(), "the feed is kept for the next wait");
        // The next wait uses the kept feed: no new one is opened.
        send.send(Heard::Released("lock".into())).unwrap();
        assert_eq!(wait(&store, &slot, None).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_feed_ends_the_wait_and_is_dropped() {
        let (store, slot, send, feed) = held_lock().await;
        send.send(Heard::Lost).unwrap();
        assert_eq!(wait(&store, &slot, Some(feed)).await, Duration::ZERO);
        assert!(slot.lock().await.is_none(), "the next wait opens a new feed");
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_before_the_feed_opened_is_not_missed() {
        let (store, slot, _send, feed) = held_lock().await;
        store.free("lock");
        assert_eq!(wait(&store, &slot, Some(feed)).await, Duration::ZERO, "the read after opening sees it free");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_feed_the_wait_polls_until_the_lock_is_free() {
        let (store, slot, _send, _feed) = held_lock().await;
        let store = Arc::new(store);
        let freer = {
            let store = store.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(30)).await;
                store.free("lock");
            })
        };
        let waited = wait(&store, &slot, None).await;
        freer.await.unwrap();
        assert!(waited >= Duration::from_secs(30) && waited < Duration::from_secs(32), "{waited:?}");
    }
}
