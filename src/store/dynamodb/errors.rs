//! What a DynamoDB answer means for leaderrun: a lost race, an outage (try again) or a
//! refusal (exit 69), each in one line that names the table and the operation.
//!
//! DynamoDB answers errors as HTTP 400 with an error code (`__type`), 500 for its own faults.
//! The code decides: a failed condition is a lost race; throttling and DynamoDB's own faults
//! are outages; a bad signature, an unknown key, no permission, a missing table and any
//! other refusal are refusals. Messages are built from the table, the operation, the HTTP
//! status and DynamoDB's code and message: never from the request or its headers, so a
//! credential never shows.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};

use crate::store::aws::{is_missing_credentials, one_line};
use crate::store::StoreError;

/// A failed request, as far as leaderrun cares.
#[derive(Debug)]
pub enum Failure {
    /// ConditionalCheckFailedException: another write came first (or the item is gone).
    Condition,
    /// ResourceNotFoundException: no such table (in this region).
    NoTable,
    Other(StoreError),
}

/// Codes that mean "try again later": throttling, and DynamoDB's own faults.
const TRANSIENT: &[&str] = &[
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
    "InternalServerError",
    "ServiceUnavailable",
    "TransactionConflictException",
    "ReplicatedWriteConflictException",
    "LimitExceededException",
];

/// `err` from `operation` (e.g. "PutItem nightly") on `table`.
pub fn classify<E>(
    table: &str,
    operation: &str,
    err: SdkError<E, aws_sdk_dynamodb::config::http::HttpResponse>,
) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let Some(status) = err.raw_response().map(|r| r.status().as_u16()) else {
        // No answer: no connection, a timeout, or no credentials to sign with.
        let why = one_line(&err);
        let what = format!("dynamodb://{table}: {operation}: {why}");
        return Failure::Other(if is_missing_credentials(&why) {
            StoreError::refused(format!(
                "{what} (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, as for the AWS CLI)"
            ))
        } else {
            StoreError::unavailable(what)
        });
    };
    let (code, message) = match &err {
        SdkError::ServiceError(service) => {
            let meta = service.err();
            (meta.code().unwrap_or_default().to_string(), meta.message().unwrap_or_default().to_string())
        }
        _ => (String::new(), String::new()),
    };
    match code.as_str() {
        "ConditionalCheckFailedException" => return Failure::Condition,
        "ResourceNotFoundException" => return Failure::NoTable,
        _ => {}
    }
    let detail = [code.as_str(), message.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>();
    let mut what = format!("dynamodb://{table}: {operation}: HTTP {status}");
    if !detail.is_empty() {
        what.push(' ');
        what.push_str(&detail.join(": ").replace(['\n', '\r'], " "));
    }
    if TRANSIENT.contains(&code.as_str()) || (500..=599).contains(&status) || status == 429 {
        Failure::Other(StoreError::unavailable(what))
    } else {
        // UnrecognizedClientException (no such key id), InvalidSignatureException (a wrong
        // secret), AccessDeniedException, ValidationException, and any other refusal.
        Failure::Other(StoreError::refused(what))
    }
}

/// The refusal for a table that is not there, naming what makes it.
pub fn no_table(table: &str, region: &str) -> StoreError {
    StoreError::refused(format!(
        "dynamodb://{table}: table {table:?} does not exist in region {region}: create it with `leaderrun init \
         --store dynamodb://{table}` (or print the AWS CLI command with `leaderrun init --print`)"
    ))
}

impl Failure {
    /// As a store error, where a lost race or a missing table is not expected.
    pub fn into_error(self, table: &str, region: &str, operation: &str) -> StoreError {
        match self {
            Failure::Other(err) => err,
            Failure::NoTable => no_table(table, region),
            Failure::Condition => StoreError::refused(format!("dynamodb://{table}: {operation}: the condition failed")),
        }
    }
}
