//! The short fault runs: a dozen or two faults against `leaderrun --wait` contenders, on the
//! embedded store, on real PostgreSQL, MariaDB, Redis, etcd, NATS and ZooKeeper servers, on the test Kubernetes
//! API server, moto's S3 and DynamoDB, fake-gcs-server and Google's Datastore emulator (started by the run itself,
//! with server kill/restart, freeze and network faults); each fails on any overlapping
//! children or fencing-token disorder. The long run is one command:
//! `cargo build --release --bins --examples && target/release/examples/leaderrun-faultrun --faults 1000 [--store postgres]`.

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;

/// One run at a time in this binary: each is a timing experiment with a dozen processes and
/// its servers. Other test binaries may run beside it (`.ci/lanes.py`), as any load on a shared
/// machine may: the safety it checks must not depend on idle cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn short_run(store: &str, faults: usize) {
    short_run_with(store, faults, &[]);
}

fn short_run_with(store: &str, faults: usize, extra: &[&str]) {
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
}

#[test]
fn short_fault_run_on_sqlite_finds_no_overlap() {
    short_run("sqlite", 20);
}

/// --slots 3: no two children in one slot, never more than three at once, tokens in order
/// within each slot.
#[test]
fn short_fault_run_with_three_slots_on_sqlite_finds_no_overlap() {
    short_run_with("sqlite", 12, &["--slots", "3"]);
}

#[test]
fn short_fault_run_with_three_slots_on_redis_finds_no_overlap() {
    short_run_with("redis", 12, &["--slots", "3"]);
}

#[test]
fn short_fault_run_on_postgres_finds_no_overlap() {
    short_run("postgres", 12);
}

#[test]
fn short_fault_run_on_mariadb_finds_no_overlap() {
    short_run("mariadb", 12);
}

#[test]
fn short_fault_run_on_redis_finds_no_overlap() {
    short_run("redis", 12);
}

#[test]
fn short_fault_run_on_etcd_finds_no_overlap() {
    short_run("etcd", 12);
}

#[test]
fn short_fault_run_on_nats_finds_no_overlap() {
    short_run("nats", 12);
}

#[test]
fn short_fault_run_on_zookeeper_finds_no_overlap() {
    short_run("zookeeper", 12);
}

#[test]
fn short_fault_run_on_kubernetes_finds_no_overlap() {
    short_run("kubernetes", 12);
}

#[test]
fn short_fault_run_on_gcs_finds_no_overlap() {
    short_run("gcs", 12);
}

#[test]
fn short_fault_run_on_s3_finds_no_overlap() {
    short_run("s3", 12);
}

#[test]
fn short_fault_run_on_dynamodb_finds_no_overlap() {
    short_run("dynamodb", 12);
}

/// The emulator restarts by SIGTERM only (a SIGKILL loses its data); tokens compare within
/// one run of it (its version counter starts again).
#[test]
fn short_fault_run_on_datastore_finds_no_overlap() {
    short_run("datastore", 12);
}

/// Azure keeps leases of 15 s at least: the contenders run with --ttl 15s, so each fault that
/// outlasts a lease takes longer than on the other stores, and the run is shorter.
#[test]
fn short_fault_run_on_azblob_finds_no_overlap() {
    short_run_with("azblob", 6, &["--ttl", "15s", "--renew-every", "3s", "--kill-after", "2s"]);
}
