//! The fault run's contenders: each a `leaderrun --wait` with the probe as its child,
//! restarted when it exits (as a supervisor would); which of them holds the lock now; and
//! stopping them all at the end.

use std::fs;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::Rng;

use crate::{note, now_ns, sibling, Run, Slot, LOCK};

impl Run {
    pub fn spawn_contender(&self, slot: usize, generation: u64) -> Slot {
        let identity = format!("c{slot}-g{generation}");
        let mut cmd = Command::new(sibling("leaderrun"));
        cmd.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.backend.env(Some(slot)))
            .arg("--store")
            .arg(self.backend.contender_url(slot))
            .args(["--lock", LOCK, "--wait", "--ttl"])
            .arg(humantime::format_duration(self.config.ttl).to_string())
            .arg("--renew-every")
            .arg(humantime::format_duration(self.config.renew_every).to_string())
            .arg("--kill-after")
            .arg(humantime::format_duration(self.config.kill_after).to_string())
            .arg("--identity")
            .arg(&identity)
            .arg("--slots")
            .arg(self.config.slots.to_string())
            .arg("--")
            .arg(sibling("leaderrun-probe"))
            .arg("--log")
            .arg(&self.log)
            .arg("--lockfile")
            .arg(self.dir.join(if self.config.slots > 1 { "probe-{slot}.flock" } else { "probe.flock" }))
            .arg("--id")
            .arg(&identity)
            .arg("--beat")
            .arg("50ms")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("leaderrun.stderr"))
                    .expect("stderr file"),
            ));
        let child = cmd.spawn().expect("spawn leaderrun");
        Slot { child: Some(child), identity, generation }
    }

    /// Restart contenders that exit, as a supervisor would.
    pub fn supervise(self: &Arc<Self>) -> thread::JoinHandle<()> {
        let run = Arc::clone(self);
        thread::spawn(move || {
            while !run.stopping.load(Ordering::SeqCst) {
                {
                    let mut slots = run.slots.lock().unwrap();
                    for i in 0..slots.len() {
                        let exited = match slots[i].child.as_mut().map(|c| c.try_wait()) {
                            Some(Ok(Some(status))) => Some(status.code().unwrap_or_else(|| {
                                use std::os::unix::process::ExitStatusExt;
                                128 + status.signal().unwrap_or(0)
                            })),
                            _ => None,
                        };
                        if let Some(code) = exited {
                            run.exits.lock().unwrap().push((slots[i].identity.clone(), code, now_ns()));
                            note(&run.log, &format!("EXIT {} {code} {}", slots[i].identity, now_ns()));
                            if !run.stopping.load(Ordering::SeqCst) {
                                let generation = slots[i].generation + 1;
                                slots[i] = run.spawn_contender(i, generation);
                            }
                        }
                    }
                }
                thread::sleep(Duration::from_millis(20));
            }
        })
    }

    /// The current holder's identity, from `leaderrun status --json`: with --slots, the
    /// holder of a slot picked at random among the held ones.
    pub fn holder(&self) -> Option<String> {
        let out = Command::new(sibling("leaderrun"))
            .env_clear()
            .envs(self.backend.env(None))
            .args(["status", "--json", "--store", &self.backend.url(), "--lock", LOCK])
            .output()
            .ok()?;
        let value: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        let holders: Vec<String> = match value.as_array() {
            Some(slots) => slots.iter().filter_map(|s| s.get("holder")?.as_str().map(String::from)).collect(),
            None => value.get("holder").and_then(|h| h.as_str()).map(String::from).into_iter().collect(),
        };
        (!holders.is_empty()).then(|| holders[rand::rng().random_range(0..holders.len())].clone())
    }

    pub fn wrapper_pid(&self, identity: &str) -> Option<Pid> {
        let slots = self.slots.lock().unwrap();
        slots
            .iter()
            .find(|s| s.identity == identity)
            .and_then(|s| s.child.as_ref())
            .map(|c| Pid::from_raw(c.id() as i32))
    }

    /// Wait (up to `within`) for a holder whose wrapper we know; None is a liveness failure.
    pub fn current_holder(&self, within: Duration) -> Option<(String, Pid)> {
        let started = Instant::now();
        while started.elapsed() < within {
            if let Some(identity) = self.holder() {
                if let Some(pid) = self.wrapper_pid(&identity) {
                    return Some((identity, pid));
                }
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn stop_all(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let mut slots = self.slots.lock().unwrap();
        for slot in slots.iter_mut() {
            if let Some(child) = &mut slot.child {
                let pid = Pid::from_raw(child.id() as i32);
                let _ = kill(pid, Signal::SIGCONT);
                let _ = kill(pid, Signal::SIGTERM);
            }
        }
        for slot in slots.iter_mut() {
            if let Some(mut child) = slot.child.take() {
                let started = Instant::now();
                loop {
                    if let Ok(Some(_)) = child.try_wait() {
                        break;
                    }
                    if started.elapsed() > Duration::from_secs(15) {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

/// The probe running under `wrapper`: a child process named leaderrun-probe.
pub fn probe_of(wrapper: Pid) -> Option<Pid> {
    for entry in fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else { continue };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..].split_whitespace().nth(1).and_then(|f| f.parse::<i32>().ok());
        if comm.starts_with("leaderrun-probe") && ppid == Some(wrapper.as_raw()) {
            return Some(Pid::from_raw(pid));
        }
    }
    None
}
