//! What several end-to-end tests check the same way: children taking turns, quiet cron runs,
//! quick handoffs, a lock's status.

use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

use super::{code_of, pid_alive, stderr_of, stdout_of, wait_for, Sandbox, Wrapper, SOON, WITHIN_A_LEASE};

/// A `--wait` child that takes a file lock for its whole life (so any overlap of two
/// children's process trees is caught exactly, whatever the clocks say) and records
/// start and stop with its token and CLOCK_BOOTTIME (/proc/uptime) in one file.
pub const TURN_TAKER: &str = r#"
exec 9>>"$D/flock"
flock -n 9 || echo "OVERLAP $LEADERRUN_FENCING_TOKEN" >> "$D/events"
echo "start $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
sleep 0.2
echo "stop $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
"#;

/// A cron job that takes about 100 ms and records that it ran, with its fencing token.
pub const CRON_JOB: &str = r#"sleep 0.1; echo "ran $LEADERRUN_FENCING_TOKEN" >> "$D/runs""#;

/// Wait for `waiters` (each running `TURN_TAKER` under `--wait`) to exit 0, then check
/// that every child ran exactly once, alone, in turn, with strictly increasing fencing
/// tokens. Returns the tokens in start order.
pub fn assert_turns_taken(sb: &Sandbox, waiters: Vec<Wrapper>) -> Vec<u64> {
    let count = waiters.len();
    for (i, w) in waiters.into_iter().enumerate() {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "waiter {i}: stderr {:?}", stderr_of(&out));
    }
    let events = sb.lines("events");
    assert!(!events.iter().any(|l| l.starts_with("OVERLAP")), "two children ran at once: {events:#?}");
    // Appends to one file are totally ordered: without overlap they alternate start, stop.
    assert_eq!(events.len(), 2 * count, "every waiter's child must run exactly once: {events:#?}");
    let (mut tokens, mut last_stop) = (Vec::new(), f64::MIN);
    for pair in events.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let stop: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!((start[0], stop[0], start[1]), ("start", "stop", stop[1]), "runs interleave: {events:#?}");
        let token: u64 = start[1].parse().expect("a numeric fencing token");
        assert!(tokens.last().is_none_or(|&last| token > last), "tokens must strictly increase: {events:#?}");
        let (t_start, t_stop): (f64, f64) = (start[2].parse().unwrap(), stop[2].parse().unwrap());
        assert!(last_stop <= t_start && t_start <= t_stop, "runs overlap in time: {events:#?}");
        tokens.push(token);
        last_stop = t_stop;
    }
    tokens
}

/// Parsed `leaderrun status --store URL --json --lock LOCK`, and its exit code.
pub fn status_json(sb: &Sandbox, url: &str, lock: &str) -> (i32, Value) {
    let mut cmd = sb.bare();
    cmd.args(["status", "--store", url, "--json", "--lock", lock]);
    let out = sb.output(cmd);
    let text = stdout_of(&out);
    let value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("status --json printed no JSON ({e}): {text:?}, stderr {:?}", stderr_of(&out)));
    (code_of(out.status, "status --json"), value)
}

/// Wait for one-shot runs started together: each must exit 0 and print nothing at all
/// (cron would mail any output).
pub fn assert_quiet_runs(runs: Vec<Wrapper>) {
    for (i, w) in runs.into_iter().enumerate() {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "run {i}: stderr {:?}", stderr_of(&out));
        assert_eq!((stdout_of(&out), stderr_of(&out)), (String::new(), String::new()), "run {i} must be silent");
    }
}

/// A `--wait` holder (ttl 8 s, renewing every second) rides out a store outage of 1.5 s
/// (`stop` takes the server down, `start` brings it back): its child keeps running, and a
/// renewal after the restart extends the same lease — 8 s minus the outage leaves at most
/// 6.5 s, so 7 s or more left shows a renewal reached the restarted server. SIGTERM then
/// ends it with 143 and frees the lock, which keeps its token. `secret` (a password in the
/// URL) never shows on the holder's stderr.
pub fn assert_holder_rides_out_an_outage(
    sb: &Sandbox,
    url: &str,
    stop: impl FnOnce(),
    start: impl FnOnce(),
    secret: Option<&str>,
) {
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "worker", "--wait", "--ttl", "8s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let (code, before) = status_json(sb, url, "worker");
    assert_eq!(code, 0, "held: {before}");

    stop();
    std::thread::sleep(Duration::from_millis(1500));
    start();

    wait_for(
        || {
            let (code, s) = status_json(sb, url, "worker");
            code == 0
                && s["fencing_token"] == before["fencing_token"]
                && s["expires_in_seconds"].as_f64().is_some_and(|left| left >= 7.0)
        },
        WITHIN_A_LEASE,
        "a renewal after the restart",
    );
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child must have kept running through the outage");
    if let Some(secret) = secret {
        assert!(!holder.stderr().contains(secret), "{:?}", holder.stderr());
    }

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
    let (code, after) = status_json(sb, url, "worker");
    assert_eq!((code, &after["fencing_token"]), (1, &before["fencing_token"]), "free, last token kept: {after}");
}

/// Ten hosts' cron fire `CRON_JOB` at once under `--lock nightly --min-hold 30s` on the store
/// at `url`: all exit 0 without a word, exactly one child runs, and the lock stays held with
/// that child's token; a late firing inside the min-hold runs nothing and says nothing.
/// Returns the token.
pub fn assert_cron_fleet_runs_once(sb: &Sandbox, url: &str) -> u64 {
    let args = ["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", CRON_JOB];
    let running: Vec<Wrapper> = (0..10).map(|i| sb.spawn(&format!("cron-{i}"), sb.at(url, &args))).collect();
    assert_quiet_runs(running);
    let runs = sb.lines("runs");
    assert_eq!(runs.len(), 1, "exactly one child must run: {runs:?}");
    let token: u64 = runs[0].strip_prefix("ran ").and_then(|t| t.parse().ok()).expect("ran TOKEN");
    assert!(token > 0);
    let (code, status) = status_json(sb, url, "nightly");
    assert_eq!((code, &status["fencing_token"]), (0, &Value::from(token)), "held for --min-hold: {status}");
    let late = sb.output(sb.at(url, &args));
    assert_eq!((late.status.code(), stderr_of(&late)), (Some(0), String::new()), "a late firing");
    assert_eq!(sb.lines("runs").len(), 1, "a late firing inside --min-hold must run nothing");
    token
}

/// Four `--wait` runs of `TURN_TAKER` on the store at `url` take turns (see
/// `assert_turns_taken`); returns the tokens in the order the turns were taken.
pub fn assert_waiters_take_turns(sb: &Sandbox, url: &str) -> Vec<u64> {
    let args = ["--lock", "deploy", "--wait", "--", "sh", "-c", TURN_TAKER];
    let waiters: Vec<Wrapper> = (0..4).map(|i| sb.spawn(&format!("waiter-{i}"), sb.at(url, &args))).collect();
    assert_turns_taken(sb, waiters)
}

/// A `--wait` child that records its start (as `$NAME`), runs until the file `go` exists and
/// 0.3 s more, and records its stop, on CLOCK_BOOTTIME (which every process shares).
pub const TURN_AFTER_GO: &str = r#"
echo "start $NAME $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
while [ ! -e "$D/go" ]; do sleep 0.05; done
sleep 0.3
echo "stop $NAME $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
"#;

/// Check that `count` children of `TURN_AFTER_GO` ran, one after another, each starting
/// less than a second after the one before it stopped: far below the several-second leases
/// the callers use, so a handoff that waited for a lease to lapse fails it.
pub fn assert_quick_handoffs(sb: &Sandbox, count: usize) {
    let mut turns: Vec<(String, f64, f64)> = Vec::new();
    for line in sb.lines("turns") {
        let f: Vec<&str> = line.split(' ').collect();
        let at: f64 = f[2].parse().expect("an uptime");
        match f[0] {
            "start" => turns.push((f[1].to_string(), at, f64::NAN)),
            _ => turns.iter_mut().find(|t| t.0 == f[1]).expect("a stop after its start").2 = at,
        }
    }
    assert_eq!(turns.len(), count, "{turns:?}");
    for pair in turns.windows(2) {
        let gap = pair[1].1 - pair[0].2;
        eprintln!("{} ended, {} started {gap:.3} s later", pair[0].0, pair[1].0);
        assert!(gap >= 0.0, "two children at once: {turns:?}");
        assert!(gap < 1.0, "a handoff took {gap:.3} s: {turns:?}");
    }
}
