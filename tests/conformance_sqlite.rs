//! The conformance suite against the embedded SQLite store (no server: a "restart"
//! drops every connection and reopens the file).

mod conformance;

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use conformance::Harness;
use leaderrun::store::kind::StoreSpec;
use leaderrun::store::sqlite::SqliteFile;
use leaderrun::store::{Access, Store};

struct Sqlite {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

async fn sqlite() -> Sqlite {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    Sqlite { _dir: dir, path }
}

#[async_trait]
impl Harness for Sqlite {
    async fn open(&self) -> Arc<dyn Store> {
        let spec = SqliteFile { path: self.path.clone(), default: false };
        Arc::from(spec.open(Access::Create).await.expect("open the SQLite store"))
    }

    async fn restart(&self) {}
}

conformance_suite!(sqlite());

/// What only the SQLite store does: waiters queue in the kernel on a file beside the
/// database. Leases here last an hour, so only the queue (or a hint) can have woken a wait.
mod wake {
    use std::sync::Arc;
    use std::time::Duration;

    use leaderrun::store::{Acquire, Lease, Store};

    use super::conformance::{count_requests, held, unique, won, Harness, SOON};
    use super::sqlite;

    const HOUR: Duration = Duration::from_secs(3600);

    /// Campaign as the elector does: acquire; while held, wait for a change.
    async fn campaign(store: &dyn Store, lock: &str, identity: &str, ttl: Duration) -> Lease {
        loop {
            match store.acquire(lock, identity, ttl).await.expect("acquire") {
                Acquire::Won(lease) => return lease,
                Acquire::Held(_) => store.changed(lock, HOUR).await,
                other => panic!("{other:?}"),
            }
        }
    }

    fn wait_in_background(store: Arc<dyn Store>, lock: &str) -> tokio::task::JoinHandle<()> {
        let lock = lock.to_string();
        tokio::spawn(async move { store.changed(&lock, HOUR).await })
    }

    /// Until `task` ends, or a failure naming `what`.
    async fn ends<T>(task: tokio::task::JoinHandle<T>, what: &str) -> T {
        tokio::time::timeout(SOON, task).await.unwrap_or_else(|_| panic!("{what}")).expect("task")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_queued_waiter_wakes_on_release_and_not_before() {
        let h = sqlite().await;
        let (a, b) = (h.open().await, h.open().await);
        let lock = unique("queued");
        let lease = won(&*a, &lock, "a", HOUR).await;
        held(&*b, &lock, "b").await;
        let waiter = wait_in_background(b.clone(), &lock);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "the wait ended while the lock was held");
        a.release(&lease, Duration::ZERO).await.unwrap();
        ends(waiter, "a release never woke the queued waiter").await;
        won(&*b, &lock, "b", HOUR).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_holder_that_never_releases_is_taken_over_at_expiry() {
        let h = sqlite().await;
        let lock = unique("hung");
        // A hung holder: its client stays open (it keeps its place) and never renews.
        let hung = h.open().await;
        let first = won(&*hung, &lock, "hung", Duration::from_millis(800)).await;
        let b = h.open().await;
        let task = {
            let (b, lock) = (b.clone(), lock.clone());
            tokio::spawn(async move { campaign(&*b, &lock, "b", HOUR).await })
        };
        let next = ends(task, "a lapsed lease was never taken over").await;
        assert!(next.token > first.token);
        // A holder whose process died (its client dropped: the kernel drops its place).
        let lock = unique("dead");
        let dead = h.open().await;
        let first = won(&*dead, &lock, "dead", Duration::from_millis(800)).await;
        drop(dead);
        let task = {
            let (b, lock) = (b.clone(), lock.clone());
            tokio::spawn(async move { campaign(&*b, &lock, "b", HOUR).await })
        };
        let next = ends(task, "a dead holder's lease was never taken over").await;
        assert!(next.token > first.token);
    }

    /// A one-shot run that wins while a waiter is at the head of the queue holds the lease
    /// without the queue's byte; its release still wakes the head (inotify on the file).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_holder_outside_the_queue_wakes_the_head_on_release() {
        let h = sqlite().await;
        let (x, w, oneshot) = (h.open().await, h.open().await, h.open().await);
        let lock = unique("outside");
        let first = won(&*x, &lock, "x", HOUR).await;
        held(&*w, &lock, "w").await;
        let waiter = wait_in_background(w.clone(), &lock);
        tokio::time::sleep(Duration::from_millis(100)).await;
        x.release(&first, Duration::ZERO).await.unwrap();
        ends(waiter, "the release never woke the waiter").await;
        // w is at the head now; the one-shot run takes the lease before w does.
        let lease = won(&*oneshot, &lock, "oneshot", HOUR).await;
        held(&*w, &lock, "w").await;
        let waiter = wait_in_background(w.clone(), &lock);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "the head's wait ended while the lock was held");
        oneshot.release(&lease, Duration::ZERO).await.unwrap();
        ends(waiter, "a release outside the queue never woke its head").await;
        won(&*w, &lock, "w", HOUR).await;
    }

    /// A waiter that stops waiting (its --timeout ran out) while its client lives on does not
    /// hold up the waiters behind it for longer than a moment.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_waiter_that_gives_up_leaves_the_queue() {
        let h = sqlite().await;
        let (a, quitter, c) = (h.open().await, h.open().await, h.open().await);
        let lock = unique("quit");
        let lease = won(&*a, &lock, "a", HOUR).await;
        held(&*quitter, &lock, "quitter").await;
        quitter.changed(&lock, Duration::from_millis(200)).await;
        held(&*c, &lock, "c").await;
        let waiter = wait_in_background(c.clone(), &lock);
        tokio::time::sleep(Duration::from_millis(100)).await;
        a.release(&lease, Duration::ZERO).await.unwrap();
        ends(waiter, "the waiter behind one that gave up was never woken").await;
        won(&*c, &lock, "c", HOUR).await;
        drop(quitter);
    }

    /// A hundred waiters on one lock, each taking its turn once, at 2 to 10 requests a handoff.
    #[tokio::test]
    async fn a_hundred_waiters_each_get_their_turn_once() {
        let (requests, _counting) = count_requests();
        crate::conformance::a_hundred_waiters_take_turns(&sqlite().await, &requests, 2.0..10.0).await;
    }
}

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&sqlite().await, &requests).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_write_is_announced_to_a_watcher() {
    conformance::announced::each_write_is_announced_to_a_watcher(&sqlite().await).await;
}
