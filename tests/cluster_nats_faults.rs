//! A `leaderrun` holder and one-shot runs on a 3-server NATS cluster, bucket replicated three
//! ways (`?replicas=3`), through the loss of one server (issue 22): at the DEFAULT ttl a
//! holder keeps its lease (its child never stopped) through the SIGKILL of the server it is
//! connected to, or its freeze (SIGSTOP) for 10 s; one-shot runs succeed with a server down
//! listed first, or with the bucket stream's leader just killed. The SIGKILL of the stream's
//! leader costs an election of 4 to 10 s at nats-server's defaults: a holder rides it out at
//! the ttl README states (not at the default: see `measure_failover`).
//!
//! No timing is asserted: a fault is held, then the lease is checked once more than a ttl
//! has passed since (a holder that lost its lease would have exited 75 by then).

mod common;
mod servers;

use std::time::{Duration, Instant};

use common::{pid_alive, status_json, Sandbox, Wrapper, SOON};
use servers::cluster::Cluster;
use servers::nats_cluster::NatsCluster;

/// The default ttl and a little more: a lease not renewed since a fault is gone by then.
const PAST_A_TTL: Duration = Duration::from_secs(17);

const CHILD: &str = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;

/// A cluster, its bucket made (through server 0) and its stream's leader.
fn cluster_with_bucket(sb: &Sandbox, name: &str) -> (NatsCluster, String, usize) {
    let cluster = NatsCluster::start();
    let bucket = format!("{name}_{}", std::process::id());
    let url = format!("{}/{bucket}?replicas=3", cluster.url());
    let out = sb.output(sb.at(&url, &["--lock", "warm-up", "--", "true"]));
    assert_eq!(out.status.code(), Some(0), "the bucket is made: {:?}", common::stderr_of(&out));
    let leader = cluster.wait_for_stream_leader(&format!("KV_{bucket}"), None, Duration::from_secs(30));
    (cluster, bucket, leader.expect("the bucket's stream has a leader"))
}

/// A holder at the default ttl, on the cluster's URL listing `first` first; its child's pid.
fn holder(sb: &Sandbox, cluster: &NatsCluster, bucket: &str, first: usize) -> (Wrapper, i32, String) {
    let url = format!("{}/{bucket}?replicas=3", cluster.url_from(first));
    let holder = sb.spawn("holder", sb.at(&url, &["--lock", "worker", "--wait", "--", "sh", "-c", CHILD]));
    let child = sb.wait_pid("child.pid");
    (holder, child, url)
}

/// More than a ttl after the fault: the holder still runs, its child was never stopped, and
/// the lock is still held with the same token.
fn assert_lease_kept(sb: &Sandbox, mut holder: Wrapper, child: i32, url: &str, token: &serde_json::Value) {
    let deadline = Instant::now() + PAST_A_TTL;
    while Instant::now() < deadline {
        assert!(holder.try_status().is_none(), "the holder exited: stderr {:?}", holder.stderr());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(pid_alive(child), "the child must have kept running; stderr {:?}", holder.stderr());
    let (code, status) = status_json(sb, url, "worker");
    assert_eq!((code, &status["fencing_token"]), (0, token), "still held, same token: {status}");
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
}

/// The holder's server (first in its URL, not the stream's leader) is killed.
#[test]
fn a_holder_keeps_its_lease_when_its_server_is_killed() {
    let sb = Sandbox::new();
    let (cluster, bucket, leader) = cluster_with_bucket(&sb, "killed");
    let first = (leader + 1) % 3;
    let (holder, child, url) = holder(&sb, &cluster, &bucket, first);
    let (_, before) = status_json(&sb, &url, "worker");
    cluster.kill(first);
    let others = format!("{}/{bucket}?replicas=3", cluster.url_from(leader));
    assert_lease_kept(&sb, holder, child, &others, &before["fencing_token"]);
}

/// The holder's server (first in its URL, not the stream's leader) is frozen for 10 s.
#[test]
fn a_holder_keeps_its_lease_when_its_server_is_frozen() {
    let sb = Sandbox::new();
    let (cluster, bucket, leader) = cluster_with_bucket(&sb, "frozen");
    let first = (leader + 1) % 3;
    let (holder, child, url) = holder(&sb, &cluster, &bucket, first);
    let (_, before) = status_json(&sb, &url, "worker");
    cluster.freeze(first);
    std::thread::sleep(Duration::from_secs(10));
    cluster.thaw(first);
    assert_lease_kept(&sb, holder, child, &url, &before["fencing_token"]);
}

/// The bucket stream's leader is killed while a holder on another server renews.
#[test]
fn a_holder_keeps_its_lease_when_the_streams_leader_is_killed() {
    let sb = Sandbox::new();
    let (cluster, bucket, leader) = cluster_with_bucket(&sb, "leader");
    let first = (leader + 1) % 3;
    let (holder, child, url) = holder(&sb, &cluster, &bucket, first);
    let (_, before) = status_json(&sb, &url, "worker");
    cluster.kill(leader);
    assert_lease_kept(&sb, holder, child, &url, &before["fencing_token"]);
}

/// Five one-shot runs, one after another, with a server that is down listed first.
#[test]
fn one_shots_succeed_with_a_server_down_listed_first() {
    let sb = Sandbox::new();
    let (cluster, bucket, leader) = cluster_with_bucket(&sb, "down");
    let down = (leader + 1) % 3;
    cluster.kill(down);
    let url = format!("{}/{bucket}?replicas=3", cluster.url_from(down));
    for i in 0..5 {
        let out =
            sb.output(sb.at(&url, &["--lock", &format!("job-{i}"), "--", "sh", "-c", r#"echo ran >> "$D/runs""#]));
        assert_eq!(out.status.code(), Some(0), "run {i}: stderr {:?}", common::stderr_of(&out));
    }
    assert_eq!(sb.lines("runs").len(), 5);
}

/// A one-shot run started just after the bucket stream's leader was killed, on the URL of
/// the other two: it waits out the election and runs its command.
#[test]
fn a_one_shot_succeeds_with_the_streams_leader_just_killed() {
    let sb = Sandbox::new();
    let (cluster, bucket, leader) = cluster_with_bucket(&sb, "oneshot");
    cluster.kill(leader);
    let url = format!("{}/{bucket}?replicas=3", cluster.url_from((leader + 1) % 3));
    let out = sb.output(sb.at(&url, &["--lock", "job", "--", "sh", "-c", r#"touch "$D/ran""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", common::stderr_of(&out));
    assert!(sb.exists("ran"));
}

/// Figures for README (run by hand: `--ignored --nocapture`): how long the bucket stream's
/// leader takes to be replaced after a SIGKILL, and how long a client with the store's ping
/// interval takes to notice that its server is frozen.
#[test]
#[ignore]
fn measure_failover() {
    let trials: usize = std::env::var("TRIALS").ok().and_then(|n| n.parse().ok()).unwrap_or(10);
    let sb = Sandbox::new();
    let (cluster, bucket, _) = cluster_with_bucket(&sb, "measure");
    let stream = format!("KV_{bucket}");
    let mut failovers = Vec::new();
    for trial in 0..trials {
        let leader = cluster.wait_for_stream_leader(&stream, None, Duration::from_secs(60)).expect("a leader");
        let killed = Instant::now();
        cluster.kill(leader);
        let next = cluster.wait_for_stream_leader(&stream, Some(leader), Duration::from_secs(60));
        let took = killed.elapsed();
        println!("trial {trial}: stream leader n{leader} killed, n{} leads after {took:?}", next.unwrap());
        failovers.push(took);
        cluster.restart(leader);
        std::thread::sleep(Duration::from_secs(3)); // it catches up
    }
    failovers.sort();
    println!(
        "stream leader failover, {trials} trials: min {:?}, median {:?}, max {:?}",
        failovers[0],
        failovers[trials / 2],
        failovers[trials - 1]
    );

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut notices = Vec::new();
    for trial in 0..5 {
        let frozen = trial % 3;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let client = runtime.block_on(async {
            let url = cluster.url_from(frozen);
            let (creds, hosts) = url.trim_start_matches("nats://").split_once('@').unwrap();
            let (user, password) = creds.split_once(':').unwrap();
            let servers: Vec<String> = hosts.split(',').map(|h| format!("nats://{h}")).collect();
            async_nats::ConnectOptions::new()
                .user_and_password(user.into(), password.into())
                .ping_interval(Duration::from_secs(1))
                .retain_servers_order()
                .event_callback(move |event| {
                    let tx = tx.clone();
                    async move {
                        let _ = tx.send((Instant::now(), event.to_string()));
                    }
                })
                .connect(servers)
                .await
                .unwrap()
        });
        std::thread::sleep(Duration::from_secs(2));
        while rx.try_recv().is_ok() {}
        let at = Instant::now();
        cluster.freeze(frozen);
        let noticed = runtime.block_on(async {
            loop {
                match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
                    Ok(Some((when, event))) if event == "disconnected" => return Some(when - at),
                    Ok(Some(_)) => {}
                    _ => return None,
                }
            }
        });
        cluster.thaw(frozen);
        println!("trial {trial}: a client of n{frozen} noticed its freeze after {noticed:?}");
        notices.extend(noticed);
        drop(client);
        std::thread::sleep(Duration::from_secs(3));
    }
    notices.sort();
    println!("frozen server noticed: min {:?}, max {:?}", notices.first(), notices.last());
}
