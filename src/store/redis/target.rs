//! The `redis://` URL: leaderrun's own parameters taken off, the rest checked by the redis
//! crate's parser, once, while the command line is checked.

use redis::{Client, RedisError};

use super::{describe, DEFAULT_PREFIX};
use crate::store::url::{redact, TlsFiles};
use crate::store::{Result, StoreError};

/// The parts of a Redis URL that are leaderrun's, not the redis crate's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Extras {
    pub(super) prefix: String,
    /// `cacert=`: trust this CA (PEM) instead of the system's; `cert=` and `key=`: a client
    /// certificate and its key (PEM), for servers that ask (as redis-cli names them).
    tls: TlsFiles,
}

/// Split leaderrun's own parameters (`prefix=`, `cacert=`, `cert=`, `key=`) off the URL;
/// the rest goes to the redis crate.
fn split_url(url: &str) -> (String, Extras) {
    let (url, fragment) = match url.split_once('#') {
        Some((url, fragment)) => (url, format!("#{fragment}")),
        None => (url, String::new()),
    };
    let mut extras = Extras { prefix: DEFAULT_PREFIX.to_string(), ..Extras::default() };
    let Some((base, query)) = url.split_once('?') else {
        return (format!("{url}{fragment}"), extras);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let taken = match pair.split_once('=') {
            Some(("prefix", value)) => {
                extras.prefix = value.to_string();
                true
            }
            Some((key, value)) => extras.tls.take(key, value),
            None => false,
        };
        if !taken {
            kept.push(pair);
        }
    }
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    (format!("{base}{query}{fragment}"), extras)
}

/// A `redis://` or `rediss://` URL, parsed once while the command line is checked.
#[derive(Clone)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// The URL the redis crate is given (leaderrun's own parameters taken out).
    pub(super) redis_url: String,
    pub(super) extras: Extras,
}

impl Target {
    /// Split leaderrun's parameters off and check the rest with the redis crate's parser.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let (redis_url, extras) = split_url(url);
        redis::parse_redis_url(&redis_url).ok_or("not a valid Redis URL (expected redis://[user]:pass@host:6379/0)")?;
        Ok(Self { shown: redact(url), redis_url, extras })
    }
}

/// A client for the URL: with the CA and client certificate of `extras` when given.
pub(super) fn client(redis_url: &str, extras: &Extras, shown: &str) -> Result<Client> {
    let refused = |why: String| StoreError::refused(format!("Redis store {shown}: {why}"));
    let invalid = |e: RedisError| refused(format!("invalid URL: {}", describe(&e)));
    let files = &extras.tls;
    if *files == TlsFiles::default() {
        return Client::open(redis_url).map_err(invalid);
    }
    files.check(redis_url.to_ascii_lowercase().starts_with("rediss:"), "a rediss:// URL").map_err(refused)?;
    let read = |param: &str, path: &Option<String>| crate::store::read_url_file("Redis", shown, param, path.as_deref());
    let (root_cert, cert, key) = (read("cacert", &files.cacert)?, read("cert", &files.cert)?, read("key", &files.key)?);
    // check() made sure that cert= and key= come together.
    let client_tls = match (cert, key) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig { client_cert, client_key }),
        _ => None,
    };
    Client::build_with_tls(redis_url, redis::TlsCertificates { client_tls, root_cert }).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_splitting() {
        let prefix = |p: &str| Extras { prefix: p.into(), ..Extras::default() };
        assert_eq!(split_url("redis://:p@h:6379/2"), ("redis://:p@h:6379/2".into(), prefix(DEFAULT_PREFIX)));
        assert_eq!(split_url("redis://h?prefix=team-b:"), ("redis://h".into(), prefix("team-b:")));
        assert_eq!(
            split_url("rediss://h/1?protocol=resp3&prefix=x#insecure"),
            ("rediss://h/1?protocol=resp3#insecure".into(), prefix("x"))
        );
        let (url, extras) = split_url("rediss://h?cacert=/ca.pem&cert=/c.pem&key=/k.pem");
        assert_eq!(url, "rediss://h");
        assert_eq!(
            (extras.tls.cacert.as_deref(), extras.tls.cert.as_deref(), extras.tls.key.as_deref()),
            (Some("/ca.pem"), Some("/c.pem"), Some("/k.pem"))
        );
    }
}
