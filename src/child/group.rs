//! A process group: the unit leaderrun signals, sweeps and waits for.

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The child's process group (its id is the child's pid).
///
/// Never 0 or 1: `killpg(0)` signals the caller's own group (leaderrun's, or the
/// watchdog's) and group 1 is init's, so such an id is refused when the group is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessGroup(Pid);

impl ProcessGroup {
    /// The group led by `pgid`; None for an id that names no child's group (≤ 1).
    pub fn new(pgid: Pid) -> Option<Self> {
        (pgid.as_raw() > 1).then_some(Self(pgid))
    }

    /// The group led by the process `pid` (as `std`/tokio give it), if it is one.
    pub fn led_by(pid: u32) -> Option<Self> {
        i32::try_from(pid).ok().map(Pid::from_raw).and_then(Self::new)
    }

    pub fn id(self) -> Pid {
        self.0
    }

    /// Send `signal` (None: only check) to every member. The kernel reports EPERM only when
    /// no member could be signalled, and ESRCH when the group has no member left.
    pub fn signal(self, signal: impl Into<Option<Signal>>) -> Result<(), Errno> {
        killpg(self.0, signal)
    }

    /// Whether any member is still running. Zombies do not count: once the
    /// wrapper is gone they belong to init, which in a container may never reap them.
    pub fn alive(self) -> bool {
        if self.signal(None) == Err(Errno::ESRCH) {
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

    /// Whether the process `pid` is a member (so a signal to the group already reached it).
    pub fn contains(self, pid: Pid) -> bool {
        nix::unistd::getpgid(Some(pid)) == Ok(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_lines_with_awkward_names() {
        let group = ProcessGroup::new(Pid::from_raw(4242)).expect("a valid group");
        assert!(group.is_live_member("4243 (sleep) S 4242 4242 4242 0 -1"));
        assert!(group.is_live_member("4243 (a) b (c) R 1 4242 4242 0 -1"));
        assert!(!group.is_live_member("4243 (sleep) Z 1 4242 4242 0 -1"));
        assert!(!group.is_live_member("4243 (sleep) S 1 4243 4243 0 -1"));
    }

    #[test]
    fn no_group_is_made_for_the_callers_own_group_or_inits() {
        // killpg(0) would signal leaderrun's own group, killpg(1) init's: neither may exist.
        for id in [-5, -1, 0, 1] {
            assert_eq!(ProcessGroup::new(Pid::from_raw(id)), None, "pgid {id}");
        }
        assert_eq!(ProcessGroup::led_by(0), None, "pid 0");
        assert_eq!(ProcessGroup::led_by(1), None, "pid 1");
        assert_eq!(ProcessGroup::led_by(u32::MAX), None, "a pid beyond i32 is no pid");
        assert_eq!(ProcessGroup::led_by(2).map(ProcessGroup::id), Some(Pid::from_raw(2)));
    }
}
