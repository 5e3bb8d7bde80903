//! A leaderrun inside another's child behaves as its own flags say: the LEADERRUN_*
//! variables that configure the outer run (read from its environment, as systemd units,
//! cron and CI set them) never reach the child, which gets only the ones leaderrun sets
//! for it. On the embedded store, one temp dir per test (see `common`).
//!
//! The nested runs find the binary and the store in E2E_BIN and E2E_STORE, which are not
//! leaderrun's and so pass through.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::Signal;

/// The outer run: `leaderrun --store <sandbox> --lock outer -- sh -c SCRIPT`, with
/// E2E_BIN and E2E_STORE for the nested runs in SCRIPT.
fn outer(sb: &Sandbox, script: &str) -> Command {
    let mut cmd = sb.cmd(&["--lock", "outer", "--", "sh", "-c", script]);
    cmd.env("E2E_BIN", BIN).env("E2E_STORE", sb.store_url());
    cmd
}

/// Files of the sandbox whose names start with `prefix`.
fn count(sb: &Sandbox, prefix: &str) -> usize {
    fs::read_dir(sb.path())
        .expect("read the sandbox")
        .filter(|entry| entry.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with(prefix)))
        .count()
}

#[test]
fn slots_of_the_outer_run_do_not_make_a_nested_lock_a_semaphore() {
    let sb = Sandbox::new();
    // Three nested one-shot runs of `inner` at once, each child holding until told to go.
    // A run that loses exits 3 (-E 3) and says so in exit.N.
    let script = r#"
        for i in 1 2 3; do
            ( "$E2E_BIN" --store "$E2E_STORE" --lock inner -E 3 -- sh -c '
                  touch "$D/started.$$"
                  while [ ! -e "$D/release" ]; do sleep 0.05; done'
              echo $? > "$D/code.$i"; mv "$D/code.$i" "$D/exit.$i" ) &
        done
        wait"#;
    let mut cmd = outer(&sb, script);
    cmd.env("LEADERRUN_SLOTS", "3");
    let run = sb.spawn("outer", cmd);

    // Each nested run either started its child (which then holds) or gave up.
    wait_for(
        || count(&sb, "started.") + count(&sb, "exit.") >= 3,
        WITHIN_A_LEASE,
        "each nested run to start its child or give up",
    );
    let started = count(&sb, "started.");
    fs::write(sb.file("release"), "").unwrap();
    let out = run.finish(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "outer run; stderr {:?}", stderr_of(&out));
    assert_eq!(started, 1, "nested runs of a plain lock ran {started} children at once (LEADERRUN_SLOTS=3 outside)");
    let mut codes: Vec<String> = (1..=3).map(|i| sb.read(&format!("exit.{i}")).trim().to_string()).collect();
    codes.sort();
    assert_eq!(codes, ["0", "3", "3"], "one nested run ran its child, two found the lock held");
}

#[test]
fn wait_of_the_outer_run_does_not_make_a_nested_one_shot_wait() {
    let sb = Sandbox::new();
    let script = r#"echo $$ > "$D/holder.tmp"; mv "$D/holder.tmp" "$D/holder.pid"; exec sleep 1000"#;
    let mut holder = sb.spawn("holder", sb.cmd(&["--lock", "held", "--", "sh", "-c", script]));
    sb.wait_pid("holder.pid");

    // A one-shot run on a held lock gives up at once with its conflict status.
    let script = r#"
        "$E2E_BIN" --store "$E2E_STORE" --lock held -E 3 -- touch "$D/ran"
        echo $? > "$D/code.tmp"; mv "$D/code.tmp" "$D/code""#;
    let mut cmd = outer(&sb, script);
    cmd.env("LEADERRUN_WAIT", "true").env("LEADERRUN_TIMEOUT", "1h");
    let run = sb.spawn("outer", cmd);

    // Not wait_for: a nested run that waits is what this test is to show, after the holder
    // goes (as the lock would be freed in real life).
    let started = Instant::now();
    while !sb.exists("code") && started.elapsed() < WITHIN_A_LEASE {
        std::thread::sleep(Duration::from_millis(20));
    }
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15);
    let out = run.finish(Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0), "outer run; stderr {:?}", stderr_of(&out));
    assert_eq!(
        sb.read("code").trim(),
        "3",
        "the nested one-shot run must give up at once (LEADERRUN_WAIT=true outside); ran: {}",
        sb.exists("ran")
    );
    assert!(!sb.exists("ran"), "the nested one-shot run ran its child");
}

/// The child's environment, as `env` printed it, when the outer run is configured from its
/// environment alone (its store included) and runs `cmd`'s user; `dir` is the child's $D.
fn child_environment(sb: &Sandbox, mut cmd: Command, dir: &Path) -> (BTreeMap<String, String>, String) {
    let config = [
        ("LEADERRUN_STORE", format!("sqlite://{}/locks.db", dir.display())),
        ("LEADERRUN_SLOTS", "3".into()),
        ("LEADERRUN_WAIT", "true".into()),
        ("LEADERRUN_TIMEOUT", "1h".into()),
        ("LEADERRUN_MIN_HOLD", "1s".into()),
        ("LEADERRUN_TTL", "20s".into()),
        ("LEADERRUN_RENEW_EVERY", "5s".into()),
        ("LEADERRUN_KILL_AFTER", "2s".into()),
        ("LEADERRUN_LOCK_DELAY", "1s".into()),
        ("LEADERRUN_SERVER_CLOCK_SKEW", "400ms".into()),
        ("LEADERRUN_SIGNAL", "INT".into()),
        ("LEADERRUN_MAX_RUNTIME", "1h".into()),
        ("LEADERRUN_LEADER_FILE", dir.join("leader.json").display().to_string()),
        ("LEADERRUN_CONFLICT_EXIT_CODE", "4".into()),
        ("LEADERRUN_VERBOSE", "2".into()),
        ("LEADERRUN_LOG_FORMAT", "text".into()),
        ("LEADERRUN_JSON", "true".into()),
        ("LEADERRUN_SOME_FUTURE_OPTION", "x".into()),
    ];
    let script = r#"
        env > "$D/env.tmp"; mv "$D/env.tmp" "$D/env"
        "$E2E_BIN" check; echo $? > "$D/check""#;
    cmd.args(["--lock", "outer", "--", "sh", "-c", script]);
    cmd.env("D", dir).env("E2E_PASSED", "kept").env("E2E_BIN", BIN);
    cmd.envs(config.iter().map(|(name, value)| (name, value)));
    let out = sb.output(cmd);
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert!(dir.join("locks.db").exists(), "LEADERRUN_STORE named the outer run's store");
    assert_eq!(fs::read_to_string(dir.join("check")).unwrap().trim(), "0", "leaderrun check in the child");
    let env = fs::read_to_string(dir.join("env"))
        .unwrap()
        .lines()
        .filter_map(|line| line.split_once('=').map(|(n, v)| (n.to_string(), v.to_string())))
        .collect();
    (env, stderr_of(&out))
}

fn assert_only_the_childs_own(env: &BTreeMap<String, String>, way: &str) {
    let leaderrun: Vec<&str> = env.keys().filter(|n| n.starts_with("LEADERRUN_")).map(String::as_str).collect();
    assert_eq!(
        leaderrun,
        ["LEADERRUN_FENCING_TOKEN", "LEADERRUN_IDENTITY", "LEADERRUN_LEASE_FILE", "LEADERRUN_LOCK", "LEADERRUN_SLOT"],
        "the LEADERRUN_* variables of a child {way}"
    );
    assert_eq!(env["LEADERRUN_LOCK"], "outer");
    // A waiting run of three slots (LEADERRUN_SLOTS and LEADERRUN_WAIT outside) takes whichever
    // free slot its campaigns win first.
    assert!(["0", "1", "2"].contains(&env["LEADERRUN_SLOT"].as_str()), "{:?}", env["LEADERRUN_SLOT"]);
    assert_eq!(env["LEADERRUN_FENCING_TOKEN"], "1");
    assert_eq!(env["E2E_PASSED"], "kept", "other variables pass through");
}

#[test]
fn the_child_gets_only_the_variables_leaderrun_sets_for_it() {
    // As this user: as root on a host with a writable cgroup v2, the child is cloned into
    // its cgroup; `leaderrun check` in it answers for its own lock without a store.
    let sb = Sandbox::new();
    let (env, _) = child_environment(&sb, sb.bare(), sb.path());
    assert_only_the_childs_own(&env, "started the way this host offers this user");

    // As nobody, who may not write the cgroup hierarchy: the other way of starting it.
    if !nix::unistd::geteuid().is_root() {
        eprintln!("not root: the run above took the only way this host offers");
        return;
    }
    let dir = sb.file("nobody");
    fs::create_dir(&dir).expect("mkdir");
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    nix::unistd::chown(&dir, Some(65534.into()), Some(65534.into())).expect("chown to nobody");
    let (env, stderr) = child_environment(&sb, sb.bare_unprivileged(), &dir);
    assert!(stderr.contains("no cgroup for the child"), "std's spawn was used: {stderr:?}");
    assert_only_the_childs_own(&env, "started by std's spawn");
}
