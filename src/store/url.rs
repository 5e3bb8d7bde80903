//! The parts of a store URL every store's parser shares: percent-decoding, showing a URL
//! without its password, the host lists of clustered stores, yes-or-no parameters and TLS
//! file parameters. A leaf: it knows no store (each store parses its own URL with these).

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
            Some((k, _))
                if k.to_ascii_lowercase().contains("pass")
                    || k.eq_ignore_ascii_case("token")
                    || k.eq_ignore_ascii_case("sig") =>
            {
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
