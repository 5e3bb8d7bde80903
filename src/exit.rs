//! Exit statuses, each documented in `--help`, the man page and README.md.

/// Bad usage or configuration; a message names the flag or the rule. Nothing was written.
pub const USAGE: u8 = 2;
/// The store could not be reached, opened or used before the child started.
pub const STORE_UNAVAILABLE: u8 = 69;
/// Internal error: the watchdog could not be started, so the child was not started either.
pub const INTERNAL: u8 = 70;
/// The lease was lost while the child ran; the child was stopped.
pub const LEASE_LOST: u8 = 75;
/// The child ran for --max-runtime and was stopped (timeout(1)'s status).
pub const TIMED_OUT: u8 = 124;
/// COMMAND was found but could not be executed.
pub const NOT_EXECUTABLE: u8 = 126;
/// COMMAND was not found.
pub const NOT_FOUND: u8 = 127;
/// `leaderrun status`: the lock is free. `leaderrun release`: it was not held.
pub const NOT_HELD: u8 = 1;

/// The shell's convention for a process ended by signal `n`.
pub fn for_signal(n: i32) -> u8 {
    (128 + n).clamp(0, 255) as u8
}
