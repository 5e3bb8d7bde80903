//! The lock key's value, and the times it is written with.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// The lock key's value.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Value {
    pub holder: String,
    pub lease_id: i64,
    /// The acquiring host's wall clock (ms since the epoch): display and --min-hold.
    pub acquired_ms: u64,
    pub revoked: bool,
    /// Released with --min-hold: the child has exited and the holder is gone; the lock stays
    /// taken only until the keep's lease lapses. Absent in records of older versions.
    #[serde(default)]
    pub kept: bool,
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Whole seconds, rounded up, at least 1: etcd leases have 1 s granularity.
pub(super) fn lease_secs(d: Duration) -> i64 {
    (d.as_nanos().div_ceil(1_000_000_000) as i64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_secs(Duration::from_millis(300)), 1);
        assert_eq!(lease_secs(Duration::from_secs(30)), 30);
        assert_eq!(lease_secs(Duration::from_millis(30_001)), 31);
    }

    #[test]
    fn records_of_older_versions_read_as_not_kept() {
        let old = br#"{"holder":"h","lease_id":7,"acquired_ms":1,"revoked":false}"#;
        let value: Value = serde_json::from_slice(old).unwrap();
        assert!(!value.kept && value.lease_id == 7);
    }
}
