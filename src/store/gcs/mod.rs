//! Cloud Storage store: `--store gs://BUCKET[/PREFIX]`, one object per lock (`object.rs`),
//! through the JSON API only (`api.rs`), with no server-side expiry: the client-timed core
//! judges every lease on this host's clock, and this file only reads and writes objects.
//!
//! - read: objects.get of the metadata (404: no record). The record is the object's
//!   `leaderrun` custom metadata; the version is `generation/metageneration`; the server's
//!   clock is the response's `Date`, and the token floor comes from it, as on S3
//!   (`client_timed/server_clock.rs`): Google documents generations as unique, not as
//!   increasing, so they cannot be a floor.
//! - create: a multipart upload with `ifGenerationMatch=0` (412: someone else created it
//!   first). An upload that landed in a later second than its read has its token raised by
//!   the core from that second; and the core counts a token from the next second's floor
//!   only once the server's clock has left the second it was written in (`counts`: it reads
//!   until then, at most a second), so that tokens outlive a deleted object; an object that
//!   changed or vanished meanwhile is a lost race.
//! - replace: the same upload with `ifGenerationMatch=G&ifMetagenerationMatch=M` (412: it
//!   changed; 404: it was deleted).
//! - list: objects.list under the prefix; each item carries its metadata, so its record
//!   (no read per lock).
//! - waiting: Cloud Storage cannot watch (Pub/Sub notifications need a topic and a
//!   subscription: out of scope), so a standby's core reads the object every 1 to 1.5 s
//!   (`client_timed/polls.rs`) and judges what each read shows: at most 3,600 Class B
//!   operations an hour per waiting process, and nothing more when the holder renews.
//!
//! Every guarded write is a multipart upload, never a PATCH, a DELETE, a media or a
//! resumable upload: fake-gcs-server 1.54 honours preconditions on multipart uploads only
//! (real Cloud Storage honours them everywhere). Release and revoke are uploads too.
//! Deleting a lock's object (`gcloud storage rm`) frees the lock at once; a holder sees it
//! at its next renewal and stops its child.
//!
//! Cloud Storage allows about one write per second to one object: the renewals of a
//! `--ttl` under about 5 s would reach it (a 429 is an outage, which the elector retries
//! until the lease is spent). docs/stores/gcs.md says so.
//!
//! A run first checks that the server honours preconditions (`probe.rs`); `status`, `list`
//! and `release` check once that the bucket exists. 401/403 and a missing bucket are
//! refusals (exit 69), in one line naming the bucket and the operation (`errors.rs`).

mod api;
mod errors;
mod kind;
mod object;
mod probe;
mod target;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

pub use kind::KIND;
pub use target::Target;

use self::api::{Bucket, Object, Precondition, Upload};
use self::object::{lock_of, name_of, Body};
use crate::store::client_timed::server_clock::{create_floor, floor, token_counts};
use crate::store::client_timed::{client_timed, Created, Found, Read, Record, Records, Version, Written};
use crate::store::google::{GoogleApi, Service};
use crate::store::Access;
use crate::store::{Result, Store, StoreError};

/// How often a waiting standby reads the object (`Records::poll_every`: 1 to 1.5 × this).
const POLL_EVERY: Duration = Duration::from_secs(1);

/// The Cloud Storage store for `target`, at Google (Application Default Credentials) or at
/// the emulator `STORAGE_EMULATOR_HOST` names: the client-timed core over its objects.
pub async fn open(target: &Target, access: Access) -> Result<Box<dyn Store>> {
    let api = GoogleApi::open(Service::Storage)
        .map_err(|err| StoreError { message: format!("gs://{}: {}", target.bucket, err.message), ..err })?;
    open_with(target, access, api).await
}

/// `open` through `api` (for tests that run several emulators in one process, and for a
/// program that embeds leaderrun).
pub async fn open_with(target: &Target, access: Access, api: GoogleApi) -> Result<Box<dyn Store>> {
    Ok(client_timed(Arc::new(GcsRecords::open_with(target, access, api).await?)))
}

/// One bucket's lock objects under one prefix.
pub struct GcsRecords {
    bucket: Bucket,
    prefix: String,
}

/// A version as this store writes it: `generation/metageneration`.
fn version(object: &Object) -> Version {
    Version(format!("{}/{}", object.generation, object.metageneration))
}

fn parse_version(version: &Version) -> Option<Precondition> {
    let (generation, metageneration) = version.0.split_once('/')?;
    Some(Precondition { generation: generation.parse().ok()?, metageneration: Some(metageneration.parse().ok()?) })
}

impl GcsRecords {
    /// A client of `target`'s bucket through `api`; a run (`Access::Create`) first checks
    /// that the server honours preconditions, anything else that the bucket exists.
    pub async fn open_with(target: &Target, access: Access, api: GoogleApi) -> Result<Self> {
        let bucket = Bucket { api, name: target.bucket.clone() };
        let records = Self { bucket, prefix: target.prefix.clone() };
        match access {
            Access::Create => probe::check_conditional_writes(&records.bucket, &records.prefix).await?,
            // One listing, whose 404 can only mean no bucket (a read of a missing lock on a
            // missing bucket looks like a free lock on fake-gcs-server).
            Access::Existing => drop(records.bucket.list(&records.prefix, Some(1)).await?),
        }
        Ok(records)
    }

    fn name(&self, lock: &str) -> Result<String> {
        name_of(&self.prefix, lock).map_err(|why| StoreError::refused(format!("gs://{}: {why}", self.bucket.name)))
    }

    /// The record an object's metadata holds, or why it is not one of leaderrun's.
    fn record_of(&self, object: &Object) -> Result<Record> {
        let text = object.record.as_deref().ok_or_else(|| {
            StoreError::refused(format!(
                "gs://{}: {} is not a leaderrun lock object (no {:?} metadata)",
                self.bucket.name,
                object.name,
                object::METADATA_KEY
            ))
        })?;
        Body::parse(text.as_bytes())
            .map(|body| body.record())
            .map_err(|why| StoreError::refused(format!("gs://{}: {} is {why}", self.bucket.name, object.name)))
    }

    /// Upload `record` to `name` if `precondition` holds: the new version, or `None`.
    async fn write(
        &self,
        name: &str,
        record: &Record,
        precondition: Precondition,
    ) -> Result<(Option<Version>, Option<SystemTime>)> {
        let json = Body::new(record).to_json();
        let (upload, date) =
            self.bucket.upload(name, Some(&json), json.as_bytes(), "application/json", precondition).await?;
        Ok(match upload {
            Upload::Written(object) => (Some(version(&object)), date),
            Upload::Precondition | Upload::NotFound => (None, date),
        })
    }
}

#[async_trait]
impl Records for GcsRecords {
    async fn read(&self, lock: &str) -> Result<Read> {
        let name = self.name(lock)?;
        let (object, server_time) = self.bucket.get(&name).await?;
        let floor = floor(server_time, object.is_some());
        let found = match object {
            Some(object) => Some(Found { record: self.record_of(&object)?, version: version(&object) }),
            None => None,
        };
        Ok(Read { found, server_time, floor })
    }

    async fn create(&self, lock: &str, record: &Record) -> Result<Created> {
        let name = self.name(lock)?;
        let (written, answered) =
            self.write(&name, record, Precondition { generation: 0, metageneration: None }).await?;
        let Some(written) = written else { return Ok(Created::Moved) };
        Ok(Created::Done { version: written, floor: create_floor(answered) })
    }

    async fn replace(&self, lock: &str, record: &Record, previous: &Version) -> Result<Written> {
        let name = self.name(lock)?;
        // A version this store did not write cannot be the object's: the lock moved.
        let Some(precondition) = parse_version(previous) else { return Ok(Written::Moved) };
        Ok(match self.write(&name, record, precondition).await? {
            (Some(version), _) => Written::Done(version),
            (None, _) => Written::Moved,
        })
    }

    async fn list(&self) -> Result<Vec<(String, Record)>> {
        let mut locks = Vec::new();
        for object in self.bucket.list(&self.prefix, None).await? {
            let Some(lock) = lock_of(&self.prefix, &object.name) else { continue };
            match self.record_of(&object) {
                Ok(record) => locks.push((lock, record)),
                // Someone else's object under the prefix: not a lock, and no reason to fail.
                Err(err) => tracing::warn!("{}", err.message),
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
    fn versions_are_generation_and_metageneration() {
        let object = Object { name: "x".into(), generation: 1_795_432_922_455_913, metageneration: 2, record: None };
        let v = version(&object);
        assert_eq!(v.0, "1795432922455913/2");
        let p = parse_version(&v).unwrap();
        assert_eq!((p.generation, p.metageneration), (1_795_432_922_455_913, Some(2)));
        assert!(parse_version(&Version("nonsense".into())).is_none());
    }
}
