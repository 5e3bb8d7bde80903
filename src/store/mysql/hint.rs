//! The wake-up hint: a user-level lock (`GET_LOCK`) held beside each lease.
//!
//! The holder keeps the lock's user lock on a connection of its own while it holds the
//! lease, and gives it up (by closing that connection) only after its release has been
//! written. A waiter blocks in `GET_LOCK` on a connection of its own, so the server wakes
//! exactly one waiter, at once, when the holder lets go or its connection dies; the others
//! stay blocked (no herd). A waiter that wakes keeps the user lock: if its acquire wins,
//! that connection becomes the holder's.
//!
//! Only a hint: the table's compare-and-set stays the only way to the lease. A holder that
//! never got the user lock (a woken waiter had it for a moment), a holder cut off while its
//! server session lingers, or a leaderrun from before the hint are all covered by the
//! elector re-reading at the lease's expiry (`sees_expiry` is false), and by the woken
//! waiter that finds the lease someone else's: it keeps the user lock, so the others stay
//! blocked, and it alone re-reads the record about once a second.
//!
//! The user lock's name is server-wide, so it covers the database and table as well as the
//! lock name, hashed to fit the 64 characters a user lock's name may have.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, MySql};
use tokio::task::{try_id, Id};
use tokio::time::{timeout, Instant};

/// The user lock's name for the lock name bound to `?`, in SQL: `leaderrun:` and the first 54
/// hex digits of a SHA-256 of database, table and lock name (64 characters in all).
pub fn name_sql(table: &str) -> String {
    format!("LEFT(CONCAT('leaderrun:', SHA2(CONCAT_WS(0x00, DATABASE(), '{table}', ?), 256)), 64)")
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

/// Longest a connection for a wait may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

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
    /// `GET_LOCK … ?, ?` with the table's name in it.
    get_lock: String,
    /// Per lock name, the connections of the lease this store holds (the one that won the
    /// acquire, and the one its waiter woke on): closing them gives the user lock up.
    held: Mutex<HashMap<String, Vec<MySqlConnection>>>,
    /// Per lock name and waiting task, the user lock a waiter woke with, until its acquire
    /// wins the lease. (By task: other tasks of this process that wait on the same lock must
    /// block behind it, not take its place.)
    woken: Mutex<HashMap<(String, Option<Id>), MySqlConnection>>,
    /// Connections of finished waits, for the next.
    idle: Mutex<Vec<MySqlConnection>>,
}

impl Hints {
    pub fn new(options: MySqlConnectOptions, pool: MySqlPool, table: &str) -> Self {
        Self {
            options,
            pool,
            lent: AtomicBool::new(false),
            get_lock: format!("SELECT CAST(GET_LOCK({}, ?) AS SIGNED)", name_sql(table)),
            held: Mutex::default(),
            woken: Mutex::default(),
            idle: Mutex::default(),
        }
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
        let woken = self.woken.lock().unwrap_or_else(|e| e.into_inner()).remove(&(lock.to_string(), try_id()));
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.entry(lock.to_string()).or_default().extend(conn.into_iter().chain(woken));
    }

    /// The connections of `lock`'s lease, taken out: the release is written on the first, and
    /// closing them all then gives the user lock up.
    pub fn take(&self, lock: &str) -> Vec<MySqlConnection> {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).remove(lock).unwrap_or_default()
    }

    /// Block until `lock`'s user lock is ours (the holder let go) or `max_wait` has passed.
    pub async fn wait(&self, lock: &str, max_wait: Duration) -> Woke {
        let deadline = Instant::now() + max_wait;
        let Some(mut wait) = self.connection(max_wait).await else {
            pause_until(deadline).await;
            return Woke::Anyway;
        };
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op = "wait", "store request");
        let query = sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(self.get_lock.as_str()))
            .bind(lock.as_bytes())
            .bind(max_wait.as_secs_f64());
        let answer = timeout(max_wait + ANSWER_GRACE, query.fetch_one(wait.conn())).await;
        match answer {
            Ok(Ok(Some(1))) => {
                if let Some(conn) = self.detach(wait) {
                    let mut woken = self.woken.lock().unwrap_or_else(|e| e.into_inner());
                    woken.insert((lock.to_string(), try_id()), conn);
                }
                Woke::Hinted
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

async fn pause_until(deadline: Instant) {
    tokio::time::sleep_until(deadline.min(Instant::now() + PAUSE_AFTER_FAILURE)).await;
}

/// Close connections of a lease given up (their user lock goes with them), briefly.
pub async fn close(conns: Vec<MySqlConnection>) {
    for conn in conns {
        let _ = timeout(Duration::from_secs(1), conn.close()).await;
    }
}
