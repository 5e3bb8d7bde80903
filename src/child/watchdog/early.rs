//! The watchdog forked at start-up, while leaderrun is still one thread.
//!
//! Re-executing the binary for every run costs its dynamic loading, relocation and std's
//! start-up again (most of a one-shot run's own time), and a fresh process's memory. A
//! fork costs neither, but only a single-threaded process may fork and go on running Rust
//! code in the child: after a fork only the forking thread exists, so a lock another
//! thread held at that instant (the allocator's, stderr's, tracing's) stays locked forever
//! in the child. By the time a child is started, threads exist (the SQLite store's worker,
//! tokio's blocking pool). So `main` forks the watchdog before it builds the runtime, for
//! a run only, and the watchdog waits on its pipe until the supervisor claims it and says
//! what to guard (a `--wait` standby keeps it idle while it waits). A run that never
//! starts a child (a conflict, a timing rule refused after parsing, a signal while
//! waiting) dismisses it before exiting; a wrapper that dies first closes the pipe, and
//! the watchdog, having nothing to guard, exits without signalling anything. Flags that
//! the parser refuses, `--help`, `--version` and the subcommands fork nothing.
//!
//! A replacement for a watchdog that died is started later, from the threaded wrapper: it
//! re-executes the binary (`leaderrun __watchdog`, see `Watchdog::spawn`).

use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd};
use std::sync::Mutex;

use nix::fcntl::OFlag;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, setpgid, ForkResult, Pid};

use super::{nonblocking, process};

/// The forked watchdog, until the supervisor claims it.
pub(super) struct Early {
    pub(super) pid: Pid,
    pub(super) pipe: OwnedFd,
}

static EARLY: Mutex<Option<Early>> = Mutex::new(None);

/// Fork the watchdog. Call only while the process has a single thread (at the top of
/// `main`). Returns None in leaderrun, and Some(exit status) in the watchdog once it is
/// done. A failure is not reported: `Watchdog::spawn` then starts one the slow way.
pub fn start_early() -> Option<u8> {
    // Close-on-exec: neither the child's program nor a later watchdog may hold a copy,
    // or the watchdog would never see the end of the pipe when leaderrun dies.
    let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
    nonblocking(&write_end).ok()?;
    // SAFETY: leaderrun has one thread here (the caller's promise), so the child may run
    // any code: nothing another thread held is left locked.
    match unsafe { fork() } {
        Err(_) => None,
        Ok(ForkResult::Child) => {
            drop(write_end);
            Some(become_watchdog(read_end))
        }
        Ok(ForkResult::Parent { child }) => {
            drop(read_end);
            // Both sides set the group (the child too, first thing), so that no signal
            // to leaderrun's group can reach the watchdog whichever runs first.
            let _ = setpgid(child, child);
            *lock() = Some(Early { pid: child, pipe: write_end });
            None
        }
    }
}

/// The forked watchdog, once: for the first `Watchdog::spawn` of the run. None if it
/// is gone meanwhile (killed while leaderrun waited for the lease): it is reaped, and a
/// new one is started instead.
pub(super) fn take() -> Option<Early> {
    lock().take().filter(|early| waitpid(early.pid, Some(WaitPidFlag::WNOHANG)) == Ok(WaitStatus::StillAlive))
}

/// The run is over and never claimed the forked watchdog: end it and reap it, so that
/// nothing of the run outlives leaderrun. It guards nothing, so SIGKILL is harmless, and
/// unlike closing the pipe it needs no co-operation from a watchdog that may be stopped.
pub fn dismiss_unused() {
    let Some(early) = lock().take() else { return };
    drop(early.pipe);
    let _ = kill(early.pid, Signal::SIGKILL);
    let _ = waitpid(early.pid, None);
}

fn lock() -> std::sync::MutexGuard<'static, Option<Early>> {
    EARLY.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The forked child becomes the watchdog: a group of its own, the pipe on stdin and
/// /dev/null on stdout as a re-executed one has them, then its loop.
fn become_watchdog(pipe: OwnedFd) -> u8 {
    let _ = setpgid(Pid::from_raw(0), Pid::from_raw(0));
    // SAFETY: dup2 onto the standard descriptors this process owns; the pipe stays open
    // as fd 0 (dup2 clears close-on-exec there, which no exec follows anyway).
    unsafe {
        libc::dup2(pipe.as_raw_fd(), 0);
    }
    drop(pipe);
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: as above.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
        }
        let _ = null.into_raw_fd();
    }
    rename_as_watchdog();
    give_back_free_heap();
    process::serve()
}

/// The fork shares leaderrun's heap, and counts every page of it that leaderrun had
/// touched, free or not (the command line parser's, mostly). Handing the free ones back
/// keeps the watchdog's own resident set to what it uses; leaderrun's copy is untouched.
fn give_back_free_heap() {
    // SAFETY: malloc_trim has no preconditions; no other thread exists to race with it.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Make `ps` (and /proc/PID/cmdline) show `leaderrun __watchdog`, as a re-executed
/// watchdog reads, instead of the wrapper's command line: operators and the tests tell the
/// two apart by it. The kernel reads the command line from the argument area at the top
/// of the stack, which /proc/self/stat locates; it is overwritten in place, padded with
/// NULs, and left alone when it is too short.
fn rename_as_watchdog() {
    const NAME: &[u8] = b"leaderrun\0__watchdog\0";
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return };
    let Some(fields) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return };
    // Fields 48 and 49 (arg_start, arg_end); the text after ')' begins at field 3.
    let mut fields = fields.split_whitespace().skip(45).map(|f| f.parse::<usize>().ok());
    let (Some(Some(start)), Some(Some(end))) = (fields.next(), fields.next()) else { return };
    if start == 0 || end < start + NAME.len() {
        return;
    }
    let area = std::ptr::with_exposed_provenance_mut::<u8>(start);
    // SAFETY: [start, end) is this process's own argument area, mapped and writable (it
    // lies at the top of the main thread's stack). Nothing here reads it: std reads it
    // only in `std::env::args`, whose copies `main` already made, and no other thread exists.
    unsafe {
        std::ptr::copy_nonoverlapping(NAME.as_ptr(), area, NAME.len());
        std::ptr::write_bytes(area.add(NAME.len()), 0, end - start - NAME.len());
    }
}
