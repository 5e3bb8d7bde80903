//! The child's whole process tree, as leaderrun and the watchdog signal it and wait for
//! it: the child's process group, and its cgroup where the host gives it one.

use std::fmt;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::cgroup::Cgroup;
use super::group::ProcessGroup;

/// Every process that belongs to one run of the child.
#[derive(Debug, Clone, Default)]
pub struct ChildTree {
    /// Unknown in the watchdog until the child announces it.
    pub group: Option<ProcessGroup>,
    /// None where the host offers no writable cgroup v2.
    pub cgroup: Option<Cgroup>,
}

/// The kernel refused a signal (EPERM): the process runs as another user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Group(Pid),
    Process(Pid),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let whom = match self {
            Refused::Group(pgid) => format!("the child's process group {pgid}"),
            Refused::Process(pid) => format!("process {pid} of the child's cgroup"),
        };
        write!(
            f,
            "cannot signal {whom}: it runs as another user (e.g. under sudo or a setuid program), \
             so leaderrun cannot stop it and it may outlive the lease"
        )
    }
}

impl ChildTree {
    /// Whether there is anything to guard yet.
    pub fn known(&self) -> bool {
        self.group.is_some() || self.cgroup.is_some()
    }

    /// Send `signal` to the whole tree: the process group, and the cgroup's members that
    /// left it (a `setsid`, a double fork). SIGKILL goes to the cgroup through
    /// `cgroup.kill`, which nothing can dodge; other signals go to the members one by one,
    /// read from `cgroup.procs` just before, which leaves the small race of any pid-based
    /// kill: a member that exits at that moment and whose pid is taken at once.
    pub fn signal(&self, signal: Signal) -> Result<(), Refused> {
        let mut refused = None;
        if let Some(group) = self.group {
            if group.signal(signal) == Err(Errno::EPERM) {
                refused = Some(Refused::Group(group.id()));
            }
        }
        if let Some(cgroup) = &self.cgroup {
            if signal == Signal::SIGKILL {
                if let Err(pid) = cgroup.kill() {
                    refused = refused.or(Some(Refused::Process(pid)));
                }
            } else {
                for pid in cgroup.members() {
                    // Members of the group got it already; twice would run a trap twice.
                    if self.group.is_some_and(|g| g.contains(pid)) {
                        continue;
                    }
                    if kill(pid, signal) == Err(Errno::EPERM) {
                        refused = refused.or(Some(Refused::Process(pid)));
                    }
                }
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Whether any process of the tree still runs (zombies do not count).
    pub fn alive(&self) -> bool {
        self.cgroup.as_ref().is_some_and(Cgroup::populated) || self.group.is_some_and(ProcessGroup::alive)
    }

    /// Poll until nothing of the tree runs or `limit` has passed; true if it is gone.
    pub fn wait_gone_blocking(&self, limit: Duration) -> bool {
        let started = std::time::Instant::now();
        while self.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// As `wait_gone_blocking`, on tokio's timer. The pace slows from 10 ms to a quarter of a
    /// second: a tree that outlives SIGKILL (state D) may be waited for a long time, and each
    /// look at a process group alone reads every process's `/proc/PID/stat`.
    pub async fn wait_gone(&self, limit: Duration) -> bool {
        let started = tokio::time::Instant::now();
        let mut pace = Duration::from_millis(10);
        while self.alive() {
            if started.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(pace).await;
            pace = (pace * 2).min(Duration::from_millis(250));
        }
        true
    }
}

impl fmt::Display for ChildTree {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.group, &self.cgroup) {
            (Some(group), Some(cgroup)) => {
                write!(f, "process group {} and cgroup {}", group.id(), cgroup.dir().display())
            }
            (Some(group), None) => write!(f, "process group {}", group.id()),
            (None, Some(cgroup)) => write!(f, "cgroup {}", cgroup.dir().display()),
            (None, None) => write!(f, "no process"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_group_and_says_why() {
        let text = Refused::Group(Pid::from_raw(4242)).to_string();
        assert!(text.contains("process group 4242") && text.contains("another user"), "{text}");
        assert!(text.contains("sudo") && text.contains("outlive the lease"), "{text}");
    }
}
