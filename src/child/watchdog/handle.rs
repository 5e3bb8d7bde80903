//! The watchdog process as leaderrun holds it: a pid it reaps itself, whether the
//! watchdog was forked at start-up or re-executed, so both are waited for the same way.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::signal::unix::{signal, SignalKind};

pub(super) struct Handle {
    pid: Pid,
    /// Set once reaped: from then on its pid may be someone else's and is never signalled.
    status: Option<ExitStatus>,
}

impl Handle {
    pub(super) fn new(pid: Pid) -> Self {
        Self { pid, status: None }
    }

    pub(super) fn pid(&self) -> Pid {
        self.pid
    }

    /// Resolves when the watchdog has exited (and is reaped). Cancel-safe: SIGCHLD is
    /// watched before the exit is checked, so an exit between the two still wakes it.
    pub(super) async fn exited(&mut self) -> io::Result<ExitStatus> {
        let mut sigchld = signal(SignalKind::child())?;
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            sigchld.recv().await;
        }
    }

    /// SIGKILL it, unless it is already reaped.
    pub(super) fn kill(&self) {
        if self.status.is_none() {
            let _ = kill(self.pid, Signal::SIGKILL);
        }
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        loop {
            // SAFETY: waitpid on our own child, with a valid pointer for its status.
            let reaped = unsafe { libc::waitpid(self.pid.as_raw(), &mut raw, libc::WNOHANG) };
            match reaped {
                0 => return Ok(None),
                -1 if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                -1 => return Err(io::Error::last_os_error()),
                _ => {
                    let status = ExitStatus::from_raw(raw);
                    self.status = Some(status);
                    return Ok(Some(status));
                }
            }
        }
    }
}
