//! The `etcd://` URL, parsed once while the command line is checked.

use super::super::url::{parse_cluster_url, redact, switch, TlsFiles};

/// The key prefix unless the URL has a path.
pub const DEFAULT_PREFIX: &str = "/leaderrun/";
/// Port when a host has none.
const DEFAULT_PORT: u16 = 2379;

/// The parts of an `etcd://` URL. Its Debug output is the URL without the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// `http://host:port` or `https://host:port`, one per host.
    pub(super) endpoints: Vec<String>,
    /// User and password for etcd's authentication.
    pub(super) user: Option<(String, String)>,
    pub(super) prefix: String,
    /// `etcds://` or `?tls=1`, with the files etcdctl names --cacert, --cert and --key.
    pub(super) tls: Option<TlsFiles>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.shown)
    }
}

impl Target {
    /// Parse an `etcd://` or `etcds://` URL; the error is a bare reason, naming the part.
    pub fn parse(url: &str) -> Result<Self, String> {
        let shown = redact(url);
        let (scheme, rest) = url.split_once("://").ok_or("expected etcd://host:2379[,host2:2379][/prefix]")?;
        let mut tls = scheme.eq_ignore_ascii_case("etcds");
        if !tls && !scheme.eq_ignore_ascii_case("etcd") {
            return Err("expected etcd:// or etcds://".into());
        }
        let url = parse_cluster_url(rest, DEFAULT_PORT)
            .map_err(|why| format!("{why} (expected etcd://host:2379[,host2:2379])"))?;
        let mut files = TlsFiles::default();
        for (key, value) in &url.params {
            if key == "tls" {
                // As on the other stores: anything but 0 or false turns TLS on (the safe reading).
                tls = switch(key, value)?;
            } else if !files.take(key, value) {
                return Err(format!("unknown parameter ?{key}= (known: tls, cacert, cert, key)"));
            }
        }
        files.check(tls, "etcds:// or ?tls=1")?;
        let http = if tls { "https" } else { "http" };
        let endpoints = url.hosts.iter().map(|host| format!("{http}://{host}")).collect();
        let user = url.userinfo.map(|(user, pass)| (user, pass.unwrap_or_default()));
        let prefix = if url.path.is_empty() { DEFAULT_PREFIX.to_string() } else { format!("/{}/", url.path) };
        Ok(Target { shown, endpoints, user, prefix, tls: tls.then_some(files) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let one = t("etcd://h:1234");
        assert_eq!(
            (one.endpoints, one.user, one.prefix),
            (vec!["http://h:1234".to_string()], None, DEFAULT_PREFIX.into())
        );
        let two = t("etcd://u:p%40ss@a,b:2/team/x/");
        assert_eq!(two.endpoints, vec!["http://a:2379", "http://b:2"]);
        assert_eq!(two.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(two.prefix, "/team/x/");
        let tls = t("etcds://h?cacert=/ca%20dir/ca.pem&cert=/c.pem&key=/k.pem");
        assert_eq!(tls.endpoints, vec!["https://h:2379"]);
        assert_eq!(
            tls.tls,
            Some(TlsFiles {
                cacert: Some("/ca dir/ca.pem".into()),
                cert: Some("/c.pem".into()),
                key: Some("/k.pem".into())
            })
        );
        assert_eq!(t("etcd://h?tls=1").tls, Some(TlsFiles::default()));
        assert_eq!(t("etcds://h?tls=0").tls, None);
        assert!(Target::parse("etcd://h?cacert=/ca.pem").unwrap_err().contains("need TLS"));
        assert!(Target::parse("etcds://h?cert=/c.pem").unwrap_err().contains("go together"));
        assert!(Target::parse("http://h").unwrap_err().contains("etcds://"));
        assert!(Target::parse("etcd://a,,b").is_err());
        assert!(Target::parse("etcd://h?tls=yes").unwrap_err().contains("?tls=yes is not 1, true, 0 or false"));
    }

    #[test]
    fn unknown_or_malformed_parameters_are_refused_by_name() {
        let err = Target::parse("etcd://h?cacrt=/ca.pem").unwrap_err();
        assert!(err.contains("unknown parameter ?cacrt=") && err.contains("known: tls, cacert, cert, key"), "{err}");
        let err = Target::parse("etcds://u:hunter2@h?cacert=/ca.pem&timeout=3s").unwrap_err();
        assert!(err.contains("unknown parameter ?timeout=") && !err.contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_output_has_no_password() {
        let target = Target::parse("etcd://app:hunter2@h").unwrap();
        let shown = format!("{target:?}");
        assert!(!shown.contains("hunter2") && shown.contains("app:***@h"), "{shown}");
    }
}
