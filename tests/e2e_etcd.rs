//! End-to-end tests of the `leaderrun` binary against a real etcd server (one per test):
//! a cron fleet, `--wait` handover, and a holder riding out a short outage.
//! Fencing tokens are etcd revisions: they increase, but do not start at 1.

mod common;
mod servers;

use common::*;
use servers::etcd::Etcd;

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    assert_cron_fleet_runs_once(&sb, &etcd.url());
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    assert_waiters_take_turns(&sb, &etcd.url());
}

#[test]
fn slots_a_semaphore_of_three_and_a_waiter_that_takes_the_slot_that_frees() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    slots::assert_a_semaphore_of_three(&sb, &etcd.url());
    let sb = Sandbox::new();
    slots::assert_a_waiter_takes_the_slot_that_frees(&sb, &etcd.url());
}

#[test]
fn a_holder_rides_out_a_short_outage() {
    let (etcd, sb) = (Etcd::start(), Sandbox::new());
    assert_holder_rides_out_an_outage(&sb, &etcd.url(), || etcd.stop(), || etcd.start_again(), None);
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
