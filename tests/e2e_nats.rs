//! End-to-end tests of the `leaderrun` binary against a real NATS server with JetStream (one
//! per test): the shared suite (tests/e2e/), and what only this store has: Choria's buckets
//! (its evict, its max age, its leaders seen by status and release) and its URL's parameters.
//! Fencing tokens are stream sequences: they increase, but do not start at 1.

mod common;
mod e2e;
mod servers;

use std::time::Duration;

use common::*;
use e2e::Tokens;
use servers::nats::Nats;

e2e_suite!(Nats, tokens: Tokens::Rising);

#[test]
fn deleting_the_key_choria_style_stops_the_holder() {
    let (nats, sb) = (Nats::start(), Sandbox::new());
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kv = runtime.block_on(nats.choria_bucket_with_max_age(Duration::from_secs(4)));
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "my_app", "--wait", "--ttl", "3s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(&url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let value = runtime.block_on(kv.get("my_app")).unwrap().expect("the key is there");
    assert!(String::from_utf8_lossy(&value).contains(&holder.pid().to_string()), "the holder's identity: {value:?}");

    // Choria's evict.
    runtime.block_on(kv.delete("my_app")).unwrap();
    assert_eq!(holder.wait_code(WITHIN_A_LEASE), 75, "the lease is lost; stderr {:?}", holder.stderr());
    assert!(!pid_alive(child), "the child must be stopped");
    assert!(holder.stderr().contains("freed"), "says why: {:?}", holder.stderr());
    assert!(!holder.stderr().contains(nats.password()), "{:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
}

#[test]
fn a_ttl_or_min_hold_that_does_not_fit_a_choria_bucket_exits_2_in_one_line() {
    let (nats, sb) = (Nats::start(), Sandbox::new());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kv = runtime.block_on(nats.choria_bucket_with_max_age(Duration::from_secs(6)));
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    for (args, needles) in [
        (&["--ttl", "2m"][..], &["--ttl 2m", "CHORIA_LEADER_ELECTION", "use a --ttl of 4s 700ms or less"][..]),
        (&["--ttl", "6s"][..], &["--ttl 6s", "every 4s 500ms", "use a --ttl of 4s 700ms or less"][..]),
        (&["--min-hold", "1m"][..], &["--min-hold 1m", "max age", "use --min-hold 6s or less"][..]),
    ] {
        let run = [&["--lock", "my_app"], args, &["--", "sh", "-c", r#"touch "$D/ran""#]].concat();
        let out = sb.output(sb.at(&url, &run));
        let err = stderr_of(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: stderr {err:?}");
        assert_eq!(err.lines().count(), 1, "one line: {err:?}");
        assert!(needles.iter().all(|n| err.contains(n)), "{needles:?} in {err:?}");
        assert!(!err.contains(nats.password()), "{err:?}");
    }
    assert!(!sb.exists("ran"), "nothing runs");
    assert!(runtime.block_on(kv.get("my_app")).unwrap().is_none(), "nothing was written");
}

#[test]
fn status_and_release_of_a_choria_leader_say_what_is_known() {
    let (nats, sb) = (Nats::start(), Sandbox::new());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let kv = runtime.block_on(nats.choria_bucket_with_max_age(Duration::from_secs(6)));
    runtime.block_on(kv.create("my_app", "choria-leader".into())).unwrap();
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    let out = sb.output(sb.at(&url, &["status", "--lock", "my_app"]));
    let text = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{text:?} {:?}", stderr_of(&out));
    assert!(text.contains("holder:      choria-leader") && text.contains("renewed at:"), "{text}");
    assert!(!text.contains("held since") && text.contains("renewing every 4s 500ms"), "{text}");
    let (_, json) = status_json(&sb, &url, "my_app");
    assert!(json["held_since"].is_null() && json["renewed_at"].is_string(), "{json}");

    let out = sb.output(sb.at(&url, &["release", "--lock", "my_app"]));
    let text = stdout_of(&out);
    assert_eq!(out.status.code(), Some(0), "{text:?} {:?}", stderr_of(&out));
    assert!(text.contains("Choria leader") && text.contains("within 4s 500ms"), "{text}");
    // Its next update fails: that is how a Choria leader learns of it.
    let revision = runtime.block_on(kv.entry("my_app")).unwrap().unwrap().revision;
    assert!(runtime.block_on(kv.update("my_app", "choria-leader".into(), revision - 1)).is_err());
}

#[test]
fn without_a_ttl_the_longest_that_fits_the_buckets_max_age_is_used() {
    // A Choria bucket whose max age (8 s) is shorter than the default 15 s ttl: with no
    // --ttl given, the run picks one that fits and says so at -v.
    let (nats, sb) = (Nats::start(), Sandbox::new());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(nats.choria_bucket_with_max_age(Duration::from_secs(8)));
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    let out = sb.output(sb.at(&url, &["-v", "--lock", "my_app", "--", "sh", "-c", r#"touch "$D/ran""#]));
    let err = stderr_of(&out);
    assert_eq!(out.status.code(), Some(0), "stderr {err:?}");
    assert!(sb.exists("ran"), "the child ran");
    // One Choria interval (6 s) + 200 ms; the one-shot --min-hold (10 s) capped to the max age.
    assert!(err.contains("using the longest that fits") && err.contains("ttl=6s 200ms"), "-v says so: {err:?}");
    assert!(err.contains("min_hold=8s"), "-v says so: {err:?}");
}

#[test]
fn a_bad_url_exits_2_before_connecting() {
    let sb = Sandbox::new();
    // Port 1 is closed: a URL checked only at open would exit 69 instead.
    for (url, needle) in [
        ("nats://u:Secret-Password-5@127.0.0.1:1?replicas=0", "?replicas=0"),
        ("nats://Secret-Token-5@127.0.0.1:1?tls=on", "?tls=on"),
        ("nats://u:Secret-Password-5@127.0.0.1:1?tlsca=/ca.pem&bogus=1", "?bogus="),
    ] {
        for args in [&["--lock", "x", "--", "sh", "-c", r#"touch "$D/ran""#][..], &["status", "--lock", "x"]] {
            let out = sb.output(sb.at(url, args));
            let err = stderr_of(&out);
            assert_eq!(out.status.code(), Some(2), "{url} {args:?}: stderr {err:?}");
            assert_eq!(err.lines().count(), 1, "one line: {err:?}");
            assert!(err.contains(needle) && err.contains("***@127.0.0.1:1"), "{err:?}");
            assert!(!err.contains("Secret-"), "{err:?}");
        }
    }
    assert!(!sb.exists("ran"), "nothing runs");
}
