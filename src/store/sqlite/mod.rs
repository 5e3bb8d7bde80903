//! The embedded default store: one SQLite file serving the processes of one host.
//!
//! Every acquire, renew and release is a single SQL statement, which SQLite runs
//! under its write lock: that is the compare-and-set. Expiry is judged on
//! CLOCK_BOOTTIME, which every process on the host shares and which never jumps;
//! each row also records the kernel's boot id, so a lease written before a reboot
//! is void after it (every process of that boot is gone). The file must stay on a
//! local filesystem: SQLite's locking is not to be trusted over NFS.
//!
//! Waiters wait in the kernel, not by polling: see `wake`. So does `leaderrun watch`, on
//! inotify, outside the waiters' queue: see `observe`.

mod kind;
mod observe;
mod open;
mod sidecar;
mod turn;
mod wake;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use rand::Rng;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqliteSynchronous};
use sqlx::{ConnectOptions, Row};
use tokio::sync::Mutex;

use super::Access;
use super::{Acquire, Lease, LockRecord, Observing, Renew, Result, Store, StoreError};
use crate::clock::boottime;
pub use kind::{default_file, default_state_dir, SqliteFile, KIND};

/// How long a statement waits for another process's write lock before failing.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The table, created on first use (`leaderrun init --print-sql` prints it).
pub const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS leaderrun_locks (
    name             TEXT PRIMARY KEY NOT NULL,
    holder           TEXT,               -- NULL when released
    token            INTEGER NOT NULL,   -- fencing token: +1 on every acquisition
    boot_id          TEXT NOT NULL,      -- the kernel boot the times below belong to
    acquired_ns      INTEGER NOT NULL,   -- CLOCK_BOOTTIME at acquisition
    expires_ns       INTEGER NOT NULL,   -- CLOCK_BOOTTIME at which the lease lapses
    acquired_unix_ms INTEGER NOT NULL,   -- wall clock at acquisition, for display only
    revoked          INTEGER NOT NULL DEFAULT 0, -- 1: `leaderrun release` asked the holder to stand down
    kept             INTEGER NOT NULL DEFAULT 0  -- 1: released, kept until expires_ns for --min-hold
) WITHOUT ROWID";

/// Files made before the `kept` column get it on open (SQLite adds a column without
/// rewriting the table).
const ADD_KEPT: &str = "ALTER TABLE leaderrun_locks ADD COLUMN kept INTEGER NOT NULL DEFAULT 0";

/// Pages the write-ahead log may hold before a commit copies them into the database.
/// Small: a process that opens the file while nobody else has it open rebuilds the
/// log's index by reading the whole log, and closing does not copy it (see `connect`).
const WAL_PAGES: &str = "64";

/// Where the kernel says which boot this is.
const BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

pub struct SqliteStore {
    /// Unset while the file does not exist and the caller only looks (status, list, watch).
    conn: tokio::sync::OnceCell<Mutex<SqliteConnection>>,
    /// How to open the file once it exists, for a store opened before it did: a `watch`
    /// started before the first run on a new file must see that run.
    later: Option<SqliteConnectOptions>,
    /// For error messages.
    path: PathBuf,
    /// This boot's id: a lease written under another is from before a reboot, and void.
    boot: String,
    /// The wake-up queue beside the file (`None` when the file does not exist).
    wake: Option<wake::Wake>,
    /// A watcher's inotify watch (`observe.rs`), made on the first `observe_change` and kept.
    watching: Mutex<Option<(observe::Writes, Option<i64>)>>,
}

/// This boot's id. Without it a lease cannot be told from one of an earlier boot: writing a
/// placeholder would make every process's live lease look like another boot's, to be taken.
fn read_boot_id(file: &Path) -> Result<String> {
    match std::fs::read_to_string(file) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        Ok(_) => Err(StoreError::refused(format!("SQLite store: {} is empty", file.display()))),
        Err(err) => Err(StoreError::refused(format!(
            "SQLite store: cannot read the kernel's boot id from {} ({err}), which tells a live lease from one \
             written before a reboot; give leaderrun read access to it (systemd: drop ProcSubset=pid)",
            file.display()
        ))),
    }
}

fn ns(d: Duration) -> i64 {
    d.as_nanos().min(i64::MAX as u128) as i64
}

fn unix_ms_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// Whether an sqlx error may go away if retried (another process holds the write lock).
fn is_busy(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            matches!(db.code().as_deref(), Some("5") | Some("6") | Some("517") | Some("261"))
                || db.message().contains("locked")
                || db.message().contains("busy")
        }
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => true,
        _ => false,
    }
}

fn store_error(path: &Path, err: sqlx::Error) -> StoreError {
    let message = match &err {
        sqlx::Error::Database(db) => format!("SQLite store {}: {}", path.display(), db.message()),
        other => format!("SQLite store {}: {other}", path.display()),
    };
    if is_busy(&err) {
        StoreError::unavailable(message)
    } else {
        StoreError::refused(message)
    }
}

impl SqliteStore {
    async fn read(&self, conn: &mut SqliteConnection, lock: &str) -> std::result::Result<LockRecord, sqlx::Error> {
        let row = sqlx::query(
            "SELECT holder, token, boot_id, expires_ns, acquired_unix_ms, revoked, kept FROM leaderrun_locks WHERE name = ?1",
        )
        .bind(lock)
        .fetch_optional(&mut *conn)
        .await;
        let row = match row {
            Ok(row) => row,
            Err(err) if no_table(&err) => None,
            Err(err) => return Err(err),
        };
        Ok(match row {
            Some(row) => self.record_from(lock.to_string(), &row).0,
            None => LockRecord::free(lock),
        })
    }

    /// The record a row shows, and whether it is only kept for --min-hold.
    fn record_from(&self, lock: String, row: &sqlx::sqlite::SqliteRow) -> (LockRecord, bool) {
        let holder: Option<String> = row.get("holder");
        let token: i64 = row.get("token");
        let row_boot: String = row.get("boot_id");
        let expires_ns: i64 = row.get("expires_ns");
        let acquired_unix_ms: i64 = row.get("acquired_unix_ms");
        let revoked: i64 = row.get("revoked");
        let kept: i64 = row.get("kept");
        let left = expires_ns - ns(boottime());
        let live = holder.is_some() && row_boot == self.boot && left > 0;
        let record = LockRecord {
            lock,
            holder: holder.filter(|_| live),
            token: token as u64,
            held_since: live.then(|| UNIX_EPOCH + Duration::from_millis(acquired_unix_ms as u64)),
            expires_in: live.then(|| Duration::from_nanos(left as u64)),
            revoked: live && revoked != 0,
            campaigner: None,
            kept: live && kept != 0,
        };
        (record, live && kept != 0)
    }
}

fn no_table(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db) if db.message().contains("no such table"))
}

/// Run `$body` with the connection, or answer `$empty` when the file does not exist.
macro_rules! with_conn {
    ($self:ident, $op:literal, $conn:ident, $empty:expr, $body:expr) => {{
        match $self.connection().await {
            None => Ok($empty),
            Some(mutex) => {
                // One line per request at -vvv: the benchmarks count them.
                tracing::trace!(op = $op, "store request");
                let mut guard = mutex.lock().await;
                let $conn: &mut SqliteConnection = &mut guard;
                let result: std::result::Result<_, sqlx::Error> = $body;
                result.map_err(|e| store_error(&$self.path, e))
            }
        }
    }};
}

impl SqliteStore {
    /// SQLite's count of commits by other connections, as this one last saw it (`None`: no
    /// file, or it cannot be read).
    async fn data_version(&self) -> Option<i64> {
        let read = with_conn!(self, "data_version", conn, None, {
            sqlx::query_scalar::<_, i64>("PRAGMA data_version").fetch_one(&mut *conn).await.map(Some)
        });
        read.ok().flatten()
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let now = boottime();
        let answer = with_conn!(
            self,
            "acquire",
            conn,
            Acquire::Held(LockRecord::free(lock)),
            async {
                // An acquisition is on disk before it is reported (FULL syncs the log at
                // commit), so a power loss cannot hand its fencing token out again. Other
                // writes may be lost with the boot they belong to, which voids them anyway,
                // and the next acquisition's sync carries them to disk.
                sqlx::query("PRAGMA synchronous = FULL").execute(&mut *conn).await?;
                let won = sqlx::query(
                "INSERT INTO leaderrun_locks (name, holder, token, boot_id, acquired_ns, expires_ns, acquired_unix_ms)
                 VALUES (?1, ?2, 1, ?3, ?4, ?5, ?6)
                 ON CONFLICT(name) DO UPDATE SET
                    holder = excluded.holder, token = leaderrun_locks.token + 1, boot_id = excluded.boot_id,
                    acquired_ns = excluded.acquired_ns, expires_ns = excluded.expires_ns,
                    acquired_unix_ms = excluded.acquired_unix_ms, revoked = 0, kept = 0
                 WHERE leaderrun_locks.holder IS NULL
                    OR leaderrun_locks.boot_id <> excluded.boot_id
                    OR leaderrun_locks.expires_ns <= excluded.acquired_ns
                 RETURNING token",
            )
            .bind(lock)
            .bind(identity)
            .bind(&self.boot)
            .bind(ns(now))
            .bind(ns(now + ttl))
            .bind(unix_ms_now())
            .fetch_optional(&mut *conn)
            .await;
                sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await?;
                Ok(match won? {
                    Some(row) => Acquire::Won(Lease {
                        lock: lock.to_string(),
                        identity: identity.to_string(),
                        token: row.get::<i64, _>("token") as u64,
                    }),
                    None => Acquire::Held(self.read(conn, lock).await?),
                })
            }
            .await
        );
        if let (Some(wake), Ok(answer)) = (&self.wake, &answer) {
            match answer {
                Acquire::Won(_) => wake.won(lock),
                Acquire::Held(LockRecord { expires_in: Some(left), .. }) => wake.saw(lock, *left),
                _ => {}
            }
        }
        answer
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let now = boottime();
        with_conn!(
            self,
            "renew",
            conn,
            Renew::Lost(None),
            async {
                let done = sqlx::query(
                    "UPDATE leaderrun_locks SET expires_ns = ?1
                 WHERE name = ?2 AND token = ?3 AND holder = ?4 AND boot_id = ?5 AND revoked = 0",
                )
                .bind(ns(now + ttl))
                .bind(&lease.lock)
                .bind(lease.token as i64)
                .bind(&lease.identity)
                .bind(&self.boot)
                .execute(&mut *conn)
                .await?;
                Ok(if done.rows_affected() == 1 {
                    Renew::Renewed
                } else {
                    Renew::Lost(Some(self.read(conn, &lease.lock).await?))
                })
            }
            .await
        )
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let now = boottime();
        let freed = with_conn!(
            self,
            "release",
            conn,
            false,
            async {
                let row = sqlx::query(
                    "UPDATE leaderrun_locks SET
                    holder = CASE WHEN acquired_ns + ?1 > ?2 THEN holder ELSE NULL END,
                    expires_ns = CASE WHEN acquired_ns + ?1 > ?2 THEN acquired_ns + ?1 ELSE 0 END,
                    kept = CASE WHEN acquired_ns + ?1 > ?2 THEN 1 ELSE 0 END
                 WHERE name = ?3 AND token = ?4 AND holder = ?5
                 RETURNING kept",
                )
                .bind(ns(keep))
                .bind(ns(now))
                .bind(&lease.lock)
                .bind(lease.token as i64)
                .bind(&lease.identity)
                .fetch_optional(&mut *conn)
                .await?;
                Ok(row.is_some_and(|row| row.get::<i64, _>("kept") == 0))
            }
            .await
        );
        // Whatever the write did (a lease lost meanwhile is not ours to free), the queue's
        // byte goes: the next waiter reads the record and judges for itself.
        if let Some(wake) = &self.wake {
            wake.released(&lease.lock, *freed.as_ref().unwrap_or(&false));
        }
        freed.map(drop)
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        with_conn!(self, "status", conn, LockRecord::free(lock), self.read(conn, lock).await)
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        with_conn!(self, "list", conn, Vec::new(), async {
            let rows = sqlx::query("SELECT name, holder, token, boot_id, expires_ns, acquired_unix_ms, revoked, kept FROM leaderrun_locks ORDER BY name")
                .fetch_all(&mut *conn)
                .await;
            match rows {
                Ok(rows) => Ok(rows.iter().map(|row| self.record_from(row.get("name"), row).0).collect()),
                Err(err) if no_table(&err) => Ok(Vec::new()),
                Err(err) => Err(err),
            }
        }
        .await)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        with_conn!(
            self,
            "revoke",
            conn,
            None,
            async {
                loop {
                    let row = sqlx::query(
                        "SELECT holder, token, boot_id, expires_ns, acquired_unix_ms, revoked, kept
                         FROM leaderrun_locks WHERE name = ?1",
                    )
                    .bind(lock)
                    .fetch_optional(&mut *conn)
                    .await;
                    let (before, kept) = match row {
                        Ok(Some(row)) => self.record_from(lock.to_string(), &row),
                        Ok(None) => return Ok(None),
                        Err(err) if no_table(&err) => return Ok(None),
                        Err(err) => return Err(err),
                    };
                    if !before.is_held() {
                        return Ok(None);
                    }
                    // A kept lease has no child and no holder left to free it: free it now. A
                    // live one is only asked to stand down. Either way a compare-and-set on the
                    // token read, so a lease taken in between is left alone.
                    let done = sqlx::query(
                        "UPDATE leaderrun_locks SET
                            revoked = CASE WHEN ?3 THEN revoked ELSE 1 END,
                            holder = CASE WHEN ?3 THEN NULL ELSE holder END,
                            expires_ns = CASE WHEN ?3 THEN 0 ELSE expires_ns END,
                            kept = 0
                         WHERE name = ?1 AND token = ?2 AND holder IS NOT NULL AND kept = ?3",
                    )
                    .bind(lock)
                    .bind(before.token as i64)
                    .bind(kept)
                    .execute(&mut *conn)
                    .await?;
                    if done.rows_affected() == 1 {
                        if kept {
                            if let Some(wake) = &self.wake {
                                wake.freed(lock);
                            }
                        }
                        return Ok(Some(before));
                    }
                }
            }
            .await
        )
    }

    fn sees_expiry(&self) -> bool {
        // `changed` also returns once the lease it last read has lapsed.
        true
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        // Without a file (a command that only looks) there is nothing to wait for.
        if let Some(wake) = &self.wake {
            wake.changed(self, lock, max_wait).await
        }
    }

    /// Every write to the file is seen, a renewal's too; an expiry writes nothing.
    fn observing(&self) -> Observing {
        Observing::PushesWrites
    }

    /// Wait for a write to the database (`observe.rs`), any lock's: the caller reads to see
    /// whether this one changed. The watch is kept across calls, so a write between two is
    /// not missed; a watch just made may have missed one: return at once then.
    ///
    /// The kernel tells of a write to the log before its commit can be read (SQLite makes a
    /// commit visible after writing and syncing it), so a write seen is followed until the
    /// database's `data_version` moves (local reads, further apart each time, for at most `SETTLE`):
    /// only then does the caller's read see it.
    async fn observe_change(&self, _lock: &str, max_wait: Duration) {
        /// How long a wait lasts without a watch (inotify refused): the caller reads about
        /// once a second, as on a store that polls.
        const POLL_WITHOUT_WATCH: Duration = Duration::from_secs(1);
        /// The longest a write seen is followed (a checkpoint writes without a commit).
        const SETTLE: Duration = Duration::from_secs(1);
        /// The first wait between two reads of `data_version`; each wait doubles, up to
        /// `SETTLE_STEP_MAX`. One commit can wake this twice (its log written in two steps, the
        /// second seen after the first was followed): the second is followed with about ten
        /// reads, not one every few milliseconds for the whole `SETTLE`.
        const SETTLE_STEP: Duration = Duration::from_millis(2);
        const SETTLE_STEP_MAX: Duration = Duration::from_millis(250);
        let deadline = tokio::time::Instant::now() + max_wait;
        let poll = || tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + POLL_WITHOUT_WATCH));
        let Ok(mut slot) = self.watching.try_lock() else { return poll().await };
        let Some((writes, seen)) = slot.as_mut() else {
            match observe::Writes::new(&self.path) {
                Ok(writes) => *slot = Some((writes, self.data_version().await)),
                Err(err) => {
                    tracing::debug!("cannot watch {} for writes, polling: {err}", self.path.display());
                    poll().await
                }
            }
            return;
        };
        match tokio::time::timeout_at(deadline, writes.next()).await {
            Err(_) => {}
            Ok(observe::Seen::Gone) => *slot = None,
            Ok(observe::Seen::Written) => {
                let settled = deadline.min(tokio::time::Instant::now() + SETTLE);
                let mut step = SETTLE_STEP;
                while tokio::time::Instant::now() < settled {
                    let now = self.data_version().await;
                    if now != *seen {
                        *seen = now;
                        return;
                    }
                    tokio::time::sleep(step.min(settled.saturating_duration_since(tokio::time::Instant::now()))).await;
                    step = (step * 2).min(SETTLE_STEP_MAX);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_a_boot_id_the_store_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        let missing = dir.path().join("no-boot-id");
        let err = SqliteStore::open_on_boot(&db, Access::Create, &missing).await.err().expect("refused");
        assert_eq!(err.kind, super::super::ErrorKind::Refused);
        assert!(err.message.contains("boot id") && err.message.contains("no-boot-id"), "{}", err.message);
        assert!(!db.exists(), "nothing was written");
        std::fs::write(&missing, "\n").unwrap();
        assert!(SqliteStore::open_on_boot(&db, Access::Create, &missing).await.is_err(), "an empty boot id");
    }

    /// Every run that opens the file alone reads the whole write-ahead log: it must stay short
    /// even though no connection copies it into the database on close.
    #[tokio::test]
    async fn the_write_ahead_log_stays_short() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        for i in 0..300 {
            let store = SqliteStore::open(&db, Access::Create).await.unwrap();
            let Acquire::Won(lease) = store.acquire("x", &format!("run-{i}"), Duration::from_secs(60)).await.unwrap()
            else {
                panic!("a released lock is free")
            };
            store.release(&lease, Duration::ZERO).await.unwrap();
        }
        let wal = std::fs::metadata(dir.path().join("locks.db-wal")).map_or(0, |m| m.len());
        let frame = 4096 + 24;
        assert!(wal <= 2 * 64 * frame, "the log holds {} frames after 600 commits", wal / frame);
    }

    /// Closing the last connection leaves the log as it is: a checkpoint would have copied it
    /// into the database and deleted it.
    #[tokio::test]
    async fn closing_does_not_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("locks.db");
        let options =
            SqliteConnectOptions::new().filename(&db).create_if_missing(true).journal_mode(SqliteJournalMode::Wal);
        let mut conn = options.connect().await.unwrap();
        open::skip_checkpoint_on_close(&mut conn).await.unwrap();
        sqlx::query(SCHEMA).execute(&mut conn).await.unwrap();
        sqlx::Connection::close(conn).await.unwrap();
        let wal = std::fs::metadata(dir.path().join("locks.db-wal")).map_or(0, |m| m.len());
        assert!(wal > 0, "the log was checkpointed and removed on close");
    }

    #[tokio::test]
    async fn a_file_from_before_the_kept_column_gets_it() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("old.db");
        {
            let mut conn = SqliteConnectOptions::new().filename(&db).create_if_missing(true).connect().await.unwrap();
            let old_schema: Vec<&str> = SCHEMA.lines().filter(|line| !line.trim_start().starts_with("kept")).collect();
            let old_schema = old_schema.join("\n").replace("DEFAULT 0, --", "DEFAULT 0 --");
            assert!(!old_schema.contains("kept"), "{old_schema}");
            sqlx::raw_sql(sqlx::AssertSqlSafe(old_schema)).execute(&mut conn).await.unwrap();
        }
        let store = SqliteStore::open(&db, Access::Existing).await.unwrap();
        let Acquire::Won(lease) = store.acquire("x", "a", Duration::from_secs(60)).await.unwrap() else {
            panic!("a fresh lock is free")
        };
        store.release(&lease, Duration::from_secs(600)).await.unwrap();
        assert!(store.revoke("x").await.unwrap().is_some());
        assert!(!store.status("x").await.unwrap().is_held(), "the keep was ended");
    }
}
