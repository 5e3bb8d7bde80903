//! What the AWS stores (S3, DynamoDB) share, as `google.rs` is for the Google ones: the SDK's
//! loader set up once (HTTPS through rustls with ring, timeouts, one retry), a trace line per
//! request, the server's `Date` of one response, and how an SDK error reads in one line.
//!
//! Credentials, region and endpoint are where the AWS CLI looks: the SDK's own loader, in its
//! order (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN; AWS_PROFILE in
//! ~/.aws/credentials and ~/.aws/config, with role_arn, credential_process and SSO; web
//! identity; ECS container credentials; the instance metadata service, IMDSv2). The SDK's
//! default HTTPS client would bring aws-lc-rs, whose build needs cmake: this one does not.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader, SdkConfig};
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::ConfigBag;

use super::client_timed::server_clock::parse_http_date;

/// A connection that does not open within this is an outage (the elector retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One HTTP attempt that takes longer than this is abandoned (and retried once).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// What the loader finds; `configure` may override it (an embedding program's own
/// credentials or endpoint).
pub async fn load(configure: impl FnOnce(ConfigLoader) -> ConfigLoader) -> SdkConfig {
    let https = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    let timeouts =
        TimeoutConfig::builder().connect_timeout(CONNECT_TIMEOUT).operation_attempt_timeout(ATTEMPT_TIMEOUT).build();
    let loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(https)
        .timeout_config(timeouts)
        // One retry: the elector retries on its own schedule, and a renewal must not spend
        // its lease in the SDK's backoff.
        .retry_config(RetryConfig::standard().with_max_attempts(2));
    configure(loader).load().await
}

/// One `store request` trace line per HTTP request the SDK sends (retries included): what
/// `-vvv` counts, as every store's requests are counted. Named by the operation where the
/// request names it in a header (DynamoDB's `X-Amz-Target: DynamoDB_20120810.GetItem`, all
/// POSTs), else by its method (S3's GET, PUT, HEAD).
#[derive(Debug)]
pub struct RequestTrace;

impl Intercept for RequestTrace {
    fn name(&self) -> &'static str {
        "leaderrun-request-trace"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let op = match request.headers().get("x-amz-target") {
            Some(target) => target.rsplit('.').next().unwrap_or_default().to_ascii_lowercase(),
            None => request.method().to_ascii_lowercase(),
        };
        tracing::trace!(op = %op, "store request");
        Ok(())
    }
}

/// Records the `Date` header of one request's response (whatever its status), for the
/// request it is attached to with `.customize().interceptor(..)`.
#[derive(Debug, Clone, Default)]
pub struct DateHeader(Arc<Mutex<Option<SystemTime>>>);

impl DateHeader {
    /// The server's clock when it answered, if it said.
    pub fn get(&self) -> Option<SystemTime> {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Intercept for DateHeader {
    fn name(&self) -> &'static str {
        "leaderrun-server-date"
    }

    fn read_before_deserialization(
        &self,
        context: &BeforeDeserializationInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let date = context.response().headers().get("date").and_then(parse_http_date);
        if date.is_some() {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = date;
        }
        Ok(())
    }
}

/// `err` and its sources in one line (never the request or its headers), without the runs of
/// blanks the SDK indents its lists with.
pub fn one_line(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let part = inner.to_string();
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = inner.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether a request failed for want of usable credentials (the SDK's words for it): none
/// anywhere in the chain, a profile that does not work, an instance metadata service or STS
/// that says no. Retrying cannot help. (A metadata service or STS that does not answer is an
/// outage, and is retried.)
pub fn is_missing_credentials(text: &str) -> bool {
    [
        "no credentials found",
        "credential provider was not enabled",
        "request forbidden",
        "AccessDenied",
        "InvalidIdentityToken",
        "ExpiredToken",
        "could not find source profile",
        "ProfileFile",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}
