//! What an S3 answer means for leaderrun: a lost race, a missing object, an outage (try
//! again) or a refusal (exit 69), each in one line that names the bucket and the operation.

use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};

use crate::store::aws::{is_missing_credentials, one_line};
use crate::store::StoreError;

/// A failed request, as far as leaderrun cares.
#[derive(Debug)]
pub enum Failure {
    /// 412 Precondition Failed, or 409 ConditionalRequestConflict (AWS's answer to two
    /// conditional writes of one key at once): another write came first.
    Precondition,
    /// 404 for the object (not for the bucket: a missing bucket is refused).
    NoSuchKey,
    Other(StoreError),
}

/// The HTTP status and S3 error code of `err`, if the server answered.
fn status_and_code<E: ProvideErrorMetadata>(
    err: &SdkError<E, aws_sdk_s3::config::http::HttpResponse>,
) -> Option<(u16, String, String)> {
    let status = err.raw_response()?.status().as_u16();
    let (code, message) = match err {
        SdkError::ServiceError(service) => {
            let meta = service.err();
            (meta.code().unwrap_or_default().to_string(), meta.message().unwrap_or_default().to_string())
        }
        _ => (String::new(), String::new()),
    };
    Some((status, code, message))
}

/// `err` from `operation` (e.g. "PutObject leaderrun/x") on `bucket`.
pub fn classify<E>(bucket: &str, operation: &str, err: SdkError<E, aws_sdk_s3::config::http::HttpResponse>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let Some((status, code, message)) = status_and_code(&err) else {
        // No answer: no connection, a timeout, or no credentials to sign with.
        let why = one_line(&err);
        let what = format!("s3://{bucket}: {operation}: {why}");
        return Failure::Other(if is_missing_credentials(&why) {
            StoreError::refused(format!(
                "{what} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, as for the AWS CLI)"
            ))
        } else {
            StoreError::unavailable(what)
        });
    };
    match (status, code.as_str()) {
        (412, _) | (409, "ConditionalRequestConflict") => return Failure::Precondition,
        (404, "NoSuchBucket") => {}
        (404, _) => return Failure::NoSuchKey,
        _ => {}
    }
    let detail = [code.as_str(), message.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>();
    let mut what = format!("s3://{bucket}: {operation}: HTTP {status}");
    if !detail.is_empty() {
        what.push(' ');
        what.push_str(&detail.join(": ").replace(['\n', '\r'], " "));
    }
    let region = err.raw_response().and_then(|r| r.headers().get("x-amz-bucket-region")).map(str::to_string);
    match (status, region) {
        // 429 and 5xx (SlowDown, InternalError, ServiceUnavailable): try again.
        (429, _) | (500..=599, _) if code != "NotImplemented" => Failure::Other(StoreError::unavailable(what)),
        (301 | 400, Some(region)) => {
            Failure::Other(StoreError::refused(format!("{what} (the bucket is in {region}: set AWS_REGION={region})")))
        }
        // 403 (bad key, bad signature, no permission), a missing bucket, a server that does
        // not implement what leaderrun needs, and any other refusal: retrying cannot help.
        _ => Failure::Other(StoreError::refused(what)),
    }
}

impl Failure {
    /// As a store error, for an answer that should not have come (a 412 where no
    /// precondition was sent).
    pub fn into_error(self, bucket: &str, operation: &str) -> StoreError {
        match self {
            Failure::Other(err) => err,
            Failure::Precondition => StoreError::refused(format!("s3://{bucket}: {operation}: precondition failed")),
            Failure::NoSuchKey => StoreError::unavailable(format!("s3://{bucket}: {operation}: no such key")),
        }
    }
}
