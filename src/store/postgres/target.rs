//! What a `postgres://` URL names: the connection options, and the table (`?table=`).
//! Everything is checked before anything connects: an unknown parameter is bad usage.

use super::*;

/// URL parameters sqlx understands (anything else is refused).
pub(super) const SQLX_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

/// A `postgres://` URL, parsed once while the command line is checked.
#[derive(Clone)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    pub(super) options: PgConnectOptions,
    pub(super) table: String,
}

impl Target {
    /// Parse a `postgres://` or `postgresql://` URL: leaderrun's `table=` and the parameters
    /// sqlx knows; anything else is refused (a misspelt `sslmode` must not leave TLS off).
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let (sqlx_url, table) = split_url(url)?;
        let options = PgConnectOptions::from_str(&sqlx_url)
            .map_err(|e| format!("invalid URL: {}", describe(&e)))?
            .log_statements(tracing::log::LevelFilter::Trace);
        Ok(Self { shown: redact(url), options, table })
    }

    /// The table's name (`?table=`, checked).
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// Whether `name` is a plain SQL identifier: safe to quote into a statement as is.
pub(super) fn valid_table(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 63
}

/// Split leaderrun's own `table=` off the URL (sqlx would warn about it) and drop the
/// parameters sqlx does not know, so that it never logs their values.
pub(super) fn split_url(url: &str) -> std::result::Result<(String, String), String> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_string(), DEFAULT_TABLE.to_string()));
    };
    let mut table = DEFAULT_TABLE.to_string();
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        if key == "table" {
            if !valid_table(value) {
                return Err(format!(
                    "table={value:?} is not a plain SQL identifier \
                     (letters, digits and _, not starting with a digit, at most 63 characters)"
                ));
            }
            table = value.to_string();
        } else if SQLX_PARAMS.contains(&key) || (key.starts_with("options[") && key.ends_with(']')) {
            kept.push(pair);
        } else {
            return Err(format!("unknown parameter ?{key}= (known: table, {})", SQLX_PARAMS.join(", ")));
        }
    }
    let url = if kept.is_empty() { base.to_string() } else { format!("{base}?{}", kept.join("&")) };
    Ok((url, table))
}
