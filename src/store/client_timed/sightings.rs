//! What this client has seen of other holders' records: client-go's `observedTime`.
//!
//! A record's writer and its readers share no clock. The only thing a standby can time
//! is how long it has itself seen one version of the record unchanged, on its own
//! elapsed-time clock. Once that span covers the holder's whole lease, stretched for a
//! clock running slow or fast by ρ, plus the margin, the holder has stopped its child
//! (its deadline came earlier, by the same rule read from the other side) and the
//! record may be taken.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use super::records::Version;
use crate::timing::{CLOCK_DRIFT, MARGIN};

/// How long one version must be seen unchanged before its lease counts as lapsed:
/// `ttl·(1 + 2ρ) + margin`.
pub fn observation(ttl_seconds: u32) -> Duration {
    Duration::from_secs(u64::from(ttl_seconds)).mul_f64(1.0 + 2.0 * CLOCK_DRIFT) + MARGIN
}

/// The judgement on a record someone else holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Seen unchanged for a whole observation: its holder has stopped.
    Lapsed,
    /// Still within its observation, `left` to go. `alive`: this client has seen the
    /// record change, so its holder was renewing a moment ago (a one-shot run gives up).
    Watching { left: Duration, alive: bool },
}

struct Sighting {
    version: Version,
    /// The clock reading when this version was first seen (after the read answered).
    since: Duration,
    ttl_seconds: u32,
    /// A different version was seen before this one.
    moved: bool,
}

/// Sightings per lock, for the life of one client.
#[derive(Default)]
pub struct Sightings(Mutex<HashMap<String, Sighting>>);

impl Sightings {
    /// `lock` was seen at `version` (held, lease `ttl_seconds`) at `seen_at` (when a read's
    /// answer or a feed's event arrived): note it, and judge it at `now`.
    pub fn judge(&self, lock: &str, version: &Version, ttl_seconds: u32, seen_at: Duration, now: Duration) -> Verdict {
        let mut seen = self.0.lock().unwrap();
        let sighting = match seen.get_mut(lock) {
            Some(s) if s.version == *version => s,
            earlier => {
                let moved = earlier.is_some();
                let fresh = Sighting { version: version.clone(), since: seen_at, ttl_seconds, moved };
                seen.insert(lock.to_string(), fresh);
                seen.get_mut(lock).expect("just inserted")
            }
        };
        let watched = now.saturating_sub(sighting.since);
        let needed = observation(sighting.ttl_seconds);
        if watched >= needed {
            Verdict::Lapsed
        } else {
            Verdict::Watching { left: needed - watched, alive: sighting.moved }
        }
    }

    /// The version last seen of `lock`, and how long until it would count as lapsed.
    pub fn last(&self, lock: &str, now: Duration) -> Option<(Version, Duration)> {
        let seen = self.0.lock().unwrap();
        let s = seen.get(lock)?;
        Some((s.version.clone(), observation(s.ttl_seconds).saturating_sub(now.saturating_sub(s.since))))
    }

    /// The record is this client's own now, or free: nothing to time.
    pub fn forget(&self, lock: &str) {
        self.0.lock().unwrap().remove(lock);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version(s.into())
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn one_version_lapses_after_the_stretched_lease_and_a_change_restarts_the_count() {
        let seen = Sightings::default();
        let full = observation(10);
        assert_eq!(full, Duration::from_millis(10_300));
        let first = seen.judge("x", &v("1"), 10, secs(100), secs(100));
        assert_eq!(first, Verdict::Watching { left: full, alive: false });
        let later = seen.judge("x", &v("1"), 10, secs(105), secs(105));
        assert_eq!(later, Verdict::Watching { left: full - Duration::from_secs(5), alive: false });
        assert_eq!(seen.judge("x", &v("1"), 10, secs(100) + full, secs(100) + full), Verdict::Lapsed);
        // The holder renewed: a new version, counted afresh, and known to be alive.
        let renewed = seen.judge("x", &v("2"), 10, secs(110), secs(111));
        // Counted from when it was seen (a feed's event may be judged a moment later).
        assert_eq!(renewed, Verdict::Watching { left: full - secs(1), alive: true });
        assert_eq!(seen.last("x", secs(112)), Some((v("2"), full - secs(2))));
        seen.forget("x");
        assert_eq!(seen.judge("x", &v("3"), 10, secs(200), secs(200)), Verdict::Watching { left: full, alive: false });
    }
}
