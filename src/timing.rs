//! Every timing rule, validated in one place (DESIGN.md §3).
//!
//! The holder reads its clock just BEFORE it sends an acquire or renew request
//! (`sent`); only a confirmed success moves its local deadline to
//! `sent + ttl·(1 − 2ρ) − margin − skew`. The child's process group gets the stop signal
//! at `deadline − kill_after` and SIGKILL at `deadline`. For that to leave room
//! for a renewal that fails once, `ttl·(1 − 2ρ) − margin − skew > renew_every + kill_after`,
//! where `skew` is how far the wall clocks of a store's servers may differ, for stores that
//! judge expiry on them (a failover to a server whose clock runs ahead ends leases early).
//!
//! --lock-delay: every acquire and renew request asks the store for a lease of
//! `ttl + lock_delay` (`Timing::store_ttl`), while the deadline, the stop signal, SIGKILL
//! and the renewal schedule stay computed from `ttl` alone. A holder lost uncleanly
//! (killed, frozen, cut off) has its child stopped by `sent + ttl·(1 − 2ρ) − margin`, but
//! the store keeps the lock closed until `sent + ttl + lock_delay`: at least `lock_delay`
//! more, room for writes the killed child still had in flight (an uninterruptible sleep,
//! an NFS write). A release frees the lock at once, as without a delay.

use std::time::Duration;

/// Assumed bound on how far any machine's elapsed-time clock may run fast or slow (ρ).
pub const CLOCK_DRIFT: f64 = 0.01;

/// Slack between the local deadline and the lease's expiry in the store: covers
/// the delivery of SIGKILL and the reaping of the group.
pub const MARGIN: Duration = Duration::from_millis(100);

/// Longest lease accepted: a lease that outlives a day is a mistake, not a setting. It
/// bounds what the store is asked to keep, ttl + --lock-delay, too.
pub const MAX_TTL: Duration = Duration::from_secs(24 * 3600);

/// Longest --min-hold or --timeout accepted (a month).
pub const MAX_LONG: Duration = Duration::from_secs(31 * 24 * 3600);

/// Default --min-hold in one-shot mode.
pub const ONE_SHOT_MIN_HOLD: Duration = Duration::from_secs(10);

/// How long a one-shot run without --timeout goes on retrying a store that fails transiently
/// (a cluster electing a new leader: etcd takes 0.4–2.3 s, see docs/clusters.md)
/// before it exits 69. Short enough that a late host still meets the firing's holder in the
/// store (see `Timing::one_shot_retry`), long enough for an election at the engines' defaults.
pub const ONE_SHOT_RETRY: Duration = Duration::from_secs(5);

/// What a renewal window must leave beyond a store's failover (`Requested::default_ttl`): a
/// copy of the renewal sent after the failover, and its answer.
const FAILOVER_SLACK: Duration = Duration::from_secs(2);

/// Longest ttl a store's failover may raise the default to.
const MAX_DEFAULT_TTL: Duration = Duration::from_secs(120);

/// Default --ttl, when the store allows it (a store may cap it: see `Requested::fit`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// Longest default --kill-after; shorter ttls get a third of the ttl.
pub const DEFAULT_KILL_AFTER: Duration = Duration::from_secs(5);

/// Default --server-clock-skew: how far apart the wall clocks of a store's servers that
/// may replace each other (a primary and the replica promoted after a failover) may be.
/// NTP keeps servers within milliseconds; half a second also covers a poorly synced one.
pub const DEFAULT_SERVER_SKEW: Duration = Duration::from_millis(500);

/// The timing flags as the user gave them (`None`: not given, a default applies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requested {
    pub ttl: Option<Duration>,
    pub renew_every: Option<Duration>,
    pub kill_after: Option<Duration>,
    pub min_hold: Option<Duration>,
    /// --server-clock-skew; counted only for stores that judge expiry on their servers'
    /// wall clocks (zero for the others).
    pub server_skew: Duration,
    /// --wait (min-hold defaults to 0 then).
    pub waiting: bool,
    /// Not a flag: how long the store says it may take to serve again after losing one of
    /// its servers, when that is longer than these defaults allow for (`Store::failover`; zero
    /// otherwise). The defaults then grow to ride it out (DESIGN.md §9).
    pub failover: Duration,
    /// --lock-delay (zero by default): how much longer than the ttl the store keeps a lease
    /// that is not renewed (`Timing::store_ttl`).
    pub lock_delay: Duration,
}

impl Requested {
    /// The timings, with defaults scaled to the ttl: --renew-every a third of it,
    /// --kill-after a third of it up to 5 s.
    pub fn timing(&self) -> Result<Timing, TimingError> {
        self.with_ttl(self.ttl.unwrap_or_else(|| self.default_ttl()))
    }

    /// 15 s, or, for a store whose failover takes longer than that allows for, the shortest
    /// whole-second ttl whose renewals ride it out: one renewal may go out just before a node
    /// is lost, and the store must have answered it (or its copy) before the stop time, so the
    /// time from a renewal's sending to the stop signal must cover the failover and
    /// `FAILOVER_SLACK`.
    fn default_ttl(&self) -> Duration {
        if self.failover.is_zero() {
            return DEFAULT_TTL;
        }
        let rides_it_out = |t: &Timing| t.renew_window() >= self.failover + FAILOVER_SLACK;
        (DEFAULT_TTL.as_secs()..=MAX_DEFAULT_TTL.as_secs())
            .map(Duration::from_secs)
            .find(|ttl| self.with_ttl(*ttl).is_ok_and(|t| rides_it_out(&t)))
            .unwrap_or(MAX_DEFAULT_TTL)
    }

    /// The lease the store is asked to keep when no --ttl is given: the default ttl and
    /// --lock-delay. A store that limits its leases is asked whether this fits
    /// (`Store::longest_ttl`).
    pub fn default_store_ttl(&self) -> Duration {
        self.default_ttl().saturating_add(self.lock_delay)
    }

    /// The timings for a store that keeps leases of at most `longest`; what it must keep is
    /// ttl + --lock-delay (`Timing::store_ttl`). Without --ttl the longest ttl up to the
    /// default whose lease fits is used (`Some`). An explicit --ttl is left for the store to
    /// judge (`None`: keep `timing()`), unless a --lock-delay is what makes it too long: that is
    /// refused here, in words that name it.
    pub fn fit(&self, longest: Duration) -> Option<Result<Timing, TimingError>> {
        let delay = self.lock_delay;
        if let Some(ttl) = self.ttl {
            return (!delay.is_zero() && ttl.saturating_add(delay) > longest).then(|| {
                Err(TimingError(format!(
                    "--ttl {} + --lock-delay {} is a lease of {}, but the store keeps leases of at most {}; \
                     lower --ttl or --lock-delay",
                    show(ttl),
                    show(delay),
                    show(ttl.saturating_add(delay)),
                    show(longest)
                )))
            });
        }
        if longest >= self.default_store_ttl() {
            return None;
        }
        if longest <= delay {
            return Some(Err(TimingError(format!(
                "--lock-delay {} leaves no ttl: the store keeps leases of at most {}, and a lease lasts \
                 ttl + --lock-delay; lower --lock-delay",
                show(delay),
                show(longest)
            ))));
        }
        // Whole milliseconds, rounded down: "the longest that fits" must still fit.
        let ttl = Duration::from_millis((longest - delay).as_millis() as u64);
        Some(self.with_ttl(ttl).map_err(|e| {
            let with_delay =
                if delay.is_zero() { String::new() } else { format!(" less --lock-delay {}", show(delay)) };
            TimingError(format!(
                "the store keeps leases of at most {}{with_delay}, too short for leaderrun's timing rule: {e}",
                show(longest)
            ))
        }))
    }

    fn with_ttl(&self, ttl: Duration) -> Result<Timing, TimingError> {
        let renew_every = self.renew_every.unwrap_or(ttl / 3);
        let kill_after = self.kill_after.unwrap_or((ttl / 3).min(DEFAULT_KILL_AFTER));
        // A one-shot run retries for as long as the store's failover may last (`one_shot_retry`),
        // and its keep lasts twice that by default, so that a late host still meets it.
        let one_shot_keep = ONE_SHOT_MIN_HOLD.max(self.failover * 2);
        let min_hold = self.min_hold.unwrap_or(if self.waiting { Duration::ZERO } else { one_shot_keep });
        let timing = Timing {
            ttl,
            renew_every,
            kill_after,
            min_hold,
            server_skew: self.server_skew,
            failover: self.failover,
            lock_delay: self.lock_delay,
        };
        timing.validate(self)?;
        Ok(timing)
    }
}

/// The validated timings of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub ttl: Duration,
    pub renew_every: Duration,
    pub kill_after: Duration,
    pub min_hold: Duration,
    /// The store's failover, as `Requested::failover` (zero for most stores).
    pub failover: Duration,
    /// How far the store's servers' wall clocks may differ (zero where expiry is not judged
    /// on them): a failover can bring the lease's expiry that much closer.
    pub server_skew: Duration,
    /// --lock-delay: added to the lease the store keeps, never to the holder's deadline.
    pub lock_delay: Duration,
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
    /// Check the rules; `asked` says which values the user gave, so that a message about a
    /// default names the flag that would change it.
    fn validate(&self, asked: &Requested) -> Result<(), TimingError> {
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
        if self.store_ttl() > MAX_TTL {
            return fail(format!(
                "--lock-delay {} with --ttl {} asks the store for a lease of {}, longer than the maximum of {}",
                show(self.lock_delay),
                show(self.ttl),
                show(self.store_ttl()),
                show(MAX_TTL)
            ));
        }
        if self.min_hold > MAX_LONG {
            return fail(format!(
                "--min-hold {} is longer than the maximum of {}",
                show(self.min_hold),
                show(MAX_LONG)
            ));
        }
        if self.server_skew >= self.ttl {
            return fail(format!(
                "--server-clock-skew ({}) must be shorter than --ttl ({})",
                show(self.server_skew),
                show(self.ttl)
            ));
        }
        if self.renew_every >= self.ttl {
            return fail(format!(
                "--renew-every ({}) must be shorter than --ttl ({})",
                show(self.renew_every),
                show(self.ttl)
            ));
        }
        let needed = self.renew_every.saturating_add(self.kill_after);
        if self.safe_lease() <= needed {
            let given = |v: Option<Duration>| if v.is_some() { "" } else { ", the default" };
            let skew = if self.server_skew.is_zero() {
                String::new()
            } else {
                format!(" - {} --server-clock-skew", show(self.server_skew))
            };
            return fail(format!(
                "--ttl {} is too short: ttl x (1 - 2 x {CLOCK_DRIFT} clock drift) - {} margin{skew} must exceed \
                 --renew-every ({}{}) + --kill-after ({}{}); raise --ttl or lower the others",
                show(self.ttl),
                show(MARGIN),
                show(self.renew_every),
                given(asked.renew_every),
                show(self.kill_after),
                given(asked.kill_after),
            ));
        }
        Ok(())
    }

    /// The lease every acquire and renew request asks the store for: ttl + --lock-delay.
    /// Only the store's lifetime of the lease grows; the deadline, the stop signal, SIGKILL
    /// and the renewals are all timed from `ttl` (`deadline_after`, `stop_at`), so a holder
    /// lost uncleanly has its child stopped by the timing rule for `ttl` while no standby may
    /// take the lock before `lock_delay` after its lease ends. A release frees it at once.
    pub fn store_ttl(&self) -> Duration {
        self.ttl.saturating_add(self.lock_delay)
    }

    /// How long after a request was SENT its confirmed success keeps the lease safe locally:
    /// the ttl shortened for clock drift, the margin, and how far a failover may move the
    /// servers' clock.
    pub fn safe_lease(&self) -> Duration {
        self.ttl.mul_f64(1.0 - 2.0 * CLOCK_DRIFT).saturating_sub(MARGIN).saturating_sub(self.server_skew)
    }

    /// The local deadline earned by a request sent at `sent` that succeeded.
    pub fn deadline_after(&self, sent: Duration) -> Duration {
        sent + self.safe_lease()
    }

    /// When the child's group gets the stop signal if no renewal succeeds before `deadline`.
    pub fn stop_at(&self, deadline: Duration) -> Duration {
        deadline.saturating_sub(self.kill_after)
    }

    /// How long an acquire or release may take before it counts as failed. An acquire that
    /// answers later could not leave the child its time anyway.
    pub fn request_timeout(&self) -> Duration {
        self.renew_every
    }

    /// How long a renewal goes unanswered before a second request is sent beside it: half the
    /// time between the renewal and the stop signal, so that a request that hangs (a half-open
    /// connection, a database failover) still leaves time for another before the child must
    /// be stopped.
    pub fn renew_timeout(&self) -> Duration {
        let window = self.renew_window();
        (window / 2).max(Duration::from_millis(1))
    }

    /// How long a one-shot run without --timeout retries transient store failures: 5 s (or
    /// the store's failover, if longer), and never more than half its --min-hold. A host whose
    /// retry gets through late then still finds the lock kept by a host that ran the same
    /// firing at once (the keep lasts --min-hold from that acquisition), with the other half
    /// left for cron firing a little apart on the hosts. With --min-hold 0 there is no keep to
    /// stay within.
    pub fn one_shot_retry(&self) -> Duration {
        let retry = ONE_SHOT_RETRY.max(self.failover);
        if self.min_hold.is_zero() {
            retry
        } else {
            retry.min(self.min_hold / 2)
        }
    }

    /// From a renewal's sending to the stop signal, if no renewal confirms: what a store's
    /// failover must fit in (DESIGN.md §9).
    pub fn renew_window(&self) -> Duration {
        self.safe_lease().saturating_sub(self.renew_every.saturating_add(self.kill_after))
    }

    /// Pause before retrying a renewal that failed at once (one that timed out is retried
    /// at once: it has waited already).
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

    fn asked(ttl: Option<f64>, renew: Option<f64>, kill: Option<f64>) -> Requested {
        Requested {
            ttl: ttl.map(s),
            renew_every: renew.map(s),
            kill_after: kill.map(s),
            min_hold: None,
            server_skew: Duration::ZERO,
            waiting: true,
            failover: Duration::ZERO,
            lock_delay: Duration::ZERO,
        }
    }

    fn timing(ttl: f64, renew: Option<f64>, kill: f64) -> Result<Timing, TimingError> {
        asked(Some(ttl), renew, Some(kill)).timing()
    }

    #[test]
    fn defaults_are_valid() {
        let t = Requested { waiting: false, ..asked(None, None, None) }.timing().unwrap();
        assert_eq!((t.ttl, t.renew_every, t.kill_after), (s(15.0), s(5.0), s(5.0)));
        assert_eq!(t.min_hold, ONE_SHOT_MIN_HOLD);
        let t = asked(None, None, None).timing().unwrap();
        assert_eq!(t.min_hold, Duration::ZERO);
        let t = Requested { server_skew: DEFAULT_SERVER_SKEW, ..asked(None, None, None) }.timing().unwrap();
        assert_eq!(t.server_skew, DEFAULT_SERVER_SKEW);
    }

    #[test]
    fn defaults_scale_with_a_short_ttl() {
        // Only --ttl given: --renew-every and --kill-after follow it.
        for ttl in [2.0, 5.0, 9.0] {
            let t = Requested { server_skew: DEFAULT_SERVER_SKEW, ..asked(Some(ttl), None, None) }
                .timing()
                .unwrap_or_else(|e| panic!("--ttl {ttl}s alone: {e}"));
            assert_eq!((t.renew_every, t.kill_after), (s(ttl) / 3, s(ttl) / 3));
        }
        let t = asked(Some(60.0), None, None).timing().unwrap();
        assert_eq!((t.renew_every, t.kill_after), (s(20.0), DEFAULT_KILL_AFTER));
        // An explicit value that breaks the rule is still refused, and named as the user's.
        let err = asked(Some(5.0), None, Some(5.0)).timing().unwrap_err();
        assert!(err.0.contains("--ttl 5s is too short") && err.0.contains("--kill-after (5s)"), "{err}");
        assert!(err.0.contains("--renew-every (1s 666ms, the default)"), "{err}");
    }

    #[test]
    fn a_store_limit_caps_the_default_ttl_only() {
        let req = asked(None, None, None);
        let t = req.fit(s(7.6)).expect("capped").unwrap();
        assert_eq!((t.ttl, t.kill_after), (s(7.6), s(7.6) / 3));
        assert!(req.fit(s(15.0)).is_none() && req.fit(s(3600.0)).is_none());
        assert!(asked(Some(20.0), None, None).fit(s(7.6)).is_none(), "an explicit --ttl is the store's to refuse");
        let err = req.fit(s(0.2)).expect("capped").unwrap_err();
        assert!(err.0.contains("the store keeps leases of at most 200ms"), "{err}");
    }

    #[test]
    fn deadline_is_anchored_at_send_and_shortened_for_drift_margin_and_skew() {
        let t = timing(10.0, None, 1.0).unwrap();
        assert_eq!(t.deadline_after(s(100.0)), s(100.0) + s(9.8) - MARGIN);
        assert_eq!(t.stop_at(t.deadline_after(s(100.0))), s(100.0) + s(8.8) - MARGIN);
        let skewed = Requested { server_skew: s(0.5), ..asked(Some(10.0), None, Some(1.0)) }.timing().unwrap();
        assert_eq!(skewed.safe_lease(), t.safe_lease() - s(0.5));
    }

    #[test]
    fn a_skew_counts_in_the_rule() {
        assert!(timing(3.0, Some(1.0), 1.5).is_ok());
        let err = Requested { server_skew: s(0.5), ..asked(Some(3.0), Some(1.0), Some(1.5)) }.timing().unwrap_err();
        assert!(err.0.contains("500ms --server-clock-skew"), "{err}");
        let err = Requested { server_skew: s(3.0), ..asked(Some(3.0), None, None) }.timing().unwrap_err();
        assert!(err.0.contains("--server-clock-skew (3s) must be shorter than --ttl"), "{err}");
    }

    #[test]
    fn two_renewal_attempts_fit_before_the_stop_signal() {
        for (ttl, renew, kill) in [(15.0, None, 5.0), (2.0, Some(0.5), 0.5), (3.0, Some(1.0), 1.0), (60.0, None, 1.0)] {
            let t = timing(ttl, renew, kill).unwrap();
            let first = t.renew_every; // after the acquire was sent
            let stop = t.stop_at(t.deadline_after(Duration::ZERO));
            assert!(first + 2 * t.renew_timeout() <= stop, "{t:?}: {:?}", t.renew_timeout());
        }
    }

    #[test]
    fn refuses_zero_values() {
        for (ttl, renew, kill) in [(0.0, 1.0, 1.0), (10.0, 0.0, 1.0), (10.0, 1.0, 0.0)] {
            let err = timing(ttl, Some(renew), kill).unwrap_err();
            assert!(err.0.contains("must be positive"), "{err}");
        }
    }

    #[test]
    fn refuses_ttl_too_short_for_renew_and_grace() {
        let err = timing(5.0, None, 5.0).unwrap_err();
        assert!(err.0.contains("--ttl 5s is too short"), "{err}");
        // Exactly at the boundary is refused too.
        let t = timing(10.0, Some(4.0), 1.0).unwrap();
        let boundary = (t.safe_lease() - s(4.0)).as_secs_f64();
        assert!(timing(10.0, Some(4.0), boundary).is_err());
    }

    #[test]
    fn refuses_renew_not_shorter_than_ttl() {
        let err = timing(10.0, Some(10.0), 1.0).unwrap_err();
        assert!(err.0.contains("--renew-every (10s) must be shorter than --ttl (10s)"), "{err}");
    }

    #[test]
    fn refuses_absurd_lengths() {
        assert!(timing(200_000.0, None, 1.0).unwrap_err().0.contains("maximum"));
        let long_hold = Requested { min_hold: Some(s(1e8)), ..asked(Some(15.0), None, Some(1.0)) };
        assert!(long_hold.timing().unwrap_err().0.contains("--min-hold"));
        assert!(validate_timeout(Some(s(1e8))).is_err());
        assert!(validate_timeout(Some(s(60.0))).is_ok());
    }

    #[test]
    fn a_one_shot_retries_for_5s_and_within_half_its_keep() {
        let one_shot = |min_hold: Option<f64>| {
            Requested { min_hold: min_hold.map(s), waiting: false, ..asked(None, None, None) }.timing().unwrap()
        };
        assert_eq!(one_shot(None).one_shot_retry(), s(5.0), "the default keep (10 s) leaves the full 5 s");
        assert_eq!(one_shot(Some(4.0)).one_shot_retry(), s(2.0));
        assert_eq!(one_shot(Some(60.0)).one_shot_retry(), s(5.0));
        assert_eq!(one_shot(Some(0.0)).one_shot_retry(), s(5.0), "no keep to stay within");
    }

    #[test]
    fn a_store_with_a_long_failover_gets_defaults_that_ride_it_out() {
        // A replicated NATS bucket: its stream's leader may take 15 s to be elected again.
        let one_shot = Requested { waiting: false, failover: s(15.0), ..asked(None, None, None) }.timing().unwrap();
        assert_eq!(one_shot.ttl, s(35.0), "the shortest whole-second ttl whose window covers 15 s + 2 s");
        assert!(one_shot.renew_window() >= s(17.0), "{:?}", one_shot.renew_window());
        let shorter = Requested { ttl: Some(s(34.0)), ..asked(None, None, None) }.timing().unwrap();
        assert!(shorter.renew_window() < s(17.0), "35 s is the shortest: {:?}", shorter.renew_window());
        assert_eq!(one_shot.min_hold, s(30.0), "a keep twice the retry");
        assert_eq!(one_shot.one_shot_retry(), s(15.0));
        // What the user gives stands.
        let given = Requested { failover: s(15.0), ..asked(Some(15.0), None, None) }.timing().unwrap();
        assert_eq!(given.ttl, s(15.0));
        // A store whose failover the defaults already ride out changes nothing.
        assert_eq!(asked(None, None, None).timing().unwrap().ttl, DEFAULT_TTL);
    }

    #[test]
    fn a_lock_delay_lengthens_the_stores_lease_only() {
        let plain = asked(Some(10.0), None, None).timing().unwrap();
        let delayed = Requested { lock_delay: s(30.0), ..asked(Some(10.0), None, None) }.timing().unwrap();
        assert_eq!((plain.store_ttl(), delayed.store_ttl()), (s(10.0), s(40.0)));
        // Everything the holder does is timed from the ttl alone.
        assert_eq!(delayed.deadline_after(s(100.0)), plain.deadline_after(s(100.0)));
        assert_eq!(delayed.stop_at(delayed.deadline_after(s(100.0))), plain.stop_at(plain.deadline_after(s(100.0))));
        assert_eq!(
            (delayed.renew_every, delayed.kill_after, delayed.renew_timeout(), delayed.request_timeout()),
            (plain.renew_every, plain.kill_after, plain.renew_timeout(), plain.request_timeout())
        );
        // The store lets a standby in no sooner than the delay after the holder's SIGKILL.
        let sent = s(100.0);
        assert!(sent + delayed.store_ttl() >= delayed.deadline_after(sent) + s(30.0));
    }

    #[test]
    fn a_lock_delay_is_capped_with_the_ttl_at_a_day() {
        let at_most = Requested { lock_delay: MAX_TTL - s(15.0), ..asked(None, None, None) }.timing().unwrap();
        assert_eq!(at_most.store_ttl(), MAX_TTL);
        let err = Requested { lock_delay: MAX_TTL, ..asked(Some(15.0), None, None) }.timing().unwrap_err();
        assert!(err.0.contains("--lock-delay 1day with --ttl 15s") && err.0.contains("maximum of 1day"), "{err}");
    }

    #[test]
    fn a_store_limit_takes_the_lock_delay_from_the_default_ttl() {
        let delayed = |delay: f64| Requested { lock_delay: s(delay), ..asked(None, None, None) };
        // The store keeps 20 s: with a delay of 8 s the default ttl becomes 12 s.
        let t = delayed(8.0).fit(s(20.0)).expect("capped").unwrap();
        assert_eq!((t.ttl, t.store_ttl(), t.renew_every), (s(12.0), s(20.0), s(4.0)));
        // Room for the default 15 s and the delay: nothing to fit.
        assert!(delayed(5.0).fit(s(20.0)).is_none());
        assert_eq!(delayed(5.0).default_store_ttl(), s(20.0));
        // A delay that leaves no ttl, or one too short for the timing rule: refused, naming it.
        let err = delayed(20.0).fit(s(20.0)).expect("capped").unwrap_err();
        assert!(err.0.contains("--lock-delay 20s leaves no ttl") && err.0.contains("at most 20s"), "{err}");
        let err = delayed(19.9).fit(s(20.0)).expect("capped").unwrap_err();
        assert!(err.0.contains("at most 20s less --lock-delay 19s 900ms"), "{err}");
        // An explicit --ttl that fits alone but not with the delay: refused here, naming both.
        let given = Requested { lock_delay: s(8.0), ..asked(Some(15.0), None, None) };
        let err = given.fit(s(20.0)).expect("does not fit").unwrap_err();
        assert!(
            err.0.contains("--ttl 15s + --lock-delay 8s is a lease of 23s") && err.0.contains("at most 20s"),
            "{err}"
        );
        assert!(given.fit(s(23.0)).is_none(), "it fits: the store accepts it");
        assert!(asked(Some(25.0), None, None).fit(s(20.0)).is_none(), "without a delay the store judges --ttl");
    }
}
