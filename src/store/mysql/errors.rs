//! The server's errors as the store reads them: which ones a retry may pass, and one line
//! to show.

use sqlx::mysql::MySqlDatabaseError;

use crate::store::ErrorKind;

pub(super) fn server_error(err: &sqlx::Error) -> Option<&MySqlDatabaseError> {
    match err {
        sqlx::Error::Database(db) => db.try_downcast_ref::<MySqlDatabaseError>(),
        _ => None,
    }
}

pub(super) fn number(err: &sqlx::Error) -> Option<u16> {
    server_error(err).map(MySqlDatabaseError::number)
}

/// 1146: the table does not exist.
/// A table made before the `kept` column (ER_BAD_FIELD_ERROR naming it).
pub(super) fn no_kept_column(err: &sqlx::Error) -> bool {
    number(err) == Some(1054) && err.to_string().contains("kept")
}

pub(super) fn no_table(err: &sqlx::Error) -> bool {
    number(err) == Some(1146)
}

/// 1062: another racer inserted the row first.
pub(super) fn duplicate(err: &sqlx::Error) -> bool {
    number(err) == Some(1062)
}

/// A deadlock (1213) or lock wait timeout (1205): InnoDB undid the statement, so running
/// it again is safe.
pub(super) fn is_undone(err: &sqlx::Error) -> bool {
    matches!(number(err), Some(1205 | 1213))
}

/// Server errors that may pass if retried: the above, too many connections (1040),
/// shutdown in progress (1053), aborted / killed / interrupted connections and network
/// errors (1152-1161, 1317, 1927, 4031), read-only during a failover (1290, 1792, 1836),
/// server gone (2006, 2013, when a server reports them).
const TRANSIENT: &[u16] = &[
    1040, 1053, 1152, 1153, 1154, 1155, 1156, 1157, 1158, 1159, 1160, 1161, 1205, 1213, 1290, 1317, 1792, 1836, 1927,
    2006, 2013, 4031,
];

/// Unavailable (worth retrying) or refused (bad credentials, no permission, unknown
/// database 1044/1045/1049/1142, bad configuration, anything unexpected).
pub(super) fn kind_of(err: &sqlx::Error) -> ErrorKind {
    match err {
        sqlx::Error::Database(_) => match number(err) {
            Some(n) if TRANSIENT.contains(&n) => ErrorKind::Unavailable,
            _ => ErrorKind::Refused,
        },
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::Protocol(_)
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => ErrorKind::Unavailable,
        _ => ErrorKind::Refused,
    }
}

/// What went wrong, in words: the server's own message with its error number, or sqlx's.
pub(super) fn describe(err: &sqlx::Error) -> String {
    match server_error(err) {
        Some(db) => format!("{} (error {})", db.message(), db.number()),
        None => err.to_string(),
    }
}
