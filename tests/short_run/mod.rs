//! The short runs of `leaderrun-faultrun` the tests make (`fault_run.rs`, `failover_run.rs`):
//! the run's own report is checked for 0 overlaps and tokens in order.

#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One run at a time in this binary: each is a timing experiment with a dozen processes and
/// its servers. Other test binaries may run beside it (`.ci/lanes.py`), as any load on a shared
/// machine may: the safety it checks must not depend on idle cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

pub fn short_run(store: &str, faults: usize) {
    short_run_with(store, faults, &[]);
}

pub fn short_run_with(store: &str, faults: usize, extra: &[&str]) -> String {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // An example (a test instrument), which `cargo test` builds beside the binary.
    let faultrun = Path::new(env!("CARGO_BIN_EXE_leaderrun")).with_file_name("examples").join("leaderrun-faultrun");
    let out = Command::new(&faultrun)
        .args(["--store", store, "--faults", &faults.to_string(), "--gap-min", "500ms", "--gap-max", "1500ms"])
        .args(extra)
        .output()
        .expect("run leaderrun-faultrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(
        stdout.contains(&format!("fault run: {faults} faults")),
        "the run did not apply its {faults} faults:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("overlaps caught by flock: 0\n"), "{stdout}");
    assert!(stdout.contains("overlapping intervals: 0 "), "{stdout}");
    assert!(stdout.contains("fencing tokens out of order: 0\n"), "{stdout}");
    if let Some(at) = extra.iter().position(|a| *a == "--slots") {
        let slots = extra[at + 1];
        assert!(stdout.contains(&format!("slots: {slots}; most children at once: ")), "{stdout}");
        assert!(stdout.contains("children outside the slots: 0\n"), "{stdout}");
    }
    assert!(out.status.success(), "leaderrun-faultrun failed:\n{stdout}\n{stderr}");
    stdout.into_owned()
}
