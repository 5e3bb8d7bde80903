//! What runs while the lease is held, as the elector sees it.
//!
//! The elector drives a `Payload` and never touches processes itself: in
//! production the payload is the child process group and its watchdog
//! (`child/`); the elector's unit tests use a recorder on a paused clock.

use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;

use crate::store::Lease;

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

impl ChildExit {
    /// The shell's convention: the code itself, or 128 + the signal number.
    pub fn status(self) -> u8 {
        match self {
            ChildExit::Code(c) => (c & 0xff) as u8,
            ChildExit::Signal(n) => crate::exit::for_signal(n),
        }
    }
}

/// Why the payload could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: {1}")]
    NotExecutable(String, String),
    #[error("{0}")]
    Internal(String),
    /// The lease's stop time had passed when the child was about to run (this host froze or
    /// was starved between the grant and the exec): it was never run, and must not be.
    #[error("the lease ran out before the child could start")]
    TooLate,
}

impl StartError {
    pub fn status(&self) -> u8 {
        match self {
            StartError::NotFound(_) => crate::exit::NOT_FOUND,
            StartError::NotExecutable(..) => crate::exit::NOT_EXECUTABLE,
            StartError::Internal(_) => crate::exit::INTERNAL,
            StartError::TooLate => crate::exit::STORE_UNAVAILABLE,
        }
    }
}

#[async_trait]
pub trait Payload: Send {
    /// Start under `lease`, held in slot `slot` of the lock (0 for a plain lock); `deadline`
    /// (on the elector's clock) is when it must be dead unless the lease is renewed. A payload
    /// that would begin after its stop time (`Timing::stop_at`) does not begin:
    /// `StartError::TooLate`.
    async fn start(&mut self, lease: &Lease, slot: usize, deadline: Duration) -> Result<(), StartError>;
    /// A renewal succeeded: the deadline moved to `deadline`.
    fn extend(&mut self, deadline: Duration);
    /// Deliver `signal` to the whole payload (a process group).
    fn signal(&mut self, signal: Signal);
    /// SIGKILL the whole payload.
    fn kill(&mut self);
    /// Resolve when the payload is gone, with how it ended. Cancel-safe: the elector
    /// polls it in a loop next to its timers.
    async fn wait(&mut self) -> ChildExit;
    /// The payload is gone and the lease is about to be given up: stand the watchdog down.
    /// Returns only once no watchdog of this run can signal anything any more: the
    /// elector releases the lease after it, never before.
    async fn finish(&mut self);
}
