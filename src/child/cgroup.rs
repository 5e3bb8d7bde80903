//! A cgroup (v2) of the child's own, where the host lets leaderrun make one.
//!
//! A process group holds only the processes that stay in it: `setsid`, a daemon's
//! double fork or a terminal multiplexer leave it, and signals to the group never reach
//! them. A cgroup holds every descendant, whatever it does, unless something with write
//! access to another cgroup moves it out; and `cgroup.kill` SIGKILLs all of it at once,
//! whichever user its processes run as. So where cgroup v2 is mounted and leaderrun may
//! write below its own cgroup (as root, or in a systemd unit with `Delegate=yes`), the
//! child runs in `<leaderrun's cgroup>/leaderrun-<pid>-<boot ns>`: below leaderrun's own,
//! since moving a process needs write access to the cgroup both sides share; a name
//! that is never reused, so a late kill of a finished run's cgroup can hit nobody else's.
//! The new cgroup enables no controllers, so the rule that forbids processes in a cgroup
//! that hands controllers to its children never stands in the way.

use std::fs;
use std::io::Write;
use std::os::fd::{OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The child's cgroup: a directory in the cgroup v2 hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// Make a new cgroup for a child below leaderrun's own. The error says why the host
    /// offers none (no cgroup v2, or no write access), for a debug line: the child then
    /// runs guarded by its process group alone.
    pub fn create() -> Result<Self, String> {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
        let own = fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("/proc/self/cgroup: {e}"))?;
        let own = own_dir(&mountinfo, &own).ok_or("no cgroup v2 hierarchy holds leaderrun")?;
        // The child is moved from leaderrun's cgroup into the new one: that needs write
        // access to leaderrun's own cgroup.procs too.
        nix::unistd::access(&own.join("cgroup.procs"), nix::unistd::AccessFlags::W_OK)
            .map_err(|e| format!("{}/cgroup.procs: {}", own.display(), e.desc()))?;
        let name = format!("leaderrun-{}-{}", std::process::id(), crate::clock::boottime().as_nanos());
        let dir = own.join(name);
        fs::create_dir(&dir).map_err(|e| format!("cannot make a cgroup in {}: {e}", own.display()))?;
        Ok(Self { dir })
    }

    /// The cgroup at `dir`, made by `create` in another process (the watchdog's view).
    pub fn at(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory itself, open for `clone3`'s `CLONE_INTO_CGROUP` (see `spawn.rs`).
    pub fn open_dir(&self) -> std::io::Result<OwnedFd> {
        use std::os::unix::fs::OpenOptionsExt;
        Ok(fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(&self.dir)?.into())
    }

    /// Its `cgroup.procs`, opened for writing: a forked child writes "0" to it to move
    /// itself in before its program runs (see `move_self_in`).
    pub fn open_procs(&self) -> std::io::Result<OwnedFd> {
        Ok(fs::OpenOptions::new().write(true).open(self.dir.join("cgroup.procs"))?.into())
    }

    /// Whether the process `pid` is in this cgroup (also once it is a zombie).
    pub fn holds(&self, pid: u32) -> bool {
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else {
            return false;
        };
        let Some(path) = text.lines().find_map(|line| line.strip_prefix("0::")) else {
            return false;
        };
        let path = path.trim_start_matches('/');
        !path.is_empty() && self.dir.ends_with(path)
    }

    /// Whether a process still runs in it. Zombies do not count: the kernel takes a
    /// process out of its cgroup when it exits.
    pub fn populated(&self) -> bool {
        match fs::read_to_string(self.dir.join("cgroup.events")) {
            Ok(events) => events.lines().any(|line| line == "populated 1"),
            // Gone (removed) means empty; unreadable otherwise: say yes, so nobody
            // releases a lease on a guess.
            Err(err) => err.kind() != std::io::ErrorKind::NotFound,
        }
    }

    /// The processes in it now.
    pub fn members(&self) -> Vec<Pid> {
        fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse::<i32>().ok()).map(Pid::from_raw).collect())
            .unwrap_or_default()
    }

    /// SIGKILL everything in it. `cgroup.kill` (Linux 5.14) does it at once, even to
    /// processes that fork meanwhile or run as another user; on older kernels every member
    /// is killed one by one, a few rounds so that a forking process is caught too.
    /// Returns the first member that refused the signal (EPERM), if any.
    pub fn kill(&self) -> Result<(), Pid> {
        let written =
            fs::OpenOptions::new().write(true).open(self.dir.join("cgroup.kill")).and_then(|mut f| f.write_all(b"1"));
        if written.is_ok() {
            return Ok(());
        }
        let mut refused = None;
        for _ in 0..5 {
            let members = self.members();
            if members.is_empty() {
                break;
            }
            for pid in members {
                if kill(pid, Signal::SIGKILL) == Err(Errno::EPERM) {
                    refused = refused.or(Some(pid));
                }
            }
        }
        refused.map_or(Ok(()), Err)
    }

    /// Remove it; the kernel refuses (EBUSY) while a process runs in it.
    pub fn remove(&self) -> std::io::Result<()> {
        match fs::remove_dir(&self.dir) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// Move the calling process into the cgroup whose `cgroup.procs` is open on `procs`.
/// Runs between fork and exec: one write(2), no allocation. The result is not returned:
/// the parent checks where the child ended up (`Cgroup::holds`), since an error from
/// here could not be told apart from one of exec.
pub fn move_self_in(procs: RawFd) {
    // SAFETY: writes one byte from a static buffer; write is async-signal-safe.
    unsafe {
        libc::write(procs, b"0".as_ptr().cast(), 1);
    }
}

/// The directory of the calling process's own cgroup: the cgroup2 mount (from
/// /proc/self/mountinfo) joined with the `0::` line of /proc/self/cgroup.
fn own_dir(mountinfo: &str, proc_cgroup: &str) -> Option<PathBuf> {
    let own = proc_cgroup.lines().find_map(|line| line.strip_prefix("0::"))?;
    mountinfo.lines().find_map(|line| {
        // `id parent major:minor root mount-point options [optional...] - fstype source super-options`
        let (left, right) = line.split_once(" - ")?;
        if right.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mut fields = left.split_whitespace();
        let root = unescape(fields.nth(3)?);
        let mount_point = unescape(fields.next()?);
        // A mount of a subtree (a container's view without a cgroup namespace) shows the
        // cgroups below its root; leaderrun's own must be one of them.
        let below = Path::new(own).strip_prefix(&root).ok()?;
        let mut dir = PathBuf::from(mount_point);
        if !below.as_os_str().is_empty() {
            dir.push(below);
        }
        Some(dir)
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn finds_the_v2_hierarchy_on_hybrid_and_pure_hosts() {
        assert_eq!(own_dir(HYBRID, "4:memory:/x\n0::/\n"), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let pure = "25 21 0:22 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(
            own_dir(pure, "0::/user.slice/user-1000.slice/app.service\n"),
            Some(PathBuf::from("/sys/fs/cgroup/user.slice/user-1000.slice/app.service"))
        );
    }

    #[test]
    fn a_mount_of_a_subtree_resolves_paths_below_its_root() {
        let container = "90 80 0:30 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
        assert_eq!(own_dir(container, "0::/docker/abc/job\n"), Some(PathBuf::from("/sys/fs/cgroup/job")));
        assert_eq!(own_dir(container, "0::/elsewhere\n"), None, "outside the mounted subtree");
    }

    #[test]
    fn no_v2_hierarchy_or_no_v2_line_means_none() {
        let v1_only = "35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(own_dir(v1_only, "0::/\n"), None);
        assert_eq!(own_dir(HYBRID, "4:memory:/x\n"), None);
    }

    #[test]
    fn mount_points_with_escaped_spaces() {
        let spaced = "41 31 0:38 / /mnt/my\\040cgroups rw - cgroup2 cgroup2 rw\n";
        assert_eq!(own_dir(spaced, "0::/a\n"), Some(PathBuf::from("/mnt/my cgroups/a")));
        assert_eq!(unescape("a\\134b\\0"), "a\\b\\0");
    }
}
