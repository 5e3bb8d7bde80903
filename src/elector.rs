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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Mutex;
use tokio::time::timeout;

use crate::clock::{sleep_until, Clock};
use crate::observe::{Attempt, Event, Observer, Observers};
use crate::payload::{ChildExit, Payload, StartError};
use crate::store::{Acquire, Lease, LockRecord, Renew, Store, StoreError};
use crate::timing::Timing;
use term::{first_answer, Pending, Term, RENEWALS_IN_FLIGHT};

/// How long a waiting campaign goes without re-reading the lock when it has nothing better
/// to go by: the store cannot say when the lease expires.
const RECHECK: Duration = Duration::from_secs(1);

/// Longest a waiting campaign goes without re-reading the lock on a store whose `changed`
/// also reports expiry: a safety net only (a watch that silently stopped delivering), so
/// it costs an idle standby one read in this long.
const SAFETY_RECHECK: Duration = Duration::from_secs(60);

/// Shortest wait before re-reading a held lock: a lease the store reports as due to
/// expire now is re-read a moment later, never in a tight loop.
const RECHECK_FLOOR: Duration = Duration::from_millis(10);

/// How long after a held lease's reported expiry it is read again: the store's clock may
/// run a little slower than this host's (a read that comes early just waits again).
const MARGIN_AFTER_EXPIRY: Duration = Duration::from_millis(20);

/// One-shot (cron) or campaign until elected (workers, CI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Try once. On a store without server-side expiry, a lease whose holder may have died
    /// is watched for up to one observation first, or until `until` (--timeout) if sooner.
    /// A store that fails transiently (a cluster electing a leader, a restart) is tried again
    /// until `retry_until` on the elector's clock (--timeout, else `Timing::one_shot_retry`
    /// after the start of the run); a lock found held ends the run at once all the same.
    OneShot { until: Option<Duration>, retry_until: Duration },
    /// Campaign until elected, or until `until` on the elector's clock (--timeout counted
    /// from the start of the run: opening the store takes from the same wait).
    Wait { until: Option<Duration> },
}

/// What to campaign for.
#[derive(Debug, Clone)]
pub struct Election {
    pub lock: String,
    pub identity: String,
    /// Whether no other run can have this identity (leaderrun's own HOST:PID:RANDOM). Only
    /// then may a lease found under it after an unanswered acquire be taken for this run's
    /// own and given back: with a shared --identity it may be another run's live lease.
    pub unique_identity: bool,
    pub timing: Timing,
    pub mode: Mode,
    /// The stop signal for the payload.
    pub stop: Signal,
    /// --max-runtime: the child gets the stop signal once it has run this long (SIGKILL
    /// --kill-after later), and the run ends with `Outcome::RanTooLong`.
    pub max_runtime: Option<Duration>,
    /// Longest a standby goes without asking the store, when something judges the run's
    /// health by its store's answers (--http, systemd's watchdog). None: as long as the store
    /// allows (an idle standby on a store that pushes changes may ask nothing for a minute).
    pub heartbeat: Option<Duration>,
    /// --slots: how many children of the lock may run at once, one per slot (`slots.rs`).
    pub slots: usize,
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
    /// The payload ran for --max-runtime and was stopped (the lease stayed held meanwhile).
    RanTooLong(ChildExit),
    /// The store failed before the payload started.
    StoreFailed(StoreError),
    /// The payload could not be started (the lease was released again).
    StartFailed(StartError),
}

/// Why a won write that had to be confirmed (`Acquire::Confirm`) gave no lease.
enum Unconfirmed {
    /// The confirming renewal found the lease gone: the campaign was lost.
    Lost(Option<LockRecord>),
    /// The confirming renewal failed or went unanswered: like a failed acquire.
    Failed(StoreError),
    /// The run ends here: a signal, or --timeout ran out during the cool-down.
    Ended(Outcome),
}

pub struct Elector {
    /// The run's store: a plain lock's, or what each slot's store wraps.
    store: Arc<dyn Store>,
    /// With --wait and --slots: a store of its own for each further slot, so that each slot's
    /// wait keeps its own place among the standbys (a store waits for one lock at a time).
    slot_stores: Vec<Arc<dyn Store>>,
    clock: Arc<dyn Clock>,
    election: Election,
    /// Shared by the campaigns for several slots: whichever hears a signal ends them all.
    signals: Mutex<UnboundedReceiver<Signal>>,
    observer: Arc<dyn Observer>,
    /// Slots left beside the child's start, to be waited for before the run ends.
    leaving: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// A campaign's win: the lease, the instant its acquire (or confirming renewal) was sent, the
/// slot it holds, and the store it holds it through (the slot's).
struct Won {
    lease: Lease,
    sent: Duration,
    slot: usize,
    store: Arc<dyn Store>,
}

impl Elector {
    pub fn new(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        election: Election,
        signals: UnboundedReceiver<Signal>,
    ) -> Self {
        Self {
            store,
            slot_stores: Vec::new(),
            clock,
            election,
            signals: Mutex::new(signals),
            observer: Arc::new(Observers::none()),
            leaving: std::sync::Mutex::default(),
        }
    }

    /// With --slots and --wait: `stores[i]` waits for slot i + 1 (slot 0 uses the first store).
    pub fn slot_stores(mut self, stores: Vec<Arc<dyn Store>>) -> Self {
        self.slot_stores = stores;
        self
    }

    /// Report what happens to `observer` (DESIGN.md §9: it only reports).
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = observer;
        self
    }

    /// Campaign, then run the payload while leading.
    pub async fn run(mut self, payload: &mut dyn Payload) -> Outcome {
        loop {
            self.observer.event(&Event::Campaigning { lock: &self.election.lock });
            let won = match self.campaign().await {
                Ok(won) => won,
                Err(outcome) => return outcome,
            };
            let outcome = self.lead(payload, won).await;
            self.finish_leaving().await;
            match outcome {
                // This host froze or starved between the grant and the child's exec for longer
                // than the lease: nothing ran, and the lease was given back. Like a grant that
                // came too late, a failure to try again while the run may (for any slot).
                Outcome::StartFailed(StartError::TooLate) if !self.out_of_retries() => {
                    tracing::warn!("the lease ran out before the child could start; campaigning again");
                }
                Outcome::StartFailed(StartError::TooLate) => {
                    return Outcome::StoreFailed(StoreError::unavailable(
                        "the lease ran out before the child could start: this host was frozen or starved for longer than --ttl",
                    ))
                }
                outcome => return outcome,
            }
        }
    }

    /// Whether the time the run has for transient failures (--timeout, or a one-shot run's
    /// retries) is up.
    fn out_of_retries(&self) -> bool {
        let until = match self.election.mode {
            Mode::Wait { until } => until,
            Mode::OneShot { retry_until, .. } => Some(retry_until),
        };
        until.is_some_and(|t| self.now() >= t)
    }

    fn timing(&self) -> Timing {
        self.election.timing
    }

    fn now(&self) -> Duration {
        self.clock.now()
    }

    /// A signal relayed to the run, to whichever campaign hears it first.
    async fn signal(&self) -> Option<Signal> {
        self.signals.lock().await.recv().await
    }

    /// Try for one slot (once, or until elected / timed out / interrupted) through `store`.
    /// Returns the lease and the instant its acquire request was sent. `granted` is set while
    /// a write that may have given this run the lease has not been found to have lost: a
    /// campaign dropped meanwhile (another slot won) leaves such a lease to be given back.
    async fn campaign_slot(&self, store: &Arc<dyn Store>, granted: &AtomicBool) -> Result<(Lease, Duration), Outcome> {
        let timing = self.timing();
        let (give_up, one_shot, retry_until) = match self.election.mode {
            Mode::Wait { until } => (until, false, until),
            Mode::OneShot { until, retry_until } => (until, true, Some(retry_until)),
        };
        let mut backoff = timing.retry_every();
        // The token of a lease of this run's own that it gave back (once only: if the store did
        // not free it, it lapses at its expiry like any other lease).
        let mut ghost = None;
        loop {
            let sent = self.now();
            granted.store(true, Ordering::SeqCst);
            let asked = store.clone();
            let (lock, identity) = (self.election.lock.clone(), self.election.identity.clone());
            let attempt =
                timeout(
                    timing.request_timeout(),
                    async move { asked.acquire(&lock, &identity, timing.store_ttl()).await },
                );
            let result = tokio::select! {
                result = attempt => result,
                Some(signal) = self.signal() => {
                    // The acquire was under way: the store may have granted it.
                    self.abandon(store).await;
                    return Err(Outcome::Interrupted(signal));
                }
            };
            // Held, or refused: no lease was granted. Any other failure may have been granted:
            // `granted` stays set until the give-back below is done, so that a campaign dropped
            // while giving it back leaves it to be given back by whoever dropped it.
            if matches!(result, Ok(Ok(Acquire::Held(_) | Acquire::Unproven { .. })))
                || matches!(&result, Ok(Err(err)) if !err.is_transient())
            {
                granted.store(false, Ordering::SeqCst);
            }
            // A client-timed store's first sight of a held lease: taken if it stays unchanged
            // for `decide_in` (a one-shot run watches that long; a change ends it).
            let unproven = match &result {
                Ok(Ok(Acquire::Unproven { decide_in, .. })) => Some(*decide_in),
                _ => None,
            };
            self.observer.event(&Event::Attempted(match &result {
                Ok(Ok(Acquire::Won(_) | Acquire::Confirm { .. })) => Attempt::Won,
                Ok(Ok(Acquire::Held(record) | Acquire::Unproven { record, .. })) => Attempt::Held(record),
                Ok(Err(_)) | Err(_) => Attempt::Failed,
            }));
            let failure = match result {
                Ok(Ok(Acquire::Won(lease))) => {
                    if self.now() < timing.stop_at(timing.deadline_after(sent)) {
                        return Ok((lease, sent));
                    }
                    // The answer came too late to leave the payload any time: give it back.
                    tracing::warn!(token = lease.token, "the store took too long to grant the lease; giving it back");
                    self.release(store, &lease, Duration::ZERO).await;
                    granted.store(false, Ordering::SeqCst);
                    StoreError::unavailable("the store answered too slowly to grant a usable lease")
                }
                Ok(Ok(Acquire::Confirm { lease, after })) => match self.confirm(store, lease, after).await {
                    Ok(confirmed) => return Ok(confirmed),
                    // Asked to stand down (revoked) before its child started: it ends as a holder would.
                    Err(Unconfirmed::Lost(record))
                        if one_shot || record.as_ref().is_some_and(|r| r.revoked && self.is_own(r)) =>
                    {
                        return Err(Outcome::Conflict(record))
                    }
                    // Someone else's after all: campaign on (the next acquire sees who holds it).
                    Err(Unconfirmed::Lost(_)) => continue,
                    Err(Unconfirmed::Ended(outcome)) => return Err(outcome),
                    Err(Unconfirmed::Failed(err)) => err,
                },
                Ok(Ok(Acquire::Held(record) | Acquire::Unproven { record, .. }))
                    if self.election.unique_identity
                        && record.holder.as_deref() == Some(&self.election.identity)
                        && ghost != Some(record.token) =>
                {
                    // An earlier attempt whose answer never came was granted after all: this
                    // run's own ghost. Give it back and try again at once. Only a give-back that
                    // reached the store settles it (once only: if the store did not free it, it
                    // lapses like any other lease); one that failed is a failure like any other,
                    // tried again within the retry bound.
                    tracing::debug!(token = record.token, "an earlier acquire was granted after all; giving it back");
                    granted.store(true, Ordering::SeqCst);
                    let given_back = self.abandon(store).await;
                    granted.store(false, Ordering::SeqCst);
                    if given_back {
                        ghost = Some(record.token);
                        continue;
                    }
                    StoreError::unavailable("could not give back a lease an earlier acquire of this run was granted")
                }
                Ok(Ok(Acquire::Held(record) | Acquire::Unproven { record, .. })) => {
                    if one_shot && unproven.is_none() || give_up.is_some_and(|t| self.now() >= t) {
                        return Err(Outcome::Conflict(Some(record)));
                    }
                    let holder = record.holder.as_deref().unwrap_or("-");
                    match unproven {
                        Some(left) => {
                            tracing::debug!(holder, ?left, "lock is held; watching whether its holder still renews")
                        }
                        None => tracing::debug!(holder, "lock is held; waiting"),
                    }
                    let recheck = self.recheck_after(store, &record, unproven);
                    let recheck = give_up.map_or(recheck, |t| t.saturating_sub(self.now()).min(recheck));
                    let waiting = store.clone();
                    let lock = self.election.lock.clone();
                    tokio::select! {
                        _ = async move { waiting.changed(&lock, recheck).await } => {}
                        Some(signal) = self.signal() => return Err(Outcome::Interrupted(signal)),
                    }
                    if give_up.is_some_and(|t| self.now() >= t) {
                        return Err(Outcome::Conflict(Some(record)));
                    }
                    backoff = timing.retry_every();
                    continue;
                }
                Ok(Err(err)) if err.is_transient() => {
                    // A timeout of the store's own, or a reset after the request went out: the
                    // store may have granted it all the same. Give it back, as for no answer,
                    // or a one-shot run would leave its lease to keep every host out for a ttl.
                    self.abandon(store).await;
                    granted.store(false, Ordering::SeqCst);
                    err
                }
                Ok(Err(err)) => err,
                Err(_) => {
                    // No answer: the store may still grant it. Give it back before going on,
                    // or nobody would hold that lease and everyone would be kept out for a ttl.
                    self.abandon(store).await;
                    granted.store(false, Ordering::SeqCst);
                    StoreError::unavailable(format!(
                        "the store did not answer within {}",
                        humantime::format_duration(timing.request_timeout())
                    ))
                }
            };
            if !failure.is_transient() || retry_until.is_some_and(|t| self.now() >= t) {
                return Err(Outcome::StoreFailed(failure));
            }
            if one_shot {
                // Quiet in cron: a firing that gets through after an election says nothing.
                tracing::info!("cannot reach the store, retrying: {failure}");
            } else {
                tracing::warn!("cannot reach the store, retrying: {failure}");
            }
            let until = retry_until.map_or(self.now() + backoff, |t| t.min(self.now() + backoff));
            let clock = self.clock.clone();
            tokio::select! {
                _ = async move { sleep_until(&*clock, until).await } => {}
                Some(signal) = self.signal() => return Err(Outcome::Interrupted(signal)),
            }
            if retry_until.is_some_and(|t| self.now() >= t) {
                // The turn never came because the store was down: say so, not "held elsewhere".
                return Err(Outcome::StoreFailed(failure));
            }
            if !one_shot {
                // A one-shot run has seconds to ride out an election: it keeps trying at the
                // first pace. A waiting one backs off, up to one renewal interval.
                backoff = (backoff * 2).min(timing.renew_every);
            }
        }
    }

    /// How long to wait for `changed` before reading a held lock again. A store whose change
    /// notification also reports expiry (a watch on a record the server deletes, a poll, a
    /// client-timed store's own observation) is re-read only when it says so, or after the
    /// safety net. Any other (a release announced on a channel, while expiry is silent) is
    /// re-read when the lease it reported would expire: an idle standby then reads once per
    /// holder renewal at most, and a dead holder's lease is taken as soon as it lapses.
    fn recheck_after(&self, store: &Arc<dyn Store>, record: &LockRecord, unproven: Option<Duration>) -> Duration {
        let recheck = match unproven {
            // A first sight on a client-timed store: decided after one observation.
            Some(left) => left.min(SAFETY_RECHECK),
            None if store.sees_expiry() => SAFETY_RECHECK,
            None => record.expires_in.map_or(RECHECK, |left| (left + MARGIN_AFTER_EXPIRY).min(SAFETY_RECHECK)),
        };
        let recheck = self.election.heartbeat.map_or(recheck, |beat| recheck.min(beat));
        recheck.max(RECHECK_FLOOR)
    }

    /// Run the payload while renewing the lease; stop it when the lease cannot be trusted.
    async fn lead(&mut self, payload: &mut dyn Payload, won: Won) -> Outcome {
        let Won { lease, sent, slot, store } = won;
        let timing = self.timing();
        let deadline = timing.deadline_after(sent);
        self.observer.event(&Event::Elected { lease: &lease, slot, stop_at: timing.stop_at(deadline) });
        // Counted from before the child starts: the watchdog's count, begun at the spawn, ends
        // later, so this run acts first.
        let max_runtime_at = self.election.max_runtime.map(|limit| self.now().saturating_add(limit));
        if let Err(err) = payload.start(&lease, slot, deadline).await {
            // Nothing ran: free the lease at once rather than holding it for --min-hold.
            self.observer.event(&Event::Released);
            self.release(&store, &lease, Duration::ZERO).await;
            return Outcome::StartFailed(err);
        }
        // The other slots' stores are closed, which takes this run out of their standbys' queues.
        self.slot_stores.clear();
        self.observer.event(&Event::ChildStarted);
        // The slot is said for a lock with slots only (a field that is `None` is left out).
        let shown_slot = (self.election.slots > 1).then_some(slot);
        tracing::info!(lock = %lease.lock, slot = shown_slot, token = lease.token, identity = %lease.identity, "elected; child started");
        let mut term = Term::new(lease, timing, self.election.stop, sent, self.observer.clone());
        term.max_runtime_at = max_runtime_at;
        let exit = loop {
            // The clock first: a wrapper resumed from SIGSTOP must act on the time that
            // passed before it looks at a renewal that may have come back meanwhile.
            term.enforce(self.now(), payload);
            let (clock, clock2) = (self.clock.clone(), self.clock.clone());
            let (next_renew, wake) = (term.next_renew, term.next_timer());
            tokio::select! {
                biased;
                exit = payload.wait() => break exit,
                Some(signal) = self.signals.get_mut().recv() => term.relay(signal, self.now(), payload),
                (sent, answer) = first_answer(&mut term.renewing), if !term.renewing.is_empty() => {
                    term.renewal_done(sent, answer, self.now(), payload);
                }
                _ = async move { sleep_until(&*clock, next_renew).await }, if term.renewing.len() < RENEWALS_IN_FLIGHT && term.renews() => {
                    let store = store.clone();
                    let held = term.lease.clone();
                    let sent = self.now();
                    // No attempt outlasts the stop time: a renewal confirmed after it is not used.
                    let limit = timing.stop_at(term.deadline).saturating_sub(sent).max(Duration::from_millis(1));
                    let future: Pending<Renew> = Box::pin(timeout(limit, async move { store.renew(&held, timing.store_ttl()).await }));
                    term.renewing.push((sent, future));
                    // Unanswered by then, a second request goes out beside it: an answer that
                    // is only slow still counts, and one that will never come (a half-open
                    // connection) does not cost the lease while there is time for another.
                    term.next_renew = sent + timing.renew_timeout();
                }
                _ = async move { sleep_until(&*clock2, wake).await } => {}
            }
        };
        payload.finish().await;
        term.exited_at(self.now());
        let lease = term.lease.clone();
        self.observer.event(&Event::ChildEnded { exit, why: term.child_end() });
        let (keep, outcome) = term.outcome(exit);
        self.observer.event(&Event::Released);
        self.release(&store, &lease, keep).await;
        outcome
    }

    /// Best effort: the lease expires by itself if this does not reach the store.
    async fn release(&self, store: &Arc<dyn Store>, lease: &Lease, keep: Duration) {
        match timeout(self.timing().request_timeout(), store.release(lease, keep)).await {
            Ok(Ok(())) => tracing::debug!(token = lease.token, ?keep, "released"),
            Ok(Err(err)) => {
                tracing::warn!("could not release the lease (it will expire by itself): {err}")
            }
            Err(_) => tracing::warn!("releasing the lease timed out (it will expire by itself)"),
        }
    }
}

mod confirm;
mod slots;
mod term;
#[cfg(test)]
mod tests;
