//! End-to-end tests of the `leaderrun` binary against a real ZooKeeper server (one per test):
//! the shared suite (tests/e2e/), and what only this store has: a password that guards the
//! root its first user creates, the server's session limits, and its URL's parameters.
//! Fencing tokens are sequence numbers + 1: they increase, but losers' attempts use numbers too.

mod common;
mod e2e;
mod servers;

use common::*;
use e2e::Tokens;
use servers::zookeeper::ZooKeeper;

e2e_suite!(ZooKeeper, tokens: Tokens::Rising, except {
    a_wrong_secret_exits_69_in_one_line_without_showing_it:
        "the server lets anyone in: a password guards the root its first user creates \
         (a_wrong_password_exits_69_without_showing_it)",
    verbose_output_never_shows_the_secret: "the server lets anyone in: no secret to hide",
});

#[test]
fn a_wrong_password_exits_69_without_showing_it() {
    let (zk, sb) = (ZooKeeper::start(), Sandbox::new());
    // The first run creates the root, readable and writable by its user only.
    let right = format!("zk://app:Right-Password-7@127.0.0.1:{}", zk.port());
    let first = sb.output(sb.at(&right, &["--lock", "pw", "--min-hold", "0s", "--", "true"]));
    assert_eq!(first.status.code(), Some(0), "stderr {:?}", stderr_of(&first));

    let wrong = right.replace("Right-Password-7", "Wrong-Password-42");
    let out = sb.output(sb.at(&wrong, &["--lock", "pw", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("app:***@") && err.contains("not authorized"), "{err:?}");
    assert!(!err.contains("Wrong-Password-42") && !stdout_of(&out).contains("Wrong-Password-42"), "{err:?}");
    assert!(!sb.exists("ran"), "nothing runs without the store");
}

#[test]
fn a_ttl_above_the_servers_longest_session_exits_69_in_one_line() {
    let (zk, sb) = (ZooKeeper::start_with_default_session_limits(), Sandbox::new());
    let url = format!("zk://app:Secret-Password-9@127.0.0.1:{}", zk.port());
    let out = sb.output(sb.at(&url, &["--lock", "long", "--ttl", "10s", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("maxSessionTimeout") && err.contains("app:***@"), "{err:?}");
    assert!(!err.contains("Secret-Password-9"), "{err:?}");
    assert!(!sb.exists("ran"), "nothing runs");
}

#[test]
fn without_a_ttl_the_longest_that_fits_the_servers_sessions_is_used() {
    // tickTime 500 ms: maxSessionTimeout is 10 s, too short for the default 15 s ttl's
    // session. With no --ttl given, the run picks one that fits and says so at -v.
    let (zk, sb) = (ZooKeeper::start_with_default_session_limits(), Sandbox::new());
    let url = format!("zk://app:Secret-Password-9@127.0.0.1:{}", zk.port());
    let out = sb.output(sb.at(&url, &["-v", "--lock", "fits", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(sb.exists("ran"), "the child ran");
    assert!(err.contains("using the longest that fits") && err.contains("ttl="), "-v says so: {err:?}");
    assert!(!err.contains("Secret-Password-9"), "{err:?}");
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    // Port 1 is closed: a URL checked only at open would exit 69 instead.
    for (url, needle) in [
        ("zk://app:Secret-Password-5@127.0.0.1:1?bogus=1", "?bogus="),
        ("zk://app:Secret-Password-5@127.0.0.1:1?tls=yes&cacert=/ca.pem", "?tls=yes"),
        ("zk://app:Secret-Password-5@127.0.0.1:1?tls=1", "cacert=FILE"),
    ] {
        for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"]] {
            let out = sb.output(sb.at(url, args));
            let err = stderr_of(&out);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}: stderr {err:?}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains(needle) && err.contains("app:***@127.0.0.1:1"), "{err:?}");
            assert!(!err.contains("Secret-Password-5"), "{err:?}");
        }
    }
    assert!(!sb.exists("ran"), "nothing runs");
}
