//! End-to-end tests of the `leaderrun` binary against moto's DynamoDB (one server per test): the
//! shared suite (tests/e2e/), where the AWS CLI's variables find the server, and what only this
//! store has: `leaderrun init` and its missing-table message, a wrong secret on a server that
//! checks signatures, bad URLs, missing credentials or region, and debug output that shows
//! neither a secret nor a session token.
//!
//! Here each sandbox's HOME gets an ~/.aws/config (region, `endpoint_url`) and ~/.aws/credentials,
//! as a user of the AWS CLI has them, so every run finds its server there; the sandbox passes
//! no AWS_* variable of the test runner's on. Fencing tokens follow the server's clock
//! (seconds × 1,000,000), so they increase but do not start at 1.

mod common;
mod e2e;
mod servers;

use std::fs;

use common::*;
use e2e::Tokens;
use servers::moto::REGION;
use servers::moto_dynamodb::MotoDynamo;

e2e_suite!(MotoDynamo, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "moto checks signatures only with IAM checks on, and then cannot restart: this file's own \
         test of the same name runs on such a server",
    runs_over_mutual_tls: "moto is plain HTTP here",
});

/// Write the sandbox's ~/.aws for `server`, signing with `secret`.
fn aws_files(sb: &Sandbox, server: &MotoDynamo, secret: &str) {
    let dir = sb.file("home/.aws");
    fs::create_dir_all(&dir).unwrap();
    let config = format!("[default]\nregion = {REGION}\nendpoint_url = {}\n", server.endpoint());
    fs::write(dir.join("config"), config).unwrap();
    let credentials = format!("[default]\naws_access_key_id = {}\naws_secret_access_key = {secret}\n", server.key().0);
    fs::write(dir.join("credentials"), credentials).unwrap();
}

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

/// `leaderrun release` is the way to make a holder stand down (deleting the lock's item is
/// not: a standby could start beside the running child). A `--wait` standby starts its child
/// only after the released holder's child has stopped, and the holder exits 75.
#[test]
fn release_stops_the_holder_before_a_standby_starts() {
    let f = e2e::Fixture::<MotoDynamo>::start(Tokens::Rising);
    let timing = f.short_timing();
    let timing: Vec<&str> = timing.iter().map(String::as_str).collect();
    let a = r#"trap 'echo "a stopped" >> "$D/log"; exit 0' TERM; echo "a started" >> "$D/log"; while :; do sleep 0.1; done"#;
    let args = [&["--lock", "job", "--wait"][..], &timing, &["--", "sh", "-c", a]].concat();
    let mut holder = f.sb.spawn("holder", f.at(&args));
    wait_for(|| f.sb.read("log").contains("a started"), SOON, "the holder's child");
    let b = r#"echo "b started" >> "$D/log""#;
    let args = [&["-vv", "--lock", "job", "--wait"][..], &timing, &["--", "sh", "-c", b]].concat();
    let mut standby = f.sb.spawn("standby", f.at(&args));
    wait_for(|| standby.stderr().contains("lock is held"), SOON, "the standby to wait");
    let out = f.sb.output(f.at(&["release", "--lock", "job"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "a released holder");
    assert_eq!(standby.wait_code(WITHIN_A_LEASE), 0, "the standby's turn");
    assert_eq!(f.sb.lines("log"), ["a started", "a stopped", "b started"], "never both at once");
}
