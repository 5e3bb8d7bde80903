//! A payload that records what the elector does to it, on the elector's clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::sync::Notify;

use crate::clock::{sleep_until, Clock};
use crate::payload::{ChildExit, Payload, StartError};
use crate::store::Lease;

/// What the recorder saw, with the clock reading at each event.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Event {
    Start { at: Duration, token: u64, deadline: Duration },
    Extend { at: Duration, deadline: Duration },
    Signal { at: Duration, signal: Signal },
    Kill { at: Duration },
}

/// A payload that records what the elector does to it. It runs for `runs_for`
/// (forever if `None`), ends on SIGKILL, and on the stop signal if `obeys_stop`.
pub(super) struct Recorder {
    pub(super) clock: Arc<dyn Clock>,
    pub(super) events: Arc<Mutex<Vec<Event>>>,
    pub(super) runs_for: Option<Duration>,
    pub(super) obeys_stop: bool,
    pub(super) started: Option<Duration>,
    /// The slot of the lock it was started in.
    pub(super) slot: Option<usize>,
    pub(super) ended: Option<ChildExit>,
    pub(super) wake: Arc<Notify>,
    /// How many starts, from the first, find the lease's stop time passed (a host that froze
    /// between the grant and the exec): they run nothing and say `StartError::TooLate`.
    pub(super) too_late: usize,
}

impl Recorder {
    pub(super) fn new(clock: Arc<dyn Clock>, runs_for: Option<Duration>, obeys_stop: bool) -> Self {
        Self {
            clock,
            events: Arc::default(),
            runs_for,
            obeys_stop,
            started: None,
            slot: None,
            ended: None,
            wake: Arc::default(),
            too_late: 0,
        }
    }

    pub(super) fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    fn push(&self, event: Event) {
        self.events.lock().unwrap().push(event);
    }

    fn end(&mut self, exit: ChildExit) {
        if self.ended.is_none() {
            self.ended = Some(exit);
        }
        self.wake.notify_one();
    }

    pub(super) fn signals(&self) -> Vec<(Duration, Signal)> {
        self.events()
            .into_iter()
            .filter_map(|e| if let Event::Signal { at, signal } = e { Some((at, signal)) } else { None })
            .collect()
    }

    /// The token the child was first started under; panics (naming the events) if it never was.
    pub(super) fn first_token(&self) -> u64 {
        match self.events().first() {
            Some(Event::Start { token, .. }) => *token,
            other => panic!("the child never started: {other:?}"),
        }
    }

    pub(super) fn kills(&self) -> Vec<Duration> {
        self.events().into_iter().filter_map(|e| if let Event::Kill { at } = e { Some(at) } else { None }).collect()
    }

    pub(super) fn extends(&self) -> Vec<(Duration, Duration)> {
        self.events()
            .into_iter()
            .filter_map(|e| if let Event::Extend { at, deadline } = e { Some((at, deadline)) } else { None })
            .collect()
    }
}

#[async_trait]
impl Payload for Recorder {
    async fn start(&mut self, lease: &Lease, slot: usize, deadline: Duration) -> Result<(), StartError> {
        if self.too_late > 0 {
            self.too_late -= 1;
            return Err(StartError::TooLate);
        }
        let at = self.clock.now();
        self.started = Some(at);
        self.slot = Some(slot);
        self.push(Event::Start { at, token: lease.token, deadline });
        Ok(())
    }
    fn extend(&mut self, deadline: Duration) {
        self.push(Event::Extend { at: self.clock.now(), deadline });
    }
    fn signal(&mut self, signal: Signal) {
        self.push(Event::Signal { at: self.clock.now(), signal });
        if self.obeys_stop {
            self.end(ChildExit::Signal(signal as i32));
        }
    }
    fn kill(&mut self) {
        self.push(Event::Kill { at: self.clock.now() });
        self.end(ChildExit::Signal(Signal::SIGKILL as i32));
    }
    async fn wait(&mut self) -> ChildExit {
        loop {
            if let Some(exit) = self.ended {
                return exit;
            }
            match (self.started, self.runs_for) {
                (Some(started), Some(runs_for)) => {
                    let wake = self.wake.clone();
                    tokio::select! {
                        _ = sleep_until(&*self.clock, started + runs_for) => self.end(ChildExit::Code(0)),
                        _ = wake.notified() => {}
                    }
                }
                _ => self.wake.clone().notified().await,
            }
        }
    }
    async fn finish(&mut self) {}
}
