//! End-to-end tests of the `leaderrun` binary against a real MariaDB server (started by
//! each test on loopback, in a temp dir): a cron fleet, `--wait` handover, a password
//! that never shows, and a holder's life through a short and a long server outage.
//!
//! Every command gets `--store URL` explicitly. Waits are on events with generous
//! bounds; nothing asserts that something was fast.

mod common;
mod servers;

use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;
use servers::mariadb::Mariadb;

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let url = db.url();
    // Ten hosts' cron fire at once; the table does not exist yet, so they also race to create it.
    let args = ["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", CRON_JOB];
    let running: Vec<Wrapper> = (0..10).map(|i| sb.spawn(&format!("cron-{i}"), sb.at(&url, &args))).collect();
    assert_quiet_runs(running);
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "exactly one child must run");

    // The lease stays taken for --min-hold; the mariadb:// scheme names the same store.
    let mariadb_url = url.replacen("mysql://", "mariadb://", 1);
    let (code, status) = status_json(&sb, &mariadb_url, "nightly");
    assert_eq!(
        (code, &status["fencing_token"], status["held"].as_bool()),
        (0, &Value::from(1), Some(true)),
        "{status}"
    );
    let out = sb.output(sb.at(&mariadb_url, &["--lock", "nightly", "--", "sh", "-c", CRON_JOB]));
    assert_eq!(out.status.code(), Some(0), "a late firing inside --min-hold; stderr {:?}", stderr_of(&out));
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "a late firing inside --min-hold must run nothing");
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let tokens = assert_waiters_take_turns(&sb, &db.url());
    assert_eq!(tokens, [1, 2, 3, 4], "one token per acquisition, exactly as the store wrote it");
}

#[test]
fn a_wrong_password_is_never_shown() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let wrong = format!("Wrong{}", db.password());
    let url = db.url().replace(db.password(), &wrong);
    let out = sb.output(sb.at(&url, &["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "the store refused us; stderr {stderr:?}");
    assert!(!sb.exists("ran"), "the child must not run");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains("leaderrun:***@127.0.0.1"), "the URL is shown with the password masked: {stderr:?}");
    assert!(stderr.contains("Access denied"), "the message says why: {stderr:?}");
    assert!(!stderr.contains(&wrong) && !stderr.contains(db.password()), "the password leaked: {stderr:?}");

    // Nor does status, on a server that is down.
    drop(db);
    let out = sb.output(sb.at(&url, &["status", "--lock", "x"]));
    let stderr = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {stderr:?}");
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains("***") && !stderr.contains(&wrong), "{stderr:?}");
}

#[test]
fn select_insert_update_suffice_once_the_table_exists() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    // The table as `leaderrun init --print-sql` would have a DBA create it.
    let schema = leaderrun::store::mysql::schema_sql("leaderrun_locks");
    db.root_sql(&format!("USE leaderrun; {schema}"));
    db.root_sql(
        "CREATE USER 'least'@'%' IDENTIFIED BY 'Least9';
         GRANT SELECT, INSERT, UPDATE ON leaderrun.leaderrun_locks TO 'least'@'%';",
    );
    let url = format!("mysql://least:Least9@127.0.0.1:{}/leaderrun", db.port());
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/ran""#;
    let out = sb.output(sb.at(&url, &["--lock", "job", "--min-hold", "0s", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("ran"), "1\n");
    let (code, status) = status_json(&sb, &url, "job");
    assert_eq!((code, &status["fencing_token"]), (1, &Value::from(1)), "released, token kept: {status}");

    // Another table, which this user may not create: refused, with the server's reason.
    let other = format!("{url}?table=other_locks");
    let out = sb.output(sb.at(&other, &["--lock", "job", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(69), "stderr {:?}", stderr_of(&out));
    assert!(stderr_of(&out).contains("denied"), "{:?}", stderr_of(&out));
}

/// Start a `--wait` holder whose child runs until killed; wait until the child is up.
fn start_holder(sb: &Sandbox, url: &str, timing: &[&str]) -> (Wrapper, i32) {
    let script = r#"echo $$ > "$D/holder.tmp"; mv "$D/holder.tmp" "$D/holder.pid"; exec sleep 1000"#;
    let args = [&["--lock", "worker", "--wait"][..], timing, &["--", "sh", "-c", script]].concat();
    let holder = sb.spawn("holder", sb.at(url, &args));
    let child = sb.wait_pid("holder.pid");
    (holder, child)
}

#[test]
fn a_holder_rides_out_a_short_outage() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let url = db.url();
    let (mut holder, child) = start_holder(&sb, &url, &["--ttl", "6s", "--renew-every", "1s", "--kill-after", "1s"]);

    let outage = std::time::Instant::now();
    db.stop();
    std::thread::sleep(Duration::from_millis(1500));
    db.start_again();
    eprintln!("the server was down for {:?}", outage.elapsed());
    // Longer than the lease: only renewals after the restart can have kept the child alive.
    std::thread::sleep(Duration::from_secs(8));
    assert!(pid_alive(child), "the child was stopped; wrapper stderr {:?}", holder.stderr());
    assert!(holder.try_status().is_none(), "the wrapper exited; stderr {:?}", holder.stderr());
    let (code, status) = status_json(&sb, &url, "worker");
    assert_eq!((code, &status["fencing_token"]), (0, &Value::from(1)), "still the first lease: {status}");

    assert!(!holder.stderr().contains(db.password()), "{:?}", holder.stderr());
    eprintln!("the holder said: {}", holder.stderr());

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    assert!(!pid_alive(child));
    let (code, _) = status_json(&sb, &url, "worker");
    assert_eq!(code, 1, "released on the way out");
}

#[test]
fn an_outage_longer_than_the_lease_stops_the_child() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let url = db.url();
    let (mut holder, child) =
        start_holder(&sb, &url, &["--ttl", "3s", "--renew-every", "500ms", "--kill-after", "500ms"]);

    db.stop();
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "lease lost while the child ran; stderr {:?}", holder.stderr());
    assert!(!pid_alive(child), "the child must be stopped");
    assert!(!holder.stderr().contains(db.password()), "{:?}", holder.stderr());

    // The server back and the lease lapsed on its clock: the next run gets the next token.
    db.start_again();
    let free = || status_json(&sb, &url, "worker").0 == 1;
    wait_for(free, WITHIN_A_LEASE, "the lost lease to lapse on the server");
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#;
    let out = sb.output(sb.at(&url, &["--lock", "worker", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("next"), "2\n");
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_timed_out_waiter_and_a_finished_run_leave_nothing_on_the_server() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let url = db.url();
    let (mut holder, child) = start_holder(&sb, &url, &[]);
    // Blocked in GET_LOCK until --timeout ends the wait (status 0: the turn never came).
    let out = sb.output(sb.at(&url, &["--lock", "worker", "--wait", "--timeout", "2s", "--", "touch", "/dev/null"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    // A wait in GET_LOCK is long by design: no slow-statement warning for it.
    assert!(!stderr_of(&out).contains("warning"), "stderr {:?}", stderr_of(&out));
    wait_for(|| db.blocked_on_user_locks() == 0, SOON, "the timed-out waiter's GET_LOCK to end");

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    assert!(!pid_alive(child));
    // Every session closed (no user lock can be left), the lease released.
    wait_for(|| db.leaderrun_sessions() == 0, SOON, "every leaderrun session to end");
    let (code, _) = status_json(&sb, &url, "worker");
    assert_eq!(code, 1, "released on the way out");
    wait_for(|| db.leaderrun_sessions() == 0, SOON, "status's session to end");
}

/// The waiter the server wakes first at a release (it has waited longest for the holder's
/// user lock) is frozen: it keeps that user lock, and the release must still reach another
/// waiter within a moment, at this handoff and the next, not when the lease they last read
/// would have expired (8 s).
#[test]
fn a_frozen_first_waiter_delays_a_handoff_by_a_moment_only() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let url = db.url();
    let args = ["--lock", "frozen", "--wait", "--ttl", "8s", "-vv", "--", "sh", "-c", TURN_AFTER_GO];
    let start = |name: &str| {
        let mut cmd = sb.at(&url, &args);
        cmd.env("NAME", name);
        sb.spawn(name, cmd)
    };
    let holder = start("holder");
    wait_for(|| sb.lines("turns").len() == 1, SOON, "the holder's child to start");
    // One at a time, so that the server's queue has them in this order.
    let waiters: Vec<Wrapper> = (1..=3)
        .map(|i| {
            let waiter = start(&format!("w{i}"));
            wait_for(|| db.blocked_on_user_locks() == i, SOON, "the waiter to block in GET_LOCK");
            waiter
        })
        .collect();
    let mut waiters = waiters.into_iter();
    let first = waiters.next().expect("three waiters");
    first.signal(Signal::SIGSTOP);
    std::fs::write(sb.file("go"), "").unwrap();
    for w in [holder].into_iter().chain(waiters) {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    }
    assert_quick_handoffs(&sb, 3);
    assert!(pid_stopped(first.pid()), "the first waiter stayed frozen throughout");
}
