//! End-to-end tests of the `leaderrun` binary against fake-gcs-server (one server per
//! test): the shared suite (tests/e2e/), and what only this store has: twenty one-shot
//! contenders, a missing bucket, bad URLs, and a service-account key that never shows.
//!
//! Each sandbox passes `STORAGE_EMULATOR_HOST` to every command, as a user of Google's
//! client libraries sets it for an emulator (no credentials are then looked for). Fencing
//! tokens follow the server's clock (seconds × 1,000,000), so they increase but do not start
//! at 1. The server keeps its objects on disk, so they outlive its restarts.

mod common;
mod e2e;
mod servers;

use std::fs;

use common::*;
use e2e::Tokens;
use servers::fake_gcs::FakeGcs;
use servers::TestServer;

e2e_suite!(FakeGcs, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "the emulator lets anyone in; a key Google would refuse is in debug_output_never_shows_the_key_or_the_token",
    verbose_output_never_shows_the_secret: "the emulator lets anyone in: no secret to hide",
    runs_over_mutual_tls: "the emulator is plain HTTP here",
});

fn gcs() -> (FakeGcs, Sandbox) {
    let gcs = FakeGcs::start();
    let sb = Sandbox::new().with_envs(gcs.env());
    (gcs, sb)
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
