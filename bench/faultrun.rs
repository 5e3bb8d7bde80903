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
//! With `--replicated async|sync` (postgres; mariadb and redis: async) it starts a primary with
//! replicas instead (PostgreSQL: a streaming standby behind a moving endpoint; MariaDB: an
//! asynchronous replica behind one; Redis: two replicas and three Sentinels, reached by a
//! `redis+sentinel://` URL), and every fault is a failover: the primary SIGKILLed and a replica
//! promoted, then a new replica added. Either the replica has caught up first, or (async only)
//! the run keeps writes off it, makes the holder stand down (`leaderrun release`) and fails
//! over once another contender has been granted the lock: the new primary never saw that grant.
//! Tokens must still rise and no two children overlap; the report gives the takeover time after
//! each kind and the leases lost to failovers that lost nothing.
//!
//! Here: the run's settings, the schedule (a fault every gap, on the current holder) and the
//! report. The faults and how each is applied are in `faults.rs`, the contenders and their
//! supervisor in `contenders.rs`, the reading of the log in `checker.rs`, the store in
//! `backend.rs`.
//!
//! A test instrument, not part of leaderrun.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::{Rng, SeedableRng};

mod backend;
mod checker;
mod contenders;
mod faults;
mod proxy;
#[path = "../tests/servers/mod.rs"]
mod servers;

use backend::{Backend, Kind, Replication};
use checker::{check, Applied};
use faults::Fault;

const LOCK: &str = "faultrun";

/// The probe beats every 50 ms: two beats of slack when judging whether a child
/// outlived a moment.
const BEAT_SLACK_NS: u64 = 100_000_000;

fn now_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
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
    /// A primary and replicas (PostgreSQL, MariaDB, Redis with Sentinel), failed over.
    replicated: Option<Replication>,
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
        replicated: None,
    };
    let mut ttl_given = false;
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
            "--ttl" => {
                c.ttl = dur(it.next(), "--ttl")?;
                ttl_given = true;
            }
            "--replicated" => {
                c.replicated = Some(Replication::parse(&it.next().ok_or("--replicated needs async or sync")?)?)
            }
            "--renew-every" => c.renew_every = dur(it.next(), "--renew-every")?,
            "--kill-after" => c.kill_after = dur(it.next(), "--kill-after")?,
            "--gap-min" => c.gap_min = dur(it.next(), "--gap-min")?,
            "--gap-max" => c.gap_max = dur(it.next(), "--gap-max")?,
            "--keep" => c.keep = Some(it.next().ok_or("--keep needs a directory")?.into()),
            "--report" => c.report = Some(it.next().ok_or("--report needs a file")?.into()),
            "--cluster" => c.cluster = true,
            "--store" => {
                c.store = Kind::parse(&it.next().ok_or(
                    "--store needs a store name (sqlite, postgres, mariadb, redis, etcd, nats, zookeeper, kubernetes, s3, dynamodb, gcs, datastore, azblob)",
                )?)?
            }
            "-h" | "--help" => {
                println!(
                    "usage: leaderrun-faultrun [--faults N] [--contenders N] [--ttl DUR] [--renew-every DUR] \
                     [--kill-after DUR] [--gap-min DUR] [--gap-max DUR] [--seed N] [--keep DIR] [--report FILE.md] \
                     [--store sqlite|postgres|mariadb|redis|etcd|nats|zookeeper|kubernetes|s3|dynamodb|gcs|datastore|azblob] \
                     [--cluster (etcd, nats, zookeeper: 3 nodes)] [--slots N (contenders: N + 2 by default)] \
                     [--replicated async|sync (postgres: async or sync; mariadb, redis: async)]"
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
    if c.replicated.is_some() && !matches!(c.store, Kind::Postgres | Kind::Mariadb | Kind::Redis) {
        return Err("--replicated needs --store postgres, mariadb or redis".into());
    }
    // A failover (a promotion, a Sentinel's election) takes a second or two: a lease that is to
    // ride out one it did not lose needs a ttl well above that.
    if c.replicated.is_some() && !ttl_given {
        c.ttl = Duration::from_secs(6);
        c.renew_every = Duration::from_secs(1);
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
    let backend = if let Some(replication) = config.replicated {
        Backend::start_replicated(config.store, replication).unwrap_or_else(|e| {
            eprintln!("leaderrun-faultrun: {e}");
            std::process::exit(2)
        })
    } else if config.cluster {
        Backend::start_cluster(config.store, config.contenders)
    } else {
        Backend::start(config.store, &dir, config.contenders)
    };
    let kinds: Vec<Fault> = Fault::ALL
        .into_iter()
        .filter(|f| match () {
            // A replicated store's run is one of failovers; a synchronous replica cannot be made
            // to miss an acknowledged write.
            _ if backend.is_replicated() => {
                f.needs_replicas() && !(backend.is_synchronous() && *f == Fault::FailOverLosing)
            }
            _ if f.needs_replicas() => false,
            _ if f.needs_cluster() => backend.is_cluster(),
            _ => !f.needs_server() || backend.has_server(),
        })
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
        // A takeover after a crash waits out the lease: 30 s, or four ttls when that is longer
        // (a frozen server's 1.5 ttl, then the lease it left).
        let within = Duration::from_secs(30).max(run.config.ttl * 4);
        let Some((holder, wrapper)) = run.current_holder(within) else {
            eprintln!("leaderrun-faultrun: no holder emerged within {} s (after {n} faults)", within.as_secs());
            liveness_failure = true;
            break;
        };
        let fault = kinds[rng.random_range(0..kinds.len())];
        // A failover that loses a lease: first a grant the replica never sees.
        let (holder, wrapper) = if fault == Fault::FailOverLosing {
            match run.lose_next_lease(&holder, within) {
                Some((released, next)) => {
                    applied.push(released);
                    // Fail over at a random moment of the new holder's first renewals.
                    thread::sleep(run.config.renew_every.mul_f64(rng.random_range(0.0..2.0)));
                    next
                }
                None => {
                    eprintln!("leaderrun-faultrun: no new holder emerged after a release (after {n} faults)");
                    liveness_failure = true;
                    break;
                }
            }
        } else {
            (holder, wrapper)
        };
        let at = now_ns();
        note(&log, &format!("FAULT {holder} {:?} {at}", fault));
        run.apply(fault, &holder, wrapper);
        note(&log, &format!("HEALED {holder} {:?} {}", fault, now_ns()));
        applied.push(Applied { fault, holder, at, first_step: false });
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
    if let Some(setup) = run.backend.describe() {
        out.push_str(&format!(
            "\n{setup}; each failover SIGKILLs the primary and promotes a replica, then adds a new one"
        ));
    } else if run.backend.is_cluster() {
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
