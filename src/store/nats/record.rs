//! A lock's entry as the store reports it: free, kept, held by a leaderrun run or by one of
//! Choria's campaigners, and for how much longer.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::bucket::Bucket;
use super::entry::Entry;
use super::NatsStore;
use crate::store::{Campaigner, LockRecord};

impl NatsStore {
    pub(super) fn record(&self, bucket: &Bucket, lock: &str, entry: Option<&Entry>) -> LockRecord {
        let Some(entry) = entry else {
            return LockRecord::free(lock);
        };
        if entry.gone {
            return LockRecord { token: if entry.has_token { entry.token } else { 0 }, ..LockRecord::free(lock) };
        }
        if bucket.keep_ended(entry) {
            // Only kept for --min-hold, and that has passed: free for leaderrun (the bucket
            // drops the entry at its max age, which Choria's campaigners wait for).
            return LockRecord { token: entry.token, ..LockRecord::free(lock) };
        }
        let lifetime = match (bucket.allow_ttl, entry.ttl_secs) {
            (true, Some(secs)) if bucket.max_age.is_zero() => Some(Duration::from_secs(secs)),
            (true, Some(secs)) => Some(Duration::from_secs(secs).min(bucket.max_age)),
            _ if entry.kept && entry.kept_ms.is_some() => {
                entry.kept_ms.map(|ms| Duration::from_millis(ms).min(bucket.max_age))
            }
            _ => Some(bucket.max_age).filter(|age| !age.is_zero()),
        };
        // No leaderrun headers: another program's campaigner (Choria), whose key keeps only its
        // last write: when it was first taken is not known, and the revision is its last renewal's.
        let campaigner = match (entry.acquired_ms, bucket.choria()) {
            (None, Some(choria)) => Some(Campaigner { renewed_at: entry.written, renews_every: choria.interval }),
            _ => None,
        };
        let expires_in =
            lifetime.map(|life| (entry.written + life).duration_since(SystemTime::now()).unwrap_or_default());
        LockRecord {
            lock: lock.to_string(),
            holder: Some(entry.holder.clone()),
            token: entry.token,
            held_since: match campaigner {
                Some(_) => None,
                None => Some(entry.acquired_ms.map_or(entry.written, |ms| UNIX_EPOCH + Duration::from_millis(ms))),
            },
            expires_in,
            revoked: entry.revoked,
            campaigner,
            kept: entry.kept,
        }
    }
}
