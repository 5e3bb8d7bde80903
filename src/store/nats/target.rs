//! The `nats://` URL of the NATS store, parsed once while the command line is checked.

use std::path::PathBuf;
use std::time::Duration;

use super::{DEFAULT_BUCKET, DEFAULT_PORT};
use crate::store::url::{parse_cluster_url, redact, switch};

/// The parts of a `nats://` URL, parsed once while the command line is checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL without its password or token, for messages.
    pub shown: String,
    pub(super) servers: Vec<String>,
    pub(super) auth: Auth,
    pub(super) bucket: String,
    pub(super) replicas: usize,
    pub(super) creds: Option<PathBuf>,
    pub(super) tls: bool,
    pub(super) tls_ca: Option<PathBuf>,
    pub(super) tls_cert: Option<PathBuf>,
    pub(super) tls_key: Option<PathBuf>,
}

#[derive(Clone, PartialEq, Eq)]
pub(super) enum Auth {
    None,
    User(String, String),
    Token(String),
}

/// Shown as messages show the store: never the password or token.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.shown)
    }
}

/// The user, never the password or token.
impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::None => write!(f, "None"),
            Auth::User(user, _) => write!(f, "User({user:?}, ***)"),
            Auth::Token(_) => write!(f, "Token(***)"),
        }
    }
}

impl Target {
    /// A bucket replicated on several servers elects its stream's leader again after losing
    /// it: the failover the run's defaults must ride out (`STREAM_ELECTION`).
    pub fn failover(&self) -> Option<Duration> {
        (self.replicas > 1).then_some(STREAM_ELECTION)
    }

    /// Parse a `nats://` URL; the error is a bare reason, naming the part, and never the
    /// password or token.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let shown = redact(url);
        let bad = |why: &str| why.to_string();
        let expected = "expected nats://[user:pass@]host:4222[,host2:4222][/BUCKET]";
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad(expected))?;
        if !scheme.eq_ignore_ascii_case("nats") {
            return Err(bad(expected));
        }
        let url = parse_cluster_url(rest, DEFAULT_PORT).map_err(|why| bad(&format!("{why} ({expected})")))?;
        let auth = match url.userinfo {
            Some((user, Some(_))) if user.is_empty() => return Err(bad("user:pass@ names no user")),
            Some((user, Some(pass))) => Auth::User(user, pass),
            Some((token, None)) if token.is_empty() => return Err(bad("token@ is empty")),
            Some((token, None)) => Auth::Token(token),
            None => Auth::None,
        };
        let mut target = Target {
            shown,
            servers: url.hosts.iter().map(|host| format!("nats://{host}")).collect(),
            auth,
            bucket: DEFAULT_BUCKET.to_string(),
            replicas: 1,
            creds: None,
            tls: false,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
        };
        let bucket = url.path;
        if !bucket.is_empty() {
            if !bucket.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
                return Err(bad(&format!("{bucket:?} is not a valid bucket name (letters, digits, '_' and '-')")));
            }
            target.bucket = bucket;
        }
        let (mut seen, mut tls) = (Vec::new(), None);
        for (key, value) in &url.params {
            if seen.contains(&key) {
                return Err(format!("?{key}= is given twice"));
            }
            seen.push(key);
            let file = || {
                (!value.is_empty()).then(|| PathBuf::from(&value)).ok_or_else(|| bad(&format!("?{key}= needs a file")))
            };
            match key.as_str() {
                "replicas" => {
                    target.replicas = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=5).contains(n))
                        .ok_or_else(|| bad(&format!("?replicas={value} is not a number from 1 to 5")))?
                }
                "creds" => target.creds = Some(file()?),
                "tls" => tls = Some(switch(key, value)?),
                "tlsca" => target.tls_ca = Some(file()?),
                "tlscert" => target.tls_cert = Some(file()?),
                "tlskey" => target.tls_key = Some(file()?),
                // A misspelt TLS parameter must not silently leave TLS off.
                _ => {
                    return Err(bad(&format!(
                        "unknown parameter ?{key}= (known: replicas, creds, tls, tlsca, tlscert, tlskey)"
                    )))
                }
            }
        }
        if target.tls_cert.is_some() != target.tls_key.is_some() {
            return Err(bad("?tlscert= and ?tlskey= go together"));
        }
        let files = target.tls_ca.is_some() || target.tls_cert.is_some();
        if files && tls == Some(false) {
            return Err(bad("?tlsca=, ?tlscert= and ?tlskey= are for TLS, which ?tls=0 turns off"));
        }
        target.tls = tls.unwrap_or(false) || files;
        Ok(target)
    }
}

/// How long a replicated stream may go without a leader after its leader server is lost:
/// nats-server's Raft followers wait a random 4–9 s after the leader's last heartbeat before
/// they campaign (`minElectionTimeoutDefault`, `maxElectionTimeoutDefault` in its
/// `server/raft.go`; not configurable), and a split vote takes another round. Measured on three
/// servers on one host: 4.1 s to 14.2 s (median 6.2 s, 22 trials) after a SIGKILL.
pub(super) const STREAM_ELECTION: Duration = Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let one = t("nats://h:1234");
        assert_eq!(
            (one.servers, one.auth, one.bucket),
            (vec!["nats://h:1234".to_string()], Auth::None, DEFAULT_BUCKET.into())
        );
        let two = t("nats://u:p%40ss@a,b:2/CHORIA_LEADER_ELECTION?replicas=3");
        assert_eq!(two.servers, vec!["nats://a:4222", "nats://b:2"]);
        assert_eq!(two.auth, Auth::User("u".into(), "p@ss".into()));
        assert_eq!((two.bucket.as_str(), two.replicas, two.tls), ("CHORIA_LEADER_ELECTION", 3, false));
        let tls = t("nats://s3cret@h?tlsca=/ca.pem&tlscert=/c.pem&tlskey=/k.pem&creds=/u.creds");
        assert_eq!(tls.auth, Auth::Token("s3cret".into()));
        assert!(tls.tls && tls.tls_ca.is_some() && tls.tls_cert.is_some() && tls.creds.is_some());
        assert!(t("nats://h?tls=1").tls);
        assert!(Target::parse("nats://a,,b").is_err());
        assert!(Target::parse("nats://h/bad.bucket").is_err());
        assert!(Target::parse("nats://h?replicas=0").is_err());
        assert!(Target::parse("nats://h?tlscert=/c.pem").is_err());
        assert!(Target::parse("nats:h").is_err());
        assert!(Target::parse("nats://h?tls_ca=/ca.pem").unwrap_err().contains("unknown parameter ?tls_ca="));
    }

    #[test]
    fn every_parameter_is_checked() {
        let (t, err) = (|u: &str| Target::parse(u).unwrap(), |u: &str| Target::parse(u).unwrap_err());
        assert_eq!(err("nats://h?tls=on"), "?tls=on is not 1, true, 0 or false");
        assert!(t("nats://h?tls").tls, "a bare ?tls is yes");
        assert_eq!(err("nats://h?replicas=3&replicas=1"), "?replicas= is given twice");
        assert_eq!(err("nats://h?replicas=0"), "?replicas=0 is not a number from 1 to 5");
        assert_eq!(err("nats://h?creds="), "?creds= needs a file");
        assert_eq!(
            err("nats://h?tls=0&tlsca=/ca.pem"),
            "?tlsca=, ?tlscert= and ?tlskey= are for TLS, which ?tls=0 turns off"
        );
        assert_eq!(err("nats://:hunter2@h"), "user:pass@ names no user");
        assert_eq!(err("nats://@h"), "token@ is empty");
        assert!(!t("nats://h?tls=false").tls && t("nats://h?tls=TRUE").tls && t("nats://h?tlsca=/ca").tls);
    }

    #[test]
    fn debug_never_shows_the_password_or_token() {
        for url in ["nats://u:hunter2@h/B", "nats://hunter2@h"] {
            let target = Target::parse(url).unwrap();
            let shown = format!("{target:?} {:?}", target.auth);
            assert!(!shown.contains("hunter2") && shown.contains("***"), "{shown}");
        }
    }

    #[test]
    fn secrets_are_masked() {
        assert_eq!(redact("nats://u:hunter2@h:4222/B"), "nats://u:***@h:4222/B");
        assert_eq!(redact("nats://hunter2@h:4222"), "nats://***@h:4222");
        assert_eq!(redact("nats://h:4222?creds=/x"), "nats://h:4222?creds=/x");
    }
}
