//! A leaderrun running in the background, killed when dropped.

use std::fs;
use std::path::PathBuf;
use std::process::{Child, ExitStatus, Output};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{code_of, wait_for};

/// A leaderrun running in the background.
pub struct Wrapper {
    pub child: Child,
    pub name: String,
    pub(super) out: PathBuf,
    pub(super) err: PathBuf,
}

impl Wrapper {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal)
            .unwrap_or_else(|e| panic!("cannot send {signal} to {}: {e}", self.name));
    }

    /// Its exit status if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Wait (at most `within`) for it to exit; return how it exited.
    pub fn wait_status(&mut self, within: Duration) -> ExitStatus {
        let mut status = None;
        let name = self.name.clone();
        wait_for(
            || {
                status = self.child.try_wait().expect("try_wait");
                status.is_some()
            },
            within,
            &format!("{name} to exit"),
        );
        status.expect("checked above")
    }

    /// Wait (at most `within`) for it to exit with a code; return the code.
    pub fn wait_code(&mut self, within: Duration) -> i32 {
        let status = self.wait_status(within);
        let context = format!("{} (stderr: {:?})", self.name, self.stderr());
        code_of(status, &context)
    }

    /// Wait (at most `within`) for it to exit; return its status and everything it printed.
    pub fn finish(mut self, within: Duration) -> Output {
        let status = self.wait_status(within);
        Output {
            status,
            stdout: fs::read(&self.out).unwrap_or_default(),
            stderr: fs::read(&self.err).unwrap_or_default(),
        }
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
