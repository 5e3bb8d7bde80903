//! The etcd store on a 3-member cluster (one per test), with one member lost or frozen and a
//! quorum standing: the conformance suite's core still holds, one-shot runs succeed whatever
//! the URL's order, a holder at the default ttl keeps its lease through the loss of the leader
//! and the loss or freeze of the member it talks to, and a waiter whose member died takes
//! over at a release, and a waiter's watch on a member that lost its leader ends (the waiter
//! reads again). The holders are real `leaderrun` processes, so the elector's own timings
//! (renewal every 5 s, a second renewal beside one unanswered for 2.3 s) apply.

mod common;
mod conformance;
mod servers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::*;
use conformance::Harness;
use leaderrun::store::{registry, Access};
use leaderrun::store::{Acquire, Store};
use servers::cluster::Cluster;
use servers::etcd_cluster::EtcdCluster;

/// A full default ttl (15 s) and a little more: a holder whose renewals all failed since a
/// fault would have had its child stopped by then (10 s after its last renewal).
const A_DEFAULT_TTL: Duration = Duration::from_secs(17);

async fn cluster() -> Arc<EtcdCluster> {
    Arc::new(tokio::task::spawn_blocking(EtcdCluster::start).await.unwrap())
}

/// The store opened on the cluster's URL, member `first` listed first.
struct ClusterHarness {
    cluster: Arc<EtcdCluster>,
    first: usize,
}

#[async_trait]
impl Harness for ClusterHarness {
    async fn open(&self) -> Arc<dyn Store> {
        let url = self.cluster.url_from(self.first);
        registry::parse_url(&url).expect("a valid URL").open(Access::Create).await.map(Arc::from).expect("open")
    }

    async fn restart(&self) {
        unreachable!("not used on a cluster")
    }
}

/// The conformance suite bar the whole-store restart, on one cluster: first with every member
/// up, then with the member listed first in the URL (a follower) killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_conformance_core_holds_with_a_follower_down() {
    let cluster = cluster().await;
    let follower = cluster.follower();
    let h = ClusterHarness { cluster: cluster.clone(), first: follower };
    for pass in ["all up", "first member down"] {
        if pass == "first member down" {
            let c = cluster.clone();
            tokio::task::spawn_blocking(move || c.kill(follower)).await.unwrap();
        }
        eprintln!("conformance on the cluster, {pass}");
        conformance::the_core_and_expiry(&h).await;
    }
}

/// A child that records its pid, and a stop signal if it ever gets one.
const WORKER: &str = r#"trap 'echo stopped >> "$D/stopped"; exit 0' TERM
echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"
while :; do sleep 0.2; done"#;

/// A `--wait` holder at the default timings on `url`, its child running.
fn start_holder(sb: &Sandbox, url: &str) -> (Wrapper, i32) {
    let holder = sb.spawn("holder", sb.at(url, &["--lock", "worker", "--wait", "--", "sh", "-c", WORKER]));
    let child = sb.wait_pid("child.pid");
    (holder, child)
}

/// After a fault and a full default ttl: the holder still runs, its child was never asked to
/// stop, no renewal failed, and the lock is still its lease (same token) on the cluster.
fn assert_lease_kept(sb: &Sandbox, url: &str, mut holder: Wrapper, child: i32, token: &serde_json::Value) {
    std::thread::sleep(A_DEFAULT_TTL);
    eprintln!("holder's stderr: {:?}", holder.stderr());
    // Nor did any renewal fail: each went to another member within its budget.
    assert!(!holder.stderr().contains("renewal"), "stderr {:?}", holder.stderr());
    assert!(holder.try_status().is_none(), "the holder exited; stderr {:?}", holder.stderr());
    assert!(!sb.exists("stopped") && pid_alive(child), "the child was stopped; stderr {:?}", holder.stderr());
    let (code, status) = status_json(sb, url, "worker");
    assert_eq!((code, &status["fencing_token"]), (0, token), "the same lease: {status}");
    // The child takes the relayed SIGTERM as its cue to exit 0.
    holder.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 0, "stderr {:?}", holder.stderr());
}

fn token_of(sb: &Sandbox, url: &str) -> serde_json::Value {
    let (code, status) = status_json(sb, url, "worker");
    assert_eq!(code, 0, "held: {status}");
    status["fencing_token"].clone()
}

#[test]
fn a_holder_keeps_its_lease_when_the_leader_is_killed() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let leader = cluster.leader().expect("a leader");
    // The leader first: the holder talks to the member that dies.
    let url = cluster.url_from(leader);
    let (holder, child) = start_holder(&sb, &url);
    let token = token_of(&sb, &url);
    cluster.kill(leader);
    assert_lease_kept(&sb, &url, holder, child, &token);
}

#[test]
fn a_holder_keeps_its_lease_when_its_member_is_killed() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let follower = cluster.follower();
    let url = cluster.url_from(follower);
    let (holder, child) = start_holder(&sb, &url);
    let token = token_of(&sb, &url);
    cluster.kill(follower);
    assert_lease_kept(&sb, &url, holder, child, &token);
}

#[test]
fn a_holder_keeps_its_lease_when_its_member_is_frozen_for_10s() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let follower = cluster.follower();
    let url = cluster.url_from(follower);
    let (holder, child) = start_holder(&sb, &url);
    let token = token_of(&sb, &url);
    cluster.freeze(follower);
    std::thread::sleep(Duration::from_secs(10));
    cluster.thaw(follower);
    assert_lease_kept(&sb, &url, holder, child, &token);
}

/// One-shot runs with a follower down, listed first and then second in the URL: every one
/// runs its child (ten runs: with the balanced channel, three to seven in ten failed).
#[test]
fn one_shot_runs_succeed_with_a_follower_down() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let follower = cluster.follower();
    let other = (0..cluster.len()).find(|i| *i != follower).unwrap();
    let (first, second) = (cluster.url_from(follower), cluster.url_from(other));
    assert!(second.split(',').nth(1).is_some_and(|host| first.contains(host)), "the down member second: {second}");
    cluster.kill(follower);
    for i in 0..10 {
        let lock = format!("cron-{i}");
        let url = if i < 5 { &first } else { &second };
        let out = sb.output(sb.at(url, &["--lock", &lock, "--", "sh", "-c", r#"echo ran >> "$D/runs""#]));
        assert_eq!(out.status.code(), Some(0), "run {i}: stderr {:?}", stderr_of(&out));
    }
    assert_eq!(sb.lines("runs").len(), 10);
}

/// A one-shot run started just after the leader was killed, listed first: it rides out the
/// election (a bounded retry of the elector's, and another member here) and runs its child.
#[test]
fn a_one_shot_run_rides_out_the_leaders_death() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let leader = cluster.leader().expect("a leader");
    let url = cluster.url_from(leader);
    cluster.kill(leader);
    let out = sb.output(sb.at(&url, &["--lock", "cron", "--", "sh", "-c", r#"echo ran >> "$D/runs""#]));
    assert_eq!(out.status.code(), Some(0), "stderr {:?}", stderr_of(&out));
    assert_eq!(sb.lines("runs").len(), 1);
}

/// Waiters whose member dies while they wait: when their holders release, each takes over
/// within 3 s (about 0.1 s here), and none ever failed to reach the cluster: its watch and
/// its acquire went to another member. The balanced channel sent about one request in
/// three to the dead member (the elector then retries after a pause, 7 s or more in all
/// for some). The holders' leases (30 s) would take far longer to lapse. Three rounds of
/// three locks, the member started again between rounds.
#[test]
fn waiters_whose_member_died_take_over_at_a_release() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let waiters_member = cluster.follower();
    let holders_member = (0..cluster.len()).find(|i| *i != waiters_member).unwrap();
    let run = r#"echo "$NAME" >> "$D/turns"; while [ ! -e "$D/go-$NAME" ]; do sleep 0.05; done"#;
    for round in 0..3 {
        let spawn = |name: &str, lock: usize, member: usize| {
            let lock = format!("deploy-{round}-{lock}");
            let args = ["--lock", &lock, "--wait", "--ttl", "30s", "--", "sh", "-c", run];
            let mut cmd = sb.at(&cluster.url_from(member), &args);
            let name = format!("{name}-{round}-{lock}");
            cmd.env("NAME", &name);
            sb.spawn(&name, cmd)
        };
        let holders: Vec<Wrapper> = (0..3).map(|lock| spawn("holder", lock, holders_member)).collect();
        wait_for(|| sb.lines("turns").len() == 6 * round + 3, SOON, "the holders' children");
        let waiters: Vec<Wrapper> = (0..3).map(|lock| spawn("waiter", lock, waiters_member)).collect();
        // Time for the waiters to find the locks held and set up their watches on their member.
        std::thread::sleep(Duration::from_secs(3));
        cluster.kill(waiters_member);
        std::thread::sleep(Duration::from_millis(500));
        let released = Instant::now();
        for mut holder in holders {
            std::fs::write(sb.file(&format!("go-{}", holder.name)), "").unwrap();
            assert_eq!(holder.wait_code(SOON), 0, "stderr {:?}", holder.stderr());
        }
        wait_for(|| sb.lines("turns").len() == 6 * round + 6, Duration::from_secs(3), "the waiters' turns, soon");
        eprintln!("round {round}: the waiters took over within {:?} after the releases", released.elapsed());
        for mut waiter in waiters {
            std::fs::write(sb.file(&format!("go-{}", waiter.name)), "").unwrap();
            assert_eq!(waiter.wait_code(SOON), 0, "stderr {:?}", waiter.stderr());
            assert!(!waiter.stderr().contains("cannot reach"), "{}: {:?}", waiter.name, waiter.stderr());
        }
        cluster.restart(waiters_member);
    }
}

/// A waiter whose member is frozen (its connection open, nothing answered) while its holder
/// releases takes over within 30 s: its watch's connection goes unanswered at a ping and is
/// closed, and the waiter sets up its wait on another member. Without the ping it would learn
/// of the release only at the elector's re-read a minute later (the holder's lease, 120 s,
/// later still).
#[test]
fn a_waiter_whose_member_froze_takes_over_at_a_release() {
    let (cluster, sb) = (EtcdCluster::start(), Sandbox::new());
    let waiters_member = cluster.follower();
    let holders_member = (0..cluster.len()).find(|i| *i != waiters_member).unwrap();
    let run = r#"echo "$NAME" >> "$D/turns"; while [ ! -e "$D/go-$NAME" ]; do sleep 0.05; done"#;
    let spawn = |name: &str, member: usize| {
        let args = ["--lock", "deploy", "--wait", "--ttl", "120s", "--", "sh", "-c", run];
        let mut cmd = sb.at(&cluster.url_from(member), &args);
        cmd.env("NAME", name);
        sb.spawn(name, cmd)
    };
    let mut holder = spawn("holder", holders_member);
    wait_for(|| sb.lines("turns").len() == 1, SOON, "the holder's child");
    let mut waiter = spawn("waiter", waiters_member);
    std::thread::sleep(Duration::from_secs(3));
    cluster.freeze(waiters_member);
    let released = Instant::now();
    std::fs::write(sb.file("go-holder"), "").unwrap();
    assert_eq!(holder.wait_code(SOON), 0, "stderr {:?}", holder.stderr());
    wait_for(|| sb.lines("turns").len() == 2, Duration::from_secs(30), "the waiter's turn, before the re-read");
    eprintln!("the waiter took over {:?} after the release, its member frozen", released.elapsed());
    std::fs::write(sb.file("go-waiter"), "").unwrap();
    assert_eq!(waiter.wait_code(SOON), 0, "stderr {:?}", waiter.stderr());
    cluster.thaw(waiters_member);
}

/// `leaderrun watch` through a member that dies: its watch fails with its connection, and the
/// next wait watches through another member from the revision last read, so the watcher still
/// sees the lock taken and released (it reads, waits for a change and reads again, as `watch`
/// does; a wait is given a minute, so seeing both within `SOON` needs the pushes).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_watcher_keeps_seeing_changes_after_its_member_is_killed() {
    let cluster = cluster().await;
    let follower = cluster.follower();
    let other = (0..cluster.len()).find(|i| *i != follower).unwrap();
    let watcher = ClusterHarness { cluster: cluster.clone(), first: follower }.open().await;
    let holder = ClusterHarness { cluster: cluster.clone(), first: other }.open().await;
    let lock = conformance::unique("watched");
    assert!(!watcher.status(&lock).await.unwrap().is_held());
    // The watch opens on the member listed first, which then dies.
    watcher.observe_change(&lock, Duration::from_millis(300)).await;
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || c.kill(follower)).await.unwrap();
    let sees = |held: bool| {
        let (watcher, lock) = (watcher.clone(), lock.clone());
        let seen = async move {
            while !watcher.status(&lock).await.is_ok_and(|r| r.is_held() == held) {
                watcher.observe_change(&lock, Duration::from_secs(60)).await;
            }
        };
        async move {
            let what = if held { "taken" } else { "freed" };
            tokio::time::timeout(conformance::SOON, seen).await.unwrap_or_else(|_| panic!("never saw the lock {what}"))
        }
    };
    let lease = conformance::won(&*holder, &lock, "holder", conformance::TTL).await;
    sees(true).await;
    holder.release(&lease, Duration::ZERO).await.unwrap();
    sees(false).await;
}

/// A waiter's watch on a member that loses its leader (the other two frozen here; cut off from
/// them by a partition, the same) ends once that member has had no leader for three election
/// timeouts: the watch asks etcd for a leader, as etcd's own clients do. The waiter then reads
/// again, which goes to a member with a leader. A watch that did not ask stays open and silent
/// on such a member, and its waiter learns of a release only at the re-read a minute later.
/// When the others are back, the waiter takes the lock at the holder's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiters_watch_ends_when_its_member_has_no_leader() {
    let cluster = cluster().await;
    let member = cluster.follower();
    let others: Vec<usize> = (0..cluster.len()).filter(|i| *i != member).collect();
    let waiter = ClusterHarness { cluster: cluster.clone(), first: member }.open().await;
    let holder = ClusterHarness { cluster: cluster.clone(), first: others[0] }.open().await;
    let lock = conformance::unique("leaderless");
    let lease = conformance::won(&*holder, &lock, "holder", Duration::from_secs(120)).await;
    assert!(matches!(waiter.acquire(&lock, "waiter", conformance::TTL).await, Ok(Acquire::Held(_))));
    let watch_streams = || cluster.metric(member, "etcd_debugging_mvcc_watch_stream_total").unwrap_or(0.0);
    let before = watch_streams();
    let waiting = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move { waiter.changed(&lock, Duration::from_secs(300)).await })
    };
    // The waiter's watch is open on the member listed first.
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        wait_for(
            || c.metric(member, "etcd_debugging_mvcc_watch_stream_total").unwrap_or(0.0) > before,
            SOON,
            "the watch",
        )
    })
    .await
    .unwrap();
    let c = cluster.clone();
    let frozen = others.clone();
    tokio::task::spawn_blocking(move || frozen.iter().for_each(|i| c.freeze(*i))).await.unwrap();
    let frozen_at = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(60), waiting).await;
    eprintln!(
        "the wait ended {:?} after the freeze; watch streams on the member: {}",
        frozen_at.elapsed(),
        watch_streams()
    );
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        others.iter().for_each(|i| c.thaw(*i));
        c.wait_for_leader(Duration::from_secs(30)).expect("a leader again");
    })
    .await
    .unwrap();
    assert!(ended.is_ok(), "the waiter's watch on a member without a leader went on for a minute");
    // Back to normal: the waiter sees the release and takes the lock.
    holder.release(&lease, Duration::ZERO).await.unwrap();
    let taken = async {
        loop {
            match waiter.acquire(&lock, "waiter", conformance::TTL).await {
                Ok(Acquire::Won(_)) => break,
                _ => waiter.changed(&lock, Duration::from_secs(60)).await,
            }
        }
    };
    tokio::time::timeout(conformance::SOON, taken).await.expect("the waiter takes the lock at the release");
}
