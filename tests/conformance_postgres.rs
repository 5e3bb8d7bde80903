//! The conformance suite against a real PostgreSQL server (one per test, started in a
//! temporary directory), and what only this store has: the table option, look-only
//! access that never creates, least privileges, error kinds and messages without the
//! password, and riding out a server restart with the same client.

mod conformance;
mod servers;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::{held, unique, waiting, won, Harness, TTL};
use leaderrun::store::{registry, Access};
use leaderrun::store::{Acquire, ErrorKind, Renew, Store, StoreError};
use servers::postgres::Postgres;

struct Pg {
    server: Postgres,
}

async fn pg() -> Pg {
    Pg { server: Postgres::start() }
}

async fn open_url(url: &str, access: Access) -> Result<Arc<dyn Store>, StoreError> {
    registry::parse_url(url).expect("a valid URL").open(access).await.map(Arc::from)
}

#[async_trait]
impl Harness for Pg {
    async fn open(&self) -> Arc<dyn Store> {
        open_url(&self.server.url(), Access::Create).await.expect("open the PostgreSQL store")
    }

    async fn restart(&self) {
        self.server.stop();
        self.server.start_again();
    }
}

conformance_suite!(pg());

/// Whether a table exists in the test database.
fn table_exists(server: &Postgres, table: &str) -> bool {
    server.psql_in(servers::postgres::DATABASE, &format!("SELECT to_regclass('\"{table}\"') IS NOT NULL")) == "t"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_clients_create_the_table_together() {
    let pg = pg().await;
    let url = pg.server.url();
    let barrier = Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let (url, barrier) = (url.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                // Fifty sessions at once can take the server longer than a client's 3 s to
                // start on a busy machine: a client that got no connection never reached the
                // table, so it tries again, as a run would; any other error fails the test.
                let mut tries = 0;
                loop {
                    let answer = match open_url(&url, Access::Create).await {
                        Ok(store) => store.acquire("created-together", &format!("client-{i}"), TTL).await,
                        Err(err) => Err(err),
                    };
                    match answer {
                        Err(err) if err.message.contains("no connection within") && tries < 5 => tries += 1,
                        answer => return answer,
                    }
                }
            })
        })
        .collect();
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap().expect("no client may fail while the table is created") {
            Acquire::Won(_) => winners += 1,
            Acquire::Confirm { .. } => panic!("PostgreSQL wins at once"),
            Acquire::Held(record) | Acquire::Unproven { record, .. } => assert!(record.is_held()),
        }
    }
    assert_eq!(winners, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_table_option_separates_users_of_one_database() {
    let pg = pg().await;
    let (default, other) =
        (pg.open().await, open_url(&format!("{}?table=Team_B", pg.server.url()), Access::Create).await.unwrap());
    let lock = unique("shared-name");
    won(&*default, &lock, "a", TTL).await;
    let lease = won(&*other, &lock, "b", TTL).await;
    assert_eq!(lease.token, 1, "another table, another token sequence");
    held(&*other, &lock, "c").await;
    assert!(table_exists(&pg.server, "leaderrun_locks") && table_exists(&pg.server, "Team_B"));

    // Refused while the command line is checked, before anything connects.
    let err = registry::parse_url(&format!("{}?table=x;drop", pg.server.url())).err().unwrap();
    assert!(err.contains("table=\"x;drop\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn looking_never_creates_the_table() {
    let pg = pg().await;
    let url = format!("{}?table=never_created", pg.server.url());
    let store = open_url(&url, Access::Existing).await.expect("open to look");
    let status = store.status("x").await.unwrap();
    assert!(!status.is_held() && status.token == 0);
    assert!(store.list().await.unwrap().is_empty());
    assert!(store.revoke("x").await.unwrap().is_none());
    assert!(!table_exists(&pg.server, "never_created"));
    // Created by a run, then seen by a look-only client.
    let runner = open_url(&url, Access::Create).await.unwrap();
    won(&*runner, "x", "a", TTL).await;
    assert_eq!(store.status("x").await.unwrap().holder.as_deref(), Some("a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn least_privileges_select_insert_update() {
    let pg = pg().await;
    pg.server.psql("CREATE ROLE limited LOGIN PASSWORD 'limited-pw'");
    let port = pg.server.port();
    let limited = format!("postgres://limited:limited-pw@127.0.0.1:{port}/leaderrun");

    // No table, and no right to create one: the first acquire is refused, saying so.
    let store = open_url(&limited, Access::Create).await.expect("opening makes nothing");
    let err = store.acquire("x", "a", TTL).await.expect_err("cannot create the table");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(err.message.contains("does not exist") && err.message.contains("limited:***@"), "{}", err.message);

    // The owner creates it (`leaderrun init`).
    let spec = registry::parse_url(&pg.server.url()).unwrap();
    spec.prepare().await.expect("the owner may create the table");
    pg.server.psql_in("leaderrun", "GRANT SELECT, INSERT, UPDATE ON leaderrun_locks TO limited");
    let store = open_url(&limited, Access::Create).await.expect("SELECT, INSERT, UPDATE are enough");
    let lock = unique("limited");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    store.release(&lease, Duration::ZERO).await.unwrap();
    let lease = won(&*store, &lock, "b", TTL).await;
    assert!(store.revoke(&lock).await.unwrap().is_some());
    store.release(&lease, Duration::from_secs(600)).await.unwrap();
    assert!(!store.list().await.unwrap().is_empty());
}

/// A server that will not run the functions that state its epoch (Aurora refuses the WAL
/// functions; here a hardened server revokes them from PUBLIC) still grants leases: the
/// acquire drops the epoch, once, and goes on without it, with tokens as on a fresh store.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_that_does_not_state_its_epoch_still_grants() {
    let pg = pg().await;
    pg.server.psql("CREATE ROLE limited LOGIN PASSWORD 'limited-pw'");
    for function in ["pg_control_system()", "pg_current_wal_lsn()", "pg_walfile_name(pg_lsn)"] {
        pg.server.psql(&format!("REVOKE EXECUTE ON FUNCTION {function} FROM PUBLIC"));
    }
    registry::parse_url(&pg.server.url()).unwrap().prepare().await.expect("the owner creates the table");
    pg.server.psql_in("leaderrun", "GRANT SELECT, INSERT, UPDATE ON leaderrun_locks TO limited");
    let port = pg.server.port();
    let limited = format!("postgres://limited:limited-pw@127.0.0.1:{port}/leaderrun");
    let store = open_url(&limited, Access::Create).await.unwrap();
    let lock = unique("unstated");
    let first = won(&*store, &lock, "a", TTL).await;
    store.release(&first, Duration::ZERO).await.unwrap();
    let second = won(&*store, &lock, "b", TTL).await;
    assert_eq!((first.token, second.token), (1, 2));
    // Another client learns it anew, and a held lock is still held.
    held(&*open_url(&limited, Access::Create).await.unwrap(), &lock, "c").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn errors_say_what_went_wrong_without_the_password() {
    let pg = pg().await;
    let port = pg.server.port();
    let check = |err: StoreError, kind: ErrorKind, needle: &str, secret: &str| {
        assert_eq!(err.kind, kind, "{}", err.message);
        assert!(err.message.contains(needle), "{needle:?} missing from {:?}", err.message);
        assert!(err.message.contains("***") && !err.message.contains(secret), "{}", err.message);
        assert!(!err.message.contains('\n'), "one line: {:?}", err.message);
    };
    let wrong = format!("postgres://leaderrun:not-the-password@127.0.0.1:{port}/leaderrun");
    check(open_url(&wrong, Access::Create).await.err().unwrap(), ErrorKind::Refused, "28P01", "not-the-password");
    let url = format!("postgres://leaderrun:{}@127.0.0.1:{port}/no_such_db", pg.server.password());
    check(open_url(&url, Access::Existing).await.err().unwrap(), ErrorKind::Refused, "3D000", pg.server.password());

    let closed = servers::free_port();
    let url = format!("postgres://leaderrun:{}@127.0.0.1:{closed}/leaderrun", pg.server.password());
    check(open_url(&url, Access::Create).await.err().unwrap(), ErrorKind::Unavailable, "refused", pg.server.password());

    // A server that goes away under an open client: transient.
    let store = pg.open().await;
    pg.server.stop();
    let err = store.status("x").await.expect_err("the server is down");
    check(err, ErrorKind::Unavailable, &format!(":{port}/"), pg.server.password());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_rides_out_a_server_restart() {
    let pg = pg().await;
    conformance::a_client_rides_out_a_server_restart(&pg, || pg.server.stop(), || pg.server.start_again()).await;
}

/// A table made by an earlier leaderrun, without the `kept` column: the first statement that
/// needs it adds it, and `leaderrun release` then ends a --min-hold keep at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_table_from_before_the_kept_column_gets_it() {
    let pg = pg().await;
    let old = "CREATE TABLE old_locks (name text PRIMARY KEY, holder text, token bigint NOT NULL, \
               acquired_at timestamptz NOT NULL, expires_at timestamptz NOT NULL, revoked boolean NOT NULL DEFAULT false)";
    pg.server.psql_in(servers::postgres::DATABASE, old);
    let url = format!("{}?table=old_locks", pg.server.url());
    let (a, admin) = (open_url(&url, Access::Create).await.unwrap(), open_url(&url, Access::Existing).await.unwrap());
    // Owned by another user: leaderrun may not add the column, and says what to run.
    let err = a.acquire("x", "a", TTL).await.expect_err("refused");
    assert_eq!(err.kind, ErrorKind::Refused);
    assert!(err.message.contains("ADD COLUMN IF NOT EXISTS kept"), "{}", err.message);
    pg.server.psql_in(servers::postgres::DATABASE, "ALTER TABLE old_locks OWNER TO leaderrun");
    let lease = won(&*a, "x", "a", TTL).await;
    a.release(&lease, Duration::from_secs(3600)).await.unwrap();
    assert!(admin.revoke("x").await.unwrap().is_some());
    assert!(!admin.status("x").await.unwrap().is_held(), "the keep ended at once");
}

/// A renewal that arrives after a --min-hold release (it was sent before, or hung) must not
/// turn the keep back into a live lease: it reports the lease lost and leaves the expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_renewal_does_not_extend_a_min_hold_keep() {
    let pg = pg().await;
    let store = pg.open().await;
    let lock = unique("late-renew");
    let lease = won(&*store, &lock, "a", TTL).await;
    store.release(&lease, Duration::from_secs(60)).await.unwrap();
    let expiry = format!("SELECT kept, expires_at FROM leaderrun_locks WHERE name = '{lock}'");
    let kept = pg.server.psql_in(servers::postgres::DATABASE, &expiry);
    assert!(kept.starts_with("t|"), "kept for --min-hold: {kept}");
    let renewed = store.renew(&lease, Duration::from_secs(3600)).await.unwrap();
    assert!(matches!(renewed, Renew::Lost(_)), "a kept lease renewed: {renewed:?}");
    assert_eq!(pg.server.psql_in(servers::postgres::DATABASE, &expiry), kept, "the keep's expiry moved");
}

/// The table is not looked at when a store opens (that would cost every run a round trip): a
/// run's acquire that finds it missing (never made, or dropped since) creates it and tries
/// again. Until then a missing table holds no locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_acquire_that_finds_no_table_creates_it() {
    let pg = pg().await;
    let url = format!("{}?table=made_on_first_use", pg.server.url());
    let store = open_url(&url, Access::Create).await.unwrap();
    assert!(!table_exists(&pg.server, "made_on_first_use"), "opening makes nothing");
    assert!(!store.status("x").await.unwrap().is_held() && store.list().await.unwrap().is_empty());
    let lease = won(&*store, "x", "a", TTL).await;
    assert!(table_exists(&pg.server, "made_on_first_use"));
    store.release(&lease, Duration::ZERO).await.unwrap();
    pg.server.psql_in(servers::postgres::DATABASE, "DROP TABLE made_on_first_use");
    won(&*store, "x", "b", TTL).await;
    assert!(table_exists(&pg.server, "made_on_first_use"));
}

/// Values travel inside the statements' text (one round trip each): names that look like
/// quotes, dollar quotes, parameters or SQL are stored and found as they are.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn names_that_look_like_sql_are_stored_as_they_are() {
    let pg = pg().await;
    let (a, b) = (pg.open().await, pg.open().await);
    let names = [
        "it's",
        "'; DROP TABLE leaderrun_locks; --",
        "$lr$",
        "a$lr",
        "lr$ b",
        "$lr$'; DROP TABLE leaderrun_locks; --$lr$",
        "$1 $2 $3",
        "back\\slash\\",
        "$$",
        "E'\\''",
    ];
    for name in names {
        let lease = won(&*a, name, name, TTL).await;
        held(&*b, name, "b").await;
        let status = b.status(name).await.unwrap();
        assert_eq!((status.lock.as_str(), status.holder.as_deref()), (name, Some(name)));
        assert_eq!(a.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
        a.release(&lease, Duration::ZERO).await.unwrap();
        let lease = won(&*b, name, "b", TTL).await;
        assert!(b.revoke(name).await.unwrap().is_some());
        b.release(&lease, Duration::ZERO).await.unwrap();
    }
    let listed: Vec<String> = a.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    for name in names {
        assert!(listed.iter().any(|l| l == name), "{name:?} missing from {listed:?}");
    }
    assert!(table_exists(&pg.server, "leaderrun_locks"));
}

/// A run's calls share one connection: the one open made serves the first call, and each
/// call keeps it for the next (handed back to the pool, it would still be in the pool's
/// hands when a one-shot run's next call asks, and the pool would connect again).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_run_uses_one_connection() {
    let pg = pg().await;
    let store = pg.open().await;
    let lock = unique("one-connection");
    let lease = won(&*store, &lock, "a", TTL).await;
    store.release(&lease, Duration::ZERO).await.unwrap();
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(store.renew(&lease, TTL).await.unwrap(), Renew::Renewed);
    store.release(&lease, Duration::ZERO).await.unwrap();
    assert!(!store.status(&lock).await.unwrap().is_held());
    let connections = pg.server.psql("SELECT count(*) FROM pg_stat_activity WHERE usename = 'leaderrun'");
    assert_eq!(connections, "1", "connections of this run's user");
}

/// How many sessions are marked as waiting for a lock (any lock) of this database.
fn waiting_sessions(server: &Postgres) -> usize {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'leaderrun-wait:%'";
    server.psql_in(servers::postgres::DATABASE, sql).parse().expect("a count")
}

/// Wait (with a generous bound) until `n` sessions are marked as waiting.
async fn until_waiting(server: &Postgres, n: usize) {
    conformance::until_count("waiting sessions", n, || waiting_sessions(server)).await
}

/// A release wakes the waiter that has waited longest, and only it; once that one has won,
/// its release wakes the next waiter (never its own former waiting session).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_wakes_the_waiter_that_waited_longest() {
    let pg = pg().await;
    let (a, b, c) = (pg.open().await, pg.open().await, pg.open().await);
    let lock = unique("turns");
    let lease = won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    held(&*c, &lock, "c").await;
    let wb = waiting(&b, &lock);
    until_waiting(&pg.server, 1).await;
    let wc = waiting(&c, &lock);
    until_waiting(&pg.server, 2).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, wb).await.expect("the first waiter was not woken").unwrap();
    let lease = won(&*b, &lock, "b", TTL).await;
    assert!(!wc.is_finished(), "the second waiter woke on the first one's turn");
    // At once, while b's waiting session may still be closing: b's release leaves it out.
    b.release(&lease, Duration::ZERO).await.unwrap();
    tokio::time::timeout(conformance::SOON, wc).await.expect("the second waiter was not woken").unwrap();
    won(&*c, &lock, "c", TTL).await;
}

/// A release by a leaderrun from before the turns (a plain NOTIFY, no turn) still wakes a
/// waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_without_a_turn_still_wakes_a_waiter() {
    let pg = pg().await;
    let (a, b) = (pg.open().await, pg.open().await);
    let lock = unique("plain");
    won(&*a, &lock, "a", TTL).await;
    held(&*b, &lock, "b").await;
    let wb = waiting(&b, &lock);
    until_waiting(&pg.server, 1).await;
    let old_release = format!(
        "UPDATE leaderrun_locks SET holder = NULL, expires_at = clock_timestamp() WHERE name = '{lock}'; \
         NOTIFY leaderrun, '{lock}'"
    );
    pg.server.psql_in(servers::postgres::DATABASE, &old_release);
    tokio::time::timeout(conformance::SOON, wb).await.expect("the plain release woke nobody").unwrap();
    won(&*b, &lock, "b", TTL).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_standby_sends_nothing() {
    let (requests, _counting) = conformance::count_requests();
    conformance::an_idle_standby_sends_nothing(&pg().await, &requests).await;
}

/// A hundred waiters, each woken in turn by the release before it: a few requests a
/// handoff, however many wait.
#[tokio::test]
async fn a_hundred_waiters_each_get_their_turn_once() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_hundred_waiters_take_turns(&pg().await, &requests, 2.0..10.0).await;
}

/// A waiter that stops reading while first in line (as a SIGSTOPped one, or one on a host that
/// vanished: its session stays) is named at every release. The others still take their turns,
/// each after one stagger, not when the lease they last read would lapse (30 s here), and a
/// handoff costs a few requests, not one per waiter.
#[tokio::test]
async fn a_frozen_waiter_costs_each_handoff_one_stagger() {
    const N: usize = 20;
    let (requests, _counting) = conformance::count_requests();
    let pg = pg().await;
    let lock = unique("frozen");
    let first = pg.open().await;
    let lease = won(&*first, &lock, "first", TTL).await;
    let frozen = pg.open().await;
    held(&*frozen, &lock, "frozen").await;
    let wait = waiting(&frozen, &lock);
    until_waiting(&pg.server, 1).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Its listener stays in the store, connected and unread.
    wait.abort();
    let (tasks, turns) = conformance::take_turns(&pg, &lock, N).await;
    until_waiting(&pg.server, N + 1).await;
    let (before, started) = (requests.count(), std::time::Instant::now());
    first.release(&lease, Duration::ZERO).await.unwrap();
    for task in tasks {
        tokio::time::timeout(conformance::SOON * 2, task).await.expect("a waiter never got its turn").expect("task");
    }
    let per_handoff = started.elapsed() / N as u32;
    let measured = (requests.count() - before) as f64 / N as f64;
    eprintln!("with a frozen waiter first in line: {per_handoff:?} and {measured:.2} requests a handoff");
    let turns: Vec<u64> = turns.lock().unwrap().iter().map(|(token, _)| *token).collect();
    assert!(turns.len() == N && turns.windows(2).all(|w| w[0] < w[1]), "each once, in token order: {turns:?}");
    assert!(per_handoff < Duration::from_secs(1), "handoffs waited for the frozen waiter: {per_handoff:?} each");
    assert!((2.0..10.0).contains(&measured), "{measured} requests per handoff");
    assert_eq!(waiting_sessions(&pg.server), 1, "the frozen waiter was still in line");
}

/// `leaderrun watch` on this store: it sees a take, a revoke, a keep and a release (a store
/// that pushes, without a request while nothing changes), status says `kept`, and a standby
/// still gets its turn. On a current-thread runtime, so that the requests counted are its own.
#[tokio::test]
async fn a_watcher_sees_changes_and_takes_no_turn() {
    let (requests, _counting) = conformance::count_requests();
    conformance::a_watcher_sees_changes_and_takes_no_turn(&pg().await, &requests).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_write_is_announced_to_a_watcher() {
    conformance::announced::each_write_is_announced_to_a_watcher(&pg().await).await;
}

/// The server's epoch, as the mark states it: `SYSTEM_IDENTIFIER/TIMELINE`.
fn epoch_of(server: &Postgres) -> String {
    let system = server.psql("SELECT system_identifier FROM pg_control_system()");
    format!("{system}/00000001")
}

/// The epoch's mark (src/store/postgres/epoch.rs) as psql prints it: epoch, longest ttl in
/// microseconds, fresh, and whether it looks like a lease that ended when it began.
fn mark_of(server: &Postgres) -> String {
    let sql =
        "SELECT holder, token, kept, expires_at = acquired_at FROM leaderrun_locks WHERE name = chr(1) || 'epoch'";
    server.psql_in(servers::postgres::DATABASE, sql)
}

/// The mark of the server's epoch is a row of the lock table, written by the first acquire of
/// a fresh store (tokens then count from 1) and grown by a longer lease; `list` never shows it,
/// and no call can take, revoke or show it as a lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_epoch_mark_is_never_listed() {
    let pg = pg().await;
    let (store, other) = (pg.open().await, pg.open().await);
    let lock = unique("beside-the-mark");
    let lease = won(&*store, &lock, "a", TTL).await;
    assert_eq!(lease.token, 1, "a fresh store counts from 1");
    let epoch = epoch_of(&pg.server);
    assert_eq!(mark_of(&pg.server), format!("{epoch}|{}|t|t", TTL.as_micros()), "epoch, longest, fresh");
    let longer = unique("longer");
    let second = won(&*other, &longer, "b", TTL * 2).await;
    assert_eq!(second.token, 1);
    assert_eq!(mark_of(&pg.server), format!("{epoch}|{}|t|t", (TTL * 2).as_micros()), "the longest lease grew");

    let mut listed: Vec<String> = other.list().await.unwrap().into_iter().map(|r| r.lock).collect();
    let mut both = vec![lock.clone(), longer];
    (listed.sort(), both.sort());
    assert_eq!(listed, both, "the two locks, without the mark");
    let mark = "\u{1}epoch";
    let err = other.acquire(mark, "x", TTL).await.expect_err("the mark is not a lock");
    assert_eq!(err.kind, ErrorKind::Refused, "{}", err.message);
    assert!(!other.status(mark).await.unwrap().is_held(), "never a live lease");
    assert!(other.revoke(mark).await.unwrap().is_none());
    assert_eq!(mark_of(&pg.server), format!("{epoch}|{}|t|t", (TTL * 2).as_micros()), "left as it was");
    // Slots' records (a control character after the lock's name) are listed as before.
    let slot = format!("{lock}\u{1f}1");
    won(&*other, &slot, "c", TTL).await;
    assert!(other.list().await.unwrap().iter().any(|r| r.lock == slot));
    assert!(other.list().await.unwrap().iter().all(|r| r.lock != mark));
}

/// A new epoch (here the mark rewritten as a promoted standby finds it: another server's
/// epoch) grants nothing, not even a free lock, until the longest lease asked for could have
/// ended; meanwhile the lock is reported held by a lease the failover may have lost, with the
/// token the server shows. Then tokens start from the server's clock in microseconds. A table
/// with leases and no mark (made by an earlier leaderrun) waits once, for the lease asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_epoch_waits_out_the_longest_lease() {
    use leaderrun::store::FAILOVER_GRACE_HOLDER;
    let pg = pg().await;
    let (a, b) = (pg.open().await, pg.open().await);
    let lock = unique("new-epoch");
    let longest = Duration::from_secs(2);
    let lease = won(&*a, &lock, "a", longest).await;
    a.release(&lease, Duration::ZERO).await.unwrap();
    let db = servers::postgres::DATABASE;
    pg.server.psql_in(db, "UPDATE leaderrun_locks SET holder = 'another/00000001' WHERE name = chr(1) || 'epoch'");

    let until_won = |store: Arc<dyn Store>, lock: String, ttl: Duration| async move {
        let started = std::time::Instant::now();
        let mut refusals = Vec::new();
        loop {
            match store.acquire(&lock, "b", ttl).await.unwrap() {
                Acquire::Won(lease) => return (lease, started.elapsed(), refusals),
                Acquire::Held(record) => refusals.push(record),
                other => panic!("{other:?}"),
            }
            assert!(started.elapsed() < conformance::SOON, "never granted after the grace");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    // A shorter lease waits out the longest one asked for before the failover.
    let (taken, waited, refusals) = until_won(b.clone(), lock.clone(), longest / 4).await;
    let first = refusals.first().expect("refused at first");
    assert_eq!((first.holder.as_deref(), first.token), (Some(FAILOVER_GRACE_HOLDER), lease.token), "{first:?}");
    assert!(first.expires_in.is_some_and(|left| left <= longest && !left.is_zero()), "{first:?}");
    assert!(waited >= longest, "granted {waited:?} after the first acquire on the new epoch");
    let clock_us = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_micros() as u64;
    assert!(taken.token > lease.token && taken.token > clock_us - 60_000_000, "token {}", taken.token);
    assert_eq!(mark_of(&pg.server), format!("{}|{}|f|t", epoch_of(&pg.server), longest.as_micros()));
    let next = won(&*a, &unique("after-the-grace"), "a", longest).await;
    assert!(next.token > clock_us - 60_000_000, "not fresh: tokens from the clock, {}", next.token);

    // No mark, and leases: an earlier leaderrun's table, or a mark lost.
    pg.server.psql_in(db, "UPDATE leaderrun_locks SET name = 'was-the-mark' WHERE name = chr(1) || 'epoch'");
    let (_, waited, refusals) = until_won(b.clone(), unique("upgraded"), longest / 2).await;
    assert!(!refusals.is_empty() && waited >= longest / 2, "granted {waited:?} after the first acquire");
}
