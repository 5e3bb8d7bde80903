//! The S3 client, configured from where the AWS CLI looks: the AWS SDK's own loader.
//!
//! Credentials, in the SDK's (and the CLI's) order: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
//! / AWS_SESSION_TOKEN; AWS_PROFILE (or `default`) in ~/.aws/credentials and ~/.aws/config,
//! with its role_arn, credential_process and SSO entries; web identity (EKS:
//! AWS_WEB_IDENTITY_TOKEN_FILE + AWS_ROLE_ARN); ECS container credentials
//! (AWS_CONTAINER_CREDENTIALS_RELATIVE_URI or _FULL_URI); the instance metadata service
//! (IMDSv2). Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, IMDS; with none
//! found, us-east-1 (as the CLI's `aws s3` does). Endpoint: AWS_ENDPOINT_URL_S3,
//! AWS_ENDPOINT_URL, or the profile's `endpoint_url`.
//!
//! HTTPS goes through rustls with ring, like every other store: the SDK's default client
//! would bring aws-lc-rs, whose build needs cmake (and, elsewhere, NASM).

use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, ConfigLoader};
use aws_sdk_s3::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_s3::config::{
    ConfigBag, Intercept, Region, RequestChecksumCalculation, ResponseChecksumValidation, RuntimeComponents,
};
use aws_sdk_s3::error::BoxError;
use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};

use super::target::Target;

/// A connection that does not open within this is an outage (the elector retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One HTTP attempt that takes longer than this is abandoned (and retried once).
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// With no region configured anywhere: the CLI's choice for S3.
const FALLBACK_REGION: &str = "us-east-1";

/// The S3 client for `target`; `configure` may override what the loader finds (an
/// embedding program's own credentials or endpoint).
pub async fn client(target: &Target, configure: impl FnOnce(ConfigLoader) -> ConfigLoader) -> aws_sdk_s3::Client {
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
    let endpoint_given = shared.endpoint_url().is_some() || std::env::var_os("AWS_ENDPOINT_URL_S3").is_some();
    let mut config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(target.path_style.unwrap_or(endpoint_given))
        // Checksums only where S3 requires them: S3 look-alikes differ in which of the
        // newer checksum headers they accept, and the ETag already tells what was stored.
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(ResponseChecksumValidation::WhenRequired)
        .interceptor(RequestTrace);
    if shared.region().is_none() {
        config = config.region(Region::from_static(FALLBACK_REGION));
    }
    aws_sdk_s3::Client::from_conf(config.build())
}

/// One `store request` trace line per HTTP request the SDK sends (retries included), named
/// by its method: what `-vvv` counts, as every store's requests are counted.
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
        tracing::trace!(op = %context.request().method().to_ascii_lowercase(), "store request");
        Ok(())
    }
}
