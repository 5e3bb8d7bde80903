//! End-to-end test of a child that leaderrun may not signal: `leaderrun -- sudo job` run by
//! a normal user. The kernel refuses the signals (EPERM); leaderrun cannot stop the job,
//! and it must say so, once, and so must its watchdog.
//!
//! The test builds that situation without sudo: as root it makes a setuid-root copy of
//! `setpriv` in the sandbox, and runs the wrapper as nobody (65534) with a child that
//! execs `setpriv --reuid=0 ... sleep`: the child then runs as root, real and saved uid
//! included, as a command under sudo does, so nobody may not signal it. (A plain setuid
//! program keeps the caller's real uid, which is enough to be signalled.) As nobody the
//! wrapper has no writable cgroup here, so only the process group can reach the child.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Records its pid, then becomes root for good (real, effective and saved uid).
const BECOMES_ROOT: &str = r#"
echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"
exec "$SETPRIV_ROOT" --reuid=0 --regid=0 --clear-groups sleep 1000
"#;

/// The real uid of `pid`, from /proc/PID/status.
fn real_uid(pid: i32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_whitespace().next()?.parse().ok()
}

fn count(text: &str, needle: &str) -> usize {
    text.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn a_child_running_as_another_user_is_reported_once_by_the_wrapper_and_once_by_the_watchdog() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: cannot make the setuid-root program this test needs; nothing checked");
        return;
    }
    let sb = Sandbox::new();
    let setpriv = sb.file("setpriv-root");
    fs::copy("/usr/bin/setpriv", &setpriv).expect("copy setpriv (util-linux)");
    fs::set_permissions(&setpriv, fs::Permissions::from_mode(0o4755)).expect("make it setuid root");
    let dir = sb.file("nobody");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    nix::unistd::chown(&dir, Some(65534.into()), Some(65534.into())).expect("chown to nobody");

    let store = format!("sqlite://{}/locks.db", dir.display());
    let mut cmd = sb.bare_unprivileged();
    cmd.args(["--store", &store, "--lock", "sudo", "-vv", "--kill-after", "1s", "--", "sh", "-c", BECOMES_ROOT]);
    cmd.env("D", &dir).env("SETPRIV_ROOT", &setpriv);
    let mut w = sb.spawn("w", cmd);
    let child = sb.wait_pid("nobody/child.pid");
    wait_for(|| real_uid(child) == Some(0), SOON, "the child to run as root");

    // SIGTERM is relayed and refused; SIGKILL follows after --kill-after and is refused too.
    w.signal(Signal::SIGTERM);
    wait_for(|| w.stderr().contains("signal=SIGKILL"), SOON, "the wrapper to try SIGKILL as well");
    let err = w.stderr();
    assert_eq!(count(&err, "runs as another user"), 1, "one line, however many signals: {err}");
    let line = err.lines().find(|l| l.contains("runs as another user")).expect("counted above");
    assert!(line.starts_with("leaderrun: error: "), "{line}");
    assert!(line.contains(&format!("process group {child}")) && line.contains("sudo"), "{line}");
    assert!(pid_alive(child), "the kernel refused: the child still runs");

    // The wrapper dies; the watchdog tries too, says so once, and gives up after its grace.
    w.signal(Signal::SIGKILL);
    w.wait_status(SOON);
    let watchdog_gone = || !sb.processes().iter().any(|(_, cmd)| cmd.starts_with("leaderrun __watchdog"));
    wait_for(watchdog_gone, WITHIN_A_LEASE, "the watchdog to give up");
    let err = w.stderr();
    assert_eq!(count(&err, "leaderrun: watchdog: leaderrun died; cannot signal"), 1, "{err}");
    assert_eq!(count(&err, "runs as another user"), 2, "one line each: {err}");

    kill(Pid::from_raw(child), Signal::SIGKILL).expect("root ends the child");
    sb.wait_no_processes_left(SOON);
}
