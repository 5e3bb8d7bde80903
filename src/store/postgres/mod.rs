//! PostgreSQL store: `--store postgres://user:pass@host:port/db[?table=NAME&sslmode=...]`
//! (`postgresql://` too).
//!
//! One row per lock name. Every acquire, renew and release is a single statement, so the
//! row lock PostgreSQL takes for it is the compare-and-set (A1): acquire is
//! `INSERT … ON CONFLICT (name) DO UPDATE … WHERE released OR expired RETURNING token`.
//! Expiry is judged on the server's clock with `clock_timestamp()` (the time now;
//! `now()` would be the start of the transaction). That is the server's wall clock: it
//! must be slewed, never stepped, while leases are held (NTP/chrony do this by default).
//! Advisory locks are never used: they belong to a session and break behind
//! transaction-pooling proxies. The same statement reads the server's epoch and grants
//! nothing for a while after a standby was promoted (`epoch.rs`).
//!
//! Wake-ups: releasing (and revoking) a lock sends `NOTIFY leaderrun, '<lock name>'` in the
//! same statement, and the turn of the waiter that has waited longest (`turns.rs`): that
//! waiter acts at once and its acquire says the lock is taken; the others act after a short
//! stagger only if they have not heard that, so a frozen waiter costs a handoff one stagger.
//! A waiter LISTENs on its own connection, opened on its first wait; a notification is only a
//! hint (the elector also re-reads when the lease it saw expires). LISTEN/NOTIFY does not
//! pass a transaction-pooling proxy; waiters then fall back on that re-read.
//!
//! `leaderrun watch` listens on a session of its own, which no release ever names: a take and
//! a keep are announced for it on `leaderrun_change` (`observe.rs`).
//!
//! Round trips: every statement is one simple query with its values quoted in (`Sql::text`),
//! so it costs one round trip, where a prepared statement costs two the first time (Parse
//! and Describe, then Bind and Execute); no server-side prepared statement is left behind,
//! so a transaction-pooling proxy needs no support for them. A run's first call uses the
//! connection its open made, and the table is created only when an acquire misses it (SQLSTATE
//! 42P01: never made, or dropped since), then the acquire is retried: checking at every open
//! would cost every run a round trip for what happens once per database. `leaderrun init`
//! creates it at once (`CREATE TABLE IF NOT EXISTS`). A one-shot run is then one connection
//! and two round trips: acquire, release.
//!
//! Connection settings: the URL is parsed by sqlx (`PgConnectOptions::from_str`), which
//! starts from libpq's environment variables — PGHOST (or PGHOSTADDR), PGPORT, PGUSER,
//! PGPASSWORD, PGDATABASE, PGSSLMODE, PGSSLROOTCERT, PGSSLCERT, PGSSLKEY, PGAPPNAME,
//! PGOPTIONS — lets the URL override each of them, and reads `~/.pgpass` (or PGPASSFILE)
//! when no password is given. URL parameters: `sslmode` (default `prefer`: TLS when the
//! server offers it, *unverified*; use `verify-full` on an untrusted network), `sslrootcert`,
//! `sslcert`, `sslkey`, `host` (a path for a Unix socket), `hostaddr`, `port`, `dbname`,
//! `user`, `password`, `application_name`, `options`, `statement-cache-capacity`, plus
//! leaderrun's own `table`. Unknown parameters are ignored with a warning (naming the key
//! only: the value might be a secret).
//!
//! `?table=NAME` picks the table (default `leaderrun_locks`), for databases shared with
//! others: a plain identifier, quoted, found through the connection's `search_path`
//! (set it with `options=-c search_path=myschema` to use another schema).
//!
//! Least privileges: SELECT, INSERT, UPDATE on the table; CREATE on its schema only if
//! leaderrun is to create the table on first use (else create it beforehand with the SQL
//! from `schema_sql`, e.g. printed by `leaderrun init --print-sql`). No DELETE is ever
//! issued. `leaderrun status`, `list` and `release` never create anything: a missing
//! table means no locks.
//!
//! A password never appears in a message: they are built from `url::redact(url)` and the
//! server's error text, never from sqlx's options (whose `Debug` shows the password).

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Postgres, Row, SqlSafeStr, SqlStr};
use tokio::sync::Mutex;
use tokio::time::timeout;

use super::release_feed;
use super::url::redact;
use super::Access;
use super::{Acquire, Lease, LockRecord, Observing, Renew, Result, Store, StoreError};
use conn::Conn;
use errors::{describe, no_kept_column, sqlstate, transient};
pub use kind::KIND;
use observe::{Changes, CHANGE_CHANNEL};
pub use statements::schema_sql;
use statements::{micros, record_from, Sql, Value};
pub use target::Target;
#[cfg(test)]
use target::{split_url, valid_table};
use turns::{Turns, TURN_CHANNEL};
use waiting::Waiting;

mod conn;
mod epoch;
mod errors;
mod kind;
mod observe;
mod statements;
mod target;
mod turns;
mod waiting;

/// The table used unless the URL says `?table=NAME`.
pub const DEFAULT_TABLE: &str = "leaderrun_locks";

/// The channel releases are announced on; the payload is the lock name.
const CHANNEL: &str = "leaderrun";

/// How long a call waits for a pooled connection (which includes reconnecting after a
/// server restart). The elector bounds every call with its own, usually shorter, timeout.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections per process: the elector makes one call at a time; the second covers a
/// connection still busy being checked or closed after a cancelled call.
const MAX_CONNECTIONS: u32 = 2;

/// How often a waiter re-reads the lock while it cannot listen for notifications.
const POLL: Duration = Duration::from_millis(250);

pub struct PostgresStore {
    pool: PgPool,
    /// The connection the lease calls use, kept here between calls (the elector makes one
    /// at a time). Given back to the pool after each call, it would still be busy being
    /// returned (a round trip) when a one-shot run's next call asks for one at once, and the
    /// pool would open a second connection, a second server backend to start. The pool only
    /// makes a new one when this is empty: at first, and after a call that failed or was
    /// cancelled (its connection may be in any state; see `Conn`).
    slot: tokio::sync::Mutex<Option<PoolConnection<Postgres>>>,
    /// A pool of one for the LISTEN connection, kept apart so waiting never takes a
    /// connection the lease calls need.
    listen_pool: PgPool,
    /// The listener, opened on the first `changed` and dropped once a lease is won (a
    /// holder reads no notifications, and unread ones would pile up on the server).
    listener: Mutex<Option<Waiting>>,
    /// A pool of one for a watcher's LISTEN connection (`observe.rs`), which is neither a
    /// lease call's nor a waiter's.
    watch_pool: PgPool,
    /// A watcher's listener, opened on the first `observe_change` and kept.
    watching: Mutex<Option<Changes>>,
    /// The pid of this store's last waiting session (0: none), which its releases leave out
    /// when they pick whose turn it is (`turns.rs`).
    waited_as: AtomicU32,
    /// The server would not run the functions that state its epoch (`epoch::Epoch::Unstated`).
    epoch_unstated: AtomicBool,
    sql: Sql,
    /// The connection settings, to find out why the pool gave up (see `open`).
    options: PgConnectOptions,
    /// The URL without its password, for messages.
    shown: String,
    /// Whether the table may be missing (status, list, release never create it).
    existing_only: bool,
    /// The table's name as the URL gives it (unquoted), for CREATE TABLE.
    table: String,
}

impl PostgresStore {
    /// Parse the URL and connect once, so a bad address, password or database is reported
    /// here, before anything runs. The table is made by the first acquire that misses it
    /// (`prepare` makes it now).
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let (shown, options, table) = (target.shown.clone(), target.options.clone(), &target.table);
        let pool = PgPoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // A dead connection (server restarted) fails one call, which the elector
            // retries; checking every connection first would cost a round trip per call.
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        // A listener's connection is closed when it is dropped, never kept for another: its
        // session is marked as waiting (`turns.rs`).
        let listen_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_release(|_, _| Box::pin(async { Ok(false) }))
            .connect_lazy_with(options.clone());
        let watch_pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .after_release(|_, _| Box::pin(async { Ok(false) }))
            .connect_lazy_with(options.clone());
        let mut store = Self {
            pool,
            slot: tokio::sync::Mutex::new(None),
            listen_pool,
            listener: Mutex::new(None),
            watch_pool,
            watching: Mutex::new(None),
            waited_as: AtomicU32::new(0),
            epoch_unstated: AtomicBool::new(false),
            sql: Sql::new(table),
            options,
            shown,
            existing_only: access == Access::Existing,
            table: table.clone(),
        };
        let conn = match store.pool.acquire().await {
            Ok(conn) => conn,
            Err(err) => return Err(store.explain_connect_failure(err).await),
        };
        store.slot = tokio::sync::Mutex::new(Some(conn));
        Ok(store)
    }

    /// `leaderrun init`: open, and create the table now if it is missing.
    pub async fn prepare(target: &Target) -> Result<Self> {
        let store = Self::open(target, Access::Create).await?;
        let mut conn = store.conn("create-table").await?;
        let made = store.create_table(&mut conn, &store.table).await;
        conn.done(made.is_ok());
        made.map(|()| store)
    }

    /// The pool retries refused connections until its timeout and then reports only
    /// that it timed out: try once more directly to say why.
    async fn explain_connect_failure(&self, err: sqlx::Error) -> StoreError {
        if !matches!(err, sqlx::Error::PoolTimedOut) {
            return self.error(err);
        }
        match timeout(Duration::from_secs(2), self.options.connect()).await {
            Ok(Err(cause)) => self.error(cause),
            _ => self.error(err),
        }
    }

    /// A table made before the `kept` column gets it when a statement first misses it
    /// (checking at every open would cost every run a round trip). ALTER needs the table's
    /// owner: a user without it is told the statement to have run.
    async fn add_kept_column(&self, conn: &mut sqlx::PgConnection) -> Result<()> {
        let alter =
            format!("ALTER TABLE {} ADD COLUMN IF NOT EXISTS kept boolean NOT NULL DEFAULT false", self.sql.table);
        tracing::info!("adding the kept column to {}", self.sql.table);
        match sqlx::raw_sql(AssertSqlSafe(alter.clone())).execute(&mut *conn).await {
            Ok(_) => Ok(()),
            Err(err) if sqlstate(&err).as_deref() == Some("42501") => Err(StoreError::refused(format!(
                "PostgreSQL store {}: table {} predates leaderrun's kept column and this user may not add it; \
                 have the table's owner run: {alter}",
                self.shown, self.sql.table
            ))),
            Err(err) => Err(self.error(err)),
        }
    }

    /// CREATE TABLE IF NOT EXISTS, tolerating the races of many first users and a user
    /// without CREATE privilege when the table is already there.
    async fn create_table(&self, conn: &mut sqlx::PgConnection, table: &str) -> Result<()> {
        let created = sqlx::raw_sql(AssertSqlSafe(schema_sql(table))).execute(&mut *conn).await;
        match created {
            Ok(_) => Ok(()),
            // Concurrent CREATE TABLE IF NOT EXISTS can still collide on pg_type's unique
            // index (23505), find the table created meanwhile (42P07), or find its row type
            // created meanwhile (42710, "type ... already exists"): it exists now.
            Err(err) if matches!(sqlstate(&err).as_deref(), Some("23505" | "42P07" | "42710")) => Ok(()),
            // The permission check comes before the existence check: without CREATE on
            // the schema, an existing table is fine.
            Err(err) if sqlstate(&err).as_deref() == Some("42501") => {
                let quoted = format!("\"{table}\"");
                let exists = self.statement("SELECT to_regclass($1) IS NOT NULL", &[Value::Text(&quoted)])?;
                match exists.fetch_one(&mut *conn).await.and_then(|row| row.try_get::<bool, _>(0)) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(StoreError::refused(format!(
                        "PostgreSQL store {}: table {quoted} does not exist and this user may not create it \
                         (grant CREATE on the schema, or create it with `leaderrun init --print-sql`)",
                        self.shown
                    ))),
                    Err(e) => Err(self.error(e)),
                }
            }
            Err(err) => Err(self.error(err)),
        }
    }

    /// A statement with its values quoted in, sent as one simple query (one round trip).
    fn statement(&self, template: &str, values: &[Value<'_>]) -> Result<sqlx::RawSql> {
        Sql::text(template, values)
            .map(sqlx::raw_sql)
            .map_err(|why| StoreError::refused(format!("PostgreSQL store {}: {why}", self.shown)))
    }

    /// One line, without the password: the URL redacted, then what went wrong.
    fn error(&self, err: sqlx::Error) -> StoreError {
        let message = format!("PostgreSQL store {}: {}", self.shown, describe(&err));
        if transient(&err) {
            StoreError::unavailable(message)
        } else {
            StoreError::refused(message)
        }
    }

    async fn read(&self, conn: &mut sqlx::PgConnection, lock: &str) -> Result<LockRecord> {
        let mut row = self.statement(&self.sql.status, &[Value::Text(lock)])?.fetch_optional(&mut *conn).await;
        if row.as_ref().is_err_and(no_kept_column) {
            row = self.statement(&self.sql.status_before_kept, &[Value::Text(lock)])?.fetch_optional(&mut *conn).await;
        }
        match row {
            Ok(Some(row)) => Ok(record_from(&row)),
            Ok(None) => Ok(LockRecord::free(lock)),
            Err(err) if self.no_table(&err) => Ok(LockRecord::free(lock)),
            Err(err) => Err(self.error(err)),
        }
    }

    /// A missing table (never made, or dropped) holds no locks: no error for a call that
    /// only looks at or gives up a lock.
    fn no_table(&self, err: &sqlx::Error) -> bool {
        sqlstate(err).as_deref() == Some("42P01")
    }

    /// The store's connection, made now if there is none.
    async fn conn(&self, op: &'static str) -> Result<Conn<'_>> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        let mut slot = self.slot.lock().await;
        if slot.is_none() {
            *slot = Some(self.pool.acquire().await.map_err(|e| self.error(e))?);
        }
        Ok(Conn { slot, kept: false })
    }

    /// Listen for releases and turns, on a session marked as waiting for `lock`.
    async fn listen(&self, lock: &str) -> Result<Waiting> {
        // One line per request at -vvv: the benchmarks count them (connect, listen, register).
        tracing::trace!(op = "listen", "store request");
        let mut listener = PgListener::connect_with(&self.listen_pool).await.map_err(|e| self.error(e))?;
        // A lost connection is reported to us (we re-read: a release may have been missed).
        listener.eager_reconnect(false);
        listener.listen_all([CHANNEL, TURN_CHANNEL]).await.map_err(|e| self.error(e))?;
        let register =
            self.statement(turns::REGISTER_SQL, &[Value::Text(&turns::waiting_name(&self.sql.table, lock))])?;
        let pid = register.fetch_one(&mut listener).await.and_then(|row| row.try_get::<i32, _>(0));
        let pid = pid.map_err(|e| self.error(e))? as u32;
        self.waited_as.store(pid, Ordering::Relaxed);
        Ok(Waiting { listener, turns: Turns::new(pid, lock) })
    }
}

/// The calls themselves, on the store's connection (`Store` below takes and keeps it).
impl PostgresStore {
    async fn acquire_on(
        &self,
        conn: &mut sqlx::PgConnection,
        lock: &str,
        identity: &str,
        ttl: Duration,
    ) -> Result<Acquire> {
        // A waiter acting on its turn tells the others, or they act after their stagger.
        let announce = self
            .listener
            .try_lock()
            .is_ok_and(|mut waiting| waiting.as_mut().is_some_and(|waiting| waiting.turns.take_acting()));
        if lock == epoch::MARK {
            return Err(StoreError::refused(format!("PostgreSQL store {}: {lock:?} is not a lock name", self.shown)));
        }
        let mut epoch = match self.epoch_unstated.load(Ordering::Relaxed) {
            true => epoch::Epoch::Unstated,
            false => epoch::Epoch::Stated,
        };
        let mut answer = Err(sqlx::Error::PoolClosed);
        for _ in 0..4 {
            let template = self.sql.acquire(epoch, announce);
            answer = self
                .statement(template, &[Value::Text(lock), Value::Text(identity), Value::Int(micros(ttl))])?
                .fetch_one(&mut *conn)
                .await
                .and_then(|row| Ok((row.try_get::<Option<i64>, _>(0)?, row.try_get::<Option<i64>, _>(1)?)));
            match &answer {
                Err(err) if no_kept_column(err) => self.add_kept_column(&mut *conn).await?,
                // Another call of this store may have met it first: only one says so.
                Err(err) if epoch == epoch::Epoch::Stated && epoch::is_unstated(err) => {
                    if !self.epoch_unstated.swap(true, Ordering::Relaxed) {
                        epoch::warn_unstated(&self.shown, &describe(err));
                    }
                    epoch = epoch::Epoch::Unstated;
                }
                // Dropped since this store opened (or never made): a run makes it again.
                Err(err) if !self.existing_only && sqlstate(err).as_deref() == Some("42P01") => {
                    self.create_table(&mut *conn, &self.table).await?
                }
                _ => break,
            }
        }
        match answer {
            Ok((Some(token), _)) => {
                // A holder reads no notifications: stop listening (see `listener`).
                if let Ok(mut listener) = self.listener.try_lock() {
                    *listener = None;
                }
                Ok(Acquire::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token: token as u64 }))
            }
            Ok((None, grace)) => {
                let record = self.read(&mut *conn, lock).await?;
                Ok(Acquire::Held(epoch::refused(record, grace)))
            }
            Err(err) if self.existing_only && self.no_table(&err) => Ok(Acquire::Held(LockRecord::free(lock))),
            Err(err) => Err(self.error(err)),
        }
    }

    async fn renew_on(&self, conn: &mut sqlx::PgConnection, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let values = [
            Value::Int(micros(ttl)),
            Value::Text(&lease.lock),
            Value::Int(lease.token as i64),
            Value::Text(&lease.identity),
        ];
        let done = self.statement(&self.sql.renew, &values)?.execute(&mut *conn).await;
        match done {
            Ok(done) if done.rows_affected() == 1 => Ok(Renew::Renewed),
            Ok(_) => Ok(Renew::Lost(Some(self.read(&mut *conn, &lease.lock).await?))),
            Err(err) if self.no_table(&err) => Ok(Renew::Lost(None)),
            Err(err) => Err(self.error(err)),
        }
    }

    async fn release_on(&self, conn: &mut sqlx::PgConnection, lease: &Lease, keep: Duration) -> Result<()> {
        let mut done = Err(sqlx::Error::PoolClosed);
        for _ in 0..2 {
            let values = [
                Value::Int(micros(keep)),
                Value::Text(&lease.lock),
                Value::Int(lease.token as i64),
                Value::Text(&lease.identity),
                Value::Int(self.waited_as.load(Ordering::Relaxed).into()),
                Value::Text(&turns::waiting_name(&self.sql.table, &lease.lock)),
            ];
            done = self.statement(&self.sql.release, &values)?.execute(&mut *conn).await;
            match &done {
                Err(err) if no_kept_column(err) => self.add_kept_column(&mut *conn).await?,
                _ => break,
            }
        }
        match done {
            Ok(_) => Ok(()),
            Err(err) if self.no_table(&err) => Ok(()),
            Err(err) => Err(self.error(err)),
        }
    }

    async fn status_on(&self, conn: &mut sqlx::PgConnection, lock: &str) -> Result<LockRecord> {
        self.read(&mut *conn, lock).await
    }

    async fn list_on(&self, conn: &mut sqlx::PgConnection) -> Result<Vec<LockRecord>> {
        let mut rows = self.statement(&self.sql.list, &[])?.fetch_all(&mut *conn).await;
        if rows.as_ref().is_err_and(no_kept_column) {
            rows = self.statement(&self.sql.list_before_kept, &[])?.fetch_all(&mut *conn).await;
        }
        match rows {
            Ok(rows) => Ok(rows.iter().map(record_from).collect()),
            Err(err) if self.no_table(&err) => Ok(Vec::new()),
            Err(err) => Err(self.error(err)),
        }
    }

    async fn revoke_on(&self, conn: &mut sqlx::PgConnection, lock: &str) -> Result<Option<LockRecord>> {
        loop {
            let before = self.read(&mut *conn, lock).await?;
            if !before.is_held() {
                return Ok(None);
            }
            let waiting = turns::waiting_name(&self.sql.table, lock);
            let values = [Value::Text(lock), Value::Int(before.token as i64), Value::Text(&waiting)];
            let done = match self.statement(&self.sql.revoke, &values)?.fetch_all(&mut *conn).await {
                Err(err) if no_kept_column(&err) => {
                    self.add_kept_column(&mut *conn).await?;
                    continue;
                }
                done => done.map_err(|e| self.error(e))?,
            };
            if done.len() == 1 {
                return Ok(Some(before));
            }
        }
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let mut conn = self.conn("acquire").await?;
        let result = self.acquire_on(&mut conn, lock, identity, ttl).await;
        conn.done(result.is_ok());
        result
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let mut conn = self.conn("renew").await?;
        let result = self.renew_on(&mut conn, lease, ttl).await;
        conn.done(result.is_ok());
        result
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let mut conn = self.conn("release").await?;
        let result = self.release_on(&mut conn, lease, keep).await;
        conn.done(result.is_ok());
        result
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let mut conn = self.conn("status").await?;
        let result = self.status_on(&mut conn, lock).await;
        conn.done(result.is_ok());
        result
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let mut conn = self.conn("list").await?;
        let result = self.list_on(&mut conn).await;
        conn.done(result.is_ok());
        result
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let mut conn = self.conn("revoke").await?;
        let result = self.revoke_on(&mut conn, lock).await;
        conn.done(result.is_ok());
        result
    }

    /// Wait for a notification naming `lock`. Notifications that arrive between two calls
    /// wait in the connection, so a release just after our last read is not missed; one
    /// that came before it only makes this return early (harmless: the caller re-reads).
    /// A listener that was just (re)connected may have missed a release: read once then.
    async fn changed(&self, lock: &str, max_wait: Duration) {
        // A listener's session is marked as waiting for one lock: another needs another.
        if let Ok(mut slot) = self.listener.try_lock() {
            if slot.as_ref().is_some_and(|waiting| waiting.turns.lock() != lock) {
                *slot = None;
            }
        }
        let open = || async { self.listen(lock).await.map_err(|err| err.message) };
        release_feed::wait_for_release(self, &self.listener, open, lock, max_wait, ACQUIRE_TIMEOUT, POLL).await
    }

    /// A renewal is not announced, nor is an expiry (`observe.rs`).
    fn observing(&self) -> Observing {
        Observing::PushesWrites
    }

    /// Wait on the watcher's own listener (`observe.rs`): it takes no waiter's turn.
    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        let open = || async { self.listen_for_changes().await.map_err(|err| err.message) };
        release_feed::observe(&self.watching, open, lock, max_wait, ACQUIRE_TIMEOUT).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(valid_table("leaderrun_locks") && valid_table("_x9") && valid_table(&"a".repeat(63)));
        for bad in ["", "9lives", "a-b", "a b", "a\"b", "schema.table", "ünï", &"a".repeat(64)] {
            assert!(!valid_table(bad), "{bad:?}");
        }
    }

    #[test]
    fn url_splitting() {
        let split = |u| split_url(u).unwrap();
        assert_eq!(split("postgres://u:p@h/db"), ("postgres://u:p@h/db".into(), DEFAULT_TABLE.into()));
        assert_eq!(split("postgres://u:p@h/db?table=t1"), ("postgres://u:p@h/db".into(), "t1".into()));
        assert_eq!(
            split("postgresql://h/db?sslmode=require&table=T&options[search_path]=s"),
            ("postgresql://h/db?sslmode=require&options[search_path]=s".into(), "T".into())
        );
        let err = split_url("postgres://u:hunter2@h/db?table=x;drop").unwrap_err();
        assert!(err.contains("x;drop") && !err.contains("hunter2"), "{err}");
        let err = split_url("postgres://u:hunter2@h/db?bogus=secret").unwrap_err();
        assert!(err.contains("unknown parameter ?bogus=") && !err.contains("secret"), "{err}");
        let err = Target::parse("postgres://u:hunter2@h:notaport/db").err().expect("refused");
        assert!(err.contains("invalid URL") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn values_are_quoted_in_one_pass() {
        let text = |template: &str, values: &[Value<'_>]| Sql::text(template, values).unwrap().as_str().to_string();
        assert_eq!(text("SELECT $1, $2", &[Value::Text("a"), Value::Int(-7)]), "SELECT $lr$a$lr$, -7");
        // A value that looks like a parameter stays as it is; `$` without a number too.
        assert_eq!(text("$1 $2", &[Value::Text("$2"), Value::Text("x")]), "$lr$$2$lr$ $lr$x$lr$");
        assert_eq!(text("a $ b $9", &[]), "a $ b $9");
        // The tag never occurs in the text, nor overlaps its end.
        assert_eq!(text("$1", &[Value::Text("$lr$")]), "$lrx$$lr$$lrx$");
        assert_eq!(text("$1", &[Value::Text("a$lr")]), "$lrx$a$lr$lrx$");
        assert_eq!(text("$1", &[Value::Text("it's \\")]), "$lr$it's \\$lr$");
        assert!(Sql::text("$1", &[Value::Text("a\0b")]).unwrap_err().contains("NUL"));
    }

    #[test]
    fn schema_is_one_statement() {
        let sql = schema_sql("t");
        assert!(sql.starts_with("CREATE TABLE IF NOT EXISTS \"t\" (") && !sql.contains(';'));
        assert_eq!(Target::parse("postgres://h/db?table=x").unwrap().table(), "x");
        assert!(Target::parse("postgres://h/db?table=1").is_err());
    }
}
