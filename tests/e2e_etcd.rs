//! End-to-end tests of the `leaderrun` binary against a real etcd server (one per test):
//! a cron fleet, `--wait` handover, and a holder riding out a short outage.
//! Fencing tokens are etcd revisions: they increase, but do not start at 1.

mod common;
mod servers;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use servers::etcd::Etcd;

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    let url = etcd.url();
    let args = ["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", CRON_JOB];
    let running: Vec<Wrapper> = (0..10).map(|i| sb.spawn(&format!("cron-{i}"), sb.at(&url, &args))).collect();
    assert_quiet_runs(running);
    let runs = sb.lines("runs");
    assert_eq!(runs.len(), 1, "exactly one child must run: {runs:?}");
    let token: u64 = runs[0].strip_prefix("ran ").and_then(|t| t.parse().ok()).expect("ran TOKEN");
    assert!(token > 0);
    let (code, status) = status_json(&sb, &url, "nightly");
    assert_eq!((code, &status["fencing_token"]), (0, &serde_json::Value::from(token)), "held for --min-hold: {status}");
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    let url = etcd.url();
    let args = ["--lock", "deploy", "--wait", "--", "sh", "-c", TURN_TAKER];
    let waiters: Vec<Wrapper> = (0..4).map(|i| sb.spawn(&format!("waiter-{i}"), sb.at(&url, &args))).collect();
    assert_turns_taken(&sb, waiters);
}

#[test]
fn a_holder_rides_out_a_short_outage() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    let url = etcd.url();
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "worker", "--wait", "--ttl", "6s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(&url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let (code, before) = status_json(&sb, &url, "worker");
    assert_eq!(code, 0, "held: {before}");

    etcd.stop();
    std::thread::sleep(Duration::from_millis(1500));
    etcd.start_again();

    // Renewed since the restart (more than 4 s of a 6 s lease left), same token.
    wait_for(
        || {
            let (code, s) = status_json(&sb, &url, "worker");
            code == 0
                && s["fencing_token"] == before["fencing_token"]
                && s["expires_in_seconds"].as_f64().is_some_and(|left| left > 4.0)
        },
        WITHIN_A_LEASE,
        "a renewal after the restart",
    );
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child must have kept running through the outage");

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
    // A clean exit of a --wait holder frees the lock at once.
    let (code, after) = status_json(&sb, &url, "worker");
    assert_eq!((code, &after["fencing_token"]), (1, &before["fencing_token"]), "free, last token kept: {after}");
}

#[test]
fn runs_over_mutual_tls() {
    let (etcd, sb) = (Etcd::start_tls(), Sandbox::new());
    let url = etcd.tls_url();
    let out =
        sb.output(sb.at(&url, &["--lock", "tls", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/ran""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let token = sb.read("ran").trim().parse::<u64>().expect("a token");
    let (code, status) = status_json(&sb, &url, "tls");
    assert_eq!((code, &status["fencing_token"]), (0, &serde_json::Value::from(token)), "held for --min-hold: {status}");
}
