//! The store under the fault run: the embedded SQLite file, or a real server started
//! here (the tests' own server support), with one TCP proxy per contender so that a
//! single contender's network can be cut, reset or slowed; or a 3-node cluster (etcd, NATS,
//! ZooKeeper) whose nodes are killed and frozen one at a time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leaderrun::store::registry;

use crate::proxy::{Mode, Proxy};
use crate::servers::azurite::Azurite;
use crate::servers::cluster::Cluster;
use crate::servers::replicated::Replicated;
use crate::servers::{
    datastore_emulator::DatastoreEmulator, etcd::Etcd, fake_gcs::FakeGcs, kubernetes::KubeApiServer, mariadb::Mariadb,
    moto::Moto, moto_dynamodb::MotoDynamo, nats::Nats, postgres::Postgres, redis::Redis, zookeeper::ZooKeeper,
    TestServer,
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
    AzBlob,
}

impl Kind {
    /// A store as the registry names it (its name or any of its schemes: `mariadb`, `zk`,
    /// `gs`), and its test server here.
    pub fn parse(name: &str) -> Result<Self, String> {
        let store = registry::by_name(name).or_else(|| registry::by_scheme(name)).map_or(name, |kind| kind.name);
        Self::of_store(store).ok_or_else(|| {
            let served: Vec<&str> =
                registry::STORES.iter().map(|kind| kind.name).filter(|n| Self::of_store(n).is_some()).collect();
            format!("--store {name:?}: the fault run has test servers for {}", served.join(", "))
        })
    }

    /// The test server of a store of the registry, by the store's name.
    fn of_store(name: &str) -> Option<Self> {
        Some(match name {
            "sqlite" => Kind::Sqlite,
            "postgres" => Kind::Postgres,
            "mysql" => Kind::Mariadb,
            "redis" => Kind::Redis,
            "etcd" => Kind::Etcd,
            "nats" => Kind::Nats,
            "zookeeper" => Kind::ZooKeeper,
            "kubernetes" => Kind::Kubernetes,
            "s3" => Kind::S3,
            "dynamodb" => Kind::DynamoDb,
            "gcs" => Kind::Gcs,
            "datastore" => Kind::Datastore,
            "azblob" => Kind::AzBlob,
            _ => return None,
        })
    }
}

enum Server {
    Sqlite(String),
    /// One server of the tests' (`TestServer`).
    Single(Box<dyn TestServer>),
    /// A 3-node cluster, and what follows each node list in the URL (NATS: the bucket,
    /// replicated on all three).
    Cluster(Box<dyn Cluster>, &'static str),
    /// A primary with replicas, failed over by the run (`--replicated`).
    Replicated(Box<dyn Replicated>),
}

/// How `--replicated` replicates the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replication {
    /// Asynchronous: a failover may lose the last writes (Redis: with three Sentinels).
    Async,
    /// Synchronous (PostgreSQL's `synchronous_standby_names`): an acknowledged write is on the
    /// replica.
    Sync,
}

impl Replication {
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "async" => Ok(Replication::Async),
            "sync" => Ok(Replication::Sync),
            other => Err(format!("--replicated {other:?}: async or sync")),
        }
    }
}

/// Start a server of type `S`.
fn single<S: TestServer + 'static>() -> Server {
    Server::Single(Box::new(S::start()))
}

pub struct Backend {
    kind: Kind,
    server: Server,
    /// One per contender, in front of a single server.
    proxies: Vec<Proxy>,
}

impl Backend {
    /// Start the store (and, for a server, one proxy per contender).
    pub fn start(kind: Kind, dir: &Path, contenders: usize) -> Self {
        let server = match kind {
            Kind::Sqlite => Server::Sqlite(format!("sqlite://{}", dir.join("locks.db").display())),
            Kind::Postgres => single::<Postgres>(),
            Kind::Mariadb => single::<Mariadb>(),
            Kind::Redis => single::<Redis>(),
            Kind::Etcd => single::<Etcd>(),
            Kind::Nats => single::<Nats>(),
            Kind::ZooKeeper => single::<ZooKeeper>(),
            Kind::Kubernetes => single::<KubeApiServer>(),
            Kind::S3 => single::<Moto>(),
            Kind::DynamoDb => single::<MotoDynamo>(),
            Kind::Gcs => single::<FakeGcs>(),
            Kind::Datastore => single::<DatastoreEmulator>(),
            Kind::AzBlob => single::<Azurite>(),
        };
        let mut backend = Self { kind, server, proxies: Vec::new() };
        if let Server::Single(server) = &backend.server {
            let target: SocketAddr = ([127, 0, 0, 1], server.port()).into();
            backend.proxies = (0..contenders).map(|_| Proxy::start(target).expect("start a proxy")).collect();
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
        Self { kind, server, proxies: Vec::new() }
    }

    /// A replicated store: PostgreSQL (async or sync), MariaDB (async), Redis with Sentinel
    /// (async), without proxies: its faults are failovers.
    pub fn start_replicated(kind: Kind, replication: Replication) -> Result<Self, String> {
        use crate::servers::{
            mariadb_replicated::MariadbReplicated, postgres_replicated::PostgresReplicated,
            redis_sentinel::RedisSentinel,
        };
        let replicated: Box<dyn Replicated> = match (kind, replication) {
            (Kind::Postgres, _) => Box::new(PostgresReplicated::start(replication == Replication::Sync)),
            (Kind::Mariadb, Replication::Async) => Box::new(MariadbReplicated::start()),
            (Kind::Redis, Replication::Async) => Box::new(RedisSentinel::start()),
            (kind, replication) => return Err(format!("no {replication:?} replicated set-up of {kind:?}")),
        };
        Ok(Self { kind, server: Server::Replicated(replicated), proxies: Vec::new() })
    }

    pub fn is_replicated(&self) -> bool {
        matches!(self.server, Server::Replicated(_))
    }

    /// Whether an acknowledged write is on the replica: a failover cannot lose it.
    pub fn is_synchronous(&self) -> bool {
        matches!(&self.server, Server::Replicated(r) if r.synchronous())
    }

    fn replicated(&self) -> &dyn Replicated {
        match &self.server {
            Server::Replicated(r) => r.as_ref(),
            _ => panic!("a failover fault on a store that is not replicated"),
        }
    }

    /// Keep writes from now on off the replica the next failover promotes.
    pub fn hold_back(&self) {
        self.replicated().hold_back()
    }

    pub fn catch_up(&self) {
        self.replicated().catch_up()
    }

    /// SIGKILL the primary and promote the replica; returns once it takes writes.
    pub fn fail_over(&self) {
        self.replicated().fail_over()
    }

    pub fn add_replica(&self) {
        self.replicated().add_replica()
    }

    /// The set-up, for the report.
    pub fn describe(&self) -> Option<String> {
        match &self.server {
            Server::Replicated(r) => Some(r.describe()),
            _ => None,
        }
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

    /// The port contender `i` connects to: its proxy's (with `None`, for `status` and
    /// `release`: the server's own).
    fn port_of(&self, server: &dyn TestServer, contender: Option<usize>) -> u16 {
        contender.and_then(|i| self.proxies.get(i)).map_or(server.port(), Proxy::port)
    }

    /// The environment contender `i` (or, with `None`, `status` and `release`) runs with:
    /// where the store takes its credentials and server from there (a kubeconfig, the
    /// AWS CLI's variables, an emulator's address).
    pub fn env(&self, contender: Option<usize>) -> Vec<(String, PathBuf)> {
        match &self.server {
            Server::Single(server) => {
                let vars = server.env_via(self.port_of(server.as_ref(), contender));
                vars.into_iter().map(|(name, value)| (name, PathBuf::from(value))).collect()
            }
            _ => Vec::new(),
        }
    }

    /// The URL `status` and `release` use: straight to the store.
    pub fn url(&self) -> String {
        match &self.server {
            Server::Sqlite(url) => url.clone(),
            Server::Single(server) => server.url(),
            Server::Cluster(cluster, after) => format!("{}{after}", cluster.url()),
            Server::Replicated(r) => r.url(),
        }
    }

    /// The URL contender `i` uses: through its own proxy.
    pub fn contender_url(&self, i: usize) -> String {
        match &self.server {
            Server::Sqlite(url) => url.clone(),
            Server::Single(server) => server.url_via(self.port_of(server.as_ref(), Some(i))),
            Server::Cluster(cluster, after) => format!("{}{after}", cluster.url_from(self.preferred_node(i))),
            Server::Replicated(r) => r.url(),
        }
    }

    pub fn has_server(&self) -> bool {
        matches!(self.server, Server::Single(_))
    }

    /// Whether a server restart may start its token floor again (the Datastore emulator
    /// restarts its version counter): fencing tokens are then compared within one
    /// server epoch, between restarts.
    pub fn floor_restarts_with_server(&self) -> bool {
        self.kind == Kind::Datastore
    }

    /// How a server fault restarts the server, for the report.
    pub fn restart_signal(&self) -> &'static str {
        match self.kind {
            // SIGKILL would lose every write since it started: they save on SIGTERM only.
            Kind::Datastore | Kind::AzBlob => "SIGTERM",
            _ => "SIGKILL",
        }
    }

    /// SIGKILL the server (the Datastore emulator and Azurite: SIGTERM, see `TestServer::kill`), keep
    /// it down for `down`, start it again.
    pub fn kill_server(&self, down: Duration) {
        if let Server::Single(server) = &self.server {
            server.kill();
            std::thread::sleep(down);
            restart_until_up(server.port(), || server.start_again());
        }
    }

    /// SIGSTOP every process of the server for `frozen`, then SIGCONT.
    pub fn freeze_server(&self, frozen: Duration) {
        if let Server::Single(server) = &self.server {
            server.freeze();
            std::thread::sleep(frozen);
            server.thaw();
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
