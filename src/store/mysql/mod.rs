//! MySQL / MariaDB store: one InnoDB table, one row per lock name.
//!
//! `--store mysql://USER:PASSWORD@HOST:PORT/DATABASE?OPTIONS` (`mariadb://` means the
//! same). Options, all optional:
//!
//! | option | meaning |
//! |---|---|
//! | `table=NAME` | the table to use (default `leaderrun_locks`), for a database shared with other software; `[A-Za-z_][A-Za-z0-9_]{0,63}` |
//! | `ssl-mode=` | `disabled`, `preferred` (the default: TLS if the server offers it), `required`, `verify_ca`, `verify_identity` |
//! | `ssl-ca=PATH` | CA certificate(s) to verify the server with (default: the Web PKI roots) |
//! | `ssl-cert=PATH`, `ssl-key=PATH` | a client certificate |
//! | `socket=PATH` | a Unix socket instead of TCP |
//!
//! Any other option is refused rather than ignored, so that a misspelt `ssl-mode` cannot
//! quietly turn TLS verification off.
//!
//! The table is created on first use if missing (`CREATE TABLE IF NOT EXISTS`, see
//! [`schema_sql`]). Least grants: `SELECT, INSERT, UPDATE` on the table; `CREATE` on the
//! database too only if leaderrun is to create the table itself (otherwise create it
//! once with `leaderrun init --print-sql`). Rows are never deleted: a row keeps its lock's
//! fencing token, so deleting one by hand would let the token start again at 1.
//!
//! How the safety contract maps onto MySQL:
//! - Expiry is judged on the server's clock: every statement compares with
//!   `UTC_TIMESTAMP(6)`, which is fixed per statement and independent of the session's
//!   time zone. The times are DATETIME(6) in UTC. (A server clock stepped forward would
//!   expire leases early, as with any store that judges expiry on its own clock.)
//! - Acquire is a compare-and-set: `ON DUPLICATE KEY UPDATE` has no WHERE, so it is a
//!   conditional `UPDATE … WHERE holder IS NULL OR expires_at <= now` whose affected-row
//!   count says who won, and an `INSERT` (which fails with a duplicate key for all but one
//!   racer) when the lock name is new. The UPDATE sets `token = LAST_INSERT_ID(token + 1)`,
//!   so the server returns the exact token it wrote with the statement's own answer.
//! - A failover to a replica that missed the last writes (asynchronous replication) must not
//!   hand a lost lease to someone else, nor a token already given: the grants are gated on the
//!   epoch mark, a row of the same table under a name no lock can have, holding the
//!   `@@server_id` leases were last granted on (see `epoch.rs`). A new server grants nothing
//!   until one longest lease has passed, and from then on its tokens start at its clock in
//!   microseconds. `list` never shows the mark.
//! - Lock names are `VARBINARY`: compared byte for byte, so case, accents and trailing
//!   spaces all make different locks (MariaDB's `utf8mb4_bin` is PAD SPACE: 'x' = 'x ').
//! - Deadlocks (1213) and lock wait timeouts (1205) undo the whole statement and are
//!   retried here a few times; a pool of a few connections reconnects after a server
//!   restart, so a holder rides out a short outage.
//! - Wake-ups come from a user-level lock (`GET_LOCK`) the holder keeps beside its lease
//!   and waiters block on, and a second one for the relief, the waiter that bypasses a first
//!   waiter frozen at its turn (see [`hint`]); only a hint, the table decides.
//! - Connections: a one-shot run uses one (the table check, the acquire and the release
//!   share it); a holder keeps the one its acquire won on (it holds the user locks) and renews
//!   on the pool's; a standby keeps one, blocked in `GET_LOCK`.
//!
//! The password never appears in a message: every message names the store by
//! `url::redact`, and anything that might echo it is scrubbed.

mod acquire;
mod epoch;
mod errors;
pub mod hint;
mod kind;
mod relief;
mod target;

use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use rand::Rng;
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row};
use tokio::time::Instant;

use super::Access;
use super::{Acquire, ErrorKind, Lease, LockRecord, Renew, Result, Store, StoreError};
use errors::{describe, duplicate, is_undone, kind_of, no_kept_column, no_table, number};
pub use kind::KIND;
use target::scrub;
#[cfg(test)]
use target::{connect_options, passwords};
pub use target::{schema_sql, table_of, Target};

/// The table used unless the URL says `?table=`.
pub const DEFAULT_TABLE: &str = "leaderrun_locks";

/// How often a waiter that holds the user lock, while someone else holds the lease without
/// it, re-reads the lock (every 1 to 1.5 s): it is the only one re-reading, the others stay
/// blocked behind its user lock.
const POLL: Duration = Duration::from_secs(1);

/// Longest wait for a connection (the pool keeps retrying a refused one meanwhile, which
/// covers a server restart).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest any one call may take, connecting included; the elector's own limits are
/// usually shorter. Keeps `status` from hanging on a server that stopped answering.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Attempts at a statement that hit a deadlock or a lock wait timeout.
const ATTEMPTS: u32 = 6;

/// Rounds of "update failed, yet the lock looked free" before an acquire gives up.
const ACQUIRE_ROUNDS: u32 = 5;

pub struct MySqlStore {
    pool: MySqlPool,
    /// For a direct connection attempt when the pool only says "timed out": its error says why.
    options: MySqlConnectOptions,
    /// `` `name` ``, checked.
    table: String,
    /// The URL as shown in messages (password replaced by `***`).
    shown: String,
    /// What to scrub from any message.
    secrets: Vec<String>,
    /// The user locks that wake waiters.
    hints: hint::Hints,
    /// When the grace of a new epoch that an acquire last ran into ends: until then every
    /// lock counts as held, and a waiter sleeps rather than queue for a user lock.
    grace: Mutex<Option<Instant>>,
}

impl MySqlStore {
    /// Connect (and with `Access::Create`, create the table if missing). Every failure here
    /// is reported at once; the caller does not retry an open.
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let (shown, secrets, table, options) =
            (target.shown.clone(), target.secrets.clone(), target.table.clone(), target.options.clone());
        let pool = MySqlPoolOptions::new()
            .min_connections(0)
            .max_connections(3)
            .acquire_timeout(CONNECT_TIMEOUT)
            // No ping before each call: it doubled every renewal's round trips, and with 100 ms
            // of network latency a renewal then outlasted the time left before the stop signal
            // (the fault run's "+100 ms" cost the lease every time). A dead connection (server
            // restarted) fails one call, which the elector retries on a fresh one.
            .test_before_acquire(false)
            .connect_lazy_with(options.clone());
        let hints = hint::Hints::new(options.clone(), pool.clone(), &table);
        let grace = Mutex::new(None);
        let store = Self { pool, options, table: format!("`{table}`"), shown, secrets, hints, grace };
        let (store_ref, table) = (&store, &table);
        store
            .call("open", move || async move {
                let store = store_ref;
                let mut conn = store.pool.acquire().await?;
                let probe = sqlx::query(store.sql("SELECT 1 FROM {t} LIMIT 0")).execute(&mut *conn).await;
                match probe {
                    Err(err) if no_table(&err) && access == Access::Create => {
                        // With the table, the mark of its first epoch (see `epoch`).
                        sqlx::raw_sql(AssertSqlSafe(schema_sql(table))).execute(&mut *conn).await?;
                    }
                    Err(err) if no_table(&err) => {} // no table, no locks: status and list say so
                    other => other.map(drop)?,
                }
                // Kept out of the pool for the acquire that follows (the pool would first ping
                // it on its way back, and an acquire meanwhile would open a second connection).
                store.hints.spare(hint::Conn::Own(conn.detach()));
                Ok(())
            })
            .await?;
        Ok(store)
    }

    /// The table's name, unquoted.
    fn bare_table(&self) -> &str {
        self.table.trim_matches('`')
    }

    /// A statement with `{t}` replaced by the quoted table name.
    fn sql(&self, template: &str) -> AssertSqlSafe<String> {
        AssertSqlSafe(template.replace("{t}", &self.table))
    }

    /// Run one store call: bounded in time, retrying what InnoDB undid (deadlock, lock
    /// wait timeout), and turning any other failure into a one-line `StoreError`.
    /// (`body` makes a fresh future for each attempt.)
    async fn call<T, F, Fut>(&self, op: &str, body: F) -> Result<T>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = sqlx::Result<T>>,
    {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        let mut attempt = 1;
        loop {
            let err = match tokio::time::timeout(CALL_TIMEOUT, body()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) => err,
                Err(_) => {
                    let waited = humantime::format_duration(CALL_TIMEOUT);
                    return Err(self.error(ErrorKind::Unavailable, &format!("no answer within {waited}")));
                }
            };
            if no_kept_column(&err) && attempt < ATTEMPTS {
                attempt += 1;
                self.add_kept_column().await?;
                continue;
            }
            if is_undone(&err) && attempt < ATTEMPTS {
                attempt += 1;
                let pause = rand::rng().random_range(5..50);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                continue;
            }
            if matches!(err, sqlx::Error::PoolTimedOut) {
                return Err(self.diagnose().await);
            }
            return Err(self.error(kind_of(&err), &describe(&err)));
        }
    }

    /// A table made before the `kept` column gets it when a statement first misses it
    /// (checking at every open would cost every run a round trip). ALTER needs the ALTER
    /// privilege: a user without it is told the statement to have run.
    async fn add_kept_column(&self) -> Result<()> {
        let alter = self.sql("ALTER TABLE {t} ADD COLUMN kept BOOLEAN NOT NULL DEFAULT 0");
        tracing::info!("adding the kept column to {}", self.table);
        match sqlx::raw_sql(AssertSqlSafe(alter.0.clone())).execute(&self.pool).await {
            // Added by another process in the meantime.
            Err(err) if number(&err) == Some(1060) => Ok(()),
            Err(err) if matches!(number(&err), Some(1142 | 1044 | 1045)) => Err(self.error(
                ErrorKind::Refused,
                &format!(
                    "table {} predates leaderrun's kept column and this user may not add it; run: {}",
                    self.table, alter.0
                ),
            )),
            Err(err) => Err(self.error(kind_of(&err), &describe(&err))),
            Ok(_) => Ok(()),
        }
    }

    /// The pool gave up waiting for a connection: one direct attempt says why.
    async fn diagnose(&self) -> StoreError {
        let waited = humantime::format_duration(CONNECT_TIMEOUT);
        match tokio::time::timeout(CONNECT_TIMEOUT, self.options.connect()).await {
            Ok(Err(err)) => self.error(kind_of(&err), &format!("cannot connect: {}", describe(&err))),
            Ok(Ok(conn)) => {
                let _ = conn.close().await;
                self.error(ErrorKind::Unavailable, &format!("no connection became free within {waited}"))
            }
            Err(_) => self.error(ErrorKind::Unavailable, &format!("cannot connect within {waited}")),
        }
    }

    /// `MySQL store mysql://user:***@host:port/db: what`, on one line, without the password.
    fn error(&self, kind: ErrorKind, what: &str) -> StoreError {
        let message = format!("MySQL store {}: {}", self.shown, what.replace(['\n', '\r'], " "));
        StoreError { kind, message: scrub(message, &self.secrets) }
    }

    /// The record of one lock, or `None` if the table has no row for it.
    async fn read(&self, conn: &mut MySqlConnection, lock: &str) -> sqlx::Result<Option<LockRecord>> {
        let select = |columns: &str| self.sql(&format!("SELECT {columns} FROM {{t}} WHERE name = ?"));
        let mut row = sqlx::query(select(&columns(true))).bind(lock.as_bytes()).fetch_optional(&mut *conn).await;
        if row.as_ref().is_err_and(no_kept_column) {
            row = sqlx::query(select(&columns(false))).bind(lock.as_bytes()).fetch_optional(&mut *conn).await;
        }
        row?.map(|row| record_from(lock.to_string(), &row)).transpose()
    }

    /// Give a lease up: keep it taken until acquired_at + keep if that is still ahead, else
    /// free it. (MySQL assigns left to right; neither expression reads a column set before it.)
    fn release_query<'q>(
        &self,
        lease: &'q Lease,
        keep: Duration,
    ) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
        sqlx::query(self.sql(
            "UPDATE {t} SET
                    expires_at = IF(acquired_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6),
                                    acquired_at + INTERVAL ? MICROSECOND, UTC_TIMESTAMP(6)),
                    holder = IF(acquired_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6), holder, NULL),
                    kept = acquired_at + INTERVAL ? MICROSECOND > UTC_TIMESTAMP(6)
                 WHERE name = ? AND token = ? AND holder = ?",
        ))
        .bind(micros(keep))
        .bind(micros(keep))
        .bind(micros(keep))
        .bind(micros(keep))
        .bind(lease.lock.as_bytes())
        .bind(lease.token)
        .bind(lease.identity.as_str())
    }
}

/// What `read` and `list` select; `record_from` decodes it. A table from before the `kept`
/// column is read without it (`with_kept` false): `status` and `list` only look, so they do
/// not add it.
fn columns(with_kept: bool) -> String {
    let kept = if with_kept { "kept" } else { "FALSE AS kept" };
    format!(
        "holder, token, revoked, {kept},
    TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) AS left_us,
    TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', acquired_at) AS since_us"
    )
}

fn record_from(lock: String, row: &MySqlRow) -> sqlx::Result<LockRecord> {
    let holder: Option<String> = row.try_get("holder")?;
    let token: u64 = row.try_get("token")?;
    let revoked: bool = row.try_get("revoked")?;
    let kept: bool = row.try_get("kept")?;
    let left_us: i64 = row.try_get("left_us")?;
    let since_us: i64 = row.try_get("since_us")?;
    let live = holder.is_some() && left_us > 0;
    Ok(LockRecord {
        lock,
        holder: holder.filter(|_| live),
        token,
        held_since: live.then(|| UNIX_EPOCH + Duration::from_micros(since_us.max(0) as u64)),
        expires_in: live.then(|| Duration::from_micros(left_us as u64)),
        revoked: live && revoked,
        campaigner: None,
        kept: live && kept,
    })
}

/// A duration as the microseconds an `INTERVAL ? MICROSECOND` takes (capped at ~100 years,
/// well inside DATETIME's range).
fn micros(d: Duration) -> i64 {
    d.as_micros().min(100 * 365 * 86_400 * 1_000_000) as i64
}

#[async_trait]
impl Store for MySqlStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        self.call("acquire", move || self.take(lock, identity, ttl)).await
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        self.call("renew", move || async move {
            let mut conn = self.pool.acquire().await?;
            // The client reports matched rows (CLIENT_FOUND_ROWS), so a renewal that writes
            // the same expiry still counts.
            let done = sqlx::query(self.sql(
                "UPDATE {t} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND
                 WHERE name = ? AND token = ? AND holder = ? AND revoked = 0",
            ))
            .bind(micros(ttl))
            .bind(lease.lock.as_bytes())
            .bind(lease.token)
            .bind(&lease.identity)
            .execute(&mut *conn)
            .await?;
            Ok(if done.rows_affected() == 1 {
                Renew::Renewed
            } else {
                Renew::Lost(self.read(&mut conn, &lease.lock).await?)
            })
        })
        .await
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        // Written on the lease's own connection (no new connection for a one-shot run), and
        // only then is that connection closed: a waiter the user lock wakes must find the
        // lease already free.
        let slot = &tokio::sync::Mutex::new(self.hints.take(&lease.lock));
        let result = self
            .call("release", move || async move {
                let mut conns = slot.lock().await;
                if let Some(conn) = conns.first_mut() {
                    match self.release_query(lease, keep).execute(conn).await {
                        Ok(_) => return Ok(()),
                        Err(err) if kind_of(&err) == ErrorKind::Refused => return Err(err),
                        // That connection is broken: the pool's will do.
                        Err(_) => drop(conns.remove(0)),
                    }
                }
                self.release_query(lease, keep).execute(&self.pool).await.map(drop)
            })
            .await;
        hint::close(slot.lock().await.drain(..).collect()).await;
        result
    }

    fn sees_expiry(&self) -> bool {
        // A holder's user lock outlives its lease when the holder is cut off (its session
        // lingers on the server): the elector must re-read at the lease's expiry.
        false
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        let grace = *self.grace.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(until) = grace.filter(|until| *until > Instant::now()) {
            // A new epoch's grace: nobody on this server holds the user locks yet, and nothing
            // is granted before it ends.
            return tokio::time::sleep_until(until.min(Instant::now() + max_wait)).await;
        }
        if self.hints.is_woken(lock) {
            // This waiter holds the user lock, yet someone holds the lease without it (it won
            // while the user lock was ours, or runs a leaderrun from before the hint): re-read
            // now and then, while every other waiter stays blocked behind our user lock.
            return super::poll_until_free(self, lock, max_wait, POLL).await;
        }
        self.hints.wait(lock, max_wait).await;
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        self.call("status", move || async move {
            let mut conn = self.pool.acquire().await?;
            match self.read(&mut conn, lock).await {
                Ok(record) => Ok(record.unwrap_or_else(|| LockRecord::free(lock))),
                Err(err) if no_table(&err) => Ok(LockRecord::free(lock)),
                Err(err) => Err(err),
            }
        })
        .await
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        self.call("list", move || async move {
            let select = |columns: &str| {
                let mark = epoch::MARK_SQL;
                self.sql(&format!("SELECT name, {columns} FROM {{t}} WHERE name <> {mark} ORDER BY name"))
            };
            let mut rows = sqlx::query(select(&columns(true))).fetch_all(&self.pool).await;
            if rows.as_ref().is_err_and(no_kept_column) {
                rows = sqlx::query(select(&columns(false))).fetch_all(&self.pool).await;
            }
            match rows {
                Ok(rows) => rows
                    .iter()
                    .map(|row| {
                        let name: Vec<u8> = row.try_get("name")?;
                        record_from(String::from_utf8_lossy(&name).into_owned(), row)
                    })
                    .collect(),
                Err(err) if no_table(&err) => Ok(Vec::new()),
                Err(err) => Err(err),
            }
        })
        .await
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        self.call("revoke", move || async move {
            let mut conn = self.pool.acquire().await?;
            loop {
                let before = match self.read(&mut conn, lock).await {
                    Ok(Some(record)) if record.is_held() => record,
                    Ok(_) => return Ok(None),
                    Err(err) if no_table(&err) => return Ok(None),
                    Err(err) => return Err(err),
                };
                // Compare-and-set on the token read, so a lease taken in between is left alone. A
                // lease only kept for --min-hold has no child and no holder left to free it: it is
                // freed now; a live one is only asked to stand down. (MySQL assigns left to right:
                // `kept` is read before it is cleared.)
                let done = sqlx::query(self.sql(
                    "UPDATE {t} SET revoked = IF(kept, revoked, 1), holder = IF(kept, NULL, holder),
                        expires_at = IF(kept, UTC_TIMESTAMP(6), expires_at), kept = 0
                     WHERE name = ? AND token = ? AND holder IS NOT NULL",
                ))
                .bind(lock.as_bytes())
                .bind(before.token)
                .execute(&mut *conn)
                .await?;
                if done.rows_affected() == 1 {
                    return Ok(Some(before));
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert_eq!(table_of("mysql://u:p@h/db").unwrap(), "leaderrun_locks");
        assert_eq!(table_of("mysql://u:p@h/db?ssl-mode=required&table=my_locks").unwrap(), "my_locks");
        assert_eq!(table_of("mysql://h/db?table=_x9").unwrap(), "_x9");
        assert!(table_of("mysql://h/db?table=9x").is_err());
        assert!(table_of("mysql://h/db?table=a`b").is_err());
        assert!(table_of("mysql://h/db?table=").is_err());
        assert!(table_of(&format!("mysql://h/db?table={}", "x".repeat(65))).is_err());
        assert!(table_of(&format!("mysql://h/db?table={}", "x".repeat(64))).is_ok());
        assert!(schema_sql("t").contains("CREATE TABLE IF NOT EXISTS `t`"));
    }

    #[test]
    fn options_are_checked_and_mariadb_is_mysql() {
        let options = connect_options("mariadb://u:hunter2@db.example:3307/locks?table=t&ssl-mode=required").unwrap();
        assert_eq!(options.get_host(), "db.example");
        assert_eq!(options.get_port(), 3307);
        assert_eq!(options.get_database(), Some("locks"));
        assert!(matches!(options.get_ssl_mode(), sqlx::mysql::MySqlSslMode::Required));
        let err = connect_options("mysql://u:hunter2@h/db?ssl_mode=required").unwrap_err();
        assert!(err.contains("unknown option \"ssl_mode\""), "{err}");
        assert!(!err.contains("hunter2"));
        assert!(connect_options("mysql://u:hunter2@h/db?ssl-mode=bogus").unwrap_err().contains("ssl_mode"));
    }

    #[test]
    fn passwords_to_scrub() {
        assert_eq!(passwords("mysql://u:hunter2@h/db"), vec!["hunter2"]);
        assert_eq!(passwords("mysql://u:p%40ss%zz@h/db"), vec!["p%40ss%zz", "p@ss%zz"]);
        assert!(passwords("mysql://u@h/db").is_empty());
    }

    #[test]
    fn bad_urls_are_refused_without_the_password() {
        for url in ["mysql://u:hunter2@h/db?table=1x", "mariadb://u:hunter2@h/db?pool=9", "mysql://u:hunter2@h:x/db"] {
            let err = Target::parse(url).err().expect("refused");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
