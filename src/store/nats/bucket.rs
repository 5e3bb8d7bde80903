//! The bucket: found, or created where this store may, once; and what it allows (per-message
//! TTL, expiry markers, a max age, Choria's campaign in it).

use std::time::{Duration, SystemTime};

use async_nats::jetstream::{self, kv, stream::Stream};

use super::choria::Choria;
use super::entry::Entry;
use super::{connections, describe, NatsStore, CHORIA_BUCKET};
use crate::store::Access;
use crate::store::{Result, StoreError};

/// How long an expiry marker stays in buckets leaderrun creates (long enough for any
/// watcher to see it; the next acquisition replaces it anyway).
const MARKER_TTL: Duration = Duration::from_secs(3600);

/// The bucket and what it allows.
#[derive(Clone)]
pub(super) struct Bucket {
    pub(super) stream: Stream,
    pub(super) kv: kv::Store,
    pub(super) allow_ttl: bool,
    /// The server leaves a marker when it expires an entry (`subject_delete_marker_ttl`).
    pub(super) markers: bool,
    pub(super) max_age: Duration,
    /// Without per-message TTL: Choria's campaign in it, or why Choria refuses the bucket.
    pub(super) choria: Option<std::result::Result<Choria, String>>,
    /// How many servers hold the bucket's stream (its leader is elected among them).
    pub(super) replicas: usize,
}

impl Bucket {
    /// Choria's campaign, in a bucket that has no per-message TTL but a max age.
    pub(super) fn choria(&self) -> Option<Choria> {
        self.choria.as_ref().and_then(|c| c.as_ref().ok()).copied()
    }

    /// Whether the keep (--min-hold) recorded on a kept entry has ended, in a bucket that
    /// cannot expire the entry then by itself: the server's timestamp of the entry plus the
    /// keep, against this host's wall clock (a cron convenience, not a safety rule).
    pub(super) fn keep_ended(&self, entry: &Entry) -> bool {
        let ends = entry.kept_ms.map(|ms| entry.written + Duration::from_millis(ms));
        !self.allow_ttl && entry.kept && ends.is_some_and(|ends| ends <= SystemTime::now())
    }
}

impl NatsStore {
    /// The bucket; `None` if it does not exist and this store may not create it.
    pub(super) async fn bucket(&self) -> Result<Option<&Bucket>> {
        if let Some(bucket) = self.bucket.get() {
            return Ok(Some(bucket));
        }
        let stream_name = format!("KV_{}", self.bucket_name);
        // Over either link, sent again while the stream's leader is being elected.
        let found = self.over_links("bucket", |js| {
            let name = stream_name.clone();
            async move {
                match js.get_stream(&name).await {
                    Err(e) if connections::passes(&describe(&e)) => Err(describe(&e)),
                    answer => Ok(answer),
                }
            }
        });
        let stream = match found.await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                use async_nats::jetstream::context::GetStreamErrorKind as K;
                let missing = matches!(e.kind(), K::JetStream(ref js)
                    if js.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND);
                if !missing {
                    return Err(self.error(describe(&e)));
                }
                if self.access == Access::Existing {
                    return Ok(None);
                }
                if self.bucket_name == CHORIA_BUCKET {
                    // Choria refuses a bucket without a max age: leave its creation to Choria.
                    return Err(StoreError::refused(format!(
                        "nats store {}: bucket {CHORIA_BUCKET} does not exist; it is Choria's to create (Choria \
                         Streams does, or: choria kv add {CHORIA_BUCKET} --ttl 60s)",
                        self.shown
                    )));
                }
                let config = kv::Config {
                    bucket: self.bucket_name.clone(),
                    description: "leaderrun leases".into(),
                    history: 1,
                    storage: jetstream::stream::StorageType::File,
                    num_replicas: self.replicas,
                    limit_markers: Some(MARKER_TTL),
                    ..Default::default()
                };
                self.call("create-bucket", self.js().create_key_value(config)).await?.stream
            }
            Err(Some(why)) => return Err(self.error(why)),
            Err(None) => return Err(self.no_answer()),
        };
        let stream = self.placed(stream).await?;
        let info = stream.cached_info().config.clone();
        let kv = kv::Store {
            name: self.bucket_name.clone(),
            stream_name,
            prefix: format!("$KV.{}.", self.bucket_name),
            put_prefix: None,
            use_jetstream_prefix: false,
            stream: stream.clone(),
        };
        let choria = (!info.allow_message_ttl && !info.max_age.is_zero()).then(|| Choria::for_max_age(info.max_age));
        let markers = info.subject_delete_marker_ttl.is_some_and(|ttl| !ttl.is_zero());
        let replicas = info.num_replicas;
        let bucket =
            Bucket { stream, kv, allow_ttl: info.allow_message_ttl, markers, max_age: info.max_age, choria, replicas };
        Ok(Some(self.bucket.get_or_init(|| async { bucket }).await))
    }

    /// The bucket, for a call that writes (the bucket exists: only a run writes).
    pub(super) async fn bucket_for_write(&self) -> Result<&Bucket> {
        self.bucket().await?.ok_or_else(|| {
            StoreError::refused(format!("nats store {}: the bucket {:?} does not exist", self.shown, self.bucket_name))
        })
    }

    /// Refuse, before anything is written, a bucket that cannot hold leases (no expiry at all,
    /// or a Choria bucket whose max age Choria itself refuses) and a lease (--ttl + --lock-delay,
    /// named --ttl: a run with a delay learnt the limit first) that does not fit: configuration.
    pub(super) fn check_ttl(&self, bucket: &Bucket, ttl: Duration) -> Result<()> {
        let name = &self.bucket_name;
        if !bucket.allow_ttl && bucket.max_age.is_zero() {
            return Err(StoreError::unfit(format!(
                "nats store {}: bucket {name:?} has neither per-message TTL nor a max age, so a lease in it would \
                 never expire; give it a max age, or use a bucket leaderrun creates",
                self.shown
            )));
        }
        match &bucket.choria {
            Some(Err(why)) => {
                return Err(StoreError::unfit(format!("nats store {}: bucket {name:?} {why}", self.shown)))
            }
            Some(Ok(choria)) => {
                if let Some(why) = choria.refuse_ttl(name, ttl) {
                    return Err(StoreError::unfit(format!("nats store {}: {why}", self.shown)));
                }
            }
            None => {}
        }
        if !bucket.max_age.is_zero() && ttl > bucket.max_age {
            return Err(StoreError::unfit(format!(
                "nats store {}: --ttl {} is longer than the max age ({}) of bucket {name:?}, which would drop the \
                 lease before its holder's deadline; use a --ttl of {} or less",
                self.shown,
                humantime::format_duration(ttl),
                humantime::format_duration(bucket.max_age),
                humantime::format_duration(bucket.max_age),
            )));
        }
        Ok(())
    }
}
