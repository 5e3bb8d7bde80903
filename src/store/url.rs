//! Choosing a store from `--store URL`, and showing a URL without its password.

use std::path::PathBuf;

use super::{Store, StoreError};

/// A parsed `--store`: each store's URL parsed once, while the command line is checked,
/// so that a bad URL is bad usage (exit 2) on every store, before anything connects.
#[derive(Clone)]
pub enum StoreSpec {
    /// An SQLite file; `default` when no --store was given.
    Sqlite { path: PathBuf, default: bool },
    /// A PostgreSQL server (`postgres://` or `postgresql://`).
    #[cfg(feature = "postgres")]
    Postgres(super::postgres::Target),
    /// A MySQL or MariaDB server (`mysql://` or `mariadb://`).
    #[cfg(feature = "mysql")]
    MySql(super::mysql::Target),
    /// A Redis server (`redis://` or `rediss://`).
    #[cfg(feature = "redis")]
    Redis(super::redis::Target),
    /// An etcd cluster (`etcd://host:2379[,host2:2379...]`, `etcds://` for TLS).
    #[cfg(feature = "etcd")]
    Etcd(super::etcd::Target),
    /// A NATS JetStream KV bucket (`nats://host:4222[,host2:4222...][/BUCKET]`).
    #[cfg(feature = "nats")]
    Nats(super::nats::Target),
    /// A ZooKeeper ensemble (`zk://host:2181[,host2:2181...][/path]`).
    #[cfg(feature = "zookeeper")]
    ZooKeeper(super::zookeeper::Target),
    /// Kubernetes Leases (`k8s://[NAMESPACE]`, `kubernetes://`).
    #[cfg(feature = "kubernetes")]
    Kubernetes(super::kubernetes::Target),
    /// An S3 bucket (`s3://BUCKET[/PREFIX]`), or an S3-compatible server's.
    #[cfg(feature = "s3")]
    S3(super::s3::Target),
    /// A Cloud Storage bucket (`gs://BUCKET[/PREFIX]`).
    #[cfg(feature = "gcs")]
    Gcs(super::gcs::Target),
    /// Datastore entities (`datastore://PROJECT[/NAMESPACE]`), or Firestore in Datastore mode's.
    #[cfg(feature = "datastore")]
    Datastore(super::datastore::Target),
}

/// Debug output shows the store as messages do: never a password.
impl std::fmt::Debug for StoreSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StoreSpec({})", describe(self))
    }
}

impl StoreSpec {
    /// Parse a store URL (for tests and tools: `parse` is what the command line uses).
    pub fn from_url(url: &str) -> Result<Self, String> {
        parse(Some(url), || Err("no state directory".into()))
    }

    /// Whether this store can keep a lock of this name (beyond `validate_lock_name`'s
    /// rules): a bare reason if not, for a usage error before anything connects.
    pub fn check_lock_name(&self, lock: &str) -> Result<(), String> {
        match self {
            #[cfg(feature = "datastore")]
            StoreSpec::Datastore(_) => super::datastore::check_lock_name(lock),
            _ => {
                let _ = lock;
                Ok(())
            }
        }
    }
}

/// The schemes this build knows, for error messages.
pub const SCHEMES: &[&str] = &[
    "sqlite",
    #[cfg(feature = "postgres")]
    "postgres",
    #[cfg(feature = "postgres")]
    "postgresql",
    #[cfg(feature = "mysql")]
    "mysql",
    #[cfg(feature = "mysql")]
    "mariadb",
    #[cfg(feature = "redis")]
    "redis",
    #[cfg(feature = "redis")]
    "rediss",
    #[cfg(feature = "etcd")]
    "etcd",
    #[cfg(feature = "etcd")]
    "etcds",
    #[cfg(feature = "nats")]
    "nats",
    #[cfg(feature = "zookeeper")]
    "zk",
    #[cfg(feature = "zookeeper")]
    "zookeeper",
    #[cfg(feature = "kubernetes")]
    "k8s",
    #[cfg(feature = "kubernetes")]
    "kubernetes",
    #[cfg(feature = "s3")]
    "s3",
    #[cfg(feature = "gcs")]
    "gs",
    #[cfg(feature = "datastore")]
    "datastore",
];

/// Every scheme any build knows, to tell "not in this build" from "no such store".
const ALL_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "redis",
    "rediss",
    "etcd",
    "etcds",
    "nats",
    "zk",
    "zookeeper",
    "k8s",
    "kubernetes",
    "s3",
    "gs",
    "datastore",
];

/// Parse `--store`. `None` picks the embedded default file in `state_dir`.
pub fn parse(url: Option<&str>, state_dir: impl FnOnce() -> Result<PathBuf, String>) -> Result<StoreSpec, String> {
    let Some(url) = url else {
        return Ok(StoreSpec::Sqlite { path: state_dir()?.join("leaderrun.db"), default: true });
    };
    let shown = redact(url);
    let Some((scheme, rest)) = url.split_once(':') else {
        return Err(format!("--store {shown:?} is not a URL (expected e.g. sqlite:///path/to/file.db)"));
    };
    let parsed = match scheme.to_ascii_lowercase().as_str() {
        "sqlite" => parse_sqlite(rest),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => super::postgres::Target::parse(url).map(StoreSpec::Postgres),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => super::mysql::Target::parse(url).map(StoreSpec::MySql),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => super::redis::Target::parse(url).map(StoreSpec::Redis),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => super::etcd::Target::parse(url).map(StoreSpec::Etcd),
        #[cfg(feature = "nats")]
        "nats" => super::nats::Target::parse(url).map(StoreSpec::Nats),
        #[cfg(feature = "zookeeper")]
        "zk" | "zookeeper" => super::zookeeper::Target::parse(url).map(StoreSpec::ZooKeeper),
        #[cfg(feature = "kubernetes")]
        "k8s" | "kubernetes" => super::kubernetes::Target::parse(url).map(StoreSpec::Kubernetes),
        #[cfg(feature = "s3")]
        "s3" => super::s3::Target::parse(url).map(StoreSpec::S3),
        #[cfg(feature = "gcs")]
        "gs" => super::gcs::Target::parse(url).map(StoreSpec::Gcs),
        #[cfg(feature = "datastore")]
        "datastore" => super::datastore::Target::parse(url).map(StoreSpec::Datastore),
        other if ALL_SCHEMES.contains(&other) => {
            return Err(format!("--store: this build of leaderrun has no {other}:// store (its cargo feature is off)"))
        }
        other => return Err(format!("--store: unknown scheme {other:?} (this build knows: {})", SCHEMES.join(", "))),
    };
    // A store's parser gives a bare reason; the flag and the URL (without its password) are named here.
    parsed.map_err(|why| format!("--store {shown:?}: {why}"))
}

/// `sqlite:///abs/path`, `sqlite://rel/path` and `sqlite:path` all name a file; the
/// URL takes no parameters.
fn parse_sqlite(rest: &str) -> Result<StoreSpec, String> {
    let path = rest.strip_prefix("//").unwrap_or(rest);
    if let Some((_, query)) = path.split_once('?') {
        let key = query.split(['=', '&']).next().unwrap_or_default();
        return Err(format!("unknown parameter ?{key}= (an sqlite:// URL takes none)"));
    }
    if path.is_empty() || path.ends_with('/') {
        return Err("it names no file (expected e.g. sqlite:///path/to/file.db)".into());
    }
    Ok(StoreSpec::Sqlite { path: PathBuf::from(path), default: false })
}

/// The state directory for the embedded store: $XDG_STATE_HOME/leaderrun, else
/// ~/.local/state/leaderrun; /var/lib/leaderrun for root.
pub fn default_state_dir() -> Result<PathBuf, String> {
    if nix::unistd::geteuid().is_root() {
        return Ok(PathBuf::from("/var/lib/leaderrun"));
    }
    let absolute = |v: std::ffi::OsString| Some(PathBuf::from(v)).filter(|p| p.is_absolute());
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").and_then(absolute) {
        return Ok(dir.join("leaderrun"));
    }
    match std::env::var_os("HOME").and_then(absolute) {
        Some(home) => Ok(home.join(".local/state/leaderrun")),
        None => {
            Err("no state directory: neither XDG_STATE_HOME nor HOME is set; give --store sqlite:///path/to/file.db"
                .into())
        }
    }
}

/// Whether the command may create the store (a run) or only look at it
/// (`status`, `list`, `release` never create an empty store).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Create,
    Existing,
}

/// Open the store a spec names.
pub async fn open(spec: &StoreSpec, access: Access) -> Result<Box<dyn Store>, StoreError> {
    choose_crypto_provider();
    match spec {
        #[cfg(feature = "sqlite")]
        StoreSpec::Sqlite { path, default } => {
            if *default && access == Access::Create {
                create_state_dir(path.parent().unwrap_or(std::path::Path::new(".")))?;
            }
            Ok(Box::new(super::sqlite::SqliteStore::open(path, access).await?))
        }
        #[cfg(not(feature = "sqlite"))]
        StoreSpec::Sqlite { .. } => {
            let _ = access;
            Err(StoreError::refused("this build of leaderrun has no sqlite store (its cargo feature is off)"))
        }
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(target) => Ok(Box::new(super::postgres::PostgresStore::open(target, access).await?)),
        #[cfg(feature = "mysql")]
        StoreSpec::MySql(target) => Ok(Box::new(super::mysql::MySqlStore::open(target, access).await?)),
        #[cfg(feature = "redis")]
        StoreSpec::Redis(target) => Ok(Box::new(super::redis::RedisStore::open(target, access).await?)),
        #[cfg(feature = "etcd")]
        StoreSpec::Etcd(target) => Ok(Box::new(super::etcd::EtcdStore::open(target, access).await?)),
        #[cfg(feature = "nats")]
        StoreSpec::Nats(target) => Ok(Box::new(super::nats::NatsStore::open(target, access).await?)),
        #[cfg(feature = "zookeeper")]
        StoreSpec::ZooKeeper(target) => Ok(Box::new(super::zookeeper::ZooKeeperStore::open(target, access).await?)),
        #[cfg(feature = "kubernetes")]
        StoreSpec::Kubernetes(target) => super::kubernetes::open(target, access).await,
        #[cfg(feature = "s3")]
        StoreSpec::S3(target) => super::s3::open(target, access).await,
        #[cfg(feature = "gcs")]
        StoreSpec::Gcs(target) => super::gcs::open(target, access).await,
        #[cfg(feature = "datastore")]
        StoreSpec::Datastore(target) => super::datastore::open(target, access).await,
    }
}

/// `leaderrun init`: open the store and make now what a run would make on first use (a
/// PostgreSQL table; every other store makes what it needs as it opens).
pub async fn prepare(spec: &StoreSpec) -> Result<Box<dyn Store>, StoreError> {
    match spec {
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(target) => {
            choose_crypto_provider();
            Ok(Box::new(super::postgres::PostgresStore::prepare(target).await?))
        }
        _ => open(spec, Access::Create).await,
    }
}

/// The store clients bring rustls with two crypto backends (ring, and aws-lc-rs through the
/// ZooKeeper client's TLS); rustls then cannot pick one by itself and panics on the first TLS
/// connection. Choose ring for the whole process, before any store connects.
fn choose_crypto_provider() {
    #[cfg(any(
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "etcd",
        feature = "nats",
        feature = "zookeeper",
        feature = "kubernetes",
        feature = "s3",
        feature = "google"
    ))]
    {
        // Already chosen (a second open in the same process): fine.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The statement that creates the store's table (`leaderrun init --print-sql`).
pub fn schema_sql(spec: &StoreSpec) -> Result<String, String> {
    match spec {
        #[cfg(feature = "sqlite")]
        StoreSpec::Sqlite { .. } => Ok(super::sqlite::SCHEMA.to_string()),
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(target) => Ok(super::postgres::schema_sql(target.table())),
        #[cfg(feature = "mysql")]
        StoreSpec::MySql(target) => Ok(super::mysql::schema_sql(target.table())),
        #[allow(unreachable_patterns)]
        _ => Err("this store keeps no tables: there is no SQL to print".into()),
    }
}

/// The store, for messages: a path, or a URL without its password.
pub fn describe(spec: &StoreSpec) -> String {
    match spec {
        StoreSpec::Sqlite { path, .. } => format!("sqlite://{}", path.display()),
        #[cfg(feature = "postgres")]
        StoreSpec::Postgres(target) => target.shown.clone(),
        #[cfg(feature = "mysql")]
        StoreSpec::MySql(target) => target.shown.clone(),
        #[cfg(feature = "redis")]
        StoreSpec::Redis(target) => target.shown.clone(),
        #[cfg(feature = "etcd")]
        StoreSpec::Etcd(target) => target.shown.clone(),
        #[cfg(feature = "nats")]
        StoreSpec::Nats(target) => target.shown.clone(),
        #[cfg(feature = "zookeeper")]
        StoreSpec::ZooKeeper(target) => target.shown.clone(),
        #[cfg(feature = "kubernetes")]
        StoreSpec::Kubernetes(target) => target.shown.clone(),
        #[cfg(feature = "s3")]
        StoreSpec::S3(target) => target.shown.clone(),
        #[cfg(feature = "gcs")]
        StoreSpec::Gcs(target) => target.shown.clone(),
        #[cfg(feature = "datastore")]
        StoreSpec::Datastore(target) => target.shown.clone(),
    }
}

#[cfg(feature = "sqlite")]
fn create_state_dir(dir: &std::path::Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| StoreError::refused(format!("cannot create state directory {}: {e}", dir.display())))
}

/// `url` with any password replaced by `***`, safe to print or log.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    // A password written with an unescaped '/', '?' or '#' ends the authority early: mask
    // everything up to the last '@' instead (more than needed, perhaps, never less).
    if !authority.contains('@') {
        if let Some(at) = rest.rfind('@') {
            return format!("{scheme}://***@{}", redact_query(&rest[at + 1..]));
        }
    }
    // NATS takes a bare token as the user info (`nats://TOKEN@host`): all of it is secret.
    let bare_secret = scheme.eq_ignore_ascii_case("nats");
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let masked = match (userinfo.contains(':'), bare_secret) {
                (true, _) => format!("{user}:***"),
                (false, true) => "***".to_string(),
                (false, false) => user.to_string(),
            };
            let tail = redact_query(tail);
            format!("{scheme}://{masked}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{}", redact_query(tail)),
    }
}

/// The parts a clustered store's URL shares (etcd, NATS, ZooKeeper):
/// `scheme://[user[:password]@]host[:port][,host2[:port]...][/path][?key=value&...]`.
#[derive(Debug, PartialEq, Eq)]
pub struct ClusterUrl {
    /// User and password (`None` without a `:`), percent-decoded.
    pub userinfo: Option<(String, Option<String>)>,
    /// `host:port` for each host (`[v6]:port` too), with `default_port` where none is given.
    pub hosts: Vec<String>,
    /// The path, percent-decoded, without its leading and trailing `/`.
    pub path: String,
    /// The query's parameters in order, values percent-decoded.
    pub params: Vec<(String, String)>,
}

/// Split the part of a clustered store's URL after `scheme://`; the error names what is wrong.
pub fn parse_cluster_url(rest: &str, default_port: u16) -> Result<ClusterUrl, String> {
    // An '@' after the first '/', '?' or '#' is a password with one of those unescaped: the
    // host part would be wrong and the password shown as a host.
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if rest[authority_end..].contains('@') && !rest[..authority_end].contains('@') {
        return Err("a user or password with '/', '?' or '#' must write them %2F, %3F and %23".into());
    }
    let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let userinfo = match userinfo.split_once(':') {
                Some((user, pass)) => (percent_decode(user), Some(percent_decode(pass))),
                None => (percent_decode(userinfo), None),
            };
            (Some(userinfo), hosts)
        }
        None => (None, authority),
    };
    let mut with_ports = Vec::new();
    for host in hosts.split(',').map(str::trim) {
        if host.is_empty() {
            return Err("names no host".into());
        }
        // host, host:port, [v6], [v6]:port
        let (name, port) = match host.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((_, "")) => (host, None),
                Some((_, port)) => (&host[..host.len() - port.len()], port.strip_prefix(':').or(Some(port))),
                None => return Err(format!("{host:?} is not a host (an IPv6 address needs its closing ']')")),
            },
            None => match host.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (host, None),
            },
        };
        match port {
            None => with_ports.push(format!("{host}:{default_port}")),
            Some(port) if port.parse::<u16>().is_ok_and(|p| p > 0) && !name.is_empty() => {
                with_ports.push(host.to_string())
            }
            Some(port) => {
                return Err(format!("{host:?} is not host:port (the port {port:?} is not a number from 1 to 65535)"))
            }
        }
    }
    let params = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (key.to_string(), percent_decode(value))
        })
        .collect();
    Ok(ClusterUrl { userinfo, hosts: with_ports, path: percent_decode(path.trim_matches('/')), params })
}

/// A yes-or-no URL parameter: bare (`?tls`), `1` or `true` is yes; `0` or `false` is no.
/// Anything else is refused: a misspelt value must not silently turn TLS on or off.
pub fn switch(key: &str, value: &str) -> Result<bool, String> {
    match value.to_ascii_lowercase().as_str() {
        "" | "1" | "true" => Ok(true),
        "0" | "false" => Ok(false),
        _ => Err(format!("?{key}={value} is not 1, true, 0 or false")),
    }
}

/// The PEM files of a TLS connection, named as etcdctl and redis-cli name them:
/// `cacert=` (the CA to trust), `cert=` and `key=` (a client certificate).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub cacert: Option<String>,
    pub cert: Option<String>,
    pub key: Option<String>,
}

impl TlsFiles {
    /// Take a URL parameter if it is one of these; false if it is not.
    pub fn take(&mut self, key: &str, value: &str) -> bool {
        let slot = match key {
            "cacert" => &mut self.cacert,
            "cert" => &mut self.cert,
            "key" => &mut self.key,
            _ => return false,
        };
        *slot = Some(value.to_string());
        true
    }

    /// Check the files against whether TLS is on; `how` says how to turn it on.
    pub fn check(&self, tls: bool, how: &str) -> Result<(), String> {
        if *self != Self::default() && !tls {
            return Err(format!("cacert=, cert= and key= need TLS ({how})"));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err("cert= and key= go together".into());
        }
        Ok(())
    }
}

/// `%XX` escapes in a URL part decoded (a password may need them for `@`, `:` or `/`); a `%`
/// not followed by two hex digits stays as it is.
pub fn percent_decode_bytes(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
            Some(byte) if bytes[i] == b'%' && !hex.is_some_and(|h| h.starts_with('+')) => {
                out.push(byte);
                i += 3;
            }
            _ => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    out
}

/// `percent_decode_bytes`, as text (invalid UTF-8 replaced).
pub fn percent_decode(text: &str) -> String {
    String::from_utf8_lossy(&percent_decode_bytes(text)).into_owned()
}

/// Mask `password=` style query parameters too.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_string();
    };
    let masked: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if k.to_ascii_lowercase().contains("pass") || k.eq_ignore_ascii_case("token") => {
                format!("{k}=***")
            }
            _ => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", masked.join("&"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_state() -> Result<PathBuf, String> {
        Ok(PathBuf::from("/state"))
    }

    #[test]
    fn sqlite_urls() {
        let p = |u| match parse(Some(u), no_state).unwrap() {
            StoreSpec::Sqlite { path, default } => (path, default),
            #[allow(unreachable_patterns)]
            other => panic!("{other:?}"),
        };
        assert_eq!(p("sqlite:///a/b.db"), ("/a/b.db".into(), false));
        assert_eq!(p("sqlite://rel/b.db"), ("rel/b.db".into(), false));
        assert_eq!(p("sqlite:b.db"), ("b.db".into(), false));
        assert!(
            matches!(parse(None, no_state).unwrap(), StoreSpec::Sqlite { path, default: true } if path == std::path::Path::new("/state/leaderrun.db"))
        );
        assert!(parse(Some("sqlite://"), no_state).unwrap_err().contains("names no file"));
        let err = parse(Some("sqlite:///a/b.db?mode=ro"), no_state).unwrap_err();
        assert!(err.contains("unknown parameter ?mode="), "{err}");
    }

    #[test]
    fn unknown_scheme_names_it_without_the_password() {
        let err = parse(Some("zookeepr://u:hunter2@h/x"), no_state).unwrap_err();
        assert!(err.contains("\"zookeepr\""), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = parse(Some("not a url"), no_state).unwrap_err();
        assert!(err.contains("not a URL"), "{err}");
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("postgres://u:hunter2@h:5432/db"), "postgres://u:***@h:5432/db");
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("redis://:p%40ss@h"), "redis://:***@h");
        assert_eq!(redact("postgres://h/db?user=u&password=hunter2"), "postgres://h/db?user=u&password=***");
        assert_eq!(redact("sqlite:///a/b.db"), "sqlite:///a/b.db");
        for url in ["redis://:pa#ss@h", "redis://:pa/ss@h/0", "postgres://u:p?w@h/db"] {
            let shown = redact(url);
            assert!(!shown.contains("pa") && !shown.contains("p?w") && shown.contains("***@h"), "{url}: {shown}");
        }
        assert_eq!(percent_decode("p%40ss%2Fw%3Ad"), "p@ss/w:d");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%+1x"), "%+1x");
    }

    #[test]
    fn cluster_urls() {
        let url = parse_cluster_url("u:p%40ss@a,b:2,[::1],[::1]:5/x/y/?k=v%20w&flag", 9).unwrap();
        assert_eq!(url.userinfo, Some(("u".into(), Some("p@ss".into()))));
        assert_eq!(url.hosts, vec!["a:9", "b:2", "[::1]:9", "[::1]:5"]);
        assert_eq!(url.path, "x/y");
        assert_eq!(url.params, vec![("k".into(), "v w".into()), ("flag".into(), String::new())]);
        assert_eq!(parse_cluster_url("tok@h", 1).unwrap().userinfo, Some(("tok".into(), None)));
        assert_eq!(parse_cluster_url("a,,b", 1).unwrap_err(), "names no host");
        for bad in ["h:abc", "h:0", "h:70000", "[::1]x", "[::1", ":5"] {
            assert!(parse_cluster_url(bad, 1).unwrap_err().contains("not"), "{bad}");
        }
        let err = parse_cluster_url("u:pa/ss@h", 1).unwrap_err();
        assert!(err.contains("%2F") && !err.contains("pa/ss"), "{err}");
        assert!(parse_cluster_url("u:p%2Fss@h/x?k=a@b", 1).is_ok(), "an '@' after an authority that has one");
        let mut files = TlsFiles::default();
        assert!(files.take("cacert", "/ca") && !files.take("tls", "1"));
        assert!(files.check(true, "").is_ok());
        assert!(files.check(false, "?tls=1").unwrap_err().contains("?tls=1"));
        assert!(files.take("cert", "/c") && files.check(true, "").unwrap_err().contains("go together"));
        assert_eq!(redact("nats://s3cr3t-token@h:4222/B"), "nats://***@h:4222/B");
        assert_eq!(redact("nats://u:hunter2@h"), "nats://u:***@h");
    }
}
