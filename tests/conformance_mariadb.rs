//! The conformance suite against a real MariaDB server, started by the test on loopback
//! in a temporary directory (one server per test); a restart stops it with SIGTERM and
//! starts it again on the same data directory and port.

mod conformance;
mod servers;

use std::sync::Arc;

use async_trait::async_trait;
use conformance::Harness;
use leaderrun::store::Store;
use leaderrun::store::{registry, Access};
use servers::mariadb::Mariadb;

struct MariadbHarness {
    server: Mariadb,
}

async fn mariadb() -> MariadbHarness {
    let server = tokio::task::spawn_blocking(Mariadb::start).await.expect("start MariaDB");
    MariadbHarness { server }
}

#[async_trait]
impl Harness for MariadbHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let spec = registry::parse_url(&self.server.url()).expect("a valid URL");
        match spec.open(Access::Create).await {
            Ok(store) => Arc::from(store),
            Err(err) => panic!("open the MariaDB store: {err}"),
        }
    }

    async fn restart(&self) {
        tokio::task::block_in_place(|| {
            self.server.stop();
            self.server.start_again();
        });
    }
}

conformance_suite!(mariadb());

/// The pool does not ping a connection before each call (a ping doubled every renewal's round
/// trips): after a restart, calls on connections from before fail as transient and the next
/// ones reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let h = mariadb().await;
    conformance::a_client_rides_out_a_server_restart(&h, || h.server.stop(), || h.server.start_again()).await;
}

/// A table made by an earlier leaderrun, without the `kept` column: the first statement that
/// needs it adds it, and `leaderrun release` then ends a --min-hold keep at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_from_before_the_kept_column_gets_it() {
    use std::time::Duration;
    let h = mariadb().await;
    h.server.root_sql(
        "CREATE TABLE leaderrun.old_locks (name VARBINARY(1020) NOT NULL PRIMARY KEY, \
         holder VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL, token BIGINT UNSIGNED NOT NULL, \
         acquired_at DATETIME(6) NOT NULL, expires_at DATETIME(6) NOT NULL, revoked BOOLEAN NOT NULL DEFAULT 0) \
         ENGINE=InnoDB",
    );
    let spec = registry::parse_url(&format!("{}?table=old_locks", h.server.url())).expect("a valid URL");
    let a: Arc<dyn Store> = Arc::from(spec.open(Access::Create).await.expect("open"));
    let admin: Arc<dyn Store> = Arc::from(spec.open(Access::Existing).await.expect("open"));
    let lease = conformance::won(&*a, "x", "a", conformance::TTL).await;
    a.release(&lease, Duration::from_secs(3600)).await.unwrap();
    assert!(admin.revoke("x").await.unwrap().is_some());
    assert!(!admin.status("x").await.unwrap().is_held(), "the keep ended at once");
}

/// Poll `cond` (a blocking check) until it holds, for at most `SOON`.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !tokio::task::block_in_place(&mut cond) {
        assert!(started.elapsed() < conformance::SOON, "never happened: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Campaign as the elector does: acquire, and while held, wait for a change until the held
/// lease's expiry. Returns the lease won.
async fn campaign(store: &dyn Store, lock: &str, identity: &str, ttl: std::time::Duration) -> leaderrun::store::Lease {
    use leaderrun::store::Acquire;
    use std::time::Duration;
    loop {
        match store.acquire(lock, identity, ttl).await.expect("acquire") {
            Acquire::Won(lease) => return lease,
            Acquire::Held(record) => {
                let until_expiry = record.expires_in.expect("a held lease expires") + Duration::from_millis(20);
                store.changed(lock, until_expiry).await;
            }
            other => panic!("{identity}: unexpected {other:?}"),
        }
    }
}

/// A waiter blocks in GET_LOCK on the server (it does not poll), and the holder's release
/// wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_blocked_on_the_user_lock_wakes_on_release() {
    use std::time::Duration;
    let h = mariadb().await;
    let (a, b) = (h.open().await, h.open().await);
    let lease = conformance::won(&*a, "wake", "a", conformance::TTL).await;
    conformance::held(&*b, "wake", "b").await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.changed("wake", Duration::from_secs(3600)).await })
    };
    eventually("the waiter blocks in GET_LOCK", || h.server.blocked_on_user_locks() == 1).await;
    assert!(!waiter.is_finished(), "the wait ended before the release");
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, waiter).await.expect("the release never woke the waiter").unwrap();
    let next = conformance::won(&*b, "wake", "b", conformance::TTL).await;
    assert!(next.token > lease.token);
}

/// A holder whose user lock lingers on the server (cut off, its session not yet reaped)
/// keeps waiters blocked, yet its lease is taken when it expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lease_whose_user_lock_lingers_is_taken_at_expiry() {
    use sqlx::{Connection, Row};
    use std::time::Duration;
    let h = mariadb().await;
    let mut lingering = sqlx::mysql::MySqlConnection::connect(&h.server.url()).await.expect("connect");
    let name = leaderrun::store::mysql::hint::name_sql("leaderrun_locks");
    let row = sqlx::query(sqlx::AssertSqlSafe(format!("SELECT CAST(GET_LOCK({name}, 0) AS SIGNED)")))
        .bind("cut".as_bytes())
        .fetch_one(&mut lingering)
        .await
        .expect("GET_LOCK");
    assert_eq!(row.get::<i64, _>(0), 1, "the user lock was free");
    let a = h.open().await;
    let lease = conformance::won(&*a, "cut", "a", Duration::from_secs(2)).await;
    drop(a); // never renewed, never released
    let b = h.open().await;
    let next = tokio::time::timeout(conformance::SOON, campaign(&*b, "cut", "b", conformance::TTL))
        .await
        .expect("the expired lease was never taken");
    assert!(next.token > lease.token);
    drop(lingering);
}

/// A holder whose connections die (a wrapper killed, a network cut the server noticed)
/// frees its user lock at once, but its lease only at its expiry: the waiter it woke takes
/// the lease then, without spinning meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_whose_connections_die_is_taken_over_at_expiry() {
    use std::time::Duration;
    let h = mariadb().await;
    let a = h.open().await;
    let lease = conformance::won(&*a, "killed", "a", Duration::from_secs(3)).await;
    let ids = tokio::task::block_in_place(|| {
        h.server.root_query("SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'leaderrun'")
    });
    assert!(!ids.is_empty(), "the holder has a session");
    let b = h.open().await;
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { campaign(&*b, "killed", "b", conformance::TTL).await })
    };
    eventually("the waiter blocks in GET_LOCK", || h.server.blocked_on_user_locks() == 1).await;
    tokio::task::block_in_place(|| {
        for id in ids.lines() {
            h.server.root_sql(&format!("KILL CONNECTION {id}"));
        }
    });
    let next = tokio::time::timeout(conformance::SOON, waiter).await.expect("never taken over").unwrap();
    assert!(next.token > lease.token);
    drop(a);
}

/// 100 waiters in one process (25 per store), one lock: each gets its turn exactly once,
/// one at a time, every one woken by the user lock (the lease is 30 s long: a waiter left to
/// re-read at expiry would take far longer than the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hundred_waiters_each_get_one_turn() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Mutex;
    use std::time::Duration;
    const WAITERS: usize = 100;
    let h = mariadb().await;
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(h.open().await);
    }
    let holder = h.open().await;
    let first = conformance::won(&*holder, "herd", "holder", conformance::TTL).await;
    let (inside, waiting) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
    let turns = Arc::new(Mutex::new(Vec::new()));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (store, inside, waiting, turns) =
                (stores[i % 4].clone(), inside.clone(), waiting.clone(), turns.clone());
            tokio::spawn(async move {
                use leaderrun::store::Acquire;
                let identity = format!("w{i}");
                let mut counted = false;
                loop {
                    match store.acquire("herd", &identity, conformance::TTL).await.expect("acquire") {
                        Acquire::Won(lease) => {
                            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                            turns.lock().unwrap().push((identity.clone(), lease.token));
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            inside.store(false, Ordering::SeqCst);
                            store.release(&lease, Duration::ZERO).await.expect("release");
                            return;
                        }
                        Acquire::Held(record) => {
                            if !counted {
                                counted = true;
                                waiting.fetch_add(1, Ordering::SeqCst);
                            }
                            let until = record.expires_in.expect("expires") + Duration::from_millis(20);
                            store.changed("herd", until).await;
                        }
                        other => panic!("{identity}: unexpected {other:?}"),
                    }
                }
            })
        })
        .collect();
    eventually("every waiter waits", || waiting.load(Ordering::SeqCst) == WAITERS).await;
    holder.release(&first, Duration::ZERO).await.unwrap();
    let all = async {
        for task in tasks {
            task.await.expect("a waiter failed");
        }
    };
    tokio::time::timeout(Duration::from_secs(120), all).await.expect("the waiters never all had their turn");
    let turns = turns.lock().unwrap().clone();
    let mut who: Vec<_> = turns.iter().map(|(identity, _)| identity.clone()).collect();
    who.sort();
    who.dedup();
    assert_eq!((turns.len(), who.len()), (WAITERS, WAITERS), "each waiter exactly once");
    assert!(turns.windows(2).all(|w| w[0].1 < w[1].1), "tokens in order: {turns:?}");
    assert!(turns[0].1 > first.token);
}

/// A waiter handed the turn that never takes it (a bare session queued first for the turn's
/// user lock, standing in for a frozen leaderrun) is bypassed by the relief: its session is
/// ended, the next waiter in line takes the lease long before the released one would have
/// expired, and the relief then takes the lease after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_that_never_takes_its_turn_is_bypassed() {
    use sqlx::Connection;
    use std::time::Duration;
    let h = mariadb().await;
    let a = h.open().await;
    let lease = conformance::won(&*a, "stuck", "a", Duration::from_secs(3600)).await;
    let mut stuck = sqlx::mysql::MySqlConnection::connect(&h.server.url()).await.expect("connect");
    let name = leaderrun::store::mysql::hint::name_sql("leaderrun_locks");
    let stuck = tokio::spawn(async move {
        let got = sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(format!("SELECT GET_LOCK({name}, 3600)")))
            .bind("stuck".as_bytes())
            .fetch_one(&mut stuck)
            .await;
        // Handed the turn, it sits on it; ended by the relief, the next statement fails.
        let alive = got.is_ok() && sqlx::query("DO SLEEP(3600)").execute(&mut stuck).await.is_ok();
        (got.ok().flatten(), alive)
    });
    eventually("the stuck session queues for the turn", || h.server.blocked_on_user_locks() == 1).await;
    let campaigner = |identity: &'static str, store: Arc<dyn Store>| {
        tokio::spawn(async move { campaign(&*store, "stuck", identity, conformance::TTL).await })
    };
    let (b, c) = (h.open().await, h.open().await);
    let next = campaigner("b", b.clone());
    eventually("the next waiter queues", || h.server.blocked_on_user_locks() == 2).await;
    let relief = campaigner("c", c.clone());
    eventually("the relief waits", || h.server.blocked_on_user_locks() == 3).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    let (got, alive) = tokio::time::timeout(conformance::SOON, stuck).await.expect("never ended").unwrap();
    assert_eq!((got, alive), (Some(1), false), "the stuck session was handed the turn, then ended");
    let second = tokio::time::timeout(conformance::SOON, next).await.expect("the turn never moved on").unwrap();
    assert!(second.token > lease.token);
    assert!(!relief.is_finished(), "the relief took the lease from the next waiter");
    b.release(&second, Duration::ZERO).await.unwrap();
    let third = tokio::time::timeout(conformance::SOON, relief).await.expect("the relief never went").unwrap();
    assert!(third.token > second.token);
}

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&mariadb().await, &requests).await;
}
