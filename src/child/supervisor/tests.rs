//! The last check before the child's program runs: once the lease's stop time has passed, the
//! child never runs, whichever way it is started (`clone3` into its cgroup, or std's spawn).
//! The watchdog is not needed for this (it is re-executed from leaderrun's own binary, so the
//! whole start is covered end to end by the fault run instead).

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
    match supervisor.std_spawn(&lease(), None, None, false, boottime()) {
        Err(err) => assert_eq!(err.raw_os_error(), Some(libc::ETIMEDOUT), "{err}"),
        Ok(_) => panic!("a child past its stop time was started"),
    }
    assert!(!marker.exists(), "the program ran after the stop time");

    // The same start in time runs it: the check above is what kept it out.
    let child = supervisor.std_spawn(&lease(), None, None, false, in_a_minute()).expect("spawn in time");
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
