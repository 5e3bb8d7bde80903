//! The campaign / lead / renew state machine (DESIGN.md §2–§3), written once for
//! every store.
//!
//! It does no I/O of its own: it talks to a `Store`, drives a `Payload`, reads an
//! injected `Clock`, and hears about signals through a channel. That is what lets
//! its unit tests run on tokio's paused clock against a store that can be told to
//! fail, hang, answer late or report the lease taken.
//!
//! The rule it keeps: the clock is read just BEFORE a request is sent; only a
//! confirmed success moves the deadline, to `sent + ttl·(1 − 2ρ) − margin`; the
//! payload gets the stop signal at `deadline − kill_after` and SIGKILL at the
//! deadline, and the stop signal at once when the store says the lease is gone.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::timeout;

use crate::child::signals::ends_the_run;
use crate::clock::{sleep_until, Clock};
use crate::payload::{ChildExit, Payload, StartError};
use crate::store::{Acquire, Lease, LockRecord, Renew, Store, StoreError};
use crate::timing::Timing;

/// Longest a waiting campaign goes without re-reading the lock, whatever the store's
/// change notification says.
const RECHECK: Duration = Duration::from_secs(1);

/// One-shot (cron) or campaign until elected (workers, CI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    OneShot,
    Wait { timeout: Option<Duration> },
}

/// What to campaign for.
#[derive(Debug, Clone)]
pub struct Election {
    pub lock: String,
    pub identity: String,
    pub timing: Timing,
    pub mode: Mode,
    /// The stop signal for the payload.
    pub stop: Signal,
}

/// How a run ended.
#[derive(Debug)]
pub enum Outcome {
    /// The payload ran and ended on its own (or after a signal relayed to it).
    Exited(ChildExit),
    /// Another holder has the lease (one-shot), or the wait timed out.
    Conflict(Option<LockRecord>),
    /// A signal arrived while still campaigning.
    Interrupted(Signal),
    /// The lease was lost while the payload ran; the payload was stopped.
    LeaseLost { exit: ChildExit, why: String },
    /// The store failed before the payload started.
    StoreFailed(StoreError),
    /// The payload could not be started (the lease was released again).
    StartFailed(StartError),
}

/// Why the payload is being stopped.
#[derive(Debug, Clone)]
enum Stopping {
    /// A relayed SIGINT/SIGTERM: the lease is still ours and still renewed.
    Interrupted,
    /// The store says the lease is not ours any more.
    Lost(String),
    /// No renewal succeeded in time.
    Expiring,
}

type Pending<T> = Pin<Box<dyn Future<Output = Result<crate::store::Result<T>, tokio::time::error::Elapsed>> + Send>>;

pub struct Elector {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    election: Election,
    signals: UnboundedReceiver<Signal>,
}

impl Elector {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        election: Election,
        signals: UnboundedReceiver<Signal>,
    ) -> Self {
        Self { store, clock, election, signals }
    }

    /// Campaign, then run the payload while leading.
    pub async fn run(mut self, payload: &mut dyn Payload) -> Outcome {
        match self.campaign().await {
            Ok((lease, sent)) => self.lead(payload, lease, sent).await,
            Err(outcome) => outcome,
        }
    }

    fn timing(&self) -> Timing {
        self.election.timing
    }

    fn now(&self) -> Duration {
        self.clock.now()
    }

    /// Try (once, or until elected / timed out / interrupted). Returns the lease and the
    /// instant its acquire request was sent.
    async fn campaign(&mut self) -> Result<(Lease, Duration), Outcome> {
        let timing = self.timing();
        let give_up = match self.election.mode {
            Mode::Wait { timeout: Some(t) } => Some(self.now() + t),
            _ => None,
        };
        let one_shot = self.election.mode == Mode::OneShot;
        let mut backoff = timing.retry_every();
        loop {
            let sent = self.now();
            let store = self.store.clone();
            let (lock, identity) = (self.election.lock.clone(), self.election.identity.clone());
            let attempt =
                timeout(timing.request_timeout(), async move { store.acquire(&lock, &identity, timing.ttl).await });
            let result = tokio::select! {
                result = attempt => result,
                Some(signal) = self.signals.recv() => return Err(Outcome::Interrupted(signal)),
            };
            let failure = match result {
                Ok(Ok(Acquire::Won(lease))) => {
                    if self.now() < timing.stop_at(timing.deadline_after(sent)) {
                        return Ok((lease, sent));
                    }
                    // The answer came too late to leave the payload any time: give it back.
                    tracing::warn!(token = lease.token, "the store took too long to grant the lease; giving it back");
                    self.release(&lease, Duration::ZERO).await;
                    StoreError::unavailable("the store answered too slowly to grant a usable lease")
                }
                Ok(Ok(Acquire::Held(record))) => {
                    if one_shot {
                        return Err(Outcome::Conflict(Some(record)));
                    }
                    tracing::debug!(holder = record.holder.as_deref().unwrap_or("-"), "lock is held; waiting");
                    let recheck = give_up.map_or(RECHECK, |t| t.saturating_sub(self.now()).min(RECHECK));
                    let store = self.store.clone();
                    let lock = self.election.lock.clone();
                    tokio::select! {
                        _ = async move { store.changed(&lock, recheck).await } => {}
                        Some(signal) = self.signals.recv() => return Err(Outcome::Interrupted(signal)),
                    }
                    if give_up.is_some_and(|t| self.now() >= t) {
                        return Err(Outcome::Conflict(Some(record)));
                    }
                    backoff = timing.retry_every();
                    continue;
                }
                Ok(Err(err)) => err,
                Err(_) => StoreError::unavailable(format!(
                    "the store did not answer within {}",
                    humantime::format_duration(timing.request_timeout())
                )),
            };
            if one_shot || !failure.is_transient() {
                return Err(Outcome::StoreFailed(failure));
            }
            tracing::warn!("cannot reach the store, retrying: {failure}");
            let until = give_up.map_or(self.now() + backoff, |t| t.min(self.now() + backoff));
            let clock = self.clock.clone();
            tokio::select! {
                _ = async move { sleep_until(&*clock, until).await } => {}
                Some(signal) = self.signals.recv() => return Err(Outcome::Interrupted(signal)),
            }
            if give_up.is_some_and(|t| self.now() >= t) {
                return Err(Outcome::Conflict(None));
            }
            backoff = (backoff * 2).min(timing.renew_every);
        }
    }

    /// Run the payload while renewing the lease; stop it when the lease cannot be trusted.
    async fn lead(&mut self, payload: &mut dyn Payload, lease: Lease, sent: Duration) -> Outcome {
        let timing = self.timing();
        let mut deadline = timing.deadline_after(sent);
        if let Err(err) = payload.start(&lease, deadline).await {
            // Nothing ran: free the lease at once rather than holding it for --min-hold.
            self.release(&lease, Duration::ZERO).await;
            return Outcome::StartFailed(err);
        }
        tracing::info!(lock = %lease.lock, token = lease.token, identity = %lease.identity, "elected; child started");

        let mut next_renew = sent + timing.renew_every;
        let mut renewing: Option<(Duration, Pending<Renew>)> = None;
        let mut stopping: Option<Stopping> = None;
        let mut stop_sent = false;
        let mut kill_at = deadline;
        let mut killed = false;

        let exit = loop {
            let renew_allowed = matches!(stopping, None | Some(Stopping::Interrupted));
            let stop_at = timing.stop_at(deadline);
            let clock = self.clock.clone();
            let clock2 = self.clock.clone();
            let clock3 = self.clock.clone();
            tokio::select! {
                biased;
                exit = payload.wait() => break exit,
                Some(signal) = self.signals.recv() => {
                    tracing::info!(%signal, "relaying signal to the child's process group");
                    payload.signal(signal);
                    if ends_the_run(signal) && stopping.is_none() {
                        stopping = Some(Stopping::Interrupted);
                        kill_at = kill_at.min(self.now() + timing.kill_after);
                    }
                }
                result = async { renewing.as_mut().map(|(_, f)| f.as_mut()).expect("guarded").await }, if renewing.is_some() => {
                    let (sent, _) = renewing.take().expect("guarded");
                    match result {
                        Ok(Ok(Renew::Renewed)) if renew_allowed => {
                            deadline = deadline.max(timing.deadline_after(sent));
                            if !matches!(stopping, Some(Stopping::Interrupted)) {
                                kill_at = deadline;
                            }
                            payload.extend(deadline);
                            next_renew = sent + timing.renew_every;
                            tracing::debug!(token = lease.token, "renewed");
                        }
                        Ok(Ok(Renew::Renewed)) => {}
                        Ok(Ok(Renew::Lost(record))) => {
                            let why = match record {
                                Some(r) if r.revoked => "leaderrun release asked this holder to stand down".to_string(),
                                Some(LockRecord { holder: Some(holder), .. }) => format!("the lease was taken by {holder}"),
                                _ => "the lease was freed behind this holder's back".to_string(),
                            };
                            tracing::error!(lock = %lease.lock, token = lease.token, "{why}; stopping the child");
                            if !stop_sent {
                                payload.signal(self.election.stop);
                                stop_sent = true;
                            }
                            kill_at = kill_at.min(self.now() + timing.kill_after).min(deadline);
                            stopping = Some(Stopping::Lost(why));
                        }
                        Ok(Err(err)) => {
                            tracing::warn!(safe_for = ?deadline.saturating_sub(self.now()), "renewal failed: {err}");
                            next_renew = self.now() + timing.retry_every();
                        }
                        Err(_) => {
                            tracing::warn!(safe_for = ?deadline.saturating_sub(self.now()), "renewal timed out");
                            next_renew = self.now() + timing.retry_every();
                        }
                    }
                }
                _ = async move { sleep_until(&*clock, next_renew).await }, if renewing.is_none() && renew_allowed => {
                    let store = self.store.clone();
                    let held = lease.clone();
                    let sent = self.now();
                    let future: Pending<Renew> = Box::pin(timeout(timing.request_timeout(), async move { store.renew(&held, timing.ttl).await }));
                    renewing = Some((sent, future));
                }
                _ = async move { sleep_until(&*clock2, stop_at).await }, if !stop_sent => {
                    tracing::error!(lock = %lease.lock, token = lease.token, "the lease could not be renewed in time; stopping the child");
                    payload.signal(self.election.stop);
                    stop_sent = true;
                    if matches!(stopping, None | Some(Stopping::Interrupted)) {
                        stopping = Some(Stopping::Expiring);
                    }
                    renewing = None;
                }
                _ = async move { sleep_until(&*clock3, kill_at).await }, if !killed => {
                    if kill_at >= deadline {
                        tracing::error!(lock = %lease.lock, "the lease deadline passed; killing the child");
                    }
                    payload.kill();
                    killed = true;
                }
            }
        };
        payload.finish();
        match stopping {
            None => {
                tracing::info!(status = exit.status(), "child exited; releasing");
                self.release(&lease, timing.min_hold).await;
                Outcome::Exited(exit)
            }
            Some(Stopping::Interrupted) => {
                self.release(&lease, Duration::ZERO).await;
                Outcome::Exited(exit)
            }
            Some(Stopping::Lost(why)) => {
                self.release(&lease, Duration::ZERO).await;
                Outcome::LeaseLost { exit, why }
            }
            Some(Stopping::Expiring) => {
                self.release(&lease, Duration::ZERO).await;
                Outcome::LeaseLost { exit, why: "the lease could not be renewed in time".into() }
            }
        }
    }

    /// Best effort: the lease expires by itself if this does not reach the store.
    async fn release(&self, lease: &Lease, keep: Duration) {
        match timeout(self.timing().request_timeout(), self.store.release(lease, keep)).await {
            Ok(Ok(())) => tracing::debug!(token = lease.token, ?keep, "released"),
            Ok(Err(err)) => {
                tracing::warn!("could not release the lease (it will expire by itself): {err}")
            }
            Err(_) => tracing::warn!("releasing the lease timed out (it will expire by itself)"),
        }
    }
}

#[cfg(test)]
mod tests;
