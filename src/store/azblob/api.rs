//! The few Blob service REST calls the store makes, over reqwest (rustls with the process's
//! ring provider), each authorized with Shared Key or a SAS (`credentials.rs`). Each answer
//! comes with the server's clock, its `Date` header.
//!
//! Shared Key: the request's canonical form (verb, the standard headers, every `x-ms-`
//! header sorted, `/ACCOUNT/PATH` and the sorted query) signed with HMAC-SHA256 under the
//! account key (ring's), in `Authorization: SharedKey ACCOUNT:SIGNATURE`.
//!
//! Nothing here shows a URL: a SAS is in every URL's query. Failures are told by the
//! operation, the blob's name, the HTTP status and Azure's error code (`errors.rs`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};

use super::credentials::{Account, Auth};
use crate::store::client_timed::server_clock::parse_http_date;
use crate::store::{Result, StoreError};

/// The REST API version asked for (Azurite runs with --skipApiVersionCheck in the tests).
const API_VERSION: &str = "2023-11-03";
/// A connection that does not open within this is an outage (the elector retries).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// One request that takes longer is abandoned: a renewal must not spend its lease on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer: its status, headers and body, and the server's clock.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
    pub date: Option<SystemTime>,
}

impl Answer {
    /// A header's value as text ("" if absent).
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or_default()
    }

    /// Azure's error code (`x-ms-error-code`, which HEAD answers carry too).
    pub fn code(&self) -> &str {
        self.header("x-ms-error-code")
    }

    /// The blob's metadata (`x-ms-meta-NAME`), names lower-cased.
    pub fn metadata(&self) -> BTreeMap<String, String> {
        let mut metadata = BTreeMap::new();
        for (name, value) in &self.headers {
            if let (Some(name), Ok(value)) = (name.as_str().strip_prefix("x-ms-meta-"), value.to_str()) {
                metadata.insert(name.to_string(), value.to_string());
            }
        }
        metadata
    }
}

/// One account's blob endpoint.
pub struct Api {
    http: reqwest::Client,
    account: Account,
    /// The endpoint's own path (Azurite's `/devstoreaccount1`), without a trailing `/`.
    base_path: String,
}

impl Api {
    pub fn new(account: Account) -> Result<Self> {
        // reqwest (`rustls-no-provider`) panics without a process-wide provider: choose ring, as
        // the registry does when it parses a URL, for the callers that build one without it.
        crate::store::tls::choose_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| StoreError::refused(format!("Azure Blob: cannot set up HTTPS: {e}")))?;
        let base_path = reqwest::Url::parse(&account.endpoint)
            .map_err(|_| StoreError::refused(format!("Azure Blob: {} names no valid BlobEndpoint", account.source)))?
            .path()
            .trim_end_matches('/')
            .to_string();
        Ok(Self { http, account, base_path })
    }

    /// Which variable the credentials came from, for messages.
    pub fn source(&self) -> &'static str {
        self.account.source
    }

    /// Send `method` to `path` (below the endpoint, already percent-encoded) with `query`
    /// (decoded values) and `headers`. `Err` only when no answer came (an outage).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, String)],
    ) -> std::result::Result<Answer, String> {
        let mut url = format!("{}{path}", self.account.endpoint);
        let mut pairs: Vec<String> = query.iter().map(|(k, v)| format!("{k}={}", encode_query(v))).collect();
        if let Auth::Sas(sas) = &self.account.auth {
            pairs.push(sas.clone());
        }
        if !pairs.is_empty() {
            url.push('?');
            url.push_str(&pairs.join("&"));
        }
        let mut map = HeaderMap::new();
        let now = httpdate::fmt_http_date(SystemTime::now());
        let mut all: Vec<(&str, String)> = vec![("x-ms-date", now), ("x-ms-version", API_VERSION.into())];
        all.extend(headers.iter().cloned());
        for (name, value) in &all {
            let value = HeaderValue::from_str(value).map_err(|_| format!("a header value for {name} is not ASCII"))?;
            map.insert(HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?, value);
        }
        if let Auth::Key(key) = &self.account.auth {
            let signed = self.string_to_sign(&method, path, query, &all);
            let signature = sign(key, &signed);
            let value = format!("SharedKey {}:{signature}", self.account.name);
            map.insert(reqwest::header::AUTHORIZATION, HeaderValue::from_str(&value).map_err(|e| e.to_string())?);
        }
        if method == Method::PUT {
            map.insert(reqwest::header::CONTENT_LENGTH, HeaderValue::from_static("0"));
        }
        let response = self.http.request(method, &url).headers(map).send().await.map_err(describe)?;
        let (status, headers) = (response.status(), response.headers().clone());
        let date = headers.get(reqwest::header::DATE).and_then(|v| v.to_str().ok()).and_then(parse_http_date);
        let body = response.text().await.map_err(describe)?;
        Ok(Answer { status, headers, body, date })
    }

    /// The string Shared Key signs (the Blob service's form since version 2015-02-21).
    fn string_to_sign(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, &str)],
        headers: &[(&str, String)],
    ) -> String {
        let header = |name: &str| {
            headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).unwrap_or_default()
        };
        let mut text = format!("{method}\n");
        for name in ["content-encoding", "content-language"] {
            text.push_str(header(name));
            text.push('\n');
        }
        // Content-Length: empty when zero.
        text.push('\n');
        for name in [
            "content-md5",
            "content-type",
            "date",
            "if-modified-since",
            "if-match",
            "if-none-match",
            "if-unmodified-since",
            "range",
        ] {
            text.push_str(header(name));
            text.push('\n');
        }
        let mut ms: Vec<(String, &str)> = headers
            .iter()
            .filter(|(n, _)| n.to_ascii_lowercase().starts_with("x-ms-"))
            .map(|(n, v)| (n.to_ascii_lowercase(), v.trim()))
            .collect();
        ms.sort();
        for (name, value) in ms {
            text.push_str(&format!("{name}:{value}\n"));
        }
        // The path as sent (encoded), after the account; then the query, sorted, decoded.
        text.push_str(&format!("/{}{}{path}", self.account.name, self.base_path));
        let mut params: Vec<(String, &str)> = query.iter().map(|(k, v)| (k.to_ascii_lowercase(), *v)).collect();
        params.sort();
        for (name, value) in params {
            text.push_str(&format!("\n{name}:{value}"));
        }
        text
    }
}

/// HMAC-SHA256 of `text` under `key`, in base64.
fn sign(key: &[u8], text: &str) -> String {
    use base64::Engine;
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    base64::engine::general_purpose::STANDARD.encode(ring::hmac::sign(&key, text.as_bytes()).as_ref())
}

/// A blob's or container's path segment: everything but unreserved characters and `/`
/// percent-encoded (UTF-8), as it is sent and signed.
pub fn encode_path(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

fn encode_query(value: &str) -> String {
    encode_path(value).replace('/', "%2F")
}

/// Why no answer came, without the URL (a SAS is in its query).
fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    if error.is_timeout() {
        return format!("no answer within {}s", REQUEST_TIMEOUT.as_secs());
    }
    let mut text = if error.is_connect() { "cannot connect".to_string() } else { error.to_string() };
    let mut source = std::error::Error::source(&error);
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_encoded_as_sent() {
        assert_eq!(encode_path("leaderrun/a b%25é"), "leaderrun/a%20b%2525%C3%A9");
        assert_eq!(encode_query("leaderrun/"), "leaderrun%2F");
    }

    /// The string to sign of a lease request, as Azure documents its parts.
    #[test]
    fn the_string_to_sign() {
        let account = Account {
            name: "devstoreaccount1".into(),
            endpoint: "http://127.0.0.1:10000/devstoreaccount1".into(),
            auth: Auth::Key(vec![1, 2, 3]),
            source: "test",
        };
        let api = Api::new(account).unwrap();
        let headers = [
            ("x-ms-date", "Sun, 06 Nov 1994 08:49:37 GMT".to_string()),
            ("x-ms-version", API_VERSION.to_string()),
            ("x-ms-lease-action", "acquire".to_string()),
            ("If-None-Match", "*".to_string()),
        ];
        let text = api.string_to_sign(&Method::PUT, "/locks/leaderrun/a", &[("comp", "lease")], &headers);
        let expected =
            "PUT\n\n\n\n\n\n\n\n\n*\n\n\nx-ms-date:Sun, 06 Nov 1994 08:49:37 GMT\nx-ms-lease-action:acquire\n\
                        x-ms-version:2023-11-03\n/devstoreaccount1/devstoreaccount1/locks/leaderrun/a\ncomp:lease";
        assert_eq!(text, expected);
    }
}
