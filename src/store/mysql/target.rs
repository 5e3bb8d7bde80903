//! What a `mysql://` or `mariadb://` URL names: the table, the options sqlx takes, and the
//! passwords that must never be shown.

use std::str::FromStr;
use std::time::Duration;

use sqlx::mysql::MySqlConnectOptions;
use sqlx::ConnectOptions;

use super::DEFAULT_TABLE;
use crate::store::url::{percent_decode, redact};

/// The URL options passed on to sqlx, with sqlx's aliases (everything else but `table`
/// is refused).
pub(super) const SQLX_OPTIONS: &[&str] =
    &["ssl-mode", "sslmode", "ssl-ca", "sslca", "ssl-cert", "sslcert", "ssl-key", "sslkey", "socket"];

/// The table's definition, for `CREATE TABLE IF NOT EXISTS` on first use and for
/// `leaderrun init --print-sql`, and the epoch mark of a table just made (the row that guards
/// against a failover that loses leases: see `epoch`). `table` must be a valid name (see
/// [`table_of`]).
pub fn schema_sql(table: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS `{table}` (
    name        VARBINARY(1020) NOT NULL PRIMARY KEY,  -- the lock name in UTF-8, compared byte for byte
    holder      VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,  -- NULL when released
    token       BIGINT UNSIGNED NOT NULL,   -- fencing token: +1 on every acquisition, never reset
    acquired_at DATETIME(6) NOT NULL,       -- UTC, on the server's clock
    expires_at  DATETIME(6) NOT NULL,       -- UTC, on the server's clock: the lease lapses then
    revoked     BOOLEAN NOT NULL DEFAULT 0, -- 1: `leaderrun release` asked the holder to stand down
    kept        BOOLEAN NOT NULL DEFAULT 0  -- 1: released, kept until expires_at for --min-hold
) ENGINE=InnoDB;
{}",
        super::epoch::create_mark_sql(table)
    )
}

/// A `mysql://` or `mariadb://` URL, parsed once while the command line is checked.
#[derive(Clone)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    pub(super) options: MySqlConnectOptions,
    pub(super) table: String,
    /// What to scrub from any message.
    pub(super) secrets: Vec<String>,
}

impl Target {
    /// Parse the URL: leaderrun's `table=` and the options sqlx knows; anything else is
    /// refused. The reason never holds the password.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let secrets = passwords(url);
        let parsed = table_of(url).and_then(|table| Ok((table, connect_options(url)?)));
        let (table, options) = parsed.map_err(|e| scrub(e, &secrets))?;
        Ok(Self { shown: redact(url), options, table, secrets })
    }

    /// The table's name (`?table=`, checked).
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// The table a store URL names with `?table=`, checked; the default if none.
pub fn table_of(url: &str) -> std::result::Result<String, String> {
    let mut table = DEFAULT_TABLE.to_string();
    for (key, value) in query_pairs(url) {
        if key == "table" {
            table = value.to_string();
        }
    }
    let mut chars = table.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || table.len() > 64 || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!(
            "table={table:?} is not a valid table name (1-64 of A-Z, a-z, 0-9, _; not starting with a digit)"
        ));
    }
    Ok(table)
}

/// The `key=value` pairs of a URL's query (not percent-decoded: the keys we know need none).
pub(super) fn query_pairs(url: &str) -> impl Iterator<Item = (&str, &str)> {
    let query = url.split_once('#').map_or(url, |(u, _)| u).split_once('?').map_or("", |(_, q)| q);
    query.split('&').filter(|p| !p.is_empty()).map(|p| p.split_once('=').unwrap_or((p, "")))
}

/// sqlx's connect options for a store URL: `mariadb://` becomes `mysql://` (the only
/// scheme sqlx knows), `table=` is taken out, unknown options are refused.
pub(super) fn connect_options(url: &str) -> std::result::Result<MySqlConnectOptions, String> {
    let (_, rest) = url.split_once("://").ok_or("expected mysql://USER:PASSWORD@HOST:PORT/DATABASE")?;
    let base = rest.split_once('?').map_or(rest, |(b, _)| b);
    let mut kept = Vec::new();
    for (key, value) in query_pairs(url) {
        match key {
            "table" => {}
            k if SQLX_OPTIONS.contains(&k) => kept.push(format!("{key}={value}")),
            other => {
                return Err(format!(
                    "unknown option {other:?} (known: table, ssl-mode, ssl-ca, ssl-cert, ssl-key, socket)"
                ))
            }
        }
    }
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    let options = MySqlConnectOptions::from_str(&format!("mysql://{base}{query}"))
        // sqlx's parse errors do not echo the URL; ours are scrubbed again anyway.
        .map_err(|e| format!("not a valid MySQL URL: {e}"))?;
    // A wait in GET_LOCK is slow by design: sqlx's slow-statement warning would print on
    // every wait.
    Ok(options
        .log_statements(tracing::log::LevelFilter::Trace)
        .log_slow_statements(tracing::log::LevelFilter::Debug, Duration::from_secs(1)))
}

/// The password as written in the URL and as decoded, to scrub from any message.
pub(super) fn passwords(url: &str) -> Vec<String> {
    let Some((_, rest)) = url.split_once("://") else { return Vec::new() };
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let Some((userinfo, _)) = authority.rsplit_once('@') else { return Vec::new() };
    let Some((_, raw)) = userinfo.split_once(':') else { return Vec::new() };
    let mut found = vec![raw.to_string(), percent_decode(raw)];
    found.retain(|p| !p.is_empty());
    found.dedup();
    found
}

/// `message` with every occurrence of a secret replaced by `***`.
pub(super) fn scrub(mut message: String, secrets: &[String]) -> String {
    for secret in secrets {
        message = message.replace(secret.as_str(), "***");
    }
    message
}
