//! End-to-end tests of the `leaderrun` binary against a real Redis server (one per test):
//! the shared suite (tests/e2e/), and what only this store has: its URL's parameters, a
//! server that may evict keys, and `watch` through an outage.

mod common;
mod e2e;
mod servers;

use common::*;
use e2e::Tokens;
use nix::sys::signal::Signal;
use servers::redis::Redis;

e2e_suite!(Redis, tokens: Tokens::FromOne);

#[test]
fn an_unknown_url_parameter_is_bad_usage_before_anything_connects() {
    let sb = Sandbox::new();
    // Port 1 is closed: a connection attempt would end in 69, not 2.
    let url = "redis://:Hunter2-Secret@127.0.0.1:1/?bogus=1";
    let out = sb.output(sb.at(url, &["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(2), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("?bogus=") && err.contains("known: prefix"), "{err:?}");
    assert!(!err.contains("Hunter2-Secret"), "{err:?}");
    assert!(!sb.exists("ran"));
}

/// A server that may evict keys is refused before the child starts, as a store that will
/// not do (69), and for good: `--wait` does not retry it. `?allow-eviction=1` runs.
#[test]
fn a_server_that_may_evict_exits_69_in_one_line_even_when_waiting() {
    let (redis, sb) = (Redis::start_configured(&["--maxmemory-policy", "allkeys-lru"]), Sandbox::new());
    let child = ["sh", "-c", r#"touch "$D/ran""#];
    let out = sb.output(sb.at(&redis.url(), &[&["--lock", "evicting", "--wait", "--"][..], &child].concat()));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(69), "stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.contains("maxmemory-policy is allkeys-lru") && err.contains("noeviction"), "{err:?}");
    assert!(!err.contains(redis.password()), "{err:?}");
    assert!(!sb.exists("ran"), "nothing runs on a server that may evict the lease");

    let accepted = format!("{}?allow-eviction=1", redis.url());
    let out = sb.output(sb.at(&accepted, &[&["--lock", "evicting", "--"][..], &child].concat()));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(sb.exists("ran"));
}

/// `leaderrun watch` against a real server: a change is seen; a server that goes away is
/// said once (without the password), and so is its return; the watch goes on and sees the
/// next change, and ends with 0 on SIGTERM.
#[test]
fn watch_says_once_that_the_server_went_away_and_once_that_it_is_back() {
    let (redis, sb) = (Redis::start(), Sandbox::new());
    let mut watch = sb.spawn("watch", sb.at(&redis.url(), &["watch", "--lock", "watched"]));
    let lines = |sb: &Sandbox| sb.lines("watch.out");
    wait_for(|| lines(&sb).len() == 1, SOON * 3, "the first state");
    // Changes that last until the next read: a lease kept for --min-hold, then freed.
    let out = sb.output(sb.at(&redis.url(), &["--lock", "watched", "--min-hold", "10m", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    wait_for(|| lines(&sb).iter().any(|l| l.contains(" kept ")), SOON * 3, "the keep");
    assert!(lines(&sb).iter().any(|l| l.contains(" acquired ")), "{:?}", lines(&sb));
    assert_eq!(sb.output(sb.at(&redis.url(), &["release", "--lock", "watched"])).status.code(), Some(0));
    wait_for(|| lines(&sb).iter().any(|l| l.contains(" released ")), SOON * 3, "the release");
    redis.stop();
    wait_for(|| watch.stderr().contains("cannot reach the store"), SOON * 3, "the outage said");
    redis.start_again();
    wait_for(|| watch.stderr().contains("the store answers again"), SOON * 3, "the return said");
    let out = sb.output(sb.at(&redis.url(), &["--lock", "watched", "--min-hold", "10m", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    wait_for(|| lines(&sb).iter().filter(|l| l.contains(" kept ")).count() == 2, SOON * 3, "the next change");
    watch.signal(Signal::SIGTERM);
    assert_eq!(watch.wait_code(SOON * 3), 0);
    let err = watch.stderr();
    assert_eq!(err.matches("cannot reach the store").count(), 1, "said once: {err:?}");
    assert_eq!(err.matches("the store answers again").count(), 1, "said once: {err:?}");
    assert!(!err.contains(redis.password()), "{err:?}");
}
