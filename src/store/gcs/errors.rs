//! What a Cloud Storage answer means for leaderrun: an outage (try again) or a refusal
//! (exit 69), each in one line that names the bucket and the operation. The callers deal
//! with the answers that are not errors (412: a lost race; 404: no such object).
//!
//! Messages are built from the bucket, the object name, the HTTP status and the `message`
//! of Google's error body (which may name the account, never a token); no header and no
//! request is ever shown.

use crate::store::google::describe_send_error;
use crate::store::StoreError;

/// One JSON API call, for messages: `objects.insert leaderrun/x`, and the IAM permissions
/// it needs, for the hint on a 403.
#[derive(Debug, Clone, Copy)]
pub struct Operation<'a> {
    pub method: &'static str,
    pub permission: &'static str,
    pub name: &'a str,
}

impl<'a> Operation<'a> {
    pub fn get(name: &'a str) -> Self {
        Operation { method: "objects.get", permission: "the permission storage.objects.get", name }
    }
    /// Overwriting an object (every renewal does) needs the delete permission as well.
    pub fn insert(name: &'a str) -> Self {
        Operation {
            method: "objects.insert",
            permission: "the permissions storage.objects.create and, to overwrite, storage.objects.delete",
            name,
        }
    }
    pub fn list(prefix: &'a str) -> Self {
        Operation { method: "objects.list", permission: "the permission storage.objects.list", name: prefix }
    }
    pub fn delete(name: &'a str) -> Self {
        Operation { method: "objects.delete", permission: "the permission storage.objects.delete", name }
    }

    fn what(&self, bucket: &str) -> String {
        format!("gs://{bucket}: {} {}", self.method, self.name)
    }
}

/// A request that got no answer (no connection, a timeout): an outage.
pub fn unanswered(bucket: &str, operation: Operation<'_>, error: reqwest::Error) -> StoreError {
    StoreError::unavailable(format!("{}: {}", operation.what(bucket), describe_send_error(error)))
}

/// An answer whose body could not be read or understood.
pub fn unreadable(bucket: &str, operation: Operation<'_>, why: impl std::fmt::Display) -> StoreError {
    let why = why.to_string().replace(['\n', '\r'], " ");
    StoreError::unavailable(format!("{}: the answer could not be read: {why}", operation.what(bucket)))
}

/// The 404 of a call that names no object (a listing, an upload that creates): the bucket
/// is not there, or this account may not see it. Retrying cannot help.
pub fn no_bucket(bucket: &str, operation: Operation<'_>) -> StoreError {
    StoreError::refused(format!(
        "{}: HTTP 404: the bucket does not exist (create it, or check the name in --store)",
        operation.what(bucket)
    ))
}

/// Whether a 404's body says the bucket (not the object) is missing: real Cloud Storage
/// says "The specified bucket does not exist."; fake-gcs-server says "Not Found" for both.
pub fn says_no_bucket(body: &str) -> bool {
    error_message(body).is_some_and(|m| m.to_ascii_lowercase().contains("bucket does not exist"))
}

/// Any other failed answer: 401/403 (no credentials, or no permission) and other 4xx are
/// refusals; 408, 429 and 5xx an outage (the elector retries).
pub fn failed(bucket: &str, operation: Operation<'_>, status: u16, body: &str) -> StoreError {
    let mut what = format!("{}: HTTP {status}", operation.what(bucket));
    if let Some(message) = error_message(body) {
        what.push_str(": ");
        what.push_str(&message);
    }
    match status {
        408 | 429 | 500..=599 => StoreError::unavailable(what),
        401 => StoreError::refused(format!("{what} (the credentials were not accepted)")),
        403 => StoreError::refused(format!("{what} (this needs {})", operation.permission)),
        _ => StoreError::refused(what),
    }
}

/// The `error.message` of a JSON API error body, on one line and not too long.
fn error_message(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let message = value.get("error")?.get("message")?.as_str()?;
    let mut line = message.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() > 300 {
        let cut = (0..=300).rev().find(|&i| line.is_char_boundary(i)).unwrap_or(0);
        line.truncate(cut);
        line.push('…');
    }
    Some(line).filter(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::ErrorKind;

    #[test]
    fn statuses() {
        let body = r#"{"error":{"code":403,"message":"a@b.iam.gserviceaccount.com does not have\nstorage.objects.create access"}}"#;
        let err = failed("bkt", Operation::insert("leaderrun/x"), 403, body);
        assert_eq!(err.kind, ErrorKind::Refused);
        assert_eq!(
            err.message,
            "gs://bkt: objects.insert leaderrun/x: HTTP 403: a@b.iam.gserviceaccount.com does not have \
             storage.objects.create access (this needs the permissions storage.objects.create and, to overwrite, \
             storage.objects.delete)"
        );
        assert!(failed("bkt", Operation::get("x"), 429, "").is_transient());
        assert!(failed("bkt", Operation::get("x"), 503, "<html>").is_transient());
        assert_eq!(failed("bkt", Operation::get("x"), 400, "").kind, ErrorKind::Refused);
        assert!(failed("bkt", Operation::get("x"), 401, "").message.contains("not accepted"));
        assert!(says_no_bucket(r#"{"error":{"code":404,"message":"The specified bucket does not exist."}}"#));
        assert!(!says_no_bucket(r#"{"error":{"code":404,"message":"Not Found"}}"#));
        assert!(no_bucket("bkt", Operation::list("p/")).message.contains("does not exist"));
    }
}
