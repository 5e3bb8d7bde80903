//! A run that wins the lock and then stalls, before its child starts, for longer than the
//! lease (a SIGSTOP, a saturated CPU) must not start the child once the next holder may run:
//! the new process checks the lease's stop time itself, just before the child's program runs.
//!
//! The stall is made exact with strace, which delays system calls of the traced run: each
//! mkdir by 3 s (the child's cgroup is made between the grant and the child's clone, and the
//! lease is 2 s), and each kill by 2 s (the run's own first signal to the new child, which
//! would otherwise stop it before it did anything). The run's watchdog, which would also stop
//! it, is frozen meanwhile, as on a starved host. Before the check existed the stalled run's
//! child started beside the next holder's, with the older fencing token.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const LONG: Duration = Duration::from_secs(90);
const LEASE: [&str; 6] = ["--ttl", "2s", "--renew-every", "500ms", "--kill-after", "500ms"];

/// `cmd` run under strace, with the stalls above (strace's own output goes to a file).
fn stalled(sb: &Sandbox, cmd: Command) -> Command {
    let mut traced = Command::new("strace");
    traced.args(["-f", "-o"]).arg(sb.file("strace.log"));
    traced.args(["-e", "trace=mkdir,mkdirat,kill"]);
    traced.args(["-e", "inject=mkdir,mkdirat:delay_enter=3s", "-e", "inject=kill:delay_enter=2s"]);
    traced.arg(cmd.get_program()).args(cmd.get_args());
    copy_env(&cmd, &mut traced);
    traced.stdin(std::process::Stdio::null());
    traced
}

/// The processes `pid` started, from /proc.
fn children(pid: i32) -> Vec<i32> {
    let path = format!("/proc/{pid}/task/{pid}/children");
    std::fs::read_to_string(path).unwrap_or_default().split_whitespace().filter_map(|p| p.parse().ok()).collect()
}

#[test]
fn a_run_stalled_past_its_lease_before_its_child_starts_never_starts_it() {
    assert!(
        Command::new("strace").arg("-V").output().is_ok_and(|out| out.status.success()),
        "this test needs strace (apt-get install strace; .ci/run installs it)"
    );
    let sb = Sandbox::new();
    let mut args = vec!["--lock", "late", "-v"];
    args.extend(LEASE);
    args.extend(["--", "sh", "-c", r#"echo "stalled $LEADERRUN_FENCING_TOKEN" >> "$D/ran""#]);
    let mut stalled_run = sb.spawn("stalled", stalled(&sb, sb.cmd(&args)));

    // The run (strace's child) forks its watchdog as it starts, before any campaign.
    let mut run = None;
    let mut watchdog = None;
    wait_for(
        || {
            run = run.or_else(|| children(stalled_run.pid()).first().copied());
            watchdog = run.and_then(|run| children(run).first().copied());
            watchdog.is_some()
        },
        LONG,
        "the traced run and its watchdog",
    );
    // Frozen for sure before the run goes on: a SIGSTOP that strace's handling of a new tracee
    // swallowed is sent again (stopped shows as T, or t under strace).
    let watchdog = Pid::from_raw(watchdog.unwrap());
    wait_for(
        || {
            let frozen = matches!(proc_state(watchdog.as_raw()), Some('T' | 't'));
            if !frozen {
                kill(watchdog, Signal::SIGSTOP).expect("freeze the watchdog");
            }
            frozen
        },
        LONG,
        "the watchdog to stop",
    );

    // Once it holds the lock, a standby waits for it; the stalled run never renews, so the
    // standby takes the lock when its lease lapses, and runs.
    wait_for(|| sb.status("late") == 0, LONG, "the traced run to win the lock");
    let mut args = vec!["--lock", "late", "--wait"];
    args.extend(LEASE);
    args.extend(["--", "sh", "-c", r#"echo "standby $LEADERRUN_FENCING_TOKEN" >> "$D/ran"; sleep 3"#]);
    let out = sb.output(sb.cmd(&args));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));

    let _ = kill(watchdog, Signal::SIGCONT);
    let code = stalled_run.wait_code(LONG);
    // What the traced run did, to tell a failure here from a flaw of the test's own.
    let err = format!("{}\n--- strace:\n{}", stalled_run.stderr(), sb.lines("strace.log").join("\n"));
    assert_eq!(sb.lines("ran"), ["standby 2"], "only the standby's child ran, under the newer token: {err}");
    assert!(err.contains("the lease ran out before the child could start"), "{err}");
    // Given back, it found the standby holding the lock (1), or ran out of its retries (69).
    assert!([1, 69].contains(&code), "exit {code}: {err}");
}
