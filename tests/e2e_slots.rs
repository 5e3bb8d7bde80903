//! `--slots N` through the binary on SQLite (the server stores run the same checks in their
//! own e2e files): a semaphore of three, a waiter taking the slot that frees, runs with
//! different counts on one lock, and bad counts refused before the store is touched.

mod common;

use common::slots::*;
use common::*;

#[test]
fn three_slots_three_children_and_status_list_release_show_each() {
    let sb = Sandbox::new();
    assert_a_semaphore_of_three(&sb, &sb.store_url());
}

#[test]
fn a_waiting_run_takes_the_slot_that_frees() {
    let sb = Sandbox::new();
    assert_a_waiter_takes_the_slot_that_frees(&sb, &sb.store_url());
}

#[test]
fn runs_with_different_counts_never_exceed_the_largest() {
    let sb = Sandbox::new();
    assert_mixed_counts_never_exceed_the_largest(&sb, &sb.store_url());
}

#[test]
fn a_plain_lock_is_slot_0_and_its_child_learns_it() {
    let sb = Sandbox::new();
    let out = sb.output(sb.cmd(&["--lock", "plain", "--", "sh", "-c", r#"echo "$LEADERRUN_SLOT" > "$D/slot""#]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(sb.read("slot").trim(), "0");
    // status of a lock that never had slots keeps its one object.
    let (code, status) = sb.status_json("plain");
    assert_eq!((code, status.is_object(), status.get("slot")), (0, true, None), "kept for --min-hold: {status}");
}

#[test]
fn bad_slot_counts_are_bad_usage_before_the_store_is_touched() {
    let sb = Sandbox::new();
    let long = "x".repeat(253);
    for args in [
        vec!["--lock", "bad", "--slots", "0"],
        vec!["--lock", "bad", "--slots", "101"],
        vec!["--lock", "bad", "--slots", "two"],
        vec!["--lock", long.as_str(), "--slots", "2"],
    ] {
        let mut all = args.clone();
        all.extend_from_slice(&["--", "true"]);
        let out = sb.output(sb.cmd(&all));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr_of(&out));
        assert!(stderr_of(&out).contains("--slots"), "{args:?}: {}", stderr_of(&out));
    }
    let out = sb.output(sb.sub("status", &["--lock", "bad", "--slot", "100"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr_of(&out));
    assert!(!sb.store_path().exists(), "nothing written");
}
