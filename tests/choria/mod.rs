//! What the Choria tests share: a campaigner that follows go-choria's leader election
//! (`providers/election/streams/election.go`), written here in Rust, and an overlap detector
//! that every party doing "work" under the lock goes through.
//!
//! Choria's algorithm, as the campaigner below follows it: every campaign interval (0.75 × the
//! bucket's max age) a candidate `Create`s the key with its name as the value. A win does not
//! start the work: at its next tick the new leader `Update`s the key on the revision it last
//! wrote, and only once that succeeds does it sleep 200 ms and start working (OnWon). Any
//! failed `Update` ends the work (OnLost) and makes it a candidate again. There is no watch:
//! a leader learns of an evict (`choria kv del`) only at its next `Update`.
//!
//! The overlap detector: a worker takes an exclusive `flock` on `$D/flock` for as long as it
//! works (a leaderrun child through the shell's `flock`, a campaigner through `flock(2)`), and
//! the kernel drops it when the worker's process tree is gone, however it ended. A worker that
//! finds the lock taken records `OVERLAP` in `$D/events`, then waits for the lock and records
//! how long it waited: that is how long two parties worked at once. Times are CLOCK_BOOTTIME
//! (/proc/uptime), comparable across processes on one host.

#![allow(dead_code)]

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_nats::jetstream::kv;
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The leaderrun child of these tests: it works (holds the overlap lock) until it is stopped.
pub const WORKER: &str = r#"
exec 9>>"$D/flock"
t0=$(cut -d' ' -f1 /proc/uptime)
if ! flock -n 9; then
  echo "OVERLAP lr:$LEADERRUN_IDENTITY $t0" >> "$D/events"
  flock 9
  echo "overlap-ended lr:$LEADERRUN_IDENTITY $t0 $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
fi
echo "start lr:$LEADERRUN_IDENTITY $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
exec sleep 1000
"#;

/// A worker deaf to the stop signal: only SIGKILL at its wrapper's deadline (or the watchdog's)
/// ends it, the worst case for how long an evicted holder's child lives on.
pub fn deaf_worker() -> String {
    format!("trap '' TERM\n{WORKER}")
}

/// Seconds since boot (CLOCK_BOOTTIME), as the shell workers read it.
pub fn uptime() -> f64 {
    let text = std::fs::read_to_string("/proc/uptime").expect("read /proc/uptime");
    text.split_whitespace().next().and_then(|t| t.parse().ok()).expect("a number in /proc/uptime")
}

/// Append one line to `$D/events` (one write: lines of several processes never mix).
pub fn record(dir: &Path, line: &str) {
    let mut file = OpenOptions::new().create(true).append(true).open(dir.join("events")).expect("open events");
    file.write_all(format!("{line}\n").as_bytes()).expect("write events");
}

/// The lines of `$D/events`.
pub fn events(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("events")).unwrap_or_default().lines().map(str::to_string).collect()
}

/// The workers that started, in order (`lr:IDENTITY` or `ch:NAME`).
pub fn starts(dir: &Path) -> Vec<String> {
    events(dir).iter().filter_map(|l| l.strip_prefix("start ")).map(|r| r.split(' ').next().unwrap().into()).collect()
}

/// Every overlap seen: who found the lock taken, and for how many seconds (None: it never got it).
pub fn overlaps(dir: &Path) -> Vec<(String, Option<f64>)> {
    let lines = events(dir);
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("OVERLAP "))
        .map(|rest| {
            let who = rest.split(' ').next().unwrap().to_string();
            let ended = lines.iter().find_map(|l| {
                let f: Vec<&str> = l.strip_prefix("overlap-ended ")?.split(' ').collect();
                (f[0] == who).then(|| f[2].parse::<f64>().unwrap() - f[1].parse::<f64>().unwrap())
            });
            (who, ended)
        })
        .collect()
}

/// Panic, quoting each overlap and its length, if two workers ever worked at once.
pub fn assert_no_overlap(dir: &Path) {
    let seen = overlaps(dir);
    assert!(seen.is_empty(), "two parties worked at once: {seen:?}; events: {:#?}", events(dir));
}

/// A campaigner's work: the overlap lock, held until it stops.
struct Work {
    who: String,
    dir: PathBuf,
    _lock: Flock<File>,
}

impl Work {
    fn start(who: &str, dir: &Path) -> Work {
        let file = OpenOptions::new().create(true).append(true).open(dir.join("flock")).expect("open flock");
        let t0 = uptime();
        let lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => lock,
            Err((file, _)) => {
                record(dir, &format!("OVERLAP {who} {t0}"));
                let lock = tokio::task::block_in_place(|| Flock::lock(file, FlockArg::LockExclusive))
                    .map_err(|(_, e)| e)
                    .expect("wait for the overlap lock");
                record(dir, &format!("overlap-ended {who} {t0} {}", uptime()));
                lock
            }
        };
        record(dir, &format!("start {who} {}", uptime()));
        Work { who: who.into(), dir: dir.into(), _lock: lock }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        record(&self.dir, &format!("stop {} {}", self.who, uptime()));
    }
}

/// A Choria campaigner running in this process. Dropping or `kill`ing it ends it as kill -9
/// ends a Choria process: its work stops at once, its key stays until the bucket expires it.
pub struct Campaigner {
    pub who: String,
    task: JoinHandle<()>,
    /// Counts this campaigner's ticks (each `Create` or `Update` it has sent and had answered).
    pub ticks: watch::Receiver<u64>,
}

impl Campaigner {
    /// Start campaigning for `key` under `name` at once (Choria spreads start-ups with a random
    /// splay of up to 5 s; the tests start their campaigners when they need them instead).
    pub fn start(kv: &kv::Store, key: &str, name: &str, interval: Duration, dir: &Path) -> Campaigner {
        let (tx, ticks) = watch::channel(0);
        let who = format!("ch:{name}");
        let campaign = campaign(kv.clone(), key.to_string(), name.to_string(), interval, dir.to_path_buf(), tx);
        Campaigner { who, task: tokio::spawn(campaign), ticks }
    }

    /// kill -9.
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for Campaigner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn campaign(
    kv: kv::Store,
    key: String,
    name: String,
    interval: Duration,
    dir: PathBuf,
    ticks: watch::Sender<u64>,
) {
    let who = format!("ch:{name}");
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Leader: the revision it last wrote, and whether it still owes its OnWon.
    let mut leading: Option<(u64, bool)> = None;
    let mut work: Option<Work> = None;
    loop {
        ticker.tick().await;
        match leading {
            None => {
                if let Ok(seq) = kv.create(&key, name.clone().into()).await {
                    record(&dir, &format!("created {who} {seq} {}", uptime()));
                    leading = Some((seq, true));
                }
            }
            Some((last, owes_won)) => match kv.update(&key, name.clone().into(), last).await {
                Ok(seq) => {
                    leading = Some((seq, false));
                    if owes_won {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        work = Some(Work::start(&who, &dir));
                    }
                }
                Err(_) => {
                    leading = None;
                    record(&dir, &format!("lost {who} {}", uptime()));
                    drop(work.take()); // OnLost: the work stops
                }
            },
        }
        ticks.send_modify(|n| *n += 1);
    }
}
