//! Opening the store for a run, and fitting the run's timings to what the store keeps.
//!
//! Every store call made here may meet a store that fails for a moment: a cluster electing
//! a new leader, a database restarting. A `--wait` run rides that out until its --timeout
//! (a worker started before its database); a one-shot run until its retry bound
//! (`Mode::OneShot::retry_until`: --timeout, else a few seconds), so that a cron firing during
//! an election starts a little late rather than nowhere. A refusal (bad credentials, a
//! setting that does not fit) is never retried: it will not pass.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use super::{fail, Plan};
use crate::clock::Clock;
use crate::elector::Mode;
use crate::exit;
use crate::store::Access;
use crate::store::{ErrorKind, Store, StoreError};

/// The pause between tries while the store is unreachable.
const RETRY_EVERY: Duration = Duration::from_secs(1);

/// The exit status for a store error before the child started: 2 when the store's settings
/// do not fit what was asked (a configuration error), else 69.
pub(super) fn store_failure(err: &StoreError) -> u8 {
    if err.kind == ErrorKind::Unfit {
        exit::USAGE
    } else {
        exit::STORE_UNAVAILABLE
    }
}

/// When a run stops retrying a store that fails transiently (`None`: never, a `--wait` run
/// without --timeout), and when its --timeout cuts a try short, on the elector's clock.
fn bounds(mode: Mode) -> (Option<Duration>, Option<Duration>) {
    match mode {
        Mode::Wait { until } => (until, until),
        Mode::OneShot { until, retry_until } => (Some(retry_until), until),
    }
}

/// Retries of one store call until it answers, fails for good, the run's retry bound passes,
/// or a signal ends the run. `Err` is the status to exit with (the failure logged).
pub(super) struct Retrying<'a> {
    /// No try starts after this.
    pub give_up: Option<Duration>,
    /// No try lasts past this (--timeout); a one-shot run's own retry bound lets a slow try
    /// finish, as a one-shot run without retries always did.
    pub cut_at: Option<Duration>,
    pub clock: &'a dyn Clock,
    pub signals: &'a mut mpsc::UnboundedReceiver<Signal>,
    /// Say it only with -v (a one-shot run: quiet in cron if it gets through in the end).
    pub quietly: bool,
}

impl Retrying<'_> {
    fn left(&self) -> Option<Duration> {
        self.give_up.map(|t| t.saturating_sub(self.clock.now()))
    }

    fn left_to_cut(&self) -> Option<Duration> {
        self.cut_at.map(|t| t.saturating_sub(self.clock.now()))
    }

    /// Call `attempt` until it succeeds. `what` names the call in the log ("open the store").
    /// `bound` caps one attempt (a connect that hangs); the retry bound caps it too.
    async fn call<T, F, Fut>(&mut self, what: &str, bound: Option<Duration>, attempt: F) -> Result<T, u8>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = crate::store::Result<T>>,
    {
        for tries in 0u64.. {
            let limit = match (self.left_to_cut(), bound) {
                (Some(left), Some(bound)) => Some(left.min(bound)),
                (left, bound) => left.or(bound),
            };
            let answered = match limit {
                Some(limit) => tokio::time::timeout(limit, attempt()).await,
                None => Ok(attempt().await),
            };
            let err = match answered {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(err)) if err.is_transient() => err,
                Ok(Err(err)) => return Err(fail(store_failure(&err), err)),
                Err(_) => StoreError::unavailable(format!("could not {what}: the store did not answer in time")),
            };
            if self.left().is_some_and(|left| left.is_zero()) {
                return Err(fail(exit::STORE_UNAVAILABLE, err));
            }
            if tries == 0 && !self.quietly {
                tracing::warn!("cannot {what} yet, retrying every second: {err}");
            } else if tries == 0 {
                tracing::info!("cannot {what} yet, retrying every second: {err}");
            } else {
                tracing::debug!("still cannot {what}: {err}");
            }
            let pause = self.left().map_or(RETRY_EVERY, |left| left.min(RETRY_EVERY));
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                Some(signal) = self.signals.recv() => return Err(exit::for_signal(signal as i32)),
            }
        }
        unreachable!("the tries never run out")
    }
}

/// The stores a run campaigns through.
pub(super) struct Opened {
    pub store: Arc<dyn Store>,
    /// With --wait and --slots N: N - 1 more, one for each further slot (`Elector::slot_stores`).
    pub slot_stores: Vec<Arc<dyn Store>>,
}

/// Open the store, and fit the run's timings to it. A signal that arrives meanwhile ends
/// the run.
pub(super) async fn open_and_fit(
    plan: &mut Plan,
    clock: &dyn Clock,
    signals: &mut mpsc::UnboundedReceiver<Signal>,
) -> Result<Opened, u8> {
    let quietly = matches!(plan.election.mode, Mode::OneShot { .. });
    let (give_up, cut_at) = bounds(plan.election.mode);
    let mut retrying = Retrying { give_up, cut_at, clock, signals, quietly };
    let spec = &plan.spec;
    let store: Arc<dyn Store> = Arc::from(retrying.call("reach the store", None, || spec.open(Access::Create)).await?);
    fit_to_store(plan, &*store, &mut retrying).await?;
    // A store waits for one lock at a time: a run waiting for every slot at once opens one
    // for each, so that each slot's standbys queue as a plain lock's do.
    let mut slot_stores = Vec::new();
    if matches!(plan.election.mode, Mode::Wait { .. }) {
        for _ in 1..plan.election.slots {
            let spec = &plan.spec;
            slot_stores.push(Arc::from(retrying.call("reach the store", None, || spec.open(Access::Create)).await?));
        }
    }
    Ok(Opened { store, slot_stores })
}

/// Without --ttl, a store that keeps leases for less than the default (a ZooKeeper server's
/// maxSessionTimeout, a NATS bucket's max age) gets the longest ttl that fits, with the other
/// defaults scaled to it; what must fit is the lease the store keeps, ttl + --lock-delay. An
/// explicit --ttl is left for the store to accept or refuse, unless --lock-delay is what makes
/// the lease too long: that is refused here (status 2), in words that name it.
///
/// In that order: the failover's defaults, the ttl, then the keep, each on what the one before
/// left (the ttl's fitting rebuilds every timing from what was asked, and would undo a keep
/// capped before it); and last the one-shot retry bound, which follows the keep.
async fn fit_to_store(plan: &mut Plan, store: &dyn Store, retrying: &mut Retrying<'_>) -> Result<(), u8> {
    fit_to_failover(plan, store, retrying).await?;
    fit_ttl_to_store(plan, store, retrying).await?;
    fit_keep_to_store(plan, store, retrying).await?;
    if let Mode::OneShot { until: None, .. } = plan.election.mode {
        let retry_until = plan.started + plan.election.timing.one_shot_retry();
        plan.election.mode = Mode::OneShot { until: None, retry_until };
        retrying.give_up = Some(retry_until);
    }
    Ok(())
}

/// The ttl part of `fit_to_store`.
async fn fit_ttl_to_store(plan: &mut Plan, store: &dyn Store, retrying: &mut Retrying<'_>) -> Result<(), u8> {
    if plan.requested.ttl.is_some() && plan.requested.lock_delay.is_zero() {
        return Ok(());
    }
    let bound = Some(plan.election.timing.request_timeout());
    let wanted = plan.election.timing.store_ttl();
    let longest = retrying.call("learn how long a lease the store keeps", bound, || store.longest_ttl(wanted)).await?;
    let Some(fitted) = longest.and_then(|longest| plan.requested.fit(longest)) else {
        return Ok(());
    };
    let timing = fitted.map_err(|e| fail(exit::USAGE, e))?;
    tracing::info!(
        ttl = %humantime::format_duration(timing.ttl),
        renew_every = %humantime::format_duration(timing.renew_every),
        kill_after = %humantime::format_duration(timing.kill_after),
        lock_delay = %humantime::format_duration(timing.lock_delay),
        "the store keeps leases for less than the default --ttl (+ --lock-delay): using the longest that fits"
    );
    plan.election.timing = timing;
    Ok(())
}

/// A store whose failover takes longer than the defaults ride out (a replicated NATS bucket)
/// gets defaults that do: a longer ttl (unless --ttl was given), a one-shot retry as long as
/// the failover (unless --timeout was given) and a keep twice that (unless --min-hold was).
async fn fit_to_failover(plan: &mut Plan, store: &dyn Store, retrying: &mut Retrying<'_>) -> Result<(), u8> {
    let bound = Some(plan.election.timing.request_timeout());
    let Some(failover) = retrying.call("learn the store's failover time", bound, || store.failover()).await? else {
        return Ok(());
    };
    plan.requested.failover = failover;
    let timing = plan.requested.timing().map_err(|e| fail(exit::USAGE, e))?;
    // A default ttl raised for the failover must still be a lease the store keeps.
    super::check_lease_limits(&*plan.spec, &timing, &plan.requested).map_err(|e| fail(exit::USAGE, e))?;
    if let Mode::OneShot { until: None, .. } = plan.election.mode {
        // The store's next questions may ride out the failover too.
        retrying.give_up = Some(plan.started + timing.one_shot_retry());
    }
    let show = |d: Duration| humantime::format_duration(d).to_string();
    tracing::info!(
        failover = %show(failover),
        ttl = %show(timing.ttl),
        min_hold = %show(timing.min_hold),
        "the store may take this long to serve again after losing a server: defaults that ride it out"
    );
    if timing.renew_window() < failover + Duration::from_secs(2) {
        // The user's own --ttl (or timings): said once, at -v, not mailed by cron at each firing.
        tracing::info!(
            "--ttl {} leaves {} between a renewal and the stop signal, less than the store's failover ({}) \
             and a renewal's copy: losing a server may cost the lease",
            show(timing.ttl),
            show(timing.renew_window()),
            show(failover)
        );
    }
    plan.election.timing = timing;
    Ok(())
}

/// A store that keeps a lock after its child exits for a limited time only (a NATS bucket
/// without per-message TTL: its max age) caps the default --min-hold to it, and refuses a
/// longer --min-hold given on the command line (status 2), which it could not keep in full.
async fn fit_keep_to_store(plan: &mut Plan, store: &dyn Store, retrying: &mut Retrying<'_>) -> Result<(), u8> {
    let keep = plan.election.timing.min_hold;
    if keep.is_zero() {
        return Ok(());
    }
    let bound = Some(plan.election.timing.request_timeout());
    let longest = match retrying.call("learn how long the store keeps a lock", bound, || store.longest_keep()).await? {
        Some(longest) if keep > longest => longest,
        _ => return Ok(()),
    };
    let show = |d: Duration| humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string();
    if plan.requested.min_hold.is_some() {
        return Err(fail(
            exit::USAGE,
            format!(
                "--min-hold {} is longer than this store keeps a lock after its child exits ({}: a NATS bucket \
                 without per-message TTL keeps it for its max age); use --min-hold {} or less",
                show(keep),
                show(longest),
                show(longest)
            ),
        ));
    }
    tracing::info!(min_hold = %show(longest), "the store keeps a lock for less than the default --min-hold: using the longest it keeps");
    plan.election.timing.min_hold = longest;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::clock::TokioClock;
    use crate::store::memory::MemoryStore;
    use crate::timing::DEFAULT_TTL;

    /// A one-shot run planned from `args`, fitted to a store that keeps leases for at most
    /// `ttl` and a lock after its child exits for at most `keep`.
    async fn fitted(args: &[&str], ttl: Option<u64>, keep: Option<u64>) -> Plan {
        let clock = Arc::new(TokioClock::new());
        let store = MemoryStore::new(clock.clone());
        store.set_limits(ttl.map(Duration::from_secs), keep.map(Duration::from_secs));
        let cli = crate::cli::Cli::try_parse_from([&["leaderrun", "--lock", "x"], args, &["--", "true"]].concat())
            .expect("the command line parses");
        let mut plan = super::super::plan(cli.run, clock.now()).expect("a valid plan");
        let (_tx, mut signals) = mpsc::unbounded_channel();
        let (give_up, cut_at) = bounds(plan.election.mode);
        let mut retrying = Retrying { give_up, cut_at, clock: &*clock, signals: &mut signals, quietly: true };
        fit_to_store(&mut plan, &store, &mut retrying).await.expect("fits");
        plan
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_capped_by_the_store_stays_capped_when_the_ttl_is_fitted_too() {
        // A small bucket: leases and kept locks both end after 8 s (the default keep is 10 s).
        let plan = fitted(&[], Some(8), Some(8)).await;
        let timing = plan.election.timing;
        assert!(timing.ttl < DEFAULT_TTL, "the ttl was fitted: {timing:?}");
        assert_eq!(timing.min_hold, Duration::from_secs(8), "the keep stays capped: {timing:?}");
        // The one-shot retries end at half the keep, counted from the capped keep.
        let Mode::OneShot { retry_until, .. } = plan.election.mode else { panic!("one-shot") };
        assert_eq!(retry_until, plan.started + Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_keep_capped_alone_moves_the_retry_bound_too() {
        let plan = fitted(&[], None, Some(6)).await;
        assert_eq!(plan.election.timing.min_hold, Duration::from_secs(6));
        let Mode::OneShot { retry_until, .. } = plan.election.mode else { panic!("one-shot") };
        assert_eq!(retry_until, plan.started + Duration::from_secs(3), "half the capped keep");
    }
}
