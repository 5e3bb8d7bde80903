//! End-to-end tests of how `--wait` runs on the embedded store wait: queued in the kernel
//! on a file beside the database (`locks.db-wake`), with no store requests while idle.
//! Waits are on events with generous bounds; nothing asserts that something was fast.

#![cfg(feature = "sqlite")]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::*;
use nix::sys::signal::Signal;

/// A child that records its start and then runs until killed.
const HOLD: &str = r#"echo $$ > "$D/$NAME.tmp"; mv "$D/$NAME.tmp" "$D/$NAME.pid"; exec sleep 1000"#;

fn holding(sb: &Sandbox, name: &str, args: &[&str]) -> Wrapper {
    let mut cmd = sb.cmd(&[args, &["--", "sh", "-c", HOLD]].concat());
    cmd.env("NAME", name);
    sb.spawn(name, cmd)
}

fn requests(text: &str) -> usize {
    text.matches("store request").count()
}

/// An idle standby behind a live holder sends the store nothing: it is blocked in the
/// kernel until the holder releases, and then takes over at once (a lease of a minute
/// cannot have lapsed meanwhile).
#[test]
fn an_idle_standby_sends_nothing_and_wakes_on_release() {
    let sb = Sandbox::new();
    let lease = ["--lock", "idle", "--wait", "--ttl", "60s", "--renew-every", "20s"];
    let mut holder = holding(&sb, "holder", &lease);
    sb.wait_pid("holder.pid");
    let standby = holding(&sb, "standby", &[&lease[..], &["-vvv"]].concat());
    wait_for(|| standby.stderr().contains("waiting"), SOON, "the standby to wait");
    // Whatever the standby sends from now on, a second later: one read of the wake-up file's
    // head at most, while a poller would have sent dozens.
    std::thread::sleep(Duration::from_millis(200));
    let settled = requests(&standby.stderr());
    std::thread::sleep(Duration::from_secs(2));
    let idle = requests(&standby.stderr()) - settled;
    assert_eq!(idle, 0, "store requests by an idle standby: {}", standby.stderr());
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15);
    sb.wait_pid("standby.pid");
}

/// The wake-up file gets the database's permissions (not the umask's), so every user who
/// may write the database may queue.
#[test]
fn the_wake_up_file_has_the_databases_mode() {
    let sb = Sandbox::new();
    let once = |mode: u32| {
        let out = sb.output(sb.cmd(&["--lock", "mode", "--min-hold", "0s", "--", "true"]));
        assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
        let db = std::fs::metadata(sb.store_path()).unwrap().permissions().mode() & 0o777;
        let wake = std::fs::metadata(sb.file("locks.db-wake")).expect("the wake-up file").permissions().mode() & 0o777;
        assert_eq!((db, wake), (mode, mode));
    };
    sb.output(sb.sub("init", &[]));
    std::fs::set_permissions(sb.store_path(), std::fs::Permissions::from_mode(0o664)).unwrap();
    once(0o664);
    std::fs::remove_file(sb.file("locks.db-wake")).unwrap();
    std::fs::set_permissions(sb.store_path(), std::fs::Permissions::from_mode(0o600)).unwrap();
    once(0o600);
}

/// A waiter whose --timeout runs out leaves the queue; the one behind it still takes over
/// at the release.
#[test]
fn a_waiter_that_times_out_leaves_the_queue() {
    let sb = Sandbox::new();
    let lease = ["--lock", "queue", "--wait", "--ttl", "60s", "--renew-every", "20s"];
    let mut holder = holding(&sb, "holder", &lease);
    sb.wait_pid("holder.pid");
    let mut quitter = holding(&sb, "quitter", &[&lease[..], &["--timeout", "1s"]].concat());
    let next = holding(&sb, "next", &[&lease[..], &["-vv"]].concat());
    wait_for(|| next.stderr().contains("waiting"), SOON, "the second waiter to wait");
    assert_eq!(quitter.wait_code(SOON), 0, "a --timeout that ran out; stderr {:?}", quitter.stderr());
    assert!(!sb.exists("quitter.pid"));
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15);
    sb.wait_pid("next.pid");
}

/// A holder that is SIGKILLed along with its watchdog, so that nothing releases its lease:
/// the standby takes over once the lease lapses.
#[test]
fn a_lease_nobody_releases_is_taken_over_at_its_expiry() {
    let sb = Sandbox::new();
    let lease = ["--lock", "lapse", "--wait", "--ttl", "2s", "--renew-every", "500ms", "--kill-after", "500ms"];
    let holder = holding(&sb, "holder", &lease);
    let child = sb.wait_pid("holder.pid");
    let standby = holding(&sb, "standby", &[&lease[..], &["-vv"]].concat());
    wait_for(|| standby.stderr().contains("waiting"), SOON, "the standby to wait");
    // SIGSTOP: the frozen wrapper keeps its place in the queue; only the lease's expiry
    // (and its watchdog, which kills the child) let the standby in.
    holder.signal(Signal::SIGSTOP);
    sb.wait_pid("standby.pid");
    assert!(!pid_alive(child), "the frozen holder's child was stopped first");
    holder.signal(Signal::SIGKILL);
}

/// A symlink planted where the wake-up file goes (the database in a shared directory) is
/// never followed: the file it points to is not written to, and runs still work.
#[test]
fn a_symlink_in_place_of_the_wake_up_file_is_not_followed() {
    let sb = Sandbox::new();
    sb.output(sb.sub("init", &[]));
    let victim = sb.file("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, sb.file("locks.db-wake")).unwrap();
    let out = sb.output(sb.cmd(&["--lock", "link", "--min-hold", "1h", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    // Ending a --min-hold keep frees the lock without the holder: it tells waiters by a write.
    let out = sb.output(sb.sub("release", &["--lock", "link"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    let out = sb.output(sb.cmd(&["--lock", "link", "--min-hold", "0s", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "the lock was freed; stderr {:?}", stderr_of(&out));
}

fn taking_turns(sb: &Sandbox, name: &str, args: &[&str]) -> Wrapper {
    let mut cmd = sb.cmd(&[args, &["--", "sh", "-c", TURN_AFTER_GO]].concat());
    cmd.env("NAME", name);
    sb.spawn(name, cmd)
}

/// Whether some open file description holds (not waits for) an OFD lock on the file.
fn ofd_lock_held_on(file: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let inode = std::fs::metadata(file).map(|m| m.ino()).unwrap_or(0);
    let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
    locks.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        // "N: OFDLCK ADVISORY WRITE -1 MAJ:MIN:INODE START END"; a waiter's line has "->" after N:.
        fields.get(1) == Some(&"OFDLCK") && fields.get(5).is_some_and(|id| id.ends_with(&format!(":{inode}")))
    })
}

/// The waiter at the head of the queue (holding the lock name's byte of the wake-up file)
/// is frozen: every holder after it holds the lease without the byte, and its release must
/// still reach a waiter behind the head within a moment, at every handoff, not when the lease
/// it last read would have lapsed (8 s).
#[test]
fn a_frozen_head_of_the_queue_delays_a_handoff_by_a_moment_only() {
    let sb = Sandbox::new();
    let lease = ["--lock", "frozen", "--wait", "--ttl", "8s", "-vv"];
    // A lease kept for --min-hold with nobody holding the byte: the first waiter to queue
    // takes the byte at once and is the head, waiting for the keep to end.
    let out = sb.output(sb.cmd(&["--lock", "frozen", "--min-hold", "1h", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let head = taking_turns(&sb, "head", &lease);
    wait_for(|| ofd_lock_held_on(&sb.file("locks.db-wake")), SOON, "the head to hold its byte");
    head.signal(Signal::SIGSTOP);
    // The keep ends and a holder takes the lease; it cannot take the frozen head's byte.
    let out = sb.output(sb.sub("release", &["--lock", "frozen"]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    let holder = taking_turns(&sb, "holder", &lease);
    wait_for(|| sb.lines("turns").len() == 1, SOON, "the holder's child to start");
    let behind: Vec<Wrapper> = ["w2", "w3"].iter().map(|name| taking_turns(&sb, name, &lease)).collect();
    for w in &behind {
        wait_for(|| w.stderr().contains("waiting"), SOON, "a waiter behind the frozen head to wait");
    }
    std::fs::write(sb.file("go"), "").unwrap();
    for w in [holder].into_iter().chain(behind) {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    }
    assert_quick_handoffs(&sb, 3);
    assert!(pid_stopped(head.pid()), "the head stayed frozen throughout");
}
