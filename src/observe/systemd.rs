//! systemd's notify protocol (`Type=notify`), through the `sd-notify` crate, when
//! NOTIFY_SOCKET is set:
//! - `READY=1` once the store is open and the campaign runs, so a standby is a started unit;
//! - `STATUS=` as the run changes ("leader, token N", "standby; held by X", ...);
//! - `WATCHDOG=1` at each successful renewal and each standby check that the store answered,
//!   and only then, when WATCHDOG_USEC is set: systemd restarts a leaderrun that is wedged or
//!   cut off from its store. A standby checks at least every half watchdog interval;
//! - `STOPPING=1` when the run ends.
//!
//! A datagram that cannot be sent is dropped: the protocol only reports.

use std::sync::Mutex;
use std::time::Duration;

use sd_notify::NotifyState;

use super::{Attempt, ChildEnd, Event, Observer, Renewal};

pub struct Systemd {
    /// Whether systemd asked for WATCHDOG=1 (WATCHDOG_USEC, for this process).
    watchdog: bool,
    /// The last STATUS= sent, so that a standby does not repeat it at every check.
    status: Mutex<String>,
}

impl Systemd {
    /// The notifier, if systemd (or anything speaking its protocol) gave NOTIFY_SOCKET.
    pub fn from_env() -> Option<Self> {
        std::env::var_os("NOTIFY_SOCKET")?;
        Some(Self { watchdog: Self::watchdog_interval().is_some(), status: Mutex::new(String::new()) })
    }

    /// WATCHDOG_USEC, if it is meant for this process.
    pub fn watchdog_interval() -> Option<Duration> {
        std::env::var_os("NOTIFY_SOCKET")?;
        sd_notify::watchdog_enabled().filter(|d| !d.is_zero())
    }

    fn send(&self, states: &[NotifyState<'_>]) {
        if let Err(err) = sd_notify::notify(states) {
            tracing::debug!("cannot notify systemd: {err}");
        }
    }

    /// STATUS=, when it changed, with WATCHDOG=1 if `alive` (and systemd asked for it).
    fn status(&self, text: String, alive: bool) {
        let mut last = self.status.lock().unwrap_or_else(|p| p.into_inner());
        let changed = *last != text;
        let mut states = Vec::new();
        if changed {
            states.push(NotifyState::Status(&text));
        }
        if alive && self.watchdog {
            states.push(NotifyState::Watchdog);
        }
        if !states.is_empty() {
            self.send(&states);
        }
        if changed {
            *last = text;
        }
    }
}

impl Observer for Systemd {
    fn event(&self, event: &Event<'_>) {
        match *event {
            Event::Campaigning { lock } => {
                let text = format!("campaigning for {lock}");
                self.send(&[NotifyState::Ready, NotifyState::Status(&text)]);
                *self.status.lock().unwrap_or_else(|p| p.into_inner()) = text;
            }
            Event::Attempted(Attempt::Held(record)) => {
                let holder = record.holder.as_deref().unwrap_or("-");
                self.status(format!("standby; held by {holder} (token {})", record.token), true)
            }
            Event::Attempted(Attempt::Failed) => self.status("standby; cannot reach the store".into(), false),
            Event::Attempted(Attempt::Won) => {}
            Event::Elected { lease, .. } => self.status(format!("leader, token {}", lease.token), true),
            Event::Renewal(Renewal::Renewed { .. }) => self.status(self.current(), true),
            Event::Renewal(Renewal::Failed | Renewal::TimedOut) => {}
            Event::Renewal(Renewal::Lost | Renewal::TooLate) | Event::SteppingDown => {
                self.status("stepping down: the lease is lost; stopping the child".into(), false)
            }
            Event::ChildEnded { exit, why } => {
                let how = match why {
                    ChildEnd::Exited => "exited",
                    ChildEnd::Interrupted => "stopped on request",
                    ChildEnd::LeaseLost | ChildEnd::LeaseExpired => "stopped: lease lost",
                    ChildEnd::RanTooLong => "stopped: it ran for --max-runtime",
                };
                self.status(format!("child {how} (status {})", exit.status()), false)
            }
            Event::Stopping => self.send(&[NotifyState::Stopping]),
            Event::ChildStarted | Event::Released | Event::StoreCall { .. } => {}
        }
    }
}

impl Systemd {
    fn current(&self) -> String {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
