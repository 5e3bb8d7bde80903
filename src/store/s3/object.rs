//! One object per lock: its key, and its body (the record as a small JSON document).
//!
//! Keys: `PREFIX` + the lock name with `%` written `%25`, `/` written `%2F` and a leading
//! `.` written `%2E`; every other character stays as it is (S3 keys are UTF-8). Decoding
//! turns each `%XX` back into its byte, so two lock names never share a key, a name never
//! reaches into a "folder" below the prefix, and no key is `.` or `..` (which some tools and
//! servers treat as paths). Keys that do not decode back to themselves, and keys starting
//! with `.` (the conditional-write probe), are not locks.
//!
//! Bodies carry a write counter: S3's ETag is the body's MD5, and the record's version is
//! the ETag, so two writes with the same body would look like no change at all to a
//! standby (a renewal within one millisecond would). The counter makes every body new.

use serde::{Deserialize, Serialize};

use crate::store::client_timed::document::{self, Document};
use crate::store::client_timed::object_names;
use crate::store::client_timed::Record;

/// The longest key S3 accepts, in bytes of UTF-8.
const MAX_KEY_BYTES: usize = 1024;

/// The object key of `lock` under `prefix`, or why it cannot have one (too long).
pub fn key_of(prefix: &str, lock: &str) -> Result<String, String> {
    let key = object_names::encode(prefix, lock, |c| c.is_ascii_control());
    if key.len() > MAX_KEY_BYTES {
        return Err(format!(
            "the object key for lock {lock:?} would be {} bytes long; S3 takes at most {MAX_KEY_BYTES} \
             (use a shorter lock name or prefix)",
            key.len()
        ));
    }
    Ok(key)
}

/// The lock name an object key under `prefix` stands for, if it is a lock's key.
pub fn lock_of(prefix: &str, key: &str) -> Option<String> {
    object_names::decode(prefix, key, |lock| key_of(prefix, lock).ok())
}

/// The body of a lock's object: the record's document, and a write counter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Body {
    #[serde(flatten)]
    pub document: Document,
    /// One more than the write this one replaced: every write changes the body, so the ETag.
    pub writes: u64,
}

impl Body {
    /// The body for `record`, as the `writes`th write of this object.
    pub fn new(record: &Record, writes: u64) -> Self {
        Body { document: Document::new(record), writes }
    }

    pub fn record(&self) -> Record {
        self.document.record()
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a body always serializes")
    }

    /// Parse an object's body; the error says why it is not one of leaderrun's.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        document::parse(bytes, |body: &Body| &body.document)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    #[test]
    fn keys_are_collision_free_and_decode_back() {
        let names =
            ["a", "a/b", "a%2Fb", "%", "%25", ".", "..", ".hidden", "x.", "日本語 spaces", "back\\slash", "a%41"];
        let mut keys = std::collections::BTreeSet::new();
        for name in names {
            let key = key_of("p/", name).unwrap();
            assert!(key.starts_with("p/") && !key[2..].contains('/') && !key[2..].starts_with('.'), "{key}");
            assert_eq!(lock_of("p/", &key).as_deref(), Some(name), "{key}");
            assert!(keys.insert(key), "{name:?} shares a key");
        }
        assert_eq!(key_of("p/", "a/b%").unwrap(), "p/a%2Fb%25");
        assert_eq!(key_of("p/", "..").unwrap(), "p/%2E.");
    }

    #[test]
    fn keys_that_are_not_locks() {
        assert_eq!(lock_of("p/", "p/.conditional-write-probe"), None);
        assert_eq!(lock_of("p/", "p/sub/x"), None, "below a folder of the prefix");
        assert_eq!(lock_of("p/", "q/x"), None, "another prefix");
        assert_eq!(lock_of("p/", "p/a%41"), None, "not the canonical spelling of aA");
        assert_eq!(lock_of("p/", "p/%ff"), None, "not UTF-8");
        assert_eq!(lock_of("p/", "p/"), None);
    }

    #[test]
    fn a_key_too_long_for_s3_is_refused() {
        let emoji = "😀".repeat(255);
        let err = key_of("leaderrun/", &emoji).unwrap_err();
        assert!(err.contains("1030 bytes") && err.contains("at most 1024"), "{err}");
        assert!(key_of("p/", &"é".repeat(255)).is_ok());
    }

    #[test]
    fn bodies_round_trip_and_differ_by_write() {
        let record = Record {
            holder: "host-1".into(),
            ttl_seconds: 15,
            acquired: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)),
            renewed: Some(UNIX_EPOCH + Duration::from_millis(1_700_000_005_456)),
            transitions: 3,
            token: Some(1_700_000_000_000_001),
            revoked: false,
            kept_until: None,
        };
        let (one, two) = (Body::new(&record, 1), Body::new(&record, 2));
        assert_ne!(one.to_bytes(), two.to_bytes(), "the same record written twice must change the ETag");
        assert_eq!(Body::parse(&one.to_bytes()).unwrap().record(), record);
        assert!(Body::parse(b"{}").unwrap_err().contains("not a leaderrun lock object"));
        let later = String::from_utf8(one.to_bytes()).unwrap().replace("\"leaderrun\":1", "\"leaderrun\":2");
        assert!(Body::parse(later.as_bytes()).unwrap_err().contains("layout 2"));
    }
}
