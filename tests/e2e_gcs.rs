//! End-to-end tests of the `leaderrun` binary against fake-gcs-server (one server per
//! test): a cron fleet, `--wait` handover, twenty contenders, a kill -9 takeover after the
//! client-timed observation, a holder riding out an outage, and refusals.
//!
//! Each sandbox passes `STORAGE_EMULATOR_HOST` to every command, as a user of Google's
//! client libraries sets it for an emulator (no credentials are then looked for). Fencing
//! tokens follow the server's clock (seconds × 1,000,000), so they increase but do not start
//! at 1.

mod common;
mod servers;

use std::fs;

use common::*;
use nix::sys::signal::Signal;
use servers::fake_gcs::FakeGcs;

fn gcs() -> (FakeGcs, Sandbox) {
    let gcs = FakeGcs::start();
    let sb = Sandbox::new().with_env("STORAGE_EMULATOR_HOST", &gcs.endpoint());
    (gcs, sb)
}

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (gcs, sb) = gcs();
    assert_cron_fleet_runs_once(&sb, &gcs.url());
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (gcs, sb) = gcs();
    assert_waiters_take_turns(&sb, &gcs.url());
}

/// Twenty one-shot contenders at once: exactly one runs its child, the others exit 0
/// having run nothing.
#[test]
fn of_twenty_contenders_exactly_one_runs() {
    let (gcs, sb) = gcs();
    let args = ["--lock", "twenty", "--", "sh", "-c", r#"echo "ran $LEADERRUN_FENCING_TOKEN" >> "$D/runs"; sleep 2"#];
    let running: Vec<Wrapper> = (0..20).map(|i| sb.spawn(&format!("c-{i}"), sb.at(&gcs.url(), &args))).collect();
    for mut run in running {
        assert_eq!(run.wait_code(WITHIN_A_LEASE), 0, "stderr {:?}", run.stderr());
    }
    assert_eq!(sb.lines("runs").len(), 1, "exactly one child: {:?}", sb.lines("runs"));
}

/// The server is stopped and started again; its objects are on disk.
#[test]
fn a_holder_rides_out_a_short_outage() {
    let (gcs, sb) = gcs();
    assert_holder_rides_out_an_outage(&sb, &gcs.url(), || gcs.stop(), || gcs.start_again(), None);
}

/// Cloud Storage ends no lease: after a kill -9 the object stays as it was, and the standby
/// takes it once it has seen it unchanged for a whole lease. The watchdog has stopped the
/// first child by then.
#[test]
fn a_killed_holder_is_replaced_after_one_observation() {
    let (gcs, sb) = gcs();
    let url = gcs.url();
    // Each child holds a file lock for its whole life, so two children at once are caught.
    let script = r#"exec 9>>"$D/flock"; flock -n 9 || echo "OVERLAP" >> "$D/events"
echo "start $LEADERRUN_FENCING_TOKEN" >> "$D/events"; exec sleep 1000"#;
    let timing = ["--ttl", "3s", "--renew-every", "500ms", "--kill-after", "500ms"];
    let args = [&["--lock", "worker", "--wait"][..], &timing, &["--", "sh", "-c", script]].concat();
    let first = sb.spawn("first", sb.at(&url, &args));
    wait_for(|| sb.lines("events").len() == 1, SOON, "the first child");
    let mut standby = sb.spawn("standby", sb.at(&url, &args));

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
fn status_list_and_release_see_the_holder() {
    let (gcs, sb) = gcs();
    let url = gcs.url();
    let args = ["--lock", "job", "--wait", "--", "sh", "-c", r#"touch "$D/started"; exec sleep 1000"#];
    let mut holder = sb.spawn("holder", sb.at(&url, &args));
    wait_for(|| sb.exists("started"), SOON, "the child");
    let (code, status) = status_json(&sb, &url, "job");
    assert_eq!(code, 0, "held: {status}");
    let out = sb.output(sb.at(&url, &["list", "--json"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(stdout_of(&out).contains("\"job\""), "{}", stdout_of(&out));
    let out = sb.output(sb.at(&url, &["release", "--lock", "job"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    // The holder sees the revocation at its next renewal and stops its child.
    let code = holder.wait_code(WITHIN_A_LEASE);
    assert_ne!(code, 0, "a revoked holder does not exit 0; stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_missing_bucket_exits_69_in_one_line() {
    let (gcs, sb) = gcs();
    for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"][..]] {
        let out = sb.output(sb.at("gs://no-such-bucket", args));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains("gs://no-such-bucket") && err.contains("bucket does not exist"), "{err:?}");
    }
    assert!(!sb.exists("ran"));
    drop(gcs);
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    for (url, needle) in [
        ("gs://someone:Sekr1tKey@bucket", "GOOGLE_APPLICATION_CREDENTIALS"),
        ("gs://bucket?project=p", "unknown parameter ?project="),
        ("gs://b", "not a Cloud Storage bucket name"),
        ("gs://Bucket", "not a Cloud Storage bucket name"),
    ] {
        let out = sb.output(sb.at(url, &["--lock", "x", "--", "true"]));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {err:?}");
        assert!(err.contains(needle) && !err.contains("Sekr1tKey") && err.lines().count() == 1, "{url}: {err:?}");
    }
}

/// A service-account key that Google would not accept: a run is refused or finds the store
/// unavailable (Google's endpoint is not reachable from the tests, or answers 401), in one
/// line (exit 69); not even -vvv shows the key or the access token signed with it.
#[test]
fn debug_output_never_shows_the_key_or_the_token() {
    let sb = Sandbox::new();
    let key_file = sb.file("key.pem");
    let made = std::process::Command::new("openssl")
        .args(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out"])
        .arg(&key_file)
        .output()
        .expect("run openssl to make a throw-away key");
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let pem = fs::read_to_string(&key_file).unwrap();
    let account = serde_json::json!({
        "type": "service_account",
        "project_id": "leaderrun-test",
        "private_key_id": "0123456789abcdef0123456789abcdef01234567",
        "private_key": pem,
        "client_email": "leaderrun@leaderrun-test.iam.gserviceaccount.com",
        "client_id": "123456789012345678901",
        "token_uri": "http://127.0.0.1:9/token",
    });
    let credentials = sb.file("sa.json");
    fs::write(&credentials, account.to_string()).unwrap();
    let sb = sb.with_env("GOOGLE_APPLICATION_CREDENTIALS", credentials.to_str().unwrap());
    let out =
        sb.output(sb.at("gs://leaderrun-test", &["-vvv", "--lock", "debug", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(69), "stderr {stderr:?}");
    assert!(!sb.exists("ran"));
    let key_body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    for shown in [&stdout, &stderr] {
        for line in key_body.as_bytes().chunks(32).map(|c| String::from_utf8_lossy(c).into_owned()) {
            assert!(!shown.contains(&line), "a piece of the key leaked: {shown}");
        }
        // A JWT (the self-signed access token) starts with base64 of `{"`.
        assert!(!shown.contains("eyJ") && !shown.to_ascii_lowercase().contains("bearer"), "a token leaked: {shown}");
    }
    let last = stderr.lines().last().unwrap_or_default();
    assert!(last.contains("gs://leaderrun-test"), "the error names the bucket: {stderr:?}");
}
