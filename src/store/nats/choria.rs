//! Leases in a Choria bucket: one with a bucket-wide max age and no per-message TTL, as
//! Choria's broker makes `CHORIA_LEADER_ELECTION` (and `choria kv add --ttl` any other).
//!
//! How Choria's campaigners use such a bucket (go-choria's `providers/election/streams`):
//! every interval, 0.75 × the max age, a candidate creates the key; a win is not used at
//! once: at its next tick the new leader updates the key on the revision it wrote, and only
//! once that succeeds does it sleep 200 ms and start working. Any failed update ends its work.
//! Nobody watches: a leader learns that it was evicted (a delete of the key, with no revision
//! check) only at its next update, up to one interval later. That cool-down, one interval +
//! 200 ms between winning and working, is what keeps a standby from starting beside an
//! evicted leader. So leaderrun plays by the same rules there:
//!
//! - an acquisition waits the cool-down and confirms with an update before its child starts
//!   (`Acquire::Confirm`), so an evicted Choria leader has stopped first;
//! - a holder's --ttl is at most one interval + 200 ms: its child is stopped by its deadline,
//!   which comes before a Choria standby that created the key right after an evict could have
//!   confirmed (the deadline is the ttl shortened for clock drift and a margin);
//! - Choria's own rules for the bucket are checked: a max age from 1 s to 1 h, and an interval
//!   of at least 1 s that is at least 1 s under the max age (so a max age of 4 s or more).
//!
//! A campaigner configured with a shorter interval of its own (go-choria's `WithBackoff` or
//! `WithCampaignInterval`) confirms sooner than this assumes; leaderrun cannot see that.

use std::time::Duration;

use crate::timing::CLOCK_DRIFT;

/// Choria's pause between a leader's confirming update and the start of its work.
const WON_PAUSE: Duration = Duration::from_millis(200);
/// Choria's bounds on a bucket's max age, and on its campaign interval.
const SHORTEST_MAX_AGE: Duration = Duration::from_secs(1);
const LONGEST_MAX_AGE: Duration = Duration::from_secs(3600);
const SHORTEST_INTERVAL: Duration = Duration::from_secs(1);

/// How Choria campaigns in a bucket with a given max age.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Choria {
    pub max_age: Duration,
    /// How often each campaigner writes: 0.75 × the max age.
    pub interval: Duration,
}

fn show(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

impl Choria {
    /// Choria's campaign in a bucket with this max age, or why Choria refuses the bucket (a
    /// bare reason, for the store to name the bucket in).
    pub fn for_max_age(max_age: Duration) -> Result<Choria, String> {
        let interval = max_age.mul_f64(0.75);
        let fits = "Choria's leader election needs a max age from 4s to 1h";
        if !(SHORTEST_MAX_AGE..=LONGEST_MAX_AGE).contains(&max_age) {
            return Err(format!("has a max age of {}, outside Choria's 1s to 1h; {fits}", show(max_age)));
        }
        if interval < SHORTEST_INTERVAL || max_age - interval < SHORTEST_INTERVAL {
            return Err(format!(
                "has a max age of {}, so Choria would campaign every {} (0.75 x max age), which must be at least \
                 1s and at least 1s under the max age; {fits}",
                show(max_age),
                show(interval)
            ));
        }
        Ok(Choria { max_age, interval })
    }

    /// How long a new holder waits after its winning write before it confirms the lease and
    /// starts: one interval, lengthened for clock drift, and Choria's 200 ms.
    pub fn cool_down(&self) -> Duration {
        self.interval.mul_f64(1.0 + 2.0 * CLOCK_DRIFT) + WON_PAUSE
    }

    /// The longest --ttl a holder may use: one interval + 200 ms, whole milliseconds. A Choria
    /// standby that creates the key right after an evict starts working that long after; the
    /// holder's deadline (ttl × (1 − 2 × drift) − margin) is earlier, even with both clocks
    /// off by the drift, so its child is gone first.
    pub fn longest_ttl(&self) -> Duration {
        Duration::from_millis((self.interval + WON_PAUSE).as_millis() as u64)
    }

    /// Why a lease of `ttl` does not fit, if it does not (`bucket` names the bucket in the
    /// message). `ttl` is the lease the store is asked for, --ttl + --lock-delay: the entry
    /// lives a max age from its last write in any case, longer than one interval, so a delay
    /// within it is kept in full. Holding the whole lease under one interval is stricter than
    /// needed (it costs a run with a delay a ttl shorter by the delay), but it is the one limit
    /// the store and `longest_ttl` share. The message names --ttl: a run with --lock-delay
    /// learnt the limit first and refused a lease over it in words that name both.
    pub fn refuse_ttl(&self, bucket: &str, ttl: Duration) -> Option<String> {
        (ttl > self.longest_ttl()).then(|| {
            format!(
                "--ttl {} does not fit Choria bucket {bucket:?} (max age {}): Choria campaigns there every {}, and \
                 a Choria standby that takes the key after an evict starts working {} later, so a holder must be \
                 stopped before that; use a --ttl of {} or less",
                show(ttl),
                show(self.max_age),
                show(self.interval),
                show(self.longest_ttl()),
                show(self.longest_ttl()),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn choria_rules_for_the_max_age() {
        let choria = Choria::for_max_age(s(6.0)).unwrap();
        assert_eq!(choria.interval, s(4.5));
        assert_eq!(choria.longest_ttl(), s(4.7));
        assert_eq!(choria.cool_down(), s(4.5 * 1.02 + 0.2));
        assert!(Choria::for_max_age(s(4.0)).is_ok() && Choria::for_max_age(s(3600.0)).is_ok());
        for bad in [0.5, 1.2, 3.9, 3601.0] {
            let err = Choria::for_max_age(s(bad)).unwrap_err();
            assert!(err.contains("from 4s to 1h") && !err.contains('\n'), "{bad}: {err}");
        }
        assert!(Choria::for_max_age(s(2.0)).unwrap_err().contains("campaign every 1s 500ms"));
    }

    #[test]
    fn a_holder_is_stopped_before_a_choria_standby_could_start() {
        use crate::timing::{Requested, MARGIN};
        for max_age in [4.0, 6.0, 60.0, 3600.0] {
            let choria = Choria::for_max_age(s(max_age)).unwrap();
            let timing = Requested {
                ttl: Some(choria.longest_ttl()),
                renew_every: None,
                kill_after: None,
                min_hold: None,
                server_skew: Duration::ZERO,
                waiting: true,
                failover: Duration::ZERO,
                lock_delay: Duration::ZERO,
            }
            .timing()
            .unwrap();
            // The holder's last write is sent at 0 and evicted at once; its SIGKILL comes at the
            // deadline on its clock, at most deadline × (1 + drift) in real time (plus the
            // margin the deadline keeps for the kill). A Choria standby creates the key at once
            // and starts working one interval on its clock (at least interval × (1 − drift)
            // real) + 200 ms later.
            let killed = timing.deadline_after(Duration::ZERO).mul_f64(1.0 + CLOCK_DRIFT) + MARGIN;
            let choria_starts = choria.interval.mul_f64(1.0 - CLOCK_DRIFT) + WON_PAUSE;
            assert!(killed <= choria_starts, "max age {max_age}: {killed:?} > {choria_starts:?}");
            assert!(choria.refuse_ttl("B", timing.ttl).is_none());
            let err = choria.refuse_ttl("B", timing.ttl + s(0.001)).unwrap();
            assert!(err.contains("use a --ttl of") && err.contains("\"B\""), "{err}");
        }
    }
}
