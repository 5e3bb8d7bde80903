//! The `azblob://ACCOUNT/CONTAINER[/PREFIX]` URL, parsed once while the command line is
//! checked.
//!
//! The URL names only where the locks live. The key, a SAS token or a connection string (and
//! with it an endpoint of its own, such as Azurite's) come from the variables the Azure CLI
//! reads (`credentials.rs`): a URL with a user, a password or a query is refused, so that no
//! secret ever sits in a command line or a process listing. A prefix with `.` or `..`
//! segments or a `\` is refused: the HTTP client would send another path than the one signed.

use crate::store::url::percent_decode;

/// The blob name prefix unless the URL has a path.
pub const DEFAULT_PREFIX: &str = "leaderrun/";

/// The parts of an `azblob://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL, for messages (it holds no secret: those are refused).
    pub shown: String,
    pub(super) account: String,
    pub(super) container: String,
    /// Every blob name starts with it: the URL's path with a trailing `/`, or `leaderrun/`.
    pub(super) prefix: String,
}

impl Target {
    /// Parse an `azblob://` URL; the error is a bare reason (the caller names the flag and URL).
    pub fn parse(url: &str) -> Result<Self, String> {
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("azblob"))
            .map(|(_, rest)| rest)
            .ok_or("expected azblob://ACCOUNT/CONTAINER[/PREFIX]")?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if authority.contains(['@', ':']) || rest.contains(['?', '#']) {
            return Err("credentials, endpoints and parameters do not go in an azblob:// URL: set \
                        AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_KEY or AZURE_STORAGE_SAS_TOKEN, as \
                        for the Azure CLI"
                .into());
        }
        check_account(authority)?;
        let (container, path) = path.split_once('/').unwrap_or((path, ""));
        check_container(container)?;
        let path = percent_decode(path.trim_matches('/'));
        if path.chars().any(char::is_control) {
            return Err("the prefix may not contain control characters".into());
        }
        // An HTTP client drops `.` and `..` segments from the path it sends, and Azure reads `\`
        // as `/`: the blob reached would not be the one named (nor the path signed).
        if path.contains('\\') || path.split('/').any(|segment| segment == "." || segment == "..") {
            return Err(format!("the prefix {path:?} may not have `.` or `..` segments or a `\\`"));
        }
        let prefix = if path.is_empty() { DEFAULT_PREFIX.to_string() } else { format!("{path}/") };
        let shown = format!("azblob://{authority}/{container}/{}", prefix.trim_end_matches('/'));
        Ok(Target { shown, account: authority.to_string(), container: container.to_string(), prefix })
    }
}

/// A storage account name: 3 to 24 lower-case letters and digits (Azurite's well-known
/// `devstoreaccount1` is one).
fn check_account(account: &str) -> Result<(), String> {
    if account.is_empty() {
        return Err("names no storage account (expected azblob://ACCOUNT/CONTAINER[/PREFIX])".into());
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !(3..=24).contains(&account.len()) || !account.chars().all(allowed) {
        return Err(format!("{account:?} is not a storage account name (3 to 24 lower-case letters and digits)"));
    }
    Ok(())
}

/// A container name: 3 to 63 lower-case letters, digits and single hyphens, starting and
/// ending with a letter or digit.
fn check_container(container: &str) -> Result<(), String> {
    if container.is_empty() {
        return Err("names no container (expected azblob://ACCOUNT/CONTAINER[/PREFIX])".into());
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-';
    let ends_well = |c: Option<char>| c.is_some_and(|c| c != '-');
    if !(3..=63).contains(&container.len())
        || !container.chars().all(allowed)
        || container.contains("--")
        || !ends_well(container.chars().next())
        || !ends_well(container.chars().last())
    {
        return Err(format!(
            "{container:?} is not a container name (3 to 63 lower-case letters, digits and single hyphens, \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let plain = t("azblob://devstoreaccount1/locks");
        assert_eq!(
            (plain.account.as_str(), plain.container.as_str(), plain.prefix.as_str()),
            ("devstoreaccount1", "locks", DEFAULT_PREFIX)
        );
        assert_eq!(plain.shown, "azblob://devstoreaccount1/locks/leaderrun");
        assert_eq!(t("azblob://acct1/locks/").prefix, DEFAULT_PREFIX);
        assert_eq!(t("AZBLOB://acct1/locks/team/a%20b/").prefix, "team/a b/");
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("azblob://").contains("names no storage account"));
        assert!(err("azblob://acct1").contains("names no container"));
        assert!(err("azblob://acct1/").contains("names no container"));
        assert!(err("azblob://Acct/locks").contains("not a storage account name"));
        assert!(err("azblob://acct1/Locks").contains("not a container name"));
        assert!(err("azblob://acct1/a--b").contains("not a container name"));
        assert!(err("azblob://acct1/-ab").contains("not a container name"));
        assert!(err("s3://acct1/locks").contains("expected azblob://"));
        assert!(err("azblob://acct1/locks?sig=abc").contains("AZURE_STORAGE_SAS_TOKEN"));
        assert!(err("azblob://acct1/locks/a%0Ab").contains("control characters"));
    }

    /// reqwest removes `.` and `..` segments from a path (and Azure takes `\` for `/`):
    /// the path sent would differ from the path signed, or a SAS would reach another path.
    #[test]
    fn dot_segments_and_backslashes_in_the_prefix_are_refused() {
        for (url, prefix) in [
            ("azblob://acct1/locks/.", "."),
            ("azblob://acct1/locks/..", ".."),
            ("azblob://acct1/locks/a/../b", "a/../b"),
            ("azblob://acct1/locks/./a/", "./a"),
            ("azblob://acct1/locks/a/%2E%2E/b", "a/../b"),
            ("azblob://acct1/locks/a%2F..", "a/.."),
            ("azblob://acct1/locks/a%5Cb", "a\\b"),
        ] {
            let why = Target::parse(url).expect_err(url);
            assert!(why.contains(&format!("{prefix:?}")), "{url}: the prefix is not named: {why}");
            assert!(!why.contains('\n'), "{why}");
        }
        for fine in ["azblob://acct1/locks/a.b/..c/...", "azblob://acct1/locks/.a/b."] {
            Target::parse(fine).unwrap_or_else(|why| panic!("{fine}: {why}"));
        }
    }

    #[test]
    fn secrets_in_the_url_are_refused_without_showing_them() {
        let why = Target::parse("azblob://acct1:c2VjcmV0S2V5@locks/x").unwrap_err();
        assert!(why.contains("AZURE_STORAGE_KEY") && !why.contains("c2VjcmV0S2V5"), "{why}");
        let why = Target::parse("azblob://acct1/locks?sv=2022&sig=SeCrEt").unwrap_err();
        assert!(!why.contains("SeCrEt"), "{why}");
        let shown = crate::store::url::redact("azblob://acct1:c2VjcmV0S2V5@locks/x");
        assert!(!shown.contains("c2VjcmV0S2V5"), "{shown}");
    }
}
