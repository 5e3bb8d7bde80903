//! A throw-away 3-server ZooKeeper 3.8 ensemble on 127.0.0.1 (Debian's `zookeeper` package), as
//! users run one: each server its own directory (`myid` 1..3), client, quorum and election
//! ports, all listed in every server's `zoo.cfg`. Stopped when dropped.
//!
//! ZooKeeper's defaults except: `tickTime=500` (2 s by default; it scales the election's
//! limits, `initLimit=10` and `syncLimit=5` ticks), `maxSessionTimeout=40000` (the default's
//! 20 ticks at the default 2 s tick, so that leaderrun's default 15 s ttl, whose session is
//! 20.75 s, and the suite's 30 s are granted), `maxClientCnxns=0` (the tests play whole
//! fleets from one address) and the four-letter words `ruok,srvr,stat,cons,mntr`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::cluster::Cluster;
use super::process::ServerProcess;
use super::zookeeper::{four_letters_at, log_tail_of, spawn_java, CLASSPATH};

/// The servers' tick (ms).
pub const TICK_MS: u64 = 500;
/// The longest session the servers grant (ms).
pub const MAX_SESSION_TIMEOUT_MS: u64 = 40_000;

struct Node {
    dir: PathBuf,
    client: u16,
    process: ServerProcess,
}

pub struct ZooKeeperCluster {
    _dir: tempfile::TempDir,
    nodes: Vec<Node>,
}

impl ZooKeeperCluster {
    /// Start three servers and wait until one leads and every one serves.
    pub fn start() -> Self {
        if !std::path::Path::new("/usr/share/java/zookeeper.jar").exists() {
            panic!("ZooKeeper is missing: apt-get install -y zookeeper");
        }
        let mut last = String::new();
        // The ports are picked before any server binds them: one may be taken meanwhile (by
        // another test's server), and then the whole ensemble starts again.
        for _ in 0..5 {
            match Self::try_start() {
                Ok(cluster) => return cluster,
                Err(why) => last = why,
            }
        }
        panic!("the ZooKeeper ensemble does not start: {last}");
    }

    fn try_start() -> Result<Self, String> {
        let dir = tempfile::Builder::new().prefix("leaderrun-zk-cluster-").tempdir().map_err(|e| e.to_string())?;
        let ports: Vec<[u16; 3]> =
            (0..3).map(|_| [super::free_port(), super::free_port(), super::free_port()]).collect();
        let servers: String = ports
            .iter()
            .enumerate()
            .map(|(i, [_, quorum, election])| format!("server.{}=127.0.0.1:{quorum}:{election}\n", i + 1))
            .collect();
        let mut nodes = Vec::new();
        for (i, [client, ..]) in ports.iter().enumerate() {
            let node_dir = dir.path().join(format!("zk{}", i + 1));
            std::fs::create_dir_all(node_dir.join("data")).map_err(|e| e.to_string())?;
            std::fs::write(node_dir.join("data/myid"), format!("{}\n", i + 1)).map_err(|e| e.to_string())?;
            let config = format!(
                "tickTime={TICK_MS}\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr,stat,cons,mntr\nmaxClientCnxns=0\n\
                 maxSessionTimeout={MAX_SESSION_TIMEOUT_MS}\n{servers}",
                node_dir.join("data").display()
            );
            std::fs::write(node_dir.join("zoo.cfg"), config).map_err(|e| e.to_string())?;
            nodes.push(Node { dir: node_dir, client: *client, process: ServerProcess::default() });
        }
        let cluster = Self { _dir: dir, nodes };
        for i in 0..3 {
            cluster.spawn(i)?;
        }
        let started = Instant::now();
        while !(0..3).all(|i| cluster.serving(i)) {
            for (i, node) in cluster.nodes.iter().enumerate() {
                if node.process.exited() {
                    return Err(format!("server {i} exited; log: {}", log_tail_of(&node.dir)));
                }
            }
            if started.elapsed() > Duration::from_secs(60) {
                return Err(format!("no quorum within 60 s; log: {}", log_tail_of(&cluster.nodes[0].dir)));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(cluster)
    }

    fn spawn(&self, i: usize) -> Result<(), String> {
        let child = spawn_java(&self.nodes[i].dir, CLASSPATH)?;
        self.nodes[i].process.set(child);
        Ok(())
    }

    /// Whether server `i` answers `srvr` with a mode: it is in a quorum and takes sessions.
    pub fn serving(&self, i: usize) -> bool {
        self.mode(i).is_some()
    }

    /// Server `i`'s `Mode:` (`leader` or `follower`), if it serves.
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letters_at(self.nodes[i].client, "srvr").ok()?;
        answer.lines().find_map(|l| l.strip_prefix("Mode: ")).map(|m| m.trim().to_string())
    }

    /// Server `i`'s client port.
    pub fn port(&self, i: usize) -> u16 {
        self.nodes[i].client
    }

    /// The servers holding a client connection whose session was granted `timeout_ms`
    /// (`cons`: every connection with its session's `to=`), as indexes.
    pub fn holding_sessions_of(&self, timeout_ms: u64) -> Vec<usize> {
        let needle = format!(",to={timeout_ms},");
        (0..3)
            .filter(|i| four_letters_at(self.nodes[*i].client, "cons").is_ok_and(|answer| answer.contains(&needle)))
            .collect()
    }

    pub fn log_tail(&self, i: usize) -> String {
        log_tail_of(&self.nodes[i].dir)
    }
}

impl Cluster for ZooKeeperCluster {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    /// `zk://127.0.0.1:Pfirst,127.0.0.1:P…` (no credentials, the default root).
    fn url_from(&self, first: usize) -> String {
        let n = self.nodes.len();
        let hosts: Vec<String> = (0..n).map(|k| format!("127.0.0.1:{}", self.nodes[(first + k) % n].client)).collect();
        format!("zk://{}", hosts.join(","))
    }

    fn leader(&self) -> Option<usize> {
        (0..self.nodes.len())
            .find(|i| self.nodes[*i].process.pid().is_some() && self.mode(*i).as_deref() == Some("leader"))
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].process.pid()
    }

    fn kill(&self, i: usize) {
        if let Some(pid) = self.pid(i) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // Reaped, and forgotten.
        let started = Instant::now();
        while self.nodes[i].process.pid().is_some() && !self.nodes[i].process.exited() {
            assert!(started.elapsed() < Duration::from_secs(30), "server {i} does not die");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn restart(&self, i: usize) {
        if self.pid(i).is_none() {
            self.spawn(i).unwrap_or_else(|why| panic!("server {i} does not start again: {why}"));
        }
        let started = Instant::now();
        while !self.serving(i) {
            assert!(started.elapsed() < Duration::from_secs(60), "server {i} not serving: {}", self.log_tail(i));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ZooKeeperCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for i in 0..self.nodes.len() {
                eprintln!("ZooKeeper server {i}'s log ends with: {}", self.log_tail(i));
            }
        }
        // The processes (frozen ones too) themselves are killed when `process` is dropped.
    }
}
