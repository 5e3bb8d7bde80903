//! End-to-end tests of how `leaderrun` stops its child: signals sent to the wrapper,
//! the watchdog when the wrapper is SIGKILLed or SIGSTOPped, and `leaderrun release`.
//!
//! Each child is a `sh -c` script that starts a grandchild (`sleep 1000 &`) and records
//! both pids, so the tests can check that the whole process tree is gone. Waits are on
//! events with generous bounds; nothing asserts that something was fast.

mod common;

use common::*;
use nix::sys::signal::Signal;

/// A child with a grandchild. It holds a file lock (`$D/flock`) for the life of its
/// whole tree (the grandchild inherits the descriptor), so a child that starts while an
/// earlier tree still runs records OVERLAP. It records its start with its token, and
/// the pids of both processes in `$D/$WORKER_NAME.pid` and `$D/$WORKER_NAME.gc.pid`.
/// PRELUDE is replaced by the variant's own lines (e.g. a trap).
const WORKER: &str = r#"
PRELUDE
exec 9>>"$D/flock"
flock -n 9 || echo "OVERLAP $WORKER_NAME $LEADERRUN_FENCING_TOKEN" >> "$D/events"
echo "start $WORKER_NAME $LEADERRUN_FENCING_TOKEN" >> "$D/events"
GRANDCHILD &
echo $! > "$D/$WORKER_NAME.gc.tmp"; mv "$D/$WORKER_NAME.gc.tmp" "$D/$WORKER_NAME.gc.pid"
echo $$ > "$D/$WORKER_NAME.tmp"; mv "$D/$WORKER_NAME.tmp" "$D/$WORKER_NAME.pid"
wait
"#;

fn worker(prelude: &str, grandchild: &str) -> String {
    WORKER.replace("PRELUDE", prelude).replace("GRANDCHILD", grandchild)
}

/// Start `leaderrun ARGS -- sh -c WORKER` as `name`; wait until child and grandchild run.
fn start_worker(sb: &Sandbox, name: &str, args: &[&str], script: &str) -> (Wrapper, i32, i32) {
    let mut all: Vec<&str> = args.to_vec();
    all.extend_from_slice(&["--", "sh", "-c", script]);
    let mut cmd = sb.cmd(&all);
    cmd.env("WORKER_NAME", name);
    let wrapper = sb.spawn(name, cmd);
    let child = sb.wait_pid(&format!("{name}.pid"));
    let grandchild = sb.wait_pid(&format!("{name}.gc.pid"));
    assert!(pid_alive(child) && pid_alive(grandchild), "{name}: child and grandchild must be running");
    (wrapper, child, grandchild)
}

/// After the wrapper exited: its tree is gone, the lock is free at once and a new
/// one-shot run gets it and runs its child.
fn assert_tree_gone_and_lock_free(sb: &Sandbox, lock: &str, child: i32, grandchild: i32) {
    assert!(!pid_alive(child), "the child {child} outlived the wrapper ({})", cmdline(child));
    assert!(!pid_alive(grandchild), "the grandchild {grandchild} outlived the wrapper ({})", cmdline(grandchild));
    assert_eq!(sb.status(lock), 1, "the lock must be free as soon as the wrapper has exited");
    let out = sb.output(sb.cmd(&["--lock", lock, "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("next"), "2\n", "the next run gets the lock, with the next token");
    sb.wait_no_processes_left(SOON);
}

/// Send `signal` to a wrapper whose child runs `prelude` + WORKER; check the exit status
/// and that nothing is left.
fn signal_stops_the_tree(signal: Signal, prelude: &str, grandchild: &str, expected: i32) {
    let sb = Sandbox::new();
    let script = worker(prelude, grandchild);
    let (mut w, child, gc) = start_worker(&sb, "w", &["--lock", "sig", "--kill-after", "1s"], &script);
    w.signal(signal);
    let code = w.wait_code(SOON);
    assert_eq!(code, expected, "exit status after {signal}; stderr {:?}", w.stderr());
    assert_tree_gone_and_lock_free(&sb, "sig", child, gc);
}

#[test]
fn sigterm_stops_the_child_tree_and_frees_the_lock() {
    // sh dies of the relayed SIGTERM: 128 + 15.
    signal_stops_the_tree(Signal::SIGTERM, "", "sleep 1000", 128 + 15);
}

#[test]
fn sigint_stops_the_child_tree_and_frees_the_lock() {
    // sh dies of the relayed SIGINT (130); its background `sleep` ignores SIGINT, as
    // background jobs of a non-interactive shell do, and must be stopped all the same.
    signal_stops_the_tree(Signal::SIGINT, "", "sleep 1000", 128 + 2);
}

#[test]
fn sigterm_exit_status_of_a_trapping_child_is_passed_through() {
    signal_stops_the_tree(Signal::SIGTERM, "trap 'exit 42' TERM INT", "sleep 1000", 42);
}

#[test]
fn sigint_exit_status_of_a_trapping_child_is_passed_through() {
    signal_stops_the_tree(Signal::SIGINT, "trap 'exit 42' TERM INT", "sleep 1000", 42);
}

#[test]
fn a_grandchild_that_ignores_the_stop_signal_is_killed_after_the_grace() {
    // The grandchild ignores TERM and INT: only the escalation to SIGKILL stops it.
    signal_stops_the_tree(Signal::SIGTERM, "", "(trap '' TERM INT; exec sleep 1000)", 128 + 15);
}

#[test]
fn other_signals_are_relayed_without_ending_the_run() {
    let sb = Sandbox::new();
    let script = r#"
trap 'echo USR1 >> "$D/got"' USR1
trap 'echo HUP >> "$D/got"' HUP
echo $$ > "$D/w.tmp"; mv "$D/w.tmp" "$D/w.pid"
while :; do sleep 1000 & wait $!; done
"#;
    let mut w = sb.spawn("w", sb.cmd(&["--lock", "relay", "--", "sh", "-c", script]));
    let child = sb.wait_pid("w.pid");
    w.signal(Signal::SIGUSR1);
    wait_for(|| sb.lines("got") == ["USR1"], SOON, "the child to get SIGUSR1");
    w.signal(Signal::SIGHUP);
    wait_for(|| sb.lines("got") == ["USR1", "HUP"], SOON, "the child to get SIGHUP");
    assert!(w.try_status().is_none(), "SIGUSR1 and SIGHUP must not end the run");
    assert!(pid_alive(child));
    assert_eq!(sb.status("relay"), 0);
    w.signal(Signal::SIGTERM);
    assert_eq!(w.wait_code(SOON), 128 + 15, "stderr {:?}", w.stderr());
    assert!(!pid_alive(child));
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_signal_while_waiting_for_the_lock_ends_the_wait() {
    let sb = Sandbox::new();
    let (mut holder, child, gc) = start_worker(&sb, "holder", &["--lock", "busy"], &worker("", "sleep 1000"));
    // -vv says when it is waiting, so the signal is known to arrive during the wait.
    let mut waiter =
        sb.spawn("waiter", sb.cmd(&["--lock", "busy", "--wait", "-vv", "--", "sh", "-c", r#"touch "$D/ran""#]));
    wait_for(|| waiter.stderr().contains("waiting"), SOON, "the waiter to campaign");
    waiter.signal(Signal::SIGTERM);
    assert_eq!(waiter.wait_code(SOON), 128 + 15, "a signal while waiting gives 128 + n; stderr {:?}", waiter.stderr());
    assert!(!sb.exists("ran"), "the waiter's child must not run");
    assert!(pid_alive(child) && pid_alive(gc), "the holder must be untouched");
    let (code, status) = sb.status_json("busy");
    assert_eq!((code, status["fencing_token"].as_u64()), (0, Some(1)), "{status}");
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15);
}

const SHORT_LEASE: [&str; 6] = ["--ttl", "2s", "--renew-every", "500ms", "--kill-after", "500ms"];

/// The live watchdogs this sandbox started (`ps` shows them as `leaderrun __watchdog`,
/// forked or re-executed alike).
fn watchdogs(sb: &Sandbox) -> Vec<i32> {
    sb.processes().into_iter().filter(|(_, cmd)| cmd.starts_with("leaderrun __watchdog")).map(|(pid, _)| pid).collect()
}

/// The live watchdogs of one wrapper (a run forks its watchdog at start-up, so a standby
/// has one too, idle until it is elected).
fn watchdogs_of(sb: &Sandbox, wrapper: &Wrapper) -> Vec<i32> {
    watchdogs(sb).into_iter().filter(|&pid| parent_of(pid) == Some(wrapper.pid())).collect()
}

fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().nth(1)?.parse().ok()
}

/// A `--wait` holder `a` with a standby `b`; `meanwhile` runs while `a` holds the lease,
/// then `a` is SIGKILLed: its child tree must still die (only a watchdog is left to kill
/// it) and the standby takes over, one tree at a time.
fn kill_9_of_the_holder_kills_the_tree_and_a_standby_takes_over(meanwhile: impl FnOnce(&Sandbox, &Wrapper)) {
    let sb = Sandbox::new();
    let args = [&["--lock", "worker", "--wait"][..], &SHORT_LEASE].concat();
    let (mut a, a_child, a_gc) = start_worker(&sb, "a", &args, &worker("", "sleep 1000"));

    // A standby, campaigning (-vv says so) while `a` holds the lease.
    let script = worker("", "sleep 1000");
    let mut b_args = args.clone();
    b_args.push("-vv");
    b_args.extend_from_slice(&["--", "sh", "-c", &script]);
    let mut cmd = sb.cmd(&b_args);
    cmd.env("WORKER_NAME", "b");
    let mut b = sb.spawn("b", cmd);
    wait_for(|| b.stderr().contains("waiting"), SOON, "the standby to campaign");

    meanwhile(&sb, &a);

    a.signal(Signal::SIGKILL);
    let status = a.wait_status(SOON);
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(9));
    // Nobody is left to stop the child but the watchdog.
    wait_for(|| !pid_alive(a_child) && !pid_alive(a_gc), SOON, "the watchdog to kill the dead wrapper's child tree");

    // The standby takes over about one ttl later.
    wait_for(|| sb.exists("b.gc.pid"), WITHIN_A_LEASE, "the standby's child to start");
    let events = sb.lines("events");
    assert_eq!(events, ["start a 1", "start b 2"], "one tree at a time, tokens increasing");
    assert!(b.try_status().is_none(), "the standby must be running its child; stderr {:?}", b.stderr());

    b.signal(Signal::SIGTERM);
    assert_eq!(b.wait_code(SOON), 128 + 15, "stderr {:?}", b.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn kill_9_of_the_wrapper_kills_the_tree_and_a_standby_takes_over() {
    kill_9_of_the_holder_kills_the_tree_and_a_standby_takes_over(|_, _| {});
}

#[test]
fn a_run_that_starts_no_child_leaves_no_watchdog_behind() {
    let sb = Sandbox::new();
    let (mut holder, child, gc) = start_worker(&sb, "a", &["--lock", "busy"], &worker("", "sleep 1000"));
    let guarding = watchdogs_of(&sb, &holder);
    assert_eq!(guarding.len(), 1, "the holder's watchdog: {:?}", sb.processes());
    // A one-shot that finds the lock held exits 0 without a child; by the time it has
    // exited, the watchdog it forked at start-up is gone too (reaped, not just orphaned).
    let mut other = sb.spawn("b", sb.cmd(&["--lock", "busy", "--", "sh", "-c", "touch \"$D/ran\""]));
    assert_eq!(other.wait_code(SOON), 0, "a conflict exits 0; stderr {:?}", other.stderr());
    assert_eq!(watchdogs(&sb), guarding, "only the holder's watchdog: {:?}", sb.processes());
    assert!(!sb.exists("ran"));
    assert_eq!(other.stderr(), "", "quiet");

    // A standby that ends without a child (a signal while it waits) ends its watchdog
    // itself, before it exits: even a stopped one, which could not see the pipe close.
    let mut standby = sb.spawn("c", sb.cmd(&["--lock", "busy", "--wait", "-vv", "--", "true"]));
    wait_for(|| standby.stderr().contains("waiting"), SOON, "the standby to campaign");
    let idle = watchdogs_of(&sb, &standby);
    assert_eq!(idle.len(), 1, "the standby's idle watchdog: {:?}", sb.processes());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(idle[0]), Signal::SIGSTOP).expect("stop the watchdog");
    standby.signal(Signal::SIGTERM);
    assert_eq!(standby.wait_code(SOON), 128 + 15, "stderr {:?}", standby.stderr());
    assert!(!pid_alive(idle[0]), "the wrapper ended and reaped its unused watchdog: {:?}", sb.processes());
    assert!(!standby.stderr().contains("watchdog"), "{:?}", standby.stderr());

    // A standby killed while it waits: its idle watchdog sees the pipe close, has nothing
    // to guard, and exits without a word or a signal.
    let mut standby = sb.spawn("d", sb.cmd(&["--lock", "busy", "--wait", "-vv", "--", "true"]));
    wait_for(|| standby.stderr().contains("waiting"), SOON, "the standby to campaign");
    let idle = watchdogs_of(&sb, &standby);
    assert_eq!(idle.len(), 1, "the standby's idle watchdog: {:?}", sb.processes());
    standby.signal(Signal::SIGKILL);
    standby.wait_status(SOON);
    wait_for(|| !pid_alive(idle[0]), SOON, "the idle watchdog to exit");
    assert!(!standby.stderr().contains("watchdog"), "{:?}", standby.stderr());
    assert!(pid_alive(child) && pid_alive(gc), "the holder's tree is untouched");
    assert_eq!(watchdogs(&sb), guarding);

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_standby_whose_idle_watchdog_was_killed_starts_a_new_one_when_elected() {
    let sb = Sandbox::new();
    let (mut a, _, _) = start_worker(&sb, "a", &["--lock", "turns", "--wait"], &worker("", "sleep 1000"));
    let mut cmd = sb.cmd(&["--lock", "turns", "--wait", "-vv", "--", "sh", "-c", &worker("", "sleep 1000")]);
    cmd.env("WORKER_NAME", "b");
    let mut b = sb.spawn("b", cmd);
    wait_for(|| b.stderr().contains("waiting"), SOON, "the standby to campaign");
    let idle = watchdogs_of(&sb, &b);
    assert_eq!(idle.len(), 1, "the standby's idle watchdog: {:?}", sb.processes());
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(idle[0]), Signal::SIGKILL).expect("kill the idle watchdog");

    a.signal(Signal::SIGTERM);
    assert_eq!(a.wait_code(SOON), 128 + 15, "stderr {:?}", a.stderr());
    let child = sb.wait_pid("b.pid");
    let guarding = watchdogs_of(&sb, &b);
    assert!(matches!(guarding[..], [new] if new != idle[0]), "a new watchdog: {:?}", sb.processes());
    assert!(!b.stderr().contains("cannot reach the watchdog"), "{:?}", b.stderr());
    assert!(!b.stderr().contains("died"), "no replacement of a dead watchdog: {:?}", b.stderr());
    assert!(pid_alive(child));
    b.signal(Signal::SIGTERM);
    assert_eq!(b.wait_code(SOON), 128 + 15, "stderr {:?}", b.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_watchdog_killed_before_the_wrapper_is_replaced_and_the_tree_still_dies() {
    // As after an OOM kill of the watchdog: the wrapper must notice and start a new one,
    // or its own later crash would leave the child running past the lease.
    kill_9_of_the_holder_kills_the_tree_and_a_standby_takes_over(|sb, a| {
        let first = watchdogs_of(sb, a);
        assert_eq!(first.len(), 1, "one watchdog: {:?}", sb.processes());
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(first[0]), Signal::SIGKILL).expect("kill the watchdog");
        wait_for(
            || matches!(watchdogs_of(sb, a)[..], [new] if new != first[0]),
            SOON,
            "the wrapper to start a new watchdog",
        );
        wait_for(|| a.stderr().contains("started a new one"), SOON, "the warning about the replacement");
        assert_eq!(a.stderr().matches("the watchdog").count(), 1, "one warning: {:?}", a.stderr());
    });
}

#[test]
fn sigstop_of_the_wrapper_lets_the_watchdog_kill_the_tree_then_the_lease_is_lost() {
    let sb = Sandbox::new();
    let args = [&["--lock", "frozen"][..], &SHORT_LEASE].concat();
    let (mut w, child, gc) = start_worker(&sb, "w", &args, &worker("", "sleep 1000"));

    w.signal(Signal::SIGSTOP);
    wait_for(|| pid_stopped(w.pid()), SOON, "the wrapper to stop");
    // The frozen wrapper cannot renew: the watchdog must stop the tree by the deadline.
    wait_for(
        || !pid_alive(child) && !pid_alive(gc),
        WITHIN_A_LEASE,
        "the watchdog to kill the frozen wrapper's child tree",
    );
    assert!(pid_stopped(w.pid()), "the wrapper must still be stopped: only the watchdog acted");

    w.signal(Signal::SIGCONT);
    let code = w.wait_code(SOON);
    assert_eq!(code, 75, "lease lost while the child ran; stderr {:?}", w.stderr());
    assert!(w.stderr().contains("lease"), "the message says why: {:?}", w.stderr());

    // The lease expired, nobody took it; the next run gets the next token.
    assert_eq!(sb.status("frozen"), 1);
    let out =
        sb.output(sb.cmd(&["--lock", "frozen", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("next"), "2\n");
    assert!(!sb.lines("events").iter().any(|l| l.starts_with("OVERLAP")));
    sb.wait_no_processes_left(SOON);
}

#[test]
fn release_makes_the_holder_stop_its_child_with_lease_lost() {
    let sb = Sandbox::new();
    let args = ["--lock", "rel", "--ttl", "3s", "--renew-every", "500ms", "--kill-after", "1s"];
    let (mut h, child, gc) = start_worker(&sb, "h", &args, &worker("", "sleep 1000"));

    let out = sb.output(sb.sub("release", &["--lock", "rel"]));
    assert_eq!(out.status.code(), Some(0), "release of a held lock; stderr {:?}", stderr_of(&out));
    assert_eq!(h.wait_code(SOON), 75, "the holder loses its lease; stderr {:?}", h.stderr());
    assert!(!pid_alive(child) && !pid_alive(gc), "the holder's child tree must be stopped");

    // Now free: release says it was not held.
    let out = sb.output(sb.sub("release", &["--lock", "rel"]));
    assert_eq!(out.status.code(), Some(1), "release of a free lock; stderr {:?}", stderr_of(&out));
    let out = sb.output(sb.sub("release", &["--json", "--lock", "rel"]));
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    assert_eq!(json["lock"], "rel", "{json}");

    // The fencing token was kept: the next holder gets a larger one.
    let out = sb.output(sb.cmd(&["--lock", "rel", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("next"), "2\n");
    sb.wait_no_processes_left(SOON);
}

#[test]
fn release_of_a_lock_in_a_store_that_does_not_exist() {
    let sb = Sandbox::new();
    let out = sb.output(sb.sub("release", &["--lock", "nothing"]));
    assert_eq!(out.status.code(), Some(1), "stderr {:?}", stderr_of(&out));
    assert!(!sb.store_path().exists(), "release must not create the store");
}

#[test]
fn stray_signals_to_the_watchdog_do_not_disarm_it() {
    let sb = Sandbox::new();
    let args = [&["--lock", "stray"][..], &SHORT_LEASE].concat();
    let (mut w, child, gc) = start_worker(&sb, "w", &args, &worker("", "sleep 1000"));
    let dog = match watchdogs(&sb)[..] {
        [dog] => dog,
        _ => panic!("one watchdog: {:?}", sb.processes()),
    };
    // What a terminal hangup, a `kill` of the session or a `pkill leaderrun` sends it.
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2] {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(dog), signal).expect("signal the watchdog");
    }
    wait_for(|| w.stderr().contains("leaderrun: watchdog: ignoring SIG"), SOON, "the watchdog to say it ignored them");
    assert_eq!(w.stderr().matches("watchdog: ignoring").count(), 1, "said once: {:?}", w.stderr());
    assert_eq!(watchdogs(&sb), [dog], "the same watchdog, alive, not a replacement");

    // Still armed: with the wrapper frozen, it kills the tree by the deadline.
    w.signal(Signal::SIGSTOP);
    wait_for(|| !pid_alive(child) && !pid_alive(gc), WITHIN_A_LEASE, "the watchdog to kill the frozen wrapper's tree");
    w.signal(Signal::SIGCONT);
    assert_eq!(w.wait_code(SOON), 75, "lease lost while the child ran; stderr {:?}", w.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_watchdog_that_keeps_dying_stops_the_child_rather_than_leave_it_unguarded() {
    // leaderrun replaces a dead watchdog a few times (3), then stops the child: the path
    // also taken when no new watchdog can be started at all.
    let sb = Sandbox::new();
    let args = [&["--lock", "dying"][..], &SHORT_LEASE].concat();
    let (mut w, child, gc) = start_worker(&sb, "w", &args, &worker("", "sleep 1000"));
    let mut killed = Vec::new();
    while w.try_status().is_none() && pid_alive(child) {
        // The current watchdog (a new one may not be up yet: wait for it, or for the stop).
        let mut dog = None;
        wait_for(
            || {
                dog = watchdogs(&sb).into_iter().find(|pid| !killed.contains(pid));
                dog.is_some() || !pid_alive(child)
            },
            SOON,
            "a watchdog to kill, or the child to be stopped",
        );
        let Some(dog) = dog else { break };
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(dog), Signal::SIGKILL).expect("kill the watchdog");
        killed.push(dog);
        assert!(killed.len() <= 4, "leaderrun must give up replacing: {:?}", w.stderr());
    }
    assert_eq!(w.wait_code(SOON), 128 + 15, "the child was stopped with --signal; stderr {:?}", w.stderr());
    assert_eq!(killed.len(), 4, "three replacements, then the stop: {:?}", w.stderr());
    assert!(w.stderr().contains("must not run without a watchdog"), "{:?}", w.stderr());
    assert!(!pid_alive(child) && !pid_alive(gc));
    sb.wait_no_processes_left(SOON);
}
