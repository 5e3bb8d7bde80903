//! The key's last message as the store reads it: who holds the lock, with which token, and
//! what leaderrun's headers say (see the module's doc for each header).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;

use super::{ACQUIRED, KEPT, KEPT_MS, KV_OPERATION, MARKER_REASON, REVOKED, TOKEN, TTL};

/// Whether `entry` is an acquisition this client sent (one of the acquired times `sent`, as
/// `identity`, no token header yet: a first write), whose answer it did not get: an earlier
/// copy of a publish sent again over another connection.
pub(super) fn mine(entry: &Entry, identity: &str, sent: &[u64]) -> bool {
    !entry.gone
        && !entry.has_token
        && entry.holder == identity
        && entry.acquired_ms.is_some_and(|ms| sent.contains(&ms))
}

/// The key's last message, as far as leaderrun cares.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    /// Its stream sequence (the KV revision).
    pub(super) seq: u64,
    /// A delete, purge or expiry marker: the lock is free.
    pub(super) gone: bool,
    pub(super) holder: String,
    /// `Leaderrun-Token`, else the revision (an acquisition, or an entry Choria wrote).
    pub(super) token: u64,
    /// `Leaderrun-Token` was there (a delete marker without it tells nothing).
    pub(super) has_token: bool,
    pub(super) acquired_ms: Option<u64>,
    pub(super) revoked: bool,
    /// Left by a release with --min-hold (`Leaderrun-Kept`).
    pub(super) kept: bool,
    /// `Leaderrun-Kept-Ms`: the keep ends that long after `written`.
    pub(super) kept_ms: Option<u64>,
    /// `Nats-TTL`, in seconds.
    pub(super) ttl_secs: Option<u64>,
    /// The server's timestamp of the message.
    pub(super) written: SystemTime,
}

impl Entry {
    pub(super) fn from_message(message: &jetstream::message::StreamMessage) -> Self {
        let headers = &message.headers;
        let get = |name: &str| headers.get(name).map(|v| v.as_str().trim().to_string());
        let op = get(KV_OPERATION);
        let gone = matches!(op.as_deref(), Some("DEL" | "PURGE")) || get(MARKER_REASON).is_some();
        let header_token = get(TOKEN).and_then(|t| t.parse::<u64>().ok());
        let nanos = message.time.unix_timestamp_nanos().max(0) as u64;
        Entry {
            seq: message.sequence,
            gone,
            holder: String::from_utf8_lossy(&message.payload).into_owned(),
            token: header_token.unwrap_or(message.sequence),
            has_token: header_token.is_some(),
            acquired_ms: get(ACQUIRED).and_then(|t| t.parse().ok()),
            revoked: get(REVOKED).is_some_and(|v| v == "1"),
            kept: get(KEPT).is_some_and(|v| v == "1"),
            kept_ms: get(KEPT_MS).and_then(|t| t.parse().ok()),
            ttl_secs: get(TTL).and_then(|t| t.parse().ok()),
            written: UNIX_EPOCH + Duration::from_nanos(nanos),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquisition(holder: &str, acquired_ms: Option<u64>, has_token: bool) -> Entry {
        Entry {
            seq: 7,
            gone: false,
            holder: holder.into(),
            token: 7,
            has_token,
            acquired_ms,
            revoked: false,
            kept: false,
            kept_ms: None,
            ttl_secs: Some(15),
            written: UNIX_EPOCH,
        }
    }

    #[test]
    fn an_acquire_sent_again_knows_only_its_own_first_write() {
        let sent = [1000, 2000];
        assert!(mine(&acquisition("a", Some(2000), false), "a", &sent));
        assert!(!mine(&acquisition("b", Some(2000), false), "a", &sent), "another identity");
        assert!(!mine(&acquisition("a", Some(3000), false), "a", &sent), "an acquisition this call never sent");
        assert!(!mine(&acquisition("a", Some(2000), true), "a", &sent), "a renewal: not a first write");
        assert!(!mine(&acquisition("a", None, false), "a", &sent), "written by another program");
        assert!(!mine(&Entry { gone: true, ..acquisition("a", Some(2000), false) }, "a", &sent));
    }
}
