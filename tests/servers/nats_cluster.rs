//! A throw-away 3-server NATS cluster with JetStream on 127.0.0.1, as users run one: each
//! server a `Nats` of its own (ports, directory, `sync_interval: always`), named and routed to
//! the others, sharing one user and password. Stopped when dropped.

use std::time::{Duration, Instant};

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
        let hosts: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        format!("nats://{}:{}@{}", super::nats::USER, self.password, hosts.join(","))
    }

    /// The URL of server `i` alone, as a client that knows only that one would connect.
    pub fn url_of(&self, i: usize) -> String {
        format!("nats://{}:{}@127.0.0.1:{}", super::nats::USER, self.password, self.nodes[i].port())
    }

    /// The JetStream meta leader's name, as the first server that answers reports it.
    pub fn meta_leader(&self) -> Option<String> {
        self.nodes.iter().find_map(|node| {
            let body = node.monitor_get("/jsz")?;
            let json: serde_json::Value = serde_json::from_str(&body).ok()?;
            json["meta_cluster"]["leader"].as_str().filter(|l| !l.is_empty()).map(str::to_string)
        })
    }

    fn wait_for_meta_leader(&self, within: Duration) {
        let started = Instant::now();
        while self.meta_leader().is_none() {
            assert!(started.elapsed() < within, "the NATS cluster elected no JetStream meta leader within {within:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
