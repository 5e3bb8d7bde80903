//! The `gs://BUCKET[/PREFIX]` URL, parsed once while the command line is checked.
//!
//! The URL names only where the locks live. Credentials come from where Google's client
//! libraries find them (Application Default Credentials, `store/google.rs`), and an emulator
//! from `STORAGE_EMULATOR_HOST`: a URL with a user, a password or a port is refused, so that
//! no key ever sits in a command line or a process listing.

use crate::store::url::{percent_decode, redact};

/// The object name prefix unless the URL has a path.
pub const DEFAULT_PREFIX: &str = "leaderrun/";

/// The parts of a `gs://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL, for messages.
    pub shown: String,
    pub(super) bucket: String,
    /// Every object name starts with it: the URL's path with a trailing `/`, or `leaderrun/`.
    pub(super) prefix: String,
}

impl Target {
    /// Parse a `gs://` URL; the error is a bare reason (the caller names the flag and URL).
    pub fn parse(url: &str) -> Result<Self, String> {
        let shown = redact(url);
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("gs"))
            .map(|(_, rest)| rest)
            .ok_or("expected gs://BUCKET[/PREFIX]")?;
        if let Some((_, query)) = rest.split_once('?') {
            let key = query.split(['=', '&']).next().unwrap_or_default();
            return Err(format!("unknown parameter ?{key}= (a gs:// URL takes none)"));
        }
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.contains('@') || bucket.contains(':') {
            return Err("credentials and endpoints do not go in a gs:// URL: leaderrun finds credentials as \
                        Google's client libraries do (GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth \
                        application-default login`, the metadata server), and an emulator through \
                        STORAGE_EMULATOR_HOST"
                .into());
        }
        check_bucket(bucket)?;
        let path = percent_decode(path.trim_matches('/'));
        if path.contains(['\r', '\n']) {
            return Err("the prefix may not contain a line break (Cloud Storage refuses such names)".into());
        }
        let prefix = if path.is_empty() { DEFAULT_PREFIX.to_string() } else { format!("{path}/") };
        Ok(Target { shown, bucket: bucket.to_string(), prefix })
    }
}

/// A bucket name as Cloud Storage accepts one: lower-case letters, digits, `-`, `_` and
/// `.`, starting and ending with a letter or digit; 3 to 63 characters, or up to 222 with
/// dots (each dot-separated part at most 63).
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("names no bucket (expected gs://BUCKET[/PREFIX])".into());
    }
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_');
    let ends = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let longest = if bucket.contains('.') { 222 } else { 63 };
    if !(3..=longest).contains(&bucket.len())
        || !bucket.chars().all(allowed)
        || !ends(bucket.chars().next())
        || !ends(bucket.chars().last())
        || bucket.split('.').any(|part| part.is_empty() || part.len() > 63)
    {
        return Err(format!(
            "{bucket:?} is not a Cloud Storage bucket name (3 to 63 lower-case letters, digits, '-', '_' or '.', \
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
        let plain = t("gs://my-bucket");
        assert_eq!((plain.bucket.as_str(), plain.prefix.as_str()), ("my-bucket", DEFAULT_PREFIX));
        assert_eq!(t("gs://my-bucket/").prefix, DEFAULT_PREFIX);
        assert_eq!(t("GS://b.c.d/team/locks/").prefix, "team/locks/");
        assert_eq!(t("gs://bkt/a%20b").prefix, "a b/");
        assert_eq!(t("gs://my_bucket_1").bucket, "my_bucket_1");
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("gs://").contains("names no bucket"));
        assert!(err("gs:///prefix").contains("names no bucket"));
        assert!(err("gs://a").contains("not a Cloud Storage bucket name"));
        assert!(err("gs://Upper").contains("not a Cloud Storage bucket name"));
        assert!(err("gs://-dash").contains("not a Cloud Storage bucket name"));
        assert!(err("gs://a..b").contains("not a Cloud Storage bucket name"));
        assert!(err("s3://bkt").contains("expected gs://"));
        assert!(err("gs://bkt?project=p").contains("unknown parameter ?project="));
        assert!(err("gs://bkt/a%0Ab").contains("line break"));
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_showing_them() {
        let why = Target::parse("gs://someone:hunter2secret@bkt/x").unwrap_err();
        assert!(why.contains("GOOGLE_APPLICATION_CREDENTIALS") && !why.contains("hunter2secret"), "{why}");
        assert!(Target::parse("gs://127.0.0.1:4443/x").unwrap_err().contains("STORAGE_EMULATOR_HOST"));
    }
}
