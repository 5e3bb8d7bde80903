//! End-to-end tests of the `leaderrun` binary against a real ZooKeeper server (one per test):
//! a cron fleet, `--wait` handover, a wrong password that never shows, a holder riding out a
//! short outage, a killed holder replaced once its session times out, and an outage longer
//! than the lease. Fencing tokens are sequence numbers + 1: they increase, but losers' attempts
//! use numbers too.

mod common;
mod servers;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;
use servers::zookeeper::ZooKeeper;

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    assert_cron_fleet_runs_once(&sb, &zk.url());
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    assert_waiters_take_turns(&sb, &zk.url());
}

#[test]
fn slots_a_semaphore_of_three_and_a_waiter_that_takes_the_slot_that_frees() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    slots::assert_a_semaphore_of_three(&sb, &zk.url());
    let sb = Sandbox::new();
    slots::assert_a_waiter_takes_the_slot_that_frees(&sb, &zk.url());
}

#[test]
fn a_wrong_password_exits_69_without_showing_it() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    // The first run creates the root, readable and writable by its user only.
    let right = format!("zk://app:Right-Password-7@127.0.0.1:{}", zk.port());
    let first = sb.output(sb.at(&right, &["--lock", "pw", "--min-hold", "0s", "--", "true"]));
    assert_eq!(first.status.code(), Some(0), "stderr {:?}", stderr_of(&first));

    let wrong = right.replace("Right-Password-7", "Wrong-Password-42");
    let out = sb.output(sb.at(&wrong, &["--lock", "pw", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("app:***@") && err.contains("not authorized"), "{err:?}");
    assert!(!err.contains("Wrong-Password-42") && !stdout_of(&out).contains("Wrong-Password-42"), "{err:?}");
    assert!(!sb.exists("ran"), "nothing runs without the store");
}

#[test]
fn a_holder_rides_out_a_short_outage() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    let url = zk.url();
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let ttl = Duration::from_secs(10);
    let args = ["--lock", "worker", "--wait", "--ttl", "10s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(&url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let (code, before) = status_json(&sb, &url, "worker");
    assert_eq!(code, 0, "held: {before}");

    // Down for less than the session timeout: the session, its lease and the holder's child
    // live on (ZooKeeper keeps sessions across a restart and gives them a fresh timeout).
    let stopped = Instant::now();
    zk.stop();
    std::thread::sleep(Duration::from_millis(1500));
    zk.start_again();

    // Without a renewal since the restart the holder would have stopped its child one ttl
    // after its last renewal before the outage at the latest; wait past that.
    std::thread::sleep((stopped + ttl + Duration::from_secs(2)).saturating_duration_since(Instant::now()));
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child must have kept running through the outage");
    let (code, during) = status_json(&sb, &url, "worker");
    assert_eq!((code, &during["fencing_token"]), (0, &before["fencing_token"]), "same lease: {during}");

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
    // A clean exit of a --wait holder frees the lock at once.
    let (code, after) = status_json(&sb, &url, "worker");
    assert_eq!((code, &after["fencing_token"]), (1, &before["fencing_token"]), "free, last token kept: {after}");
}

#[test]
fn a_killed_holder_is_replaced_once_its_session_times_out() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    let url = zk.url();
    // Each child holds a file lock for its whole life, so two children at once are caught.
    let script = r#"exec 9>>"$D/flock"; flock -n 9 || echo "OVERLAP" >> "$D/events"
echo "start $LEADERRUN_FENCING_TOKEN" >> "$D/events"; exec sleep 1000"#;
    let timing = ["--ttl", "3s", "--renew-every", "500ms", "--kill-after", "500ms"];
    let args = [&["--lock", "worker", "--wait"][..], &timing, &["--", "sh", "-c", script]].concat();
    let first = sb.spawn("first", sb.at(&url, &args));
    wait_for(|| sb.lines("events").len() == 1, SOON, "the first child");
    let mut standby = sb.spawn("standby", sb.at(&url, &args));

    // The wrapper dies; its watchdog stops the child by the deadline, and the server expires
    // the session (no more heartbeats) a session timeout after it last heard of it.
    first.signal(Signal::SIGKILL);
    wait_for(|| sb.lines("events").len() == 2, WITHIN_A_LEASE, "the standby's child");
    let events = sb.lines("events");
    assert!(!events.iter().any(|l| l.starts_with("OVERLAP")), "two children at once: {events:?}");
    let tokens: Vec<u64> = events.iter().filter_map(|l| l.strip_prefix("start ")?.parse().ok()).collect();
    assert!(tokens.len() == 2 && tokens[1] > tokens[0], "{events:?}");

    standby.signal(Signal::SIGTERM);
    assert_eq!(standby.wait_code(SOON), 128 + 15, "stderr {:?}", standby.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn an_outage_longer_than_the_lease_stops_the_child() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    let url = zk.url();
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "worker", "--wait", "--ttl", "3s", "--renew-every", "500ms", "--kill-after", "500ms"];
    let mut holder = sb.spawn("holder", sb.at(&url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let (_, before) = status_json(&sb, &url, "worker");

    zk.stop();
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "lease lost while the child ran; stderr {:?}", holder.stderr());
    assert!(!pid_alive(child), "the child must be stopped");

    // Back up, the server gives the session a fresh timeout; nobody heartbeats it any more, so
    // it lapses then, and the next run gets a later token.
    zk.start_again();
    wait_for(|| status_json(&sb, &url, "worker").0 == 1, WITHIN_A_LEASE, "the lost lease to lapse on the server");
    let out = sb
        .output(sb.at(&url, &["--lock", "worker", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let next: u64 = sb.read("next").trim().parse().expect("a token");
    assert!(next > before["fencing_token"].as_u64().expect("a token"), "{next} after {before}");
    sb.wait_no_processes_left(SOON);
}

#[test]
fn runs_over_mutual_tls() {
    let (zk, sb) = (ZooKeeper::start_tls(), Sandbox::new());
    let url = zk.tls_url();
    let out =
        sb.output(sb.at(&url, &["--lock", "tls", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/ran""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let token = sb.read("ran").trim().parse::<u64>().expect("a token");
    let (code, status) = status_json(&sb, &url, "tls");
    assert_eq!((code, &status["fencing_token"]), (0, &serde_json::Value::from(token)), "held for --min-hold: {status}");
}

#[test]
fn a_ttl_above_the_servers_longest_session_exits_69_in_one_line() {
    let (zk, sb) = (ZooKeeper::start_with_default_session_limits(), Sandbox::new());
    let url = format!("zk://app:Secret-Password-9@127.0.0.1:{}", zk.port());
    let out = sb.output(sb.at(&url, &["--lock", "long", "--ttl", "10s", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("maxSessionTimeout") && err.contains("app:***@"), "{err:?}");
    assert!(!err.contains("Secret-Password-9"), "{err:?}");
    assert!(!sb.exists("ran"), "nothing runs");
}

#[test]
fn without_a_ttl_the_longest_that_fits_the_servers_sessions_is_used() {
    // tickTime 500 ms: maxSessionTimeout is 10 s, too short for the default 15 s ttl's
    // session. With no --ttl given, the run picks one that fits and says so at -v.
    let (zk, sb) = (ZooKeeper::start_with_default_session_limits(), Sandbox::new());
    let url = format!("zk://app:Secret-Password-9@127.0.0.1:{}", zk.port());
    let out = sb.output(sb.at(&url, &["-v", "--lock", "fits", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(sb.exists("ran"), "the child ran");
    assert!(err.contains("using the longest that fits") && err.contains("ttl="), "-v says so: {err:?}");
    assert!(!err.contains("Secret-Password-9"), "{err:?}");
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    // Port 1 is closed: a URL checked only at open would exit 69 instead.
    for (url, needle) in [
        ("zk://app:Secret-Password-5@127.0.0.1:1?bogus=1", "?bogus="),
        ("zk://app:Secret-Password-5@127.0.0.1:1?tls=yes&cacert=/ca.pem", "?tls=yes"),
        ("zk://app:Secret-Password-5@127.0.0.1:1?tls=1", "cacert=FILE"),
    ] {
        for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"]] {
            let out = sb.output(sb.at(url, args));
            let err = stderr_of(&out);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}: stderr {err:?}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains(needle) && err.contains("app:***@127.0.0.1:1"), "{err:?}");
            assert!(!err.contains("Secret-Password-5"), "{err:?}");
        }
    }
    assert!(!sb.exists("ran"), "nothing runs");
}
