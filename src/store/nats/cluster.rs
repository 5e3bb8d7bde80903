//! What a cluster adds: a replicated stream's own answer to a lost compare-and-set, and a new
//! stream that takes no messages until the cluster has placed it.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishError, context::PublishErrorKind, publish::PublishAck};
use async_nats::HeaderMap;
use tokio::time::{error::Elapsed, timeout};

use super::{NatsStore, REQUEST_TIMEOUT};
use crate::store::{Result, StoreError};

/// Longest a run waits for a replicated bucket's stream to get its leader (a new stream's
/// placement takes a second or two; a cluster that cannot place it in this long is down).
const PLACEMENT_WAIT: Duration = Duration::from_secs(10);

/// The error code a replicated stream answers a stale expected sequence with; a single
/// server answers 10071, which async-nats maps to `WrongLastSequence`.
const WRONG_LAST_SEQUENCE_REPLICATED: u64 = 10164;

/// Whether a refused publish lost the compare-and-set: someone else wrote the key first.
pub(super) fn lost_race(e: &PublishError) -> bool {
    use std::error::Error as _;
    let code = e.source().and_then(|s| s.downcast_ref::<jetstream::Error>()).map(|j| j.error_code().0);
    e.kind() == PublishErrorKind::WrongLastSequence || code == Some(WRONG_LAST_SEQUENCE_REPLICATED)
}

impl NatsStore {
    /// One publish, answered or not within the request bound; sent again while a bucket just
    /// made is not yet served ("no stream found": nobody took it, so nothing was written).
    pub(super) async fn send(
        &self,
        op: &'static str,
        subject: String,
        headers: HeaderMap,
        payload: &str,
    ) -> std::result::Result<std::result::Result<PublishAck, PublishError>, Elapsed> {
        loop {
            tracing::trace!(op, "store request");
            let (subject, headers, payload) = (subject.clone(), headers.clone(), payload.to_string().into());
            let sent = timeout(REQUEST_TIMEOUT, async {
                self.js.publish_with_headers(subject, headers, payload).await?.await
            });
            match sent.await {
                Ok(Err(e)) if e.kind() == PublishErrorKind::StreamNotFound && self.placing() => {
                    tracing::debug!(op, "the bucket's stream does not answer yet; sending again");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                sent => return sent,
            }
        }
    }

    /// Whether the bucket was opened so recently that its stream may not take messages yet:
    /// in a cluster, the servers learn who serves a new stream's subjects a moment after it
    /// was made (until then a publish finds "no stream"), whatever its replicas.
    fn placing(&self) -> bool {
        self.bucket.get().is_some_and(|b| b.opened.elapsed() < PLACEMENT_WAIT)
    }

    /// `stream` once the cluster has placed it: a stream replicated to several servers
    /// answers nothing (a publish: "no stream found") until its own leader is elected, a
    /// moment after it was made. A single server's stream, or one with a leader, at once.
    pub(super) async fn placed(&self, mut stream: jetstream::stream::Stream) -> Result<jetstream::stream::Stream> {
        let has_leader = |info: &jetstream::stream::Info| {
            info.config.num_replicas <= 1 || info.cluster.as_ref().is_none_or(|c| c.leader.is_some())
        };
        let until = tokio::time::Instant::now() + PLACEMENT_WAIT;
        while !has_leader(stream.cached_info()) {
            if tokio::time::Instant::now() >= until {
                return Err(StoreError::unavailable(format!(
                    "nats store {}: the bucket {:?}'s stream has no leader after {}",
                    self.shown,
                    self.bucket_name,
                    humantime::format_duration(PLACEMENT_WAIT)
                )));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            self.call("stream-info", stream.info()).await?;
        }
        Ok(stream)
    }
}
