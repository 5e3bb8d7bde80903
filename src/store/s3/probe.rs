//! Does this server honour conditional writes? A server that ignored `If-None-Match: *` or
//! `If-Match` would let two hosts both "win" a lock, silently. So a run (not `status` or
//! `list`) asks first, on objects of its own (lock keys never start with a `.`):
//!
//! 1. PutObject of `PREFIX.conditional-write-probe-RANDOM` (a key that does not exist) with
//!    `If-Match` of an ETag no body has: must be refused (404, or 412). A 200 means the server
//!    ignores If-Match, at least on a missing key (MinIO did until 2025, minio/minio#21526);
//!    the object it wrote is deleted again.
//! 2. PutObject of `PREFIX.conditional-write-probe` with `If-None-Match: *`: 412 once that
//!    object exists. The first time ever it is created (200) and asked again, which must
//!    then be 412.
//!
//! Two small refused writes per run (three the first time); a server that fails either
//! check is refused at open, in one line. A server that rejects the headers outright
//! (400 or 501, "not implemented") is refused by the same check, with its own words.

use aws_sdk_s3::primitives::ByteStream;

use super::errors::{classify, Failure};
use crate::store::{Result, StoreError};

/// The probe object's key under `prefix`.
pub fn probe_key(prefix: &str) -> String {
    format!("{prefix}.conditional-write-probe")
}

/// An ETag no object can have (not a hex MD5).
const NO_SUCH_ETAG: &str = "\"leaderrun-probe-no-such-etag\"";

/// What one probe write did.
enum Answer {
    Written,
    Refused,
}

async fn put(client: &aws_sdk_s3::Client, bucket: &str, key: &str, condition: Condition) -> Result<Answer> {
    let request = client
        .put_object()
        .bucket(bucket)
        .key(key)
        .content_type("text/plain")
        .body(ByteStream::from_static(b"leaderrun checks that conditional writes are honoured\n"));
    let (request, operation) = match condition {
        Condition::IfMatch => (request.if_match(NO_SUCH_ETAG), format!("PutObject {key} (If-Match)")),
        Condition::IfNoneMatch => (request.if_none_match("*"), format!("PutObject {key} (If-None-Match: *)")),
    };
    match request.send().await {
        Ok(_) => Ok(Answer::Written),
        Err(err) => match classify(bucket, &operation, err) {
            Failure::Precondition | Failure::NoSuchKey => Ok(Answer::Refused),
            Failure::Other(err) => Err(err),
        },
    }
}

#[derive(Clone, Copy)]
enum Condition {
    IfMatch,
    IfNoneMatch,
}

/// Refuse a server that is seen to ignore either precondition.
pub async fn check_conditional_writes(client: &aws_sdk_s3::Client, bucket: &str, prefix: &str) -> Result<()> {
    let key = probe_key(prefix);
    let ignores = |header: &str| {
        StoreError::refused(format!(
            "s3://{bucket}: this server ignores {header} on PutObject (checked on {key}), so two hosts could \
             both take a lock: leaderrun needs an S3 server that honours conditional writes"
        ))
    };
    let absent = format!("{key}-{:016x}", rand::random::<u64>());
    if let Answer::Written = put(client, bucket, &absent, Condition::IfMatch).await? {
        let _ = client.delete_object().bucket(bucket).key(&absent).send().await;
        return Err(ignores("If-Match"));
    }
    if let Answer::Written = put(client, bucket, &key, Condition::IfNoneMatch).await? {
        // Created just now (the first run against this prefix), or ignored: ask again.
        if let Answer::Written = put(client, bucket, &key, Condition::IfNoneMatch).await? {
            return Err(ignores("If-None-Match: *"));
        }
    }
    Ok(())
}
