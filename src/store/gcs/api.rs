//! The handful of Cloud Storage JSON API calls the store makes, over `store/google.rs`:
//! objects.get (metadata only), objects.insert as a multipart upload with preconditions,
//! objects.list, and objects.delete (only to clean up after the probe). Each answer comes
//! with the server's clock, its `Date` header.

use std::collections::HashMap;
use std::time::SystemTime;

use reqwest::{Method, Response};
use serde::Deserialize;

use super::errors::{failed, no_bucket, says_no_bucket, unanswered, unreadable, Operation};
use super::object::{multipart, path_segment, METADATA_KEY};
use crate::store::client_timed::server_clock::parse_http_date;
use crate::store::google::GoogleApi;
use crate::store::{Result, StoreError};

/// Object names per objects.list page (the API's most).
const PAGE: u32 = 1000;

/// The fields the store reads of an object (the rest is not sent by real Cloud Storage).
const OBJECT_FIELDS: &str = "name,generation,metageneration,metadata";

/// An int64 as the JSON API writes it (a string), or a number from a lenient server.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
enum Int64 {
    Text(#[serde(deserialize_with = "from_text")] u64),
    Number(u64),
}

fn from_text<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

impl Int64 {
    fn get(self) -> u64 {
        match self {
            Int64::Text(n) | Int64::Number(n) => n,
        }
    }
}

#[derive(Debug, Deserialize)]
struct ObjectResource {
    name: String,
    generation: Int64,
    metageneration: Int64,
    #[serde(default)]
    metadata: HashMap<String, String>,
}

/// An object's metadata, as far as the store cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object {
    pub name: String,
    pub generation: u64,
    pub metageneration: u64,
    /// The `leaderrun` custom metadata value: the record, as JSON.
    pub record: Option<String>,
}

impl From<ObjectResource> for Object {
    fn from(mut r: ObjectResource) -> Self {
        Object {
            name: r.name,
            generation: r.generation.get(),
            metageneration: r.metageneration.get(),
            record: r.metadata.remove(METADATA_KEY),
        }
    }
}

#[derive(Debug, Deserialize)]
struct ListPage {
    #[serde(default)]
    items: Vec<ObjectResource>,
    #[serde(default, rename = "nextPageToken")]
    next_page_token: Option<String>,
}

/// What a guarded upload did.
#[derive(Debug)]
pub enum Upload {
    Written(Object),
    /// 412: the precondition failed.
    Precondition,
    /// 404: no bucket (or, for some servers, no object at the generation asked for).
    NotFound,
}

/// The generation (and metageneration) an upload requires.
#[derive(Debug, Clone, Copy)]
pub struct Precondition {
    /// 0: no live object may exist.
    pub generation: u64,
    pub metageneration: Option<u64>,
}

/// One bucket, through one Google API client.
pub struct Bucket {
    pub api: GoogleApi,
    pub name: String,
}

fn server_time(response: &Response) -> Option<SystemTime> {
    response.headers().get(reqwest::header::DATE).and_then(|v| v.to_str().ok()).and_then(parse_http_date)
}

impl Bucket {
    fn object_url(&self, name: &str) -> String {
        format!("{}/storage/v1/b/{}/o/{}", self.api.base(), self.name, path_segment(name))
    }

    /// A request, authorized; a token that cannot be had is named with the bucket and call.
    async fn request(&self, operation: Operation<'_>, method: Method, url: &str) -> Result<reqwest::RequestBuilder> {
        self.api.request(method, url).await.map_err(|err| StoreError {
            message: format!("gs://{}: {} {}: {}", self.name, operation.method, operation.name, err.message),
            ..err
        })
    }

    async fn send(&self, operation: Operation<'_>, request: reqwest::RequestBuilder) -> Result<Response> {
        tracing::trace!(op = operation.method.trim_start_matches("objects."), "store request");
        request.send().await.map_err(|e| unanswered(&self.name, operation, e))
    }

    async fn text(&self, operation: Operation<'_>, response: Response) -> Result<String> {
        response
            .text()
            .await
            .map_err(|e| unreadable(&self.name, operation, crate::store::google::describe_send_error(e)))
    }

    fn json<T: serde::de::DeserializeOwned>(&self, operation: Operation<'_>, text: &str) -> Result<T> {
        serde_json::from_str(text).map_err(|e| unreadable(&self.name, operation, e))
    }

    /// objects.get (metadata): the object, or `None`; and the server's clock.
    pub async fn get(&self, name: &str) -> Result<(Option<Object>, Option<SystemTime>)> {
        let operation = Operation::get(name);
        let request =
            self.request(operation, Method::GET, &self.object_url(name)).await?.query(&[("fields", OBJECT_FIELDS)]);
        let response = self.send(operation, request).await?;
        let (status, date) = (response.status().as_u16(), server_time(&response));
        let text = self.text(operation, response).await?;
        match status {
            200 => Ok((Some(self.json::<ObjectResource>(operation, &text)?.into()), date)),
            404 if says_no_bucket(&text) => Err(no_bucket(&self.name, operation)),
            404 => Ok((None, date)),
            _ => Err(failed(&self.name, operation, status, &text)),
        }
    }

    /// objects.insert, as a multipart upload of `content` with `record` as the `leaderrun`
    /// custom metadata, if `precondition` holds. Also the server's clock.
    pub async fn upload(
        &self,
        name: &str,
        record: Option<&str>,
        content: &[u8],
        content_type: &str,
        precondition: Precondition,
    ) -> Result<(Upload, Option<SystemTime>)> {
        let operation = Operation::insert(name);
        let upload = multipart(name, record, content, content_type);
        let url = format!("{}/upload/storage/v1/b/{}/o", self.api.base(), self.name);
        let mut query = vec![
            ("uploadType", "multipart".to_string()),
            ("ifGenerationMatch", precondition.generation.to_string()),
            ("fields", OBJECT_FIELDS.to_string()),
        ];
        if let Some(metageneration) = precondition.metageneration {
            query.push(("ifMetagenerationMatch", metageneration.to_string()));
        }
        let request = self
            .request(operation, Method::POST, &url)
            .await?
            .query(&query)
            .header(reqwest::header::CONTENT_TYPE, upload.content_type)
            .body(upload.body);
        let response = self.send(operation, request).await?;
        let (status, date) = (response.status().as_u16(), server_time(&response));
        let text = self.text(operation, response).await?;
        let upload = match status {
            200 => Upload::Written(self.json::<ObjectResource>(operation, &text)?.into()),
            412 => Upload::Precondition,
            404 if says_no_bucket(&text) => return Err(no_bucket(&self.name, operation)),
            404 => Upload::NotFound,
            _ => return Err(failed(&self.name, operation, status, &text)),
        };
        Ok((upload, date))
    }

    /// objects.list under `prefix`, every page (at most `limit` objects if given): each
    /// object with its metadata, so with its record.
    pub async fn list(&self, prefix: &str, limit: Option<u32>) -> Result<Vec<Object>> {
        let operation = Operation::list(prefix);
        let url = format!("{}/storage/v1/b/{}/o", self.api.base(), self.name);
        let page_size = limit.unwrap_or(PAGE).min(PAGE).to_string();
        let fields = format!("items({OBJECT_FIELDS}),nextPageToken");
        let (mut objects, mut token) = (Vec::new(), None::<String>);
        loop {
            let mut query = vec![("prefix", prefix), ("maxResults", &page_size), ("fields", &fields)];
            if let Some(token) = &token {
                query.push(("pageToken", token));
            }
            let request = self.request(operation, Method::GET, &url).await?.query(&query);
            let response = self.send(operation, request).await?;
            let status = response.status().as_u16();
            let text = self.text(operation, response).await?;
            match status {
                200 => {}
                404 => return Err(no_bucket(&self.name, operation)),
                _ => return Err(failed(&self.name, operation, status, &text)),
            }
            let page: ListPage = self.json(operation, &text)?;
            objects.extend(page.items.into_iter().map(Object::from));
            token = page.next_page_token.filter(|t| !t.is_empty());
            if token.is_none() || limit.is_some_and(|l| objects.len() >= l as usize) {
                return Ok(objects);
            }
        }
    }

    /// objects.delete, unconditionally (only for the probe's stray object).
    pub async fn delete(&self, name: &str) -> Result<()> {
        let operation = Operation::delete(name);
        let request = self.request(operation, Method::DELETE, &self.object_url(name)).await?;
        let response = self.send(operation, request).await?;
        match response.status().as_u16() {
            200..=299 | 404 => Ok(()),
            status => Err(failed(&self.name, operation, status, &self.text(operation, response).await?)),
        }
    }
}
