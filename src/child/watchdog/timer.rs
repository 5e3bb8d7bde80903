//! The watchdog's alarm clock: a timerfd on CLOCK_BOOTTIME, armed at an absolute instant.
//!
//! Deadlines are instants on CLOCK_BOOTTIME, which keeps counting while the host is
//! suspended. A poll(2) timeout is measured on CLOCK_MONOTONIC, which does not: a
//! watchdog sleeping through a suspend would wake that much after the deadline. A timer
//! on the deadlines' own clock, armed at the instant itself rather than a span from now,
//! fires on resume for any deadline that passed meanwhile, and is polled together with
//! the pipe from leaderrun.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use nix::sys::time::TimeSpec;
use nix::sys::timerfd::{ClockId, Expiration, TimerFd, TimerFlags, TimerSetTimeFlags};

pub struct BootTimer(TimerFd);

impl BootTimer {
    pub fn new() -> nix::Result<Self> {
        TimerFd::new(ClockId::CLOCK_BOOTTIME, TimerFlags::TFD_NONBLOCK | TimerFlags::TFD_CLOEXEC).map(Self)
    }

    /// Fire (become readable) at `at` on CLOCK_BOOTTIME, at once if that has passed;
    /// None: never.
    pub fn arm(&self, at: Option<Duration>) -> nix::Result<()> {
        match at.and_then(expiry) {
            Some(at) => self.0.set(Expiration::OneShot(at), TimerSetTimeFlags::TFD_TIMER_ABSTIME),
            None => self.0.unset(),
        }
    }

    /// Take the expiry that made it readable, so that poll sleeps again.
    pub fn clear(&self) {
        let mut count = [0u8; 8];
        // Nothing to take (EAGAIN) is fine: the timer was re-armed or had not fired.
        let _ = nix::unistd::read(self.0.as_fd(), &mut count);
    }
}

impl AsFd for BootTimer {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// The absolute expiry for `at`, or None when it lies beyond what the kernel can hold.
/// Never zero: an expiry of zero disarms a timerfd instead of firing it, and a deadline
/// that is already behind (`deadline < kill_after` early after boot) must fire at once.
fn expiry(at: Duration) -> Option<TimeSpec> {
    let at = at.max(Duration::from_nanos(1));
    let secs = i64::try_from(at.as_secs()).ok()?;
    Some(TimeSpec::new(secs, i64::from(at.subsec_nanos())))
}

#[cfg(test)]
mod tests {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

    use super::*;
    use crate::clock::boottime;

    /// Whether the timer fires within a generous bound (no assertion on how soon).
    fn fires(timer: &BootTimer) -> bool {
        let mut fds = [PollFd::new(timer.as_fd(), PollFlags::POLLIN)];
        matches!(poll(&mut fds, PollTimeout::from(10_000u16)), Ok(1))
    }

    #[test]
    fn an_expiry_is_never_zero_which_would_disarm_the_timer() {
        assert_eq!(expiry(Duration::ZERO), Some(TimeSpec::new(0, 1)));
        assert_eq!(expiry(Duration::new(5, 7)), Some(TimeSpec::new(5, 7)));
        assert_eq!(expiry(Duration::MAX), None, "beyond the kernel's range: never");
    }

    #[test]
    fn a_timer_armed_at_a_passed_instant_fires_at_once() {
        let timer = BootTimer::new().expect("a timerfd");
        timer.arm(Some(Duration::ZERO)).expect("arm");
        assert!(fires(&timer), "an instant at zero (a deadline already behind) must fire");
        timer.clear();
        timer.arm(Some(boottime().saturating_sub(Duration::from_secs(1)))).expect("arm");
        assert!(fires(&timer));
    }

    #[test]
    fn a_timer_armed_on_boottime_fires_at_that_instant() {
        let timer = BootTimer::new().expect("a timerfd");
        let at = boottime() + Duration::from_millis(50);
        timer.arm(Some(at)).expect("arm");
        assert!(fires(&timer));
        assert!(boottime() >= at, "it fired at the instant on CLOCK_BOOTTIME, not before");
    }

    #[test]
    fn a_disarmed_timer_stays_quiet_and_clear_makes_it_quiet_again() {
        let timer = BootTimer::new().expect("a timerfd");
        timer.arm(Some(Duration::ZERO)).expect("arm");
        assert!(fires(&timer));
        timer.clear();
        timer.arm(None).expect("disarm");
        let mut fds = [PollFd::new(timer.as_fd(), PollFlags::POLLIN)];
        assert_eq!(poll(&mut fds, PollTimeout::ZERO), Ok(0), "cleared and disarmed");
    }
}
