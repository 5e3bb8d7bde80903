//! The DynamoDB client: the AWS stores' loader (`store/aws.rs`: credentials, HTTPS and
//! timeouts as there). Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, IMDS;
//! with none found the store is refused, as the CLI refuses `aws dynamodb` (a table lives in
//! one region: guessing one would only say "no such table"). Endpoint:
//! AWS_ENDPOINT_URL_DYNAMODB, AWS_ENDPOINT_URL, or the profile's `endpoint_url`.

use aws_config::ConfigLoader;

use crate::store::aws::{self, RequestTrace};

/// The DynamoDB client; `configure` may override what the loader finds (an embedding
/// program's own credentials or endpoint). Also the region, if one was found anywhere.
pub async fn client(
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> (aws_sdk_dynamodb::Client, Option<String>) {
    let shared = aws::load(configure).await;
    let region = shared.region().map(|r| r.to_string());
    let config = aws_sdk_dynamodb::config::Builder::from(&shared).interceptor(RequestTrace).build();
    (aws_sdk_dynamodb::Client::from_conf(config), region)
}
