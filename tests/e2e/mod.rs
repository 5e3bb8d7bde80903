//! The end-to-end suite of the `leaderrun` binary: written once, run against every store's
//! test server (one server per test).
//!
//! A store joins by implementing `TestServer` for its server (tests/servers/) and calling
//! `e2e_suite!(ServerType, tokens: ...)` in its tests/e2e_STORE.rs, which declares `mod common;
//! mod e2e; mod servers;`. A test that cannot apply to a store is named in the call's
//! `except { test_name: "why", ... }`, with the reason, and is not generated for that store (a
//! misspelt name does not compile). What only one store does stays in that store's own file.
//!
//! Every command is `--store URL` with the server's environment (`TestServer::env`); every
//! wait is on an event with a generous bound, and nothing asserts how fast anything happened.

#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use serde_json::Value;

use crate::common::*;
use crate::servers::{TestServer, TlsServer};

/// How a store numbers its fencing tokens, as far as the suite checks them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tokens {
    /// 1, 2, 3...: one per acquisition of a lock, on a fresh server.
    FromOne,
    /// Increasing, but numbered otherwise (revisions, sequences, the server's clock).
    Rising,
}

impl Tokens {
    /// Check the tokens of a lock's acquisitions on a fresh server, in order (every store's
    /// tokens increase; `FromOne` says by how much).
    pub fn check(self, tokens: &[u64]) {
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "tokens must increase: {tokens:?}");
        if self == Tokens::FromOne {
            let expected: Vec<u64> = (1..=tokens.len() as u64).collect();
            assert_eq!(tokens, expected, "one token per acquisition, exactly as the store wrote it");
        }
    }
}

/// A test's server, and a sandbox whose every command reaches it.
pub struct Fixture<S> {
    pub server: S,
    pub sb: Sandbox,
    pub tokens: Tokens,
}

impl<S: TestServer> Fixture<S> {
    /// A fresh server of this kind.
    pub fn start(tokens: Tokens) -> Self {
        Self::on(S::start(), tokens)
    }

    /// `server`, already started.
    pub fn on(server: S, tokens: Tokens) -> Self {
        let sb = Self::sandbox(&server);
        Self { server, sb, tokens }
    }

    /// Another sandbox on the same server.
    fn sandbox(server: &S) -> Sandbox {
        Sandbox::new().with_envs(server.env())
    }

    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The timing flags of a short lease (the server's `short_ttl`), renewed and stopped a
    /// sixth of it apart: `--ttl 3s --renew-every 500ms --kill-after 500ms` on most stores.
    pub fn short_timing(&self) -> Vec<String> {
        let ttl = self.server.short_ttl();
        let sixth = format!("{}ms", (ttl / 6).as_millis());
        [
            "--ttl".into(),
            format!("{}ms", ttl.as_millis()),
            "--renew-every".into(),
            sixth.clone(),
            "--kill-after".into(),
            sixth,
        ]
        .into()
    }

    /// `leaderrun [SUB] --store URL ARGS...` in the sandbox.
    pub fn at(&self, args: &[&str]) -> Command {
        self.sb.at(&self.url(), args)
    }

    /// Exit code and parsed `status --json --lock LOCK`.
    pub fn status(&self, lock: &str) -> (i32, Value) {
        status_json(&self.sb, &self.url(), lock)
    }

    /// Fail if `text` (something leaderrun printed) shows the server's secret.
    pub fn assert_no_secret(&self, text: &str, what: &str) {
        if let Some(secret) = self.server.secret() {
            assert!(!text.contains(&secret), "{what} shows the secret: {text:?}");
        }
    }

    /// The server's secret, for a test about keeping it hidden, which has nothing to test
    /// on a server that lets anyone in.
    fn required_secret(&self) -> String {
        self.server.secret().expect("this server lets anyone in: name the test in the store's `except`")
    }
}

/// A child that records its pid, then runs until it is stopped.
const RUNS_UNTIL_STOPPED: &str = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;

/// Start a `--wait` holder of `lock` with `timing`, whose child runs until stopped; wait until
/// the child runs, and return the holder and the child's pid.
fn holder<S: TestServer>(f: &Fixture<S>, lock: &str, timing: &[&str]) -> (Wrapper, i32) {
    let args = [&["--lock", lock, "--wait"][..], timing, &["--", "sh", "-c", RUNS_UNTIL_STOPPED]].concat();
    let holder = f.sb.spawn("holder", f.at(&args));
    let child = f.sb.wait_pid("child.pid");
    (holder, child)
}

/// Ten hosts' cron fire `CRON_JOB` at once under `--lock nightly --min-hold 30s`, on a server
/// that has no lock yet (the stores that make a table, a bucket or a root race to make it):
/// all exit 0 without a word, exactly one child runs, and the lock stays held with that
/// child's token; a late firing inside the min-hold runs nothing and says nothing.
pub fn cron_fleet_runs_each_firing_exactly_once<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let args = ["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", CRON_JOB];
    let running: Vec<Wrapper> = (0..10).map(|i| f.sb.spawn(&format!("cron-{i}"), f.at(&args))).collect();
    assert_quiet_runs(running);
    let runs = f.sb.lines("runs");
    assert_eq!(runs.len(), 1, "exactly one child must run: {runs:?}");
    let token: u64 = runs[0].strip_prefix("ran ").and_then(|t| t.parse().ok()).expect("ran TOKEN");
    assert!(token > 0);
    f.tokens.check(&[token]);
    let (code, status) = f.status("nightly");
    assert_eq!(
        (code, &status["fencing_token"], status["held"].as_bool()),
        (0, &Value::from(token), Some(true)),
        "held for --min-hold: {status}"
    );
    let late = f.sb.output(f.at(&args));
    assert_eq!((late.status.code(), stderr_of(&late)), (Some(0), String::new()), "a late firing");
    assert_eq!(f.sb.lines("runs").len(), 1, "a late firing inside --min-hold must run nothing");
}

/// Four `--wait` runs of `TURN_TAKER` take turns: each child runs once, alone, with a
/// larger token than the one before.
pub fn wait_handover_runs_every_waiter_once_in_turn<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let args = ["--lock", "deploy", "--wait", "--", "sh", "-c", TURN_TAKER];
    let waiters: Vec<Wrapper> = (0..4).map(|i| f.sb.spawn(&format!("waiter-{i}"), f.at(&args))).collect();
    let taken = assert_turns_taken(&f.sb, waiters);
    f.tokens.check(&taken);
}

/// A holder killed with SIGKILL renews no more: its watchdog stops its child by the deadline,
/// and a standby takes over once the lease has lapsed (on a server that ends no lease, once
/// it has seen the lease unchanged for a whole one). The two children never overlap: each
/// holds a file lock for its whole life, and the second would find the first's taken.
pub fn a_killed_holder_is_replaced<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let script = r#"exec 9>>"$D/flock"; flock -n 9 || echo "OVERLAP" >> "$D/events"
echo $$ > "$D/child-$LEADERRUN_FENCING_TOKEN.pid"
echo "start $LEADERRUN_FENCING_TOKEN" >> "$D/events"; exec sleep 1000"#;
    let timing = f.short_timing();
    let timing: Vec<&str> = timing.iter().map(String::as_str).collect();
    let args = [&["--lock", "worker", "--wait"][..], &timing, &["--", "sh", "-c", script]].concat();
    let first = f.sb.spawn("first", f.at(&args));
    wait_for(|| f.sb.lines("events").len() == 1, SOON, "the first child");
    let mut standby = f.sb.spawn("standby", f.at(&args));

    first.signal(Signal::SIGKILL);
    let lapsed = WITHIN_A_LEASE + f.server.short_ttl() * 2;
    wait_for(|| f.sb.lines("events").len() == 2, lapsed, "the standby's child");
    let events = f.sb.lines("events");
    assert!(!events.iter().any(|l| l.starts_with("OVERLAP")), "two children at once: {events:?}");
    let tokens: Vec<u64> = events.iter().filter_map(|l| l.strip_prefix("start ")?.parse().ok()).collect();
    assert_eq!(tokens.len(), 2, "{events:?}");
    f.tokens.check(&tokens);
    let first_child: i32 = f.sb.read(&format!("child-{}.pid", tokens[0])).trim().parse().expect("a pid");
    assert!(!pid_alive(first_child), "the killed holder's child must be dead");

    standby.signal(Signal::SIGTERM);
    assert_eq!(standby.wait_code(SOON), 128 + 15, "stderr {:?}", standby.stderr());
    f.sb.wait_no_processes_left(SOON);
}

/// A `--wait` holder (renewing every second) rides out an outage of 1.5 s: the same lease goes
/// on, and so does its child. Two things show that renewals reached the server again: a status
/// with the ttl less 1 s or more left (the outage leaves at most the ttl less 1.5 s without
/// one), and the child still running a whole lease after the stop (without a renewal since,
/// the holder would have stopped it by then). The ttl is the server's `outage_ttl`, since its
/// restart is part of the outage: 15 s, or 30 s for a JVM, which a busy machine starts slowly. SIGTERM then ends it with 143 and frees the
/// lock, which keeps its token. The secret never shows on the holder's stderr.
pub fn a_holder_rides_out_a_short_outage<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let ttl = f.server.outage_ttl();
    let ttl_flag = format!("{}s", ttl.as_secs());
    let (mut holder, child) = holder(&f, "worker", &["--ttl", &ttl_flag, "--renew-every", "1s", "--kill-after", "1s"]);
    let (code, before) = f.status("worker");
    assert_eq!(code, 0, "held: {before}");

    let stopped = Instant::now();
    f.server.outage(Duration::from_millis(1500));
    wait_for(
        || {
            assert!(holder.try_status().is_none(), "the holder exited; stderr {:?}", holder.stderr());
            let (code, s) = f.status("worker");
            code == 0
                && s["fencing_token"] == before["fencing_token"]
                && s["expires_in_seconds"].as_f64().is_some_and(|left| left >= ttl.as_secs_f64() - 1.0)
        },
        WITHIN_A_LEASE,
        "a renewal after the restart",
    );
    std::thread::sleep((stopped + ttl + Duration::from_secs(2)).saturating_duration_since(Instant::now()));
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child must have kept running through the outage");
    let (code, during) = f.status("worker");
    assert_eq!((code, &during["fencing_token"]), (0, &before["fencing_token"]), "the same lease: {during}");
    f.assert_no_secret(&holder.stderr(), "the holder's stderr");

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    f.sb.wait_no_processes_left(SOON);
    let (code, after) = f.status("worker");
    assert_eq!((code, &after["fencing_token"]), (1, &before["fencing_token"]), "free, last token kept: {after}");
}

/// A server down for longer than the lease: the holder stops its child and exits 75 (lease
/// lost), without showing the secret. Back up, the next run waits for the lost lease to lapse
/// (on a server that ends no lease: until it has seen it unchanged for a whole one), and gets
/// the next token.
pub fn an_outage_longer_than_the_lease_stops_the_child<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let timing = f.short_timing();
    let (mut holder, child) = holder(&f, "worker", &timing.iter().map(String::as_str).collect::<Vec<_>>());
    let (_, before) = f.status("worker");
    let before = before["fencing_token"].as_u64().expect("a token");

    f.server.stop();
    assert_eq!(
        holder.wait_code(WITHIN_A_LEASE + f.server.short_ttl()),
        75,
        "lease lost while the child ran; stderr {:?}",
        holder.stderr()
    );
    assert!(!pid_alive(child), "the child must be stopped when the lease cannot be renewed");
    f.assert_no_secret(&holder.stderr(), "the holder's stderr");

    f.server.start_again();
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/next""#;
    let out = f.sb.output(f.at(&["--lock", "worker", "--wait", "--timeout", "60s", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let next: u64 = f.sb.read("next").trim().parse().expect("a token");
    f.tokens.check(&[before, next]);
    f.sb.wait_no_processes_left(SOON);
}

/// Exits 69 with one line on stderr that says `says`, shows a URL's secret masked, and never
/// shows `secrets`; the child never ran.
fn assert_refused(sb: &Sandbox, out: &std::process::Output, url: &str, secrets: &[&str], says: &str, case: &str) {
    let (err, stdout) = (stderr_of(out), stdout_of(out));
    assert_eq!(out.status.code(), Some(69), "{case}: stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "{case}: one line: {err:?}");
    assert!(err.contains(says), "{case}: {says:?} missing from {err:?}");
    for secret in secrets {
        assert!(!err.contains(secret) && !stdout.contains(secret), "{case}: a secret shows: {err:?}");
        if url.contains(secret) {
            assert!(err.contains("***"), "{case}: the URL is shown masked: {err:?}");
        }
    }
    assert!(!sb.exists("ran"), "{case}: nothing runs without the store");
}

/// A wrong secret: a run and a status exit 69 in one line that says the server refused it,
/// showing neither the wrong secret nor the right one.
pub fn a_wrong_secret_exits_69_in_one_line_without_showing_it<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let wrong = f.server.wrong_secret().expect("this server lets anyone in: name the test in the store's `except`");
    let right = f.required_secret();
    let secrets = [wrong.secret.as_str(), right.as_str()];
    for args in [&["--lock", "pw", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "pw"]] {
        let mut cmd = f.sb.at(&wrong.url, args);
        cmd.envs(wrong.env.iter().map(|(name, value)| (name, value)));
        let out = f.sb.output(cmd);
        assert_refused(&f.sb, &out, &wrong.url, &secrets, wrong.refusal, &format!("{args:?}"));
    }
}

/// The store unreachable (the server's port with nothing listening): a run, after its retries,
/// and a status exit 69 in one line, without the secret.
pub fn an_unreachable_store_exits_69_in_one_line<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let closed = crate::servers::free_port();
    let url = f.server.url_via(closed);
    let secret = f.server.secret();
    let secrets: Vec<&str> = secret.iter().map(String::as_str).collect();
    for args in [&["--lock", "down", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "down"]] {
        let mut cmd = f.sb.at(&url, args);
        cmd.envs(f.server.env_via(closed));
        let out = f.sb.output(cmd);
        assert_refused(&f.sb, &out, &url, &secrets, "", &format!("{args:?}"));
    }
}

/// Not even -vvv (which lets the store client's own debug lines through) shows the secret,
/// nor does anything the other commands print.
pub fn verbose_output_never_shows_the_secret<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let secret = f.required_secret();
    let run = f.sb.output(f.at(&["-vvv", "--min-hold", "1h", "--lock", "verbose", "--", "true"]));
    assert_eq!(run.status.code(), Some(0), "stderr {:?}", stderr_of(&run));
    assert!(stderr_of(&run).contains("trace:"), "-vvv says what it does: {:?}", stderr_of(&run));
    let mut outputs = vec![run];
    for args in [
        &["status", "--lock", "verbose"][..],
        &["status", "--json", "--lock", "verbose"],
        &["list", "--json"],
        &["list"],
        &["release", "-v", "--lock", "verbose"],
    ] {
        let out = f.sb.output(f.at(args));
        assert_eq!(out.status.code(), Some(0), "{args:?}: stderr {:?}", stderr_of(&out));
        outputs.push(out);
    }
    for out in &outputs {
        let all = format!("{}{}", stdout_of(out), stderr_of(out));
        assert!(!all.contains(&secret), "the secret shows: {all}");
    }
}

/// status, list and release see a `--wait` holder: held with its child's token, listed; the
/// release makes it stop its child and exit 75, and frees the lock.
pub fn status_list_and_release_see_the_holder<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/token"; exec sleep 1000"#;
    let mut holder = f.sb.spawn("holder", f.at(&["--lock", "job", "--wait", "--", "sh", "-c", script]));
    wait_for(|| !f.sb.read("token").is_empty(), SOON, "the child");
    let token: u64 = f.sb.read("token").trim().parse().expect("a token");

    let out = f.sb.output(f.at(&["status", "--lock", "job"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(stdout_of(&out).contains("job"), "{}", stdout_of(&out));
    let (code, status) = f.status("job");
    assert_eq!(
        (code, status["held"].as_bool(), &status["fencing_token"]),
        (0, Some(true), &Value::from(token)),
        "held by the holder: {status}"
    );
    let out = f.sb.output(f.at(&["list", "--json"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let listed: Value = serde_json::from_str(stdout_of(&out).trim()).expect("list --json prints JSON");
    let job = listed.as_array().expect("a list").iter().find(|l| l["lock"] == "job").cloned();
    assert_eq!(job.map(|l| l["fencing_token"].clone()), Some(Value::from(token)), "listed: {listed}");

    let out = f.sb.output(f.at(&["release", "--lock", "job"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    // The holder sees the release at its next renewal at the latest.
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "a released holder; stderr {:?}", holder.stderr());
    f.sb.wait_no_processes_left(SOON);
    assert_eq!(f.status("job").0, 1, "free after the release");
}

/// `--slots 3`: a semaphore of three (see `slots::assert_a_semaphore_of_three`), then a
/// waiter that takes the slot that frees.
pub fn slots_a_semaphore_of_three_and_a_waiter_that_takes_the_slot_that_frees<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    slots::assert_a_semaphore_of_three(&f.sb, &f.url());
    let sb = Fixture::sandbox(&f.server);
    slots::assert_a_waiter_takes_the_slot_that_frees(&sb, &f.url());
}

/// Waiting runs with `--slots 2` and `--slots 3` on one lock never exceed three at once.
pub fn slots_runs_with_different_counts_never_exceed_the_largest<S: TestServer>(tokens: Tokens) {
    let f = Fixture::<S>::start(tokens);
    slots::assert_mixed_counts_never_exceed_the_largest(&f.sb, &f.url());
}

/// A run over mutual TLS (the server asks for a client certificate of its CA) holds the lock.
pub fn runs_over_mutual_tls<S: TlsServer>(tokens: Tokens) {
    let f = Fixture::on(S::start_tls(), tokens);
    let url = f.server.tls_url();
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" >> "$D/ran""#;
    let out = f.sb.output(f.sb.at(&url, &["--lock", "tls", "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let ran = f.sb.lines("ran");
    assert_eq!(ran.len(), 1, "the child ran once: {ran:?}");
    let token: u64 = ran[0].parse().expect("a token");
    f.tokens.check(&[token]);
    let (code, status) = status_json(&f.sb, &url, "tls");
    assert_eq!((code, &status["fencing_token"]), (0, &Value::from(token)), "held for --min-hold: {status}");
}

/// Generate one `#[test]` per test of the suite for a `TestServer` type. `tokens:` says how
/// the store numbers its tokens (`Tokens::FromOne` or `Tokens::Rising`); `except { test: "why",
/// ... }` names the tests that cannot apply to this store, each with the reason; they are not
/// generated (no test is left to be ignored). `runs_over_mutual_tls` needs a `TlsServer`.
#[macro_export]
macro_rules! e2e_suite {
    ($server:ty, tokens: $tokens:expr $(, except { $($skip:ident : $why:literal),* $(,)? })? $(,)?) => {
        $crate::e2e_suite!(@define ($) $server, $tokens, [$($($skip : $why),*)?]);
    };
    // `$d` is a `$` for the rules of the inner macro, which the outer one would take for its own.
    (@define ($d:tt) $server:ty, $tokens:expr, [$($skip:ident : $why:literal),*]) => {
        // A name that is not a test of the suite fails here.
        $(#[allow(unused_imports)] use $crate::e2e::$skip as _;)*
        macro_rules! e2e_test {
            // Not generated: the reason stands in the store's file, beside the call.
            $(($skip) => {};)*
            ($d name:ident) => {
                #[test]
                fn $d name() {
                    $crate::e2e::$d name::<$server>($tokens);
                }
            };
        }
        e2e_test!(cron_fleet_runs_each_firing_exactly_once);
        e2e_test!(wait_handover_runs_every_waiter_once_in_turn);
        e2e_test!(a_killed_holder_is_replaced);
        e2e_test!(a_holder_rides_out_a_short_outage);
        e2e_test!(an_outage_longer_than_the_lease_stops_the_child);
        e2e_test!(a_wrong_secret_exits_69_in_one_line_without_showing_it);
        e2e_test!(an_unreachable_store_exits_69_in_one_line);
        e2e_test!(verbose_output_never_shows_the_secret);
        e2e_test!(status_list_and_release_see_the_holder);
        e2e_test!(slots_a_semaphore_of_three_and_a_waiter_that_takes_the_slot_that_frees);
        e2e_test!(slots_runs_with_different_counts_never_exceed_the_largest);
        e2e_test!(runs_over_mutual_tls);
    };
}
