//! The failover suite: what a replicated store (PostgreSQL, MariaDB, Redis with Sentinel)
//! must keep across a failover that loses the last writes (docs/safety.md, "A store's own
//! failover"), written once and run against each set-up by `failover_suite!`.
//!
//! The set-up (`servers::replicated::Replicated`) keeps writes off the replica on purpose
//! (`hold_back`), kills the primary and promotes the replica (`fail_over`). Every wait is on
//! an event with a generous bound. The one comparison of instants is the safety property
//! itself, measured so that it can only err towards passing: a lease is granted no earlier
//! than the answer to its acquire, and the lost lease's holder would have stopped its child
//! by `sent + ttl` at the latest.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use leaderrun::store::{registry, Access, Acquire, Lease, Renew, Store, StoreError};

use crate::servers::replicated::Replicated;

/// The lease the suite asks for: the store's grace after a failover is at least this long. A
/// lease the replica had must outlast a failover (Sentinel's election takes 1.6–2.9 s here, more
/// on a loaded machine) and the reconnection after it.
pub const TTL: Duration = Duration::from_secs(6);

/// Generous bound for what should happen soon (a reconnection, a promotion).
pub const SOON: Duration = Duration::from_secs(60);

/// A new client, as another leaderrun process would open it.
pub async fn open(r: &dyn Replicated) -> Arc<dyn Store> {
    let kind = registry::parse_url(&r.url()).expect("a valid URL");
    let deadline = Instant::now() + SOON;
    loop {
        match kind.open(Access::Create).await {
            Ok(store) => return Arc::from(store),
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(err) => panic!("open the replicated store: {err}"),
        }
    }
}

/// A lock name no other test uses.
pub fn unique(name: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::SeqCst))
}

/// A store call retried while it fails transiently (the failover resets connections).
async fn answered<T, F, Fut>(what: &str, mut call: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let deadline = Instant::now() + SOON;
    loop {
        match call().await {
            Ok(answer) => return answer,
            Err(err) if err.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await
            }
            Err(err) => panic!("{what}: {err}"),
        }
    }
}

async fn acquire(store: &Arc<dyn Store>, lock: &str, identity: &str) -> Acquire {
    answered("acquire", || store.acquire(lock, identity, TTL)).await
}

async fn won(store: &Arc<dyn Store>, lock: &str, identity: &str) -> Lease {
    match acquire(store, lock, identity).await {
        Acquire::Won(lease) => lease,
        other => panic!("{identity} expected to win {lock:?}: {other:?}"),
    }
}

/// Acquire until won; the lease and when its answer came.
async fn won_eventually(store: &Arc<dyn Store>, lock: &str, identity: &str) -> (Lease, Instant) {
    let deadline = Instant::now() + SOON;
    loop {
        match acquire(store, lock, identity).await {
            Acquire::Won(lease) => return (lease, Instant::now()),
            Acquire::Held(record) if Instant::now() < deadline => {
                assert!(record.is_held(), "a refused acquire must report a holder: {record:?}");
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => panic!("{identity} never won {lock:?}: {other:?}"),
        }
    }
}

/// A lease the failover lost is granted to nobody else until it could have ended, and the
/// lease granted then has a larger token. Without the store's guard, the standby wins at once
/// on the new primary, under the very same token.
pub async fn a_lost_lease_is_not_granted_again(r: &dyn Replicated) {
    let lock = unique("lost");
    let holder = open(r).await;
    // A lease before the lost one, which the replica has: the lock's row exists there.
    let first = won(&holder, &lock, "first").await;
    answered("release", || holder.release(&first, Duration::ZERO)).await;
    r.catch_up();
    r.hold_back();
    let sent = Instant::now();
    let lost = won(&holder, &lock, "holder").await;
    r.fail_over();
    let standby = open(r).await;
    match acquire(&standby, &lock, "standby").await {
        Acquire::Held(record) => assert!(record.is_held(), "{record:?}"),
        Acquire::Won(lease) => panic!(
            "the standby was granted {lock:?} (token {}) at once after a failover that lost the lease of token {}",
            lease.token, lost.token
        ),
        other => panic!("{other:?}"),
    }
    let (taken, answered_at) = won_eventually(&standby, &lock, "standby").await;
    assert!(
        answered_at >= sent + TTL,
        "granted {:?} after the lost acquire was sent, before its lease (ttl {TTL:?}) could have ended",
        answered_at - sent
    );
    assert!(taken.token > lost.token, "token {} after the lost token {}", taken.token, lost.token);
}

/// A lock the new primary shows free (it never saw it at all) waits out the grace too: the
/// lost write may have been the lock's first.
pub async fn a_lock_the_new_primary_never_saw_waits_too(r: &dyn Replicated) {
    let lock = unique("never-seen");
    let holder = open(r).await;
    r.hold_back();
    let sent = Instant::now();
    let lost = won(&holder, &lock, "holder").await;
    r.fail_over();
    let standby = open(r).await;
    let (taken, answered_at) = won_eventually(&standby, &lock, "standby").await;
    assert!(answered_at >= sent + TTL, "granted {:?} after the lost acquire was sent", answered_at - sent);
    assert!(taken.token > lost.token, "token {} after the lost token {}", taken.token, lost.token);
}

/// The holder of a lease the failover lost finds it gone at its next renewal (and stops its
/// child), rather than renewing a record the new primary does not show.
pub async fn a_holder_whose_lease_was_lost_loses_it(r: &dyn Replicated) {
    let lock = unique("holder-lost");
    let holder = open(r).await;
    r.hold_back();
    let lease = won(&holder, &lock, "holder").await;
    r.fail_over();
    match answered("renew", || holder.renew(&lease, TTL)).await {
        Renew::Lost(_) => {}
        Renew::Renewed => panic!("renewed a lease the new primary never saw: {lease:?}"),
    }
}

/// A lease the replica had when it was promoted survives the failover: its holder renews it,
/// and nobody else is granted the lock.
pub async fn an_intact_lease_is_kept(r: &dyn Replicated) {
    let lock = unique("intact");
    let holder = open(r).await;
    let lease = won(&holder, &lock, "holder").await;
    r.catch_up();
    r.fail_over();
    assert_eq!(answered("renew", || holder.renew(&lease, TTL)).await, Renew::Renewed, "{lease:?}");
    let standby = open(r).await;
    match acquire(&standby, &lock, "standby").await {
        Acquire::Held(record) => assert_eq!(record.holder.as_deref(), Some("holder"), "{record:?}"),
        other => panic!("the standby took a lease that survived the failover: {other:?}"),
    }
    answered("release", || holder.release(&lease, Duration::ZERO)).await;
}

/// Across two failovers that each lose leases (several acquisitions and releases, as a busy
/// lock has), every lease granted after a failover has a larger token than every lease granted
/// before it.
pub async fn tokens_rise_across_failovers(r: &dyn Replicated) {
    let lock = unique("tokens");
    let mut highest = 0;
    for round in 0..2 {
        if round > 0 {
            r.add_replica();
        }
        let client = open(r).await;
        let (first, _) = won_eventually(&client, &lock, "before").await;
        assert!(first.token > highest, "round {round}: token {} after {highest}", first.token);
        answered("release", || client.release(&first, Duration::ZERO)).await;
        r.catch_up();
        r.hold_back();
        highest = first.token;
        for i in 0..3 {
            let lease = won(&client, &lock, &format!("lost-{i}")).await;
            assert!(lease.token > highest, "token {} after {highest}", lease.token);
            highest = lease.token;
            answered("release", || client.release(&lease, Duration::ZERO)).await;
        }
        r.fail_over();
    }
    let client = open(r).await;
    let (last, _) = won_eventually(&client, &lock, "after").await;
    assert!(last.token > highest, "token {} after the lost tokens up to {highest}", last.token);
}

/// The suite, one test per scenario, each with a set-up of its own (`$setup` is an async
/// expression giving a `Replicated`). `synchronous:` runs only what a synchronous replica
/// allows: an acknowledged write cannot be kept off it.
#[macro_export]
macro_rules! failover_suite {
    (asynchronous: $setup:expr) => {
        $crate::failover_suite!(@tests $setup;
            a_lost_lease_is_not_granted_again,
            a_lock_the_new_primary_never_saw_waits_too,
            a_holder_whose_lease_was_lost_loses_it,
            an_intact_lease_is_kept,
            tokens_rise_across_failovers,
        );
    };
    (synchronous: $setup:expr) => {
        $crate::failover_suite!(@tests $setup; an_intact_lease_is_kept,);
    };
    (@tests $setup:expr; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let setup = $setup;
                failover::$name(&setup).await;
            }
        )*
    };
}
