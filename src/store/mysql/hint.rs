//! The wake-up hint: user-level locks (`GET_LOCK`) held beside each lease.
//!
//! The holder keeps the lock's user lock (the turn) on a connection of its own while it
//! holds the lease, and gives it up (by closing that connection) only after its release has
//! been written. A waiter blocks in `GET_LOCK` on a connection of its own, so the server
//! wakes exactly one waiter, at once, when the holder lets go or its connection dies; the
//! others stay blocked (no herd). A waiter that wakes keeps the user lock: if its acquire
//! wins, that connection becomes the holder's.
//!
//! A waiter handed the turn while it is frozen keeps it, and would hold up every waiter
//! behind it. So one waiter, the relief, blocks instead on a second user lock the holder
//! keeps, and makes sure the turn is taken: see `relief`. It is the second waiter to come;
//! a frozen first waiter then costs a handoff one stagger (at most 0.3 s), and it leaves the
//! queue (its session is ended). An idle standby still holds one connection, blocked in
//! `GET_LOCK`, and sends nothing until the lease it saw would expire; a handoff costs the
//! relief a look or two and a new `GET_LOCK`. A frozen relief costs nothing while the first
//! waiters take their turns, but leaves none to cover a frozen one after it.
//!
//! Only a hint: the table's compare-and-set stays the only way to the lease. A holder that
//! never got the user lock (a woken waiter had it for a moment), a holder cut off while its
//! server session lingers, or a leaderrun from before the hint are all covered by the
//! elector re-reading at the lease's expiry (`sees_expiry` is false), and by the woken
//! waiter that finds the lease someone else's: it keeps the user lock, so the others stay
//! blocked, and it alone re-reads the record about once a second.
//!
//! The user locks' names are server-wide, so they cover the database and table as well as
//! the lock name, hashed to fit the 64 characters a user lock's name may have.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, MySql};
use tokio::task::{try_id, Id};
use tokio::time::{timeout, Instant};

use super::relief::{self, Relief, Seen, Step};

/// The user lock's name for the lock name bound to `?`, in SQL: `leaderrun:` and the first 54
/// hex digits of a SHA-256 of database, table and lock name (64 characters in all). This is
/// the turn: the holder keeps it, and waiters queue for it.
pub fn name_sql(table: &str) -> String {
    named(table, ':', "")
}

/// The holder's second user lock, which the relief waits on (see `relief`): named also by
/// the lease's fencing token, `token` in SQL, so that a relief never queues behind a waiter.
pub fn relief_sql(table: &str, token: &str) -> String {
    named(table, '~', &format!(", {token}"))
}

/// The relief's seat: whoever holds it is the relief.
fn seat_sql(table: &str) -> String {
    named(table, '+', "")
}

/// Held by the first waiter while it waits for the turn, so that the relief is the second.
fn first_sql(table: &str) -> String {
    named(table, '^', "")
}

/// Another user lock of the lock name bound to `?`, marked by a character after `leaderrun`.
fn named(table: &str, mark: char, extra: &str) -> String {
    format!("LEFT(CONCAT('leaderrun{mark}', SHA2(CONCAT_WS(0x00, DATABASE(), '{table}', ?{extra}), 256)), 64)")
}

/// How much longer than the server's own `GET_LOCK` timeout the client waits for its answer
/// before it gives the connection up.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// After a failed wait, the pause (within the wait's bound) before the caller re-reads, so
/// that a server that is down is not asked in a tight loop.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// How often, and how far apart, a wait looks for a pool connection on its way back.
const RETURN_TRIES: u32 = 20;
const RETURN_PAUSE: Duration = Duration::from_millis(2);

/// The server's answer to a KILL of a session that has ended.
const ER_NO_SUCH_THREAD: u16 = 1094;

/// Longest a connection for a wait may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// What a wait statement answers: the turn was handed to this waiter (or it timed out), or
/// the relief's second user lock was (or it timed out).
const TURN: i64 = 1;
const RELIEF: i64 = 11;
const RELIEF_TIMED_OUT: i64 = 10;

/// How a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Woke {
    /// This waiter now holds the user lock: the holder let go (or never had it).
    Hinted,
    /// The wait's bound passed, or it failed: re-read.
    Anyway,
}

/// The user locks of one store (a process may wait and hold through one store, many tasks
/// at once: every wait has a connection of its own, and renewals never queue behind one,
/// since none of these connections belong to the store's pool).
pub struct Hints {
    options: MySqlConnectOptions,
    /// The store's pool: one wait at a time borrows an idle connection of it, so that an
    /// idle standby keeps one connection to the server, not two. (One only: the pool's
    /// other connections stay for renewals.)
    pool: MySqlPool,
    lent: AtomicBool,
    /// The wait statement (see `wait_query`) and the relief's look, with the table's name in them.
    wait_sql: String,
    look_sql: String,
    /// Per lock name, the connections of the lease this store holds (the one that won the
    /// acquire, and the one its waiter woke on): closing them gives the user lock up.
    held: Mutex<HashMap<String, Vec<MySqlConnection>>>,
    /// Per lock name and waiting task, the user lock a waiter woke with, until its acquire
    /// wins the lease. (By task: other tasks of this process that wait on the same lock must
    /// block behind it, not take its place.)
    woken: Mutex<HashMap<(String, Option<Id>), MySqlConnection>>,
    /// Connections of finished waits, for the next.
    idle: Mutex<Vec<MySqlConnection>>,
    /// Per lock name, the fencing token an acquire last found holding it.
    seen: Mutex<HashMap<String, u64>>,
    /// Per lock name and waiting task, the relief's connection between its waits: it holds
    /// the seat, and the second user lock of the lease `woken_by` (0: none).
    seats: Mutex<HashMap<(String, Option<Id>), Seat>>,
}

struct Seat {
    conn: MySqlConnection,
    woken_by: u64,
}

impl Hints {
    pub fn new(options: MySqlConnectOptions, pool: MySqlPool, table: &str) -> Self {
        Self {
            options,
            pool,
            lent: AtomicBool::new(false),
            wait_sql: wait_sql(table),
            look_sql: format!(
                "SELECT CAST(IS_USED_LOCK({}) AS SIGNED),
                    (SELECT CAST(token AS SIGNED) FROM `{table}`
                      WHERE name = ? AND holder IS NOT NULL AND expires_at > UTC_TIMESTAMP(6))",
                name_sql(table)
            ),
            held: Mutex::default(),
            woken: Mutex::default(),
            idle: Mutex::default(),
            seen: Mutex::default(),
            seats: Mutex::default(),
        }
    }

    /// An acquire found `lock` held under `token`.
    pub fn saw(&self, lock: &str, token: u64) {
        self.seen.lock().unwrap_or_else(|e| e.into_inner()).insert(lock.to_string(), token);
    }

    /// A spare connection of this store's (the one `open` checked the table on, one an
    /// acquire or a wait used), or one of the pool's: a one-shot run then needs one
    /// connection in all.
    pub async fn connection_for_acquire(&self) -> sqlx::Result<Conn> {
        let spare = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        match spare {
            Some(conn) => Ok(Conn::Own(conn)),
            None => Ok(Conn::Pooled(self.pool.acquire().await?)),
        }
    }

    /// Keep a connection in a clean state (no user lock, no statement under way) for later.
    pub fn spare(&self, conn: Conn) {
        match conn {
            Conn::Own(conn) => self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(conn),
            Conn::Pooled(conn) => drop(conn),
        }
    }

    /// Whether this task, waiting, holds `lock`'s user lock without holding the lease.
    pub fn is_woken(&self, lock: &str) -> bool {
        self.woken.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&(lock.to_string(), try_id()))
    }

    /// This store won `lock`'s lease on `conn` (which the acquire's statement asked for the
    /// user lock): keep it, and the connection a waiter woke on, until the lease is given up.
    pub fn won(&self, lock: &str, conn: Option<MySqlConnection>) {
        let key = (lock.to_string(), try_id());
        // A relief that won gives its seat up (closing the connection), for another waiter.
        drop(self.seats.lock().unwrap_or_else(|e| e.into_inner()).remove(&key));
        let woken = self.woken.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.entry(lock.to_string()).or_default().extend(conn.into_iter().chain(woken));
    }

    /// The connections of `lock`'s lease, taken out: the release is written on the first, and
    /// closing them all then gives the user lock up.
    pub fn take(&self, lock: &str) -> Vec<MySqlConnection> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(lock).unwrap_or_default()
    }

    /// Block until `lock`'s turn is ours (the holder let go), or, as the relief, until the
    /// first waiter has had its chance, or until `max_wait` has passed.
    pub async fn wait(&self, lock: &str, max_wait: Duration) -> Woke {
        let deadline = Instant::now() + max_wait;
        let key = (lock.to_string(), try_id());
        let seat = self.seats.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        let (mut wait, mut old) = match seat {
            Some(seat) => (Wait { conn: Some(Conn::Own(seat.conn)), lent: &self.lent }, seat.woken_by),
            None => match self.connection(max_wait).await {
                Some(wait) => (wait, 0),
                None => {
                    pause_until(deadline).await;
                    return Woke::Anyway;
                }
            },
        };
        let mut token = self.seen.lock().unwrap_or_else(|e| e.into_inner()).get(lock).copied().unwrap_or(0);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            // One line per request at -vvv: the benchmarks count them.
            tracing::trace!(op = "wait", "store request");
            let query = self.wait_query(lock, old, token, left);
            let answer = match timeout(left + ANSWER_GRACE, query.fetch_one(wait.conn())).await {
                Ok(Ok(Some(RELIEF))) => {
                    tracing::debug!(token, "the holder let go: the relief looks");
                    match self.relieve(wait.conn(), lock, token, deadline).await {
                        Ok(Step::Rewait(new)) => {
                            (old, token) = (token, new);
                            continue;
                        }
                        Ok(Step::Go) => {
                            self.keep_seat(key, wait, token);
                            return Woke::Hinted;
                        }
                        Ok(_) => {
                            self.keep_seat(key, wait, token);
                            tokio::time::sleep_until(deadline).await;
                            return Woke::Anyway;
                        }
                        Err(err) => Ok(Err(err)),
                    }
                }
                other => other,
            };
            return match answer {
                Ok(Ok(Some(TURN))) => {
                    if let Some(conn) = self.detach(wait) {
                        let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
                        woken.insert(key, conn);
                    }
                    Woke::Hinted
                }
                Ok(Ok(Some(RELIEF_TIMED_OUT))) => {
                    // Its wait ran out: it holds the seat only.
                    self.keep_seat(key, wait, 0);
                    tokio::time::sleep_until(deadline).await;
                    Woke::Anyway
                }
                Ok(Ok(_)) => {
                    match wait.conn.take() {
                        // Back to the pool: it holds no user lock.
                        Some(Conn::Pooled(conn)) => {
                            drop(conn);
                            self.lent.store(false, Ordering::SeqCst);
                        }
                        Some(Conn::Own(conn)) => self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(conn),
                        None => {}
                    }
                    // A server that counts the timeout in whole seconds (MySQL truncates it) may
                    // answer early: the rest of the wait is slept, not spent re-reading.
                    tokio::time::sleep_until(deadline).await;
                    Woke::Anyway
                }
                Ok(Err(err)) => {
                    tracing::debug!("waiting on the user lock failed: {err}");
                    drop(self.detach(wait));
                    pause_until(deadline).await;
                    Woke::Anyway
                }
                // Unanswered: the connection is closed, which ends its session's wait.
                Err(_) => {
                    drop(self.detach(wait));
                    Woke::Anyway
                }
            };
        }
    }

    /// The relief keeps its seat (and the connection it is held on) for its next wait, with
    /// the second user lock of the lease `woken_by` if it holds one; it gives them up when it
    /// wins, or when its client is dropped.
    fn keep_seat(&self, key: (String, Option<Id>), wait: Wait<'_>, woken_by: u64) {
        if let Some(conn) = self.detach(wait) {
            self.seats.lock().unwrap_or_else(|e| e.into_inner()).insert(key, Seat { conn, woken_by });
        }
    }

    /// The wait statement: the relief keeps waiting on the holder's second user lock; the
    /// first waiter (it takes the `first` lock, free while nobody waits for the turn) and
    /// every waiter after the relief queue for the turn; the second takes the seat and is the
    /// relief. It also lets go of the second user lock the relief was last woken by.
    fn wait_query<'q>(
        &'q self,
        lock: &'q str,
        old: u64,
        token: u64,
        left: Duration,
    ) -> sqlx::query::QueryScalar<'q, MySql, Option<i64>, sqlx::mysql::MySqlArguments> {
        let name = lock.as_bytes();
        let secs = left.as_secs_f64();
        sqlx::query_scalar(AssertSqlSafe(self.wait_sql.as_str()))
            .bind(name)
            .bind(old)
            .bind(name)
            .bind(name)
            .bind(token)
            .bind(secs)
            .bind(name)
            .bind(name)
            .bind(secs)
            .bind(name)
            .bind(name)
            .bind(name)
            .bind(token)
            .bind(secs)
            .bind(name)
            .bind(secs)
    }

    /// The relief was woken: look until the first waiter has taken the lease (then wait on
    /// the new holder), nobody else will (go), or the wait is over.
    async fn relieve(
        &self,
        conn: &mut MySqlConnection,
        lock: &str,
        token: u64,
        deadline: Instant,
    ) -> sqlx::Result<Step> {
        let mut relief = Relief::new(token, relief::stagger());
        loop {
            tracing::trace!(op = "look", "store request");
            let (turn, held): (Option<i64>, Option<i64>) = sqlx::query_as(AssertSqlSafe(self.look_sql.as_str()))
                .bind(lock.as_bytes())
                .bind(lock.as_bytes())
                .fetch_one(&mut *conn)
                .await?;
            let seen = match held {
                Some(token) => Seen::Held(token as u64),
                None => Seen::Free { turn: turn.map(|session| session as u64) },
            };
            match relief.step(seen, Instant::now()) {
                Step::LookAt(at) => {
                    tokio::time::sleep_until(at.min(deadline)).await;
                    if Instant::now() >= deadline {
                        return Ok(Step::Idle);
                    }
                }
                Step::Bypass(session) => {
                    tracing::debug!(session, "the waiter handed the turn did not take it: ending its session");
                    tracing::trace!(op = "kill", "store request");
                    let killed =
                        sqlx::raw_sql(AssertSqlSafe(format!("KILL CONNECTION {session}"))).execute(&mut *conn).await;
                    match killed {
                        // Gone meanwhile: the turn has moved on; look again.
                        Err(err) if super::number(&err) == Some(ER_NO_SUCH_THREAD) => {}
                        Err(err) => {
                            tracing::debug!("cannot end it ({err}): the relief takes the turn");
                            return Ok(Step::Go);
                        }
                        Ok(_) => {}
                    }
                }
                step => return Ok(step),
            }
        }
    }

    /// The wait's connection taken out of the pool for good (it holds a user lock, or is in
    /// an unknown state).
    fn detach(&self, mut wait: Wait) -> Option<MySqlConnection> {
        let conn = wait.conn.take()?;
        if matches!(conn, Conn::Pooled(_)) {
            self.lent.store(false, Ordering::SeqCst);
        }
        Some(conn.detach())
    }

    /// An idle connection of the pool's (if none is lent already) or of an earlier wait, or a
    /// new one.
    async fn connection(&self, max_wait: Duration) -> Option<Wait<'_>> {
        let wait = |conn| Wait { conn: Some(conn), lent: &self.lent };
        if !self.lent.swap(true, Ordering::SeqCst) {
            // The acquire just before hands its connection back after a ping: a moment's
            // wait for it saves a second connection to the server.
            for _ in 0..RETURN_TRIES {
                if let Some(conn) = self.pool.try_acquire() {
                    return Some(wait(Conn::Pooled(conn)));
                }
                if self.pool.size() as usize <= self.pool.num_idle() {
                    break; // none is on its way back
                }
                tokio::time::sleep(RETURN_PAUSE).await;
            }
            self.lent.store(false, Ordering::SeqCst);
        }
        let idle = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        if let Some(conn) = idle {
            return Some(wait(Conn::Own(conn)));
        }
        match timeout(max_wait.min(CONNECT_TIMEOUT), self.options.connect()).await {
            Ok(Ok(conn)) => Some(wait(Conn::Own(conn))),
            Ok(Err(err)) => {
                tracing::debug!("cannot connect to wait on the user lock: {err}");
                None
            }
            Err(_) => None,
        }
    }
}

/// A connection borrowed from the pool, or of its own.
pub enum Conn {
    Pooled(PoolConnection<MySql>),
    Own(MySqlConnection),
}

impl Conn {
    pub fn conn(&mut self) -> &mut MySqlConnection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Own(conn) => conn,
        }
    }

    /// Out of the pool for good.
    pub fn detach(self) -> MySqlConnection {
        match self {
            Conn::Pooled(conn) => conn.detach(),
            Conn::Own(conn) => conn,
        }
    }
}

/// A wait under way. Dropped before it ended (a signal ends the wait), its connection is
/// closed, never handed back to the pool: it may be about to get the user lock.
struct Wait<'a> {
    conn: Option<Conn>,
    lent: &'a AtomicBool,
}

impl Wait<'_> {
    fn conn(&mut self) -> &mut MySqlConnection {
        self.conn.as_mut().expect("a wait has its connection until it ends").conn()
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if matches!(conn, Conn::Pooled(_)) {
                self.lent.store(false, Ordering::SeqCst);
            }
            drop(conn.detach());
        }
    }
}

/// The wait statement for `table` (see `Hints::wait_query`, which binds it).
fn wait_sql(table: &str) -> String {
    let (turn, seat, first) = (name_sql(table), seat_sql(table), first_sql(table));
    let (old, relief) = (relief_sql(table, "?"), relief_sql(table, "?"));
    // CASE evaluates only the branch taken, and `+` its left side first.
    format!(
        "SELECT CAST(LEAST(0, IFNULL(RELEASE_LOCK({old}), 0)) + CASE
            WHEN IS_USED_LOCK({seat}) = CONNECTION_ID() THEN {RELIEF_TIMED_OUT} + GET_LOCK({relief}, ?)
            WHEN GET_LOCK({first}, 0) = 1 THEN GET_LOCK({turn}, ?) + LEAST(0, IFNULL(RELEASE_LOCK({first}), 0))
            WHEN GET_LOCK({seat}, 0) = 1 THEN {RELIEF_TIMED_OUT} + GET_LOCK({relief}, ?)
            ELSE GET_LOCK({turn}, ?) END AS SIGNED)"
    )
}

async fn pause_until(deadline: Instant) {
    tokio::time::sleep_until(deadline.min(Instant::now() + PAUSE_AFTER_FAILURE)).await;
}

/// Close connections of a lease given up (their user locks go with them), briefly. The last
/// first: a woken waiter's connection, which holds the turn, goes before the acquire's, which
/// holds the second user lock, so that the first waiter is woken before the relief.
pub async fn close(conns: Vec<MySqlConnection>) {
    for conn in conns.into_iter().rev() {
        let _ = timeout(Duration::from_secs(1), conn.close()).await;
    }
}
