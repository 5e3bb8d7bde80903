//! A record as a small JSON document, for stores that keep it as one (an S3 object's body,
//! a Cloud Storage object's custom metadata): one layout, so that both read alike.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Record;

/// The record as a document keeps it (times in milliseconds since the epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Document {
    /// Marks leaderrun's documents (and the layout, should it ever change).
    pub leaderrun: u32,
    pub holder: String,
    pub ttl_seconds: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_ms: Option<u64>,
    pub transitions: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    pub revoked: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_until_ms: Option<u64>,
}

fn millis(at: Option<SystemTime>) -> Option<u64> {
    at.map(|t| t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64)
}

fn time(ms: Option<u64>) -> Option<SystemTime> {
    ms.map(|ms| UNIX_EPOCH + Duration::from_millis(ms))
}

impl Document {
    pub const LAYOUT: u32 = 1;

    pub fn new(record: &Record) -> Self {
        Document {
            leaderrun: Self::LAYOUT,
            holder: record.holder.clone(),
            ttl_seconds: record.ttl_seconds,
            acquired_ms: millis(record.acquired),
            renewed_ms: millis(record.renewed),
            transitions: record.transitions,
            token: record.token,
            revoked: record.revoked,
            kept_until_ms: millis(record.kept_until),
        }
    }

    pub fn record(&self) -> Record {
        Record {
            holder: self.holder.clone(),
            ttl_seconds: self.ttl_seconds,
            acquired: time(self.acquired_ms),
            renewed: time(self.renewed_ms),
            transitions: self.transitions,
            token: self.token,
            revoked: self.revoked,
            kept_until: time(self.kept_until_ms),
        }
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a document always serializes")
    }

    /// Parse a document; the error says why it is not one of leaderrun's.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        parse(bytes, |document: &Document| document)
    }
}

/// Parse `bytes` as `T`, a document or a store's wrapper of one (`document` finds it in
/// `T`); the error says why it is not one of leaderrun's.
pub fn parse<T: DeserializeOwned>(bytes: &[u8], document: impl Fn(&T) -> &Document) -> Result<T, String> {
    let parsed: T = serde_json::from_slice(bytes).map_err(|e| format!("not a leaderrun lock object ({e})"))?;
    let layout = document(&parsed).leaderrun;
    if layout != Document::LAYOUT {
        return Err(format!(
            "written in layout {layout} by another leaderrun version; this one reads layout {}",
            Document::LAYOUT
        ));
    }
    Ok(parsed)
}
