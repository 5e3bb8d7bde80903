//! The DynamoDB client, configured from where the AWS CLI looks: the AWS SDK's own loader,
//! as for the s3 store.
//!
//! Credentials, in the SDK's (and the CLI's) order: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
//! / AWS_SESSION_TOKEN; AWS_PROFILE (or `default`) in ~/.aws/credentials and ~/.aws/config,
//! with its role_arn, credential_process and SSO entries; web identity (EKS); ECS container
//! credentials; the instance metadata service (IMDSv2). Region: AWS_REGION,
//! AWS_DEFAULT_REGION, the profile's `region`, IMDS; with none found the store is refused, as
//! the CLI refuses `aws dynamodb` (a table lives in one region: guessing one would only say
//! "no such table"). Endpoint: AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, or the profile's
//! `endpoint_url`.
//!
//! HTTPS goes through rustls with ring, like every other store: the SDK's default client
//! would bring aws-lc-rs, whose build needs cmake.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader};
use aws_sdk_dynamodb::config::interceptors::{
    BeforeDeserializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use crate::store::client_timed::server_clock::parse_http_date;

/// A connection that does not open within this is an outage (the elector retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One HTTP attempt that takes longer than this is abandoned (and retried once).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// The DynamoDB client; `configure` may override what the loader finds (an embedding
/// program's own credentials or endpoint). Also the region, if one was found anywhere.
pub async fn client(
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> (aws_sdk_dynamodb::Client, Option<String>) {
    let https = aws_smithy_http_client::Builder::new().tls_provider(Provider::Rustls(CryptoMode::Ring)).build_https();
    let timeouts =
        TimeoutConfig::builder().connect_timeout(CONNECT_TIMEOUT).operation_attempt_timeout(ATTEMPT_TIMEOUT).build();
    let loader = aws_config::defaults(BehaviorVersion::latest())
        .http_client(https)
        .timeout_config(timeouts)
        // One retry: the elector retries on its own schedule, and a renewal must not spend
        // its lease in the SDK's backoff.
        .retry_config(RetryConfig::standard().with_max_attempts(2));
    let shared = configure(loader).load().await;
    let region = shared.region().map(|r| r.to_string());
    let config = aws_sdk_dynamodb::config::Builder::from(&shared).interceptor(RequestTrace).build();
    (aws_sdk_dynamodb::Client::from_conf(config), region)
}

/// One `store request` trace line per HTTP request the SDK sends (retries included), named
/// by its operation: what `-vvv` counts, as every store's requests are counted.
#[derive(Debug)]
struct RequestTrace;

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
        // DynamoDB names the operation in a header (`DynamoDB_20120810.GetItem`); every
        // request is a POST.
        let target = context.request().headers().get("x-amz-target").unwrap_or_default();
        let op = target.rsplit('.').next().unwrap_or_default().to_ascii_lowercase();
        tracing::trace!(op = %op, "store request");
        Ok(())
    }
}

/// Records the `Date` header of one request's response (whatever its status), for the
/// request it is attached to with `.customize().interceptor(..)`: the server's clock, from
/// which fencing tokens get their floor.
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
