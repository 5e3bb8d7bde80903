//! End-to-end tests of what a run shows of itself, on the embedded store: `leaderrun check`
//! (inside a child, from the parent's lease file; elsewhere, from the store), the leader
//! file, systemd's notify protocol, and `leaderrun watch`. Waits are on events with generous
//! bounds; nothing asserts that something was fast.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixDatagram;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

const LONG: Duration = Duration::from_secs(60);

#[test]
fn check_in_a_child_answers_from_its_parent_without_the_store() {
    let sb = Sandbox::new();
    // The child's LEADERRUN_STORE names a server that does not exist: a check that asked
    // the store would exit 69.
    let script = r#"
        export LEADERRUN_STORE=postgres://nobody@127.0.0.1:1/none
        "$LR" check; echo "own $?" >> "$D/checks"
        "$LR" check --token "$LEADERRUN_FENCING_TOKEN"; echo "token $?" >> "$D/checks"
        "$LR" check --token 999999; echo "other-token $?" >> "$D/checks"
    "#;
    let mut cmd = sb.cmd(&["--lock", "inside", "--", "sh", "-c", script]);
    cmd.env("LR", BIN);
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    assert_eq!(sb.lines("checks"), ["own 0", "token 0", "other-token 1"]);
}

#[test]
fn check_in_a_child_says_no_from_its_frozen_parents_stop_time() {
    let sb = Sandbox::new();
    // The child ignores the stop signal and checks until it is killed, noting the boot
    // clock (/proc/uptime, CLOCK_BOOTTIME in hundredths) read BEFORE each check, and the
    // stop time the parent published.
    let script = r#"
        trap '' TERM
        echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"
        while true; do
            t=$(cut -d' ' -f1 /proc/uptime)
            published=$(cat "$LEADERRUN_LEASE_FILE" 2>/dev/null | cut -d' ' -f1)
            "$LR" check; r=$?
            echo "$t $r ${published:-none}" >> "$D/checks"
            sleep 0.05
        done
    "#;
    let mut cmd = sb.cmd(&["--lock", "frozen", "--ttl", "6s", "--kill-after", "2s", "--", "sh", "-c", script]);
    cmd.env("LR", BIN);
    let mut wrapper = sb.spawn("wrapper", cmd);
    sb.wait_pid("child.pid");
    wait_for(|| sb.lines("checks").iter().any(|l| l.split(' ').nth(1) == Some("0")), LONG, "a first yes");
    wrapper.signal(Signal::SIGSTOP);
    // The watchdog kills the child at the deadline; until then it keeps checking.
    let child = sb.read("child.pid").trim().parse::<i32>().unwrap();
    wait_for(|| !pid_alive(child), LONG, "the watchdog to kill the child of the frozen parent");
    wrapper.signal(Signal::SIGCONT);
    let lines = sb.lines("checks");
    let mut last_stop_at = None;
    let mut said_no = false;
    for line in &lines {
        let words: Vec<&str> = line.split(' ').collect();
        let Ok(before) = words[0].parse::<f64>() else { continue };
        if let Ok(ns) = words[2].parse::<u128>() {
            last_stop_at = Some(ns as f64 / 1e9);
        }
        match words[1] {
            "0" => {
                assert!(!said_no, "a yes after a no: {lines:?}");
                let stop_at = last_stop_at.expect("a yes comes with a published stop time");
                assert!(before < stop_at, "yes at {before} although the stop time was {stop_at}: {lines:?}");
            }
            "1" => said_no = true,
            other => panic!("check exited {other}: {lines:?}"),
        }
    }
    assert!(said_no, "the child was told no before it was killed: {lines:?}");
    wrapper.wait_code(LONG);
}

#[test]
fn check_elsewhere_reads_the_store() {
    let sb = Sandbox::new();
    let script = r#"echo "$LEADERRUN_FENCING_TOKEN" > "$D/token.tmp"; mv "$D/token.tmp" "$D/token"; sleep 1000"#;
    let mut holder = sb.spawn("holder", sb.cmd(&["--lock", "outside", "--", "sh", "-c", script]));
    let token = sb.wait_pid("token").to_string();
    let check = |args: &[&str]| code_of(sb.output(sb.sub("check", args)).status, "leaderrun check");
    assert_eq!(check(&["--lock", "outside"]), 0);
    assert_eq!(check(&["--lock", "outside", "--token", &token]), 0);
    assert_eq!(check(&["--lock", "outside", "--token", "999999"]), 1);
    assert_eq!(check(&["--lock", "nobody-holds-this"]), 1);
    holder.signal(Signal::SIGTERM);
    holder.wait_code(LONG);
    assert_eq!(check(&["--lock", "outside"]), 1);
    // Outside a child, a lock must be named; a store that cannot answer is 69.
    let out = sb.output(sb.sub("check", &[]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("--lock"), "{}", stderr_of(&out));
    let out = sb.output(sb.at("postgres://nobody@127.0.0.1:1/none", &["check", "--lock", "x"]));
    assert_eq!(out.status.code(), Some(69), "{}", stderr_of(&out));
}

#[test]
fn the_leader_file_exists_while_leading_only() {
    let sb = Sandbox::new();
    let leader = sb.file("leader.json");
    let script = r#"cp "$D/leader.json" "$D/seen.json""#;
    let out = sb.output(sb.cmd(&["--lock", "lf", "--leader-file", leader.to_str().unwrap(), "--", "sh", "-c", script]));
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let seen: serde_json::Value = serde_json::from_str(&sb.read("seen.json")).expect("the child saw the leader file");
    assert_eq!(seen["lock"], "lf");
    assert_eq!(seen["token"], 1);
    assert!(seen["identity"].as_str().is_some_and(|i| !i.is_empty()) && seen["since"].is_string());
    assert!(!leader.exists(), "removed when leadership ended");
    // A directory that does not exist is bad usage, found before the store is touched.
    let out = sb.output(sb.cmd(&["--lock", "lf2", "--leader-file", "/no/such/dir/l.json", "--", "true"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("--leader-file"), "{}", stderr_of(&out));
    assert_eq!(sb.status("lf2"), 1, "nothing written for bad usage");
}

#[test]
fn the_watchdog_removes_the_leader_file_of_a_killed_wrapper() {
    let sb = Sandbox::new();
    let leader = sb.file("leader.json");
    let script = r#"echo $$ > "$D/c.tmp"; mv "$D/c.tmp" "$D/child.pid"; sleep 1000"#;
    let cmd = sb.cmd(&["--lock", "lf-kill", "--leader-file", leader.to_str().unwrap(), "--", "sh", "-c", script]);
    let mut wrapper = sb.spawn("wrapper", cmd);
    let child = sb.wait_pid("child.pid");
    assert!(leader.exists());
    wrapper.signal(Signal::SIGKILL);
    wrapper.wait_status(LONG);
    wait_for(|| !pid_alive(child), LONG, "the watchdog to stop the child");
    wait_for(|| !leader.exists(), LONG, "the watchdog to remove the leader file");
}

/// A datagram socket standing in for systemd's, and what it heard.
struct Notify {
    socket: UnixDatagram,
    path: std::path::PathBuf,
    heard: Vec<String>,
}

impl Notify {
    fn bind(sb: &Sandbox) -> Self {
        let path = sb.file("notify.sock");
        let socket = UnixDatagram::bind(&path).expect("bind the notify socket");
        socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        Self { socket, path, heard: Vec::new() }
    }

    /// Read datagrams until one has a line for which `want` is true.
    fn until(&mut self, what: &str, want: impl Fn(&str) -> bool) {
        let started = Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            if let Ok(n) = self.socket.recv(&mut buf) {
                let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                let found = text.lines().any(&want);
                self.heard.extend(text.lines().map(str::to_string));
                if found {
                    return;
                }
            }
            assert!(started.elapsed() < LONG, "never heard {what}; heard {:?}", self.heard);
        }
    }

    /// Read datagrams until `line` was heard `n` times in all.
    fn until_heard(&mut self, line: &str, n: usize) {
        while self.count(line) < n {
            self.until(line, |l| l == line);
        }
    }

    fn count(&self, line: &str) -> usize {
        self.heard.iter().filter(|l| *l == line).count()
    }
}

#[test]
fn systemd_hears_ready_status_watchdog_and_stopping() {
    let sb = Sandbox::new();
    let mut notify = Notify::bind(&sb);
    let mut holder = sb.spawn("holder", sb.cmd(&["--lock", "unit", "--wait", "--", "sleep", "1000"]));
    wait_for(|| sb.status("unit") == 0, LONG, "the holder");
    let mut cmd = sb.cmd(&["--lock", "unit", "--wait", "--", "sleep", "1000"]);
    cmd.env("NOTIFY_SOCKET", &notify.path).env("WATCHDOG_USEC", "2000000");
    let mut unit = sb.spawn("unit", cmd);
    notify.until("READY=1", |l| l == "READY=1");
    notify.until("the standby's status", |l| l.starts_with("STATUS=standby; held by"));
    // A standby pings at each check of the store: at least every half watchdog interval.
    let pings = notify.count("WATCHDOG=1");
    notify.until_heard("WATCHDOG=1", pings + 2);
    holder.signal(Signal::SIGTERM);
    holder.wait_code(LONG);
    notify.until("the leader's status", |l| l.starts_with("STATUS=leader, token"));
    unit.signal(Signal::SIGTERM);
    notify.until("STOPPING=1", |l| l == "STOPPING=1");
    unit.wait_code(LONG);
    assert_eq!(notify.count("READY=1"), 1, "{:?}", notify.heard);
    let ready = notify.heard.iter().position(|l| l == "READY=1").unwrap();
    assert!(!notify.heard[..ready].contains(&"WATCHDOG=1".to_string()), "no ping before READY: {:?}", notify.heard);
}

#[test]
fn watch_prints_each_change_and_ends_quietly() {
    let sb = Sandbox::new();
    let mut watch = sb.spawn("watch", sb.sub("watch", &["--lock", "w", "--json"]));
    let json_lines = |sb: &Sandbox| -> Vec<serde_json::Value> {
        sb.lines("watch.out").iter().map(|l| serde_json::from_str(l).expect("a JSON line")).collect()
    };
    let events = |sb: &Sandbox| -> Vec<String> {
        json_lines(sb).iter().map(|v| v["event"].as_str().unwrap().to_string()).collect()
    };
    wait_for(|| events(&sb) == ["state"], LONG, "the first state");
    // A one-shot run whose lease is kept for --min-hold, then asked to go.
    let out = sb.output(sb.cmd(&["--lock", "w", "--min-hold", "10m", "--", "true"]));
    assert_eq!(out.status.code(), Some(0));
    wait_for(|| events(&sb).contains(&"kept".to_string()), LONG, "kept");
    assert_eq!(sb.output(sb.sub("release", &["--lock", "w"])).status.code(), Some(0));
    wait_for(|| events(&sb).ends_with(&["released".to_string()]), LONG, "released");
    let seen = events(&sb);
    assert_eq!(&seen[..2], ["state", "acquired"], "{seen:?}");
    let lines = json_lines(&sb);
    assert_eq!(lines[1]["lock"], "w");
    assert_eq!(lines[1]["held"], true);
    assert!(lines[1]["at"].as_str().unwrap().ends_with('Z'));
    watch.signal(Signal::SIGTERM);
    assert_eq!(watch.wait_code(LONG), 0);
    assert_eq!(watch.stderr(), "", "quiet");
}

#[test]
fn watch_into_a_pipe_that_closes_ends_quietly() {
    let sb = Sandbox::new();
    let mut cmd = sb.sub("watch", &["--lock", "piped"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut watch = cmd.spawn().expect("spawn watch");
    let mut first = String::new();
    BufReader::new(watch.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.contains(" state ") && first.contains("piped free"), "{first:?}");
    // The reader is gone (its end was dropped above): the next change ends the watch.
    let out = sb.output(sb.cmd(&["--lock", "piped", "--", "true"]));
    assert_eq!(out.status.code(), Some(0));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = watch.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < LONG, "watch did not end when its reader went away");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let mut err = String::new();
    std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(err, "", "quiet");
}

#[test]
fn a_systemd_watchdog_shorter_than_two_renewals_is_warned_of() {
    let sb = Sandbox::new();
    let notify = Notify::bind(&sb);
    // --renew-every is 5 s at the defaults: a 4 s watchdog would restart a healthy leader.
    let mut cmd = sb.cmd(&["--lock", "short-watchdog", "--", "true"]);
    cmd.env("NOTIFY_SOCKET", &notify.path).env("WATCHDOG_USEC", "4000000");
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0));
    let err = stderr_of(&out);
    assert_eq!(err.lines().count(), 1, "{err:?}");
    assert!(err.contains("WatchdogSec (4s) is under twice --renew-every (5s)"), "{err:?}");
}
