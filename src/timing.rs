//! Every timing rule, validated in one place (DESIGN.md §3).
//!
//! The holder reads its clock just BEFORE it sends an acquire or renew request
//! (`sent`); only a confirmed success moves its local deadline to
//! `sent + ttl·(1 − 2ρ) − margin`. The child's process group gets the stop signal
//! at `deadline − kill_after` and SIGKILL at `deadline`. For that to leave room
//! for a renewal that fails once, `ttl·(1 − 2ρ) − margin > renew_every + kill_after`.

use std::time::Duration;

/// Assumed bound on how far any machine's elapsed-time clock may run fast or slow (ρ).
pub const CLOCK_DRIFT: f64 = 0.01;

/// Slack between the local deadline and the lease's expiry in the store: covers
/// the delivery of SIGKILL and the reaping of the group.
pub const MARGIN: Duration = Duration::from_millis(100);

/// Longest lease accepted: a lease that outlives a day is a mistake, not a setting.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Longest --min-hold or --timeout accepted (a month).
pub const MAX_LONG: Duration = Duration::from_secs(31 * 24 * 3600);

/// Default --min-hold in one-shot mode.
pub const ONE_SHOT_MIN_HOLD: Duration = Duration::from_secs(10);

/// The validated timings of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub kill_after: Duration,
    pub min_hold: Duration,
}

/// A timing rule that broke, worded for the user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TimingError(pub String);

fn show(d: Duration) -> String {
    // Round to milliseconds so that ttl/3 prints as 5s, not 5.000000333s.
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

impl Timing {
    /// Build and check the timings. `renew_every` defaults to ttl/3 and `min_hold`
    /// to 10 s one-shot, 0 with --wait.
    pub fn new(
        ttl: Duration,
        renew_every: Option<Duration>,
        kill_after: Duration,
        min_hold: Option<Duration>,
        waiting: bool,
    ) -> Result<Self, TimingError> {
        let renew_every = renew_every.unwrap_or(ttl / 3);
        let min_hold = min_hold.unwrap_or(if waiting { Duration::ZERO } else { ONE_SHOT_MIN_HOLD });
        let timing = Self { ttl, renew_every, kill_after, min_hold };
        timing.validate()?;
        Ok(timing)
    }

    fn validate(&self) -> Result<(), TimingError> {
        let fail = |msg: String| Err(TimingError(msg));
        for (flag, value) in
            [("--ttl", self.ttl), ("--renew-every", self.renew_every), ("--kill-after", self.kill_after)]
        {
            if value.is_zero() {
                return fail(format!("{flag} must be positive"));
            }
        }
        if self.ttl > MAX_TTL {
            return fail(format!("--ttl {} is longer than the maximum of {}", show(self.ttl), show(MAX_TTL)));
        }
        if self.min_hold > MAX_LONG {
            return fail(format!(
                "--min-hold {} is longer than the maximum of {}",
                show(self.min_hold),
                show(MAX_LONG)
            ));
        }
        if self.renew_every >= self.ttl {
            return fail(format!(
                "--renew-every ({}) must be shorter than --ttl ({})",
                show(self.renew_every),
                show(self.ttl)
            ));
        }
        let needed = self.renew_every + self.kill_after;
        if self.safe_lease() <= needed {
            return fail(format!(
                "--ttl {} is too short: ttl x (1 - 2 x {CLOCK_DRIFT} clock drift) - {} margin must exceed \
                 --renew-every ({}) + --kill-after ({}); raise --ttl or lower the others",
                show(self.ttl),
                show(MARGIN),
                show(self.renew_every),
                show(self.kill_after),
            ));
        }
        Ok(())
    }

    /// How long after a request was SENT its confirmed success keeps the lease safe locally.
    pub fn safe_lease(&self) -> Duration {
        self.ttl.mul_f64(1.0 - 2.0 * CLOCK_DRIFT).saturating_sub(MARGIN)
    }

    /// The local deadline earned by a request sent at `sent` that succeeded.
    pub fn deadline_after(&self, sent: Duration) -> Duration {
        sent + self.safe_lease()
    }

    /// When the child's group gets the stop signal if no renewal succeeds before `deadline`.
    pub fn stop_at(&self, deadline: Duration) -> Duration {
        deadline.saturating_sub(self.kill_after)
    }

    /// How long one acquire or renew request may take before it counts as failed (it is then
    /// retried; the deadline it would have moved stays where it was).
    pub fn request_timeout(&self) -> Duration {
        self.renew_every
    }

    /// Pause before retrying a failed renewal.
    pub fn retry_every(&self) -> Duration {
        (self.renew_every / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }
}

/// Check a --timeout.
pub fn validate_timeout(timeout: Option<Duration>) -> Result<(), TimingError> {
    match timeout {
        Some(t) if t > MAX_LONG => {
            Err(TimingError(format!("--timeout {} is longer than the maximum of {}", show(t), show(MAX_LONG))))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(secs: f64) -> Duration {
        Duration::from_secs_f64(secs)
    }

    #[test]
    fn defaults_are_valid() {
        let t = Timing::new(s(15.0), None, s(5.0), None, false).unwrap();
        assert_eq!(t.renew_every, s(5.0));
        assert_eq!(t.min_hold, ONE_SHOT_MIN_HOLD);
        let t = Timing::new(s(15.0), None, s(5.0), None, true).unwrap();
        assert_eq!(t.min_hold, Duration::ZERO);
    }

    #[test]
    fn deadline_is_anchored_at_send_and_shortened_for_drift_and_margin() {
        let t = Timing::new(s(10.0), None, s(1.0), None, true).unwrap();
        assert_eq!(t.deadline_after(s(100.0)), s(100.0) + s(9.8) - MARGIN);
        assert_eq!(t.stop_at(t.deadline_after(s(100.0))), s(100.0) + s(8.8) - MARGIN);
    }

    #[test]
    fn refuses_zero_values() {
        for (ttl, renew, kill) in [(0.0, 1.0, 1.0), (10.0, 0.0, 1.0), (10.0, 1.0, 0.0)] {
            let err = Timing::new(s(ttl), Some(s(renew)), s(kill), None, true).unwrap_err();
            assert!(err.0.contains("must be positive"), "{err}");
        }
    }

    #[test]
    fn refuses_ttl_too_short_for_renew_and_grace() {
        let err = Timing::new(s(5.0), None, s(5.0), None, true).unwrap_err();
        assert!(err.0.contains("--ttl 5s is too short"), "{err}");
        assert!(err.0.contains("--kill-after (5s)"), "{err}");
        // Exactly at the boundary is refused too.
        let t = Timing::new(s(10.0), Some(s(4.0)), s(1.0), None, true).unwrap();
        let boundary = t.safe_lease() - s(4.0);
        assert!(Timing::new(s(10.0), Some(s(4.0)), boundary, None, true).is_err());
    }

    #[test]
    fn refuses_renew_not_shorter_than_ttl() {
        let err = Timing::new(s(10.0), Some(s(10.0)), s(1.0), None, true).unwrap_err();
        assert!(err.0.contains("--renew-every (10s) must be shorter than --ttl (10s)"), "{err}");
    }

    #[test]
    fn refuses_absurd_lengths() {
        assert!(Timing::new(s(200_000.0), None, s(1.0), None, true).unwrap_err().0.contains("maximum"));
        assert!(Timing::new(s(15.0), None, s(1.0), Some(s(1e8)), true).unwrap_err().0.contains("--min-hold"));
        assert!(validate_timeout(Some(s(1e8))).is_err());
        assert!(validate_timeout(Some(s(60.0))).is_ok());
    }
}
