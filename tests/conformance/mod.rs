//! The store conformance suite: written once, run against every store.
//!
//! A store joins by implementing `Harness` (open a fresh store — a new connection,
//! as a separate leaderrun process would have — and restart its server) and calling
//! `conformance_suite!(harness_expression)` in its own test file. Every test waits on
//! events with generous bounds; none asserts how fast anything happened.

#![allow(dead_code)]

pub mod announced;
pub mod slots;

pub use slots::{a_standby_that_stops_waiting_holds_no_one_up, slots_are_locks_of_their_own};

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use leaderrun::store::{Acquire, Lease, Renew, Store};

/// Generous bound on anything that should happen "soon".
pub const SOON: Duration = Duration::from_secs(30);
/// The lease duration the suite asks for, unless a test needs it short.
pub const TTL: Duration = Duration::from_secs(30);

#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// A new client of the same store, as another leaderrun process would open it.
    async fn open(&self) -> Arc<dyn Store>;
    /// Stop and start the store's server (for an embedded store: drop every client and
    /// reopen the file). Leases written before must survive.
    async fn restart(&self);
}

/// A lock name no other test uses.
pub fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

pub async fn won(store: &dyn Store, lock: &str, identity: &str, ttl: Duration) -> Lease {
    match store.acquire(lock, identity, ttl).await.expect("acquire") {
        Acquire::Won(lease) => lease,
        Acquire::Confirm { lease, after } => confirmed(store, lease, after, ttl).await,
        Acquire::Held(record) | Acquire::Unproven { record, .. } => {
            panic!("{identity} expected to win {lock:?}, held by {:?}", record.holder)
        }
    }
}

/// A won write that must be confirmed (a Choria bucket): a win only once a renewal sent after
/// the cool-down succeeds, as the elector does it.
pub async fn confirmed(store: &dyn Store, lease: Lease, after: Duration, ttl: Duration) -> Lease {
    tokio::time::sleep(after).await;
    assert_eq!(store.renew(&lease, ttl).await.expect("confirm"), Renew::Renewed, "the cool-down lost {lease:?}");
    lease
}

pub async fn held(store: &dyn Store, lock: &str, identity: &str) {
    held_for(store, lock, identity, TTL).await
}

/// `held`, asking for `ttl` (a store may not keep the suite's).
pub async fn held_for(store: &dyn Store, lock: &str, identity: &str, ttl: Duration) {
    match store.acquire(lock, identity, ttl).await.expect("acquire") {
        Acquire::Won(lease) | Acquire::Confirm { lease, .. } => {
            panic!("{identity} took {lock:?} (token {}) while it was held", lease.token)
        }
        Acquire::Held(record) | Acquire::Unproven { record, .. } => {
            assert!(record.is_held(), "a refused acquire must report a holder: {record:?}")
        }
    }
}

pub async fn exclusive_acquire_with_50_contenders(h: &dyn Harness) {
    let lock = unique("fifty");
    let mut stores = Vec::new();
    for _ in 0..50 {
        stores.push(h.open().await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let mut tasks = Vec::new();
    for (i, store) in stores.into_iter().enumerate() {
        let (lock, barrier) = (lock.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.acquire(&lock, &format!("contender-{i}"), TTL).await
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.expect("task").expect("no contender may see a store error") {
            Acquire::Won(lease) => winners.push(lease),
            Acquire::Confirm { lease, .. } => panic!("the suite's stores win at once: {lease:?}"),
            Acquire::Held(record) | Acquire::Unproven { record, .. } => assert!(record.is_held()),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one of 50 must win: {winners:?}");
    let status = h.open().await.status(&lock).await.unwrap();
    assert_eq!(status.holder.as_deref(), Some(winners[0].identity.as_str()));
    assert_eq!(status.token, winners[0].token);
}

pub async fn renew_by_the_holder_only(h: &dyn Harness) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("renew");
    let lease = won(&*a, &lock, "a", TTL).await;
    assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    assert_eq!(b.renew(&lease, TTL).await.unwrap(), Renew::Renewed, "any client may renew with the lease");
    let impostor = Lease { identity: "b".into(), ..lease.clone() };
    assert!(matches!(b.renew(&impostor, TTL).await.unwrap(), Renew::Lost(_)), "another identity must not renew");
    let stale = Lease { token: lease.token + 1, ..lease.clone() };
    assert!(matches!(b.renew(&stale, TTL).await.unwrap(), Renew::Lost(_)), "another token must not renew");
    held(&*b, &lock, "b").await;
    held(&*a, &lock, "a").await; // not even by the holder's own identity: one lease, one token
}

pub async fn expiry_frees_the_lock(h: &dyn Harness) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("expiry");
    let first = won(&*a, &lock, "a", Duration::from_millis(300)).await;
    held(&*b, &lock, "b").await;
    let started = Instant::now();
    let second = loop {
        if let Acquire::Won(lease) = b.acquire(&lock, "b", TTL).await.unwrap() {
            break lease;
        }
        assert!(started.elapsed() < SOON, "an expired lease was never freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(second.token > first.token);
    assert!(matches!(a.renew(&first, TTL).await.unwrap(), Renew::Lost(_)), "the expired holder must not renew");
}

pub async fn release_frees_the_lock_at_once(h: &dyn Harness) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("release");
    let lease = won(&*a, &lock, "a", TTL).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    assert!(!b.status(&lock).await.unwrap().is_held());
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token);
    // A second release of the old lease must not free the new holder's.
    a.release(&lease, Duration::ZERO).await.unwrap();
    assert_eq!(b.status(&lock).await.unwrap().holder.as_deref(), Some("b"));
}

pub async fn release_with_keep_holds_until_then(h: &dyn Harness) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("keep");
    let lease = won(&*a, &lock, "a", TTL).await;
    a.release(&lease, Duration::from_secs(600)).await.unwrap();
    let status = b.status(&lock).await.unwrap();
    assert_eq!(status.holder.as_deref(), Some("a"), "the lease stays taken for --min-hold");
    assert!(status.expires_in.unwrap() > Duration::from_secs(300));
    held(&*b, &lock, "b").await;
    // A keep that has already passed frees it at once.
    let lock = unique("keep-passed");
    let lease = won(&*a, &lock, "a", TTL).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.release(&lease, Duration::from_millis(1)).await.unwrap();
    won(&*b, &lock, "b", TTL).await;
}

/// `leaderrun release` on a lock that is only kept for --min-hold (its child has exited and
/// its holder is gone) frees it at once: nobody else would, for up to a month.
pub async fn revoke_frees_a_min_hold_keep_at_once(h: &dyn Harness) {
    let (a, admin, b) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("revoke-keep");
    let lease = won(&*a, &lock, "a", TTL).await;
    a.release(&lease, Duration::from_secs(3600)).await.unwrap();
    held(&*b, &lock, "b").await;
    let before = admin.revoke(&lock).await.unwrap().expect("a kept lock is held");
    assert_eq!((before.holder.as_deref(), before.token), (Some("a"), lease.token));
    assert!(!admin.status(&lock).await.unwrap().is_held(), "the keep ended at once");
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token);
    // A live lease is still only asked to stand down, never freed under its child.
    admin.revoke(&lock).await.unwrap().expect("b holds it");
    held(&*a, &lock, "a").await;
}

/// An acquire whose answer was lost may have been granted: `abandon` frees it when it is
/// this identity's, from the client that asked or from a fresh one, and leaves another
/// identity's lease alone.
pub async fn abandon_frees_only_this_identitys_lease(h: &dyn Harness) {
    let (a, fresh, b) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("abandon");
    let lease = won(&*a, &lock, "ghost", TTL).await;
    a.abandon(&lock, "somebody-else").await.unwrap();
    assert_eq!(b.status(&lock).await.unwrap().holder.as_deref(), Some("ghost"));
    a.abandon(&lock, "ghost").await.unwrap();
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token);
    a.abandon(&lock, "ghost").await.unwrap();
    assert_eq!(b.status(&lock).await.unwrap().holder.as_deref(), Some("b"), "b's lease is not touched");
    b.release(&next, Duration::ZERO).await.unwrap();

    let lock = unique("abandon-fresh");
    won(&*a, &lock, "ghost", TTL).await;
    fresh.abandon(&lock, "ghost").await.unwrap();
    won(&*b, &lock, "b", TTL).await;
}

pub async fn tokens_strictly_increase(h: &dyn Harness) {
    let store = h.open().await;
    let lock = unique("tokens");
    let mut last = 0;
    for i in 0..100 {
        let lease = won(&*store, &lock, &format!("holder-{i}"), TTL).await;
        assert!(lease.token > last, "token {} after {last}", lease.token);
        last = lease.token;
        store.release(&lease, Duration::ZERO).await.unwrap();
    }
}

pub async fn status_list_and_revoke_agree(h: &dyn Harness) {
    let store = h.open().await;
    let (held_lock, free_lock) = (unique("status-held"), unique("status-free"));
    let lease = won(&*store, &held_lock, "a", TTL).await;
    let gone = won(&*store, &free_lock, "b", TTL).await;
    store.release(&gone, Duration::ZERO).await.unwrap();

    let status = store.status(&held_lock).await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("a"), lease.token));
    assert!(status.held_since.is_some() && status.expires_in.is_some() && !status.revoked);
    let free = store.status(&free_lock).await.unwrap();
    assert!(!free.is_held() && free.token == gone.token && free.expires_in.is_none());
    let never = store.status(&unique("never-seen")).await.unwrap();
    assert!(!never.is_held() && never.token == 0);

    let listed = store.list().await.unwrap();
    let names: BTreeSet<&str> = listed.iter().map(|r| r.lock.as_str()).collect();
    assert!(names.contains(held_lock.as_str()) && names.contains(free_lock.as_str()), "{names:?}");
    let in_list = listed.iter().find(|r| r.lock == held_lock).unwrap();
    assert_eq!((in_list.holder.as_deref(), in_list.token), (Some("a"), lease.token));

    let before = store.revoke(&held_lock).await.unwrap().expect("a held lock is revoked");
    assert_eq!(before.holder.as_deref(), Some("a"));
    assert!(store.revoke(&free_lock).await.unwrap().is_none(), "a free lock has nothing to revoke");
    let status = store.status(&held_lock).await.unwrap();
    assert!(status.is_held() && status.revoked, "revoked, but held until its holder stands down: {status:?}");
}

pub async fn revoked_holder_sees_it_at_the_next_renewal(h: &dyn Harness) {
    let (a, admin, b) = (h.open().await, h.open().await, h.open().await);
    let lock = unique("revoke");
    let lease = won(&*a, &lock, "a", TTL).await;
    admin.revoke(&lock).await.unwrap();
    held(&*b, &lock, "b").await; // never two: the old child may still be running
    match a.renew(&lease, TTL).await.unwrap() {
        Renew::Lost(Some(record)) => assert!(record.revoked, "{record:?}"),
        other => panic!("a revoked lease was renewed: {other:?}"),
    }
    a.release(&lease, Duration::ZERO).await.unwrap(); // the holder stands down
    let next = won(&*b, &lock, "b", TTL).await;
    assert!(next.token > lease.token);
    assert!(!b.status(&lock).await.unwrap().revoked);
}

pub async fn awkward_lock_names(h: &dyn Harness) {
    let store = h.open().await;
    let long: String = "é".repeat(255);
    let names = [
        format!("it's \"quoted\" {}", unique("q")),
        format!("ünïcødé 日本語 {}", unique("u")),
        format!("spaces in the name {}", unique("s")),
        format!("back\\slash; DROP TABLE x; -- {}", unique("d")),
        format!("percent % and _ {}", unique("p")),
    ];
    for name in names.iter().chain(std::iter::once(&long)) {
        let lease = won(&*store, name, "a", TTL).await;
        let status = store.status(name).await.unwrap();
        assert_eq!(status.lock, *name);
        assert_eq!(status.holder.as_deref(), Some("a"), "{name:?}");
        assert!(store.list().await.unwrap().iter().any(|r| r.lock == *name), "{name:?} missing from list");
        store.release(&lease, Duration::ZERO).await.unwrap();
    }
    // Similar names are different locks.
    let base = unique("similar");
    won(&*store, &base, "a", TTL).await;
    won(&*store, &format!("{base} "), "b", TTL).await;
    won(&*store, &base.to_uppercase(), "c", TTL).await;
}

pub async fn a_release_wakes_a_waiter(h: &dyn Harness) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("wake");
    let lease = won(&*a, &lock, "a", TTL).await;
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            b.changed(&lock, Duration::from_secs(3600)).await;
            started.elapsed()
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    let waited = tokio::time::timeout(SOON, waiter).await.expect("a release never woke the waiter").unwrap();
    assert!(waited < Duration::from_secs(3600));
    won(&*b, &lock, "b", TTL).await;
}

/// The checks that wait out no lease and restart no server, one after another on one store:
/// what a cluster's tests run on the cluster (a cluster per check would cost more than the
/// checks).
pub async fn the_core(h: &dyn Harness) {
    exclusive_acquire_with_50_contenders(h).await;
    renew_by_the_holder_only(h).await;
    release_frees_the_lock_at_once(h).await;
    revoke_frees_a_min_hold_keep_at_once(h).await;
    abandon_frees_only_this_identitys_lease(h).await;
    tokens_strictly_increase(h).await;
    status_list_and_revoke_agree(h).await;
    revoked_holder_sees_it_at_the_next_renewal(h).await;
    awkward_lock_names(h).await;
    a_release_wakes_a_waiter(h).await;
    slots_are_locks_of_their_own(h).await;
    a_standby_that_stops_waiting_holds_no_one_up(h).await;
}

/// The core and the two checks that wait out a lease (expiry, a --min-hold keep).
pub async fn the_core_and_expiry(h: &dyn Harness) {
    the_core(h).await;
    expiry_frees_the_lock(h).await;
    release_with_keep_holds_until_then(h).await;
}

pub async fn leases_survive_a_restart(h: &dyn Harness) {
    let a = h.open().await;
    let lock = unique("restart");
    let lease = won(&*a, &lock, "a", TTL).await;
    drop(a);
    h.restart().await;
    let (a, b) = (h.open().await, h.open().await);
    held(&*b, &lock, "b").await;
    assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed, "the holder renews after the restart");
    let status = b.status(&lock).await.unwrap();
    assert_eq!((status.holder.as_deref(), status.token), (Some("a"), lease.token));
}

/// For a store with a server: a client's renewal fails while the server is down (a
/// transient error), succeeds again once `start` brought it back (each client may fail
/// a few more times on connections from before), and its waits hear releases again.
/// `stop` and `start` drive the server; a wait during the outage still ends by its bound.
pub async fn a_client_rides_out_a_server_restart(h: &dyn Harness, stop: impl FnOnce(), start: impl FnOnce()) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("outage");
    let lease = won(&*a, &lock, "a", TTL).await;
    // b waits with its notification channel open, which the restart cuts.
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_millis(200)).await;

    stop();
    assert!(a.renew(&lease, TTL).await.unwrap_err().is_transient());
    let started = Instant::now();
    b.changed(&lock, Duration::from_millis(500)).await;
    assert!(started.elapsed() < SOON);
    start();

    let started = Instant::now();
    loop {
        match a.renew(&lease, TTL).await {
            Ok(renew) => {
                assert_eq!(renew, Renew::Renewed);
                break;
            }
            Err(err) => assert!(err.is_transient() && started.elapsed() < SOON, "{}", err.message),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let waiter = {
        let (b, lock) = (b.clone(), lock.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                match b.acquire(&lock, "b", TTL).await {
                    Ok(Acquire::Won(lease)) => return lease,
                    _ => b.changed(&lock, Duration::from_secs(3600)).await,
                }
                assert!(started.elapsed() < SOON, "b never took over");
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    let next = tokio::time::timeout(SOON, waiter).await.expect("the release never woke b").unwrap();
    assert!(next.token > lease.token);
}

/// For a store whose standby keeps a watch (or blocks) across waits: after its first wait,
/// nothing is sent while the lock stays held, the holder's renewals included; a release still
/// wakes it. `requests` counts this thread's store requests (`count_requests`).
///
/// The first wait is long (3 s) because it opens the watch, and a wait too short for that
/// polls instead and opens it again next time: on a busy machine, opening a connection and a
/// watch can take longer than the 200 ms of the waits after it.
pub async fn an_idle_standby_sends_nothing(h: &dyn Harness, requests: &Requests) {
    let (a, b) = (h.open().await, h.open().await);
    let lock = unique("idle");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    b.changed(&lock, Duration::from_secs(3)).await;
    let before = requests.count();
    for _ in 0..5 {
        b.changed(&lock, Duration::from_millis(200)).await;
    }
    assert_eq!(requests.count() - before, 0, "an idle standby sends nothing");
    assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    let before = requests.count();
    b.changed(&lock, Duration::from_millis(200)).await;
    assert_eq!(requests.count() - before, 0, "a renewal is no reason to read");
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(SOON, b.changed(&lock, Duration::from_secs(3600)))
        .await
        .expect("the release wakes the standby");
    won(&*b, &lock, "b", TTL).await;
}

/// `leaderrun watch`'s view (`Store::observe_change`): on a store that pushes, a watcher learns
/// of a take, a revoke, a keep and a release without asking, and asks nothing while the lock
/// stays as it is; on any store, a watcher takes no waiter's turn: a release still wakes the
/// standby waiting in `changed`, which then wins. `requests` counts this thread's store
/// requests (`count_requests`): run on a current-thread runtime.
pub async fn a_watcher_sees_changes_and_takes_no_turn(h: &dyn Harness, requests: &Requests) {
    use leaderrun::store::Observing;
    let (holder, standby, watcher) = (h.open().await, h.open().await, h.open().await);
    let watcher: Arc<dyn Store> = watcher;
    let lock = unique("watched");
    let pushes = watcher.observing() != Observing::Polls;
    assert!(!watcher.status(&lock).await.unwrap().is_held());
    // Each change below is awaited while the watcher waits for it.
    let sees = |what: &'static str| {
        let (watcher, lock) = (watcher.clone(), lock.clone());
        tokio::spawn(async move {
            if pushes {
                tokio::time::timeout(SOON, watcher.observe_change(&lock, Duration::from_secs(3600)))
                    .await
                    .unwrap_or_else(|_| panic!("the watcher never saw the lock {what}"));
            } else {
                watcher.observe_change(&lock, Duration::from_millis(50)).await;
            }
        })
    };
    let seen = sees("taken");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lease = won(&*holder, &lock, "holder", TTL).await;
    seen.await.unwrap();
    assert!(watcher.status(&lock).await.unwrap().is_held());
    if pushes {
        // Idle: the holder neither renews nor releases. A first wait may open the channel.
        watcher.observe_change(&lock, Duration::from_millis(200)).await;
        let before = requests.count();
        for _ in 0..5 {
            watcher.observe_change(&lock, Duration::from_millis(200)).await;
        }
        assert_eq!(requests.count() - before, 0, "a watcher asks nothing while nothing changes");
    }
    // A read before each wait: the watcher then waits for this change, not an earlier one.
    watcher.status(&lock).await.unwrap();
    let seen = sees("revoked");
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.revoke(&lock).await.unwrap();
    seen.await.unwrap();
    assert!(watcher.status(&lock).await.unwrap().revoked);
    // A new lease, kept for --min-hold when its child is done, then freed by a revoke.
    holder.release(&lease, Duration::ZERO).await.unwrap();
    let lease = won(&*holder, &lock, "holder", TTL).await;
    watcher.status(&lock).await.unwrap();
    let seen = sees("kept");
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release(&lease, Duration::from_secs(600)).await.unwrap();
    seen.await.unwrap();
    let kept = watcher.status(&lock).await.unwrap();
    assert!(kept.is_held() && kept.kept, "a lease kept for --min-hold says so: {kept:?}");
    holder.revoke(&lock).await.unwrap();
    // A standby waits its turn while the watcher watches: the release is the standby's.
    let lease = won(&*holder, &lock, "holder", TTL).await;
    held(&*standby, &lock, "standby").await;
    let waiting = waiting(&standby, &lock);
    watcher.status(&lock).await.unwrap();
    let seen = sees("released");
    tokio::time::sleep(Duration::from_millis(300)).await;
    holder.release(&lease, Duration::ZERO).await.unwrap();
    seen.await.unwrap();
    tokio::time::timeout(SOON, waiting).await.expect("the release wakes the standby, not the watcher").unwrap();
    won(&*standby, &lock, "standby", TTL).await;
}

/// What `take_turns` records: each waiter's token and identity, in the order they ran.
pub type Turns = Arc<std::sync::Mutex<Vec<(u64, String)>>>;

/// `n` clients of the store (as `n` processes), to open before a test takes its lock: opening a
/// hundred can take longer than a lease on a busy machine, and a lease that lapsed meanwhile
/// would hand the lock round before the test began to watch.
pub async fn open_stores(h: &dyn Harness, n: usize) -> Vec<Arc<dyn Store>> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        stores.push(h.open().await);
    }
    stores
}

/// Start `n` waiters on `lock` (a store each, as `n` processes, each opened as the one before
/// it starts waiting): see `waiter`.
pub async fn take_turns(h: &dyn Harness, lock: &str, n: usize) -> (Vec<tokio::task::JoinHandle<()>>, Turns) {
    let turns = Turns::default();
    let mut tasks = Vec::new();
    for i in 0..n {
        tasks.push(waiter(i, h.open().await, lock, &turns));
    }
    (tasks, turns)
}

/// `take_turns` with stores opened beforehand (`open_stores`).
pub fn take_turns_with(stores: Vec<Arc<dyn Store>>, lock: &str) -> (Vec<tokio::task::JoinHandle<()>>, Turns) {
    let turns = Turns::default();
    let tasks = stores.into_iter().enumerate().map(|(i, store)| waiter(i, store, lock, &turns)).collect();
    (tasks, turns)
}

/// A waiter on `lock`: it acquires until it wins (waiting for a change, at most until the lease
/// it saw would lapse, when held), notes its turn, holds the lease 2 ms and releases it.
fn waiter(i: usize, store: Arc<dyn Store>, lock: &str, turns: &Turns) -> tokio::task::JoinHandle<()> {
    let (lock, turns) = (lock.to_string(), turns.clone());
    tokio::spawn(async move {
        let identity = format!("w{i}");
        let lease = loop {
            match store.acquire(&lock, &identity, TTL).await.expect("acquire") {
                Acquire::Won(lease) => break lease,
                Acquire::Held(record) => {
                    let until_expiry = record.expires_in.unwrap_or(TTL) + Duration::from_millis(20);
                    store.changed(&lock, until_expiry).await;
                }
                other => panic!("{identity}: unexpected {other:?}"),
            }
        };
        turns.lock().unwrap().push((lease.token, identity));
        tokio::time::sleep(Duration::from_millis(2)).await;
        store.release(&lease, Duration::ZERO).await.unwrap();
    })
}

/// A hundred waiters on one lock (a store each, as a hundred processes), each taking its turn
/// once: every one gets it, tokens strictly increase, and the requests per handoff stay within
/// `per_handoff` (a herd re-reading at every release would make about 100). `requests` counts
/// this thread's store requests (`count_requests`): run on a current-thread runtime.
pub async fn a_hundred_waiters_take_turns(h: &dyn Harness, requests: &Requests, per_handoff: std::ops::Range<f64>) {
    const N: usize = 100;
    let lock = unique("hundred");
    let waiters = open_stores(h, N).await;
    let first = h.open().await;
    let lease = won(&*first, &lock, "first", TTL).await;
    let (tasks, turns) = take_turns_with(waiters, &lock);
    // Every waiter has asked once and is waiting.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = requests.count();
    first.release(&lease, Duration::ZERO).await.unwrap();
    for task in tasks {
        tokio::time::timeout(SOON * 2, task).await.expect("a waiter never got its turn").expect("task");
    }
    let turns = turns.lock().unwrap().clone();
    assert_eq!(turns.len(), N);
    let identities: BTreeSet<_> = turns.iter().map(|(_, id)| id.clone()).collect();
    assert_eq!(identities.len(), N, "each waiter once");
    assert!(turns.windows(2).all(|w| w[0].0 < w[1].0), "tokens in order of the turns: {turns:?}");
    let measured = (requests.count() - before) as f64 / N as f64;
    eprintln!("requests per handoff with {N} waiters (acquire, release, and re-reads after a wake): {measured:.2}");
    assert!(per_handoff.contains(&measured), "{measured} requests per handoff, expected {per_handoff:?}");
}

/// Generate one `#[tokio::test]` per conformance test for a harness; with `paused:`,
/// on tokio's paused clock (for a store that runs in memory on an injected clock).
#[macro_export]
macro_rules! conformance_suite {
    (paused: $harness:expr) => {
        $crate::conformance_suite!(@each (start_paused = true) $harness);
    };
    ($harness:expr) => {
        $crate::conformance_suite!(@each (flavor = "multi_thread", worker_threads = 4) $harness);
    };
    (@each $flavor:tt $harness:expr) => {
        $crate::conformance_suite!(@tests $flavor $harness;
            exclusive_acquire_with_50_contenders,
            renew_by_the_holder_only,
            expiry_frees_the_lock,
            release_frees_the_lock_at_once,
            release_with_keep_holds_until_then,
            revoke_frees_a_min_hold_keep_at_once,
            abandon_frees_only_this_identitys_lease,
            tokens_strictly_increase,
            status_list_and_revoke_agree,
            revoked_holder_sees_it_at_the_next_renewal,
            awkward_lock_names,
            a_release_wakes_a_waiter,
            slots_are_locks_of_their_own,
            a_standby_that_stops_waiting_holds_no_one_up,
            leases_survive_a_restart,
        );
    };
    (@tests $flavor:tt $harness:expr; $($name:ident,)*) => {
        $(
            #[tokio::test $flavor]
            async fn $name() {
                let harness = $harness.await;
                conformance::$name(&harness).await;
            }
        )*
    };
}

/// Counts the "store request" events the stores log, one per request, on one thread only
/// (the tests that use it run on a current-thread runtime, so the store's calls run there).
#[derive(Clone, Default)]
pub struct Requests(Arc<std::sync::atomic::AtomicUsize>);

impl Requests {
    pub fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

thread_local! {
    /// The counter of the test running on this thread, while it counts.
    static COUNTING: std::cell::RefCell<Option<Requests>> = const { std::cell::RefCell::new(None) };
}

/// One subscriber for the whole test binary, installed once. A subscriber per test
/// (`set_default`) misses events: tracing caches each call site's interest globally, and with
/// exactly one such subscriber alive, a call site first reached on another test's thread is
/// cached as uninteresting, so this test never sees it.
struct CountOnThisThread;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for CountOnThisThread {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct IsRequest(bool);
        impl tracing::field::Visit for IsRequest {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 |= field.name() == "message" && format!("{value:?}") == "store request";
            }
        }
        let mut seen = IsRequest(false);
        event.record(&mut seen);
        if seen.0 {
            COUNTING.with(|c| {
                if let Some(requests) = &*c.borrow() {
                    requests.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            });
        }
    }
}

/// Stops counting this thread's requests when dropped.
pub struct Counting(());

impl Drop for Counting {
    fn drop(&mut self) {
        COUNTING.with(|c| *c.borrow_mut() = None);
    }
}

/// A task that waits in `changed` on `lock` (for up to an hour).
pub fn waiting(store: &Arc<dyn Store>, lock: &str) -> tokio::task::JoinHandle<()> {
    let (store, lock) = (store.clone(), lock.to_string());
    tokio::spawn(async move { store.changed(&lock, Duration::from_secs(3600)).await })
}

/// Wait (up to `SOON`) until `count` says `n`: a server's own count of waiters, read again
/// every 10 ms. `what` names it if it never does.
pub async fn until_count(what: &str, n: usize, count: impl Fn() -> usize) {
    tokio::time::timeout(SOON, async {
        while count() != n {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never {n} {what}"));
}

/// Count this thread's store requests from now on (until the `Counting` is dropped).
pub fn count_requests() -> (Requests, Counting) {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        use tracing_subscriber::layer::SubscriberExt;
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(CountOnThisThread))
            .expect("no other subscriber in the conformance tests");
    });
    // A callsite another test's thread registered while the subscriber was being installed
    // can keep the "never" interest it got from no subscriber, and its requests would go
    // uncounted: have every callsite asked again.
    tracing::callsite::rebuild_interest_cache();
    let requests = Requests::default();
    COUNTING.with(|c| *c.borrow_mut() = Some(requests.clone()));
    (requests, Counting(()))
}
