//! The calls on one container's blobs, each told apart by what its answer means for
//! leaderrun: the expected refusals (a lease someone else holds, a blob that is not there)
//! come back as values; anything else is an outage (try again) or a refusal (exit 69), in
//! one line naming the container, the operation and the blob, with Azure's error code.
//! Messages never carry a key, a SAS, a signature or a URL.

use std::time::SystemTime;

use reqwest::Method;

use super::api::{encode_path, Answer, Api};
use super::list::{self, Page};
use super::record::{LeaseState, Meta};
use crate::store::{Result, StoreError};

/// Blobs listed per page (the service's most).
const PAGE: &str = "5000";

/// A blob's lease state, metadata and ETag, and the server's clock when read.
pub struct Properties {
    pub lease: LeaseState,
    pub meta: Meta,
    pub etag: String,
    pub date: Option<SystemTime>,
}

/// What a metadata write answered: the server's clock, and the blob's new ETag.
pub struct Written {
    pub date: Option<SystemTime>,
    pub etag: String,
}

/// What a lease request did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// Done; with the server's clock.
    Done(Option<SystemTime>),
    /// 409: someone else's lease, no lease, or one that is breaking or broken.
    Conflict,
    /// 404: no such blob.
    NoBlob,
}

/// One container, through one account's API.
pub struct Container {
    pub api: Api,
    pub name: String,
    /// `azblob://ACCOUNT/CONTAINER/PREFIX`, for messages.
    pub shown: String,
}

impl Container {
    fn path(&self, blob: &str) -> String {
        format!("/{}/{}", self.name, encode_path(blob))
    }

    async fn send(
        &self,
        op: &str,
        blob: &str,
        method: Method,
        path: String,
        query: &[(&str, &str)],
        headers: &[(&str, String)],
    ) -> Result<Answer> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        self.api
            .send(method, &path, query, headers)
            .await
            .map_err(|why| StoreError::unavailable(format!("{}: {op} {blob}: {why}", self.shown)))
    }

    /// The error for an answer no caller expects.
    pub fn failed(&self, op: &str, blob: &str, answer: &Answer) -> StoreError {
        let code = answer.code();
        let status = answer.status.as_u16();
        let mut what = format!("{}: {op} {blob}: HTTP {status}", self.shown);
        if !code.is_empty() {
            what.push(' ');
            what.push_str(code);
        }
        match (status, code) {
            (404, "ContainerNotFound") => self.no_container(),
            // The message of a refused signature quotes the signature: show the code only.
            (403, _) => StoreError::refused(format!(
                "{what}: the server refused the credentials from {} (a wrong key, an expired SAS, or no \
                 permission)",
                self.api.source()
            )),
            (408 | 429 | 500..=599, _) => StoreError::unavailable(what),
            _ => {
                if let Some(message) = message(&answer.body) {
                    what.push_str(": ");
                    what.push_str(&message);
                }
                StoreError::refused(what)
            }
        }
    }

    /// A missing container: a refusal that names it (leaderrun never creates one).
    pub fn no_container(&self) -> StoreError {
        StoreError::refused(format!(
            "{}: the container {:?} does not exist (leaderrun creates blobs only: create it, e.g. `az storage \
             container create --name {}`)",
            self.shown, self.name, self.name
        ))
    }

    /// Get Blob Properties: `None` if there is no such blob.
    pub async fn properties(&self, blob: &str) -> Result<(Option<Properties>, Option<SystemTime>)> {
        let answer = self.send("GetBlobProperties", blob, Method::HEAD, self.path(blob), &[], &[]).await?;
        match (answer.status.as_u16(), answer.code()) {
            (200, _) => {
                let lease = LeaseState::parse(answer.header("x-ms-lease-state"));
                let (meta, etag) = (Meta::parse(&answer.metadata()), answer.header("etag").to_string());
                let properties = Properties { lease, meta, etag, date: answer.date };
                Ok((Some(properties), answer.date))
            }
            // A HEAD answer has no body, only the code: a blob's 404 without one is a blob's.
            (404, "BlobNotFound" | "") => Ok((None, answer.date)),
            _ => Err(self.failed("GetBlobProperties", blob, &answer)),
        }
    }

    /// Put Blob of an empty block blob, if none exists (`If-None-Match: *`). Whether it was
    /// created now; a blob that exists, leased or not, is no error.
    pub async fn create(&self, blob: &str) -> Result<bool> {
        let headers = [("x-ms-blob-type", "BlockBlob".to_string()), ("If-None-Match", "*".to_string())];
        let answer = self.send("PutBlob", blob, Method::PUT, self.path(blob), &[], &headers).await?;
        match answer.status.as_u16() {
            201 => Ok(true),
            409 | 412 => Ok(false),
            _ => Err(self.failed("PutBlob", blob, &answer)),
        }
    }

    /// A lease action (`acquire`, `renew`, `release`, `break`) with its headers.
    pub async fn lease(&self, blob: &str, action: &str, headers: &[(&str, String)]) -> Result<LeaseAnswer> {
        let mut all = vec![("x-ms-lease-action", action.to_string())];
        all.extend(headers.iter().cloned());
        let op = format!("LeaseBlob ({action})");
        let answer = self.send(&op, blob, Method::PUT, self.path(blob), &[("comp", "lease")], &all).await?;
        match (answer.status.as_u16(), answer.code()) {
            (200..=202, _) => Ok(LeaseAnswer::Done(answer.date)),
            (409, _) => Ok(LeaseAnswer::Conflict),
            (404, "BlobNotFound") => Ok(LeaseAnswer::NoBlob),
            _ => Err(self.failed(&op, blob, &answer)),
        }
    }

    /// Set Blob Metadata under `lease`, and only over the blob's ETag `if_match` if given:
    /// `Ok(None)` if the lease is not (or no longer) the blob's, the ETag has moved, or the
    /// blob is gone.
    pub async fn set_metadata(
        &self,
        blob: &str,
        lease: &str,
        meta: &Meta,
        if_match: Option<&str>,
    ) -> Result<Option<Written>> {
        let mut headers: Vec<(String, String)> = meta.headers();
        headers.push(("x-ms-lease-id".into(), lease.to_string()));
        if let Some(etag) = if_match {
            headers.push(("If-Match".into(), etag.to_string()));
        }
        let headers: Vec<(&str, String)> = headers.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        let query = [("comp", "metadata")];
        let answer = self.send("SetBlobMetadata", blob, Method::PUT, self.path(blob), &query, &headers).await?;
        match (answer.status.as_u16(), answer.code()) {
            (200, _) => Ok(Some(Written { date: answer.date, etag: answer.header("etag").to_string() })),
            (409 | 412, _) | (404, "BlobNotFound") => Ok(None),
            _ => Err(self.failed("SetBlobMetadata", blob, &answer)),
        }
    }

    /// One page of List Blobs under `prefix`, with metadata; and the server's clock.
    pub async fn list(&self, prefix: &str, marker: Option<&str>) -> Result<(Page, Option<SystemTime>)> {
        let mut query = vec![("restype", "container"), ("comp", "list"), ("prefix", prefix), ("include", "metadata")];
        query.push(("maxresults", PAGE));
        if let Some(marker) = marker {
            query.push(("marker", marker));
        }
        let path = format!("/{}", self.name);
        let answer = self.send("ListBlobs", prefix, Method::GET, path, &query, &[]).await?;
        if answer.status.as_u16() != 200 {
            return Err(self.failed("ListBlobs", prefix, &answer));
        }
        let page = list::parse(&answer.body).map_err(|why| {
            StoreError::unavailable(format!("{}: ListBlobs {prefix}: the answer could not be read: {why}", self.shown))
        })?;
        Ok((page, answer.date))
    }

    /// Delete Blob, unconditionally (an operator's tool would; no run does).
    pub async fn delete(&self, blob: &str) -> Result<()> {
        let answer = self.send("DeleteBlob", blob, Method::DELETE, self.path(blob), &[], &[]).await?;
        match answer.status.as_u16() {
            202 | 404 => Ok(()),
            _ => Err(self.failed("DeleteBlob", blob, &answer)),
        }
    }

    /// Whether the container exists, and the server takes the credentials, before a run
    /// campaigns: Get Blob Properties of `blob`, a name no lock has. A blob's own call, since a
    /// container SAS or a user delegation SAS may not read the container's properties: its
    /// BlobNotFound proves the container is there.
    pub async fn check_container(&self, blob: &str) -> Result<()> {
        let answer = self.send("GetBlobProperties", blob, Method::HEAD, self.path(blob), &[], &[]).await?;
        match (answer.status.as_u16(), answer.code()) {
            (200, _) | (404, "BlobNotFound") => Ok(()),
            // Anything else a 404 says (ContainerNotFound, or no code) proves no container.
            (404, _) => Err(self.no_container()),
            _ => Err(self.failed("GetBlobProperties", blob, &answer)),
        }
    }

    /// Create Container (for the tests and for embedders; a run never creates one). Whether it
    /// was created now.
    pub async fn create_container(&self) -> Result<bool> {
        let path = format!("/{}", self.name);
        let answer = self.send("CreateContainer", "", Method::PUT, path, &[("restype", "container")], &[]).await?;
        match answer.status.as_u16() {
            201 => Ok(true),
            409 => Ok(false),
            _ => Err(self.failed("CreateContainer", "", &answer)),
        }
    }
}

/// The first line of Azure's `<Message>` (it adds a RequestId and Time on lines of their own).
fn message(body: &str) -> Option<String> {
    let start = body.find("<Message>")? + "<Message>".len();
    let end = body[start..].find("</Message>")? + start;
    let text = body[start..end].lines().next()?.trim();
    (!text.is_empty()).then(|| text.chars().take(300).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_first_line_of_the_message() {
        let body = "<?xml version=\"1.0\"?><Error><Code>InvalidHeaderValue</Code><Message>The value for one of \
                    the HTTP headers is not in the correct format.\nRequestId:abc\nTime:x</Message></Error>";
        assert_eq!(
            super::message(body).as_deref(),
            Some("The value for one of the HTTP headers is not in the correct format.")
        );
        assert_eq!(super::message("<Error/>"), None);
    }
}
