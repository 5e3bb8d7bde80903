//! The short failover runs: `leaderrun --wait` contenders on a replicated store whose primary is
//! SIGKILLed and a replica promoted again and again (`leaderrun-faultrun --replicated`): an
//! asynchronous PostgreSQL standby, a synchronous one, an asynchronous MariaDB replica, and Redis
//! with two replicas and three Sentinels. On the asynchronous set-ups the seed makes the run's
//! failovers include ones that lose the new holder's grant (the replica never saw it). Each run
//! fails on any overlapping children or fencing-token disorder. The long runs (100 failovers and
//! more) are in docs/fault-run.md.

mod short_run;

use short_run::short_run_with;

/// The runs' settings: a seed whose fault order includes failovers of both kinds.
const FLAGS: &[&str] = &["--seed", "3"];

fn failover_run(store: &str, replicated: &str, failovers: usize) {
    let flags: Vec<&str> = ["--replicated", replicated].iter().chain(FLAGS).copied().collect();
    let report = short_run_with(store, failovers, &flags);
    if replicated == "async" {
        assert!(report.contains("| failover losing the holder's acquire | "), "{report}");
        assert!(
            !report.contains("| failover losing the holder's acquire | 0 |"),
            "no failover lost a grant: the run showed nothing\n{report}"
        );
    }
}

#[test]
fn short_failover_run_on_asynchronous_postgres_finds_no_overlap() {
    failover_run("postgres", "async", 4);
}

#[test]
fn short_failover_run_on_synchronous_postgres_finds_no_overlap() {
    failover_run("postgres", "sync", 3);
}

#[test]
fn short_failover_run_on_mariadb_finds_no_overlap() {
    failover_run("mariadb", "async", 4);
}

#[test]
fn short_failover_run_on_redis_with_sentinels_finds_no_overlap() {
    failover_run("redis", "async", 4);
}
