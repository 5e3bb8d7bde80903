//! End-to-end tests of the `leaderrun` binary against moto's DynamoDB (one server per test): a
//! cron fleet, `--wait` handover, a kill -9 takeover after the client-timed observation, a
//! holder riding out an outage, status/list/release, `leaderrun init`, and refusals.
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
use servers::moto::REGION;
use servers::moto_dynamodb::MotoDynamo;

/// Write the sandbox's ~/.aws for `server`, signing with `secret`.
fn aws_files(sb: &Sandbox, server: &MotoDynamo, secret: &str) {
    let dir = sb.file("home/.aws");
    fs::create_dir_all(&dir).unwrap();
    let config = format!("[default]\nregion = {REGION}\nendpoint_url = {}\n", server.endpoint());
    fs::write(dir.join("config"), config).unwrap();
    let credentials = format!("[default]\naws_access_key_id = {}\naws_secret_access_key = {secret}\n", server.key().0);
    fs::write(dir.join("credentials"), credentials).unwrap();
}

fn dynamo() -> (MotoDynamo, Sandbox) {
    let (server, sb) = (MotoDynamo::start(), Sandbox::new());
    aws_files(&sb, &server, server.key().1);
    (server, sb)
}

#[test]
fn cron_fleet_runs_each_firing_exactly_once() {
    let (server, sb) = dynamo();
    assert_cron_fleet_runs_once(&sb, &server.url());
}

#[test]
fn wait_handover_runs_every_waiter_once_in_turn() {
    let (server, sb) = dynamo();
    assert_waiters_take_turns(&sb, &server.url());
}

/// moto forgets everything when it stops; the test server replays its recording into the
/// restarted process (see tests/servers/moto.rs), as DynamoDB would have kept it.
#[test]
fn a_holder_rides_out_a_short_outage() {
    let (server, sb) = dynamo();
    assert_holder_rides_out_an_outage(
        &sb,
        &server.url(),
        || server.stop(),
        || server.start_again(),
        Some(server.key().1),
    );
}

/// DynamoDB ends no lease: after a kill -9 the item stays as it was, and the standby takes it
/// once it has seen it unchanged for a whole lease (about ttl·1.02 + 100 ms on its clock).
/// The watchdog has stopped the first child by then.
#[test]
fn a_killed_holder_is_replaced_after_one_observation() {
    let (server, sb) = dynamo();
    let url = server.url();
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
    let (server, sb) = dynamo();
    let url = server.url();
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

/// `init --print` shows the AWS CLI command and touches nothing; until the table exists, a
/// run and a status exit 69 naming `leaderrun init`; `init` makes it, and the run then runs.
#[test]
fn init_prints_or_creates_the_table_and_a_missing_table_names_it() {
    let (server, sb) = (MotoDynamo::start_empty(), Sandbox::new());
    aws_files(&sb, &server, server.key().1);
    let url = "dynamodb://team-locks";
    for print in ["--print", "--print-sql"] {
        let out = sb.output(sb.at(url, &["init", print]));
        assert_eq!(code_of(out.status, "init --print"), 0, "{}", stderr_of(&out));
        let text = stdout_of(&out);
        assert!(text.starts_with("aws dynamodb create-table --table-name team-locks \\\n"), "{text}");
        assert!(text.contains("--key-schema AttributeName=key,KeyType=HASH"), "{text}");
        assert!(text.contains("--billing-mode PAY_PER_REQUEST"), "{text}");
    }
    let job = ["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#];
    for args in [&job[..], &["status", "--lock", "x"][..], &["list"][..]] {
        let out = sb.output(sb.at(url, args));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(69), "{args:?}: {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(
            err.contains("does not exist") && err.contains("leaderrun init --store dynamodb://team-locks"),
            "{err:?}"
        );
    }
    assert!(!sb.exists("ran"));
    let out = sb.output(sb.at(url, &["init"]));
    assert_eq!(code_of(out.status, "init"), 0, "{}", stderr_of(&out));
    assert!(stdout_of(&out).contains("the store is ready: dynamodb://team-locks"), "{}", stdout_of(&out));
    let out = sb.output(sb.at(url, &job));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

#[test]
fn a_wrong_secret_exits_69_in_one_line_without_showing_it() {
    let (server, sb) = (MotoDynamo::start_with_iam(), Sandbox::new());
    let wrong = format!("{}Wrong", server.key().1);
    let run = |cmd: std::process::Command| {
        let out = sb.output(cmd);
        let (err, stdout) = (stderr_of(&out), stdout_of(&out));
        assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(err.contains("dynamodb://leaderrun-test") && err.contains("DescribeTable"), "{err:?}");
        assert!(!err.contains(&wrong) && !stdout.contains(&wrong), "{err:?}");
        assert!(!sb.exists("ran"), "nothing runs without the store");
        err
    };
    let job = ["--lock", "secret", "--", "sh", "-c", r#"touch "$D/ran""#];
    // From ~/.aws/credentials.
    aws_files(&sb, &server, &wrong);
    run(sb.at(&server.url(), &job));
    // From the environment, with a session token, and from a status.
    let mut cmd = sb.at(&server.url(), &job);
    cmd.env("AWS_ACCESS_KEY_ID", server.key().0)
        .env("AWS_SECRET_ACCESS_KEY", &wrong)
        .env("AWS_SESSION_TOKEN", "Sess10nT0ken");
    let err = run(cmd);
    assert!(!err.contains("Sess10nT0ken"), "{err:?}");
    run(sb.at(&server.url(), &["status", "--lock", "secret"]));
    // The right secret runs.
    aws_files(&sb, &server, server.key().1);
    let out = sb.output(sb.at(&server.url(), &job));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    for (url, needle) in [
        ("dynamodb://AKIAEXAMPLE:Sekr1tKey@locks", "AWS_ACCESS_KEY_ID"),
        ("dynamodb://locks?regoin=eu-west-1", "unknown parameter ?regoin="),
        ("dynamodb://ab", "not a table name"),
    ] {
        let out = sb.output(sb.at(url, &["--lock", "x", "--", "true"]));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{url}: {err:?}");
        assert!(err.contains(needle) && !err.contains("Sekr1tKey") && err.lines().count() == 1, "{url}: {err:?}");
    }
}

#[test]
fn no_credentials_or_no_region_exits_69_in_one_line() {
    let (server, sb) = (MotoDynamo::start(), Sandbox::new());
    // No ~/.aws in the sandbox, no AWS_* variable but the endpoint; no instance metadata.
    let job = ["--lock", "nocreds", "--wait", "--", "sh", "-c", r#"touch "$D/ran""#];
    let mut cmd = sb.at(&server.url(), &job);
    cmd.env("AWS_ENDPOINT_URL", server.endpoint()).env("AWS_REGION", REGION).env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "refused, even with --wait: {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("no credentials") && err.contains("AWS_ACCESS_KEY_ID"), "{err:?}");
    // Keys but no region anywhere: refused as the AWS CLI refuses it.
    let mut cmd = sb.at(&server.url(), &job);
    cmd.env("AWS_ENDPOINT_URL", server.endpoint())
        .env("AWS_ACCESS_KEY_ID", server.key().0)
        .env("AWS_SECRET_ACCESS_KEY", server.key().1)
        .env("AWS_EC2_METADATA_DISABLED", "true");
    let out = sb.output(cmd);
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "{err:?}");
    assert!(err.contains("no region") && err.contains("AWS_REGION") && err.lines().count() == 1, "{err:?}");
    assert!(!sb.exists("ran"));
}

/// Not even -vvv (which lets the AWS SDK's own debug lines through) shows a secret key or
/// a session token.
#[test]
fn debug_output_never_shows_the_secret_or_the_session_token() {
    let (server, sb) = (MotoDynamo::start(), Sandbox::new());
    let mut cmd = sb.at(&server.url(), &["-vvv", "--lock", "debug", "--", "true"]);
    let (secret, token) = ("TopSecretKeyValue123", "SessionTokenValue456");
    cmd.env("AWS_ENDPOINT_URL", server.endpoint())
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
