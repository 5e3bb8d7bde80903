//! The store under the fault run: the embedded SQLite file, or a real server started
//! here (the tests' own server support), with one TCP proxy per contender so that a
//! single contender's network can be cut, reset or slowed; or a 3-node cluster (etcd, NATS,
//! ZooKeeper) whose nodes are killed and frozen one at a time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::proxy::{Mode, Proxy};
use crate::servers::cluster::Cluster;
use crate::servers::{
    datastore_emulator::DatastoreEmulator, etcd::Etcd, fake_gcs::FakeGcs, kubernetes::KubeApiServer, mariadb::Mariadb,
    moto::Moto, moto_dynamodb::MotoDynamo, nats::Nats, postgres::Postgres, redis::Redis, zookeeper::ZooKeeper,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    Postgres,
    Mariadb,
    Redis,
    Etcd,
    Nats,
    ZooKeeper,
    Kubernetes,
    S3,
    DynamoDb,
    Gcs,
    Datastore,
}

impl Kind {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "sqlite" => Ok(Kind::Sqlite),
            "postgres" | "postgresql" => Ok(Kind::Postgres),
            "mariadb" | "mysql" => Ok(Kind::Mariadb),
            "redis" => Ok(Kind::Redis),
            "etcd" => Ok(Kind::Etcd),
            "nats" => Ok(Kind::Nats),
            "zookeeper" | "zk" => Ok(Kind::ZooKeeper),
            "kubernetes" | "k8s" => Ok(Kind::Kubernetes),
            "s3" => Ok(Kind::S3),
            "dynamodb" => Ok(Kind::DynamoDb),
            "gcs" | "gs" => Ok(Kind::Gcs),
            "datastore" => Ok(Kind::Datastore),
            other => Err(format!(
                "--store {other:?}: the fault run knows sqlite, postgres, mariadb, redis, etcd, nats, zookeeper, \
                 kubernetes, s3, dynamodb, gcs, datastore"
            )),
        }
    }
}

enum Server {
    Sqlite(String),
    Postgres(Postgres),
    Mariadb(Mariadb),
    Redis(Redis),
    Etcd(Etcd),
    Nats(Nats),
    ZooKeeper(ZooKeeper),
    Kubernetes(KubeApiServer),
    S3(Moto),
    /// moto's DynamoDB (the same server as S3's, with a table).
    DynamoDb(MotoDynamo),
    Gcs(FakeGcs),
    Datastore(DatastoreEmulator),
    /// A 3-node cluster, and what follows each node list in the URL (NATS: the bucket,
    /// replicated on all three).
    Cluster(Box<dyn Cluster>, &'static str),
}

pub struct Backend {
    server: Server,
    proxies: Vec<Proxy>,
    /// Kubernetes: one kubeconfig per contender, naming its proxy as the API server.
    kubeconfigs: Vec<PathBuf>,
}

impl Backend {
    /// Start the store (and, for a server, one proxy per contender).
    pub fn start(kind: Kind, dir: &Path, contenders: usize) -> Self {
        let server = match kind {
            Kind::Sqlite => Server::Sqlite(format!("sqlite://{}", dir.join("locks.db").display())),
            Kind::Postgres => Server::Postgres(Postgres::start()),
            Kind::Mariadb => Server::Mariadb(Mariadb::start()),
            Kind::Redis => Server::Redis(Redis::start()),
            Kind::Etcd => Server::Etcd(Etcd::start()),
            Kind::Nats => Server::Nats(Nats::start()),
            Kind::ZooKeeper => Server::ZooKeeper(ZooKeeper::start()),
            Kind::Kubernetes => Server::Kubernetes(KubeApiServer::start()),
            Kind::S3 => Server::S3(Moto::start()),
            Kind::DynamoDb => Server::DynamoDb(MotoDynamo::start()),
            Kind::Gcs => Server::Gcs(FakeGcs::start()),
            Kind::Datastore => Server::Datastore(DatastoreEmulator::start()),
        };
        let mut backend = Self { server, proxies: Vec::new(), kubeconfigs: Vec::new() };
        if let Some(port) = backend.port() {
            let target: SocketAddr = ([127, 0, 0, 1], port).into();
            backend.proxies = (0..contenders).map(|_| Proxy::start(target).expect("start a proxy")).collect();
        }
        if let Server::Kubernetes(api) = &backend.server {
            // The server's certificate names 127.0.0.1, whatever the port: only the port changes.
            let text = std::fs::read_to_string(api.kubeconfig()).expect("read the kubeconfig");
            let direct = format!("https://127.0.0.1:{}", api.port());
            for (i, proxy) in backend.proxies.iter().enumerate() {
                let path = dir.join(format!("kubeconfig-{i}"));
                let through = text.replace(&direct, &format!("https://127.0.0.1:{}", proxy.port()));
                std::fs::write(&path, through).expect("write a contender's kubeconfig");
                backend.kubeconfigs.push(path);
            }
        }
        backend
    }

    /// A 3-node cluster of an engine that has one (etcd, NATS, ZooKeeper), without proxies:
    /// its faults are a node's, not one contender's network. Contender `i`'s URL lists node
    /// `i mod 3` first, so that the holder's preferred node is known.
    pub fn start_cluster(kind: Kind, _contenders: usize) -> Self {
        use crate::servers::{
            etcd_cluster::EtcdCluster, nats_cluster::NatsCluster, zookeeper_cluster::ZooKeeperCluster,
        };
        let server = match kind {
            Kind::Etcd => Server::Cluster(Box::new(EtcdCluster::start()), ""),
            Kind::Nats => Server::Cluster(Box::new(NatsCluster::start()), "/faultrun?replicas=3"),
            Kind::ZooKeeper => Server::Cluster(Box::new(ZooKeeperCluster::start()), ""),
            other => panic!("no cluster of {other:?}"),
        };
        Self { server, proxies: Vec::new(), kubeconfigs: Vec::new() }
    }

    pub fn is_cluster(&self) -> bool {
        matches!(self.server, Server::Cluster(..))
    }

    /// The node that leads the cluster now.
    pub fn leader_node(&self) -> Option<usize> {
        match &self.server {
            Server::Cluster(cluster, _) => cluster.wait_for_leader(Duration::from_secs(30)),
            _ => None,
        }
    }

    /// The node contender `slot`'s URL lists first.
    pub fn preferred_node(&self, slot: usize) -> usize {
        match &self.server {
            Server::Cluster(cluster, _) => slot % cluster.len(),
            _ => 0,
        }
    }

    /// SIGKILL node `i`, keep it down for `down`, start it again and wait until it answers
    /// and the cluster has a leader: the next fault never finds two nodes down.
    pub fn kill_node(&self, i: usize, down: Duration) {
        if let Server::Cluster(cluster, _) = &self.server {
            cluster.kill(i);
            std::thread::sleep(down);
            cluster.restart(i);
            cluster.wait_for_leader(Duration::from_secs(60));
        }
    }

    /// SIGSTOP node `i` for `frozen`, then SIGCONT, and wait until the cluster has a leader.
    pub fn freeze_node(&self, i: usize, frozen: Duration) {
        if let Server::Cluster(cluster, _) = &self.server {
            cluster.freeze(i);
            std::thread::sleep(frozen);
            cluster.thaw(i);
            cluster.wait_for_leader(Duration::from_secs(60));
        }
    }

    /// The environment contender `i` (or, with `None`, `status` and `release`) runs with:
    /// where the store takes its credentials and server from there (a kubeconfig, the
    /// AWS CLI's variables).
    pub fn env(&self, contender: Option<usize>) -> Vec<(String, PathBuf)> {
        match &self.server {
            Server::Kubernetes(api) => {
                let file = contender.and_then(|i| self.kubeconfigs.get(i).cloned()).unwrap_or_else(|| api.kubeconfig());
                vec![("KUBECONFIG".to_string(), file)]
            }
            Server::S3(moto) | Server::DynamoDb(MotoDynamo { moto }) => {
                let proxy = contender.and_then(|i| self.proxies.get(i));
                let through = |(name, value): (&str, String)| match (name, proxy) {
                    ("AWS_ENDPOINT_URL", Some(proxy)) => format!("http://127.0.0.1:{}", proxy.port()),
                    _ => value,
                };
                moto.env().into_iter().map(|(name, value)| (name.to_string(), through((name, value)).into())).collect()
            }
            // Cloud Storage: the emulator is named by STORAGE_EMULATOR_HOST, never in the URL.
            Server::Gcs(gcs) => {
                let port = contender.and_then(|i| self.proxies.get(i)).map_or(gcs.port(), Proxy::port);
                vec![("STORAGE_EMULATOR_HOST".to_string(), PathBuf::from(format!("http://127.0.0.1:{port}")))]
            }
            // The emulator's address is an environment variable, as Google's libraries read it.
            Server::Datastore(ds) => {
                let host = match contender.and_then(|i| self.proxies.get(i)) {
                    Some(proxy) => format!("127.0.0.1:{}", proxy.port()),
                    None => ds.host(),
                };
                vec![("DATASTORE_EMULATOR_HOST".to_string(), PathBuf::from(host))]
            }
            _ => Vec::new(),
        }
    }

    fn port(&self) -> Option<u16> {
        match &self.server {
            Server::Sqlite(_) => None,
            Server::Postgres(pg) => Some(pg.port()),
            Server::Mariadb(db) => Some(db.port()),
            Server::Redis(r) => Some(r.port()),
            Server::Etcd(e) => Some(e.port()),
            Server::Nats(n) => Some(n.port()),
            Server::ZooKeeper(z) => Some(z.port()),
            Server::Kubernetes(api) => Some(api.port()),
            Server::S3(moto) | Server::DynamoDb(MotoDynamo { moto }) => Some(moto.port()),
            Server::Gcs(gcs) => Some(gcs.port()),
            Server::Datastore(ds) => Some(ds.port()),
            Server::Cluster(..) => None,
        }
    }

    /// The URL `status` and `release` use: straight to the store.
    pub fn url(&self) -> String {
        match &self.server {
            Server::Sqlite(url) => url.clone(),
            Server::Postgres(pg) => pg.url(),
            Server::Mariadb(db) => db.url(),
            Server::Redis(r) => r.url(),
            Server::Etcd(e) => e.url(),
            Server::Nats(n) => n.url(),
            Server::ZooKeeper(z) => z.url(),
            // The server is in the kubeconfig (`env`); the URL names the namespace.
            Server::Kubernetes(_) => format!("k8s://{}", crate::servers::kubernetes::NAMESPACE),
            // The endpoint is in the environment (`env`).
            Server::S3(moto) => moto.url(),
            Server::DynamoDb(dynamo) => dynamo.url(),
            // The server is in STORAGE_EMULATOR_HOST (`env`); the URL names the bucket.
            Server::Gcs(gcs) => gcs.url(),
            // The server is in the environment (`env`).
            Server::Datastore(ds) => ds.url(),
            Server::Cluster(cluster, after) => format!("{}{after}", cluster.url()),
        }
    }

    /// The URL contender `i` uses: through its own proxy.
    pub fn contender_url(&self, i: usize) -> String {
        if let Server::Cluster(cluster, after) = &self.server {
            return format!("{}{after}", cluster.url_from(self.preferred_node(i)));
        }
        match (self.port(), self.proxies.get(i)) {
            // The port is followed by the path, or ends the URL (etcd://host:PORT).
            (Some(port), Some(proxy)) => {
                let (url, from) = (self.url(), format!(":{port}"));
                let at = url.find(&format!("{from}/")).or_else(|| url.ends_with(&from).then(|| url.len() - from.len()));
                match at {
                    Some(at) => format!("{}:{}{}", &url[..at], proxy.port(), &url[at + from.len()..]),
                    None => url,
                }
            }
            _ => self.url(),
        }
    }

    pub fn has_server(&self) -> bool {
        self.port().is_some()
    }

    /// Whether a server restart may start its token floor again (the Datastore emulator
    /// restarts its version counter): fencing tokens are then compared within one
    /// server epoch, between restarts.
    pub fn floor_restarts_with_server(&self) -> bool {
        matches!(self.server, Server::Datastore(_))
    }

    /// How a server fault restarts the server, for the report.
    pub fn restart_signal(&self) -> &'static str {
        match self.server {
            // SIGKILL would lose every write since it started: it saves on SIGTERM only.
            Server::Datastore(_) => "SIGTERM",
            _ => "SIGKILL",
        }
    }

    /// Every process of the server: the one listening on its port and its children
    /// (PostgreSQL's backends).
    fn server_pids(&self) -> Vec<Pid> {
        // Servers started from a configuration file (the port is not on their command line)
        // say which process they are.
        let known = match &self.server {
            Server::Nats(n) => Some(n.pid()),
            Server::ZooKeeper(z) => Some(z.pid()),
            Server::Kubernetes(api) => Some(api.pid()),
            Server::S3(moto) | Server::DynamoDb(MotoDynamo { moto }) => Some(moto.pid()),
            Server::Gcs(gcs) => Some(gcs.pid()),
            _ => None,
        };
        if let Some(pid) = known {
            return pid.map(|pid| Pid::from_raw(pid as i32)).into_iter().collect();
        }
        if let Server::Datastore(ds) = &self.server {
            return ds.pids().into_iter().map(Pid::from_raw).collect();
        }
        let Some(port) = self.port() else { return Vec::new() };
        let mut main = Vec::new();
        let mut all: Vec<(i32, i32)> = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<String> =
                cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
            let listens = args.windows(2).any(|w| w[0] == "-p" && w[1] == port.to_string())
                || args.iter().any(|a| *a == format!("--port={port}") || a.ends_with(&format!("127.0.0.1:{port}")));
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rfind(')')
                .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
                .and_then(|f| f.parse::<i32>().ok())
                .unwrap_or(0);
            let program = args[0].split_whitespace().next().unwrap_or("");
            let servers = ["postgres", "mariadbd", "redis-server", "etcd"];
            if listens && servers.iter().any(|s| program.ends_with(s)) {
                main.push(pid);
            }
            all.push((pid, ppid));
        }
        let children = all.iter().filter(|(_, ppid)| main.contains(ppid)).map(|(pid, _)| *pid);
        main.iter().copied().chain(children).map(Pid::from_raw).collect()
    }

    /// SIGKILL the server (the Datastore emulator: SIGTERM), keep it down for `down`, start
    /// it again.
    pub fn kill_server(&self, down: Duration) {
        if let Server::Datastore(ds) = &self.server {
            ds.stop();
            std::thread::sleep(down);
            return ds.start_again();
        }
        for pid in self.server_pids() {
            let _ = kill(pid, Signal::SIGKILL);
        }
        std::thread::sleep(down);
        match &self.server {
            Server::Sqlite(_) => {}
            Server::Postgres(pg) => restart_until_up(pg.port(), || pg.start_again()),
            Server::Mariadb(db) => restart_until_up(db.port(), || {
                db.stop(); // reaps the killed process
                db.start_again()
            }),
            Server::Redis(r) => restart_until_up(r.port(), || {
                r.stop();
                r.start_again()
            }),
            Server::Etcd(e) => restart_until_up(e.port(), || {
                e.stop();
                e.start_again()
            }),
            Server::Nats(n) => restart_until_up(n.port(), || {
                n.stop();
                n.start_again()
            }),
            Server::ZooKeeper(z) => restart_until_up(z.port(), || {
                z.stop();
                z.start_again()
            }),
            Server::Kubernetes(api) => restart_until_up(api.port(), || {
                api.stop();
                api.start_again()
            }),
            // moto keeps objects in memory: the test server replays the writes it recorded.
            // Its public port is a gate that stays open while moto is dead, so the port
            // cannot tell whether it is up: restart it always.
            Server::S3(moto) | Server::DynamoDb(MotoDynamo { moto }) => {
                moto.stop();
                moto.start_again()
            }
            // Its objects are on disk: a kill -9 loses none.
            Server::Gcs(gcs) => restart_until_up(gcs.port(), || {
                gcs.stop();
                gcs.start_again()
            }),
            Server::Datastore(_) | Server::Cluster(..) => {}
        }
    }

    /// SIGSTOP every process of the server for `frozen`, then SIGCONT.
    pub fn freeze_server(&self, frozen: Duration) {
        let pids = self.server_pids();
        for pid in &pids {
            let _ = kill(*pid, Signal::SIGSTOP);
        }
        std::thread::sleep(frozen);
        for pid in &pids {
            let _ = kill(*pid, Signal::SIGCONT);
        }
    }

    /// Put contender `i`'s network in `mode` for `lasting`, then let traffic pass again.
    pub fn network(&self, i: usize, mode: Mode, lasting: Duration) {
        if let Some(proxy) = self.proxies.get(i) {
            proxy.set(mode);
            std::thread::sleep(lasting);
            proxy.set(Mode::Pass);
        }
    }
}

/// A server killed with SIGKILL may need a moment before it can start on the same
/// directory and port (PostgreSQL refuses while its killed postmaster is not yet reaped),
/// and a start that reported failure may have come up after all: judge by the port.
fn restart_until_up(port: u16, start: impl Fn()) {
    let up = || std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).is_ok();
    for _ in 0..40 {
        if up() {
            return;
        }
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&start));
        std::panic::set_hook(quiet);
        if started.is_ok() || up() {
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("the server did not come back after a kill");
}
