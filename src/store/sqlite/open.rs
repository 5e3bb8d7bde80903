//! Opening the file: WAL mode, the table (created with `Access::Create`, a `kept` column added
//! to a table from before it), no checkpoint on close, and a store opened before its file
//! existed that connects once it does (a `watch` started before the first run).

use super::*;

impl SqliteStore {
    /// Open (and with `Access::Create`, create) the store file.
    pub async fn open(path: &Path, access: Access) -> Result<Self> {
        Self::open_on_boot(path, access, Path::new(BOOT_ID_FILE)).await
    }

    /// `open`, with the boot id read from `boot_id_file` (tests point it elsewhere).
    pub(super) async fn open_on_boot(path: &Path, access: Access, boot_id_file: &Path) -> Result<Self> {
        let boot = read_boot_id(boot_id_file)?;
        if access == Access::Existing && !path.exists() {
            return Ok(Self {
                conn: tokio::sync::OnceCell::new(),
                later: Some(Self::options(path, access)),
                path: path.to_path_buf(),
                boot,
                wake: None,
                watching: Mutex::new(None),
            });
        }
        let options = Self::options(path, access);
        // Many processes may create the file in the same instant; switching it to WAL
        // and creating the table can then report "locked" before the busy handler
        // applies. Those races are brief: retry them with jitter.
        let started = std::time::Instant::now();
        loop {
            match Self::connect(&options, access).await {
                Ok(conn) => {
                    let wake = Some(wake::Wake::new(path, access == Access::Create));
                    return Ok(Self {
                        conn: tokio::sync::OnceCell::new_with(Some(Mutex::new(conn))),
                        later: None,
                        path: path.to_path_buf(),
                        boot,
                        wake,
                        watching: Mutex::new(None),
                    });
                }
                Err(err) if is_busy(&err) && started.elapsed() < BUSY_TIMEOUT => {
                    let pause = rand::rng().random_range(2..20);
                    tokio::time::sleep(Duration::from_millis(pause)).await;
                }
                // Whatever still fails at open time will not pass by retrying.
                Err(err) => return Err(StoreError::refused(store_error(path, err).message)),
            }
        }
    }

    /// The connection, once the file exists; `None` before (everything is free then).
    pub(super) async fn connection(&self) -> Option<&Mutex<SqliteConnection>> {
        if let Some(conn) = self.conn.get() {
            return Some(conn);
        }
        let options = self.later.as_ref().filter(|_| self.path.exists())?;
        let opened =
            self.conn.get_or_try_init(|| async { Self::connect(options, Access::Existing).await.map(Mutex::new) });
        // Not readable yet (its creator is still setting it up): free for now, tried again next time.
        opened.await.ok()
    }

    /// NORMAL, and FULL around each acquire (see there).
    fn options(path: &Path, access: Access) -> SqliteConnectOptions {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(access == Access::Create)
            .busy_timeout(BUSY_TIMEOUT)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .pragma("wal_autocheckpoint", WAL_PAGES)
            .log_statements(tracing::log::LevelFilter::Trace)
    }

    async fn connect(
        options: &SqliteConnectOptions,
        access: Access,
    ) -> std::result::Result<SqliteConnection, sqlx::Error> {
        let mut conn = options.connect().await?;
        skip_checkpoint_on_close(&mut conn).await?;
        // One read for what every run used to ask in three statements.
        let (has_table, has_kept): (bool, bool) = sqlx::query_as(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leaderrun_locks'),
                    EXISTS (SELECT 1 FROM pragma_table_info('leaderrun_locks') WHERE name = 'kept')",
        )
        .fetch_one(&mut conn)
        .await?;
        if !has_table && access == Access::Create {
            // IF NOT EXISTS: another process may be creating it at this moment.
            sqlx::query(SCHEMA).execute(&mut conn).await?;
        } else if has_table && !has_kept {
            match sqlx::query(ADD_KEPT).execute(&mut conn).await {
                // Another process added it in the meantime.
                Err(sqlx::Error::Database(db)) if db.message().contains("duplicate column") => {}
                other => {
                    other?;
                }
            }
        }
        Ok(conn)
    }
}

extern "C" {
    /// SQLite's own configuration call (sqlx links the library; it does not wrap this one).
    fn sqlite3_db_config(db: *mut std::ffi::c_void, op: std::ffi::c_int, ...) -> std::ffi::c_int;
}

/// The last connection to close would copy the write-ahead log into the database and
/// fsync both: a one-shot run (usually the only user of the file) would pay for that on
/// every exit, and its exit would wait for the fsync. The log is copied by the commits
/// instead, every `WAL_PAGES`; nothing acknowledged depends on the copy.
pub(super) async fn skip_checkpoint_on_close(conn: &mut SqliteConnection) -> std::result::Result<(), sqlx::Error> {
    use std::ffi::{c_int, c_void};
    const SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE: c_int = 1006;
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr().cast::<c_void>();
    let mut now: c_int = 0;
    // SAFETY: `db` is an open connection, held by `handle` for the call; this option takes
    // an int (1: skip) and a pointer to an int that receives the setting now in force.
    unsafe { sqlite3_db_config(db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1 as c_int, &mut now as *mut c_int) };
    if now != 1 {
        tracing::debug!("SQLite kept its checkpoint on close: an exit may wait for an fsync");
    }
    Ok(())
}
