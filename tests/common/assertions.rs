//! What several end-to-end tests check the same way: children taking turns, quiet cron runs,
//! quick handoffs, a lock's status.

use std::time::Duration;

use serde_json::Value;

use super::{code_of, stderr_of, stdout_of, Sandbox, Wrapper};

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
