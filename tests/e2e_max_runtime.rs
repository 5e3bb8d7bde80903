//! `--max-runtime`: the child is stopped once it has run that long and leaderrun exits 124,
//! as timeout(1) does; the watchdog keeps the limit when leaderrun is frozen; bad values are
//! bad usage. Waits are on events with generous bounds; nothing asserts how fast.

mod common;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn a_child_that_runs_too_long_is_stopped_and_the_run_exits_124() {
    let sb = Sandbox::new();
    let out = sb.output(sb.cmd(&["--lock", "mr", "--wait", "--max-runtime", "1s", "--", "sleep", "1000"]));
    assert_eq!(out.status.code(), Some(124), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("--max-runtime"), "{err:?}");
    assert_eq!(sb.status("mr"), 1, "--wait: released at once");
    // A child done in time is untouched, its status passed through.
    let out = sb.output(sb.cmd(&["--lock", "mr", "--max-runtime", "1m", "--", "sh", "-c", "exit 3"]));
    assert_eq!(out.status.code(), Some(3));
}

#[test]
fn the_watchdog_keeps_the_limit_when_leaderrun_is_frozen() {
    let sb = Sandbox::new();
    // The lease lasts 5 minutes: only --max-runtime can stop the child within the wait below.
    let script = r#"echo $$ > "$D/c.tmp"; mv "$D/c.tmp" "$D/child.pid"; sleep 1000"#;
    let cmd = sb.cmd(&["--lock", "frozen-mr", "--ttl", "300s", "--max-runtime", "3s", "--", "sh", "-c", script]);
    let mut wrapper = sb.spawn("wrapper", cmd);
    let child = sb.wait_pid("child.pid");
    wrapper.signal(Signal::SIGSTOP);
    wait_for(|| !pid_alive(child), LONG, "the watchdog to stop the child of a frozen leaderrun");
    wrapper.signal(Signal::SIGCONT);
    assert_eq!(wrapper.wait_code(LONG), 124, "{}", wrapper.stderr());
    assert!(wrapper.stderr().contains("watchdog: the child ran for --max-runtime"), "{}", wrapper.stderr());
}

#[test]
fn a_bad_max_runtime_is_bad_usage_before_the_store_is_touched() {
    let sb = Sandbox::new();
    for bad in ["0s", "ten", "10"] {
        let out = sb.output(sb.cmd(&["--lock", "bad-mr", "--max-runtime", bad, "--", "true"]));
        assert_eq!(out.status.code(), Some(2), "--max-runtime {bad}: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("--max-runtime"), "{}", stderr_of(&out));
    }
    assert!(!sb.store_path().exists(), "nothing written");
}
