//! Helpers shared by the end-to-end tests: the real binary, real processes, one
//! temporary directory per test, and a guard that kills whatever a test left behind.
//!
//! Rules these helpers exist to keep:
//! - every test has its own temp dir and its own SQLite store in it; the real user's
//!   state directory is never touched (and as root, the default store is only ever used
//!   with privileges dropped, since root's default store is /var/lib/leaderrun);
//! - no timing assertions: tests wait on events (files, process states) with a
//!   generous deadline, and only ever assert that something happened within it;
//! - every process a test starts carries a marker variable in its environment, and
//!   the sandbox kills every process carrying its marker when it is dropped, even when
//!   the test failed (wrappers, children, grandchildren and watchdogs alike).
//!
//! `sandbox.rs` holds the sandbox, `wrapper.rs` a leaderrun running in the background,
//! `assertions.rs` the checks several tests make, `slots.rs` those of `--slots N`.

#![allow(dead_code)]

mod assertions;
mod sandbox;
pub mod slots;
mod wrapper;

pub use assertions::*;
pub use sandbox::*;
pub use wrapper::*;

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::kill;
use nix::unistd::Pid;

/// The binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_leaderrun");

/// A generous bound for things that normally take milliseconds.
pub const SOON: Duration = Duration::from_secs(10);

/// A generous bound for things that take about one short lease (2-3 s ttls).
pub const WITHIN_A_LEASE: Duration = Duration::from_secs(20);

/// Poll `cond` every 20 ms until it holds; panic naming `what` after `within`.
pub fn wait_for(mut cond: impl FnMut() -> bool, within: Duration, what: &str) {
    let started = Instant::now();
    loop {
        if cond() {
            return;
        }
        if started.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of /proc/PID/stat (R, S, D, T, t, Z, X, ...), if the process exists.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// Whether `pid` is a live process. A zombie counts as dead: it runs nothing any more.
pub fn pid_alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    !matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Whether the process is stopped (SIGSTOP / SIGTSTP).
pub fn pid_stopped(pid: i32) -> bool {
    matches!(proc_state(pid), Some('T'))
}

/// The exit code of a process that exited normally; panics (with `context`) otherwise.
pub fn code_of(status: ExitStatus, context: &str) -> i32 {
    match status.code() {
        Some(code) => code,
        None => panic!("{context}: expected an exit code, the process was killed by signal {:?}", status.signal()),
    }
}

/// The command line of a process, for messages.
pub fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
        .unwrap_or_default()
}

/// The stderr of `out` as text.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The stdout of `out` as text.
pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}
