//! sqlx's errors as the store reads them: one line to show, and whether a retry may pass.

use super::ACQUIRE_TIMEOUT;

/// What went wrong, in one line, from sqlx's error (never from the connect options).
pub(super) fn describe(err: &sqlx::Error) -> String {
    let what = match err {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("{} (SQLSTATE {code})", db.message()),
            None => db.message().to_string(),
        },
        sqlx::Error::Io(e) => format!("cannot reach the server: {e}"),
        sqlx::Error::PoolTimedOut => format!("no connection within {}s", ACQUIRE_TIMEOUT.as_secs()),
        // sqlx nests these, each saying "error with configuration: ".
        sqlx::Error::Configuration(e) => e.to_string().replace("error with configuration: ", ""),
        other => other.to_string(),
    };
    what.replace('\n', " ")
}

pub(super) fn sqlstate(err: &sqlx::Error) -> Option<String> {
    match err {
        sqlx::Error::Database(db) => db.code().map(|code| code.into_owned()),
        _ => None,
    }
}

/// Whether an error may pass if the call is retried.
pub(super) fn transient(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            code.starts_with("08") // connection exception
                || code.starts_with("53") // insufficient resources (too many connections, ...)
                || matches!(
                    &*code,
                    "57P01" | "57P02" | "57P03" // admin / crash shutdown, cannot connect now
                        | "57014" // query canceled (statement_timeout)
                        | "40001" | "40P01" // serialization failure, deadlock
                        | "55P03" // lock not available
                        | "25006" // read-only transaction: a standby, during a failover
                        | "58030" // I/O error
                )
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => true,
        _ => false,
    }
}

/// A table made before the `kept` column (undefined_column, naming it).
pub(super) fn no_kept_column(err: &sqlx::Error) -> bool {
    sqlstate(err).as_deref() == Some("42703") && err.to_string().contains("kept")
}
