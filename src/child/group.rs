//! A process group: the unit leaderrun signals, sweeps and waits for.

use std::time::Duration;

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The child's process group (its id is the child's pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup(Pid);

impl ProcessGroup {
    pub fn new(pgid: Pid) -> Self {
        Self(pgid)
    }

    pub fn id(self) -> Pid {
        self.0
    }

    /// Send `signal` to every member; false if there was none to send it to.
    pub fn signal(self, signal: Signal) -> bool {
        killpg(self.0, signal).is_ok()
    }

    /// Whether any member is still running. Zombies do not count: once the
    /// wrapper is gone they belong to init, which in a container may never reap them.
    pub fn alive(self) -> bool {
        if killpg(self.0, None).is_err() {
            return false;
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return true;
        };
        entries.flatten().any(|entry| {
            let name = entry.file_name();
            let Some(pid) = name.to_str().filter(|n| n.bytes().all(|b| b.is_ascii_digit())) else {
                return false;
            };
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| self.is_live_member(&stat))
        })
    }

    /// `/proc/PID/stat` reads `pid (comm) state ppid pgrp ...`; comm may hold spaces
    /// and parentheses, so parse from the last ')'.
    fn is_live_member(self, stat: &str) -> bool {
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            return false;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next();
        let pgrp = fields.nth(1).and_then(|f| f.parse::<i32>().ok());
        pgrp == Some(self.0.as_raw()) && !matches!(state, Some("Z") | Some("X"))
    }

    /// Poll until no member is running or `limit` has passed; true if the group is gone.
    pub fn wait_gone_blocking(self, limit: Duration) -> bool {
        let started = std::time::Instant::now();
        while self.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// As `wait_gone_blocking`, on tokio's timer.
    pub async fn wait_gone(self, limit: Duration) -> bool {
        let started = tokio::time::Instant::now();
        while self.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_with_awkward_names() {
        let group = ProcessGroup::new(Pid::from_raw(4242));
        assert!(group.is_live_member("4243 (sleep) S 4242 4242 4242 0 -1"));
        assert!(group.is_live_member("4243 (a) b (c) R 1 4242 4242 0 -1"));
        assert!(!group.is_live_member("4243 (sleep) Z 1 4242 4242 0 -1"));
        assert!(!group.is_live_member("4243 (sleep) S 1 4243 4243 0 -1"));
    }
}
