//! End-to-end tests of the `leaderrun` binary against a real PostgreSQL server (one per
//! test): the shared suite (tests/e2e/), and what only this store has: the table named in the
//! URL, a waiting worker started before its database, and a frozen first waiter.

mod common;
mod e2e;
mod servers;

use std::time::Duration;

use common::*;
use e2e::Tokens;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use servers::postgres::Postgres;

e2e_suite!(Postgres, tokens: Tokens::FromOne, except {
    runs_over_mutual_tls: "the test PostgreSQL server does not speak TLS",
});

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
    // A one-shot run retries a store that is down for a few seconds only (a restart, a
    // failover), then gives up with status 69.
    pg.stop();
    let out = sb.output(sb.at(&pg.url(), &["--lock", "late-db", "--min-hold", "0s", "--", "true"]));
    assert_eq!(code_of(out.status, "one-shot with the store down"), 69, "{}", stderr_of(&out));
    assert_eq!(stderr_of(&out).lines().count(), 1, "one line: {}", stderr_of(&out));
    // Back while it still retries (up to its --timeout, here: the default 5 s might not cover
    // the server's start on a loaded machine): it runs, and says nothing (quiet in cron).
    let args = ["--lock", "late-db", "--timeout", "60s", "--", "sh", "-c", script];
    let mut late = sb.spawn("late", sb.at(&pg.url(), &args));
    std::thread::sleep(Duration::from_millis(1500));
    pg.start_again();
    assert_eq!(late.wait_code(WITHIN_A_LEASE), 0, "stderr: {}", late.stderr());
    assert_eq!(sb.lines("runs"), vec!["ran 1", "ran 2"]);
    assert_eq!(late.stderr(), "", "a run that got through is quiet");
}

/// A `--wait` child that records start and stop (token, CLOCK_BOOTTIME) and runs until the
/// test creates `exit-TOKEN`.
const RELAY_CHILD: &str = r#"
echo "start $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
while [ ! -e "$D/exit-$LEADERRUN_FENCING_TOKEN" ]; do sleep 0.02; done
echo "stop $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
"#;

/// The CLOCK_BOOTTIME (seconds) at which the child with `token` recorded `what`, once it has.
fn event_at(sb: &Sandbox, what: &str, token: u64) -> f64 {
    let mut at = None;
    wait_for(
        || {
            at = sb.lines("events").iter().find_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.len() == 3 && fields[0] == what && fields[1] == token.to_string())
                    .then(|| fields[2].parse::<f64>().expect("an uptime"))
            });
            at.is_some()
        },
        Duration::from_secs(30),
        &format!("{what} of the child with token {token}"),
    );
    at.expect("checked above")
}

/// A waiter frozen (SIGSTOP) while it is first in line is named at every release, and never
/// acts: the others must still take over within a moment, at each handoff, not when the
/// lease they last read would lapse (8 s here).
#[test]
fn a_frozen_first_waiter_does_not_stall_the_handoffs() {
    let (pg, sb) = (Postgres::start(), Sandbox::new());
    let url = pg.url();
    let args = ["--lock", "relay", "--wait", "--ttl", "8s", "--", "sh", "-c", RELAY_CHILD];
    let waiting = || {
        let sql = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'leaderrun-wait:%'";
        pg.psql_in(servers::postgres::DATABASE, sql).parse::<usize>().expect("a count")
    };
    let _holder = sb.spawn("holder", sb.at(&url, &args));
    event_at(&sb, "start", 1);
    // The first waiter connects first, so every release names it.
    let first = sb.spawn("frozen", sb.at(&url, &args));
    wait_for(|| waiting() == 1, SOON, "the first waiter to wait");
    kill(Pid::from_raw(-first.pid()), Signal::SIGSTOP).expect("SIGSTOP the first waiter's group");
    let others: Vec<Wrapper> = (0..2).map(|i| sb.spawn(&format!("waiter-{i}"), sb.at(&url, &args))).collect();
    wait_for(|| waiting() == 3, SOON, "the other two waiters to wait");

    let mut gaps = Vec::new();
    for token in 1..=2 {
        std::fs::write(sb.file(&format!("exit-{token}")), "").unwrap();
        let stopped = event_at(&sb, "stop", token);
        let next = event_at(&sb, "start", token + 1);
        gaps.push(next - stopped);
    }
    eprintln!("handoff gaps with the first waiter frozen (s): {gaps:.3?}");
    assert!(gaps.iter().all(|&gap| gap < 1.0), "a handoff waited for the frozen waiter: gaps {gaps:?} s");

    // Thawed, it takes its turn after the others.
    kill(Pid::from_raw(-first.pid()), Signal::SIGCONT).expect("SIGCONT");
    for token in 3..=4 {
        std::fs::write(sb.file(&format!("exit-{token}")), "").unwrap();
    }
    for (i, w) in others.into_iter().chain([first]).enumerate() {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "waiter {i}: stderr {:?}", stderr_of(&out));
    }
}
