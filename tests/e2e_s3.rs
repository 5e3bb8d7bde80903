//! End-to-end tests of the `leaderrun` binary against moto's S3 (one server per test): the
//! shared suite (tests/e2e/), where the AWS CLI's variables find the server, and what only
//! this store has: credentials from every source, refused or missing, named profiles, bad
//! URLs, and debug output that shows neither a secret nor a session token.
//!
//! Here each sandbox's HOME gets an ~/.aws/config (region, `endpoint_url`) and
//! ~/.aws/credentials, as a user of the AWS CLI has them; the sandbox passes no AWS_* variable
//! of the test runner's on. Fencing tokens follow the server's clock (seconds × 1,000,000), so
//! they increase but do not start at 1. moto forgets everything when it stops: the test server
//! replays its recording into the restarted process (see tests/servers/moto.rs), as a durable
//! S3 would have kept it.

mod common;
mod e2e;
mod servers;

use std::fs;

use common::*;
use e2e::Tokens;
use servers::moto::{Moto, REGION};

e2e_suite!(Moto, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "moto checks signatures only with IAM checks on, and then cannot restart \
         (a_wrong_secret_from_any_source_exits_69_in_one_line)",
    runs_over_mutual_tls: "moto is plain HTTP here",
});

/// Write the sandbox's ~/.aws for `moto`, signing with `secret`.
fn aws_files(sb: &Sandbox, moto: &Moto, secret: &str) {
    let dir = sb.file("home/.aws");
    fs::create_dir_all(&dir).unwrap();
    let config = format!("[default]\nregion = {REGION}\nendpoint_url = {}\n", moto.endpoint());
    fs::write(dir.join("config"), config).unwrap();
    let credentials = format!("[default]\naws_access_key_id = {}\naws_secret_access_key = {secret}\n", moto.key().0);
    fs::write(dir.join("credentials"), credentials).unwrap();
}

fn s3() -> (Moto, Sandbox) {
    let (moto, sb) = (Moto::start(), Sandbox::new());
    aws_files(&sb, &moto, moto.key().1);
    (moto, sb)
}

/// From ~/.aws/credentials, from the environment with a session token, and for a status.
#[test]
fn a_wrong_secret_from_any_source_exits_69_in_one_line() {
    let (moto, sb) = (Moto::start_with_iam(), Sandbox::new());
    let wrong = format!("{}Wrong", moto.key().1);
    let run = |cmd: std::process::Command| {
        let out = sb.output(cmd);
        let (err, stdout) = (stderr_of(&out), stdout_of(&out));
        assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        // 403 for a bad signature; AWS answers a session token it cannot read with 400 InvalidToken.
        assert!(
            err.contains("s3://leaderrun-test") && (err.contains("403") || err.contains("InvalidToken")),
            "{err:?}"
        );
        assert!(!err.contains(&wrong) && !stdout.contains(&wrong), "{err:?}");
        assert!(!sb.exists("ran"), "nothing runs without the store");
        err
    };
    let job = ["--lock", "secret", "--", "sh", "-c", r#"touch "$D/ran""#];
    // From ~/.aws/credentials.
    aws_files(&sb, &moto, &wrong);
    let err = run(sb.at(&moto.url(), &job));
    assert!(err.contains("PutObject"), "{err:?}");
    // From the environment, with a session token, and from a status.
    let mut cmd = sb.at(&moto.url(), &job);
    cmd.env("AWS_ACCESS_KEY_ID", moto.key().0)
        .env("AWS_SECRET_ACCESS_KEY", &wrong)
        .env("AWS_SESSION_TOKEN", "Sess10nT0ken");
    let err = run(cmd);
    assert!(!err.contains("Sess10nT0ken"), "{err:?}");
    let err = run(sb.at(&moto.url(), &["status", "--lock", "secret"]));
    assert!(err.contains("GetObject"), "{err:?}");
    // The right secret runs.
    aws_files(&sb, &moto, moto.key().1);
    let out = sb.output(sb.at(&moto.url(), &job));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    for (url, needle) in [
        ("s3://AKIAEXAMPLE:Sekr1tKey@bucket", "AWS_ACCESS_KEY_ID"),
        ("s3://bucket?regoin=eu-west-1", "unknown parameter ?regoin="),
        ("s3://b", "not a bucket name"),
    ] {
        let out = sb.output(sb.at(url, &["--lock", "x", "--", "true"]));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {err:?}");
        assert!(err.contains(needle) && !err.contains("Sekr1tKey") && err.lines().count() == 1, "{url}: {err:?}");
    }
}

#[test]
fn no_credentials_anywhere_exits_69_in_one_line() {
    let (moto, sb) = (Moto::start(), Sandbox::new());
    // No ~/.aws in the sandbox, no AWS_* variable but the endpoint; no instance metadata.
    let mut cmd = sb.at(&moto.url(), &["--lock", "nocreds", "--wait", "--", "sh", "-c", r#"touch "$D/ran""#]);
    cmd.env("AWS_ENDPOINT_URL", moto.endpoint()).env("AWS_REGION", REGION).env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "refused, even with --wait: {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("no credentials") && err.contains("AWS_ACCESS_KEY_ID"), "{err:?}");
    assert!(!sb.exists("ran"));
}

/// AWS_PROFILE picks a profile of ~/.aws/config and ~/.aws/credentials, as for the CLI.
#[test]
fn a_named_profile_is_used() {
    let (moto, sb) = s3();
    let dir = sb.file("home/.aws");
    let config = format!(
        "[default]\nregion = {REGION}\n[profile locks]\nregion = {REGION}\nendpoint_url = {}\n",
        moto.endpoint()
    );
    fs::write(dir.join("config"), config).unwrap();
    let credentials =
        format!("[locks]\naws_access_key_id = {}\naws_secret_access_key = {}\n", moto.key().0, moto.key().1);
    fs::write(dir.join("credentials"), credentials).unwrap();
    let job = ["--lock", "profile", "--", "sh", "-c", r#"touch "$D/ran""#];
    // Without it, the default profile has no keys (and there is no instance metadata): refused.
    let mut cmd = sb.at(&moto.url(), &job);
    cmd.env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(69), "stderr {:?}", stderr_of(&out));
    assert!(stderr_of(&out).contains("no credentials"), "stderr {:?}", stderr_of(&out));
    let mut cmd = sb.at(&moto.url(), &job);
    cmd.env("AWS_PROFILE", "locks").env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

/// Not even -vvv (which lets the AWS SDK's own debug lines through) shows a secret key or
/// a session token.
#[test]
fn debug_output_never_shows_the_secret_or_the_session_token() {
    let (moto, sb) = (Moto::start(), Sandbox::new());
    let mut cmd = sb.at(&moto.url(), &["-vvv", "--lock", "debug", "--", "true"]);
    let (secret, token) = ("TopSecretKeyValue123", "SessionTokenValue456");
    cmd.env("AWS_ENDPOINT_URL", moto.endpoint())
        .env("AWS_REGION", REGION)
        .env("AWS_ACCESS_KEY_ID", "AKIAVISIBLEID")
        .env("AWS_SECRET_ACCESS_KEY", secret)
        .env("AWS_SESSION_TOKEN", token)
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    let (stdout, stderr) = (stdout_of(&out), stderr_of(&out));
    assert_eq!(out.status.code(), Some(0), "stderr {stderr:?}");
    assert!(stderr.lines().count() > 20, "-vvv shows the SDK's debug lines: {stderr:?}");
    for shown in [&stdout, &stderr] {
        assert!(!shown.contains(secret) && !shown.contains(token), "a credential leaked: {shown}");
    }
}
