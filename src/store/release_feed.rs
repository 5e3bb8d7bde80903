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
//!
//! `observe` is the same care for `leaderrun watch`, on a feed of its own that hears every
//! change to a lock (not only releases) and that no waiter shares: it only listens, so it
//! takes no turn and spends no wake-up meant for a standby.

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

/// How long `observe` waits when it has no feed (it cannot be opened: the server is down, or
/// a transaction-pooling proxy refused LISTEN): the caller then reads about once a second,
/// as it would on a store that polls, and never in a tight loop.
pub const POLL_WITHOUT_FEED: Duration = Duration::from_secs(1);

/// For `leaderrun watch`: return when the feed in `slot` (opened by `open`, bounded by
/// `open_timeout`, and kept across calls) names `lock`, or after `max_wait`. While the feed
/// is open this asks the server nothing: what it hears between two calls waits in it, so a
/// change just after the caller's last read is not missed (one from before only makes this
/// return early). A feed just opened may have missed a change: this returns at once then,
/// and the caller reads. A lost feed also returns at once; one that cannot be opened waits
/// `POLL_WITHOUT_FEED` (within `max_wait`), so the caller polls.
pub async fn observe<F, Fut>(
    slot: &Mutex<Option<F>>,
    open: impl FnOnce() -> Fut,
    lock: &str,
    max_wait: Duration,
    open_timeout: Duration,
) where
    F: ReleaseFeed,
    Fut: Future<Output = std::result::Result<F, String>>,
{
    let deadline = Instant::now() + max_wait;
    let poll = || tokio::time::sleep_until(deadline.min(Instant::now() + POLL_WITHOUT_FEED));
    // Another task of this process is watching with this store: poll beside it.
    let Ok(mut guard) = slot.try_lock() else {
        return poll().await;
    };
    let Some(feed) = guard.as_mut() else {
        match tokio::time::timeout_at(deadline.min(Instant::now() + open_timeout), open()).await {
            Ok(Ok(feed)) => *guard = Some(feed),
            Ok(Err(why)) => {
                tracing::debug!("cannot hear changes, polling: {why}");
                poll().await
            }
            Err(_) => poll().await,
        }
        return;
    };
    loop {
        match tokio::time::timeout_at(deadline, feed.next()).await {
            Err(_) => return,
            Ok(Heard::Released(name)) if name == lock => return,
            Ok(Heard::Released(_) | Heard::Nothing) => continue,
            Ok(Heard::Lost) => {
                tracing::debug!("the connection that hears changes was lost");
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

    /// Observe `lock` for up to an hour; return how long it took.
    async fn observed(slot: &Mutex<Option<Scripted>>, feed: Option<Scripted>) -> Duration {
        let started = Instant::now();
        let open = || async move { feed.ok_or_else(|| "refused".to_string()) };
        observe(slot, open, "lock", HOUR, SECOND).await;
        started.elapsed()
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_returns_once_its_feed_opens_then_only_for_its_lock() {
        let (_store, slot, send, feed) = held_lock().await;
        assert_eq!(observed(&slot, Some(feed)).await, Duration::ZERO, "a feed just opened may have missed a change");
        send.send(Heard::Nothing).unwrap();
        send.send(Heard::Released("another lock".into())).unwrap();
        let announcer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            send.send(Heard::Released("lock".into())).unwrap();
            send
        });
        assert_eq!(observed(&slot, None).await, Duration::from_secs(60));
        let send = announcer.await.unwrap();
        // Heard while nobody observed: the next call returns at once.
        send.send(Heard::Released("lock".into())).unwrap();
        assert_eq!(observed(&slot, None).await, Duration::ZERO);
        send.send(Heard::Lost).unwrap();
        assert_eq!(observed(&slot, None).await, Duration::ZERO);
        assert!(slot.lock().await.is_none(), "a lost feed is dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watcher_without_a_feed_polls() {
        let (_store, slot, _send, _feed) = held_lock().await;
        assert_eq!(observed(&slot, None).await, POLL_WITHOUT_FEED);
        let started = Instant::now();
        observe(&slot, || async { Err::<Scripted, _>("down".to_string()) }, "lock", SECOND / 4, SECOND).await;
        assert_eq!(started.elapsed(), SECOND / 4, "never past max_wait");
    }
}
