//! A throw-away 3-server NATS cluster with JetStream on 127.0.0.1, as users run one: each
//! server a `Nats` of its own (ports, directory, `sync_interval: always`), named `n0`, `n1`,
//! `n2` and routed to the others, sharing one user and password. Stopped when dropped.
//!
//! Its `Cluster` leader is the JetStream meta leader (which places streams); a bucket's stream
//! has a leader of its own, which takes its writes: `stream_leader` says which server.

use std::time::{Duration, Instant};

use super::cluster::Cluster;
use super::nats::Nats;

pub struct NatsCluster {
    pub nodes: Vec<Nats>,
    password: String,
}

impl NatsCluster {
    /// Start three servers and wait until JetStream has a meta leader (a stream can be made).
    pub fn start() -> Self {
        let password = format!("Sekr1t-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let mut last = String::new();
        // The route ports are picked before any server listens on them: one may be taken
        // meanwhile (by another test's server), and then the whole cluster starts again.
        for _ in 0..5 {
            match Self::try_start(&password) {
                Ok(nodes) => {
                    let cluster = Self { nodes, password };
                    cluster.wait_for_meta_leader(Duration::from_secs(60));
                    return cluster;
                }
                Err(why) => last = why,
            }
        }
        panic!("the NATS cluster does not start: {last}");
    }

    fn try_start(password: &str) -> Result<Vec<Nats>, String> {
        let routes: Vec<u16> = (0..3).map(|_| super::free_port()).collect();
        let listed: Vec<String> = routes.iter().map(|port| format!("nats-route://127.0.0.1:{port}")).collect();
        // Each server starts alone and waits for its routes; JetStream is enabled on each
        // before a meta leader exists, which `start` then waits for.
        let mut nodes = Vec::new();
        for (i, port) in routes.iter().enumerate() {
            let extra = format!(
                "server_name: n{i}\ncluster {{\n  name: leaderrun-test\n  listen: 127.0.0.1:{port}\n  routes: [{}]\n}}\n",
                listed.join(", ")
            );
            nodes.push(Nats::try_start_in_cluster(&extra, password)?); // the others stop when dropped
        }
        Ok(nodes)
    }

    /// `nats://leaderrun:PASSWORD@127.0.0.1:P0,127.0.0.1:P1,127.0.0.1:P2`.
    pub fn url(&self) -> String {
        self.url_from(0)
    }

    /// The URL of server `i` alone, as a client that knows only that one would connect.
    pub fn url_of(&self, i: usize) -> String {
        format!("nats://{}:{}@127.0.0.1:{}", super::nats::USER, self.password, self.nodes[i].port())
    }

    /// The JetStream meta leader's name, as the first running server that answers reports it.
    pub fn meta_leader(&self) -> Option<String> {
        self.nodes.iter().filter(|node| node.pid().is_some()).find_map(|node| {
            let body = node.monitor_get("/jsz")?;
            let json: serde_json::Value = serde_json::from_str(&body).ok()?;
            json["meta_cluster"]["leader"].as_str().filter(|l| !l.is_empty()).map(str::to_string)
        })
    }

    /// Wait for a meta leader that sees both other servers current: until then a replicated
    /// bucket cannot be placed ("no suitable peers for placement, peer offline"), which on a
    /// loaded machine can last a while after the leader is elected.
    fn wait_for_meta_leader(&self, within: Duration) {
        let started = Instant::now();
        while self.meta_leader().is_none() || !self.every_peer_current() {
            assert!(
                started.elapsed() < within,
                "the NATS cluster had no JetStream meta leader with every peer current within {within:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether a server that knows the meta leader reports the other two servers current.
    fn every_peer_current(&self) -> bool {
        self.nodes.iter().filter(|node| node.pid().is_some()).any(|node| {
            let Some(json) = node.monitor_get("/jsz").and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
            else {
                return false;
            };
            let meta = &json["meta_cluster"];
            let replicas = meta["replicas"].as_array().map(Vec::as_slice).unwrap_or_default();
            meta["leader"].as_str().is_some_and(|l| !l.is_empty())
                && replicas.len() == self.nodes.len() - 1
                && replicas.iter().all(|r| r["current"].as_bool() == Some(true) && r["offline"].as_bool() != Some(true))
        })
    }

    /// The index of the server named `name` (`n0`, `n1`, `n2`).
    fn index_of(&self, name: &str) -> Option<usize> {
        name.strip_prefix('n').and_then(|i| i.parse().ok()).filter(|i| *i < self.nodes.len())
    }

    /// The server that leads the stream `stream` (a bucket's is `KV_<bucket>`) as the running
    /// servers that host it report it: `None` while it has none, or none of them knows it.
    /// A killed leader is not reported (its index has no process).
    pub fn stream_leader(&self, stream: &str) -> Option<usize> {
        let leader = self.nodes.iter().filter(|node| node.pid().is_some()).find_map(|node| {
            let body = node.monitor_get("/jsz?accounts=true&streams=true")?;
            let json: serde_json::Value = serde_json::from_str(&body).ok()?;
            find_stream_leader(&json, stream)
        })?;
        self.index_of(&leader).filter(|i| self.nodes[*i].pid().is_some())
    }

    /// How many client connections named `name` server `i` has (`/connz`).
    pub fn clients_named(&self, i: usize, name: &str) -> usize {
        let Some(body) = self.nodes[i].monitor_get("/connz?limit=1000") else { return 0 };
        let json: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        json["connections"].as_array().map_or(0, |c| c.iter().filter(|c| c["name"] == name).count())
    }

    /// Wait until the stream `stream` has a leader other than `not`, at most `within`.
    pub fn wait_for_stream_leader(&self, stream: &str, not: Option<usize>, within: Duration) -> Option<usize> {
        let started = Instant::now();
        loop {
            match self.stream_leader(stream) {
                Some(leader) if Some(leader) != not => return Some(leader),
                _ if started.elapsed() >= within => return None,
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// In a `/jsz?accounts=true&streams=true` answer, the leader named for the stream `stream`.
fn find_stream_leader(json: &serde_json::Value, stream: &str) -> Option<String> {
    match json {
        serde_json::Value::Object(map) => {
            if map.get("name").and_then(|n| n.as_str()) == Some(stream) {
                if let Some(leader) = map.get("cluster").and_then(|c| c["leader"].as_str()).filter(|l| !l.is_empty()) {
                    return Some(leader.to_string());
                }
            }
            map.values().find_map(|v| find_stream_leader(v, stream))
        }
        serde_json::Value::Array(items) => items.iter().find_map(|v| find_stream_leader(v, stream)),
        _ => None,
    }
}

impl Cluster for NatsCluster {
    fn len(&self) -> usize {
        self.nodes.len()
    }

    fn url_from(&self, first: usize) -> String {
        let n = self.nodes.len();
        let hosts: Vec<String> = (0..n).map(|k| format!("127.0.0.1:{}", self.nodes[(first + k) % n].port())).collect();
        format!("nats://{}:{}@{}", super::nats::USER, self.password, hosts.join(","))
    }

    /// The JetStream meta leader (`Cluster::leader`); see `stream_leader` for a bucket's.
    fn leader(&self) -> Option<usize> {
        self.meta_leader().and_then(|name| self.index_of(&name)).filter(|i| self.nodes[*i].pid().is_some())
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].pid()
    }

    fn kill(&self, i: usize) {
        if let Some(pid) = self.nodes[i].pid() {
            unsafe { libc::kill(pid as i32, libc::SIGCONT) };
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        self.nodes[i].stop(); // reaps it
    }

    fn restart(&self, i: usize) {
        self.nodes[i].start_again();
    }
}
