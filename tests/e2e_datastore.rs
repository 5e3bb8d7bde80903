//! End-to-end tests of the `leaderrun` binary against Google's Datastore emulator (one per
//! test): the shared suite (tests/e2e/), and what only this store has: 20 contenders and one
//! winner, status / list / release in a namespace and kind of the URL's, and refusals (a bad
//! URL or a reserved lock name exits 2; credentials that do not work exit 69 without showing
//! them; -vvv shows no secret).
//!
//! Every run finds the emulator through `DATASTORE_EMULATOR_HOST`, as Google's client
//! libraries do. Fencing tokens come from the emulator's version counter, so they increase
//! but do not start at 1. The emulator keeps its entities across a SIGTERM restart (and
//! restarts its version counter, which the nonce makes harmless).

mod common;
mod e2e;
mod servers;

use std::fs;
use std::process::Command;

use common::*;
use e2e::Tokens;
use serde_json::Value;
use servers::datastore_emulator::DatastoreEmulator;
use servers::TestServer;

e2e_suite!(DatastoreEmulator, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "the emulator lets anyone in; credentials Google would refuse are in \
         unusable_credentials_exit_69_in_one_line_without_showing_them",
    verbose_output_never_shows_the_secret:
        "the emulator lets anyone in: no secret to hide (debug_output_never_shows_a_secret hides a key file's)",
    runs_over_mutual_tls: "the emulator is plain HTTP",
});

/// `sb.at`, reaching `ds` (and no Google credentials of the test runner's).
fn at(sb: &Sandbox, ds: &DatastoreEmulator, args: &[&str]) -> Command {
    let mut cmd = sb.at(&ds.url(), args);
    cmd.env_remove("GOOGLE_APPLICATION_CREDENTIALS").envs(ds.env());
    cmd
}

/// An emulator, and a sandbox whose every command finds it (the shared helpers take only
/// a URL, and the emulator's address travels in the environment).
fn datastore() -> (DatastoreEmulator, Sandbox) {
    let ds = DatastoreEmulator::start();
    let sb = Sandbox::new().with_envs(ds.env());
    (ds, sb)
}

#[test]
fn twenty_contenders_one_winner() {
    let (ds, sb) = datastore();
    let script = r#"exec 9>>"$D/flock"; flock -n 9 || echo OVERLAP >> "$D/events"; echo "ran $LEADERRUN_FENCING_TOKEN" >> "$D/events"; sleep 2"#;
    let args = ["--lock", "twenty", "--", "sh", "-c", script];
    let runs: Vec<Wrapper> = (0..20).map(|i| sb.spawn(&format!("c{i}"), at(&sb, &ds, &args))).collect();
    for (i, run) in runs.into_iter().enumerate() {
        let out = run.finish(SOON);
        assert_eq!(out.status.code(), Some(0), "contender {i}: stderr {:?}", stderr_of(&out));
    }
    let events = sb.lines("events");
    assert_eq!(events.len(), 1, "exactly one of twenty runs: {events:?}");
    assert!(events[0].starts_with("ran "), "{events:?}");
}

#[test]
fn status_list_and_release() {
    let (ds, sb) = datastore();
    let url = format!("{}/team?kind=Job", ds.url());
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let mut cmd = sb.at(&url, &["--lock", "nightly", "--wait", "--", "sh", "-c", script]);
    cmd.envs(ds.env());
    let mut holder = sb.spawn("holder", cmd);
    sb.wait_pid("child.pid");
    let json = |args: &[&str]| -> (i32, Value) {
        let mut cmd = sb.at(&url, args);
        cmd.envs(ds.env());
        let out = sb.output(cmd);
        (out.status.code().unwrap_or(-1), serde_json::from_str(stdout_of(&out).trim()).unwrap_or(Value::Null))
    };
    let (code, status) = json(&["status", "--json", "--lock", "nightly"]);
    assert_eq!(code, 0, "held: {status}");
    assert!(status["fencing_token"].as_u64().is_some_and(|t| t > 0), "{status}");
    let (code, list) = json(&["list", "--json"]);
    assert_eq!(code, 0);
    let locks: Vec<&str> = list.as_array().unwrap().iter().filter_map(|l| l["lock"].as_str()).collect();
    assert_eq!(locks, ["nightly"], "{list}");
    // Another namespace sees nothing.
    let mut cmd = sb.at(&ds.url(), &["list", "--json"]);
    cmd.envs(ds.env());
    assert_eq!(stdout_of(&sb.output(cmd)).trim(), "[]");
    // `release` asks the holder to stand down: it stops its child and exits.
    let mut cmd = sb.at(&url, &["release", "--lock", "nightly"]);
    cmd.envs(ds.env());
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    holder.wait_status(SOON);
    let (code, status) = json(&["status", "--json", "--lock", "nightly"]);
    assert_eq!(code, 1, "free after the release: {status}");
}

#[test]
fn a_bad_url_or_a_reserved_lock_name_exits_2_before_connecting() {
    let sb = Sandbox::new();
    for (url, lock, needle) in [
        ("datastore://user:Sekr1tPass@project", "x", "GOOGLE_APPLICATION_CREDENTIALS"),
        ("datastore://project?knid=Lease", "x", "unknown parameter ?knid="),
        ("datastore://Project_1", "x", "not a project ID"),
        ("datastore://project", "__scatter__", "two underscores"),
    ] {
        // Nothing listens here: exit 2 comes before any connection.
        let mut cmd = sb.at(url, &["--lock", lock, "--", "true"]);
        cmd.env("DATASTORE_EMULATOR_HOST", "127.0.0.1:9");
        let out = sb.output(cmd);
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {err:?}");
        assert!(err.contains(needle) && !err.contains("Sekr1tPass") && err.lines().count() == 1, "{url}: {err:?}");
    }
    let mut cmd = sb.at("datastore://project", &["status", "--lock", "__x__"]);
    cmd.env("DATASTORE_EMULATOR_HOST", "127.0.0.1:9");
    assert_eq!(sb.output(cmd).status.code(), Some(2));
}

/// Credentials that cannot work (a service-account file whose key is not a key) are a
/// refusal, exit 69 in one line, and the file's secret never shows.
#[test]
fn unusable_credentials_exit_69_in_one_line_without_showing_them() {
    let sb = Sandbox::new();
    let secret = "PRIVATEKEYMATERIALxyz123";
    let file = sb.file("key.json");
    let key = serde_json::json!({
        "type": "service_account",
        "project_id": "project",
        "private_key_id": "0123456789abcdef",
        "private_key": format!("-----BEGIN PRIVATE KEY-----\n{secret}\n-----END PRIVATE KEY-----\n"),
        "client_email": "leaderrun@project.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "http://127.0.0.1:9/token",
    });
    fs::write(&file, key.to_string()).unwrap();
    for args in [&["--lock", "creds", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "creds"]] {
        let mut cmd = sb.at("datastore://project", args);
        cmd.env("GOOGLE_APPLICATION_CREDENTIALS", &file).env_remove("DATASTORE_EMULATOR_HOST");
        let out = sb.output(cmd);
        let (err, stdout) = (stderr_of(&out), stdout_of(&out));
        assert_eq!(out.status.code(), Some(69), "{args:?}: stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains("datastore://project"), "{err:?}");
        assert!(!err.contains(secret) && !stdout.contains(secret), "{err:?}");
    }
    assert!(!sb.exists("ran"), "nothing runs without the store");
}

/// Not even -vvv shows a credential: here the credentials file's key, which the emulator
/// never asks for, and whatever the HTTP client logs.
#[test]
fn debug_output_never_shows_a_secret() {
    let (ds, sb) = datastore();
    let secret = "PRIVATEKEYMATERIALabc789";
    let file = sb.file("key.json");
    fs::write(&file, format!(r#"{{"type":"service_account","private_key":"{secret}"}}"#)).unwrap();
    let mut cmd = at(&sb, &ds, &["-vvv", "--lock", "debug", "--", "true"]);
    cmd.env("GOOGLE_APPLICATION_CREDENTIALS", &file);
    let out = sb.output(cmd);
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "stderr {stderr:?}");
    assert!(stderr.lines().count() > 5, "-vvv shows debug lines: {stderr:?}");
    assert!(!stdout.contains(secret) && !stderr.contains(secret), "a credential leaked: {stderr}");
}
