//! End-to-end tests of the `leaderrun` binary against a real MariaDB server (started by
//! each test on loopback, in a temp dir): the shared suite (tests/e2e/), and what only this
//! store has: the `mariadb://` scheme, least privileges, sessions left behind, and a frozen
//! first waiter.
//!
//! Every command gets `--store URL` explicitly. Waits are on events with generous
//! bounds; nothing asserts that something was fast.

mod common;
mod e2e;
mod servers;

use std::time::Duration;

use common::*;
use e2e::Tokens;
use nix::sys::signal::Signal;
use serde_json::Value;
use servers::mariadb::Mariadb;

e2e_suite!(Mariadb, tokens: Tokens::FromOne, except {
    runs_over_mutual_tls: "the test MariaDB server does not speak TLS",
});

/// `mariadb://` names the same store as `mysql://`: a lease taken through one is held
/// through the other.
#[test]
fn the_mariadb_scheme_names_the_same_store() {
    let (db, sb) = (Mariadb::start(), Sandbox::new());
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/ran""#;
    let out = sb.output(sb.at(&db.url(), &["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("ran"), "1\n");
    let mariadb_url = db.url().replacen("mysql://", "mariadb://", 1);
    let (code, status) = status_json(&sb, &mariadb_url, "nightly");
    assert_eq!(
        (code, &status["fencing_token"], status["held"].as_bool()),
        (0, &Value::from(1), Some(true)),
        "{status}"
    );
    let out = sb.output(sb.at(&mariadb_url, &["--lock", "nightly", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "a late firing inside --min-hold; stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("ran"), "1\n", "a late firing inside --min-hold must run nothing");
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
