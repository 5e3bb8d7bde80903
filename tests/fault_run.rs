//! The short fault run: a few dozen faults against `leaderrun --wait` contenders on the
//! embedded store; fails on any overlapping children or fencing-token disorder.
//! The long run is one command: `cargo run --release --bin leaderrun-faultrun -- --faults 1000`.

use std::process::Command;

#[test]
fn short_fault_run_finds_no_overlap() {
    let out = Command::new(env!("CARGO_BIN_EXE_leaderrun-faultrun"))
        .args(["--faults", "30", "--gap-min", "500ms", "--gap-max", "1500ms"])
        .output()
        .expect("run leaderrun-faultrun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n{stderr}");
    assert!(stdout.contains("fault run: 30 faults"), "the run did not apply its 30 faults:\n{stdout}\n{stderr}");
    assert!(stdout.contains("overlaps caught by flock: 0\n"), "{stdout}");
    assert!(stdout.contains("overlapping intervals: 0 "), "{stdout}");
    assert!(stdout.contains("fencing tokens out of order: 0\n"), "{stdout}");
    assert!(out.status.success(), "leaderrun-faultrun failed:\n{stdout}\n{stderr}");
}
