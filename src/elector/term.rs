//! One term of leadership: the deadline, the renewals in flight, and the stopping of the
//! payload when the lease can no longer be trusted (or --max-runtime is up). The elector
//! (`elector.rs`) drives it from its loop; it does no I/O of its own.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;

use super::Outcome;
use crate::child::signals::ends_the_run;
use crate::observe::{ChildEnd, Event, Observer, Renewal};
use crate::payload::{ChildExit, Payload};
use crate::store::{Lease, LockRecord, Renew};
use crate::timing::Timing;

/// Why the payload is being stopped.
#[derive(Debug, Clone)]
pub(super) enum Stopping {
    /// A relayed SIGINT/SIGTERM: the lease is still ours and still renewed.
    Interrupted,
    /// The store says the lease is not ours any more.
    Lost(String),
    /// No renewal succeeded in time.
    Expiring,
    /// It ran for --max-runtime: the lease is still ours and still renewed.
    RanTooLong,
}

/// A store call bounded in time: `Err(Elapsed)` when it did not answer in time.
pub(super) type Answer<T> = Result<crate::store::Result<T>, tokio::time::error::Elapsed>;
pub(super) type Pending<T> = Pin<Box<dyn Future<Output = Answer<T>> + Send>>;

/// Renewals in flight at once, at most: the first, and one more sent when the first has gone
/// unanswered for `Timing::renew_timeout`.
pub(super) const RENEWALS_IN_FLIGHT: usize = 2;

/// The first of the renewals in flight to answer, taken out of `renewing`, with the instant
/// it was sent.
pub(super) async fn first_answer(renewing: &mut Vec<(Duration, Pending<Renew>)>) -> (Duration, Answer<Renew>) {
    std::future::poll_fn(|cx| {
        for i in 0..renewing.len() {
            if let std::task::Poll::Ready(answer) = renewing[i].1.as_mut().poll(cx) {
                let (sent, _) = renewing.remove(i);
                return std::task::Poll::Ready((sent, answer));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// A renewal confirmed this close to the stop time is not used: the watchdog, which
/// keeps the same deadline, may be signalling the child's group at this very moment.
const HANDOFF_SLACK: Duration = Duration::from_millis(50);

/// One term of leadership: the deadline, the renewal in flight, and how far the
/// stopping of the payload has gone.
pub(super) struct Term {
    pub(super) lease: Lease,
    pub(super) timing: Timing,
    pub(super) stop_signal: Signal,
    pub(super) deadline: Duration,
    pub(super) next_renew: Duration,
    /// Renewals in flight, each with the instant it was sent.
    pub(super) renewing: Vec<(Duration, Pending<Renew>)>,
    pub(super) stopping: Option<Stopping>,
    pub(super) stop_sent: bool,
    pub(super) kill_at: Duration,
    pub(super) killed: bool,
    pub(super) observer: Arc<dyn Observer>,
    /// When the child has run for --max-runtime (the elector's clock), if there is a limit.
    pub(super) max_runtime_at: Option<Duration>,
}

impl Term {
    pub(super) fn new(
        lease: Lease,
        timing: Timing,
        stop_signal: Signal,
        sent: Duration,
        observer: Arc<dyn Observer>,
    ) -> Self {
        let deadline = timing.deadline_after(sent);
        Self {
            lease,
            timing,
            stop_signal,
            deadline,
            next_renew: sent + timing.renew_every,
            renewing: Vec::new(),
            stopping: None,
            stop_sent: false,
            kill_at: deadline,
            killed: false,
            observer,
            max_runtime_at: None,
        }
    }

    /// Why the child ended, as the run's observers are told.
    pub(super) fn child_end(&self) -> ChildEnd {
        match self.stopping {
            None => ChildEnd::Exited,
            Some(Stopping::Interrupted) => ChildEnd::Interrupted,
            Some(Stopping::Lost(_)) => ChildEnd::LeaseLost,
            Some(Stopping::Expiring) => ChildEnd::LeaseExpired,
            Some(Stopping::RanTooLong) => ChildEnd::RanTooLong,
        }
    }

    /// Whether the lease is still being renewed (also while an interrupted child winds down).
    pub(super) fn renews(&self) -> bool {
        matches!(self.stopping, None | Some(Stopping::Interrupted | Stopping::RanTooLong))
    }

    /// Whether the lease is known to be untrustworthy: the store said it is gone, or its stop
    /// time passed. Until then a lease is still ours, however the child is being stopped.
    fn untrusted(&self) -> bool {
        matches!(self.stopping, Some(Stopping::Lost(_) | Stopping::Expiring))
    }

    /// The next instant at which `enforce` has something to do.
    pub(super) fn next_timer(&self) -> Duration {
        let stop = if self.untrusted() { Duration::MAX } else { self.timing.stop_at(self.deadline) };
        let kill = if self.killed { Duration::MAX } else { self.kill_at.min(self.deadline) };
        let limit = match (self.stopping.is_none(), self.max_runtime_at) {
            (true, Some(at)) => at,
            _ => Duration::MAX,
        };
        stop.min(kill).min(limit)
    }

    /// The stop signal at `deadline − kill_after`, SIGKILL at the deadline (or earlier
    /// once a stop is under way).
    pub(super) fn enforce(&mut self, now: Duration, payload: &mut dyn Payload) {
        if self.stopping.is_none() && self.max_runtime_at.is_some_and(|at| now >= at) {
            tracing::info!(lock = %self.lease.lock, "the child ran for --max-runtime; stopping it");
            payload.signal(self.stop_signal);
            self.stop_sent = true;
            self.stopping = Some(Stopping::RanTooLong);
            self.kill_at = self.kill_at.min(now + self.timing.kill_after);
        }
        // Past the stop time the lease is expiring whatever else is stopping the child (a
        // relayed signal, --max-runtime): no more renewals, and no --min-hold keep after.
        if !self.untrusted() && now >= self.timing.stop_at(self.deadline) {
            tracing::error!(lock = %self.lease.lock, token = self.lease.token, "the lease could not be renewed in time; stopping the child");
            self.stop(Stopping::Expiring, now, payload);
        }
        if !self.killed && now >= self.kill_at.min(self.deadline) {
            if now >= self.deadline {
                tracing::error!(lock = %self.lease.lock, "the lease deadline passed; killing the child");
            }
            payload.kill();
            self.killed = true;
        }
    }

    /// Send the stop signal (once) and give the payload `kill_after` before SIGKILL.
    pub(super) fn stop(&mut self, why: Stopping, now: Duration, payload: &mut dyn Payload) {
        if !self.stop_sent {
            payload.signal(self.stop_signal);
            self.stop_sent = true;
        }
        self.kill_at = self.kill_at.min(now + self.timing.kill_after);
        self.renewing.clear();
        if matches!(self.stopping, None | Some(Stopping::Interrupted | Stopping::RanTooLong)) {
            self.stopping = Some(why);
            self.observer.event(&Event::SteppingDown);
        }
    }

    /// A signal sent to leaderrun: relay it; SIGINT and SIGTERM also end the run.
    pub(super) fn relay(&mut self, signal: Signal, now: Duration, payload: &mut dyn Payload) {
        tracing::info!(%signal, "relaying signal to the child's process group");
        payload.signal(signal);
        if ends_the_run(signal) && self.stopping.is_none() {
            self.stopping = Some(Stopping::Interrupted);
            self.kill_at = self.kill_at.min(now + self.timing.kill_after);
        }
    }

    /// One renewal answered (`sent`: when it was sent).
    pub(super) fn renewal_done(
        &mut self,
        sent: Duration,
        answer: Answer<Renew>,
        now: Duration,
        payload: &mut dyn Payload,
    ) {
        match answer {
            Ok(Ok(Renew::Renewed)) if self.renews() => {
                if now + HANDOFF_SLACK >= self.timing.stop_at(self.deadline) {
                    self.observer.event(&Event::Renewal(Renewal::TooLate));
                    tracing::error!(lock = %self.lease.lock, token = self.lease.token, "the lease was renewed too late to be used; stopping the child");
                    self.stop(Stopping::Expiring, now, payload);
                    return;
                }
                self.deadline = self.deadline.max(self.timing.deadline_after(sent));
                if self.stopping.is_none() {
                    self.kill_at = self.deadline;
                }
                payload.extend(self.deadline);
                // Any other request in flight has nothing left to add.
                self.renewing.clear();
                self.next_renew = sent + self.timing.renew_every;
                self.observer.event(&Event::Renewal(Renewal::Renewed { stop_at: self.timing.stop_at(self.deadline) }));
                tracing::debug!(token = self.lease.token, "renewed");
            }
            Ok(Ok(Renew::Renewed)) => {}
            Ok(Ok(Renew::Lost(record))) => {
                self.observer.event(&Event::Renewal(Renewal::Lost));
                let why = match record {
                    Some(r) if r.revoked => "leaderrun release asked this holder to stand down".to_string(),
                    Some(LockRecord { holder: Some(holder), .. }) => format!("the lease was taken by {holder}"),
                    _ => "the lease was freed behind this holder's back".to_string(),
                };
                tracing::error!(lock = %self.lease.lock, token = self.lease.token, "{why}; stopping the child");
                self.stop(Stopping::Lost(why), now, payload);
            }
            Ok(Err(err)) => {
                self.observer.event(&Event::Renewal(Renewal::Failed));
                tracing::warn!(safe_for = ?self.deadline.saturating_sub(now), "renewal failed: {err}");
                if self.renewing.is_empty() {
                    self.next_renew = now + self.timing.retry_every();
                }
            }
            Err(_) => {
                self.observer.event(&Event::Renewal(Renewal::TimedOut));
                // Unanswered until the stop time: try again at once (it has waited already).
                tracing::warn!(safe_for = ?self.deadline.saturating_sub(now), "renewal timed out");
                if self.renewing.is_empty() {
                    self.next_renew = now;
                }
            }
        }
    }

    /// The payload ended at `now`. Past the stop time its lease could no longer be
    /// trusted, whoever ended it: the watchdog keeps the same stop time on its own clock
    /// and often signals the group a moment before this wrapper's timer fires, so the
    /// exit arrives first. That run still lost its lease, and says so (exit 75).
    pub(super) fn exited_at(&mut self, now: Duration) {
        // The watchdog keeps --max-runtime too, and may have stopped the child first.
        if self.stopping.is_none() && self.max_runtime_at.is_some_and(|at| now >= at) {
            self.stopping = Some(Stopping::RanTooLong);
        }
        if !self.untrusted() && now >= self.timing.stop_at(self.deadline) {
            tracing::error!(lock = %self.lease.lock, token = self.lease.token, "the child ended after the lease could no longer be renewed in time");
            self.stopping = Some(Stopping::Expiring);
        }
    }

    /// How long to keep the lease after the payload is gone, and how the run ended.
    pub(super) fn outcome(self, exit: ChildExit) -> (Duration, Outcome) {
        match self.stopping {
            None => {
                tracing::info!(status = exit.status(), "child exited; releasing");
                (self.timing.min_hold, Outcome::Exited(exit))
            }
            // Interrupted: free at once, --min-hold or not.
            Some(Stopping::Interrupted) => (Duration::ZERO, Outcome::Exited(exit)),
            // As timeout(1) does: 124. The lease is kept for --min-hold as after any child.
            Some(Stopping::RanTooLong) => (self.timing.min_hold, Outcome::RanTooLong(exit)),
            Some(Stopping::Lost(why)) => (Duration::ZERO, Outcome::LeaseLost { exit, why }),
            Some(Stopping::Expiring) => {
                (Duration::ZERO, Outcome::LeaseLost { exit, why: "the lease could not be renewed in time".into() })
            }
        }
    }
}
