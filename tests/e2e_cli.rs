//! End-to-end tests of the `leaderrun` binary as a user runs it: cron fleets, `--wait`
//! handover, exit statuses, the child's environment and stdio, `status` / `list`, and
//! bad input. Signals, the watchdog and `release` are in `e2e_signals.rs`.
//!
//! Each test has its own temp dir and SQLite store (see `common`). Children are small
//! `sh -c` scripts that record what happened in files of that directory (`$D`).

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Output, Stdio};
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;
use serde_json::Value;

/// Start `n` one-shot runs of `CRON_JOB` at once (spawn all, then wait for all).
fn cron_wave(sb: &Sandbox, tag: &str, lock: &str, extra: &[&str], n: usize) -> Vec<Output> {
    let mut args = vec!["--lock", lock];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", CRON_JOB]);
    let running: Vec<Wrapper> = (0..n).map(|i| sb.spawn(&format!("{tag}-{i}"), sb.cmd(&args))).collect();
    running.into_iter().map(|w| w.finish(Duration::from_secs(60))).collect()
}

/// Every run exited 0 and printed nothing at all (cron would mail any output).
fn assert_quiet_success(outs: &[Output], what: &str) {
    for (i, out) in outs.iter().enumerate() {
        assert_eq!(out.status.code(), Some(0), "{what}, run {i}: status; stderr {:?}", stderr_of(out));
        assert_eq!(stdout_of(out), "", "{what}, run {i}: stdout must be empty");
        assert_eq!(stderr_of(out), "", "{what}, run {i}: stderr must be empty");
    }
}

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let sb = Sandbox::new();
    // Wave 1: ten hosts' cron fire at once; the job takes 100 ms.
    let outs = cron_wave(&sb, "wave1", "nightly", &["--min-hold", "30s"], 10);
    assert_quiet_success(&outs, "wave 1");
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "exactly one child of wave 1 must run");

    // Wave 2: cron fires late on ten more hosts, still inside --min-hold: nobody runs.
    let outs = cron_wave(&sb, "wave2", "nightly", &["--min-hold", "30s"], 10);
    assert_quiet_success(&outs, "wave 2");
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "a wave inside --min-hold must run nothing");
    // The first winner's lease is still held by the min-hold, token unchanged.
    let (code, status) = sb.status_json("nightly");
    assert_eq!(code, 0, "the lock stays taken for --min-hold: {status}");
    assert_eq!(status["fencing_token"], 1);
}

#[test]
fn twenty_processes_racing_to_create_the_store_elect_exactly_one() {
    let sb = Sandbox::new();
    // The store file does not exist yet: all twenty race to create it, switch it to WAL
    // and create the table. None may see "database is locked"; exactly one runs.
    assert!(!sb.store_path().exists());
    let outs = cron_wave(&sb, "race", "created-together", &[], 20);
    assert_quiet_success(&outs, "the creation race");
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "exactly one of twenty must run");
}

#[test]
fn cron_fleet_runs_again_once_min_hold_has_passed() {
    let sb = Sandbox::new();
    let outs = cron_wave(&sb, "wave1", "hourly", &["--min-hold", "2s"], 10);
    assert_quiet_success(&outs, "wave 1");
    assert_eq!(sb.lines("runs"), vec!["ran 1"], "exactly one child of wave 1 must run");

    // The lease frees itself when --min-hold has passed (nobody lingers to do it).
    wait_for(|| sb.status("hourly") == 1, WITHIN_A_LEASE, "the min-hold to pass and the lock to be free");

    let outs = cron_wave(&sb, "wave3", "hourly", &["--min-hold", "2s"], 10);
    assert_quiet_success(&outs, "wave 3");
    assert_eq!(sb.lines("runs"), vec!["ran 1", "ran 2"], "exactly one child of the wave after min-hold must run");
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let sb = Sandbox::new();
    let waiters: Vec<Wrapper> = (0..5)
        .map(|i| {
            sb.spawn(&format!("waiter-{i}"), sb.cmd(&["--lock", "deploy", "--wait", "--", "sh", "-c", TURN_TAKER]))
        })
        .collect();
    assert_turns_taken(&sb, waiters);
}

/// Start a holder whose child runs until killed; wait until the child is up.
fn start_holder(sb: &Sandbox, lock: &str, extra: &[&str]) -> (Wrapper, i32) {
    let mut args = vec!["--lock", lock];
    args.extend_from_slice(extra);
    let script = r#"echo $$ > "$D/holder.tmp"; mv "$D/holder.tmp" "$D/holder.pid"; exec sleep 1000"#;
    args.extend_from_slice(&["--", "sh", "-c", script]);
    let holder = sb.spawn("holder", sb.cmd(&args));
    let pid = sb.wait_pid("holder.pid");
    (holder, pid)
}

#[test]
fn wait_timeout_gives_up_with_the_conflict_status() {
    let sb = Sandbox::new();
    let (mut holder, holder_child) = start_holder(&sb, "deploy", &[]);
    let job = ["sh", "-c", r#"touch "$D/ran""#];

    let out = sb.output(sb.cmd(&[&["--lock", "deploy", "--wait", "--timeout", "1s", "--"][..], &job].concat()));
    assert_eq!(out.status.code(), Some(0), "default conflict status; stderr {:?}", stderr_of(&out));
    assert_eq!(stderr_of(&out), "", "a lost turn is not an error: nothing on stderr by default");

    let out =
        sb.output(sb.cmd(&[&["--lock", "deploy", "--wait", "--timeout", "1s", "-E", "3", "--"][..], &job].concat()));
    assert_eq!(out.status.code(), Some(3), "-E 3; stderr {:?}", stderr_of(&out));

    let out = sb.output(sb.cmd(&[&["--lock", "deploy", "--conflict-exit-code", "3", "--"][..], &job].concat()));
    assert_eq!(
        out.status.code(),
        Some(3),
        "one-shot conflict with --conflict-exit-code 3; stderr {:?}",
        stderr_of(&out)
    );

    assert!(!sb.exists("ran"), "a child ran while the lock was held by another");
    assert!(pid_alive(holder_child), "the holder's child must be untouched");
    let (code, status) = sb.status_json("deploy");
    assert_eq!((code, &status["fencing_token"]), (0, &Value::from(1)), "{status}");

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15);
}

#[test]
fn exit_status_of_the_child_is_passed_through() {
    let sb = Sandbox::new();
    let cases: [(&str, i32); 6] = [
        ("exit 0", 0),
        ("exit 1", 1),
        ("exit 7", 7),
        ("exit 255", 255),
        ("kill -KILL $$", 128 + 9),
        ("kill -TERM $$", 128 + 15),
    ];
    for (i, (script, expected)) in cases.iter().enumerate() {
        let lock = format!("status-{i}");
        let out = sb.output(sb.cmd(&["--lock", &lock, "--", "sh", "-c", script]));
        assert_eq!(out.status.code(), Some(*expected), "child `{script}`; stderr {:?}", stderr_of(&out));
    }
}

#[test]
fn child_environment_is_passed_through_and_leaderrun_variables_override_inherited_ones() {
    let sb = Sandbox::new();
    let script =
        r#"printf '%s\n' "$LEADERRUN_LOCK" "$LEADERRUN_IDENTITY" "$LEADERRUN_FENCING_TOKEN" "$E2E_PASSED" > "$D/env""#;
    let run = |n: &str| {
        let mut cmd = sb.cmd(&["--lock", "real-lock", "--min-hold", "0s", "--", "sh", "-c", script]);
        cmd.env("LEADERRUN_LOCK", "junk-lock")
            .env("LEADERRUN_IDENTITY", "junk-identity")
            .env("LEADERRUN_FENCING_TOKEN", "999999")
            .env("E2E_PASSED", "kept as is: $x 'q' \"dq\"");
        let mut w = sb.spawn(n, cmd);
        let pid = w.pid();
        let code = w.wait_code(SOON);
        (pid, code, sb.lines("env"))
    };

    let (pid, code, env) = run("first");
    assert_eq!(code, 0);
    assert_eq!(env[0], "real-lock");
    assert_eq!(env[2], "1", "the first acquisition's fencing token");
    assert_eq!(env[3], "kept as is: $x 'q' \"dq\"", "other variables pass through untouched");
    // Default identity, as documented: HOST:PID:RANDOM.
    let parts: Vec<&str> = env[1].split(':').collect();
    assert_eq!(parts.len(), 3, "identity {:?} is not HOST:PID:RANDOM", env[1]);
    let host = nix::unistd::gethostname().unwrap().into_string().unwrap();
    assert_eq!(parts[0], host, "identity {:?}", env[1]);
    assert_eq!(parts[1], pid.to_string(), "identity {:?} names the wrapper's pid", env[1]);
    assert!(!parts[2].is_empty() && parts[2].chars().all(|c| c.is_ascii_hexdigit()), "identity {:?}", env[1]);

    let (pid2, code, env) = run("second");
    assert_eq!(code, 0);
    assert_eq!(env[2], "2", "the token grows with every acquisition");
    assert_ne!(env[1].split(':').nth(1), None);
    assert_eq!(env[1].split(':').nth(1), Some(pid2.to_string().as_str()));
}

#[test]
fn lock_and_identity_are_never_read_from_the_environment() {
    let sb = Sandbox::new();
    // A nested leaderrun must not silently inherit its parent's lock.
    let mut cmd = sb.cmd(&["--", "sh", "-c", r#"touch "$D/ran""#]);
    cmd.env("LEADERRUN_LOCK", "inherited");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(2), "stderr {:?}", stderr_of(&out));
    assert!(stderr_of(&out).contains("--lock"), "the message names --lock: {:?}", stderr_of(&out));
    assert!(!sb.exists("ran"));
    assert!(!sb.store_path().exists(), "bad usage must not create the store");
}

#[test]
fn identity_shows_in_the_child_environment_and_in_status() {
    let sb = Sandbox::new();
    let mut cmd = sb.cmd(&[
        "--lock",
        "report",
        "--identity",
        "me",
        "--min-hold",
        "60s",
        "--",
        "sh",
        "-c",
        r#"echo "$LEADERRUN_IDENTITY" > "$D/identity""#,
    ]);
    cmd.env("LEADERRUN_IDENTITY", "junk");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.read("identity"), "me\n");
    // The lease stays taken for --min-hold after the child exits, so status shows it.
    let (code, status) = sb.status_json("report");
    assert_eq!(code, 0, "{status}");
    assert_eq!(status["holder"], "me", "{status}");
    let text = sb.output(sb.sub("status", &["--lock", "report"]));
    assert_eq!(text.status.code(), Some(0));
    assert!(stdout_of(&text).contains("me"), "{:?}", stdout_of(&text));
}

#[test]
fn options_can_be_set_from_the_environment() {
    let sb = Sandbox::new();
    let env_db = sb.file("from-env.db");
    let env_url = format!("sqlite://{}", env_db.display());
    let with_env = |args: &[&str]| {
        let mut cmd = sb.bare();
        cmd.args(args).env("LEADERRUN_STORE", &env_url);
        cmd
    };

    // LEADERRUN_STORE picks the store; LEADERRUN_MIN_HOLD the min-hold.
    let mut cmd = with_env(&["--lock", "e", "--", "true"]);
    cmd.env("LEADERRUN_MIN_HOLD", "1h");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(env_db.exists(), "LEADERRUN_STORE must name the store");
    assert!(!sb.store_path().exists());
    let out = sb.output(with_env(&["status", "--json", "--lock", "e"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let status: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let left = status["expires_in_seconds"].as_f64().unwrap();
    // The default would leave at most 10 s; an hour minus however slow this machine is.
    assert!(left > 600.0 && left <= 3600.0, "LEADERRUN_MIN_HOLD=1h not applied: {status}");

    // LEADERRUN_CONFLICT_EXIT_CODE changes the conflict status.
    let mut cmd = with_env(&["--lock", "e", "--", "sh", "-c", r#"touch "$D/ran""#]);
    cmd.env("LEADERRUN_CONFLICT_EXIT_CODE", "5");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(5), "stderr {:?}", stderr_of(&out));
    // LEADERRUN_WAIT and LEADERRUN_TIMEOUT.
    let mut cmd = with_env(&["--lock", "e", "--", "sh", "-c", r#"touch "$D/ran""#]);
    cmd.env("LEADERRUN_CONFLICT_EXIT_CODE", "5").env("LEADERRUN_WAIT", "true").env("LEADERRUN_TIMEOUT", "300ms");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(5), "stderr {:?}", stderr_of(&out));
    assert!(!sb.exists("ran"));

    // LEADERRUN_TTL and friends: the lease in the store lasts at most the ttl.
    let mut cmd = with_env(&["--lock", "short", "--", "sh", "-c", r#"touch "$D/up"; exec sleep 1000"#]);
    cmd.env("LEADERRUN_TTL", "2s").env("LEADERRUN_RENEW_EVERY", "500ms").env("LEADERRUN_KILL_AFTER", "500ms");
    let mut worker = sb.spawn("worker", cmd);
    wait_for(|| sb.exists("up"), SOON, "the child to start");
    let out = sb.output(with_env(&["status", "--json", "--lock", "short"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let status: Value = serde_json::from_str(stdout_of(&out).trim()).unwrap();
    let left = status["expires_in_seconds"].as_f64().unwrap();
    assert!(left > 0.0 && left <= 2.0, "LEADERRUN_TTL=2s not applied (default is 15s): {status}");
    worker.signal(Signal::SIGTERM);
    assert_eq!(worker.wait_code(SOON), 128 + 15);

    // A bad value from the environment is refused like a bad flag.
    let mut cmd = with_env(&["--lock", "e", "--", "true"]);
    cmd.env("LEADERRUN_TTL", "10x");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(2), "stderr {:?}", stderr_of(&out));
    assert!(stderr_of(&out).contains("--ttl"), "{:?}", stderr_of(&out));
}

#[test]
fn status_and_list_report_every_lock_as_json() {
    let sb = Sandbox::new();

    // Before the store exists: free, and looking does not create it.
    let (code, status) = sb.status_json("held");
    assert_eq!(code, 1, "{status}");
    assert_eq!(status["held"], false);
    assert_eq!(sb.list_json(), serde_json::json!([]));
    assert!(!sb.store_path().exists(), "status/list must not create the store");

    // "held": one-shot, kept for --min-hold after its child. "freed": --wait, released at once.
    let out = sb.output(sb.cmd(&["--lock", "held", "--identity", "holder-1", "--min-hold", "1h", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let out = sb.output(sb.cmd(&["--lock", "freed", "--wait", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));

    let (code, held) = sb.status_json("held");
    assert_eq!(code, 0, "held lock: {held}");
    assert_eq!(held["lock"], "held");
    assert_eq!(held["held"], true);
    assert_eq!(held["holder"], "holder-1");
    assert_eq!(held["fencing_token"], 1);
    let since = held["held_since"].as_str().unwrap_or_else(|| panic!("held_since: {held}"));
    humantime::parse_rfc3339(since).unwrap_or_else(|e| panic!("held_since {since:?} is not RFC 3339: {e}"));
    let left = held["expires_in_seconds"].as_f64().unwrap_or_else(|| panic!("expires_in_seconds: {held}"));
    assert!(left > 0.0 && left <= 3600.0, "{held}");

    let (code, freed) = sb.status_json("freed");
    assert_eq!(code, 1, "released lock: {freed}");
    assert_eq!(freed["held"], false);
    assert_eq!(freed["holder"], Value::Null);
    assert_eq!(freed["fencing_token"], 1);
    assert_eq!(freed["expires_in_seconds"], Value::Null);

    let (code, never) = sb.status_json("never");
    assert_eq!(code, 1, "unknown lock: {never}");
    assert_eq!(never["fencing_token"], 0);

    // Plain text status: same exit codes.
    assert_eq!(sb.status("held"), 0);
    assert_eq!(sb.status("freed"), 1);

    let list = sb.list_json();
    let list = list.as_array().unwrap_or_else(|| panic!("list --json is not an array: {list}"));
    let names: Vec<&str> = list.iter().map(|r| r["lock"].as_str().unwrap()).collect();
    assert_eq!(names, vec!["freed", "held"], "{list:?}");
    assert_eq!(list[0]["held"], false);
    assert_eq!(list[1]["held"], true);
    assert_eq!(list[1]["holder"], "holder-1");
    let out = sb.output(sb.sub("list", &[]));
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout_of(&out).contains("held") && stdout_of(&out).contains("freed"), "{:?}", stdout_of(&out));
}

#[test]
fn stdio_is_passed_through() {
    let sb = Sandbox::new();
    let mut cmd = sb.cmd(&["--lock", "io", "--", "sh", "-c", "cat; echo to-stderr >&2; echo done"]);
    cmd.stdin(Stdio::piped());
    let mut w = sb.spawn("io", cmd);
    let mut stdin = w.child.stdin.take().expect("stdin pipe");
    stdin.write_all(b"line one\nline two\n").unwrap();
    drop(stdin);
    let out = w.finish(SOON);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(stdout_of(&out), "line one\nline two\ndone\n");
    assert_eq!(stderr_of(&out), "to-stderr\n", "nothing but the child's own stderr at default verbosity");
}

/// What a refused invocation must look like: the status, one line on stderr starting
/// with `leaderrun: `, no panic or backtrace, nothing on stdout.
fn assert_refused(out: &Output, expected: i32, case: &str, mentions: &[&str]) {
    let err = stderr_of(out);
    assert_eq!(out.status.code(), Some(expected), "{case}: status; stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "{case}: exactly one line on stderr, got {err:?}");
    assert!(err.starts_with("leaderrun: "), "{case}: {err:?}");
    assert!(err.ends_with('\n'), "{case}: {err:?}");
    let lower = err.to_lowercase();
    assert!(!lower.contains("panicked") && !lower.contains("backtrace"), "{case}: {err:?}");
    for m in mentions {
        assert!(err.contains(m), "{case}: the message should mention {m:?}: {err:?}");
    }
    assert_eq!(stdout_of(out), "", "{case}: nothing on stdout");
}

#[test]
fn bad_input_is_refused_with_one_line_and_writes_nothing() {
    let sb = Sandbox::new();
    let noexec = sb.file("not-executable.sh");
    fs::write(&noexec, "#!/bin/sh\ntouch \"$D/ran\"\n").unwrap();
    fs::set_permissions(&noexec, fs::Permissions::from_mode(0o644)).unwrap();
    let noexec = noexec.to_str().unwrap().to_string();
    let dir = sb.path().to_str().unwrap().to_string();
    let long = "x".repeat(256);
    let job = ["sh", "-c", r#"touch "$D/ran""#];
    let with = |flags: &[&str]| -> Vec<String> {
        let mut v: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
        v.push("--".into());
        v.extend(job.iter().map(|s| s.to_string()));
        v
    };
    let s = |v: &[&str]| -> Vec<String> { v.iter().map(|s| s.to_string()).collect() };
    // (case, args after --store, expected status, what the message must mention)
    let cases: Vec<(&str, Vec<String>, i32, Vec<&str>)> = vec![
        ("bad duration unit", with(&["--lock", "b", "--ttl", "10x"]), 2, vec!["--ttl"]),
        ("duration without unit", with(&["--lock", "b", "--ttl", "15"]), 2, vec!["--ttl"]),
        ("empty lock name", with(&["--lock", ""]), 2, vec!["--lock"]),
        ("blank lock name", with(&["--lock", "   "]), 2, vec!["--lock"]),
        ("256-character lock name", with(&["--lock", &long]), 2, vec!["--lock", "255"]),
        ("lock name with a newline", with(&["--lock", "a\nb"]), 2, vec!["--lock"]),
        ("lock name with a tab", with(&["--lock", "a\tb"]), 2, vec!["--lock"]),
        ("missing command", s(&["--lock", "b"]), 2, vec!["command"]),
        ("missing command after --", s(&["--lock", "b", "--"]), 2, vec!["command"]),
        ("missing --lock", with(&[]), 2, vec!["--lock"]),
        (
            "command not found",
            s(&["--lock", "b", "--", "no-such-command-e2e-leaderrun"]),
            127,
            vec!["no-such-command-e2e-leaderrun"],
        ),
        ("command not found by path", s(&["--lock", "b", "--", "./no/such/file"]), 127, vec!["./no/such/file"]),
        ("command not executable", s(&["--lock", "b", "--", &noexec]), 126, vec![&noexec]),
        ("command is a directory", s(&["--lock", "b", "--", &dir]), 126, vec![&dir]),
        ("-q with -v", with(&["--lock", "b", "-q", "-v"]), 2, vec!["--quiet", "--verbose"]),
        (
            "timing rule broken",
            with(&["--lock", "b", "--ttl", "5s", "--kill-after", "5s"]),
            2,
            vec!["--ttl", "--kill-after"],
        ),
        (
            "renew not shorter than ttl",
            with(&["--lock", "b", "--ttl", "5s", "--renew-every", "5s"]),
            2,
            vec!["--renew-every", "--ttl"],
        ),
        ("zero kill-after", with(&["--lock", "b", "--kill-after", "0s"]), 2, vec!["--kill-after"]),
        ("unknown signal", with(&["--lock", "b", "--signal", "NOPE"]), 2, vec!["--signal"]),
        ("conflict exit code out of range", with(&["--lock", "b", "-E", "300"]), 2, vec!["--conflict-exit-code"]),
        ("empty identity", with(&["--lock", "b", "--identity", ""]), 2, vec!["--identity"]),
    ];
    // A duration too long to add to a clock reading (u64::MAX seconds): refused in one line,
    // whichever flag it is given to, never a panic (once after the lease was won).
    let huge = "18446744073709551615s";
    let mut cases = cases;
    for flag in [
        "--max-runtime",
        "--lock-delay",
        "--ttl",
        "--renew-every",
        "--kill-after",
        "--min-hold",
        "--timeout",
        "--server-clock-skew",
    ] {
        cases.push(("a duration out of range", with(&["--lock", "b", flag, huge]), 2, vec![flag]));
    }

    let run = |args: &[String], case: &str| -> Output {
        let mut cmd = sb.cmd(&[]);
        cmd.args(args).env("RUST_BACKTRACE", "1");
        let out = sb.output(cmd);
        assert!(!sb.exists("ran"), "{case}: the child ran");
        out
    };

    // With no store yet: refused, and the store file is not created.
    for (case, args, expected, mentions) in &cases {
        let out = run(args, case);
        assert_refused(&out, *expected, case, mentions);
        assert!(!sb.store_path().exists(), "{case}: the store file was created");
    }

    // With a store that already exists: refused, and nothing is written to it.
    let out = sb.output(sb.cmd(&["--lock", "pre", "--wait", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let before = sb.list_json();
    assert_eq!(before.as_array().map(Vec::len), Some(1), "{before}");
    for (case, args, expected, mentions) in &cases {
        let out = run(args, case);
        assert_refused(&out, *expected, case, mentions);
        assert_eq!(sb.list_json(), before, "{case}: the store changed");
    }

    // The subcommands check the lock name too.
    for sub in ["status", "release"] {
        for (case, name) in [("empty", ""), ("too long", long.as_str()), ("newline", "a\nb")] {
            let mut cmd = sb.sub(sub, &["--lock", name]);
            cmd.env("RUST_BACKTRACE", "1");
            let out = sb.output(cmd);
            assert_refused(&out, 2, &format!("{sub} with a lock name {case}"), &["--lock"]);
        }
    }
    assert_eq!(sb.list_json(), before);

    // The longest valid name is accepted (so 256 fails for its length, not its characters).
    let longest = "é".repeat(255);
    let out = sb.output(sb.cmd(&["--lock", &longest, "--", "sh", "-c", r#"touch "$D/ran""#]));
    assert_eq!(out.status.code(), Some(0), "a 255-character lock name: stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

#[test]
fn an_unknown_flag_before_the_command_is_bad_usage() {
    // A misspelt option before `--` is a usage error naming it (status 2), not the
    // command to run: the `--` that follows shows where the command starts.
    let sb = Sandbox::new();
    for flag in ["--no-such-flag", "--kil-after"] {
        let mut cmd = sb.cmd(&["--lock", "b", flag, "1s", "--", "sh", "-c", r#"touch "$D/ran""#]);
        cmd.env("RUST_BACKTRACE", "1");
        let out = sb.output(cmd);
        assert!(!sb.exists("ran"));
        assert_refused(&out, 2, &format!("unknown flag {flag} before --"), &[flag]);
        assert!(!sb.store_path().exists(), "the store file was created");
    }
}

#[test]
fn bad_store_urls_are_refused_without_showing_the_password() {
    let sb = Sandbox::new();
    let cases = [
        ("unknown scheme", "zz://host/x", vec!["zz"]),
        ("unknown scheme with a password", "foo://user:hunter2@host/x", vec!["foo"]),
        ("not a URL", "just-a-word", vec!["--store"]),
        ("sqlite URL naming no file", "sqlite://", vec!["--store"]),
        // Malformed or unknown parameters, on every store, found before anything connects
        // (port 1 is closed: a connection attempt would end in 69, not 2).
        ("sqlite parameter", "sqlite:///tmp/x.db?mode=ro", vec!["?mode="]),
        ("postgres parameter", "postgres://u:hunter2@127.0.0.1:1/db?sslmod=require", vec!["?sslmod="]),
        ("postgres bad table", "postgres://u:hunter2@127.0.0.1:1/db?table=a-b", vec!["table="]),
        ("mysql parameter", "mysql://u:hunter2@127.0.0.1:1/db?bogus=1", vec!["bogus"]),
        ("mariadb bad value", "mariadb://u:hunter2@127.0.0.1:1/db?ssl-mode=maybe", vec!["--store"]),
        ("redis parameter", "redis://:hunter2@127.0.0.1:1/0?bogus=1", vec!["?bogus="]),
        ("etcd parameter", "etcd://u:hunter2@127.0.0.1:1?cacrt=/ca.pem", vec!["?cacrt="]),
        ("nats bad value", "nats://u:hunter2@127.0.0.1:1?replicas=0", vec!["replicas"]),
        ("zookeeper parameter", "zk://u:hunter2@127.0.0.1:1/x?bogus=1", vec!["?bogus="]),
        ("kubernetes parameter", "k8s://team?bogus=1", vec!["?bogus="]),
        ("kubernetes bad namespace", "k8s://Team_A", vec!["namespace"]),
        ("kubernetes URL with a host", "kubernetes://u:hunter2@127.0.0.1:1/ns", vec!["kubeconfig"]),
        ("s3 parameter", "s3://bucket/x?bogus=1", vec!["?bogus="]),
        ("s3 credentials in the URL", "s3://AKIAEXAMPLE:hunter2@bucket", vec!["AWS_ACCESS_KEY_ID"]),
    ];
    // A store left out of this build is refused as such, with the same status.
    let compiled = |url: &str| match url.split(':').next() {
        Some("postgres") => cfg!(feature = "postgres"),
        Some("mysql" | "mariadb") => cfg!(feature = "mysql"),
        Some("redis") => cfg!(feature = "redis"),
        Some("etcd") => cfg!(feature = "etcd"),
        Some("nats") => cfg!(feature = "nats"),
        Some("zk") => cfg!(feature = "zookeeper"),
        Some("k8s" | "kubernetes") => cfg!(feature = "kubernetes"),
        Some("s3") => cfg!(feature = "s3"),
        _ => true,
    };
    let cases: Vec<_> = cases
        .into_iter()
        .map(|(case, url, mentions)| if compiled(url) { (case, url, mentions) } else { (case, url, vec!["has no"]) })
        .collect();
    for (case, url, mentions) in &cases {
        for args in [vec!["--store", url, "--lock", "b", "--", "true"], vec!["status", "--store", url, "--lock", "b"]] {
            let mut cmd = sb.bare();
            cmd.args(&args).env("RUST_BACKTRACE", "1");
            let out = sb.output(cmd);
            assert_refused(&out, 2, case, mentions);
            assert!(!stderr_of(&out).contains("hunter2"), "{case}: the password leaked: {:?}", stderr_of(&out));
        }
    }
    // A server clock skew that eats the whole lease, on a store that judges expiry on its
    // servers' wall clocks: refused before anything connects.
    if cfg!(feature = "postgres") {
        let mut cmd = sb.bare();
        let url = "postgres://u:hunter2@127.0.0.1:1/db";
        cmd.args(["--store", url, "--lock", "b", "--ttl", "2s", "--server-clock-skew", "2s", "--", "true"]);
        assert_refused(&sb.output(cmd), 2, "server clock skew as long as the ttl", &["--server-clock-skew"]);
    }
    // The same URL from the environment: refused, and never shown, not even by --help.
    let mut cmd = sb.bare();
    cmd.args(["--lock", "b", "--", "true"]).env("LEADERRUN_STORE", "foo://user:hunter2@host/x");
    let out = sb.output(cmd);
    assert_refused(&out, 2, "LEADERRUN_STORE with a password", &["foo"]);
    assert!(!stderr_of(&out).contains("hunter2"), "{:?}", stderr_of(&out));
    for help in ["--help", "-h"] {
        let mut cmd = sb.bare();
        cmd.arg(help).env("LEADERRUN_STORE", "foo://user:hunter2@host/x");
        let out = sb.output(cmd);
        assert_eq!(out.status.code(), Some(0));
        assert!(stdout_of(&out).contains("--store"), "{help} shows the flags");
        assert!(
            !stdout_of(&out).contains("hunter2") && !stderr_of(&out).contains("hunter2"),
            "{help} shows the password"
        );
    }
    // A store file in a directory that cannot exist: the store cannot be opened.
    let blocker = sb.file("a-file");
    fs::write(&blocker, "").unwrap();
    let url = format!("sqlite://{}/sub/x.db", blocker.display());
    let mut cmd = sb.bare();
    cmd.args(["--store", &url, "--lock", "b", "--", "sh", "-c", r#"touch "$D/ran""#]).env("RUST_BACKTRACE", "1");
    let out = sb.output(cmd);
    assert_refused(&out, 69, "unopenable store file", &["a-file"]);
    assert!(!sb.exists("ran"));
}

#[test]
fn default_store_lives_in_the_state_directory() {
    let sb = Sandbox::new();
    let (state, home) = (sb.file("state"), sb.file("home"));
    for dir in [&state, &home] {
        fs::create_dir(dir).unwrap();
        if nix::unistd::geteuid().is_root() {
            nix::unistd::chown(dir.as_path(), Some(65534.into()), Some(65534.into())).unwrap();
        }
    }
    let run = |xdg: Option<&std::path::Path>| {
        let mut cmd = sb.bare_unprivileged();
        cmd.args(["--lock", "default", "--wait", "--", "true"]).env("HOME", &home).env_remove("XDG_STATE_HOME");
        if let Some(xdg) = xdg {
            cmd.env("XDG_STATE_HOME", xdg);
        }
        sb.output(cmd)
    };
    let out = run(Some(&state));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(state.join("leaderrun/leaderrun.db").exists(), "$XDG_STATE_HOME/leaderrun/leaderrun.db");
    assert!(!home.join(".local").exists());

    let out = run(None);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(home.join(".local/state/leaderrun/leaderrun.db").exists(), "~/.local/state/leaderrun/leaderrun.db");
}

#[test]
fn unusable_state_directory_gives_store_unavailable() {
    let sb = Sandbox::new();
    // A path through a regular file cannot be created, not even by root.
    let blocker = sb.file("a-file");
    fs::write(&blocker, "").unwrap();
    let mut cmd = sb.bare_unprivileged();
    cmd.args(["--lock", "b", "--", "sh", "-c", r#"touch "$D/ran""#])
        .env("RUST_BACKTRACE", "1")
        .env("HOME", blocker.join("home"))
        .env("XDG_STATE_HOME", blocker.join("state"));
    let out = sb.output(cmd);
    assert_refused(&out, 69, "unusable state directory", &["a-file"]);
    assert!(!sb.exists("ran"));
    assert!(blocker.is_file());
}

#[test]
fn init_prints_the_schema_without_writing_and_creates_the_store() {
    let sb = Sandbox::new();
    let out = sb.output(sb.sub("init", &["--print-sql"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(stdout_of(&out).starts_with("CREATE TABLE IF NOT EXISTS leaderrun_locks"), "{}", stdout_of(&out));
    assert!(!sb.store_path().exists(), "--print-sql must not create the store");
    let out = sb.output(sb.sub("init", &[]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert!(sb.store_path().exists());
    assert_eq!(sb.list_json(), serde_json::json!([]), "a fresh store has no locks");
}

#[test]
fn a_short_ttl_alone_gets_defaults_that_fit() {
    // --kill-after and --renew-every follow --ttl when they are not given.
    let sb = Sandbox::new();
    for ttl in ["5s", "2s"] {
        let mut cmd = sb.cmd(&["--lock", "short", "--wait", "--ttl", ttl, "--", "sh", "-c", r#"touch "$D/ran-$T""#]);
        cmd.env("T", ttl);
        let out = sb.output(cmd);
        assert_eq!(out.status.code(), Some(0), "--ttl {ttl}: stderr {:?}", stderr_of(&out));
        assert!(sb.exists(&format!("ran-{ttl}")));
    }
    // A value the user gave that breaks the rule is still refused.
    let out = sb.output(sb.cmd(&["--lock", "short", "--wait", "--ttl", "5s", "--kill-after", "5s", "--", "true"]));
    assert_refused(&out, 2, "explicit --kill-after too long for --ttl", &["--kill-after (5s)"]);
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    // `leaderrun list | head -1`: a closed pipe is not an error, and never a panic.
    let sb = Sandbox::new();
    for i in 0..3 {
        let out = sb.output(sb.cmd(&["--lock", &format!("lock-{i}"), "--", "true"]));
        assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    }
    for (args, expected) in [
        (vec!["list"], 0),
        (vec!["list", "--json"], 0),
        (vec!["status", "--lock", "lock-0"], 0),
        (vec!["status", "--lock", "free"], 1),
    ] {
        let (read_end, write_end) = nix::unistd::pipe().expect("a pipe");
        drop(read_end); // the reader is gone before leaderrun writes
        let mut cmd = sb.sub(args[0], &args[1..]);
        cmd.stdout(std::process::Stdio::from(write_end)).stderr(std::process::Stdio::piped());
        cmd.env("RUST_BACKTRACE", "1");
        let out = cmd.output().expect("run leaderrun");
        assert_eq!(out.status.code(), Some(expected), "{args:?}: stderr {:?}", stderr_of(&out));
        assert_eq!(stderr_of(&out), "", "{args:?}: quiet");
    }
}
