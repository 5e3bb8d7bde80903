//! What a cluster adds: a replicated stream's own answer to a lost compare-and-set, and a new
//! stream that takes no messages until the cluster has placed it.

use std::time::Duration;

use async_nats::jetstream::{self, context::PublishError, context::PublishErrorKind, publish::PublishAck};
use async_nats::HeaderMap;

use super::{describe, NatsStore};
use crate::store::{Result, StoreError};

/// Longest a run waits for a replicated bucket's stream to get its leader (a new stream's
/// placement takes a second or two; a cluster that cannot place it in this long is down).
const PLACEMENT_WAIT: Duration = Duration::from_secs(10);

/// The error code a replicated stream answers a stale expected sequence with; a single
/// server answers 10071, which async-nats maps to `WrongLastSequence`.
const WRONG_LAST_SEQUENCE_REPLICATED: u64 = 10164;

/// Whether a refused publish lost the compare-and-set: someone else wrote the key first.
/// Whether a refused publish may pass if sent again: no stream leader took it (an election,
/// or a stream just made that the servers do not know yet), or no answer came.
fn passes(e: &PublishError) -> bool {
    matches!(e.kind(), PublishErrorKind::StreamNotFound | PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe)
        || super::connections::passes(&describe(e))
}

pub(super) fn lost_race(e: &PublishError) -> bool {
    use std::error::Error as _;
    let code = e.source().and_then(|s| s.downcast_ref::<jetstream::Error>()).map(|j| j.error_code().0);
    e.kind() == PublishErrorKind::WrongLastSequence || code == Some(WRONG_LAST_SEQUENCE_REPLICATED)
}

impl NatsStore {
    /// One publish over either link (see `connections.rs`): sent again while no stream leader
    /// takes it (a bucket just made, or an election: "no stream found", nothing was written)
    /// or while it goes unanswered, until the request bound. `Err(None)`: never answered;
    /// `Err(Some(why))`: the last refusal, one that passes.
    pub(super) async fn send(
        &self,
        op: &'static str,
        subject: String,
        headers: HeaderMap,
        payload: &str,
    ) -> std::result::Result<std::result::Result<PublishAck, PublishError>, Option<String>> {
        self.over_links(op, |js| {
            let (subject, headers, payload) = (subject.clone(), headers.clone(), payload.to_string().into());
            async move {
                let sent = async { js.publish_with_headers(subject, headers, payload).await?.await };
                match sent.await {
                    Err(e) if !lost_race(&e) && passes(&e) => Err(describe(&e)),
                    answer => Ok(answer),
                }
            }
        })
        .await
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
