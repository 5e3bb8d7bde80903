//! The watchdog: a separate process that enforces the lease deadline on the child's
//! process tree even when leaderrun itself cannot.
//!
//! A SIGKILLed, OOM-killed or crashed wrapper cannot stop its child, and a SIGSTOPped
//! one cannot keep time; `PR_SET_PDEATHSIG` covers only the direct child. So before
//! the child starts, leaderrun starts itself again as `leaderrun __watchdog`, in a
//! process group of its own (a signal to the wrapper's group does not reach it), with
//! a pipe on its stdin and the child's cgroup, if it has one, as an argument. Over the
//! pipe it learns the child's process group and every new deadline, as instants on
//! CLOCK_BOOTTIME, which both processes share.
//!
//! - At `deadline − kill_after` it sends the stop signal to the tree, at `deadline`
//!   SIGKILL: this is what stops the child of a frozen wrapper.
//! - When the pipe closes without a goodbye (the wrapper died), it sends the stop
//!   signal at once and SIGKILL after `kill_after` or at the deadline, whichever is
//!   first, and waits until the tree is gone.
//! - On the goodbye line it exits without touching anything.
//!
//! This file is the wrapper's side; `process.rs` is the watchdog's.

mod process;
mod timer;

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::Signal;

use super::group::ProcessGroup;
pub use process::main;

/// argv[1] that turns leaderrun into its own watchdog.
pub const ARG: &str = "__watchdog";

/// How long a watchdog that got the goodbye may take to exit before it is SIGKILLed.
/// It exits at once unless it is stopped or starved; either way it must be gone before
/// the lease is released.
const GOODBYE_WAIT: Duration = Duration::from_secs(5);

/// The wrapper's end: the pipe, and the watchdog process (reaped on tokio, so that
/// waiting for it never blocks the runtime).
pub struct Watchdog {
    pipe: Option<File>,
    process: tokio::process::Child,
}

impl Watchdog {
    /// Start a watchdog with `deadline` (CLOCK_BOOTTIME), guarding `cgroup` if given.
    pub fn spawn(
        stop: Signal,
        kill_after: Duration,
        deadline: Duration,
        cgroup: Option<&Path>,
    ) -> std::io::Result<Self> {
        use nix::unistd::pipe2;
        // Close-on-exec: neither the child's program nor a later watchdog may hold a copy,
        // or the watchdog would never see the end of the pipe when leaderrun dies.
        let (read_end, write_end) = pipe2(OFlag::O_CLOEXEC)?;
        // Never block the wrapper on a stopped watchdog: a message that does not fit
        // is dropped, which can only make the watchdog act earlier, never later.
        let flags = OFlag::from_bits_truncate(fcntl(&write_end, FcntlArg::F_GETFL)?) | OFlag::O_NONBLOCK;
        fcntl(&write_end, FcntlArg::F_SETFL(flags))?;
        let process = {
            let mut command = tokio::process::Command::new("/proc/self/exe");
            command.arg0("leaderrun").arg(ARG).arg((stop as i32).to_string()).arg(kill_after.as_nanos().to_string());
            if let Some(dir) = cgroup {
                command.arg(dir);
            }
            command
                .process_group(0)
                .stdin(Stdio::from(read_end))
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .kill_on_drop(false);
            command.spawn()?
            // The command, and leaderrun's copy of the read end with it, is dropped here.
        };
        let mut watchdog = Self { pipe: Some(File::from(write_end)), process };
        watchdog.extend(deadline);
        Ok(watchdog)
    }

    /// The write end of the pipe, for `announce_from_child`.
    pub fn pipe_fd(&self) -> Option<RawFd> {
        self.pipe.as_ref().map(AsRawFd::as_raw_fd)
    }

    pub fn pid(&self) -> Option<u32> {
        self.process.id()
    }

    /// The child's process group to guard.
    pub fn guard(&mut self, group: ProcessGroup) {
        self.send(&format!("P {}", group.id().as_raw()));
    }

    /// The lease was renewed: the new deadline.
    pub fn extend(&mut self, deadline: Duration) {
        self.send(&format!("D {}", deadline.as_nanos()));
    }

    /// Resolves when the watchdog process has exited. Cancel-safe (tokio's `wait` is).
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        self.process.wait().await
    }

    /// The child is gone: say goodbye, and return once the watchdog has exited. A
    /// watchdog that does not exit within `GOODBYE_WAIT` (stopped, starved) is SIGKILLed
    /// and reaped: after this returns no watchdog of this run can signal anything.
    pub async fn finish(mut self) {
        self.send("X");
        self.pipe = None;
        if tokio::time::timeout(GOODBYE_WAIT, self.process.wait()).await.is_err() {
            tracing::warn!("the watchdog did not exit after the goodbye; killing it");
            let _ = self.process.start_kill();
            let _ = self.process.wait().await;
        }
    }

    fn send(&mut self, line: &str) {
        if let Some(pipe) = &mut self.pipe {
            if let Err(err) = pipe.write_all(format!("{line}\n").as_bytes()) {
                tracing::warn!("cannot reach the watchdog: {err}");
            }
        }
    }
}

/// Tell the watchdog "P <own pid>" from a just-forked child, before it executes its
/// program: the child leads its own process group by then, so that is the group to guard.
/// Without it, a wrapper killed between the spawn and its own `guard` call would leave the
/// watchdog not knowing which group to stop, and the child running on.
///
/// Runs between fork and exec: only async-signal-safe calls (getpid, write), no allocation.
/// `fd` is the wrapper's end of the pipe, which the forked child still holds (it is closed
/// on exec). The line fits in one atomic pipe write.
pub fn announce_from_child(fd: std::os::fd::RawFd) -> std::io::Result<()> {
    // SAFETY: getpid has no preconditions.
    let mut pid = unsafe { libc::getpid() } as u32;
    let mut digits = [0u8; 10];
    let mut n = 0;
    loop {
        digits[n] = b'0' + (pid % 10) as u8;
        n += 1;
        pid /= 10;
        if pid == 0 {
            break;
        }
    }
    let mut line = [0u8; 13];
    line[..2].copy_from_slice(b"P ");
    for i in 0..n {
        line[2 + i] = digits[n - 1 - i];
    }
    line[2 + n] = b'\n';
    let len = 3 + n;
    // SAFETY: `line` is valid for `len` bytes; write is async-signal-safe.
    let written = unsafe { libc::write(fd, line.as_ptr().cast(), len) };
    if written == len as isize {
        Ok(())
    } else {
        Err(std::io::Error::other("cannot tell the watchdog which process group to guard"))
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    use super::*;

    #[test]
    fn a_child_announces_the_group_it_leads_before_its_program_runs() {
        let (read_end, write_end) = nix::unistd::pipe().expect("a pipe");
        let fd = write_end.as_raw_fd();
        let mut command = Command::new("sh");
        // The program itself writes a second line: it must come after the announcement.
        command.args(["-c", "echo ran >&3"]).process_group(0);
        // SAFETY: announce_from_child is async-signal-safe; dup2 too.
        unsafe {
            command.pre_exec(move || {
                announce_from_child(fd)?;
                // dup2 on a descriptor this process holds (inside the unsafe block above).
                match libc::dup2(fd, 3) {
                    3 => Ok(()),
                    _ => Err(std::io::Error::last_os_error()),
                }
            });
        }
        let mut child = command.spawn().expect("spawn sh");
        let pid = child.id();
        assert!(child.wait().expect("wait").success());
        drop(write_end);
        let mut text = String::new();
        std::fs::File::from(read_end).read_to_string(&mut text).unwrap();
        assert_eq!(
            text,
            format!("P {pid}\nran\n"),
            "the group (the child's own pid, as it leads it), then the program"
        );
    }
}
