//! The short fault runs: a dozen or two faults against `leaderrun --wait` contenders, on the
//! embedded store, on real PostgreSQL, MariaDB, Redis, etcd, NATS and ZooKeeper servers, on the test Kubernetes
//! API server, moto's S3 and DynamoDB, fake-gcs-server and Google's Datastore emulator (started by the run itself,
//! with server kill/restart, freeze and network faults); each fails on any overlapping
//! children or fencing-token disorder. The long run is one command:
//! `cargo build --release --bins --examples && target/release/examples/leaderrun-faultrun --faults 1000 [--store postgres]`.

mod short_run;

use short_run::{short_run, short_run_with};

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
