//! S3 store: `--store s3://BUCKET[/PREFIX]`, one object per lock (`object.rs`), with no
//! server-side expiry: the client-timed core judges every lease on this host's clock, and
//! this file only reads and writes objects.
//!
//! - read: GetObject (404: no record). The version is the object's ETag (with the body's
//!   write counter, which the next write increments); the server's clock is the response's
//!   `Date`, the token floor comes from it (`client_timed/server_clock.rs`).
//! - create: PutObject with `If-None-Match: *` (412: someone else created it first). A PUT
//!   that landed in a later second than its read (a slow network, a paused host, an SDK
//!   retry) has its token raised by the core from that second; and the core counts a token
//!   from the next second's floor only once the server's clock has left the second it was
//!   written in (`counts`: it reads until then, at most a second), so that tokens outlive a
//!   deleted object (`client_timed/server_clock.rs`); an object that changed or vanished
//!   meanwhile is a lost race.
//! - replace: PutObject with `If-Match: ETAG` (412: it changed; 404: it was deleted).
//! - list: ListObjectsV2 under the prefix, then GetObject of each lock's object.
//! - waiting: S3 cannot watch, so a standby's core reads the object every 1 to 1.5 s
//!   (`client_timed/polls.rs`) and judges what each read shows: at most 3,600 GetObjects
//!   an hour per waiting process, and nothing more when the holder renews.
//!
//! Deleting a lock's object frees the lock at once (a holder sees it at its next renewal
//! and stops its child), as `kubectl delete lease` does. AWS's 409
//! ConditionalRequestConflict (two conditional writes of one key at once) counts as a lost
//! race like a 412.
//!
//! A run first checks that the server honours both preconditions (`probe.rs`). A 403 (bad
//! key or signature, no permission) and a missing bucket are refusals (exit 69), in one line
//! naming the bucket and the operation; messages never carry a credential: they are built
//! from the bucket, the key, the HTTP status and S3's error code and message.

mod credentials;
mod errors;
mod kind;
mod object;
mod probe;
mod target;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
pub use aws_config::ConfigLoader;
use aws_sdk_s3::primitives::ByteStream;
pub use kind::KIND;

pub use target::Target;

use self::errors::{classify, Failure};
use self::object::{key_of, lock_of, Body};
use crate::store::aws::DateHeader;
use crate::store::client_timed::server_clock::{create_floor, floor, token_counts};
use crate::store::client_timed::{client_timed, Created, Found, Read, Record, Records, Version, Written};
use crate::store::Access;
use crate::store::{Result, Store, StoreError};

/// How often a waiting standby reads the object (`Records::poll_every`: 1 to 1.5 × this).
const POLL_EVERY: Duration = Duration::from_secs(1);
/// Objects listed per ListObjectsV2 page.
const PAGE: i32 = 1000;

/// The S3 store for `target`: the client-timed core over this bucket's objects.
pub async fn open(target: &Target, access: Access) -> Result<Box<dyn Store>> {
    open_with(target, access, |loader| loader).await
}

/// `open`, with `configure` overriding what the AWS SDK's loader finds (for a program that
/// embeds leaderrun with credentials or an endpoint of its own, and for tests).
pub async fn open_with(
    target: &Target,
    access: Access,
    configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
) -> Result<Box<dyn Store>> {
    let records = S3Records::open_with(target, access, configure).await?;
    Ok(client_timed(Arc::new(records)))
}

/// One bucket's lock objects under one prefix.
pub struct S3Records {
    client: aws_sdk_s3::Client,
    bucket: String,
    prefix: String,
}

/// A version as this store writes it: the ETag, and the body's write counter (which the
/// ETag already implies; it rides along so a replace need not read the body again).
fn version(etag: &str, writes: u64) -> Version {
    Version(format!("{writes} {etag}"))
}

fn parse_version(version: &Version) -> (u64, &str) {
    let (writes, etag) = version.0.split_once(' ').unwrap_or(("0", &version.0));
    (writes.parse().unwrap_or(0), etag)
}

impl S3Records {
    /// A client of `target`'s bucket; a run (`Access::Create`) first checks that the server
    /// honours conditional writes.
    pub async fn open_with(
        target: &Target,
        access: Access,
        configure: impl FnOnce(ConfigLoader) -> ConfigLoader,
    ) -> Result<Self> {
        let client = credentials::client(target, configure).await;
        let records = Self { client, bucket: target.bucket.clone(), prefix: target.prefix.clone() };
        if access == Access::Create {
            probe::check_conditional_writes(&records.client, &records.bucket, &records.prefix).await?;
        }
        Ok(records)
    }

    fn key(&self, lock: &str) -> Result<String> {
        key_of(&self.prefix, lock).map_err(|why| StoreError::refused(format!("s3://{}: {why}", self.bucket)))
    }

    fn error(&self, operation: &str, key: &str, failure: Failure) -> StoreError {
        failure.into_error(&self.bucket, &format!("{operation} {key}"))
    }

    /// GetObject: the body and its version, or `None`; and the server's clock.
    async fn get(&self, key: &str) -> Result<(Option<(Body, Version)>, Option<SystemTime>)> {
        let date = DateHeader::default();
        let sent = self.client.get_object().bucket(&self.bucket).key(key).customize().interceptor(date.clone()).send();
        let output = match sent.await {
            Ok(output) => output,
            Err(err) => {
                return match classify(&self.bucket, &format!("GetObject {key}"), err) {
                    Failure::NoSuchKey => Ok((None, date.get())),
                    other => Err(self.error("GetObject", key, other)),
                }
            }
        };
        let etag = output.e_tag().map(str::to_string);
        let bytes = output.body.collect().await.map_err(|e| {
            StoreError::unavailable(format!("s3://{}: GetObject {key}: reading the body: {e}", self.bucket))
        })?;
        let body = Body::parse(&bytes.into_bytes())
            .map_err(|why| StoreError::refused(format!("s3://{}: {key} is {why}", self.bucket)))?;
        let etag = etag.ok_or_else(|| self.no_etag("GetObject", key))?;
        let version = version(&etag, body.writes);
        Ok((Some((body, version)), date.get()))
    }

    fn no_etag(&self, operation: &str, key: &str) -> StoreError {
        StoreError::refused(format!("s3://{}: {operation} {key}: the server sent no ETag", self.bucket))
    }

    /// PutObject of `body` under a precondition (`If-None-Match: *`, or `If-Match: etag`).
    /// `Ok(None)`: the precondition failed (or the object is gone). Also the server's clock.
    async fn put(
        &self,
        key: &str,
        body: &Body,
        if_match: Option<&str>,
    ) -> Result<(Option<String>, Option<SystemTime>)> {
        let date = DateHeader::default();
        let request = self
            .client
            .put_object()
            .bucket(&self.bucket)
            .key(key)
            .content_type("application/json")
            .body(ByteStream::from(body.to_bytes()));
        let request = match if_match {
            Some(etag) => request.if_match(etag),
            None => request.if_none_match("*"),
        };
        match request.customize().interceptor(date.clone()).send().await {
            Ok(output) => {
                Ok((Some(output.e_tag().ok_or_else(|| self.no_etag("PutObject", key))?.to_string()), date.get()))
            }
            Err(err) => match classify(&self.bucket, &format!("PutObject {key}"), err) {
                Failure::Precondition | Failure::NoSuchKey => Ok((None, date.get())),
                other => Err(self.error("PutObject", key, other)),
            },
        }
    }
}

#[async_trait]
impl Records for S3Records {
    async fn read(&self, lock: &str) -> Result<Read> {
        let key = self.key(lock)?;
        let (found, server_time) = self.get(&key).await?;
        let floor = floor(server_time, found.is_some());
        let found = found.map(|(body, version)| Found { record: body.record(), version });
        Ok(Read { found, server_time, floor })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        let key = self.key(lock)?;
        let body = Body::new(record, 1);
        let (Some(etag), written) = self.put(&key, &body, None).await? else { return Ok(Created::Moved) };
        Ok(Created::Done { version: version(&etag, body.writes), floor: create_floor(written) })
    }

    async fn replace(&self, lock: &str, record: &Record, previous: &Version) -> Result<Written> {
        let key = self.key(lock)?;
        let (writes, etag) = parse_version(previous);
        let body = Body::new(record, writes + 1);
        Ok(match self.put(&key, &body, Some(etag)).await? {
            (Some(etag), _) => Written::Done(version(&etag, body.writes)),
            (None, _) => Written::Moved,
        })
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        let mut locks = Vec::new();
        let mut pages = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(&self.prefix)
            .max_keys(PAGE)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|err| {
                classify(&self.bucket, &format!("ListObjectsV2 {}", self.prefix), err)
                    .into_error(&self.bucket, &format!("ListObjectsV2 {}", self.prefix))
            })?;
            for key in page.contents().iter().filter_map(|object| object.key()) {
                let Some(lock) = lock_of(&self.prefix, key) else { continue };
                match self.get(key).await {
                    Ok((Some((body, _)), _)) => locks.push((lock, body.record())),
                    Ok((None, _)) => {} // deleted since the listing
                    // Someone else's object under the prefix: not a lock, and no reason to fail.
                    Err(err) if !err.is_transient() => tracing::warn!("{}", err.message),
                    Err(err) => return Err(err),
                }
            }
        }
        Ok(locks)
    }

    fn poll_every(&self) -> Option<Duration> {
        Some(POLL_EVERY)
    }

    /// The server's clock is the HTTP `Date`, in whole seconds.
    fn server_clock_resolution(&self) -> Duration {
        Duration::from_secs(1)
    }

    /// Tokens follow the server's clock: one counts once no later create can undercut it.
    fn counts(&self, token: u64, read: &Read) -> bool {
        token_counts(token, read.server_time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_carry_the_etag_and_the_write_count() {
        let v = version("\"9dd4e461268c8034f5c8564e155c67a6\"", 7);
        assert_eq!(parse_version(&v), (7, "\"9dd4e461268c8034f5c8564e155c67a6\""));
    }
}
