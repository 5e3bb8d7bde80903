//! The `dynamodb://TABLE` URL, parsed once while the command line is checked.
//!
//! The URL names only the table. Credentials, region and endpoint come from where the AWS
//! CLI finds them (`client.rs`): a URL with a user, a password or a host in it is refused,
//! so that a secret key never sits in a command line or a process listing.

use crate::store::url::redact;

/// The parts of a `dynamodb://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL, for messages.
    pub shown: String,
    pub(super) table: String,
}

impl Target {
    /// Parse a `dynamodb://` URL; the error is a bare reason (the caller names the flag and URL).
    pub fn parse(url: &str) -> Result<Self, String> {
        let shown = redact(url);
        let rest = url
            .split_once("://")
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("dynamodb"))
            .map(|(_, rest)| rest)
            .ok_or("expected dynamodb://TABLE")?;
        if rest.contains('@') || rest.contains(':') {
            return Err("credentials and endpoints do not go in a dynamodb:// URL: set AWS_ACCESS_KEY_ID and \
                        AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), AWS_REGION and AWS_ENDPOINT_URL, as for the AWS CLI"
                .into());
        }
        if let Some((_, query)) = rest.split_once('?') {
            let key = query.split(['=', '&']).next().unwrap_or_default();
            return Err(format!("unknown parameter ?{key}= (a dynamodb:// URL takes none)"));
        }
        let table = rest.strip_suffix('/').unwrap_or(rest);
        check_table(table)?;
        Ok(Target { shown, table: table.to_string() })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.table
    }
}

/// A table name as DynamoDB accepts one: 3 to 255 letters, digits, `_`, `-` and `.`.
fn check_table(table: &str) -> Result<(), String> {
    if table.is_empty() {
        return Err("names no table (expected dynamodb://TABLE)".into());
    }
    if table.contains('/') {
        return Err(format!(
            "{table:?} is not a table name: a dynamodb:// URL has no path (expected dynamodb://TABLE)"
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if !(3..=255).contains(&table.len()) || !table.chars().all(allowed) {
        return Err(format!("{table:?} is not a table name (3 to 255 letters, digits, '.', '-' or '_')"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        assert_eq!(t("dynamodb://leaderrun-locks").table, "leaderrun-locks");
        assert_eq!(t("DynamoDB://My_Table.v2/").table, "My_Table.v2");
        assert_eq!(t("dynamodb://abc").shown, "dynamodb://abc");
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        let err = |u: &str| Target::parse(u).unwrap_err();
        assert!(err("dynamodb://").contains("names no table"));
        assert!(err("dynamodb://ab").contains("not a table name"));
        assert!(err("dynamodb://a b c").contains("not a table name"));
        assert!(err(&format!("dynamodb://{}", "t".repeat(256))).contains("not a table name"));
        assert!(err("dynamodb://table/prefix").contains("has no path"));
        assert!(err("s3://table").contains("expected dynamodb://"));
        assert!(err("dynamodb://locks?region=eu-west-1").contains("unknown parameter ?region="));
        assert!(err("dynamodb://localhost:8000/locks").contains("AWS_ENDPOINT_URL"));
    }

    #[test]
    fn credentials_in_the_url_are_refused_without_showing_them() {
        let why = Target::parse("dynamodb://AKIAEXAMPLE:wJalrSecret@locks").unwrap_err();
        assert!(why.contains("AWS_ACCESS_KEY_ID") && !why.contains("wJalrSecret"), "{why}");
        assert!(!redact("dynamodb://AKIAEXAMPLE:wJalrSecret@locks").contains("wJalrSecret"));
    }
}
