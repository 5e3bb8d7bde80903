//! The watchdog process itself, forked at start-up or re-executed as `leaderrun
//! __watchdog`, with leaderrun's pipe on its stdin. It runs no tokio runtime: one poll
//! loop over the pipe and a CLOCK_BOOTTIME timer.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::unistd::Pid;

use super::timer::BootTimer;
use crate::child::cgroup::Cgroup;
use crate::child::group::ProcessGroup;
use crate::child::signals::FORWARDED;
use crate::child::tree::ChildTree;
use crate::clock::boottime;

/// How long after --max-runtime the watchdog sends the stop signal itself (at most half of
/// `kill_after`): leaderrun, when it runs, sends it at the limit and the child is usually gone
/// by then; a frozen leaderrun's child gets it this late, and SIGKILL on time.
const MAX_RUNTIME_SLACK: Duration = Duration::from_millis(500);

/// What the watchdog knows of the child and its deadline.
struct Guard {
    stop: Signal,
    kill_after: Duration,
    tree: ChildTree,
    /// On CLOCK_BOOTTIME; None until leaderrun sends the first.
    deadline: Option<Duration>,
    stop_sent: bool,
    kill_sent: bool,
    /// A refused signal is said once, not at every step.
    refusal_told: bool,
    /// Files that say this run leads (its leader file, the child's lease file): removed when
    /// the watchdog stops the child, since the run leads no more.
    files: Vec<PathBuf>,
    /// When the child has run for --max-runtime (CLOCK_BOOTTIME), if there is a limit.
    max_runtime_at: Option<Duration>,
}

/// What a line from leaderrun asks for.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    Nothing,
    Goodbye,
}

impl Guard {
    /// A guard of nothing yet: leaderrun's first lines say what to guard, and how.
    fn waiting() -> Self {
        Self::new(Signal::SIGTERM, Duration::ZERO, None)
    }

    fn new(stop: Signal, kill_after: Duration, cgroup: Option<Cgroup>) -> Self {
        Self {
            stop,
            kill_after,
            tree: ChildTree { group: None, cgroup },
            deadline: None,
            stop_sent: false,
            kill_sent: false,
            refusal_told: false,
            files: Vec::new(),
            max_runtime_at: None,
        }
    }

    /// `S <signal> <ns>`: the stop signal and kill_after; `C <hex>`: the cgroup's
    /// directory, its bytes in hex; `R <hex>`: a file or directory to remove when the
    /// watchdog stops the child; `M <ns>`: when the child has run for --max-runtime; `P <pgid>`: the group to guard (0 and 1 are never one,
    /// and are ignored); `D <ns>`: the deadline on CLOCK_BOOTTIME; `X`: goodbye.
    fn hear(&mut self, line: &str) -> Heard {
        let mut words = line.split_whitespace();
        let first = words.next();
        if first == Some("C") {
            if let Some(dir) = words.next().and_then(unhex) {
                self.tree.cgroup = Some(Cgroup::at(PathBuf::from(OsString::from_vec(dir))));
            }
            return Heard::Nothing;
        }
        if first == Some("R") {
            if let Some(path) = words.next().and_then(unhex) {
                self.files.push(PathBuf::from(OsString::from_vec(path)));
            }
            return Heard::Nothing;
        }
        match (first, words.next().and_then(|w| w.parse::<u64>().ok())) {
            (Some("S"), Some(signal)) => {
                let stop = i32::try_from(signal).ok().and_then(|s| Signal::try_from(s).ok());
                if let (Some(stop), Some(ns)) = (stop, words.next().and_then(|w| w.parse::<u64>().ok())) {
                    self.stop = stop;
                    self.kill_after = Duration::from_nanos(ns);
                }
            }
            (Some("P"), Some(pgid)) => {
                if let Some(group) = i32::try_from(pgid).ok().map(Pid::from_raw).and_then(ProcessGroup::new) {
                    self.tree.group = Some(group);
                }
            }
            (Some("D"), Some(ns)) => self.deadline = Some(Duration::from_nanos(ns)),
            (Some("M"), Some(ns)) => self.max_runtime_at = Some(Duration::from_nanos(ns)),
            (Some("X"), _) => return Heard::Goodbye,
            _ => {}
        }
        Heard::Nothing
    }

    /// The run leads no more: what says it does goes.
    fn remove_files(&mut self) {
        for path in self.files.drain(..) {
            let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
        }
    }

    fn signal(&mut self, signal: Signal, why: &str) {
        if !self.tree.alive() {
            return;
        }
        match self.tree.signal(signal) {
            Ok(()) => eprintln!("leaderrun: watchdog: {why}; sent {signal} to the child's {}", self.tree),
            Err(refused) if !self.refusal_told => {
                self.refusal_told = true;
                eprintln!("leaderrun: watchdog: {why}; {refused}");
            }
            Err(_) => {}
        }
    }

    /// When the tree gets the stop signal: `kill_after` before the lease deadline, or a little
    /// after the child has run for --max-runtime (`MAX_RUNTIME_SLACK`), whichever is first.
    fn stop_time(&self, deadline: Duration) -> Duration {
        let slack = (self.kill_after / 2).min(MAX_RUNTIME_SLACK);
        deadline.saturating_sub(self.kill_after).min(self.max_runtime_at.map_or(Duration::MAX, |at| at + slack))
    }

    /// When it gets SIGKILL: at the deadline, or `kill_after` after --max-runtime.
    fn kill_time(&self, deadline: Duration) -> Duration {
        deadline.min(self.max_runtime_at.map_or(Duration::MAX, |at| at.saturating_add(self.kill_after)))
    }

    /// Act on the deadline at `now` (CLOCK_BOOTTIME).
    fn tick(&mut self, now: Duration) {
        let Some(deadline) = self.deadline.filter(|_| self.tree.known()) else { return };
        if !self.stop_sent && now >= self.stop_time(deadline) {
            self.stop_sent = true;
            let stop = self.stop;
            if now < deadline.saturating_sub(self.kill_after) {
                // The lease still holds: what says the run leads stays with it.
                self.signal(stop, "the child ran for --max-runtime");
            } else {
                self.remove_files();
                self.signal(stop, "the lease deadline is near and leaderrun did not renew it");
            }
        }
        if !self.kill_sent && now >= self.kill_time(deadline) {
            self.kill_sent = true;
            let why =
                if now < deadline { "the child outlived --max-runtime's grace" } else { "the lease deadline passed" };
            self.signal(Signal::SIGKILL, why);
        }
    }

    /// The next instant `tick` has something to do; None: nothing until leaderrun speaks.
    fn next_wake(&self) -> Option<Duration> {
        let deadline = self.deadline.filter(|_| self.tree.known())?;
        if !self.stop_sent {
            Some(self.stop_time(deadline))
        } else if !self.kill_sent {
            Some(self.kill_time(deadline))
        } else {
            None
        }
    }

    /// leaderrun is gone: stop the tree now, kill it after the grace (or at the deadline,
    /// whichever is first), wait until it is gone, and remove its cgroup.
    fn orphaned(&mut self) {
        self.remove_files();
        if self.tree.alive() {
            let stop = self.stop;
            self.signal(stop, "leaderrun died");
            let left = self.deadline.map_or(self.kill_after, |d| d.saturating_sub(boottime()));
            if !self.tree.wait_gone_blocking(self.kill_after.min(left)) {
                self.signal(Signal::SIGKILL, "leaderrun died and the child outlived the grace");
                self.tree.wait_gone_blocking(Duration::from_secs(5));
            }
        }
        if let Some(cgroup) = &self.tree.cgroup {
            let _ = cgroup.remove();
        }
    }
}

/// The signals meant for leaderrun or its child must not disarm the watchdog: a
/// terminal's hangup, `kill` of a whole session, a mistaken `pkill leaderrun`. (Ctrl-C
/// does not reach it: the terminal signals its foreground group, and the watchdog runs in
/// a group of its own.) Only leaderrun's goodbye, or the end of its pipe, ends it.
///
/// SIG_IGN would do that with an `unsafe` call to sigaction. signal-hook's flag handler
/// does it in safe code, with the same effect on the signal (the default action, which
/// would end the process, is replaced), and records which signal came, so the watchdog
/// can say why it is still running. A signal interrupts the poll (EINTR) and the loop
/// reports it; one that lands just before the poll is reported at the next wake-up.
fn catch_stray_signals() -> std::io::Result<Arc<AtomicUsize>> {
    let last = Arc::new(AtomicUsize::new(0));
    for signal in FORWARDED {
        signal_hook::flag::register_usize(signal as i32, last.clone(), signal as usize)?;
    }
    Ok(last)
}

/// The bytes written as hex digits by the wrapper (`hex` in watchdog.rs).
fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits = text.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits.chunks(2).map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()).collect()
}

/// Whether the pipe has something (data or its end) to read now.
fn readable_now(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    matches!(poll(&mut fds, PollTimeout::ZERO), Ok(n) if n > 0)
}

/// `leaderrun __watchdog`: a replacement, started by a threaded wrapper.
pub fn main(args: &[String]) -> u8 {
    if !args.is_empty() {
        eprintln!("leaderrun: __watchdog is internal to leaderrun");
        return crate::exit::USAGE;
    }
    serve()
}

/// The watchdog's loop, until the goodbye or the end of the pipe on stdin.
pub fn serve() -> u8 {
    let stray = match catch_stray_signals() {
        Ok(stray) => stray,
        Err(err) => {
            eprintln!("leaderrun: watchdog: cannot install its signal handlers: {err}");
            return crate::exit::INTERNAL;
        }
    };
    let timer = match BootTimer::new() {
        Ok(timer) => timer,
        Err(err) => {
            eprintln!("leaderrun: watchdog: cannot make a CLOCK_BOOTTIME timer: {err}");
            return crate::exit::INTERNAL;
        }
    };
    let mut guard = Guard::waiting();
    let stdin = std::io::stdin();
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 512];
    let mut stray_told = false;
    loop {
        let caught = stray.swap(0, Ordering::Relaxed);
        if caught != 0 && !stray_told {
            stray_told = true;
            let name = i32::try_from(caught).ok().and_then(|n| Signal::try_from(n).ok());
            eprintln!(
                "leaderrun: watchdog: ignoring {}: only leaderrun's goodbye, or leaderrun's end, stops the watchdog",
                name.map_or_else(|| format!("signal {caught}"), |s| s.to_string())
            );
        }
        // Read whatever leaderrun has already sent before judging the deadline: a
        // renewal that reached the pipe must count.
        if !readable_now(stdin.as_fd()) {
            guard.tick(boottime());
            if let Err(err) = timer.arm(guard.next_wake()) {
                // Without its clock it cannot keep the deadline: stop the child now.
                eprintln!("leaderrun: watchdog: cannot arm its timer: {err}");
                break;
            }
            let mut fds =
                [PollFd::new(stdin.as_fd(), PollFlags::POLLIN), PollFd::new(timer.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(Errno::EINTR) => continue,
                Err(_) => break,
            }
            let pipe_ready = fds[0].revents().is_some_and(|r| !r.is_empty());
            timer.clear();
            if !pipe_ready {
                continue;
            }
        }
        let n = match nix::unistd::read(&stdin, &mut chunk) {
            Ok(0) => break,
            Ok(n) => n,
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(_) => break,
        };
        pending.extend_from_slice(&chunk[..n]);
        while let Some(end) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=end).collect();
            if guard.hear(&String::from_utf8_lossy(&line)) == Heard::Goodbye {
                return 0;
            }
        }
    }
    // The pipe closed without a goodbye: leaderrun is gone.
    guard.orphaned();
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn guard() -> Guard {
        Guard::new(Signal::SIGTERM, SECOND, None)
    }

    #[test]
    fn groups_0_and_1_are_never_guarded() {
        let mut guard = guard();
        // killpg(0) would hit the watchdog's own group, killpg(1) init's.
        assert_eq!(guard.hear("P 0\n"), Heard::Nothing);
        assert_eq!(guard.hear("P 1\n"), Heard::Nothing);
        assert_eq!(guard.hear("P 99999999999\n"), Heard::Nothing, "beyond any pid");
        assert_eq!(guard.tree.group, None);
        guard.hear("P 4242\n");
        assert_eq!(guard.tree.group, ProcessGroup::new(Pid::from_raw(4242)));
        guard.hear("P 1\n");
        assert_eq!(guard.tree.group, ProcessGroup::new(Pid::from_raw(4242)), "a bad line changes nothing");
        assert_eq!(guard.hear("X\n"), Heard::Goodbye);
    }

    #[test]
    fn the_timer_is_armed_at_the_stop_time_then_at_the_deadline() {
        let mut guard = guard();
        guard.hear("D 10000000000\n");
        assert_eq!(guard.next_wake(), None, "no group or cgroup yet: nothing to guard");
        guard.hear("P 4242\n");
        assert_eq!(guard.next_wake(), Some(9 * SECOND), "deadline − kill_after");
        guard.stop_sent = true;
        assert_eq!(guard.next_wake(), Some(10 * SECOND), "then the deadline itself");
        guard.kill_sent = true;
        assert_eq!(guard.next_wake(), None, "then nothing until leaderrun speaks");
    }

    #[test]
    fn a_renewal_moves_the_alarm_and_an_early_deadline_arms_at_zero() {
        let mut guard = guard();
        guard.hear("P 4242\n");
        assert_eq!(guard.next_wake(), None, "no deadline yet");
        guard.hear("D 500000000\n");
        assert_eq!(guard.next_wake(), Some(Duration::ZERO), "deadline < kill_after: stop at once");
        guard.hear("D 20000000000\n");
        assert_eq!(guard.next_wake(), Some(19 * SECOND));
    }

    #[test]
    fn the_first_lines_say_the_stop_signal_the_grace_and_the_cgroup() {
        let mut guard = Guard::waiting();
        assert_eq!(guard.hear("S 2 3000000000\n"), Heard::Nothing);
        assert_eq!((guard.stop, guard.kill_after), (Signal::SIGINT, 3 * SECOND));
        guard.hear("S 999 5\n");
        assert_eq!((guard.stop, guard.kill_after), (Signal::SIGINT, 3 * SECOND), "no such signal: unchanged");
        guard.hear(&format!("C {}\n", super::super::hex(b"/sys/fs/cgroup/a b\n")));
        assert_eq!(guard.tree.cgroup, Some(Cgroup::at(PathBuf::from("/sys/fs/cgroup/a b\n"))), "any bytes");
        guard.hear("C 2f7\n");
        assert!(guard.tree.cgroup.is_some(), "a malformed line changes nothing");
        guard.hear("D 10000000000\n");
        assert_eq!(guard.next_wake(), Some(7 * SECOND), "deadline − kill_after");
    }

    #[test]
    fn a_cgroup_alone_is_enough_to_guard() {
        // A leaderrun killed before the group was announced: the cgroup still holds the child.
        let mut guard = Guard::new(Signal::SIGTERM, SECOND, Some(Cgroup::at(PathBuf::from("/nonexistent"))));
        guard.hear("D 10000000000\n");
        assert_eq!(guard.next_wake(), Some(9 * SECOND));
    }
}
