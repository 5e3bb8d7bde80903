//! What a run reports about itself, for whoever watches it: the child's `leaderrun check`
//! (the lease file), a leader file, systemd's notify protocol, and `--http`'s health,
//! readiness and metrics.
//!
//! The elector says what happens as `Event`s to one `Observer`; each window onto the run is
//! an observer of its own, and `Observers` hands every event to each of them. An observer only
//! reports (DESIGN.md §9, Observing): it is called synchronously from the elector's loop, so
//! it must never block, never fail the run and never send a request to the store. A stop
//! signal is sent before the event that says so.

use std::sync::Arc;
use std::time::Duration;

use crate::payload::ChildExit;
use crate::store::{Lease, LockRecord};

#[cfg(feature = "http")]
pub mod health;
#[cfg(feature = "http")]
pub mod http;
pub mod leader_file;
pub mod lease_file;
#[cfg(feature = "http")]
pub mod metrics;
pub mod systemd;
#[cfg(feature = "http")]
pub mod timed_store;

/// Something that happened in a run. Instants are on the elector's clock (CLOCK_BOOTTIME
/// in the binary).
#[derive(Debug, Clone, Copy)]
pub enum Event<'a> {
    /// The store is open and the campaign begins: the run is up (systemd's READY=1).
    Campaigning { lock: &'a str },
    /// An acquire was answered (or not).
    Attempted(Attempt<'a>),
    /// This run leads: its child is about to start under `lease`, which is trusted until
    /// `stop_at`, when the child gets its stop signal unless a renewal moves it.
    Elected { lease: &'a Lease, slot: usize, stop_at: Duration },
    /// The child started.
    ChildStarted,
    /// A renewal was answered (or not).
    Renewal(Renewal),
    /// The lease is no longer trusted (lost, revoked, or not renewed in time): the child
    /// was sent its stop signal. This run no longer leads.
    SteppingDown,
    /// The child is gone.
    ChildEnded { exit: ChildExit, why: ChildEnd },
    /// The lease is being given up, or kept for --min-hold with no child: leadership is over.
    Released,
    /// The run is ending (systemd's STOPPING=1).
    Stopping,
    /// A store request ended after `took` (`ok`: it was answered, whatever the answer).
    StoreCall { operation: &'static str, took: Duration, ok: bool },
}

/// How an acquire ended.
#[derive(Debug, Clone, Copy)]
pub enum Attempt<'a> {
    Won,
    /// Someone else holds the lock: this run stands by.
    Held(&'a LockRecord),
    /// The store failed or did not answer.
    Failed,
}

impl Attempt<'_> {
    /// The `result` label of the acquire counter.
    pub fn label(&self) -> &'static str {
        match self {
            Attempt::Won => "won",
            Attempt::Held(_) => "held",
            Attempt::Failed => "failed",
        }
    }
}

/// How a renewal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Renewed: the lease is trusted until `stop_at` now.
    Renewed { stop_at: Duration },
    /// Renewed, but too close to the stop time to be used.
    TooLate,
    /// The store says the lease is not this run's any more.
    Lost,
    /// The store failed.
    Failed,
    /// No answer in time.
    TimedOut,
}

impl Renewal {
    /// The `result` label of the renewal counter.
    pub fn label(&self) -> &'static str {
        match self {
            Renewal::Renewed { .. } => "renewed",
            Renewal::TooLate => "too_late",
            Renewal::Lost => "lost",
            Renewal::Failed => "failed",
            Renewal::TimedOut => "timed_out",
        }
    }
}

/// Why the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildEnd {
    /// On its own.
    Exited,
    /// leaderrun got SIGINT or SIGTERM and relayed it.
    Interrupted,
    /// The store said the lease was taken, freed or revoked.
    LeaseLost,
    /// No renewal succeeded in time.
    LeaseExpired,
    /// It ran for --max-runtime.
    RanTooLong,
}

impl ChildEnd {
    /// The `reason` label of the child-end counter.
    pub fn label(&self) -> &'static str {
        match self {
            ChildEnd::Exited => "exited",
            ChildEnd::Interrupted => "interrupted",
            ChildEnd::LeaseLost => "lease_lost",
            ChildEnd::LeaseExpired => "lease_expired",
            ChildEnd::RanTooLong => "max_runtime",
        }
    }
}

/// One window onto the run.
pub trait Observer: Send + Sync {
    /// Called from the elector's loop: return at once, never fail.
    fn event(&self, event: &Event<'_>);
}

/// Every window the run opened; none at all when nothing watches.
#[derive(Clone, Default)]
pub struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn add(&mut self, observer: Arc<dyn Observer>) {
        self.0.push(observer);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Observer for Observers {
    fn event(&self, event: &Event<'_>) {
        for observer in &self.0 {
            observer.event(event);
        }
    }
}
