//! The elapsed-time clock the safety contract is measured on.
//!
//! Deadlines are instants on a clock that never jumps. In production that is
//! CLOCK_BOOTTIME: unlike CLOCK_MONOTONIC it keeps counting while the host is
//! suspended, so a lease that lapsed during a suspend is seen as lapsed on resume.
//! Tests inject a clock driven by tokio's paused time instead.

use std::time::Duration;

/// Longest single sleep: after it the clock is read again, so a suspend (which
/// tokio's timers, being CLOCK_MONOTONIC, do not see) delays a deadline by at most this.
const MAX_NAP: Duration = Duration::from_millis(250);

/// A clock that never jumps, read as the time elapsed since some fixed origin.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Duration;
}

/// Sleep until `clock` reads at least `target`.
pub async fn sleep_until(clock: &dyn Clock, target: Duration) {
    loop {
        let now = clock.now();
        if now >= target {
            return;
        }
        tokio::time::sleep((target - now).min(MAX_NAP)).await;
    }
}

/// CLOCK_BOOTTIME: shared by every process on the host, so the watchdog and the
/// SQLite store compare instants with the wrapper directly.
#[derive(Debug, Clone, Copy, Default)]
pub struct BootClock;

impl Clock for BootClock {
    fn now(&self) -> Duration {
        boottime()
    }
}

/// Read CLOCK_BOOTTIME.
pub fn boottime() -> Duration {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .expect("CLOCK_BOOTTIME is available on every Linux since 2.6.39");
    Duration::new(ts.tv_sec() as u64, ts.tv_nsec() as u32)
}

/// tokio's clock, which tests pause and advance by hand.
#[derive(Debug, Clone, Copy)]
pub struct TokioClock {
    origin: tokio::time::Instant,
}

impl TokioClock {
    pub fn new() -> Self {
        Self { origin: tokio::time::Instant::now() }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TokioClock {
    fn now(&self) -> Duration {
        tokio::time::Instant::now() - self.origin
    }
}
