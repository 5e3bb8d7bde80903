//! End-to-end tests of the child's cgroup: a process that leaves the child's process
//! group (`setsid`) is still stopped with the rest of the tree, when the run ends, when it
//! is stopped, and by the watchdog when the wrapper is SIGKILLed.
//!
//! Whether the host gives leaderrun a cgroup is checked the way leaderrun checks it
//! (`Cgroup::create`, as the user the wrapper runs as). Where it gives none, each test
//! asserts the documented fallback instead: the escaped process outlives the run.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::*;
use leaderrun::child::cgroup::Cgroup;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// A child that records its cgroup and pid, starts a process in a session of its own
/// (so outside the child's process group), and runs until `$D/go` appears.
const ESCAPING: &str = r#"
cat /proc/self/cgroup > "$D/cgroup"
echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"
setsid sh -c 'echo $$ > "$D/escapee.tmp"; mv "$D/escapee.tmp" "$D/escapee.pid"; exec sleep 1000' &
while [ ! -e "$D/go" ]; do sleep 0.05; done
"#;

/// Whether this host gives a wrapper run by this test's user a cgroup, found the way
/// leaderrun finds it.
fn cgroup_available() -> bool {
    match Cgroup::create() {
        Ok(probe) => {
            probe.remove().expect("remove the probe cgroup");
            true
        }
        Err(why) => {
            eprintln!("no writable cgroup v2 here ({why}): checking the process-group fallback");
            false
        }
    }
}

/// The process group of `pid`, from /proc/PID/stat (`pid (comm) state ppid pgrp ...`).
fn pgid(pid: i32) -> i32 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/PID/stat");
    let after = &stat[stat.rfind(')').expect("comm") + 1..];
    after.split_whitespace().nth(2).and_then(|f| f.parse().ok()).expect("the pgrp field")
}

/// The cgroup directory the child recorded (`0::/path` joined to the cgroup v2 mount).
fn child_cgroup_dir(sb: &Sandbox) -> Option<PathBuf> {
    let text = sb.read("cgroup");
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.to_string();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mount = mountinfo.lines().find(|l| l.contains(" - cgroup2 "))?.split_whitespace().nth(4)?.to_string();
    Some(PathBuf::from(mount).join(path.trim_start_matches('/')))
}

/// Start `leaderrun ... -- sh -c ESCAPING` as `cmd`; wait until the escapee runs and check
/// that it really left the child's process group. Returns (wrapper, child, escapee).
fn start_escaping(sb: &Sandbox, cmd: std::process::Command) -> (Wrapper, i32, i32) {
    let wrapper = sb.spawn("w", cmd);
    let child = sb.wait_pid("child.pid");
    let escapee = sb.wait_pid("escapee.pid");
    assert!(pid_alive(escapee), "the escapee must be running");
    assert_ne!(pgid(escapee), pgid(child), "the escapee must have left the child's process group");
    (wrapper, child, escapee)
}

/// After the run: with a cgroup the escapee is gone and so is the cgroup; without one it
/// outlived the run (the documented limit) and the test ends it itself.
fn assert_escapee_fate(sb: &Sandbox, available: bool, escapee: i32) {
    if available {
        let dir = child_cgroup_dir(sb).expect("the child's cgroup line");
        assert!(
            dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("leaderrun-")),
            "the child ran in a cgroup of its own from its first instruction: {:?}",
            sb.read("cgroup")
        );
        wait_for(|| !pid_alive(escapee), SOON, "the escapee to be killed with the child's cgroup");
        wait_for(|| !dir.exists(), SOON, "the child's cgroup to be removed");
    } else {
        assert!(pid_alive(escapee), "without a cgroup a process that leaves the group escapes (documented)");
        kill(Pid::from_raw(escapee), Signal::SIGKILL).expect("kill the escapee");
    }
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_setsid_escapee_is_stopped_when_the_child_exits() {
    let available = cgroup_available();
    let sb = Sandbox::new();
    let cmd = sb.cmd(&["--lock", "esc", "--kill-after", "1s", "--", "sh", "-c", ESCAPING]);
    let (mut w, child, escapee) = start_escaping(&sb, cmd);
    fs::write(sb.file("go"), "").expect("touch go");
    assert_eq!(w.wait_code(SOON), 0, "the child's own status; stderr {:?}", w.stderr());
    assert!(!pid_alive(child));
    assert_escapee_fate(&sb, available, escapee);
}

#[test]
fn a_setsid_escapee_is_stopped_when_the_run_is_stopped() {
    let available = cgroup_available();
    let sb = Sandbox::new();
    let cmd = sb.cmd(&["--lock", "esc", "--kill-after", "1s", "--", "sh", "-c", ESCAPING]);
    let (mut w, child, escapee) = start_escaping(&sb, cmd);
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_code(SOON), 128 + 15, "stderr {:?}", w.stderr());
    assert!(!pid_alive(child));
    assert_escapee_fate(&sb, available, escapee);
}

#[test]
fn a_setsid_escapee_is_killed_by_the_watchdog_when_the_wrapper_is_killed() {
    let available = cgroup_available();
    let sb = Sandbox::new();
    let cmd = sb.cmd(&["--lock", "esc", "--kill-after", "1s", "--", "sh", "-c", ESCAPING]);
    let (mut w, child, escapee) = start_escaping(&sb, cmd);
    w.signal(Signal::SIGKILL);
    w.wait_status(SOON);
    wait_for(|| !pid_alive(child), SOON, "the watchdog to stop the dead wrapper's child");
    if available {
        // The watchdog alone is left to do it; it also removes the cgroup once empty.
        assert_escapee_fate(&sb, available, escapee);
    } else {
        // The watchdog is done once the group is gone; the escapee runs on (documented).
        wait_for(|| sb.processes().iter().all(|(pid, _)| *pid == escapee), SOON, "the watchdog to finish");
        assert_escapee_fate(&sb, available, escapee);
    }
}

#[test]
fn without_a_writable_cgroup_the_process_group_alone_holds_the_child() {
    if !nix::unistd::geteuid().is_root() {
        // Unprivileged, the tests above already take whichever path this host offers.
        eprintln!("not root: the tests above already checked the path this host offers");
        return;
    }
    let sb = Sandbox::new();
    // The wrapper runs as nobody (65534), who may not write the cgroup hierarchy here.
    let dir = sb.file("nobody");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    nix::unistd::chown(&dir, Some(65534.into()), Some(65534.into())).expect("chown to nobody");
    let store = format!("sqlite://{}/locks.db", dir.display());
    let mut cmd = sb.bare_unprivileged();
    cmd.args(["--store", &store, "--lock", "esc", "-vv", "--kill-after", "1s", "--", "sh", "-c", ESCAPING]);
    cmd.env("D", &dir);
    let mut w = sb.spawn("w", cmd);
    let child = sb.wait_pid("nobody/child.pid");
    let escapee = sb.wait_pid("nobody/escapee.pid");
    assert_ne!(pgid(escapee), pgid(child), "the escapee must have left the child's process group");
    assert!(!sb.read("nobody/cgroup").contains("leaderrun-"), "no cgroup: {:?}", sb.read("nobody/cgroup"));
    assert!(w.stderr().contains("no cgroup for the child"), "said at debug level: {:?}", w.stderr());
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_code(SOON), 128 + 15, "stderr {:?}", w.stderr());
    assert!(!pid_alive(child), "the process group is still stopped");
    assert!(pid_alive(escapee), "without a cgroup a process that leaves the group escapes (documented)");
    kill(Pid::from_raw(escapee), Signal::SIGKILL).expect("kill the escapee");
    sb.wait_no_processes_left(SOON);
}

/// Whether this kernel has `clone3` with `CLONE_INTO_CGROUP` (Linux 5.7).
fn kernel_clones_into_cgroups() -> bool {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (5, 7)
}

#[test]
fn the_child_is_born_in_its_cgroup_rather_than_moved_there() {
    // A move (a write to cgroup.procs) waits for an RCU grace period, 8-20 ms per start;
    // a child created inside its cgroup pays none of it. The run's own trace says which.
    if !cgroup_available() || !kernel_clones_into_cgroups() {
        eprintln!("no writable cgroup v2 or a kernel before 5.7: the child moves itself in (checked above)");
        return;
    }
    let sb = Sandbox::new();
    let out = sb.output(sb.cmd(&["-vv", "--lock", "born", "--", "sh", "-c", "cat /proc/self/cgroup > \"$D/cgroup\""]));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr {stderr:?}");
    assert!(!stderr.contains("moves in itself"), "the kernel refused clone3 into the cgroup: {stderr:?}");
    let dir = child_cgroup_dir(&sb).expect("the child's cgroup line");
    assert!(dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with("leaderrun-")), "{dir:?}");
}
