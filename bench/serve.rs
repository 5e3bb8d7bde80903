//! `leaderrun-serve`: one store's server for the benchmarks, started through the tests' own
//! server code (`tests/servers/`, by way of the fault run's `Backend`), so that the benchmarks
//! and the tests run the same servers with the same settings.
//!
//!     leaderrun-serve --store NAME [--cluster] --dir DIR
//!     leaderrun-serve --list
//!
//! It starts the server (with `--cluster`, a 3-node cluster of etcd, NATS or ZooKeeper) and
//! prints one JSON line on stdout: what a client needs to reach it (`url`, and `env`: the
//! variables some stores take their server from), `secret` (the password in the URL, for the
//! report to blank), and for etcd `endpoints` (for `etcdctl`). A cluster adds `urls` (the URL
//! listing node `i` first, for each node) and `pids`.
//!
//! Then it reads commands on stdin, one a line, and answers each with one JSON line once it is
//! done (`{"error": ...}` when it failed):
//!
//! - any store: `stop`; and `kill SECS` (SIGKILL the server, keep it down, start it again),
//!   `freeze SECS` (SIGSTOP, then SIGCONT).
//! - a cluster: `leader` and `follower` (a node index; for NATS the leader is that of the
//!   bucket's stream once it exists, before that JetStream's meta leader), `wait-leader SECS`,
//!   `pid I`, `kill I` (SIGKILL, reaped), `restart I` (same ports and data, once it answers),
//!   `freeze I`, `thaw I`, `restore I` (thawed or started again, and a leader elected),
//!   `kill-node I SECS` and `freeze-node I SECS` (the fault, then `restore I`).
//!
//! It stops the server on `stop`, at the end of its input (so a benchmark that crashed leaves
//! no server behind) and on SIGTERM, SIGINT or SIGHUP.
//!
//! A test instrument, not part of leaderrun.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

// The fault run's store, of which only the start, the URL and the server faults are used here.
#[allow(dead_code)]
mod backend;
mod proxy;
#[path = "../tests/servers/mod.rs"]
mod servers;

use backend::{Backend, Kind};
use leaderrun::store::registry;
use servers::cluster::Cluster;
use servers::{etcd_cluster::EtcdCluster, nats_cluster::NatsCluster, zookeeper_cluster::ZooKeeperCluster};

const CLUSTERS: [&str; 3] = ["etcd", "nats", "zookeeper"];

/// The NATS cluster's bucket, replicated on all three servers; its stream is `KV_bench`.
const NATS_BUCKET: &str = "bench";

/// A 3-node cluster, as the tests start it.
enum Engine {
    Etcd(EtcdCluster),
    Nats(NatsCluster),
    ZooKeeper(ZooKeeperCluster),
}

impl Engine {
    fn start(kind: Kind) -> Result<Self, String> {
        match kind {
            Kind::Etcd => Ok(Engine::Etcd(EtcdCluster::start())),
            Kind::Nats => Ok(Engine::Nats(NatsCluster::start())),
            Kind::ZooKeeper => Ok(Engine::ZooKeeper(ZooKeeperCluster::start())),
            other => Err(format!("no cluster of {other:?}: only {}", CLUSTERS.join(", "))),
        }
    }

    fn cluster(&self) -> &dyn Cluster {
        match self {
            Engine::Etcd(c) => c,
            Engine::Nats(c) => c,
            Engine::ZooKeeper(c) => c,
        }
    }

    /// The store URL listing node `first` first (NATS: with the replicated bucket).
    fn url_from(&self, first: usize) -> String {
        match self {
            Engine::Nats(c) => format!("{}/{NATS_BUCKET}?replicas=3", c.url_from(first)),
            other => other.cluster().url_from(first),
        }
    }
}

/// A cluster and what the benchmarks need beyond the tests' `Cluster`: which nodes are frozen,
/// and NATS's bucket stream as the leader that matters to a lease.
struct Nodes {
    engine: Engine,
    frozen: BTreeSet<usize>,
    /// NATS: the bucket's stream has been seen with a leader, so it exists from then on.
    stream_seen: bool,
}

impl Nodes {
    fn up(&self, i: usize) -> bool {
        self.engine.cluster().pid(i).is_some() && !self.frozen.contains(&i)
    }

    /// The node that leads now: a lease's writes go through it. A frozen node leads nothing.
    fn leader(&mut self) -> Option<usize> {
        let leader = match &self.engine {
            Engine::Nats(c) => match c.stream_leader(&format!("KV_{NATS_BUCKET}")) {
                Some(i) => {
                    self.stream_seen = true;
                    Some(i)
                }
                None if self.stream_seen => None,
                None => c.leader(),
            },
            other => other.cluster().leader(),
        };
        leader.filter(|i| !self.frozen.contains(i))
    }

    fn wait_for_leader(&mut self, within: Duration) -> Option<usize> {
        let started = Instant::now();
        loop {
            if let Some(leader) = self.leader() {
                return Some(leader);
            }
            if started.elapsed() >= within {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A node that is up and does not lead (NATS: nor is JetStream's meta leader, if another
    /// such node is up); the lowest such index.
    fn follower(&mut self) -> Option<usize> {
        let leader = self.leader();
        let others: Vec<usize> =
            (0..self.engine.cluster().len()).filter(|i| Some(*i) != leader && self.up(*i)).collect();
        let meta = match &self.engine {
            Engine::Nats(c) => c.meta_leader().and_then(|name| name.strip_prefix('n')?.parse::<usize>().ok()),
            _ => None,
        };
        others.iter().copied().find(|i| Some(*i) != meta).or(others.first().copied())
    }

    fn kill(&mut self, i: usize) {
        self.engine.cluster().kill(i);
        self.frozen.remove(&i);
    }

    /// Node `i` again, same ports and data, once it answers (a NATS server also once its
    /// streams have caught up, for at most 30 s: the next fault then finds three replicas).
    fn restart(&mut self, i: usize) {
        self.engine.cluster().restart(i);
        if let Engine::Nats(c) = &self.engine {
            let started = Instant::now();
            while !c.nodes[i].monitor_get("/healthz").is_some_and(|body| body.contains("ok"))
                && started.elapsed() < Duration::from_secs(30)
            {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn freeze(&mut self, i: usize) {
        self.engine.cluster().freeze(i);
        self.frozen.insert(i);
    }

    fn thaw(&mut self, i: usize) {
        self.engine.cluster().thaw(i);
        self.frozen.remove(&i);
    }

    /// Node `i` back (thawed if frozen, started again if killed) and a leader elected: every
    /// repetition starts from a whole cluster.
    fn restore(&mut self, i: usize) -> Result<Value, String> {
        if self.frozen.contains(&i) {
            self.thaw(i);
        }
        if self.engine.cluster().pid(i).is_none() {
            self.restart(i);
        }
        match self.wait_for_leader(Duration::from_secs(60)) {
            Some(leader) => Ok(json!({ "leader": leader })),
            None => Err(format!("no leader 60 s after node {i} came back")),
        }
    }

    fn stop(&mut self) {
        // A frozen node would hold up its SIGTERM.
        for i in std::mem::take(&mut self.frozen) {
            self.engine.cluster().thaw(i);
        }
    }
}

enum Served {
    Single(Backend),
    Cluster(Nodes),
}

impl Served {
    fn start(kind: Kind, cluster: bool, dir: &std::path::Path) -> Result<Self, String> {
        if cluster {
            let engine = Engine::start(kind)?;
            Ok(Served::Cluster(Nodes { engine, frozen: BTreeSet::new(), stream_seen: false }))
        } else {
            // No contenders: no proxies, the clients reach the server itself.
            Ok(Served::Single(Backend::start(kind, dir, 0)))
        }
    }

    /// The first line: what a client needs to reach the store.
    fn describe(&self, name: &str) -> Value {
        let (url, env) = match self {
            Served::Single(b) => {
                let env: serde_json::Map<String, Value> =
                    b.env(None).into_iter().map(|(k, v)| (k, Value::from(v.display().to_string()))).collect();
                (b.url(), env)
            }
            Served::Cluster(nodes) => (nodes.engine.url_from(0), serde_json::Map::new()),
        };
        let mut out = json!({ "store": name, "url": url, "env": env, "secret": password_in(&url) });
        if let Some(hosts) = url.strip_prefix("etcd://") {
            let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
            out["endpoints"] = Value::from(endpoints.join(","));
        }
        if let Served::Cluster(nodes) = self {
            let c = nodes.engine.cluster();
            out["cluster"] = Value::from(true);
            out["urls"] = (0..c.len()).map(|i| nodes.engine.url_from(i)).collect();
            out["pids"] = (0..c.len()).map(|i| c.pid(i)).collect();
        }
        out
    }

    /// Carry out one command line; `Ok(None)` for `stop`.
    fn command(&mut self, line: &str) -> Result<Option<Value>, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |at: usize| -> Result<f64, String> {
            words.get(at).and_then(|w| w.parse::<f64>().ok()).ok_or(format!("{line:?}: a number expected"))
        };
        let secs = |at: usize| number(at).map(Duration::from_secs_f64);
        let done = || Ok(Some(json!({ "ok": true })));
        if words.first() == Some(&"stop") {
            return Ok(None);
        }
        match self {
            Served::Single(b) => match words.as_slice() {
                ["kill", _] => {
                    b.kill_server(secs(1)?);
                    done()
                }
                ["freeze", _] => {
                    b.freeze_server(secs(1)?);
                    done()
                }
                _ => Err(format!("{line:?}: a single server takes kill SECS, freeze SECS, stop")),
            },
            Served::Cluster(nodes) => {
                let len = nodes.engine.cluster().len();
                let node = || match number(1)? {
                    i if i >= 0.0 && (i as usize) < len && i.fract() == 0.0 => Ok(i as usize),
                    _ => Err(format!("{line:?}: no such node")),
                };
                match words.as_slice() {
                    ["leader"] => Ok(Some(json!({ "leader": nodes.leader() }))),
                    ["wait-leader", _] => Ok(Some(json!({ "leader": nodes.wait_for_leader(secs(1)?) }))),
                    ["follower"] => Ok(Some(json!({ "follower": nodes.follower() }))),
                    ["pid", _] => Ok(Some(json!({ "pid": nodes.engine.cluster().pid(node()?) }))),
                    ["kill", _] => {
                        nodes.kill(node()?);
                        done()
                    }
                    ["restart", _] => {
                        nodes.restart(node()?);
                        done()
                    }
                    ["freeze", _] => {
                        nodes.freeze(node()?);
                        done()
                    }
                    ["thaw", _] => {
                        nodes.thaw(node()?);
                        done()
                    }
                    ["restore", _] => nodes.restore(node()?).map(Some),
                    ["kill-node", _, _] => {
                        let (i, down) = (node()?, secs(2)?);
                        nodes.kill(i);
                        std::thread::sleep(down);
                        nodes.restore(i).map(Some)
                    }
                    ["freeze-node", _, _] => {
                        let (i, frozen) = (node()?, secs(2)?);
                        nodes.freeze(i);
                        std::thread::sleep(frozen);
                        nodes.restore(i).map(Some)
                    }
                    _ => Err(format!(
                        "{line:?}: a cluster takes leader, follower, wait-leader SECS, pid I, kill I, restart I, \
                         freeze I, thaw I, restore I, kill-node I SECS, freeze-node I SECS, stop"
                    )),
                }
            }
        }
    }

    fn stop(self) {
        if let Served::Cluster(mut nodes) = self {
            nodes.stop();
        }
        // Dropping the test servers stops them and deletes their directories.
    }
}

/// The password in a URL's user information (`scheme://user:PASSWORD@host`), if any.
fn password_in(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let userinfo = rest.split_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (!password.is_empty()).then(|| password.to_string())
}

/// Run `f`, turning a panic of the tests' server code (how it reports a failure) into an error.
fn guarded<T>(f: impl FnOnce() -> Result<T, String>) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let text = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panicked".to_string());
        Err(text)
    })
}

fn say(value: &Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{value}");
    let _ = out.flush();
}

struct Args {
    kind: Kind,
    name: String,
    cluster: bool,
    dir: PathBuf,
}

fn parse_args() -> Result<Option<Args>, String> {
    let (mut name, mut cluster, mut dir) = (None, false, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--store" => name = Some(it.next().ok_or("--store needs a store name")?),
            "--cluster" => cluster = true,
            "--dir" => dir = Some(PathBuf::from(it.next().ok_or("--dir needs a directory")?)),
            "--list" => {
                // The registry's stores that have a test server here, in the registry's order.
                registry::STORES.iter().filter(|s| Kind::parse(s.name).is_ok()).for_each(|s| println!("{}", s.name));
                CLUSTERS.iter().for_each(|s| println!("{s} --cluster"));
                return Ok(None);
            }
            "-h" | "--help" => {
                println!("usage: leaderrun-serve --store NAME [--cluster] --dir DIR | --list");
                return Ok(None);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let name = name.ok_or("--store NAME is needed (--list names them)")?;
    let kind = Kind::parse(&name)?;
    if cluster && !matches!(kind, Kind::Etcd | Kind::Nats | Kind::ZooKeeper) {
        return Err(format!("--cluster needs --store {}", CLUSTERS.join(", ")));
    }
    let dir = dir.ok_or("--dir DIR is needed")?;
    Ok(Some(Args { kind, name, cluster, dir }))
}

fn main() {
    let args = match parse_args() {
        Ok(Some(args)) => args,
        Ok(None) => return,
        Err(e) => {
            eprintln!("leaderrun-serve: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::create_dir_all(&args.dir) {
        eprintln!("leaderrun-serve: {}: {e}", args.dir.display());
        std::process::exit(2);
    }
    let served = match guarded(|| Served::start(args.kind, args.cluster, &args.dir)) {
        Ok(served) => Arc::new(Mutex::new(Some(served))),
        Err(why) => {
            say(&json!({ "error": format!("the {} server did not start: {why}", args.name) }));
            std::process::exit(1);
        }
    };
    stop_on_signal(Arc::clone(&served));
    say(&served.lock().unwrap().as_ref().expect("started").describe(&args.name));

    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        if line.trim().is_empty() {
            continue;
        }
        let mut guard = served.lock().unwrap_or_else(|e| e.into_inner());
        let Some(server) = guard.as_mut() else { break };
        match guarded(|| server.command(&line)) {
            Ok(Some(answer)) => say(&answer),
            Ok(None) => break,
            Err(why) => say(&json!({ "error": why })),
        }
    }
    if let Some(server) = served.lock().unwrap_or_else(|e| e.into_inner()).take() {
        server.stop();
    }
    say(&json!({ "stopped": true }));
}

/// SIGTERM, SIGINT or SIGHUP stop the server (once the command under way is done) and exit.
fn stop_on_signal(served: Arc<Mutex<Option<Served>>>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]).expect("signal handlers");
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            if let Some(server) = served.lock().unwrap_or_else(|e| e.into_inner()).take() {
                server.stop();
            }
            std::process::exit(128 + signal);
        }
    });
}
