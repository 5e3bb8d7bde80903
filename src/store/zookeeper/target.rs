//! The `zk://` URL, parsed once while the command line is checked, and the TLS settings its
//! files make.

use zookeeper_client::{Error as ZkError, TlsOptions};

use super::names::refused_by_zookeeper;
use crate::store::url::{parse_cluster_url, redact, switch, TlsFiles};
use crate::store::{Result, StoreError};

/// The root node unless the URL has a path.
pub const DEFAULT_ROOT: &str = "/leaderrun";
/// Port when a host has none.
const DEFAULT_PORT: u16 = 2181;

/// The parts of a `zk://` URL, parsed once while the command line is checked.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// `host:port,host2:port2`, the connect string without a chroot.
    pub(super) hosts: String,
    pub(super) user: Option<(String, String)>,
    pub(super) root: String,
    /// TLS (`?tls=1`): the PEM files of the CA (required) and of a client certificate.
    pub(super) tls: Option<TlsFiles>,
}

/// Shown as messages show the store: never the password.
impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Target({})", self.shown)
    }
}

impl Target {
    /// Parse a `zk://` or `zookeeper://` URL; the error is a bare reason, naming the part, and
    /// never the password.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let shown = redact(url);
        let bad = |why: &str| why.to_string();
        let expected = "expected zk://[user:pass@]host:2181[,host2:2181][/path]";
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad(expected))?;
        if !scheme.eq_ignore_ascii_case("zk") && !scheme.eq_ignore_ascii_case("zookeeper") {
            return Err(bad(expected));
        }
        let url = parse_cluster_url(rest, DEFAULT_PORT).map_err(|why| bad(&format!("{why} ({expected})")))?;
        let (mut tls, mut files, mut seen) = (false, TlsFiles::default(), Vec::new());
        for (key, value) in &url.params {
            // `zookeeper.client.secure` is the Java client's name for it.
            let is_tls = matches!(key.as_str(), "tls" | "secure" | "zookeeper.client.secure");
            let name = if is_tls { "tls" } else { key.as_str() };
            if seen.contains(&name) {
                return Err(format!("?{key}= is given twice"));
            }
            seen.push(name);
            if is_tls {
                tls = switch(key, value)?;
            } else if !files.take(key, value) {
                return Err(format!(
                    "unknown parameter ?{key}= (known: tls or zookeeper.client.secure, cacert, cert, key)"
                ));
            } else if value.is_empty() {
                return Err(format!("?{key}= needs a file"));
            }
        }
        files.check(tls, "?tls=1, for the server's secureClientPort").map_err(|why| bad(&why))?;
        if tls && files.cacert.is_none() {
            return Err(bad("TLS needs the CA of the server's certificate: ?tls=1&cacert=FILE"));
        }
        let root = if url.path.is_empty() { DEFAULT_ROOT.to_string() } else { format!("/{}", url.path) };
        for segment in root[1..].split('/') {
            if segment.is_empty() || segment == "." || segment == ".." || segment.chars().any(refused_by_zookeeper) {
                return Err(bad(&format!("{root:?} is not a ZooKeeper path")));
            }
        }
        if root == "/zookeeper" || root.starts_with("/zookeeper/") {
            return Err(bad("/zookeeper is ZooKeeper's own subtree; choose another path"));
        }
        if url.userinfo.as_ref().is_some_and(|(user, _)| user.is_empty()) {
            return Err(bad("user:pass@ names no user"));
        }
        let user = url.userinfo.map(|(user, pass)| (user, pass.unwrap_or_default()));
        Ok(Target { shown, hosts: url.hosts.join(","), user, root, tls: tls.then_some(files) })
    }
}

/// The client's TLS settings from the URL's PEM files: the CA, and a client certificate.
pub(super) fn tls_options(files: &TlsFiles, shown: &str) -> Result<TlsOptions> {
    let read = |param: &str, path: &Option<String>| -> Result<Option<String>> {
        let bytes = crate::store::read_url_file("zookeeper", shown, param, path.as_deref())?;
        Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
    };
    let bad = |what: &str, e: ZkError| StoreError::refused(format!("zookeeper store {shown}: {what}: {e}"));
    let mut options = TlsOptions::new();
    if let Some(ca) = read("cacert", &files.cacert)? {
        options = options.with_pem_ca(&ca).map_err(|e| bad("cacert= holds no usable certificate", e))?;
    }
    if let (Some(cert), Some(key)) = (read("cert", &files.cert)?, read("key", &files.key)?) {
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| bad("cert= and key= do not make a client identity", e))?;
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        assert_eq!(
            t("zk://h"),
            Target { shown: "zk://h".into(), hosts: "h:2181".into(), user: None, root: DEFAULT_ROOT.into(), tls: None }
        );
        let two = t("zookeeper://u:p%40ss@a,b:2/team/x/");
        assert_eq!(two.hosts, "a:2181,b:2");
        assert_eq!(two.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(two.root, "/team/x");
        assert!(Target::parse("zk://h?tls=1").unwrap_err().contains("cacert=FILE"));
        assert!(Target::parse("zk://h?cacert=/ca.pem").unwrap_err().contains("need TLS"));
        assert!(Target::parse("zk://h?tls=1&cacert=/ca&cert=/c").unwrap_err().contains("go together"));
        let tls = t("zk://h?zookeeper.client.secure=true&cacert=/ca%20dir/ca.pem&cert=/c.pem&key=/k.pem");
        let files =
            TlsFiles { cacert: Some("/ca dir/ca.pem".into()), cert: Some("/c.pem".into()), key: Some("/k.pem".into()) };
        assert_eq!(tls.tls, Some(files));
        assert_eq!(t("zk://h?tls=false").hosts, "h:2181");
        assert!(Target::parse("zk://a,,b").is_err());
        assert!(Target::parse("zk://h/a//b").is_err());
        assert!(Target::parse("zk://h/a/../b").is_err());
        assert!(Target::parse("zk://h/zookeeper").is_err());
    }

    #[test]
    fn every_parameter_is_checked() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert_eq!(
            err("zk://h?bogus=1"),
            "unknown parameter ?bogus= (known: tls or zookeeper.client.secure, cacert, cert, key)"
        );
        assert_eq!(err("zk://h?tls=yes&cacert=/ca"), "?tls=yes is not 1, true, 0 or false");
        assert!(Target::parse("zk://h?tls&cacert=/ca").unwrap().tls.is_some(), "a bare ?tls is yes");
        assert_eq!(err("zk://h?tls=1&secure=0&cacert=/ca"), "?secure= is given twice");
        assert_eq!(err("zk://h?tls=1&cacert=/a&cacert=/b"), "?cacert= is given twice");
        assert_eq!(err("zk://h?tls=1&cacert="), "?cacert= needs a file");
        assert_eq!(err("zk://:hunter2@h"), "user:pass@ names no user");
        assert!(Target::parse("zk://h?tls=TRUE&cacert=/ca").unwrap().tls.is_some());
        assert!(Target::parse("zk://h?tls=0").unwrap().tls.is_none());
    }

    #[test]
    fn debug_never_shows_the_password() {
        let target = Target::parse("zk://app:hunter2@h?tls=1&cacert=/ca").unwrap();
        let shown = format!("{target:?}");
        assert!(!shown.contains("hunter2") && shown.contains("app:***@h"), "{shown}");
    }
}
