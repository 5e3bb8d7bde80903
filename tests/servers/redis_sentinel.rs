//! Redis with Sentinel, as users run it: a primary, two replicas and three Sentinels
//! (`redis-sentinel`), each in its own temporary directory on free ports of 127.0.0.1, reached
//! by a `redis+sentinel://` URL. Dropping it stops every process and deletes every directory.
//!
//! Keeping the next writes off the replicas (`hold_back`): every Redis server sits behind a
//! TCP forwarder of its own (`Front`), and announces the forwarder's port as its own
//! (`replica-announce-port`), so that the Sentinels, the clients and the replicas all reach a
//! server through its forwarder, at the one address the Sentinels know it by. A replica's
//! connections come from 127.0.0.2 (`bind-source-addr`), everything else from 127.0.0.1: the
//! forwarder of the primary holds back what the primary sends on the replicas' connections
//! and lets the rest through. The replicas' links stay open and look up (the replica waits
//! `repl-timeout`, 60 s, before it gives up on a silent primary), so the Sentinels still
//! promote one of them; and since the replicas replicate from the address the Sentinels know
//! the primary by, Sentinel never "fixes" their configuration around the forwarder (it does
//! for a replica whose master address differs from its own view). After a failover the
//! Sentinels point the remaining replica at the new primary's forwarder, which holds back in
//! its turn.
//!
//! The Sentinels run with `down-after-milliseconds 1000`, quorum 2 and `failover-timeout 3000`
//! (a failover that fails is tried again 6 s later), and their own timers shortened with
//! `SENTINEL DEBUG` (Redis 7.0): INFO every 200 ms (replicas are discovered within a moment
//! instead of ten seconds; during a failover Sentinel asks every second whatever the setting),
//! a reconnection to a server that went away every 500 ms instead of every second (a SIGKILLed
//! primary is seen down 1 to 1.5 s after, not 1 to 2 s: the suite's 4 s leases must outlive
//! the failover when the replica has them), the other Sentinels asked every 100 ms, hello
//! messages every 200 ms, and no TILT on a busy machine (30 s of doing nothing). A SIGKILLed
//! primary is replaced in about 2 s (1.6 to 2.9 s in 130 failovers in a row here).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::process::{start_on_free_ports, ServerProcess};
use super::replicated::Replicated;

/// The name the Sentinels monitor the primary by.
pub const SERVICE: &str = "leaderrun-test";

/// Where the Redis servers' own connections (a replica's to its primary) come from.
const REPLICA_SOURCE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Generous bound on what should happen soon (a start, a promotion, a catch-up).
const SOON: Duration = Duration::from_secs(60);

/// How often a wait asks again.
const POLL: Duration = Duration::from_millis(50);

pub struct RedisSentinel {
    dir: tempfile::TempDir,
    password: String,
    sentinel_password: String,
    /// Every Redis server started, in order; a killed one's slot is reused by `add_replica`.
    nodes: Mutex<Vec<Node>>,
    /// The index in `nodes` of the primary.
    primary: Mutex<usize>,
    sentinels: Vec<Sentinel>,
}

/// One Redis server, behind its forwarder.
struct Node {
    front: Front,
    port: u16,
    process: ServerProcess,
    dir: PathBuf,
    /// Killed by `fail_over`: its forwarder refuses, and its slot waits for `add_replica`.
    dead: bool,
}

struct Sentinel {
    port: u16,
    process: ServerProcess,
}

impl RedisSentinel {
    /// A primary, two replicas that have caught up, and three Sentinels that know them all and
    /// each other; panics with the reason if they do not start.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-sentinel-").tempdir().expect("create a temp dir");
        let secret = || format!("{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let mut setup = Self {
            dir,
            password: format!("Sekr1t-{}", secret()),
            sentinel_password: format!("Sent1nel-{}", secret()),
            nodes: Mutex::new(Vec::new()),
            primary: Mutex::new(0),
            sentinels: Vec::new(),
        };
        setup.start_node(None);
        let primary = setup.front_of_primary();
        setup.start_node(Some(primary));
        setup.start_node(Some(primary));
        setup.wait_caught_up();
        for i in 0..3 {
            let sentinel = setup.start_sentinel(i, primary);
            setup.sentinels.push(sentinel);
        }
        setup.wait_until("every Sentinel knows the others and both replicas", || {
            setup.sentinels.iter().all(|s| setup.sentinel_peers(s.port) == 2 && setup.known_replicas(s.port).len() == 2)
        });
        setup
    }

    /// The password of the Redis servers (the URL's).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The Sentinels' own password (`?sentinel-password=`).
    pub fn sentinel_password(&self) -> &str {
        &self.sentinel_password
    }

    /// The Sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The URL for the Sentinels of `service`, without a query.
    pub fn url_for(&self, service: &str) -> String {
        let hosts: Vec<String> = self.sentinels.iter().map(|s| format!("127.0.0.1:{}", s.port)).collect();
        format!("redis+sentinel://:{}@{}/{service}", self.password, hosts.join(","))
    }

    /// Send one command to the primary (through its forwarder, after AUTH).
    pub fn primary_command(&self, args: &[&str]) -> std::io::Result<Reply> {
        command(self.front_of_primary(), Some(&self.password), args)
    }

    fn front_of_primary(&self) -> u16 {
        let nodes = self.nodes.lock().unwrap();
        nodes[*self.primary.lock().unwrap()].front.port()
    }

    /// Start a Redis server in a new slot or a dead one, a replica of `replica_of` (a
    /// forwarder's port) if given; it answers when this returns.
    fn start_node(&self, replica_of: Option<u16>) {
        let mut nodes = self.nodes.lock().unwrap();
        // A dead server's slot is reused where its forwarder's port is still free, so that the
        // Sentinels, which remember every server they saw, see it come back as a replica
        // rather than keep one more dead server for ever.
        let slot = match nodes.iter().position(|node| node.dead && node.front.reopen().is_ok()) {
            Some(slot) => slot,
            None => {
                let n = nodes.len();
                let dir = self.dir.path().join(format!("redis-{n}"));
                nodes.push(Node { front: Front::start(), port: 0, process: ServerProcess::default(), dir, dead: true });
                n
            }
        };
        let node = &mut nodes[slot];
        let _ = std::fs::remove_dir_all(&node.dir);
        std::fs::create_dir_all(&node.dir).expect("create a node's directory");
        let (front, dir, process) = (node.front.port(), node.dir.clone(), &node.process);
        let port = std::cell::Cell::new(0);
        start_on_free_ports(
            "Redis",
            || port.set(super::free_port()),
            || {
                let conf = node_conf(port.get(), &dir, front, &self.password, replica_of);
                spawn(process, "redis-server", &dir, &conf, port.get(), Some(&self.password))
            },
        );
        node.port = port.get();
        node.front.point_at(node.port);
        node.dead = false;
    }

    fn start_sentinel(&self, i: usize, primary: u16) -> Sentinel {
        let dir = self.dir.path().join(format!("sentinel-{i}"));
        std::fs::create_dir_all(&dir).expect("create a Sentinel's directory");
        let (process, port) = (ServerProcess::default(), std::cell::Cell::new(0));
        start_on_free_ports(
            "Redis Sentinel",
            || port.set(super::free_port()),
            || {
                let port = port.get();
                let conf = [
                    format!("port {port}"),
                    "bind 127.0.0.1".into(),
                    format!("dir {}", dir.display()),
                    format!("requirepass {}", self.sentinel_password),
                    format!("sentinel sentinel-pass {}", self.sentinel_password),
                    format!("sentinel monitor {SERVICE} 127.0.0.1 {primary} 2"),
                    format!("sentinel auth-pass {SERVICE} {}", self.password),
                    format!("sentinel down-after-milliseconds {SERVICE} 1000"),
                    format!("sentinel failover-timeout {SERVICE} 3000"),
                    format!("sentinel parallel-syncs {SERVICE} 2"),
                ]
                .join("\n")
                    + "\n";
                spawn(&process, "redis-sentinel", &dir, &conf, port, Some(&self.sentinel_password))
            },
        );
        let port = port.get();
        for (param, value) in [
            ("info-period", "200"),
            ("ping-period", "500"),
            ("ask-period", "100"),
            ("publish-period", "200"),
            ("tilt-trigger", "60000"),
        ] {
            let reply = command(port, Some(&self.sentinel_password), &["SENTINEL", "DEBUG", param, value]);
            assert!(matches!(reply, Ok(Reply::Simple(_))), "SENTINEL DEBUG {param} {value}: {reply:?}");
        }
        Sentinel { port, process }
    }

    /// How many other Sentinels the Sentinel on `port` knows.
    fn sentinel_peers(&self, port: u16) -> usize {
        match command(port, Some(&self.sentinel_password), &["SENTINEL", "SENTINELS", SERVICE]) {
            Ok(Reply::Array(peers)) => peers.len(),
            _ => 0,
        }
    }

    /// The ports of the replicas the Sentinel on `port` knows and sees up.
    fn known_replicas(&self, port: u16) -> Vec<u16> {
        let Ok(Reply::Array(replicas)) =
            command(port, Some(&self.sentinel_password), &["SENTINEL", "REPLICAS", SERVICE])
        else {
            return Vec::new();
        };
        replicas
            .iter()
            .map(Reply::fields)
            .filter(|fields| fields.get("flags").is_some_and(|flags| flags == "slave"))
            .filter_map(|fields| fields.get("port")?.parse().ok())
            .collect()
    }

    /// The primary as the Sentinel on `port` states it once a failover is over: its port, if
    /// its flags say nothing but "master".
    fn primary_per_sentinel(&self, port: u16) -> Option<u16> {
        let reply = command(port, Some(&self.sentinel_password), &["SENTINEL", "MASTER", SERVICE]).ok()?;
        let fields = reply.fields();
        (fields.get("flags")? == "master").then(|| fields.get("port")?.parse().ok()).flatten()
    }

    /// Wait until every live replica follows the primary and has all it acknowledged.
    fn wait_caught_up(&self) {
        let primary = self.front_of_primary();
        let info = self.primary_command(&["INFO", "replication"]).expect("INFO on the primary");
        let offset: u64 = info.field("master_repl_offset").and_then(|o| o.parse().ok()).expect("master_repl_offset");
        let replicas: Vec<u16> = {
            let (nodes, at) = (self.nodes.lock().unwrap(), *self.primary.lock().unwrap());
            nodes.iter().enumerate().filter(|(i, node)| *i != at && !node.dead).map(|(_, node)| node.port).collect()
        };
        self.wait_until("every replica has caught up with the primary", || {
            replicas.iter().all(|&port| {
                let Ok(info) = command(port, Some(&self.password), &["INFO", "replication"]) else { return false };
                info.field("master_port") == Some(primary.to_string())
                    && info.field("master_link_status").as_deref() == Some("up")
                    && info.field("slave_repl_offset").and_then(|o| o.parse::<u64>().ok()).is_some_and(|o| o >= offset)
            })
        });
    }

    fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < SOON, "not within {} s: {what}; {}", SOON.as_secs(), self.logs());
            std::thread::sleep(POLL);
        }
    }

    /// The last 30 lines of every Sentinel's log, newest first, for a failure's message.
    pub fn logs(&self) -> String {
        (0..self.sentinels.len())
            .map(|i| {
                let log = self.dir.path().join(format!("sentinel-{i}")).join("log");
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                format!("Sentinel {i}: {tail:#?}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Replicated for RedisSentinel {
    fn url(&self) -> String {
        format!("{}?sentinel-password={}", self.url_for(SERVICE), self.sentinel_password)
    }

    fn hold_back(&self) {
        let nodes = self.nodes.lock().unwrap();
        nodes[*self.primary.lock().unwrap()].front.hold(true);
    }

    fn catch_up(&self) {
        {
            let nodes = self.nodes.lock().unwrap();
            nodes[*self.primary.lock().unwrap()].front.hold(false);
        }
        self.wait_caught_up();
    }

    fn fail_over(&self) {
        let old = {
            let mut nodes = self.nodes.lock().unwrap();
            let node = &mut nodes[*self.primary.lock().unwrap()];
            if let Some(pid) = node.process.pid() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            node.process.stop();
            // Nothing it held back may reach a replica now: its connections go, unforwarded,
            // and its port refuses, as a dead server's does.
            node.front.close();
            node.dead = true;
            node.front.port()
        };
        // Clients find the new primary once one Sentinel names it without a failover's flags
        // (the redis crate reads SENTINEL MASTERS, not get-master-addr-by-name): the leader's
        // followers do as soon as it reconfigures the other replica, the leader itself once
        // that replica has followed. A Sentinel still behind is caught up by the next step
        // that needs it (`add_replica` waits until every Sentinel knows every replica).
        let mut promoted = 0;
        self.wait_until("a Sentinel names the promoted replica as the primary", || {
            let seen = self.sentinels.iter().find_map(|s| self.primary_per_sentinel(s.port).filter(|&p| p != old));
            promoted = seen.unwrap_or_default();
            seen.is_some()
        });
        let slot = self.nodes.lock().unwrap().iter().position(|node| node.front.port() == promoted);
        *self.primary.lock().unwrap() = slot.expect("the promoted server is one of the set-up's");
        self.wait_until("the new primary takes writes", || {
            matches!(command(promoted, Some(&self.password), &["ROLE"]), Ok(Reply::Array(role))
                if role.first().and_then(Reply::text).as_deref() == Some("master"))
                && matches!(self.primary_command(&["SET", "leaderrun-setup:probe", "1"]), Ok(Reply::Simple(_)))
        });
    }

    fn add_replica(&self) {
        let primary = self.front_of_primary();
        self.start_node(Some(primary));
        self.wait_caught_up();
        let live: Vec<u16> = {
            let (nodes, at) = (self.nodes.lock().unwrap(), *self.primary.lock().unwrap());
            nodes
                .iter()
                .enumerate()
                .filter(|(i, node)| *i != at && !node.dead)
                .map(|(_, node)| node.front.port())
                .collect()
        };
        self.wait_until("every Sentinel knows every replica", || {
            self.sentinels.iter().all(|s| {
                let known = self.known_replicas(s.port);
                live.iter().all(|port| known.contains(port))
            })
        });
    }

    fn describe(&self) -> String {
        "Redis 7.0, a primary, two replicas and three Sentinels".to_string()
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        // The Sentinels first, so that none reconfigures a server while the others stop.
        for sentinel in &self.sentinels {
            sentinel.process.stop();
        }
        for node in self.nodes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            if let Some(pid) = node.process.pid() {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
            node.process.stop();
            node.front.close();
        }
    }
}

/// A Redis server's configuration: on `port`, announced as its forwarder's `front`, its own
/// connections from `REPLICA_SOURCE`, a replica of `replica_of` (a forwarder's port) if given.
/// Replicas sync through a file, not the socket: after a diskless sync the primary streams
/// nothing until the replica's first acknowledgement, up to a second later.
fn node_conf(port: u16, dir: &Path, front: u16, password: &str, replica_of: Option<u16>) -> String {
    let mut conf = [
        format!("port {port}"),
        "bind 127.0.0.1".into(),
        format!("dir {}", dir.display()),
        "save \"\"".into(),
        "appendonly no".into(),
        format!("requirepass {password}"),
        format!("masterauth {password}"),
        format!("bind-source-addr {REPLICA_SOURCE}"),
        "replica-announce-ip 127.0.0.1".into(),
        format!("replica-announce-port {front}"),
        "repl-diskless-sync no".into(),
    ]
    .join("\n");
    if let Some(primary) = replica_of {
        conf.push_str(&format!("\nreplicaof 127.0.0.1 {primary}"));
    }
    conf + "\n"
}

/// Write `conf`, run `program` on it and wait until it answers PING on `port`.
fn spawn(
    process: &ServerProcess,
    program: &str,
    dir: &Path,
    conf: &str,
    port: u16,
    password: Option<&str>,
) -> Result<(), String> {
    let (conf_file, log) = (dir.join("server.conf"), dir.join("log"));
    std::fs::write(&conf_file, conf).map_err(|e| e.to_string())?;
    let out = std::fs::File::create(&log).map_err(|e| e.to_string())?;
    let child = Command::new(program)
        .arg(&conf_file)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().map_err(|e| e.to_string())?)
        .stderr(out)
        .spawn()
        .map_err(|e| format!("cannot run {program} (is it installed?): {e}"))?;
    process.set(child);
    let ready = process.wait_ready(
        program,
        &log,
        Duration::from_millis(20),
        || matches!(command(port, password, &["PING"]), Ok(Reply::Simple(pong)) if pong == "PONG"),
    );
    if ready.is_err() {
        process.stop();
    }
    ready
}

/// A reply of the Redis protocol (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<String>),
    Array(Vec<Reply>),
}

impl Reply {
    fn text(&self) -> Option<String> {
        match self {
            Reply::Simple(s) | Reply::Bulk(Some(s)) => Some(s.clone()),
            Reply::Int(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// A `field:value` line of an INFO reply.
    pub fn field(&self, name: &str) -> Option<String> {
        let text = self.text()?;
        text.lines().find_map(|line| Some(line.strip_prefix(name)?.strip_prefix(':')?.trim().to_string()))
    }

    /// The fields of a flat `[name, value, name, value...]` reply (what Sentinel answers).
    fn fields(&self) -> std::collections::HashMap<String, String> {
        let Reply::Array(items) = self else { return Default::default() };
        items.chunks(2).filter_map(|pair| Some((pair.first()?.text()?, pair.get(1)?.text()?))).collect()
    }
}

/// Send one command to 127.0.0.1:`port` (after AUTH, with a password) and read its reply.
pub fn command(port: u16, password: Option<&str>, args: &[&str]) -> std::io::Result<Reply> {
    use super::redis::encode;
    let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut request = String::new();
    if let Some(password) = password {
        request.push_str(&encode(&["AUTH", password]));
    }
    request.push_str(&encode(args));
    stream.write_all(request.as_bytes())?;
    let mut reader = BufReader::new(stream);
    if password.is_some() {
        if let Reply::Error(e) = read_reply(&mut reader)? {
            return Err(std::io::Error::other(format!("AUTH: {e}")));
        }
    }
    read_reply(&mut reader)
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let line = line.trim_end_matches("\r\n");
    let (kind, rest) = line.split_at(1.min(line.len()));
    let number = || rest.parse::<i64>().map_err(|_| std::io::Error::other(format!("not RESP: {line:?}")));
    Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(number()?),
        "$" if number()? < 0 => Reply::Bulk(None),
        "$" => {
            let mut body = vec![0; number()? as usize + 2];
            reader.read_exact(&mut body)?;
            body.truncate(body.len() - 2);
            Reply::Bulk(Some(String::from_utf8_lossy(&body).into_owned()))
        }
        "*" if number()? < 0 => Reply::Array(Vec::new()),
        "*" => Reply::Array((0..number()?).map(|_| read_reply(reader)).collect::<Result<_, _>>()?),
        _ => return Err(std::io::Error::other(format!("not RESP: {line:?}"))),
    })
}

/// A TCP forwarder in front of one Redis server, on a port of its own (the server behind it
/// changes when a slot is reused). While `hold` is on, what the server sends on a connection
/// from `REPLICA_SOURCE` (a replica's link) is not read, so it waits, unforwarded, until `hold`
/// goes off or the connection is cut. Once its server is killed it is closed, so that its port
/// refuses connections as a dead server's does (the Sentinels then see the server down within
/// `down-after-milliseconds`, as they would; a forwarder that accepted and closed each of their
/// connections would let each reconnection restart their clock).
struct Front {
    port: u16,
    shared: Arc<FrontShared>,
    /// The accepting thread, and the flag that stops it.
    accepting: Mutex<Option<(std::thread::JoinHandle<()>, Arc<AtomicBool>)>>,
}

struct FrontShared {
    upstream: AtomicU16,
    held: AtomicBool,
    open: Mutex<Vec<Carried>>,
}

/// One connection carried: both sockets, and whether it was cut.
struct Carried {
    client: TcpStream,
    server: TcpStream,
    cut: Arc<AtomicBool>,
}

impl Front {
    /// A forwarder on a free port, not pointing anywhere yet.
    fn start() -> Front {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("a bound port").port();
        let shared =
            Arc::new(FrontShared { upstream: AtomicU16::new(0), held: AtomicBool::new(false), open: Mutex::default() });
        let front = Front { port, shared, accepting: Mutex::new(None) };
        front.accept(listener);
        front
    }

    fn accept(&self, listener: TcpListener) {
        let (shared, stop) = (Arc::clone(&self.shared), Arc::new(AtomicBool::new(false)));
        let stopped = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    return;
                }
                if let Ok(client) = client {
                    shared.carry(client);
                }
            }
        });
        *self.accepting.lock().unwrap_or_else(|e| e.into_inner()) = Some((thread, stop));
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn point_at(&self, upstream: u16) {
        self.shared.upstream.store(upstream, Ordering::SeqCst);
    }

    fn hold(&self, on: bool) {
        self.shared.held.store(on, Ordering::SeqCst);
    }

    /// Stop listening (the port refuses from now on) and cut every connection.
    fn close(&self) {
        if let Some((thread, stop)) = self.accepting.lock().unwrap_or_else(|e| e.into_inner()).take() {
            stop.store(true, Ordering::SeqCst);
            // Wake the accepting thread so that it sees `stop` and drops the listener.
            let _ = TcpStream::connect(("127.0.0.1", self.port));
            let _ = thread.join();
        }
        self.cut();
    }

    /// Listen again on the same port, if it is still free.
    fn reopen(&self) -> std::io::Result<()> {
        self.accept(TcpListener::bind(("127.0.0.1", self.port))?);
        Ok(())
    }

    /// Close every connection without forwarding anything held back, and hold nothing more.
    fn cut(&self) {
        for carried in self.shared.open.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            carried.cut.store(true, Ordering::SeqCst);
            let _ = carried.client.shutdown(Shutdown::Both);
            let _ = carried.server.shutdown(Shutdown::Both);
        }
        self.hold(false);
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.close();
    }
}

impl FrontShared {
    fn carry(self: &Arc<Self>, client: TcpStream) {
        let to = self.upstream.load(Ordering::SeqCst);
        let Ok(server) = TcpStream::connect_timeout(&([127, 0, 0, 1], to).into(), Duration::from_secs(2)) else {
            let _ = client.shutdown(Shutdown::Both);
            return;
        };
        let replica = client.peer_addr().is_ok_and(|peer| peer.ip() == IpAddr::V4(REPLICA_SOURCE));
        let cut = Arc::new(AtomicBool::new(false));
        let _ = (client.set_nodelay(true), server.set_nodelay(true));
        let (Ok(c), Ok(s), Ok(c2), Ok(s2)) =
            (client.try_clone(), server.try_clone(), client.try_clone(), server.try_clone())
        else {
            return;
        };
        {
            let mut open = self.open.lock().unwrap();
            open.retain(|carried| !carried.cut.load(Ordering::SeqCst));
            open.push(Carried { client: c, server: s, cut: Arc::clone(&cut) });
        }
        pump(None, client, server, Arc::clone(&cut));
        pump(replica.then(|| Arc::clone(self)), s2, c2, cut);
    }

    fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }
}

/// Copy `from` → `to` on a thread of its own until either side closes. With `held_by`, nothing
/// is read while that forwarder holds, and a chunk read just before it began holding waits too:
/// whatever the server sent after `hold` returned is never forwarded while it holds.
fn pump(held_by: Option<Arc<FrontShared>>, mut from: TcpStream, mut to: TcpStream, cut: Arc<AtomicBool>) {
    std::thread::spawn(move || {
        let wait_while_held = || {
            while held_by.as_ref().is_some_and(|front| front.holding()) && !cut.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(2));
            }
            !cut.load(Ordering::SeqCst)
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            if !wait_while_held() {
                break;
            }
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if !wait_while_held() || to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        cut.store(true, Ordering::SeqCst);
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
