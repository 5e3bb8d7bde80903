//! The S3 client: the AWS stores' loader (`store/aws.rs`: credentials, HTTPS and timeouts as
//! there), with S3's own choices. Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's
//! `region`, IMDS; with none found, us-east-1 (as the CLI's `aws s3` does). Endpoint:
//! AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, or the profile's `endpoint_url`; path-style
//! addressing when one is given.

use aws_config::ConfigLoader;
use aws_sdk_s3::config::{Region, RequestChecksumCalculation, ResponseChecksumValidation};

use super::target::Target;
use crate::store::aws::{self, RequestTrace};

/// With no region configured anywhere: the CLI's choice for S3.
const FALLBACK_REGION: &str = "us-east-1";

/// The S3 client for `target`; `configure` may override what the loader finds (an
/// embedding program's own credentials or endpoint).
pub async fn client(target: &Target, configure: impl FnOnce(ConfigLoader) -> ConfigLoader) -> aws_sdk_s3::Client {
    let shared = aws::load(configure).await;
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
