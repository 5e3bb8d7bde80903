//! The data of a lease child, as every part of the store reads and writes it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The data of a lease child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Value {
    pub(super) holder: String,
    /// The acquiring host's wall clock (ms since the epoch): display and --min-hold.
    pub(super) acquired_ms: u64,
    #[serde(default)]
    pub(super) revoked: bool,
    /// The owner session's timeout: the most the lease can have left.
    #[serde(default)]
    pub(super) session_timeout_ms: u64,
    /// Set on the persistent child a release with --min-hold leaves (wall clock, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) keep_until_ms: Option<u64>,
}

/// This host's wall clock, in ms since the epoch (the times a lease child records).
pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
