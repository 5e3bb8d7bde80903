//! `leaderrun-faultrun`: the fault-injection run that counts overlapping children.
//!
//! Several `leaderrun --wait` contenders campaign for one lock, each running
//! `leaderrun-probe` as its child (START / BEAT / STOP lines on CLOCK_MONOTONIC, and
//! a non-blocking flock held for the probe's whole life: failing to get it is an
//! overlap caught in the act). A supervisor restarts every contender that exits.
//! Every 1–5 s a scheduler picks a fault, applies it to the current holder, holds
//! it, heals it. At the end a checker reads the log and reports overlaps (the
//! figure that must be 0), fencing tokens out of order, failover gaps per fault
//! kind and false losses. Exit status 1 on any overlap or token disorder.
//!
//!     cargo build --release --bins --examples && target/release/examples/leaderrun-faultrun --faults 1000
//!
//! With `--store postgres` or `--store mariadb` it starts that server itself and adds
//! the server's faults: SIGKILL and restart it, freeze it (SIGSTOP) past the ttl, and
//! cut, reset or slow the holder's own connection through a TCP proxy that stands
//! between each contender and the server.
//!
//! With `--cluster` (etcd, nats, zookeeper) it starts a 3-node cluster instead (a NATS
//! bucket replicated on all three), each contender listing a different node first, and adds
//! the node faults: the leader node or the holder's preferred node SIGKILLed and started
//! again, or SIGSTOPped and resumed; one node at a time, the cluster led again before the
//! next fault. A lease lost to a node fault counts as a false loss: with a quorum standing,
//! it must cost none whose ttl exceeds the engine's failover time plus two renewals.
//!
//! A test instrument, not part of leaderrun.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use rand::{Rng, SeedableRng};

mod backend;
mod checker;
mod proxy;
#[path = "../tests/servers/mod.rs"]
mod servers;

use backend::{Backend, Kind};
use checker::{check, Applied};
use proxy::Mode;

const LOCK: &str = "faultrun";

/// The probe beats every 50 ms: two beats of slack when judging whether a child
/// outlived a moment.
const BEAT_SLACK_NS: u64 = 100_000_000;

fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

/// The faults, each applied to the current holder and then healed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillWrapper,
    KillChild,
    StopWrapperShort,
    StopWrapperAboutTtl,
    StopWrapperLong,
    TermWrapper,
    Release,
    KillServer,
    FreezeServer,
    CutHolderNetwork,
    ResetHolderConnections,
    SlowHolderNetwork,
    KillLeaderNode,
    FreezeLeaderNode,
    KillHolderNode,
    FreezeHolderNode,
}

impl Fault {
    const ALL: [Fault; 16] = [
        Fault::KillWrapper,
        Fault::KillChild,
        Fault::StopWrapperShort,
        Fault::StopWrapperAboutTtl,
        Fault::StopWrapperLong,
        Fault::TermWrapper,
        Fault::Release,
        Fault::KillServer,
        Fault::FreezeServer,
        Fault::CutHolderNetwork,
        Fault::ResetHolderConnections,
        Fault::SlowHolderNetwork,
        Fault::KillLeaderNode,
        Fault::FreezeLeaderNode,
        Fault::KillHolderNode,
        Fault::FreezeHolderNode,
    ];

    /// A fault of one node of a cluster (`--cluster`): never two nodes down at once, so a
    /// quorum always stands.
    fn needs_cluster(self) -> bool {
        matches!(
            self,
            Fault::KillLeaderNode | Fault::FreezeLeaderNode | Fault::KillHolderNode | Fault::FreezeHolderNode
        )
    }

    fn needs_server(self) -> bool {
        matches!(
            self,
            Fault::KillServer
                | Fault::FreezeServer
                | Fault::CutHolderNetwork
                | Fault::ResetHolderConnections
                | Fault::SlowHolderNetwork
        )
    }

    fn name(self) -> &'static str {
        match self {
            Fault::KillWrapper => "SIGKILL wrapper",
            Fault::KillChild => "SIGKILL child",
            Fault::StopWrapperShort => "SIGSTOP wrapper 0.3 ttl",
            Fault::StopWrapperAboutTtl => "SIGSTOP wrapper 1.0 ttl",
            Fault::StopWrapperLong => "SIGSTOP wrapper 2.0 ttl",
            Fault::TermWrapper => "SIGTERM wrapper",
            Fault::Release => "leaderrun release",
            Fault::KillServer => "SIGKILL server, down 0.2-1.5 ttl",
            Fault::FreezeServer => "SIGSTOP server 1.5 ttl",
            Fault::CutHolderNetwork => "blackhole holder's network 1.5 ttl",
            Fault::ResetHolderConnections => "reset holder's connections",
            Fault::SlowHolderNetwork => "holder's network +100 ms, 2 ttl",
            Fault::KillLeaderNode => "SIGKILL leader node, down 0.2-1.5 ttl",
            Fault::FreezeLeaderNode => "SIGSTOP leader node 1.5 ttl",
            Fault::KillHolderNode => "SIGKILL holder's node, down 0.2-1.5 ttl",
            Fault::FreezeHolderNode => "SIGSTOP holder's node 1.5 ttl",
        }
    }

    /// Whether the holder is expected to lose its lease (and exit 75) under this fault. A node
    /// of a cluster is not: with a quorum standing, its loss must cost no lease whose ttl
    /// exceeds the engine's failover time and two renewal attempts (a loss is a false one).
    fn may_lose_lease(self) -> bool {
        matches!(
            self,
            Fault::StopWrapperAboutTtl
                | Fault::StopWrapperLong
                | Fault::Release
                | Fault::KillServer
                | Fault::FreezeServer
                | Fault::CutHolderNetwork
        )
    }

    /// Whether the fault hits the store itself, and so every holder at once: with --slots, the
    /// holders of the other slots may lose their leases to it too.
    fn hits_every_holder(self) -> bool {
        matches!(self, Fault::Release | Fault::KillServer | Fault::FreezeServer)
    }
}

struct Config {
    faults: usize,
    contenders: usize,
    ttl: Duration,
    renew_every: Duration,
    kill_after: Duration,
    gap_min: Duration,
    gap_max: Duration,
    seed: u64,
    keep: Option<PathBuf>,
    report: Option<PathBuf>,
    store: Kind,
    /// A 3-node cluster of the store (etcd, nats, zookeeper) instead of one server.
    cluster: bool,
    /// --slots N for every contender: up to N children at once, one per slot.
    slots: usize,
}

fn parse_args() -> Result<Config, String> {
    let mut c = Config {
        faults: 30,
        contenders: 3,
        ttl: Duration::from_secs(2),
        renew_every: Duration::from_millis(500),
        kill_after: Duration::from_millis(500),
        gap_min: Duration::from_secs(1),
        gap_max: Duration::from_secs(5),
        seed: rand::random(),
        keep: None,
        report: None,
        store: Kind::Sqlite,
        cluster: false,
        slots: 1,
    };
    let mut contenders_given = false;
    let mut it = std::env::args().skip(1);
    let dur = |v: Option<String>, f: &str| -> Result<Duration, String> {
        humantime::parse_duration(&v.ok_or(format!("{f} needs a value"))?).map_err(|e| format!("{f}: {e}"))
    };
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--faults" => c.faults = it.next().and_then(|v| v.parse().ok()).ok_or("--faults needs a number")?,
            "--contenders" => {
                c.contenders = it.next().and_then(|v| v.parse().ok()).ok_or("--contenders needs a number")?;
                contenders_given = true;
            }
            "--slots" => c.slots = it.next().and_then(|v| v.parse().ok()).ok_or("--slots needs a number")?,
            "--seed" => c.seed = it.next().and_then(|v| v.parse().ok()).ok_or("--seed needs a number")?,
            "--ttl" => c.ttl = dur(it.next(), "--ttl")?,
            "--renew-every" => c.renew_every = dur(it.next(), "--renew-every")?,
            "--kill-after" => c.kill_after = dur(it.next(), "--kill-after")?,
            "--gap-min" => c.gap_min = dur(it.next(), "--gap-min")?,
            "--gap-max" => c.gap_max = dur(it.next(), "--gap-max")?,
            "--keep" => c.keep = Some(it.next().ok_or("--keep needs a directory")?.into()),
            "--report" => c.report = Some(it.next().ok_or("--report needs a file")?.into()),
            "--cluster" => c.cluster = true,
            "--store" => {
                c.store = Kind::parse(&it.next().ok_or(
                    "--store needs a store name (sqlite, postgres, mariadb, redis, etcd, nats, zookeeper, kubernetes, s3, dynamodb, gcs, datastore)",
                )?)?
            }
            "-h" | "--help" => {
                println!(
                    "usage: leaderrun-faultrun [--faults N] [--contenders N] [--ttl DUR] [--renew-every DUR] \
                     [--kill-after DUR] [--gap-min DUR] [--gap-max DUR] [--seed N] [--keep DIR] [--report FILE.md] \
                     [--store sqlite|postgres|mariadb|redis|etcd|nats|zookeeper|kubernetes|s3|dynamodb|gcs|datastore] \
                     [--cluster (etcd, nats, zookeeper: 3 nodes)] [--slots N (contenders: N + 2 by default)]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !contenders_given && c.slots > 1 {
        c.contenders = c.slots + 2;
    }
    if c.slots == 0 || c.contenders <= c.slots {
        return Err("need --slots >= 1 and more --contenders than --slots".into());
    }
    if c.contenders < 2 || c.gap_min > c.gap_max {
        return Err("need --contenders >= 2 and --gap-min <= --gap-max".into());
    }
    if c.cluster && !matches!(c.store, Kind::Etcd | Kind::Nats | Kind::ZooKeeper) {
        return Err("--cluster needs --store etcd, nats or zookeeper".into());
    }
    Ok(c)
}

/// Where the binaries are: the probe next to this one (target/*/examples/), leaderrun one
/// directory up (target/*/).
fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("current_exe");
    let here = me.parent().expect("exe dir");
    let beside = here.join(name);
    if beside.exists() {
        return beside;
    }
    here.parent().map_or(beside.clone(), |up| up.join(name))
}

/// One contender slot: the running wrapper and its identity.
struct Slot {
    child: Option<Child>,
    identity: String,
    generation: u64,
}

/// What the supervisor saw: (identity, exit status, monotonic ns).
type Exits = Arc<Mutex<Vec<(String, i32, u64)>>>;

struct Run {
    dir: PathBuf,
    backend: Backend,
    log: PathBuf,
    config: Config,
    slots: Arc<Mutex<Vec<Slot>>>,
    exits: Exits,
    stopping: Arc<AtomicBool>,
}

impl Run {
    fn spawn_contender(&self, slot: usize, generation: u64) -> Slot {
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
    fn supervise(self: &Arc<Self>) -> thread::JoinHandle<()> {
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
    fn holder(&self) -> Option<String> {
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

    fn wrapper_pid(&self, identity: &str) -> Option<Pid> {
        let slots = self.slots.lock().unwrap();
        slots
            .iter()
            .find(|s| s.identity == identity)
            .and_then(|s| s.child.as_ref())
            .map(|c| Pid::from_raw(c.id() as i32))
    }

    /// Wait (up to 30 s) for a holder whose wrapper we know; None is a liveness failure.
    fn current_holder(&self) -> Option<(String, Pid)> {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Some(identity) = self.holder() {
                if let Some(pid) = self.wrapper_pid(&identity) {
                    return Some((identity, pid));
                }
            }
            thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn apply(&self, fault: Fault, holder: &str, wrapper: Pid) {
        let ttl = self.config.ttl;
        // Contender slot of the holder: identities read `c{slot}-g{generation}`.
        let slot = holder.strip_prefix('c').and_then(|r| r.split('-').next()).and_then(|n| n.parse().ok());
        match fault {
            Fault::KillServer => {
                let down = rand::rng().random_range(0.2..1.5);
                self.backend.kill_server(ttl.mul_f64(down));
                if self.backend.floor_restarts_with_server() {
                    note(&self.log, &format!("EPOCH {}", now_ns()));
                }
            }
            Fault::FreezeServer => self.backend.freeze_server(ttl.mul_f64(1.5)),
            Fault::CutHolderNetwork => self.backend.network(slot.unwrap_or(0), Mode::Blackhole, ttl.mul_f64(1.5)),
            Fault::ResetHolderConnections => {
                self.backend.network(slot.unwrap_or(0), Mode::Reset, Duration::from_millis(100))
            }
            Fault::SlowHolderNetwork => {
                self.backend.network(slot.unwrap_or(0), Mode::Delay(Duration::from_millis(100)), ttl * 2)
            }
            Fault::KillLeaderNode | Fault::KillHolderNode => {
                let down = ttl.mul_f64(rand::rng().random_range(0.2..1.5));
                let node = self.node_for(fault, slot);
                note(&self.log, &format!("NODE {node} killed for {} ms", down.as_millis()));
                self.backend.kill_node(node, down);
            }
            Fault::FreezeLeaderNode | Fault::FreezeHolderNode => {
                let node = self.node_for(fault, slot);
                note(&self.log, &format!("NODE {node} frozen"));
                self.backend.freeze_node(node, ttl.mul_f64(1.5));
            }
            Fault::KillWrapper => {
                let _ = kill(wrapper, Signal::SIGKILL);
            }
            Fault::KillChild => {
                if let Some(child) = probe_of(wrapper) {
                    let _ = kill(child, Signal::SIGKILL);
                }
            }
            Fault::StopWrapperShort | Fault::StopWrapperAboutTtl | Fault::StopWrapperLong => {
                let factor = match fault {
                    Fault::StopWrapperShort => 0.3,
                    Fault::StopWrapperAboutTtl => 1.0,
                    _ => 2.0,
                };
                let _ = kill(wrapper, Signal::SIGSTOP);
                thread::sleep(ttl.mul_f64(factor));
                let _ = kill(wrapper, Signal::SIGCONT);
            }
            Fault::TermWrapper => {
                let _ = kill(wrapper, Signal::SIGTERM);
            }
            Fault::Release => {
                let _ = Command::new(sibling("leaderrun"))
                    .env_clear()
                    .envs(self.backend.env(None))
                    .args(["release", "--store", &self.backend.url(), "--lock", LOCK])
                    .stdout(Stdio::null())
                    .status();
            }
        }
    }

    /// The node a cluster fault hits: the leader, or the node the holder's URL lists first
    /// (the one its client prefers).
    fn node_for(&self, fault: Fault, slot: Option<usize>) -> usize {
        match fault {
            Fault::KillLeaderNode | Fault::FreezeLeaderNode => self.backend.leader_node().unwrap_or(0),
            _ => self.backend.preferred_node(slot.unwrap_or(0)),
        }
    }

    fn stop_all(&self) {
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
fn probe_of(wrapper: Pid) -> Option<Pid> {
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

fn main() {
    let config = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("leaderrun-faultrun: {e}");
            std::process::exit(2);
        }
    };
    let temp = tempdir();
    let dir = config.keep.clone().unwrap_or_else(|| temp.clone());
    fs::create_dir_all(&dir).expect("run directory");
    let backend = if config.cluster {
        Backend::start_cluster(config.store, config.contenders)
    } else {
        Backend::start(config.store, &dir, config.contenders)
    };
    let kinds: Vec<Fault> = Fault::ALL
        .into_iter()
        .filter(|f| if f.needs_cluster() { backend.is_cluster() } else { !f.needs_server() || backend.has_server() })
        .collect();
    let log = dir.join("probe.log");
    let _ = fs::remove_file(&log);
    let mut rng = rand::rngs::StdRng::seed_from_u64(config.seed);
    let run = Arc::new(Run {
        dir: dir.clone(),
        backend,
        log: log.clone(),
        slots: Arc::new(Mutex::new(Vec::new())),
        exits: Arc::default(),
        stopping: Arc::new(AtomicBool::new(false)),
        config,
    });
    {
        let mut slots = run.slots.lock().unwrap();
        for i in 0..run.config.contenders {
            slots.push(run.spawn_contender(i, 0));
        }
    }
    let supervisor = run.supervise();
    let mut applied = Vec::new();
    let mut liveness_failure = false;
    let interrupted = stop_on_interrupt();
    for n in 0..run.config.faults {
        if interrupted.load(Ordering::SeqCst) {
            eprintln!("leaderrun-faultrun: interrupted after {n} faults; checking those");
            break;
        }
        let gap = rng.random_range(run.config.gap_min.as_secs_f64()..=run.config.gap_max.as_secs_f64());
        thread::sleep(Duration::from_secs_f64(gap));
        let Some((holder, wrapper)) = run.current_holder() else {
            eprintln!("leaderrun-faultrun: no holder emerged within 30 s (after {n} faults)");
            liveness_failure = true;
            break;
        };
        let fault = kinds[rng.random_range(0..kinds.len())];
        let at = now_ns();
        note(&log, &format!("FAULT {holder} {:?} {at}", fault));
        run.apply(fault, &holder, wrapper);
        note(&log, &format!("HEALED {holder} {:?} {}", fault, now_ns()));
        applied.push(Applied { fault, holder, at });
        if (n + 1) % 50 == 0 {
            eprintln!("leaderrun-faultrun: {} faults applied", n + 1);
        }
    }
    // Let the last failover finish before stopping everything.
    thread::sleep(run.config.ttl * 2);
    run.stop_all();
    let _ = supervisor.join();
    let exits = run.exits.lock().unwrap().clone();
    let report = check(&log, &applied, &exits, &run.config);
    let mut out = report.lines.join("\n");
    if run.backend.is_cluster() {
        out.push_str(
            "\na 3-node cluster; node faults one at a time, each healed (the node answers again) before the next",
        );
    } else if run.backend.has_server() {
        out.push_str(&format!("\nserver faults restart the server by {}", run.backend.restart_signal()));
    }
    if liveness_failure {
        out.push_str("\nRESULT: FAIL (liveness: no holder emerged)");
    }
    println!("{out}");
    if let Some(path) = &run.config.report {
        let _ = fs::File::create(path).and_then(|mut f| writeln!(f, "{out}"));
    }
    if run.config.keep.is_none() {
        let _ = fs::remove_dir_all(&temp);
    } else {
        eprintln!("leaderrun-faultrun: logs kept in {}", dir.display());
    }
    // Stop the store's server and proxies (Drop) before exit, which runs no destructors.
    let failed = report.failed || liveness_failure;
    drop(run);
    std::process::exit(if failed { 1 } else { 0 });
}

/// SIGINT or SIGTERM ends the run after the fault under way, so that it is still checked
/// and the store's server, proxies and contenders are stopped rather than left behind.
fn stop_on_interrupt() -> &'static AtomicBool {
    static INTERRUPTED: AtomicBool = AtomicBool::new(false);
    extern "C" fn on_signal(_: libc::c_int) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    }
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet};
    let action = SigAction::new(SigHandler::Handler(on_signal), SaFlags::SA_RESTART, SigSet::empty());
    for signal in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(signal, &action) }.expect("install a signal handler");
    }
    &INTERRUPTED
}

/// Append a line of the run's own to the shared log (one write, O_APPEND).
fn note(log: &Path, line: &str) {
    if let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(log) {
        let _ = f.write_all(format!("{line}\n").as_bytes());
    }
}

fn tempdir() -> PathBuf {
    let base = std::env::temp_dir().join(format!("leaderrun-faultrun-{}-{}", std::process::id(), now_ns()));
    fs::create_dir_all(&base).expect("temp dir");
    base
}
