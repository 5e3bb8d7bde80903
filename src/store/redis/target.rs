//! The `redis://` URL, parsed once while the command line is checked. Every parameter is
//! one leaderrun knows or one the redis crate reads; anything else is refused, so that a
//! misspelt `?cacrt=` cannot silently leave the CA unused, nor a `?db=2` (which the crate
//! ignores: the database is the path) silently use database 0.
//!
//! A Redis whose master Sentinels choose is named by its Sentinels, as redis-py's and
//! redisvl's `redis+sentinel://` URLs name it (the redis crate has no URL form of its own):
//! `redis+sentinel://[user:pass@]host1[:26379][,host2[:port]...]/SERVICE[/DB][?params]`, and
//! `rediss+sentinel://` for TLS to the Sentinels and the servers alike. The user and password
//! are the servers'; Sentinels that ask for their own take `?sentinel-user=` and
//! `?sentinel-password=` (percent-encoded).

use redis::{Client, ConnectionInfo, IntoConnectionInfo, ProtocolVersion, RedisError, TlsCertificates};

use super::{describe, DEFAULT_PREFIX};
use crate::store::url::{parse_cluster_url, percent_decode, redact, switch, TlsFiles};
use crate::store::{Result, StoreError};

/// The parameters a Redis URL takes, for the message that refuses any other.
const KNOWN: &str = "prefix, allow-eviction, cacert, cert, key, protocol";

/// The parameters a Sentinel URL takes besides those.
const KNOWN_SENTINEL: &str = "sentinel-user, sentinel-password";

/// The schemes of a URL that names Sentinels, and whether each is TLS.
const SENTINEL_SCHEMES: [(&str, bool); 2] = [("redis+sentinel", false), ("rediss+sentinel", true)];

/// A Sentinel's port when the URL gives none.
const SENTINEL_PORT: u16 = 26379;

/// A `redis://` or `rediss://` URL, or a `redis+sentinel://` one, parsed once while the
/// command line is checked.
///
/// Deliberately without Debug: `connection` holds the password.
#[derive(Clone)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// Host, port, TLS or not, user, password, database and protocol, as the redis crate
    /// takes them (boxed: it is large, and `StoreSpec` holds one target of any store). Behind
    /// Sentinels, all but the address (the first Sentinel's, unused) are the master's.
    pub(super) connection: Box<ConnectionInfo>,
    /// The Sentinels that name the master, when the URL names Sentinels.
    pub(super) sentinels: Option<Box<Sentinels>>,
    /// `prefix=`: the start of every key leaderrun writes (default `leaderrun:`).
    pub(super) prefix: String,
    /// `cacert=`: trust this CA (PEM) instead of the system's; `cert=` and `key=`: a client
    /// certificate and its key (PEM), for servers that ask (as redis-cli names them).
    tls: TlsFiles,
    /// `allow-eviction=1`: open even a server that may evict keys (see `eviction.rs`).
    pub(super) allow_eviction: bool,
}

/// What a `redis+sentinel://` URL says besides the master's settings.
///
/// Deliberately without Debug: it holds the Sentinels' password.
#[derive(Clone)]
pub(super) struct Sentinels {
    /// Each Sentinel's host (an IPv6 address without its brackets) and port.
    pub(super) hosts: Vec<(String, u16)>,
    /// The name the Sentinels monitor the master by (`sentinel monitor NAME ...`).
    pub(super) service: String,
    /// `sentinel-user=` and `sentinel-password=`: the Sentinels' own credentials, if they ask.
    pub(super) user: Option<String>,
    pub(super) password: Option<String>,
}

impl Target {
    /// Parse the URL; the error is one line that never contains the password (the caller
    /// adds the redacted URL).
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let (url_part, fragment) = match url.split_once('#') {
            Some((url_part, fragment)) => (url_part, Some(fragment)),
            None => (url, None),
        };
        // The fragment is not repeated: it may be the rest of a password with a bare '#'.
        match fragment {
            None => {}
            Some("insecure") => {
                return Err("#insecure (TLS without checking the server's certificate) is not supported; \
                            give the server's CA with ?cacert=FILE"
                    .into())
            }
            Some(_) => return Err("a Redis URL takes no #fragment (a '#' in a password is written %23)".into()),
        }
        let (base, query) = url_part.split_once('?').unwrap_or((url_part, ""));
        let (connection, sentinels) = match sentinel_scheme(base) {
            Some((tls, rest)) => {
                let (connection, sentinels) = sentinel_parts(tls, rest)?;
                (connection, Some(Box::new(sentinels)))
            }
            None => (connection_info(base)?, None),
        };
        let mut target = Self {
            shown: redact(url),
            connection: Box::new(connection),
            sentinels,
            prefix: DEFAULT_PREFIX.to_string(),
            tls: TlsFiles::default(),
            allow_eviction: false,
        };
        let mut seen: Vec<&str> = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if seen.contains(&key) {
                return Err(format!("?{key}= is given twice"));
            }
            seen.push(key);
            match key {
                "prefix" => target.prefix = value.to_string(),
                "allow-eviction" => target.allow_eviction = switch(key, value)?,
                "protocol" => {
                    let settings = target.connection.redis_settings().clone().set_protocol(protocol(value)?);
                    target.connection = Box::new(target.connection.set_redis_settings(settings));
                }
                "sentinel-user" | "sentinel-password" if target.sentinels.is_some() => {
                    let value = (!value.is_empty()).then(|| percent_decode(value));
                    if let Some(sentinels) = target.sentinels.as_mut() {
                        match key {
                            "sentinel-user" => sentinels.user = value,
                            _ => sentinels.password = value,
                        }
                    }
                }
                "db" if target.sentinels.is_some() => {
                    return Err(format!(
                        "unknown parameter ?db= (known: {KNOWN}, {KNOWN_SENTINEL}); the database number follows \
                         the service: redis+sentinel://host:26379/SERVICE/N"
                    ))
                }
                "db" => {
                    return Err(format!(
                        "unknown parameter ?db= (known: {KNOWN}); the database number is the path: redis://host:6379/N"
                    ))
                }
                _ if target.tls.take(key, value) => {
                    if value.is_empty() {
                        return Err(format!("?{key}= names no file"));
                    }
                }
                _ if target.sentinels.is_some() => {
                    return Err(format!("unknown parameter ?{key}= (known: {KNOWN}, {KNOWN_SENTINEL})"))
                }
                _ => return Err(format!("unknown parameter ?{key}= (known: {KNOWN})")),
            }
        }
        let how = if target.sentinels.is_some() { "a rediss+sentinel:// URL" } else { "a rediss:// URL" };
        target.tls.check(target.is_tls(), how)?;
        Ok(target)
    }

    /// Whether the URL asks for TLS (`rediss://`, `rediss+sentinel://`).
    pub(super) fn is_tls(&self) -> bool {
        matches!(self.connection.addr(), redis::ConnectionAddr::TcpTls { .. })
    }

    /// The redis crate's client for this target: with the CA and client certificate of the
    /// URL when it names them (the files are read now, not while parsing).
    pub(super) fn client(&self) -> Result<Client> {
        let invalid = |e: RedisError| self.invalid(e);
        match self.certificates()? {
            None => Client::open(*self.connection.clone()).map_err(invalid),
            Some(certificates) => Client::build_with_tls(*self.connection.clone(), certificates).map_err(invalid),
        }
    }

    /// The CA and client certificate the URL names, if it names any: read now, not while
    /// parsing.
    pub(super) fn certificates(&self) -> Result<Option<TlsCertificates>> {
        let files = &self.tls;
        if *files == TlsFiles::default() {
            return Ok(None);
        }
        let read = |param: &str, path: &Option<String>| {
            crate::store::read_url_file("Redis", &self.shown, param, path.as_deref())
        };
        let (root_cert, cert, key) =
            (read("cacert", &files.cacert)?, read("cert", &files.cert)?, read("key", &files.key)?);
        // parse() made sure that cert= and key= come together.
        let client_tls = match (cert, key) {
            (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig { client_cert, client_key }),
            _ => None,
        };
        Ok(Some(TlsCertificates { client_tls, root_cert }))
    }

    /// A client the redis crate refused to build, in one line.
    pub(super) fn invalid(&self, e: RedisError) -> StoreError {
        StoreError::refused(format!("Redis store {}: invalid URL: {}", self.shown, describe(&e)))
    }
}

/// Whether the URL names Sentinels (any case), and then whether with TLS, and the rest after
/// `://`.
fn sentinel_scheme(base: &str) -> Option<(bool, &str)> {
    let (scheme, rest) = base.split_once("://")?;
    SENTINEL_SCHEMES.iter().find(|(name, _)| scheme.eq_ignore_ascii_case(name)).map(|(_, tls)| (*tls, rest))
}

/// The parts of a Sentinel URL after `scheme://`, without its query: the master's settings
/// (from the user, password and database, as the redis crate parses them) and the Sentinels.
fn sentinel_parts(tls: bool, rest: &str) -> std::result::Result<(ConnectionInfo, Sentinels), String> {
    const SHAPE: &str = "redis+sentinel://[user:pass@]host:26379[,host2:26379...]/SERVICE[/DB]";
    let url = parse_cluster_url(rest, SENTINEL_PORT)?;
    let (service, db) = url.path.split_once('/').unwrap_or((url.path.as_str(), ""));
    if service.is_empty() {
        return Err(format!("names no service (the name the Sentinels know the master by): {SHAPE}"));
    }
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err(format!("after the service comes the database number, 0 or more: {SHAPE}"));
    }
    let hosts = url
        .hosts
        .iter()
        .map(|host| {
            // parse_cluster_url gave every host a valid port.
            let (name, port) = host.rsplit_once(':').unwrap_or((host, ""));
            let name = name.trim_start_matches('[').trim_end_matches(']').to_string();
            port.parse::<u16>().map(|port| (name, port)).map_err(|_| format!("{host:?} is not host:port"))
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    // The user and password as written (still percent-encoded), for the crate's own parser,
    // which decodes and checks them as it does for redis://.
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    let userinfo = authority.rsplit_once('@').map(|(userinfo, _)| format!("{userinfo}@")).unwrap_or_default();
    let scheme = if tls { "rediss" } else { "redis" };
    let connection = connection_info(&format!("{scheme}://{userinfo}{}/{db}", url.hosts[0]))?;
    Ok((connection, Sentinels { hosts, service: service.to_string(), user: None, password: None }))
}

/// Where to connect, from the URL without its query and fragment: the redis crate's own
/// parser (host, port, TLS, user, password), with the database number checked here first,
/// since the crate would take `/-1` and leave it to the server to refuse.
fn connection_info(base: &str) -> std::result::Result<ConnectionInfo, String> {
    let url = redis::parse_redis_url(base).ok_or("not a valid Redis URL (expected redis://[user]:pass@host:6379/0)")?;
    let db = url.path().trim_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Err("the path is the database number, 0 or more (redis://host:6379/0)".into());
    }
    // The crate's messages name what is wrong (no host, a wildcard address, a user name or
    // password that is not UTF-8), never the password itself; the kind after " - " is noise.
    url.into_connection_info().map_err(|e| {
        let text = e.to_string();
        format!("not a valid Redis URL: {}", text.split(" - ").next().unwrap_or(&text))
    })
}

/// `protocol=`: the RESP version of the store's connections, as the redis crate reads it.
fn protocol(value: &str) -> std::result::Result<ProtocolVersion, String> {
    match value {
        "2" | "resp2" => Ok(ProtocolVersion::RESP2),
        "3" | "resp3" => Ok(ProtocolVersion::RESP3),
        _ => Err(format!("?protocol={value} is not a protocol (resp2 or resp3)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> std::result::Result<Target, String> {
        Target::parse(url)
    }

    #[test]
    fn leaderrun_parameters_are_taken_off() {
        let target = parse("redis://:p@h:6379/2").unwrap();
        assert_eq!((target.prefix.as_str(), target.allow_eviction), (DEFAULT_PREFIX, false));
        assert_eq!(target.connection.redis_settings().db(), 2);
        assert_eq!(target.connection.redis_settings().password(), Some("p"));
        assert_eq!(parse("redis://h?prefix=team-b:").unwrap().prefix, "team-b:");
        assert_eq!(parse("redis://h?prefix=").unwrap().prefix, "");
        assert!(parse("redis://h/?allow-eviction=1").unwrap().allow_eviction);
        assert!(parse("redis://h/?allow-eviction").unwrap().allow_eviction);
        assert!(!parse("redis://h/?allow-eviction=0").unwrap().allow_eviction);
        let target = parse("rediss://h?cacert=/ca.pem&cert=/c.pem&key=/k.pem").unwrap();
        assert_eq!(
            (target.tls.cacert.as_deref(), target.tls.cert.as_deref(), target.tls.key.as_deref()),
            (Some("/ca.pem"), Some("/c.pem"), Some("/k.pem"))
        );
    }

    #[test]
    fn the_redis_crates_own_settings() {
        let settings = |url| parse(url).unwrap().connection.redis_settings().clone();
        assert_eq!(settings("redis://h/1?protocol=resp3").protocol(), ProtocolVersion::RESP3);
        assert_eq!(settings("redis://h?protocol=3").protocol(), ProtocolVersion::RESP3);
        assert_eq!(settings("redis://h?protocol=resp2").protocol(), ProtocolVersion::RESP2);
        assert_eq!(settings("redis://h").protocol(), ProtocolVersion::RESP2);
        assert_eq!(settings("redis://u:p%40ss@h").password(), Some("p@ss"));
        assert_eq!(settings("redis://u:p%40ss@h").username(), Some("u"));
        assert_eq!(settings("redis://h/").db(), 0);
        let addr = |url| parse(url).unwrap().connection.addr().clone();
        assert!(matches!(addr("rediss://h:7000"), redis::ConnectionAddr::TcpTls { port: 7000, insecure: false, .. }));
        assert!(matches!(addr("redis://[::1]"), redis::ConnectionAddr::Tcp(host, 6379) if host == "::1"));
    }

    #[test]
    fn anything_else_is_refused_in_one_line_without_the_password() {
        let refused = |url: &str, needle: &str| {
            let err = parse(url).err().unwrap_or_else(|| panic!("{url} was accepted"));
            assert!(err.contains(needle), "{needle:?} missing from {err:?}");
            assert!(!err.contains("hunter2") && !err.contains('\n'), "{err:?}");
        };
        let known = "(known: prefix, allow-eviction, cacert, cert, key, protocol)";
        refused("redis://:hunter2@h/0?bogus=1", &format!("unknown parameter ?bogus= {known}"));
        refused("redis://:hunter2@h/0?cacrt=/ca.pem", "unknown parameter ?cacrt=");
        refused("redis://:hunter2@h/0?Prefix=x", "unknown parameter ?Prefix=");
        refused("redis://:hunter2@h/0?password=hunter2", "unknown parameter ?password=");
        refused("redis://:hunter2@h?db=2", "the database number is the path");
        refused("redis://:hunter2@h/x", "the path is the database number");
        refused("redis://:hunter2@h/-1", "the path is the database number");
        refused("redis://:hunter2@h/0/1", "the path is the database number");
        refused("redis://:hunter2@h?protocol=4", "?protocol=4 is not a protocol (resp2 or resp3)");
        refused(
            "redis://:hunter2@h?allow-eviction=yes-please",
            "?allow-eviction=yes-please is not 1, true, 0 or false",
        );
        refused("redis://:hunter2@h?prefix=a&prefix=b", "?prefix= is given twice");
        refused("rediss://:hunter2@h?cacert=", "?cacert= names no file");
        refused("redis://:hunter2@h?cacert=/ca.pem", "need TLS (a rediss:// URL)");
        refused("rediss://:hunter2@h?cert=/c.pem", "cert= and key= go together");
        refused("rediss://:hunter2@h/0#insecure", "#insecure");
        refused("redis://:hunt#er2@h/0", "takes no #fragment");
        refused("redis://:hunter2@0.0.0.0/0", "wildcard address");
        refused("redis://:hunter2@h:99999/0", "not a valid Redis URL");
        refused("redis://:hunter2@/0", "not a valid Redis URL");
        refused("redis://:hunter2%ff@h/0", "not valid UTF-8");
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_the_service_and_the_masters_settings() {
        let target =
            parse("redis+sentinel://u:p%40ss@s1,s2:26380,[::1]:7/mymaster/2?prefix=x:&sentinel-password=s%26p")
                .unwrap();
        let sentinels = target.sentinels.as_deref().unwrap();
        let hosts: Vec<(&str, u16)> = sentinels.hosts.iter().map(|(h, p)| (h.as_str(), *p)).collect();
        assert_eq!(hosts, [("s1", 26379), ("s2", 26380), ("::1", 7)]);
        assert_eq!(sentinels.service, "mymaster");
        assert_eq!((sentinels.user.as_deref(), sentinels.password.as_deref()), (None, Some("s&p")));
        let server = target.connection.redis_settings();
        assert_eq!((server.username(), server.password(), server.db()), (Some("u"), Some("p@ss"), 2));
        assert_eq!(target.prefix, "x:");
        assert!(!target.is_tls());
        assert_eq!(
            target.shown,
            "redis+sentinel://u:***@s1,s2:26380,[::1]:7/mymaster/2?prefix=x:&sentinel-password=***"
        );

        let target = parse("REDISS+SENTINEL://h/svc?sentinel-user=sen&protocol=resp3&cacert=/ca.pem").unwrap();
        assert!(target.is_tls());
        let sentinels = target.sentinels.as_deref().unwrap();
        assert_eq!((sentinels.service.as_str(), sentinels.user.as_deref()), ("svc", Some("sen")));
        assert_eq!(target.connection.redis_settings().db(), 0);
        assert_eq!(target.connection.redis_settings().protocol(), ProtocolVersion::RESP3);
        assert!(parse("redis://h").unwrap().sentinels.is_none());
    }

    #[test]
    fn a_bad_sentinel_url_is_refused_in_one_line_without_a_password() {
        let refused = |url: &str, needle: &str| {
            let err = parse(url).err().unwrap_or_else(|| panic!("{url} was accepted"));
            assert!(err.contains(needle), "{needle:?} missing from {err:?}");
            assert!(!err.contains("hunter2") && !err.contains('\n'), "{err:?}");
        };
        let known = "(known: prefix, allow-eviction, cacert, cert, key, protocol, sentinel-user, sentinel-password)";
        refused("redis+sentinel://:hunter2@h:26379", "names no service");
        refused("redis+sentinel://:hunter2@h:26379/", "names no service");
        refused("redis+sentinel://:hunter2@h/svc/x", "after the service comes the database number");
        refused("redis+sentinel://:hunter2@h/svc/0/1", "after the service comes the database number");
        refused("redis+sentinel://:hunter2@h/svc?bogus=1", &format!("unknown parameter ?bogus= {known}"));
        refused("redis+sentinel://:hunter2@h/svc?db=1", "the database number follows the service");
        refused("redis+sentinel://:hunter2@h/svc?cacert=/ca.pem", "need TLS (a rediss+sentinel:// URL)");
        refused("redis+sentinel://:hunter2@h:0/svc", "not host:port");
        refused("redis+sentinel://:hunter2@h,,g/svc", "names no host");
        refused("redis+sentinel://:hunt/er2@h/svc", "must write them %2F");
        refused("redis+sentinel://:hunter2@h/svc?sentinel-password=a&sentinel-password=b", "given twice");
        refused("redis://:hunter2@h?sentinel-password=x", "unknown parameter ?sentinel-password= (known: prefix,");
    }
}
