//! The ZooKeeper store on a 3-server ensemble (one per test), with one server down, killed or
//! frozen and a quorum standing: the conformance suite's core on the ensemble's URL, a holder at
//! the DEFAULT ttl that keeps its lease through the loss of the leader and the loss or the freeze
//! of the server its lease's session is on, one-shot runs with a follower down listed first, and
//! a one-shot run right after the leader was killed. `leaderrun` runs as a process, so the real
//! elector's timings apply. Durations are printed (`--nocapture`), never asserted.

mod common;
mod conformance;
mod servers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use conformance::Harness;
use leaderrun::store::Store;
use leaderrun::store::{registry, Access};
use nix::sys::signal::Signal;
use servers::cluster::Cluster;
use servers::zookeeper_cluster::ZooKeeperCluster;

/// The session of a lease at the default ttl (15 s): ttl + 25% + a tick of at most 2 s (half
/// the 4 s the servers grant the reads session), as `cons` shows it (`to=`).
const DEFAULT_LEASE_SESSION_MS: u64 = 20_750;

struct ClusterHarness {
    cluster: ZooKeeperCluster,
}

#[async_trait]
impl Harness for ClusterHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let spec = registry::parse_url(&self.cluster.url()).expect("a valid URL");
        spec.open(Access::Create).await.map(Arc::from).expect("open the ZooKeeper store on the ensemble")
    }

    /// Every server in turn, a quorum standing throughout.
    async fn restart(&self) {
        for i in 0..self.cluster.len() {
            self.cluster.kill(i);
            self.cluster.restart(i);
        }
    }
}

/// The conformance suite's core on the ensemble's URL, on one ensemble (one per test would be
/// 13 ensembles of 3 JVMs at once): every test but the three that wait out leases or restart
/// servers (expiry, --min-hold, a restart), which the single-server suite covers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conformance_core_holds_on_an_ensemble() {
    let h = ClusterHarness { cluster: tokio::task::spawn_blocking(ZooKeeperCluster::start).await.unwrap() };
    conformance::the_core(&h).await;
}

/// A child that records its pid and runs until stopped.
const CHILD: &str = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;

/// A `--wait` holder at the default timings whose lease's session is on `server` (a follower
/// when `on_follower`), with the ensemble's URL listing that server first. The client library
/// picks a server of the URL at random: a holder that landed elsewhere is stopped and started
/// again. Returns the holder, its child's pid, its fencing token and the server.
fn holder(sb: &Sandbox, cluster: &ZooKeeperCluster, on_follower: bool) -> (Wrapper, i32, serde_json::Value, usize) {
    let first = cluster.follower();
    for attempt in 0..12 {
        let url = cluster.url_from(first);
        let mut holder = sb
            .spawn(&format!("holder-{attempt}"), sb.at(&url, &["--lock", "worker", "--wait", "--", "sh", "-c", CHILD]));
        let child = sb.wait_pid("child.pid");
        let on = lease_server(cluster, &[0, 1, 2]);
        let leader = cluster.leader();
        if !on_follower || (on.is_some() && on != leader) {
            let (code, status) = status_json(sb, &url, "worker");
            assert_eq!(code, 0, "held: {status}");
            return (holder, child, status["fencing_token"].clone(), on.expect("the lease's session is on a server"));
        }
        holder.signal(Signal::SIGTERM);
        assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
        sb.wait_no_processes_left(SOON);
        std::fs::remove_file(sb.file("child.pid")).unwrap();
    }
    panic!("the lease's session never landed on a follower in 12 runs");
}

/// The server, of `among`, holding the default ttl's lease session (`cons`).
fn lease_server(cluster: &ZooKeeperCluster, among: &[usize]) -> Option<usize> {
    let on: Vec<usize> = cluster.holding_sessions_of(DEFAULT_LEASE_SESSION_MS);
    on.into_iter().find(|i| among.contains(i))
}

/// Wait (at most 30 s) until the lease's session is on one of `others`; how long that took
/// since `since`, if it did (a figure: the outcome is what `still_holds` checks).
fn session_moved(cluster: &ZooKeeperCluster, others: &[usize], since: Instant) -> Option<Duration> {
    while since.elapsed() < Duration::from_secs(30) {
        if lease_server(cluster, others).is_some() {
            return Some(since.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// After a fault: the holder still runs, its child was never stopped, the lock is held with the
/// same token, and a renewal after the fault confirmed (more than a renewal interval left).
fn still_holds(sb: &Sandbox, cluster: &ZooKeeperCluster, holder: &mut Wrapper, child: i32, token: &serde_json::Value) {
    // Without a renewal since the fault the child would be stopped about 10 s after the last
    // renewal before it: wait past that.
    std::thread::sleep(Duration::from_secs(12));
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child was stopped; holder's stderr {:?}", holder.stderr());
    let (code, status) = status_json(sb, &cluster.url(), "worker");
    assert_eq!((code, &status["fencing_token"]), (0, token), "the same lease: {status}");
    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    assert!(!holder.stderr().contains("lost"), "stderr {:?}", holder.stderr());
}

#[test]
fn a_holder_at_the_default_ttl_keeps_its_lease_when_the_leader_is_killed() {
    let (cluster, sb) = (ZooKeeperCluster::start(), Sandbox::new());
    let (mut holder, child, token, on) = holder(&sb, &cluster, false);
    let leader = cluster.leader().expect("a leader");
    let killed = Instant::now();
    cluster.kill(leader);
    let new_leader = cluster.wait_for_leader(Duration::from_secs(60)).expect("a new leader");
    eprintln!("leader {leader} killed (lease session on {on}): new leader {new_leader} after {:?}", killed.elapsed());
    still_holds(&sb, &cluster, &mut holder, child, &token);
}

#[test]
fn a_holder_at_the_default_ttl_keeps_its_lease_when_its_server_is_killed() {
    let (cluster, sb) = (ZooKeeperCluster::start(), Sandbox::new());
    let (mut holder, child, token, on) = holder(&sb, &cluster, true);
    let others: Vec<usize> = (0..3).filter(|i| *i != on).collect();
    let killed = Instant::now();
    cluster.kill(on);
    eprintln!(
        "server {on} (a follower) killed: the lease's session moved after {:?}",
        session_moved(&cluster, &others, killed)
    );
    still_holds(&sb, &cluster, &mut holder, child, &token);
}

#[test]
fn a_holder_at_the_default_ttl_keeps_its_lease_when_its_server_is_frozen_for_10_s() {
    let (cluster, sb) = (ZooKeeperCluster::start(), Sandbox::new());
    let (mut holder, child, token, on) = holder(&sb, &cluster, true);
    let others: Vec<usize> = (0..3).filter(|i| *i != on).collect();
    let frozen = Instant::now();
    cluster.freeze(on);
    eprintln!(
        "server {on} (a follower) frozen: the lease's session moved after {:?}",
        session_moved(&cluster, &others, frozen)
    );
    std::thread::sleep(Duration::from_secs(10).saturating_sub(frozen.elapsed()));
    cluster.thaw(on);
    still_holds(&sb, &cluster, &mut holder, child, &token);
}

#[test]
fn one_shot_runs_succeed_with_a_follower_down_listed_first() {
    let (cluster, sb) = (ZooKeeperCluster::start(), Sandbox::new());
    let down = cluster.follower();
    cluster.kill(down);
    let url = cluster.url_from(down);
    for run in 0..5 {
        let out = sb
            .output(sb.at(&url, &["--lock", "cron", "--min-hold", "0s", "--", "sh", "-c", r#"echo ran >> "$D/runs""#]));
        assert_eq!(out.status.code(), Some(0), "run {run}: stderr {:?}", stderr_of(&out));
    }
    assert_eq!(sb.lines("runs").len(), 5);
}

/// Needs the one-shot run's bounded retry of transient failures (the elector's): without it
/// the run exits 69 while the ensemble elects a new leader.
#[test]
fn a_one_shot_run_rides_out_the_election_after_the_leader_is_killed() {
    let (cluster, sb) = (ZooKeeperCluster::start(), Sandbox::new());
    let leader = cluster.leader().expect("a leader");
    cluster.kill(leader);
    let out =
        sb.output(sb.at(&cluster.url_from(leader), &["--lock", "cron", "--", "sh", "-c", r#"echo ran >> "$D/runs""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.lines("runs").len(), 1);
}
