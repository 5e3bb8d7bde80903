//! A lock's blob: its name, and what leaderrun keeps in its metadata.
//!
//! Names: `PREFIX` + the lock name with `%`, `/`, `\`, control characters, a leading `.` and
//! a trailing `.` written `%XX` (Azure advises against names ending in `.`, and treats `\`
//! as `/`); everything else stays as it is. Only the canonical spelling of a name is a
//! lock's blob.
//!
//! Metadata (names are C#-identifier-like; values ASCII, so the holder's identity is
//! percent-encoded), all written by the lease holder only, under its lease:
//!
//! | name | value |
//! |---|---|
//! | `leaderrun_token` | the fencing token of the latest acquisition |
//! | `leaderrun_holder` | its holder's identity |
//! | `leaderrun_lease` | its lease id (so that the same identity's other client may renew, release or abandon it) |
//! | `leaderrun_acquired` | when it was acquired, ms since the epoch, on the server's clock (`Date`) |
//! | `leaderrun_renewed` | its latest renewal, likewise (for `expires_in` only) |
//! | `leaderrun_duration` | its lease duration, seconds |
//! | `leaderrun_kept_until` | after a release with --min-hold: until when the lock stays taken, ms on the server's clock |

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::store::client_timed::object_names;
use crate::store::url::percent_decode;
use crate::store::LockRecord;

/// The longest blob name Azure accepts, in characters.
const MAX_NAME_CHARS: usize = 1024;

pub const TOKEN: &str = "leaderrun_token";
pub const HOLDER: &str = "leaderrun_holder";
pub const LEASE: &str = "leaderrun_lease";
pub const ACQUIRED: &str = "leaderrun_acquired";
pub const RENEWED: &str = "leaderrun_renewed";
pub const DURATION: &str = "leaderrun_duration";
pub const KEPT_UNTIL: &str = "leaderrun_kept_until";

/// The blob name of `lock` under `prefix`, or why it cannot have one (too long).
pub fn blob_of(prefix: &str, lock: &str) -> Result<String, String> {
    let mut name = object_names::encode(prefix, lock, |c| c == '\\' || c.is_ascii_control());
    if name.ends_with('.') {
        name.pop();
        name.push_str("%2E");
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(format!(
            "the blob name for lock {lock:?} would be {chars} characters long; Azure takes at most \
             {MAX_NAME_CHARS} (use a shorter lock name or prefix)"
        ));
    }
    Ok(name)
}

/// The lock name a blob under `prefix` stands for, if it is a lock's blob.
pub fn lock_of(prefix: &str, name: &str) -> Option<String> {
    object_names::decode(prefix, name, |lock| blob_of(prefix, lock).ok())
}

/// What the metadata says, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta {
    pub token: Option<u64>,
    pub holder: Option<String>,
    pub lease: Option<String>,
    pub acquired_ms: u64,
    pub renewed_ms: u64,
    pub duration: u64,
    pub kept_until_ms: u64,
}

impl Meta {
    pub fn parse(metadata: &BTreeMap<String, String>) -> Self {
        let number = |name: &str| metadata.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        Meta {
            token: number(TOKEN),
            holder: metadata.get(HOLDER).map(|h| percent_decode(h)),
            lease: metadata.get(LEASE).cloned(),
            acquired_ms: number(ACQUIRED).unwrap_or(0),
            renewed_ms: number(RENEWED).unwrap_or(0),
            duration: number(DURATION).unwrap_or(0),
            kept_until_ms: number(KEPT_UNTIL).unwrap_or(0),
        }
    }

    /// The headers that write it (Set Blob Metadata replaces all of a blob's metadata).
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut headers = Vec::new();
        let mut add = |name: &str, value: String| headers.push((format!("x-ms-meta-{name}"), value));
        if let Some(token) = self.token {
            add(TOKEN, token.to_string());
        }
        if let Some(holder) = &self.holder {
            add(HOLDER, encode_value(holder));
        }
        if let Some(lease) = &self.lease {
            add(LEASE, lease.clone());
        }
        add(ACQUIRED, self.acquired_ms.to_string());
        add(RENEWED, self.renewed_ms.to_string());
        add(DURATION, self.duration.to_string());
        if self.kept_until_ms > 0 {
            add(KEPT_UNTIL, self.kept_until_ms.to_string());
        }
        headers
    }

    /// Whether a --min-hold keep still holds the lock at the server's `now`.
    pub fn kept_at(&self, now: Option<SystemTime>) -> bool {
        self.kept_until_ms > millis(now)
    }
}

/// Until when a --min-hold keep of `keep` holds the lock, on the server's clock, for a lease
/// whose acquisition was noted at `acquired_ms`. That came from a `Date`, which counts whole
/// seconds: the lease was taken up to a second later, so the keep gets that second more and
/// never ends before the time asked.
pub fn kept_until(acquired_ms: u64, keep: Duration) -> u64 {
    let keep_ms = keep.as_millis().min(u128::from(u64::MAX)) as u64;
    acquired_ms.saturating_add(DATE_RESOLUTION_MS).saturating_add(keep_ms)
}

/// How much later than its `Date` an answer may have been made: a `Date` counts whole seconds.
const DATE_RESOLUTION_MS: u64 = 1_000;

/// A metadata value: printable ASCII only, so everything else (and `%`) is `%XX`.
fn encode_value(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        match byte {
            b'%' => out.push_str("%25"),
            0x21..=0x7e => out.push(byte as char),
            _ => out.push_str(&format!("%{byte:02X}")),
        }
    }
    out
}

/// Milliseconds since the epoch of a server time (0 if unknown).
pub fn millis(at: Option<SystemTime>) -> u64 {
    at.and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as u64)
}

/// The blob's lease, as Azure reports it (`x-ms-lease-state`, or `LeaseState` in a listing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// `available`, `expired`, `broken`: anyone may acquire it.
    Free,
    Leased,
    /// Broken, with a break period still running: nobody can acquire or renew it; its holder
    /// may still release it.
    Breaking,
}

impl LeaseState {
    pub fn parse(text: &str) -> Self {
        match text {
            "leased" => LeaseState::Leased,
            "breaking" => LeaseState::Breaking,
            _ => LeaseState::Free,
        }
    }
}

/// The record of `lock` from its blob's lease state and metadata, read at the server's `now`.
///
/// A lease is held by the holder its metadata names, between the lease's acquisition and the
/// acquirer's first metadata write (one round trip) by the previous holder's name. Azure does
/// not tell how long a lease has left: `expires_in` is its duration from its latest renewal
/// that the holder recorded (`leaderrun_renewed`), an estimate to the second that is never
/// short of the truth by more than that second. A keep's is exact to the second.
pub fn record(lock: &str, lease: LeaseState, meta: &Meta, now: Option<SystemTime>) -> LockRecord {
    let token = meta.token.unwrap_or(0);
    let now_ms = millis(now);
    let holder = || Some(meta.holder.clone().unwrap_or_else(|| "(being taken)".to_string()));
    let held_since = (meta.acquired_ms > 0).then(|| UNIX_EPOCH + Duration::from_millis(meta.acquired_ms));
    if meta.kept_at(now) {
        return LockRecord {
            holder: holder(),
            token,
            held_since,
            expires_in: Some(Duration::from_millis(meta.kept_until_ms - now_ms)),
            kept: true,
            ..LockRecord::free(lock)
        };
    }
    match lease {
        LeaseState::Free => LockRecord { token, ..LockRecord::free(lock) },
        LeaseState::Leased | LeaseState::Breaking => {
            let end = meta.renewed_ms.max(meta.acquired_ms) + meta.duration * 1000;
            LockRecord {
                holder: holder(),
                token,
                held_since,
                expires_in: Some(Duration::from_millis(end.saturating_sub(now_ms))),
                revoked: lease == LeaseState::Breaking,
                ..LockRecord::free(lock)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(blob_of("leaderrun/", "a/b%c").unwrap(), "leaderrun/a%2Fb%25c");
        assert_eq!(blob_of("p/", ".x.").unwrap(), "p/%2Ex%2E");
        assert_eq!(blob_of("p/", "back\\slash").unwrap(), "p/back%5Cslash");
        assert_eq!(lock_of("p/", "p/%2Ex%2E").as_deref(), Some(".x."));
        assert_eq!(lock_of("p/", "p/a%41"), None, "only the canonical spelling");
        assert_eq!(lock_of("p/", "p/.probe"), None);
        assert!(blob_of("p/", &"é".repeat(1100)).unwrap_err().contains("at most 1024"));
    }

    #[test]
    fn metadata_round_trips() {
        let meta = Meta {
            token: Some(7),
            holder: Some("hôst:1:ab%c".into()),
            lease: Some("0f8fad5b-d9cb-469f-a165-70867728950e".into()),
            acquired_ms: 1_000,
            renewed_ms: 2_000,
            duration: 15,
            kept_until_ms: 0,
        };
        let headers: BTreeMap<String, String> =
            meta.headers().into_iter().map(|(n, v)| (n.trim_start_matches("x-ms-meta-").to_string(), v)).collect();
        assert!(headers.values().all(|v| v.is_ascii()));
        assert_eq!(Meta::parse(&headers), meta);
    }

    /// The acquisition is noted from a `Date`, which counts whole seconds: it happened up to a
    /// second after the time noted, and a keep never ends before the time asked.
    #[test]
    fn a_keep_allows_for_the_whole_second_of_date() {
        let noted = 1_000_000; // "…:40 GMT": the lease was taken at :40.000 to :40.999
        let keep = Duration::from_secs(4);
        assert!(kept_until(noted, keep) >= noted + 999 + 4_000, "a keep that may end early");
        assert!(kept_until(noted, keep) <= noted + 1_000 + 4_000, "longer than the second needs");
        assert_eq!(kept_until(u64::MAX - 5, keep), u64::MAX);
    }

    #[test]
    fn records() {
        let at = |ms: u64| Some(UNIX_EPOCH + Duration::from_millis(ms));
        let meta =
            Meta { token: Some(3), holder: Some("a".into()), acquired_ms: 10_000, duration: 15, ..Meta::default() };
        let held = record("l", LeaseState::Leased, &meta, at(12_000));
        assert_eq!((held.holder.as_deref(), held.token, held.revoked), (Some("a"), 3, false));
        assert_eq!(held.expires_in, Some(Duration::from_secs(13)));
        assert!(record("l", LeaseState::Breaking, &meta, at(12_000)).revoked);
        let free = record("l", LeaseState::Free, &meta, at(12_000));
        assert_eq!((free.holder, free.token, free.expires_in), (None, 3, None));
        let kept = Meta { kept_until_ms: 20_000, ..meta.clone() };
        let record_kept = record("l", LeaseState::Free, &kept, at(12_000));
        assert!(record_kept.kept && record_kept.expires_in == Some(Duration::from_secs(8)));
        assert!(!record("l", LeaseState::Free, &kept, at(20_000)).is_held(), "a keep ends on the server's clock");
        let fresh = record("l", LeaseState::Leased, &Meta::default(), at(1));
        assert!(fresh.is_held(), "a lease taken a moment ago, before its holder wrote its name");
    }
}
