//! The headers leaderrun writes on a lock's messages (and JetStream's own it reads), and the
//! header sets of a held lease and of a delete marker.

use std::time::Duration;

use async_nats::HeaderMap;

use super::bucket::Bucket;

pub(super) const TOKEN: &str = "Leaderrun-Token";
pub(super) const ACQUIRED: &str = "Leaderrun-Acquired-Ms";
pub(super) const REVOKED: &str = "Leaderrun-Revoked";
/// On the entry a release with --min-hold leaves: its child has exited, nobody renews it.
pub(super) const KEPT: &str = "Leaderrun-Kept";
/// On such an entry: how long (ms) after it was written the keep ends. A bucket without
/// per-message TTL keeps the entry for its max age; leaderrun takes it over once this passed.
pub(super) const KEPT_MS: &str = "Leaderrun-Kept-Ms";
pub(super) const EXPECTED: &str = "Nats-Expected-Last-Subject-Sequence";
pub(super) const TTL: &str = "Nats-TTL";
pub(super) const KV_OPERATION: &str = "KV-Operation";
pub(super) const MARKER_REASON: &str = "Nats-Marker-Reason";

/// Whole seconds, rounded up, at least 1: the server's TTL granularity.
pub(super) fn ttl_secs(d: Duration) -> u64 {
    (d.as_nanos().div_ceil(1_000_000_000) as u64).max(1)
}

/// Headers of a held lease: token (when known), acquired time, TTL where allowed.
pub(super) fn lease_headers(bucket: &Bucket, token: Option<u64>, acquired_ms: u64, ttl: Option<Duration>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(token) = token {
        headers.insert(TOKEN, token.to_string());
    }
    headers.insert(ACQUIRED, acquired_ms.to_string());
    if let (true, Some(ttl)) = (bucket.allow_ttl, ttl) {
        headers.insert(TTL, ttl_secs(ttl).to_string());
    }
    headers
}

/// Headers of a KV delete marker that remembers the lock's last token.
pub(super) fn delete_headers(token: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(KV_OPERATION, "DEL");
    headers.insert(TOKEN, token.to_string());
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up() {
        assert_eq!(ttl_secs(Duration::from_millis(300)), 1);
        assert_eq!(ttl_secs(Duration::from_secs(30)), 30);
        assert_eq!(ttl_secs(Duration::from_millis(30_001)), 31);
    }
}
