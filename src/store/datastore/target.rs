//! The `datastore://PROJECT[/NAMESPACE][?kind=Lease&database=ID]` URL, parsed once while the
//! command line is checked.
//!
//! The URL names only where the locks live: the project, the namespace (none: the default
//! namespace), the entity kind (`Lease`, the kind the seed article's Go scheduler used) and
//! the database (none: the project's default database; a named Firestore database in
//! Datastore mode otherwise). Credentials come from Application Default Credentials and an
//! emulator from `DATASTORE_EMULATOR_HOST`, never from the URL: a URL with a user or password
//! in it is refused, so that no secret sits in a command line or a process listing.

use crate::store::url::{percent_decode, redact};

/// The entity kind unless the URL names one.
pub const DEFAULT_KIND: &str = "Lease";

/// The parameters a `datastore://` URL takes, for the message that refuses any other.
const KNOWN: &str = "kind, database";

const EXPECTED: &str = "expected datastore://PROJECT[/NAMESPACE][?kind=Lease&database=ID]";

/// The parts of a `datastore://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL, for messages.
    pub shown: String,
    pub(super) project: String,
    /// `""`: the default namespace.
    pub(super) namespace: String,
    pub(super) kind: String,
    /// `""`: the project's default database.
    pub(super) database: String,
}

impl Target {
    /// Parse a `datastore://` URL; the error is a bare reason (the caller names the flag and URL).
    pub fn parse(url: &str) -> Result<Self, String> {
        let shown = redact(url);
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("datastore"))
            .map(|(_, rest)| rest)
            .ok_or(EXPECTED)?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (project, namespace) = rest.split_once('/').unwrap_or((rest, ""));
        if project.contains('@') {
            return Err("credentials do not go in a datastore:// URL: set GOOGLE_APPLICATION_CREDENTIALS, run \
                        `gcloud auth application-default login`, or run where a metadata server answers"
                .into());
        }
        check_project(project)?;
        let namespace = percent_decode(namespace.trim_end_matches('/'));
        check_namespace(&namespace)?;
        let (mut kind, mut database) = (None, None);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = percent_decode(value);
            let slot = match key {
                "kind" => &mut kind,
                "database" => &mut database,
                _ => return Err(format!("unknown parameter ?{key}= (known: {KNOWN})")),
            };
            if slot.replace(value).is_some() {
                return Err(format!("?{key}= is given twice"));
            }
        }
        let kind = kind.unwrap_or_else(|| DEFAULT_KIND.to_string());
        check_kind(&kind)?;
        let database = match database.as_deref() {
            None | Some("(default)") => String::new(),
            Some(id) => check_database(id)?.to_string(),
        };
        Ok(Target { shown, project: project.to_string(), namespace, kind, database })
    }
}

/// Whether Datastore reserves `name` for itself (`__kind__`, `__namespace__`, ...): no key
/// name, kind or namespace may match `__.*__`.
pub fn is_reserved(name: &str) -> bool {
    name.len() >= 4 && name.starts_with("__") && name.ends_with("__")
}

/// A project ID: 6 to 30 lower-case letters, digits and hyphens, starting with a letter
/// (an older domain-scoped project, `example.com:project`, also has a domain and a colon).
/// Looser than Google's rule only in length, so that any emulator's project name works.
fn check_project(project: &str) -> Result<(), String> {
    if project.is_empty() {
        return Err(format!("names no project ({EXPECTED})"));
    }
    let id = project.rsplit_once(':').map_or(project, |(_, id)| id);
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | ':');
    if project.len() > 100 || !project.chars().all(ok) || !id.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Err(format!(
            "{project:?} is not a project ID (lower-case letters, digits and '-', starting with a letter)"
        ));
    }
    Ok(())
}

/// A namespace: at most 100 letters, digits, '.', '-' and '_', not `__…__`.
fn check_namespace(namespace: &str) -> Result<(), String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if namespace.len() > 100 || !namespace.chars().all(ok) || is_reserved(namespace) {
        return Err(format!(
            "{namespace:?} is not a namespace (at most 100 letters, digits, '.', '-' and '_', not __…__)"
        ));
    }
    Ok(())
}

/// A kind: 1 to 1,500 bytes, not `__…__`.
fn check_kind(kind: &str) -> Result<(), String> {
    if kind.is_empty() || kind.len() > 1500 || is_reserved(kind) || kind.chars().any(char::is_control) {
        return Err(format!("?kind={kind:?} is not a kind (1 to 1500 bytes, no control characters, not __…__)"));
    }
    Ok(())
}

/// A database ID: 4 to 63 lower-case letters, digits and hyphens, starting with a letter
/// and not ending with a hyphen.
fn check_database(id: &str) -> Result<&str, String> {
    let ok = (4..=63).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && id.starts_with(|c: char| c.is_ascii_lowercase())
        && !id.ends_with('-');
    if ok {
        Ok(id)
    } else {
        Err(format!(
            "?database={id:?} is not a database ID (4 to 63 lower-case letters, digits and '-', starting with a \
             letter; (default) for the default database)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let plain = t("datastore://my-project");
        assert_eq!(
            (plain.project.as_str(), plain.namespace.as_str(), plain.kind.as_str(), plain.database.as_str()),
            ("my-project", "", "Lease", "")
        );
        assert_eq!(t("datastore://my-project/").namespace, "");
        assert_eq!(t("DATASTORE://my-project/team.a_b-c").namespace, "team.a_b-c");
        assert_eq!(t("datastore://p123456?kind=Leader%20Lease").kind, "Leader Lease");
        assert_eq!(t("datastore://p123456?database=locks-db").database, "locks-db");
        assert_eq!(t("datastore://p123456?database=(default)").database, "");
        assert_eq!(t("datastore://example.com:my-project").project, "example.com:my-project");
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("datastore://").contains("names no project"));
        assert!(err("datastore:///ns").contains("names no project"));
        assert!(err("datastore://My_Project").contains("not a project ID"));
        assert!(err("datastore://1project").contains("not a project ID"));
        assert!(err("gs://bkt").contains("expected datastore://"));
        assert!(err("datastore://p/a/b").contains("not a namespace"));
        assert!(err("datastore://p/__kind__").contains("not a namespace"));
        assert!(err("datastore://p?kind=__x__").contains("not a kind"));
        assert!(err("datastore://p?kind=").contains("not a kind"));
        assert!(err("datastore://p?database=DB").contains("not a database ID"));
        assert!(err("datastore://p?region=x").contains("unknown parameter ?region= (known: kind, database)"));
        assert!(err("datastore://p?kind=A&kind=B").contains("twice"));
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_showing_them() {
        let why = Target::parse("datastore://user:s3cr3t@project").unwrap_err();
        assert!(why.contains("GOOGLE_APPLICATION_CREDENTIALS") && !why.contains("s3cr3t"), "{why}");
    }

    #[test]
    fn reserved_names() {
        assert!(is_reserved("__kind__") && is_reserved("____") && is_reserved("__a b__"));
        assert!(!is_reserved("__") && !is_reserved("___") && !is_reserved("__a") && !is_reserved("a__"));
    }
}
