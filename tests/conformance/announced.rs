//! For a store whose watcher keeps its channel open between waits: each write is announced
//! on its own. The shared watch test cannot tell that apart from a notice of an earlier
//! write still waiting in the channel; here the channel is emptied before each write.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderrun::store::Store;

use super::{unique, won, Harness, SOON, TTL};

/// A take, a revoke, a keep, the revoke that frees it, a take and a release: each one ends a
/// wait that nothing else ended.
pub async fn each_write_is_announced_to_a_watcher(h: &dyn Harness) {
    let (holder, watcher) = (h.open().await, h.open().await);
    let lock = unique("announced");
    let lease = announced(&watcher, &lock, "a take", won(&*holder, &lock, "holder", TTL)).await;
    announced(&watcher, &lock, "a revoke", holder.revoke(&lock)).await.unwrap();
    holder.release(&lease, Duration::ZERO).await.unwrap();
    let lease = announced(&watcher, &lock, "a take", won(&*holder, &lock, "holder", TTL)).await;
    announced(&watcher, &lock, "a keep", holder.release(&lease, Duration::from_secs(600))).await.unwrap();
    announced(&watcher, &lock, "a revoke of a keep", holder.revoke(&lock)).await.unwrap();
    let lease = announced(&watcher, &lock, "a take", won(&*holder, &lock, "holder", TTL)).await;
    announced(&watcher, &lock, "a release", holder.release(&lease, Duration::ZERO)).await.unwrap();
}

/// Run `change` while the watcher waits on an empty channel, and see the wait end, after which
/// a read (as `leaderrun watch` makes one then) shows the change.
async fn announced<T>(watcher: &Arc<dyn Store>, lock: &str, what: &str, change: impl Future<Output = T>) -> T {
    // Until a wait runs to its bound, nothing for this lock is pending (the first may open
    // the channel).
    loop {
        let started = Instant::now();
        watcher.observe_change(lock, Duration::from_millis(200)).await;
        if started.elapsed() >= Duration::from_millis(200) {
            break;
        }
    }
    let shown = |r: leaderrun::store::LockRecord| (r.holder, r.token, r.revoked, r.kept);
    let before = shown(watcher.status(lock).await.unwrap());
    let waits = {
        let (watcher, lock) = (watcher.clone(), lock.to_string());
        tokio::spawn(async move { watcher.observe_change(&lock, Duration::from_secs(3600)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waits.is_finished(), "the watcher returned before {what}");
    let done = change.await;
    tokio::time::timeout(SOON, waits).await.unwrap_or_else(|_| panic!("the watcher never heard of {what}")).unwrap();
    let after = shown(watcher.status(lock).await.unwrap());
    assert_ne!(before, after, "the watcher returned for {what}, but a read then does not show it");
    done
}
