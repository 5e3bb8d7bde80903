//! The `s3://BUCKET[/PREFIX]` URL, parsed once while the command line is checked.
//!
//! The URL names only where the locks live. Credentials, region and endpoint come from
//! where the AWS CLI finds them (`credentials.rs`): a URL with a user or password in it is
//! refused, so that a secret key never sits in a command line or a process listing.

use crate::store::url::{percent_decode, redact, switch};

/// The key prefix unless the URL has a path.
pub const DEFAULT_PREFIX: &str = "leaderrun/";

/// The parameters an `s3://` URL takes, for the message that refuses any other.
const KNOWN: &str = "path-style";

/// The parts of an `s3://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL, for messages.
    pub shown: String,
    pub(super) bucket: String,
    /// Every object key starts with it: the URL's path with a trailing `/`, or `leaderrun/`.
    pub(super) prefix: String,
    /// `?path-style=1` or `0`: address the bucket as `endpoint/bucket/key` rather than
    /// `bucket.endpoint/key`. Unset: path style exactly when an endpoint is configured (a
    /// local MinIO or Ceph rarely has a DNS name per bucket).
    pub(super) path_style: Option<bool>,
}

impl Target {
    /// Parse an `s3://` URL; the error is a bare reason (the caller names the flag and URL).
    pub fn parse(url: &str) -> Result<Self, String> {
        let shown = redact(url);
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("s3"))
            .map(|(_, rest)| rest)
            .ok_or("expected s3://BUCKET[/PREFIX]")?;
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.contains('@') || bucket.contains(':') {
            return Err("credentials and endpoints do not go in an s3:// URL: set AWS_ACCESS_KEY_ID and \
                        AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_ENDPOINT_URL, as for the AWS CLI"
                .into());
        }
        check_bucket(bucket)?;
        let path = percent_decode(path.trim_matches('/'));
        let prefix = if path.is_empty() { DEFAULT_PREFIX.to_string() } else { format!("{path}/") };
        let mut path_style = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "path-style" if path_style.is_none() => path_style = Some(switch(key, value)?),
                "path-style" => return Err(format!("?{key}= is given twice")),
                _ => return Err(format!("unknown parameter ?{key}= (known: {KNOWN})")),
            }
        }
        Ok(Target { shown, bucket: bucket.to_string(), prefix, path_style })
    }
}

/// A bucket name as S3 and its look-alikes accept one: 3 to 63 letters, digits, dots,
/// hyphens and underscores (AWS itself allows no capitals or underscores in new buckets,
/// others do); nothing that would change the URL's meaning.
fn check_bucket(bucket: &str) -> Result<(), String> {
    if bucket.is_empty() {
        return Err("names no bucket (expected s3://BUCKET[/PREFIX])".into());
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if !(3..=63).contains(&bucket.len()) || !bucket.chars().all(allowed) {
        return Err(format!("{bucket:?} is not a bucket name (3 to 63 letters, digits, '.', '-' or '_')"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let plain = t("s3://my-bucket");
        assert_eq!(
            (plain.bucket.as_str(), plain.prefix.as_str(), plain.path_style),
            ("my-bucket", DEFAULT_PREFIX, None)
        );
        assert_eq!(t("s3://my-bucket/").prefix, DEFAULT_PREFIX);
        assert_eq!(t("s3://b.c.d/team/locks/").prefix, "team/locks/");
        assert_eq!(t("s3://bkt/a%20b").prefix, "a b/");
        assert_eq!(t("S3://bkt?path-style=1").path_style, Some(true));
        assert_eq!(t("s3://bkt?path-style=false").path_style, Some(false));
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("s3://").contains("names no bucket"));
        assert!(err("s3:///prefix").contains("names no bucket"));
        assert!(err("s3://a").contains("not a bucket name"));
        assert!(err("s3://bad%bucket").contains("not a bucket name"));
        assert!(err("gs://bkt").contains("expected s3://"));
        assert!(err("s3://bkt?region=eu-west-1").contains("unknown parameter ?region= (known: path-style)"));
        assert!(err("s3://bkt?path-style=yes").contains("not 1, true, 0 or false"));
        assert!(err("s3://bkt?path-style=1&path-style=0").contains("twice"));
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_showing_them() {
        let why = Target::parse("s3://AKIAEXAMPLE:wJalrSecret@bkt/x").unwrap_err();
        assert!(why.contains("AWS_ACCESS_KEY_ID") && !why.contains("wJalrSecret"), "{why}");
        let shown = crate::store::url::redact("s3://AKIAEXAMPLE:wJalrSecret@bkt/x");
        assert!(!shown.contains("wJalrSecret"), "{shown}");
    }
}
