//! End-to-end tests of the `leaderrun` binary against moto's S3 (one server per test): a cron
//! fleet, `--wait` handover, a kill -9 takeover after the client-timed observation, a holder
//! riding out an outage, and refusals.
//!
//! Each sandbox's HOME gets an ~/.aws/config (region, `endpoint_url`) and ~/.aws/credentials,
//! as a user of the AWS CLI has them, so every run finds its server there; the sandbox passes
//! no AWS_* variable of the test runner's on. Fencing tokens follow the server's clock
//! (seconds × 1,000,000), so they increase but do not start at 1.

mod common;
mod servers;

use std::fs;

use common::*;
use nix::sys::signal::Signal;
use servers::moto::{Moto, REGION};

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

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (moto, sb) = s3();
    assert_cron_fleet_runs_once(&sb, &moto.url());
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (moto, sb) = s3();
    assert_waiters_take_turns(&sb, &moto.url());
}

/// moto forgets everything when it stops; the test server replays its recording into the
/// restarted process (see tests/servers/moto.rs), as a durable S3 would have kept it.
#[test]
fn a_holder_rides_out_a_short_outage() {
    let (moto, sb) = s3();
    assert_holder_rides_out_an_outage(&sb, &moto.url(), || moto.stop(), || moto.start_again(), Some(moto.key().1));
}

/// S3 ends no lease: after a kill -9 the object stays as it was, and the standby takes it
/// once it has seen it unchanged for a whole lease (about ttl·1.02 + 100 ms on its clock).
/// The watchdog has stopped the first child by then.
#[test]
fn a_killed_holder_is_replaced_after_one_observation() {
    let (moto, sb) = s3();
    let url = moto.url();
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
fn a_wrong_secret_exits_69_in_one_line_without_showing_it() {
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
