//! What `--http`'s /healthz and /readyz answer, kept up to date from the run's events.
//!
//! - Health: the run goes on and its store answered within the last ttl. A run cut off from
//!   its store for that long can neither renew nor take over, so a liveness probe restarting
//!   it loses nothing. A standby asks the store at least every ttl/2 when --http is on
//!   (`Election::heartbeat`), so an idle standby on a store that pushes changes stays healthy.
//! - Readiness: this run holds the lease and its child runs. A Service routed by readiness
//!   then reaches the leader alone.
//!
//! Instants are CLOCK_BOOTTIME, the elector's clock; the answers are computed when asked.

use std::sync::Mutex;
use std::time::Duration;

use super::{Attempt, Event, Observer, Renewal};
use crate::clock::boottime;

pub struct Health {
    ttl: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the store last answered a request (whatever the answer).
    answered: Option<Duration>,
    /// Why /readyz is not 200 (`None`: ready).
    not_ready: Option<String>,
    ending: bool,
}

impl Health {
    pub fn new(ttl: Duration) -> Self {
        let state = State { answered: None, not_ready: Some("the campaign has not begun".into()), ending: false };
        Self { ttl, state: Mutex::new(state) }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// /healthz at `now`: `Err` is the one-line reason for a 503.
    pub fn healthy(&self, now: Duration) -> Result<(), String> {
        let state = self.state();
        if state.ending {
            return Err("the run is ending".into());
        }
        match state.answered {
            None => Err("the store has not answered yet".into()),
            Some(at) if now.saturating_sub(at) > self.ttl => {
                Err(format!("no answer from the store for {}s", now.saturating_sub(at).as_secs()))
            }
            Some(_) => Ok(()),
        }
    }

    /// /readyz: `Err` is the one-line reason for a 503.
    pub fn ready(&self) -> Result<(), String> {
        let state = self.state();
        if state.ending {
            return Err("the run is ending".into());
        }
        state.not_ready.clone().map_or(Ok(()), Err)
    }

    /// Take in one event that happened at `now`.
    pub fn on(&self, event: &Event<'_>, now: Duration) {
        let mut state = self.state();
        let answered = match *event {
            Event::StoreCall { ok, .. } => ok,
            Event::Attempted(Attempt::Won | Attempt::Held(_)) => true,
            Event::Renewal(Renewal::Renewed { .. } | Renewal::TooLate | Renewal::Lost) => true,
            _ => false,
        };
        if answered {
            state.answered = Some(now);
        }
        let not_ready = match *event {
            Event::Campaigning { lock } => format!("campaigning for {lock}"),
            Event::Attempted(Attempt::Held(record)) => {
                format!("standby; held by {}", record.holder.as_deref().unwrap_or("nobody yet"))
            }
            Event::Attempted(Attempt::Failed) => "standby; the store did not answer".into(),
            Event::Attempted(Attempt::Won) | Event::Elected { .. } => "elected; the child is starting".into(),
            Event::ChildStarted => {
                state.not_ready = None;
                return;
            }
            Event::SteppingDown => "stepping down: the lease is no longer trusted".into(),
            Event::ChildEnded { .. } => "the child has ended".into(),
            Event::Released => "not leading: the lease was given up".into(),
            Event::Stopping => {
                state.ending = true;
                "the run is ending".into()
            }
            Event::Renewal(_) | Event::StoreCall { .. } => return,
        };
        state.not_ready = Some(not_ready);
    }
}

impl Observer for Health {
    fn event(&self, event: &Event<'_>) {
        self.on(event, boottime());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::ChildEnd;
    use crate::payload::ChildExit;
    use crate::store::{Lease, LockRecord};

    const TTL: Duration = Duration::from_secs(15);

    fn at(secs: u64) -> Duration {
        Duration::from_secs(secs)
    }

    #[test]
    fn healthy_while_the_store_answered_within_a_ttl() {
        let health = Health::new(TTL);
        health.on(&Event::Campaigning { lock: "l" }, at(100));
        assert_eq!(health.healthy(at(100)).unwrap_err(), "the store has not answered yet");
        // A request that failed is no answer.
        health.on(&Event::StoreCall { operation: "acquire", took: at(1), ok: false }, at(101));
        health.on(&Event::Attempted(Attempt::Failed), at(101));
        assert_eq!(health.healthy(at(101)).unwrap_err(), "the store has not answered yet");

        let mut record = LockRecord::free("l");
        record.holder = Some("other".into());
        health.on(&Event::Attempted(Attempt::Held(&record)), at(102));
        assert_eq!(health.healthy(at(117)), Ok(()));
        assert_eq!(health.healthy(at(143)).unwrap_err(), "no answer from the store for 41s");
        health.on(&Event::StoreCall { operation: "status", took: at(0), ok: true }, at(140));
        assert_eq!(health.healthy(at(143)), Ok(()));

        health.on(&Event::Stopping, at(144));
        assert_eq!(health.healthy(at(144)).unwrap_err(), "the run is ending");
    }

    #[test]
    fn ready_only_while_leading_with_the_child_running() {
        let health = Health::new(TTL);
        health.on(&Event::Campaigning { lock: "l" }, at(0));
        assert_eq!(health.ready().unwrap_err(), "campaigning for l");
        let mut record = LockRecord::free("l");
        record.holder = Some("host-a:12:abc".into());
        health.on(&Event::Attempted(Attempt::Held(&record)), at(1));
        assert_eq!(health.ready().unwrap_err(), "standby; held by host-a:12:abc");

        let lease = Lease { lock: "l".into(), identity: "me".into(), token: 7 };
        health.on(&Event::Attempted(Attempt::Won), at(2));
        health.on(&Event::Elected { lease: &lease, slot: 0, stop_at: at(20) }, at(2));
        assert!(health.ready().is_err(), "not ready before the child runs");
        health.on(&Event::ChildStarted, at(2));
        assert_eq!(health.ready(), Ok(()));
        health.on(&Event::Renewal(Renewal::Failed), at(7));
        assert_eq!(health.ready(), Ok(()), "a failed renewal alone does not end leadership");

        health.on(&Event::SteppingDown, at(20));
        assert_eq!(health.ready().unwrap_err(), "stepping down: the lease is no longer trusted");
        health.on(&Event::ChildEnded { exit: ChildExit::Signal(15), why: ChildEnd::LeaseExpired }, at(21));
        assert_eq!(health.ready().unwrap_err(), "the child has ended");
        health.on(&Event::Stopping, at(21));
        assert_eq!(health.ready().unwrap_err(), "the run is ending");
    }
}
