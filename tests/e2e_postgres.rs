//! End-to-end tests of the `leaderrun` binary against a real PostgreSQL server (one per
//! test): a cron fleet, `--wait` handover, a password that never shows, and a holder
//! riding out a short outage but stopping its child in a long one.

mod common;
mod servers;

use std::process::Output;
use std::time::Duration;

use common::*;
use servers::postgres::Postgres;

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    // Ten hosts fire at once on a database that has no table yet: all race to create it.
    assert_eq!(assert_cron_fleet_runs_once(&sb, &pg.url()), 1);
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    assert_waiters_take_turns(&sb, &pg.url());
}

/// Exits 69 with one line on stderr that shows the URL masked and never `secret`.
fn assert_store_failure(out: &Output, secret: &str, case: &str) {
    let err = stderr_of(out);
    assert_eq!(out.status.code(), Some(69), "{case}: stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "{case}: one line: {err:?}");
    assert!(err.contains("***"), "{case}: the URL is shown masked: {err:?}");
    assert!(!err.contains(secret) && !stdout_of(out).contains(secret), "{case}: the password leaked: {err:?}");
}

#[test]
fn the_password_never_shows() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    let (url, password) = (pg.url(), pg.password().to_string());
    let job = ["--lock", "pw", "--", "sh", "-c", r#"touch "$D/ran""#];

    let wrong = url.replace(&password, "Wrong-Password-42");
    let out = sb.output(sb.at(&wrong, &job));
    assert_store_failure(&out, "Wrong-Password-42", "a wrong password");
    assert!(stderr_of(&out).contains("password authentication failed"), "{:?}", stderr_of(&out));
    let closed = url.replace(&format!(":{}/", pg.port()), &format!(":{}/", servers::free_port()));
    let out = sb.output(sb.at(&closed, &job));
    assert_store_failure(&out, &password, "a closed port");
    assert!(!sb.exists("ran"), "nothing runs without the store");

    // Everything a working run and the other commands print, even at -vvv.
    let mut outputs = vec![sb.output(sb.at(&url, &[&["-vvv", "--min-hold", "1h"][..], &job].concat()))];
    assert_eq!(outputs[0].status.code(), Some(0), "stderr {:?}", stderr_of(&outputs[0]));
    assert!(sb.exists("ran"));
    for (name, args) in [
        ("status", vec!["--lock", "pw"]),
        ("status", vec!["--json", "--lock", "pw"]),
        ("list", vec!["--json"]),
        ("list", vec![]),
        ("release", vec!["-v", "--lock", "pw"]),
    ] {
        let out = sb.output(sb.at(&url, &[&[name][..], &args].concat()));
        assert_eq!(out.status.code(), Some(0), "{name} {args:?}: stderr {:?}", stderr_of(&out));
        outputs.push(out);
    }
    for out in &outputs {
        let all = format!("{}{}", stdout_of(out), stderr_of(out));
        assert!(!all.contains(&password), "the password leaked: {all}");
    }
}

/// A `--wait` holder whose child runs until stopped; returns it and the child's pid.
fn start_holder(sb: &Sandbox, url: &str, lease: &[&str]) -> (Wrapper, i32) {
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = [&["--lock", "worker", "--wait"][..], lease, &["--", "sh", "-c", script]].concat();
    let holder = sb.spawn("holder", sb.at(url, &args));
    let child = sb.wait_pid("child.pid");
    (holder, child)
}

#[test]
fn a_holder_rides_out_a_short_outage() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    assert_holder_rides_out_an_outage(&sb, &pg.url(), || pg.stop(), || pg.start_again(), Some(pg.password()));
}

#[test]
fn a_longer_outage_stops_the_child_and_loses_the_lease() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    let url = pg.url();
    let (mut holder, child) = start_holder(&sb, &url, &["--ttl", "3s", "--renew-every", "1s", "--kill-after", "1s"]);

    pg.stop();
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "lease lost; stderr {:?}", holder.stderr());
    assert!(!pid_alive(child), "the child must be stopped when the lease cannot be renewed");
    assert!(!holder.stderr().contains(pg.password()), "{:?}", holder.stderr());

    // Back up: the lease lapses on the server's clock and the next run gets the next token.
    pg.start_again();
    wait_for(
        || sb.output(sb.at(&url, &["status", "--lock", "worker"])).status.code() == Some(1),
        WITHIN_A_LEASE,
        "the lease to lapse",
    );
    let out = sb
        .output(sb.at(&url, &["--lock", "worker", "--", "sh", "-c", r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("next"), "2\n");
    sb.wait_no_processes_left(SOON);
}

#[test]
fn init_prints_or_creates_the_table_named_in_the_url() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    let url = format!("{}?table=team_locks", pg.url());
    // --print-sql connects to nothing and writes nothing.
    let out = sb.output(sb.at(&url, &["init", "--print-sql"]));
    assert_eq!(code_of(out.status, "init --print-sql"), 0, "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("CREATE TABLE IF NOT EXISTS \"team_locks\""), "{}", stdout_of(&out));
    let exists = "SELECT count(*) FROM pg_tables WHERE tablename = 'team_locks'";
    assert_eq!(pg.psql_in("leaderrun", exists), "0");
    // init creates it; the password stays out of what it prints.
    let out = sb.output(sb.at(&url, &["init"]));
    assert_eq!(code_of(out.status, "init"), 0, "{}", stderr_of(&out));
    assert!(!stdout_of(&out).contains(pg.password()), "{}", stdout_of(&out));
    assert_eq!(pg.psql_in("leaderrun", exists), "1");
    // A table name that is not a plain identifier is bad usage, refused before connecting.
    let out = sb.output(sb.at(&format!("{}?table=x;drop", pg.url()), &["init", "--print-sql"]));
    assert_eq!(code_of(out.status, "init with a bad table"), 2, "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "{}", stderr_of(&out));
    assert!(!stderr_of(&out).contains(pg.password()));
}

#[test]
fn a_waiting_worker_started_before_its_database_waits_for_it() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    pg.stop();
    let script = r#"echo "ran $LEADERRUN_FENCING_TOKEN" >> "$D/runs""#;
    let mut worker = sb.spawn("worker", sb.at(&pg.url(), &["--lock", "late-db", "--wait", "--", "sh", "-c", script]));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(worker.try_status().is_none(), "a --wait worker must not give up on a store that is not up yet");
    pg.start_again();
    assert_eq!(worker.wait_code(WITHIN_A_LEASE), 0, "stderr: {}", worker.stderr());
    assert_eq!(sb.lines("runs"), vec!["ran 1"]);
    assert!(!worker.stderr().contains(pg.password()), "{}", worker.stderr());
    // A one-shot run does not wait: the store being down is status 69.
    pg.stop();
    let out = sb.output(sb.at(&pg.url(), &["--lock", "late-db", "--", "true"]));
    assert_eq!(code_of(out.status, "one-shot with the store down"), 69, "{}", stderr_of(&out));
}
