//! leaderrun processes and Choria campaigners (tests/choria: go-choria's algorithm in Rust)
//! sharing one lock in a bucket made as Choria's broker makes it: whoever is evicted
//! (`choria kv del`) or killed with -9, no two of them ever work at once. Every worker holds
//! an flock while it works; finding it taken is an overlap (tests/choria says how long).
//! Nothing here is timed: each step waits for an event, within a generous bound.

mod choria;
mod common;
mod servers;

use std::time::Duration;

use async_nats::jetstream::kv;
use choria::{assert_no_overlap, deaf_worker, starts, Campaigner, WORKER};
use common::*;
use futures_util::StreamExt;
use nix::sys::signal::Signal;
use servers::nats::Nats;

/// The bucket's max age: small, so that a takeover takes seconds. Choria campaigns every 3 s.
const MAX_AGE: Duration = Duration::from_secs(4);
const KEY: &str = "my_app";
/// Bound on one takeover: a max age, a campaign interval, a cool-down, and room to spare.
const TAKEOVER: Duration = Duration::from_secs(40);

fn interval() -> Duration {
    MAX_AGE.mul_f64(0.75)
}

struct Setup {
    nats: Nats,
    sb: Sandbox,
    runtime: tokio::runtime::Runtime,
    kv: kv::Store,
    url: String,
}

fn setup() -> Setup {
    let (nats, sb) = (Nats::start(), Sandbox::new());
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let kv = runtime.block_on(nats.choria_bucket_with_max_age(MAX_AGE));
    let url = format!("{}/CHORIA_LEADER_ELECTION", nats.url());
    Setup { nats, sb, runtime, kv, url }
}

impl Setup {
    /// A `leaderrun --wait` of the fleet, with the timing it picks for the bucket.
    fn leaderrun(&self, name: &str) -> Wrapper {
        self.leaderrun_running(name, WORKER)
    }

    fn leaderrun_running(&self, name: &str, script: &str) -> Wrapper {
        self.sb.spawn(name, self.sb.at(&self.url, &["-v", "--lock", KEY, "--wait", "--", "sh", "-c", script]))
    }

    fn campaigner(&self, name: &str) -> Campaigner {
        let _guard = self.runtime.enter();
        Campaigner::start(&self.kv, KEY, name, interval(), self.sb.path())
    }

    /// Wait until `n` workers in all have started; return the last.
    fn started(&self, n: usize) -> String {
        wait_for(|| starts(self.sb.path()).len() >= n, TAKEOVER, &format!("worker number {n} to start"));
        starts(self.sb.path())[n - 1].clone()
    }

    /// Choria's evict: a delete marker, with no revision check.
    fn evict(&self) {
        self.runtime.block_on(self.kv.delete(KEY)).expect("delete the key");
    }

    /// Wait for the campaigner's next tick (its Create or Update has been answered).
    fn next_tick(&self, campaigner: &mut Campaigner) {
        let ticks = &mut campaigner.ticks;
        ticks.borrow_and_update();
        let changed = self.runtime.block_on(async { tokio::time::timeout(TAKEOVER, ticks.changed()).await });
        changed.expect("the campaigner ticks").expect("the campaigner runs");
    }

    /// Wait until the key is written again (a renewal of its holder); return at once after.
    fn next_write(&self) {
        self.runtime.block_on(async {
            let now = self.kv.entry(KEY).await.unwrap().map_or(0, |e| e.revision);
            let mut watch = self.kv.watch(KEY).await.unwrap();
            let renewed = async {
                while let Some(entry) = watch.next().await {
                    let entry = entry.unwrap();
                    if entry.revision > now && entry.operation == kv::Operation::Put {
                        return;
                    }
                }
                panic!("the watch ended");
            };
            tokio::time::timeout(TAKEOVER, renewed).await.expect("the holder renews");
        });
    }
}

#[test]
fn an_evicted_choria_leader_never_overlaps_a_leaderrun_standby() {
    let s = setup();
    let mut leader = s.campaigner("leader");
    assert_eq!(s.started(1), "ch:leader");
    let _standby = s.leaderrun("standby");
    // Right after the leader's tick: it notices the evict only one interval later.
    s.next_tick(&mut leader);
    s.next_tick(&mut leader);
    s.evict();
    assert!(s.started(2).starts_with("lr:"), "the leaderrun standby takes over");
    assert_no_overlap(s.sb.path());
}

#[test]
fn an_evicted_leaderrun_holder_never_overlaps_a_leaderrun_standby() {
    let s = setup();
    let mut holder = s.leaderrun("holder");
    assert!(s.started(1).starts_with("lr:"));
    let _standby = s.leaderrun("standby");
    s.next_write();
    s.evict();
    assert!(s.started(2).starts_with("lr:"));
    assert_eq!(holder.wait_code(TAKEOVER), 75, "the evicted holder's lease is lost");
    assert_no_overlap(s.sb.path());
}

#[test]
fn an_evicted_leaderrun_holder_never_overlaps_a_choria_standby() {
    let s = setup();
    let mut holder = s.leaderrun_running("holder", &deaf_worker());
    assert!(s.started(1).starts_with("lr:"));
    let _standby = s.campaigner("standby");
    s.next_write();
    s.evict();
    assert_eq!(s.started(2), "ch:standby");
    assert_eq!(holder.wait_code(TAKEOVER), 75, "the evicted holder's lease is lost");
    assert_no_overlap(s.sb.path());
}

/// The worst case for the holder's own deadline: frozen right after a renewal, it never hears
/// of the evict, and only the watchdog stops its child, at the deadline that renewal earned.
/// A Choria standby that campaigns right after the evict confirms one interval + 200 ms later.
#[test]
fn a_frozen_evicted_leaderrun_holder_never_overlaps_a_choria_standby() {
    let s = setup();
    let mut holder = s.leaderrun_running("holder", &deaf_worker());
    assert!(s.started(1).starts_with("lr:"));
    s.next_write();
    holder.signal(Signal::SIGSTOP);
    s.evict();
    let _standby = s.campaigner("standby");
    assert_eq!(s.started(2), "ch:standby");
    holder.signal(Signal::SIGCONT);
    assert_eq!(holder.wait_code(TAKEOVER), 75, "the evicted holder's lease is lost");
    assert_no_overlap(s.sb.path());
}

#[test]
fn a_frozen_evicted_leaderrun_holder_never_overlaps_a_leaderrun_standby() {
    let s = setup();
    let mut holder = s.leaderrun_running("holder", &deaf_worker());
    assert!(s.started(1).starts_with("lr:"));
    s.next_write();
    holder.signal(Signal::SIGSTOP);
    s.evict();
    let _standby = s.leaderrun("standby");
    assert!(s.started(2).starts_with("lr:"));
    holder.signal(Signal::SIGCONT);
    assert_eq!(holder.wait_code(TAKEOVER), 75, "the evicted holder's lease is lost");
    assert_no_overlap(s.sb.path());
}

/// Two leaderrun processes and two campaigners; whoever works is evicted or killed with -9,
/// in turn, and replaced; every takeover must wait for the worker before it to be gone.
#[test]
fn a_mixed_fleet_under_evicts_and_kill_9_never_overlaps() {
    let s = setup();
    let mut wrappers = vec![s.leaderrun("lr-0"), s.leaderrun("lr-1")];
    let mut campaigners = vec![s.campaigner("ch-0"), s.campaigner("ch-1")];
    let mut worker = s.started(1);
    for round in 1..=4 {
        // An evicted leaderrun holder exits (75): the fleet gets a new one.
        wrappers.retain_mut(|w| w.try_status().is_none());
        while wrappers.len() < 2 {
            wrappers.push(s.leaderrun(&format!("lr-{round}-{}", wrappers.len())));
        }
        if round % 2 == 1 {
            s.evict();
        } else if let Some(i) = campaigners.iter().position(|c| c.who == worker) {
            campaigners.remove(i).kill();
            campaigners.push(s.campaigner(&format!("ch-{round}")));
        } else {
            // lr:HOST:PID:RANDOM; the watchdog stops the child of a wrapper killed with -9.
            let pid: i32 = worker.split(':').nth(2).and_then(|p| p.parse().ok()).expect("a pid in the identity");
            let i = wrappers.iter().position(|w| w.pid() == pid).expect("the worker's wrapper");
            let mut killed = wrappers.remove(i);
            killed.signal(Signal::SIGKILL);
            killed.wait_status(SOON);
        }
        worker = s.started(round + 1);
    }
    assert_no_overlap(s.sb.path());
    drop(campaigners);
    drop(s.nats);
}

/// `leaderrun release` while a one-shot run waits out its cool-down: the run stands down
/// before its child starts, and gives its revoked entry back. Else the entry would keep the
/// lock for the bucket's max age, and no second release could free it.
#[test]
fn a_one_shot_revoked_during_its_cool_down_leaves_the_lock_free() {
    let s = setup();
    let ran = s.sb.file("ran");
    let script = format!("touch {}", ran.display());
    let mut run = s.sb.spawn("one-shot", s.sb.at(&s.url, &["--lock", KEY, "--", "sh", "-c", &script]));
    // Its acquisition is written; the child waits for the cool-down (about a campaign interval).
    let written = || s.runtime.block_on(s.kv.entry(KEY)).unwrap().is_some_and(|e| e.operation == kv::Operation::Put);
    wait_for(written, TAKEOVER, "the one-shot run's acquisition");
    let released = s.sb.output(s.sb.at(&s.url, &["release", "--lock", KEY]));
    assert_eq!(code_of(released.status, "leaderrun release"), 0, "{}", stderr_of(&released));
    assert_eq!(run.wait_code(TAKEOVER), 0, "stood down as a conflict: {}", run.stderr());
    assert!(!ran.exists(), "the child ran after its lease was revoked");
    let (_, status) = status_json(&s.sb, &s.url, KEY);
    assert!(status["holder"].is_null(), "the revoked entry was left behind: {status}");
}
