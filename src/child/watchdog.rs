//! The watchdog: a separate process that enforces the lease deadline on the child's
//! process group even when leaderrun itself cannot.
//!
//! A SIGKILLed, OOM-killed or crashed wrapper cannot stop its child, and a SIGSTOPped
//! one cannot keep time; `PR_SET_PDEATHSIG` covers only the direct child. So before
//! the child starts, leaderrun starts itself again as `leaderrun __watchdog`, in a
//! process group of its own (a signal to the wrapper's group does not reach it), with
//! a pipe on its stdin. Over the pipe it learns the child's process group and every
//! new deadline, as instants on CLOCK_BOOTTIME, which both processes share.
//!
//! - At `deadline − kill_after` it sends the stop signal to the group, at `deadline`
//!   SIGKILL: this is what stops the child of a frozen wrapper.
//! - When the pipe closes without a goodbye (the wrapper died), it sends the stop
//!   signal at once and SIGKILL after `kill_after` or at the deadline, whichever is
//!   first, and waits until the group is gone.
//! - On the goodbye line it exits without touching anything.

use std::io::Write;
use std::os::fd::AsFd;
use std::process::{ChildStdin, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::group::ProcessGroup;
use crate::clock::boottime;

/// argv[1] that turns leaderrun into its own watchdog.
pub const ARG: &str = "__watchdog";

/// The wrapper's end of the pipe.
pub struct Watchdog {
    pipe: Option<ChildStdin>,
    process: std::process::Child,
}

impl Watchdog {
    /// Start the watchdog with the first `deadline` (CLOCK_BOOTTIME).
    pub fn spawn(stop: Signal, kill_after: Duration, deadline: Duration) -> std::io::Result<Self> {
        use std::os::unix::process::CommandExt;
        let mut process = Command::new("/proc/self/exe")
            .arg0("leaderrun")
            .arg(ARG)
            .arg((stop as i32).to_string())
            .arg(kill_after.as_nanos().to_string())
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        let pipe = process.stdin.take();
        if let Some(pipe) = &pipe {
            // Never block the wrapper on a stopped watchdog: a message that does not fit
            // is dropped, which can only make the watchdog act earlier, never later.
            let flags = nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_GETFL)?;
            let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
            nix::fcntl::fcntl(pipe, nix::fcntl::FcntlArg::F_SETFL(flags))?;
        }
        let mut watchdog = Self { pipe, process };
        watchdog.send(&format!("D {}", deadline.as_nanos()));
        Ok(watchdog)
    }

    /// The write end of the pipe, for `announce_from_child`.
    pub fn pipe_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.pipe.as_ref().map(AsRawFd::as_raw_fd)
    }

    /// The child's process group to guard.
    pub fn guard(&mut self, pgid: Pid) {
        self.send(&format!("P {}", pgid.as_raw()));
    }

    /// The lease was renewed: the new deadline.
    pub fn extend(&mut self, deadline: Duration) {
        self.send(&format!("D {}", deadline.as_nanos()));
    }

    /// The child is gone: say goodbye and reap the watchdog.
    pub fn finish(&mut self) {
        self.send("X");
        self.pipe = None;
        let _ = self.process.wait();
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

/// What the watchdog knows.
struct Guard {
    stop: Signal,
    kill_after: Duration,
    group: Option<ProcessGroup>,
    deadline: Duration,
    stop_sent: bool,
    kill_sent: bool,
}

impl Guard {
    fn signal(&mut self, signal: Signal, why: &str) {
        if let Some(group) = self.group {
            if group.alive() && group.signal(signal) {
                eprintln!("leaderrun: watchdog: {why}; sent {signal} to process group {}", group.id());
            }
        }
    }

    /// Act on the deadline; return how long until the next thing to do.
    fn tick(&mut self) -> Option<Duration> {
        self.group?;
        let now = boottime();
        let stop_at = self.deadline.saturating_sub(self.kill_after);
        if !self.stop_sent && now >= stop_at {
            self.stop_sent = true;
            let stop = self.stop;
            self.signal(stop, "the lease deadline is near and leaderrun did not renew it");
        }
        if !self.kill_sent && now >= self.deadline {
            self.kill_sent = true;
            self.signal(Signal::SIGKILL, "the lease deadline passed");
        }
        if self.kill_sent {
            None
        } else if self.stop_sent {
            Some(self.deadline - now)
        } else {
            Some(stop_at - now)
        }
    }

    /// The wrapper is gone: stop the group now, kill it after the grace, wait until it is gone.
    fn orphaned(&mut self) {
        let Some(group) = self.group else { return };
        if !group.alive() {
            return;
        }
        let stop = self.stop;
        self.signal(stop, "leaderrun died");
        let grace = self.kill_after.min(self.deadline.saturating_sub(boottime()));
        if !group.wait_gone_blocking(grace) {
            self.signal(Signal::SIGKILL, "leaderrun died and the group outlived the grace");
            group.wait_gone_blocking(Duration::from_secs(5));
        }
    }
}

/// The watchdog's main: `leaderrun __watchdog SIGNAL KILL_AFTER_NS`, pipe on stdin.
pub fn main(args: &[String]) -> u8 {
    // Terminal and stray signals must not disarm it; only its pipe ends it.
    for signal in crate::child::signals::FORWARDED {
        // SAFETY: installing SIG_IGN has no handler to run.
        unsafe {
            let _ = nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigIgn);
        }
    }
    let parse = |i: usize| args.get(i).and_then(|s| s.parse::<i64>().ok());
    let (Some(stop), Some(kill_after)) = (parse(0), parse(1)) else {
        eprintln!("leaderrun: __watchdog is internal to leaderrun");
        return crate::exit::USAGE;
    };
    let mut guard = Guard {
        stop: Signal::try_from(stop as i32).unwrap_or(Signal::SIGTERM),
        kill_after: Duration::from_nanos(kill_after.max(0) as u64),
        group: None,
        deadline: Duration::MAX,
        stop_sent: false,
        kill_sent: false,
    };
    let stdin = std::io::stdin();
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 512];
    loop {
        // Read whatever the wrapper has already sent before judging the deadline: a
        // renewal that reached the pipe must count.
        let mut fds = [nix::poll::PollFd::new(stdin.as_fd(), nix::poll::PollFlags::POLLIN)];
        let pending_input = matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0);
        if !pending_input {
            let timeout = match guard.tick() {
                None => nix::poll::PollTimeout::NONE,
                Some(d) => nix::poll::PollTimeout::try_from(d.as_millis().clamp(1, 60_000) as i32)
                    .unwrap_or(nix::poll::PollTimeout::MAX),
            };
            let mut fds = [nix::poll::PollFd::new(stdin.as_fd(), nix::poll::PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, timeout) {
                Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        let n = match nix::unistd::read(&stdin, &mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
            Err(_) => break,
        };
        pending.extend_from_slice(&chunk[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let mut words = line.split_whitespace();
            match (words.next(), words.next().and_then(|w| w.parse::<u128>().ok())) {
                (Some("P"), Some(pgid)) => guard.group = Some(ProcessGroup::new(Pid::from_raw(pgid as i32))),
                (Some("D"), Some(ns)) => guard.deadline = Duration::from_nanos(ns.min(u64::MAX as u128) as u64),
                (Some("X"), _) => return 0,
                _ => {}
            }
        }
    }
    // The pipe closed without a goodbye: the wrapper is gone.
    guard.orphaned();
    0
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;

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
