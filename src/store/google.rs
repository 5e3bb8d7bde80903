//! What the Google stores (Cloud Storage, Datastore) share: where the API is and how a
//! request is authorized, found the way Google's own client libraries find them.
//!
//! - An emulator: `STORAGE_EMULATOR_HOST` (`http://host:port`, or `host:port`) for Cloud
//!   Storage, `DATASTORE_EMULATOR_HOST` (`host:port`, plain HTTP) for Datastore. Requests
//!   then carry no credentials, and nothing asks the metadata server.
//! - Otherwise Application Default Credentials, through Google's `google-cloud-auth`:
//!   `GOOGLE_APPLICATION_CREDENTIALS` (a service-account key, an authorized-user file from
//!   `gcloud auth application-default login`, an impersonated or external account), then
//!   gcloud's `application_default_credentials.json`, then the metadata server (GCE, GKE
//!   workload identity, Cloud Run). It caches the access token and refreshes it before it
//!   expires.
//!
//! Both go through reqwest with rustls and the process's ring provider (no aws-lc-rs, no
//! OpenSSL). No message built here carries a token or key material: a credentials failure
//! is described by its kind and the library's own text, which names files, not contents.

use std::time::Duration;

use google_cloud_auth::credentials::{Builder, CacheableResource, Credentials};
use reqwest::header::HeaderMap;

use super::{Result, StoreError};

/// A connection that does not open within this is an outage (the elector retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One request that takes longer than this is abandoned: a renewal must not spend its
/// lease waiting on one slow answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Which Google API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    Storage,
    Datastore,
}

impl Service {
    fn emulator_variable(self) -> &'static str {
        match self {
            Service::Storage => "STORAGE_EMULATOR_HOST",
            Service::Datastore => "DATASTORE_EMULATOR_HOST",
        }
    }

    fn production_base(self) -> &'static str {
        match self {
            Service::Storage => "https://storage.googleapis.com",
            Service::Datastore => "https://datastore.googleapis.com",
        }
    }

    /// The narrowest OAuth scope that lets the store read and write its records.
    fn scope(self) -> &'static str {
        match self {
            Service::Storage => "https://www.googleapis.com/auth/devstorage.read_write",
            Service::Datastore => "https://www.googleapis.com/auth/datastore",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Service::Storage => "Cloud Storage",
            Service::Datastore => "Datastore",
        }
    }
}

/// One Google API endpoint and the credentials its requests carry.
pub struct GoogleApi {
    http: reqwest::Client,
    base: String,
    /// `None` against an emulator.
    credentials: Option<Credentials>,
    service: Service,
}

impl GoogleApi {
    /// The API for `service`: its emulator if the environment names one, else Google's
    /// endpoint with Application Default Credentials. A credentials file that is missing or
    /// does not parse is a refusal (exit 69); fetching a token happens per request.
    pub fn open(service: Service) -> Result<Self> {
        if let Some(host) = std::env::var(service.emulator_variable()).ok().filter(|h| !h.is_empty()) {
            return Self::emulator(service, &host);
        }
        let http = http_client(service)?;
        let credentials = Builder::default().with_scopes([service.scope()]).build().map_err(|e| {
            StoreError::refused(format!(
                "{}: no usable Google credentials ({e}); set GOOGLE_APPLICATION_CREDENTIALS, run \
                 `gcloud auth application-default login`, or run where a metadata server answers",
                service.name()
            ))
        })?;
        Ok(Self { http, base: service.production_base().to_string(), credentials: Some(credentials), service })
    }

    /// The API for `service` served by the emulator at `host` (`host:port` or a URL), as if
    /// its `*_EMULATOR_HOST` variable named it: for tests that run several emulators in one
    /// process, and for programs that embed leaderrun.
    pub fn emulator(service: Service, host: &str) -> Result<Self> {
        Ok(Self { http: http_client(service)?, base: emulator_base(host), credentials: None, service })
    }

    /// The API's base URL, without a trailing slash (`https://storage.googleapis.com`, or
    /// the emulator's `http://127.0.0.1:PORT`).
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Whether requests go to an emulator (no credentials, no server clock on some).
    pub fn is_emulator(&self) -> bool {
        self.credentials.is_none()
    }

    /// A request to `url`, authorized. A token that cannot be had now (the metadata server
    /// or the token endpoint did not answer) is an outage; one refused for good (a revoked
    /// key) is a refusal.
    pub async fn request(&self, method: reqwest::Method, url: &str) -> Result<reqwest::RequestBuilder> {
        let request = self.http.request(method, url);
        match &self.credentials {
            None => Ok(request),
            Some(credentials) => Ok(request.headers(self.auth_headers(credentials).await?)),
        }
    }

    async fn auth_headers(&self, credentials: &Credentials) -> Result<HeaderMap> {
        match credentials.headers(Default::default()).await {
            Ok(CacheableResource::New { data, .. }) => Ok(data),
            // Only returned when the caller passes an entity tag, which this never does.
            Ok(CacheableResource::NotModified) => {
                Err(StoreError::unavailable(format!("{}: credentials returned no headers", self.service.name())))
            }
            Err(e) if e.is_transient() => {
                Err(StoreError::unavailable(format!("{}: cannot get an access token: {e}", self.service.name())))
            }
            Err(e) => Err(StoreError::refused(format!("{}: credentials refused: {e}", self.service.name()))),
        }
    }
}

fn http_client(service: Service) -> Result<reqwest::Client> {
    // reqwest (`rustls-no-provider`) panics without a process-wide provider: choose ring, as
    // the registry does when it parses a URL, for the callers that build an API without it (tests, embedders).
    super::tls::choose_crypto_provider();
    reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .map_err(|e| StoreError::refused(format!("{}: cannot set up HTTPS: {e}", service.name())))
}

/// The base URL of an emulator named by `*_EMULATOR_HOST`: Google's libraries accept it
/// with or without a scheme, and speak plain HTTP when there is none.
fn emulator_base(host: &str) -> String {
    let host = host.trim_end_matches('/');
    if host.starts_with("http://") || host.starts_with("https://") {
        host.to_string()
    } else {
        format!("http://{host}")
    }
}

/// Describe a failed request without its URL's query or any header: reqwest's text of a
/// timeout or a refused connection, which names the host only.
pub fn describe_send_error(error: reqwest::Error) -> String {
    let error = error.without_url();
    if error.is_timeout() {
        format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())
    } else if error.is_connect() {
        format!("cannot connect: {}", source_text(&error))
    } else {
        source_text(&error)
    }
}

fn source_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_emulator_host_without_a_scheme_is_plain_http() {
        assert_eq!(emulator_base("127.0.0.1:8081"), "http://127.0.0.1:8081");
        assert_eq!(emulator_base("http://127.0.0.1:4443/"), "http://127.0.0.1:4443");
        assert_eq!(emulator_base("https://gcs.test"), "https://gcs.test");
    }
}
