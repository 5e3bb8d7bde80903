//! The Lease requests the store makes, one HTTP request each, through kube-rs' client
//! (which brings the kubeconfig's or the pod's credentials to every request).
//!
//! Raw requests rather than kube's typed `Api`: the core needs each answer's HTTP `Date`
//! header (the server's clock, for --min-hold keeps) and tells a lost race (409, 404) from
//! an error, which the typed API folds together.

use std::time::{Duration, SystemTime};

use futures_util::StreamExt;
use http::StatusCode;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::List;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use kube::client::Body;
use kube::core::Request;

use crate::store::{is_tls_refusal, Result, StoreError};

/// Bound on every request but a watch (the elector bounds its calls too, usually tighter).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The Leases of one namespace.
pub(super) struct LeaseApi {
    client: kube::Client,
    request: Request,
    namespace: String,
    /// "k8s store, namespace NS at https://server", for messages.
    shown: String,
}

/// A watch's events, as they come.
pub(super) type Events = std::pin::Pin<Box<dyn futures_util::Stream<Item = kube::Result<WatchEvent<Lease>>> + Send>>;

/// An answer and the server's clock when it gave it.
pub(super) struct Dated<T> {
    pub value: T,
    pub date: Option<SystemTime>,
}

/// A Lease list: its items and the list's resourceVersion.
pub(super) struct Listed {
    pub items: Vec<Lease>,
    pub resource_version: Option<String>,
}

impl LeaseApi {
    pub fn new(client: kube::Client, namespace: String, server: &str) -> Self {
        let request = Request::new(format!("/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"));
        let shown = format!("k8s store, namespace {namespace} at {server}");
        Self { client, request, namespace, shown }
    }

    /// The Lease, or `None` if there is none.
    pub async fn get(&self, name: &str) -> Result<Dated<Option<Lease>>> {
        let request = self.request.get(name, &Default::default()).map_err(|e| self.bad_request(e))?;
        let (status, date, body) = self.send("get", request).await?;
        let value = match status {
            StatusCode::NOT_FOUND => None,
            _ => Some(self.parse("get", status, &body)?),
        };
        Ok(Dated { value, date })
    }

    /// The Leases (only `name`, if given) and the list's resourceVersion.
    pub async fn list(&self, name: Option<&str>) -> Result<Dated<Listed>> {
        let mut params = ListParams::default();
        if let Some(name) = name {
            params = params.fields(&format!("metadata.name={name}"));
        }
        let request = self.request.list(&params).map_err(|e| self.bad_request(e))?;
        let (status, date, body) = self.send("list", request).await?;
        let list: List<Lease> = self.parse("list", status, &body)?;
        let value = Listed { items: list.items, resource_version: list.metadata.resource_version };
        Ok(Dated { value, date })
    }

    /// Create the Lease; `None` if one of its name exists.
    pub async fn create(&self, lease: &Lease) -> Result<Option<Lease>> {
        let data = serde_json::to_vec(lease).map_err(|e| self.bad_request(e))?;
        let request = self.request.create(&PostParams::default(), data).map_err(|e| self.bad_request(e))?;
        let (status, _, body) = self.send("create", request).await?;
        match status {
            StatusCode::CONFLICT => Ok(None),
            _ => self.parse("create", status, &body).map(Some),
        }
    }

    /// Replace the Lease, guarded by the resourceVersion and uid in its metadata; `None` if
    /// it moved on or is gone.
    pub async fn replace(&self, name: &str, lease: &Lease) -> Result<Option<Lease>> {
        let data = serde_json::to_vec(lease).map_err(|e| self.bad_request(e))?;
        let request = self.request.replace(name, &PostParams::default(), data).map_err(|e| self.bad_request(e))?;
        let (status, _, body) = self.send("update", request).await?;
        match status {
            // 409: another write since, or the uid precondition of a Lease deleted since.
            StatusCode::CONFLICT | StatusCode::NOT_FOUND => Ok(None),
            _ => self.parse("update", status, &body).map(Some),
        }
    }

    /// Watch the one Lease from `resource_version` (`None`: from now, its current state
    /// first) and return at the first event (a 410 Gone, which arrives as an event, too),
    /// or when the server ends the watch after `max_wait`.
    pub async fn watch_once(&self, name: &str, resource_version: Option<&str>, max_wait: Duration) -> Result<()> {
        let events = self.watch(name, resource_version.unwrap_or(""), max_wait).await?;
        match std::pin::pin!(events).next().await {
            Some(Err(e)) => Err(self.error("watch", e)),
            _ => Ok(()),
        }
    }

    /// The one Lease's events after `resource_version` ("": its current state first), until
    /// the server ends the watch after `max_wait` (whole seconds, at least 1). Opening it is
    /// bounded by REQUEST_TIMEOUT; the events are not.
    pub async fn watch(&self, name: &str, resource_version: &str, max_wait: Duration) -> Result<Events> {
        let seconds = u32::try_from(max_wait.as_secs().max(1)).unwrap_or(u32::MAX);
        let params =
            WatchParams::default().fields(&format!("metadata.name={name}")).timeout(seconds).disable_bookmarks();
        let request = self.request.watch(&params, resource_version).map_err(|e| self.bad_request(e))?;
        tracing::trace!(op = "watch", "store request");
        let opened = tokio::time::timeout(REQUEST_TIMEOUT, self.client.request_events::<Lease>(request)).await;
        let events = opened.map_err(|_| self.no_answer("watch"))?.map_err(|e| self.error("watch", e))?;
        Ok(Box::pin(events))
    }

    fn no_answer(&self, verb: &str) -> StoreError {
        StoreError::unavailable(format!("{}: no answer to {verb} within {}s", self.shown, REQUEST_TIMEOUT.as_secs()))
    }

    /// Send one request, bounded by REQUEST_TIMEOUT: its status, `Date` and body.
    async fn send(
        &self,
        verb: &str,
        request: http::Request<Vec<u8>>,
    ) -> Result<(StatusCode, Option<SystemTime>, Vec<u8>)> {
        tracing::trace!(op = verb, "store request");
        let exchange = async {
            let response = self.client.send(request.map(Body::from)).await.map_err(|e| self.error(verb, e))?;
            let status = response.status();
            let date = response.headers().get(http::header::DATE).and_then(|d| d.to_str().ok()).and_then(http_date);
            let body = response.into_body().collect_bytes().await.map_err(|e| self.error(verb, e))?;
            Ok((status, date, body.to_vec()))
        };
        match tokio::time::timeout(REQUEST_TIMEOUT, exchange).await {
            Ok(answer) => answer,
            Err(_) => Err(self.no_answer(verb)),
        }
    }

    /// A successful answer's body; any other answer as an error.
    fn parse<T: serde::de::DeserializeOwned>(&self, verb: &str, status: StatusCode, body: &[u8]) -> Result<T> {
        if !status.is_success() {
            return Err(self.refusal(verb, status, body));
        }
        serde_json::from_slice(body).map_err(|e| {
            StoreError::unavailable(format!("{}: {verb}: the API server's answer is not a Lease: {e}", self.shown))
        })
    }

    /// An error answer: 401, 403 and the other 4xx will not pass if retried (refused);
    /// 429 and 5xx may (unavailable).
    fn refusal(&self, verb: &str, status: StatusCode, body: &[u8]) -> StoreError {
        let message = serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|status| status["message"].as_str().map(one_line))
            .unwrap_or_else(|| status.canonical_reason().unwrap_or("").to_string());
        let code = status.as_u16();
        let shown = &self.shown;
        match status {
            StatusCode::UNAUTHORIZED => StoreError::refused(format!(
                "{shown}: the API server does not accept these credentials (401 Unauthorized): check the \
                 kubeconfig's user, or the pod's service account token"
            )),
            StatusCode::FORBIDDEN => StoreError::refused(format!(
                "{shown}: RBAC denies {verb} on leases.coordination.k8s.io in namespace {} (403 Forbidden: \
                 {message}); the Role needs get, list, watch, create and update on leases",
                self.namespace
            )),
            _ if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() => {
                StoreError::unavailable(format!("{shown}: {verb}: {code} {message}"))
            }
            _ => StoreError::refused(format!("{shown}: {verb}: {code} {message}")),
        }
    }

    /// A client error (no connection, TLS, credentials that could not be had).
    fn error(&self, verb: &str, error: kube::Error) -> StoreError {
        if let kube::Error::Api(status) = &error {
            let code = StatusCode::from_u16(status.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return self.refusal(verb, code, &serde_json::to_vec(&**status).unwrap_or_default());
        }
        let text = one_line(&chain(&error));
        let message = format!("{}: {verb}: {text}", self.shown);
        match error {
            kube::Error::Auth(_) => StoreError::refused(message),
            _ if is_tls_refusal(&text) => StoreError::refused(message),
            _ => StoreError::unavailable(message),
        }
    }

    fn bad_request(&self, error: impl std::fmt::Display) -> StoreError {
        StoreError::refused(format!("{}: cannot build the request: {error}", self.shown))
    }
}

/// An HTTP `Date` header (`Mon, 23 Nov 2026 07:50:06 GMT`) as a time.
fn http_date(text: &str) -> Option<SystemTime> {
    let parsed = k8s_openapi::jiff::fmt::rfc2822::DateTimeParser::new().parse_timestamp(text).ok()?;
    Some(SystemTime::from(parsed))
}

/// An error and its causes, `: `-separated (kube's own Display leaves the causes out).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text
}

/// Messages are one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates() {
        let at = http_date("Mon, 23 Nov 2026 07:50:06 GMT").unwrap();
        assert_eq!(at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs(), 1_795_420_206);
        assert_eq!(http_date("yesterday"), None);
    }
}
