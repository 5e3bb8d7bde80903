//! The watchdog: a separate process that enforces the lease deadline on the child's
//! process tree even when leaderrun itself cannot.
//!
//! A SIGKILLed, OOM-killed or crashed wrapper cannot stop its child, and a SIGSTOPped
//! one cannot keep time; `PR_SET_PDEATHSIG` covers only the direct child. So a watchdog
//! process guards the child, in a process group of its own (a signal to the wrapper's
//! group does not reach it), reading a pipe from leaderrun on its stdin. It is forked at
//! start-up, before leaderrun has threads (`early.rs`); a replacement for one that died
//! re-executes the binary as `leaderrun __watchdog`. Over the pipe it learns the stop
//! signal and `kill_after`, the child's cgroup if it has one, the child's process group
//! and every new deadline, as instants on CLOCK_BOOTTIME, which both processes share.
//!
//! - At `deadline − kill_after` it sends the stop signal to the tree, at `deadline`
//!   SIGKILL: this is what stops the child of a frozen wrapper.
//! - When the pipe closes without a goodbye (the wrapper died), it sends the stop
//!   signal at once and SIGKILL after `kill_after` or at the deadline, whichever is
//!   first, and waits until the tree is gone. Before it knows of a child it just exits.
//! - On the goodbye line it exits without touching anything.
//!
//! This file is the wrapper's side; `process.rs` is the watchdog's.

mod early;
mod handle;
mod process;
mod timer;

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::group::ProcessGroup;
pub use early::{dismiss_unused, start_early};
use handle::Handle;
pub use process::main;

/// argv[1] that turns leaderrun into its own watchdog.
pub const ARG: &str = "__watchdog";

/// How long a watchdog that got the goodbye may take to exit before it is SIGKILLed.
/// It exits at once unless it is stopped or starved; either way it must be gone before
/// the lease is released.
const GOODBYE_WAIT: Duration = Duration::from_secs(5);

/// The wrapper's end: the pipe, and the watchdog process (reaped here, waiting on
/// SIGCHLD through tokio, so that waiting for it never blocks the runtime).
pub struct Watchdog {
    pipe: Option<File>,
    process: Handle,
}

impl Watchdog {
    /// Start a watchdog with `deadline` (CLOCK_BOOTTIME), guarding `cgroup` if given: the
    /// one forked at start-up if it is still unclaimed, else a new one (re-executed: see
    /// `early.rs` for why a threaded process does not fork one).
    pub fn spawn(
        stop: Signal,
        kill_after: Duration,
        deadline: Duration,
        cgroup: Option<&Path>,
    ) -> std::io::Result<Self> {
        let (pid, write_end) = match early::take() {
            Some(early) => (early.pid, early.pipe),
            None => reexecute()?,
        };
        let mut watchdog = Self { pipe: Some(File::from(write_end)), process: Handle::new(pid) };
        watchdog.send(&format!("S {} {}", stop as i32, kill_after.as_nanos()));
        if let Some(dir) = cgroup {
            watchdog.send(&format!("C {}", hex(dir.as_os_str().as_bytes())));
        }
        watchdog.extend(deadline);
        Ok(watchdog)
    }

    /// The write end of the pipe, for `announce_from_child`.
    pub fn pipe_fd(&self) -> Option<RawFd> {
        self.pipe.as_ref().map(AsRawFd::as_raw_fd)
    }

    pub fn pid(&self) -> Option<u32> {
        u32::try_from(self.process.pid().as_raw()).ok()
    }

    /// The child's process group to guard.
    pub fn guard(&mut self, group: ProcessGroup) {
        self.send(&format!("P {}", group.id().as_raw()));
    }

    /// A file or directory that says this run leads: removed by the watchdog when it stops
    /// the child itself (the wrapper died, or was frozen past its deadline).
    pub fn remove_on_stop(&mut self, path: &Path) {
        self.send(&format!("R {}", hex(path.as_os_str().as_bytes())));
    }

    /// The child may run until `at` (CLOCK_BOOTTIME, --max-runtime): the stop signal then,
    /// SIGKILL `kill_after` later, whatever the lease.
    pub fn limit_runtime(&mut self, at: Duration) {
        self.send(&format!("M {}", at.as_nanos()));
    }

    /// The lease was renewed: the new deadline.
    pub fn extend(&mut self, deadline: Duration) {
        self.send(&format!("D {}", deadline.as_nanos()));
    }

    /// Resolves when the watchdog process has exited. Cancel-safe.
    pub async fn exited(&mut self) -> std::io::Result<ExitStatus> {
        self.process.exited().await
    }

    /// The child is gone: say goodbye, and return once the watchdog has exited. A
    /// watchdog that does not exit within `GOODBYE_WAIT` (stopped, starved) is SIGKILLed
    /// and reaped: after this returns no watchdog of this run can signal anything.
    pub async fn finish(mut self) {
        self.send("X");
        self.pipe = None;
        if tokio::time::timeout(GOODBYE_WAIT, self.process.exited()).await.is_err() {
            tracing::warn!("the watchdog did not exit after the goodbye; killing it");
            self.process.kill();
            let _ = self.process.exited().await;
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

/// A new watchdog from the threaded wrapper: `leaderrun __watchdog`, the pipe on its stdin.
fn reexecute() -> std::io::Result<(Pid, OwnedFd)> {
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    nonblocking(&write_end)?;
    let child = std::process::Command::new("/proc/self/exe")
        .arg0("leaderrun")
        .arg(ARG)
        .process_group(0)
        .stdin(Stdio::from(read_end))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()?;
    // Dropping std's Child neither kills nor reaps it: `Handle` does the reaping.
    Ok((Pid::from_raw(child.id() as i32), write_end))
}

/// Never block the wrapper on a stopped watchdog: a message that does not fit is
/// dropped, which can only make the watchdog act earlier, never later.
fn nonblocking(fd: &impl AsFd) -> nix::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?) | OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map(drop)
}

/// A path as hex digits: one word on a line, whatever bytes it holds.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
