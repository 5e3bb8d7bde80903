//! The last check before the child's program runs: once the lease's stop time has passed, the
//! child never runs, whichever way it is started (`clone3` into its cgroup, or std's spawn).
//! The watchdog is not needed for this (it is re-executed from leaderrun's own binary, so the
//! whole start is covered end to end by the fault run instead).

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::Path;

use super::*;
use crate::clock::boottime;

/// A supervisor whose child creates `marker`: the file says whether the program ran.
fn touching(marker: &Path) -> Supervisor {
    let script = format!("touch '{}'", marker.display());
    let command = CommandSpec::resolve("sh".into(), vec!["-c".into(), script.into()]).expect("sh is on PATH");
    Supervisor::new(command, Signal::SIGTERM, Duration::from_secs(1))
}

fn lease() -> Lease {
    Lease { lock: "l".into(), identity: "i".into(), token: 1 }
}

fn in_a_minute() -> Duration {
    boottime() + Duration::from_secs(60)
}

#[tokio::test]
async fn std_spawn_runs_nothing_once_the_stop_time_has_passed() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let supervisor = touching(&marker);
    match supervisor.std_spawn(&lease(), None, None, false, boottime()).await {
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{err}"),
        Ok(_) => panic!("a child past its stop time was started"),
    }
    assert!(!marker.exists(), "the program ran after the stop time");

    // The same start in time runs it: the check above is what kept it out.
    let child = supervisor.std_spawn(&lease(), None, None, false, in_a_minute()).await.expect("spawn in time");
    assert!(child.wait().await.expect("wait").success());
    assert!(marker.exists(), "the program ran");
}

#[tokio::test]
async fn clone_into_a_cgroup_runs_nothing_once_the_stop_time_has_passed() {
    let cgroup = match Cgroup::create() {
        Ok(cgroup) => cgroup,
        Err(why) => {
            // leaderrun never starts a child this way on such a host (std's spawn, tested above).
            eprintln!("this host gives no cgroup ({why}): the clone3 way is not used here");
            return;
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let supervisor = touching(&marker);
    match supervisor.clone_into(&cgroup, &lease(), None, false, boottime()) {
        Err(Some(err)) => assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{err}"),
        Err(None) => {
            eprintln!("this host refuses clone3 into a cgroup: leaderrun falls back to std's spawn");
            cgroup.remove().unwrap();
            return;
        }
        Ok(_) => panic!("a child past its stop time was started"),
    }
    assert!(!marker.exists(), "the program ran after the stop time");

    let child = supervisor.clone_into(&cgroup, &lease(), None, false, in_a_minute()).expect("spawn in time");
    assert!(child.wait().await.expect("wait").success());
    assert!(marker.exists(), "the program ran");
    cgroup.remove().unwrap();
}

/// A pipe whose write end blocks: full, its reader never reading. A new process announcing
/// itself on it stops there, before its exec, until it is killed.
fn full_pipe() -> (OwnedFd, OwnedFd) {
    use nix::fcntl::{fcntl, FcntlArg, OFlag};
    let (read, write) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).unwrap();
    while nix::unistd::write(&write, &[0u8; 4096]).is_ok() {}
    fcntl(&write, FcntlArg::F_SETFL(OFlag::empty())).unwrap();
    (read, write)
}

/// SIGKILL, once it shows up (within a minute), this process's child that holds `fd` (the
/// same pipe as ours) and is blocked writing to it (/proc/PID/syscall). Every child forked
/// meanwhile by the other tests here holds `fd` too until its exec; only ours blocks on it.
fn kill_the_child_holding(fd: RawFd) -> std::thread::JoinHandle<()> {
    let ours = std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap();
    std::thread::spawn(move || {
        for _ in 0..6000 {
            let tasks = std::fs::read_dir("/proc/self/task").unwrap();
            let children = tasks.flatten().flat_map(|task| {
                let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
                list.split_whitespace().filter_map(|pid| pid.parse::<i32>().ok()).collect::<Vec<_>>()
            });
            for pid in children.collect::<Vec<_>>() {
                let blocked = std::fs::read_to_string(format!("/proc/{pid}/syscall"))
                    .is_ok_and(|call| call.starts_with(&format!("{} {:#x} ", libc::SYS_write, fd)));
                if blocked && std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).is_ok_and(|theirs| theirs == ours) {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

/// A child killed before its exec (as the watchdog kills one that announces itself past the
/// deadline) never ran its program, and is not reported as started: the pipe closing alone
/// would look like an exec.
#[tokio::test]
async fn a_child_killed_before_its_exec_is_not_reported_started() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let supervisor = touching(&marker);
    let (_read, write) = full_pipe();
    let killer = kill_the_child_holding(write.as_raw_fd());
    let announce = Some(write.as_raw_fd());
    match supervisor.std_spawn(&lease(), None, announce, false, in_a_minute()).await {
        Err(err) => assert!(spawn::killed_before_exec(&err), "{err}"),
        Ok(_) => panic!("a child killed before its exec was reported started"),
    }
    killer.join().unwrap();
    if let Ok(cgroup) = Cgroup::create() {
        let killer = kill_the_child_holding(write.as_raw_fd());
        match supervisor.clone_into(&cgroup, &lease(), announce, false, in_a_minute()) {
            Err(Some(err)) => assert!(spawn::killed_before_exec(&err), "{err}"),
            Err(None) => drop(killer),
            Ok(_) => panic!("a child killed before its exec (clone3) was reported started"),
        }
        cgroup.remove().unwrap();
    }
    assert!(!marker.exists(), "the program ran");
}
