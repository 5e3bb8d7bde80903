//! A replicated PostgreSQL 15 as its users run it: a primary and a streaming standby made with
//! `pg_basebackup -R -X stream`, asynchronous or synchronous (`synchronous_standby_names =
//! '*'`), reached by the clients through one `Endpoint` that moves at failover.
//!
//! The standby streams from the primary through a `Link`, a TCP forwarder in this process:
//! `hold_back` cuts it (every replication connection is closed, and every new one refused), so
//! the standby receives nothing more. Pausing the replay would not do: a standby that is
//! promoted replays everything it has received first. `fail_over` SIGKILLs every process of
//! the primary, promotes the standby (`pg_ctl promote -w`) and moves the endpoint;
//! `add_replica` makes a new standby of the new primary and deletes the dead one's directory.
//!
//! Every node lives in one temporary directory (its data in `nodeN/`, its socket and log
//! beside it) and runs as `postgres` when the tests run as root, as `postgres.rs` does.

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::postgres::{owner_and_password, run_tool, text, DATABASE, USER};
use super::replicated::{pipe, Endpoint, Replicated};

/// Generous bound for what should happen soon (a standby streaming, a promotion).
const SOON: Duration = Duration::from_secs(60);

/// One server of the set: its data directory under the set's directory, and its port.
struct Node {
    data: PathBuf,
    port: u16,
}

/// The processes and directories of the set.
struct Nodes {
    primary: Node,
    /// The standby the next `fail_over` promotes, if there is one.
    standby: Option<Node>,
    /// A primary killed by `fail_over`, whose directory `add_replica` deletes.
    dead: Option<Node>,
    /// Directories made so far, for the next one's name.
    made: usize,
}

pub struct PostgresReplicated {
    dir: tempfile::TempDir,
    /// (uid, gid) to run the servers as, when the tests run as root.
    owner: Option<(u32, u32)>,
    password: String,
    synchronous: bool,
    endpoint: Endpoint,
    /// The standby's way to the primary.
    link: Link,
    nodes: Mutex<Nodes>,
}

impl PostgresReplicated {
    /// A primary with the role and database the tests use, and a standby streaming from it.
    pub fn start(synchronous: bool) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-pgr-").tempdir().expect("create a temp dir");
        let (owner, password) = owner_and_password(dir.path());
        let primary = Node { data: dir.path().join("node0"), port: 0 };
        let set = PostgresReplicated {
            endpoint: Endpoint::start(0),
            link: Link::start(),
            nodes: Mutex::new(Nodes { primary, standby: None, dead: None, made: 1 }),
            dir,
            owner,
            password,
            synchronous,
        };
        set.init_primary();
        set.add_replica();
        set
    }

    /// initdb, the settings every node shares (copied to each standby), start, the role and
    /// database.
    fn init_primary(&self) {
        let mut nodes = self.nodes.lock().unwrap();
        let data = nodes.primary.data.clone();
        let d = data.to_str().unwrap();
        let args = ["-D", d, "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"];
        self.tool("initdb", &[&args[..], &["--encoding=UTF8", "--locale=C"]].concat());
        // Replication connections from this host need no password (the clients' still do).
        let hba = data.join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
        std::fs::write(&hba, format!("host replication postgres 127.0.0.1/32 trust\n{rules}")).expect("pg_hba.conf");
        // fsync=off survives a SIGKILLed server (the OS keeps the writes), not an OS crash. A
        // standby cut off by `hold_back` retries its primary every 100 ms once let through, and
        // finds the WAL it missed still there.
        let settings = "\nlisten_addresses = '127.0.0.1'\nfsync = off\nfull_page_writes = off\n\
                        max_connections = 300\nwal_keep_size = '1GB'\nwal_retrieve_retry_interval = '100ms'\n";
        let conf = data.join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new().append(true).open(&conf).expect("open postgresql.conf");
        file.write_all(settings.as_bytes()).expect("write postgresql.conf");
        nodes.primary.port = self.start_node(&data);
        let primary = &nodes.primary;
        self.psql(primary, &format!("CREATE ROLE {USER} LOGIN PASSWORD '{}'", self.password));
        self.psql(primary, &format!("CREATE DATABASE {DATABASE} OWNER {USER}"));
        self.endpoint.move_to(primary.port);
        self.link.retarget(primary.port);
    }

    /// Start a node on a free port (another process may take it first: try a few).
    fn start_node(&self, data: &Path) -> u16 {
        let log = data.with_extension("log");
        for attempt in 0.. {
            let port = super::free_port();
            let options = format!("-p {port} -k {}", self.dir.path().display());
            let (d, l) = (data.to_str().unwrap(), log.to_str().unwrap());
            let out = self.tool_output("pg_ctl", &["-D", d, "-l", l, "-w", "-t", "60", "-o", &options, "start"]);
            if out.status.success() {
                return port;
            }
            if attempt >= 4 {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(10).collect();
                panic!("PostgreSQL does not start: {}; log (newest first): {tail:#?}", text(&out));
            }
        }
        unreachable!()
    }

    /// Run SQL as the superuser over the node's Unix socket; what psql printed (unaligned,
    /// tuples only), or why it failed.
    fn try_psql(&self, node: &Node, database: &str, sql: &str) -> Result<String, String> {
        let (dir, port) = (self.dir.path().to_str().unwrap(), node.port.to_string());
        let mut args: Vec<&str> = "-X -q -A -t -v ON_ERROR_STOP=1 -U postgres".split(' ').collect();
        args.extend(["-h", dir, "-p", &port, "-d", database, "-c", sql]);
        let out = self.tool_output("psql", &args);
        match out.status.success() {
            true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_string()),
            false => Err(text(&out)),
        }
    }

    fn psql(&self, node: &Node, sql: &str) -> String {
        self.try_psql(node, "postgres", sql).unwrap_or_else(|why| panic!("psql {sql:?} failed: {why}"))
    }

    /// Poll `sql` on `node` until it prints `t`.
    fn until(&self, node: &Node, what: &str, sql: &str) {
        let deadline = Instant::now() + SOON;
        loop {
            match self.try_psql(node, "postgres", sql) {
                Ok(answer) if answer == "t" => return,
                answer if Instant::now() > deadline => panic!("{what}: never ({sql}: {answer:?})"),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// Stop a node at once and delete its directory (it may be dead already).
    fn remove(&self, node: Node) {
        self.kill(&node);
        let _ = std::fs::remove_dir_all(&node.data);
        let _ = std::fs::remove_file(node.data.with_extension("log"));
    }

    /// SIGKILL every process of a node: the postmaster is stopped first so that it forks no
    /// backend meanwhile, then its children and it are killed; returns once all are gone.
    fn kill(&self, node: &Node) {
        use nix::sys::signal::{kill, Signal};
        let text = std::fs::read_to_string(node.data.join("postmaster.pid")).unwrap_or_default();
        let Some(postmaster) = text.lines().next().and_then(|line| line.trim().parse::<u32>().ok()) else { return };
        if !alive(postmaster) {
            return;
        }
        let pid = |p: u32| nix::unistd::Pid::from_raw(p as i32);
        let _ = kill(pid(postmaster), Signal::SIGSTOP);
        let all = super::server::with_children(postmaster);
        for &p in all.iter().rev() {
            let _ = kill(pid(p), Signal::SIGKILL);
        }
        let deadline = Instant::now() + SOON;
        while all.iter().any(|&p| alive(p)) {
            assert!(Instant::now() < deadline, "the killed PostgreSQL processes {all:?} do not go");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Run one of PostgreSQL's programs (as `postgres` when we are root); panic on failure.
    fn tool(&self, program: &str, args: &[&str]) {
        let out = self.tool_output(program, args);
        assert!(out.status.success(), "{program} failed: {}", text(&out));
    }

    fn tool_output(&self, program: &str, args: &[&str]) -> Output {
        run_tool(self.dir.path(), self.owner, program, args)
    }

    /// Whether the primary has a standby streaming (and, if synchronous, acknowledging).
    fn streaming_sql(&self) -> &'static str {
        if self.synchronous {
            "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'"
        } else {
            "SELECT count(*) > 0 FROM pg_stat_replication WHERE state = 'streaming'"
        }
    }
}

/// Whether a process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')').and_then(|i| stat[i + 1..].split_whitespace().next()).is_some_and(|state| state != "Z")
}

impl Replicated for PostgresReplicated {
    fn url(&self) -> String {
        format!("postgres://{USER}:{}@127.0.0.1:{}/{DATABASE}", self.password, self.endpoint.port())
    }

    fn hold_back(&self) {
        self.link.cut();
    }

    fn catch_up(&self) {
        let nodes = self.nodes.lock().unwrap();
        let Some(standby) = &nodes.standby else { return };
        self.link.retarget(nodes.primary.port);
        let lsn = self.psql(&nodes.primary, "SELECT pg_current_wal_lsn()");
        let sql = format!("SELECT pg_last_wal_replay_lsn() >= '{lsn}'::pg_lsn");
        self.until(standby, "the standby catches up", &sql);
    }

    fn fail_over(&self) {
        let mut nodes = self.nodes.lock().unwrap();
        let standby = nodes.standby.take().expect("a standby to promote (add_replica first)");
        self.kill(&nodes.primary);
        self.tool("pg_ctl", &["-D", standby.data.to_str().unwrap(), "-w", "-t", "60", "promote"]);
        self.endpoint.move_to(standby.port);
        // Takes writes: a transaction id is given only to a transaction that may write.
        self.until(&standby, "the new primary takes writes", "SELECT txid_current() > 0 AND NOT pg_is_in_recovery()");
        let old = std::mem::replace(&mut nodes.primary, standby);
        if let Some(dead) = nodes.dead.replace(old) {
            self.remove(dead);
        }
    }

    fn add_replica(&self) {
        let mut nodes = self.nodes.lock().unwrap();
        // A synchronous primary would wait for the new standby's first answer.
        if self.synchronous {
            self.psql(&nodes.primary, "ALTER SYSTEM RESET synchronous_standby_names");
            self.psql(&nodes.primary, "SELECT pg_reload_conf()");
        }
        if let Some(standby) = nodes.standby.take() {
            self.remove(standby);
        }
        let data = self.dir.path().join(format!("node{}", nodes.made));
        nodes.made += 1;
        // Through the link: `-R` writes the link's address into the standby's settings.
        self.link.retarget(nodes.primary.port);
        let (d, port) = (data.to_str().unwrap(), self.link.port().to_string());
        let args = ["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "-D", d, "-R", "-X", "stream"];
        self.tool("pg_basebackup", &[&args[..], &["--checkpoint=fast", "--no-sync"]].concat());
        // A standby ignores synchronous_standby_names, but once promoted it would wait for a
        // standby it does not have yet (`add_replica` sets it when it has one).
        let auto = data.join("postgresql.auto.conf");
        let mut file = std::fs::OpenOptions::new().append(true).open(&auto).expect("open postgresql.auto.conf");
        file.write_all(b"synchronous_standby_names = ''\n").expect("write postgresql.auto.conf");
        let standby = Node { port: self.start_node(&data), data };
        if self.synchronous {
            self.psql(&nodes.primary, "ALTER SYSTEM SET synchronous_standby_names = '*'");
            self.psql(&nodes.primary, "SELECT pg_reload_conf()");
        }
        self.until(&nodes.primary, "the new standby streams", self.streaming_sql());
        nodes.standby = Some(standby);
        if let Some(dead) = nodes.dead.take() {
            self.remove(dead);
        }
    }

    fn synchronous(&self) -> bool {
        self.synchronous
    }

    fn describe(&self) -> String {
        let kind = if self.synchronous { "a synchronous" } else { "an asynchronous" };
        format!("PostgreSQL 15, a primary and {kind} streaming standby behind a moving endpoint")
    }
}

impl Drop for PostgresReplicated {
    fn drop(&mut self) {
        let nodes = self.nodes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let all = [Some(&nodes.primary), nodes.standby.as_ref(), nodes.dead.as_ref()];
        for node in all.into_iter().flatten() {
            self.kill(node);
        }
        self.link.close();
        // The directory goes with `dir`.
    }
}

/// A TCP forwarder on a free port of 127.0.0.1 to a port of 127.0.0.1 (the primary), for
/// the standby's replication connection: `cut` closes every connection it carries and
/// refuses new ones until `retarget`. One lock covers the accepting and the cutting, so a
/// connection being made while the link is cut is either closed by the cut or refused.
struct Link {
    port: u16,
    state: Arc<Mutex<LinkState>>,
}

struct LinkState {
    /// Where connections go; `None` while cut.
    upstream: Option<u16>,
    open: Vec<TcpStream>,
    /// The set-up is gone: the accepting thread ends.
    closed: bool,
}

impl Link {
    /// A link that refuses connections until `retarget`.
    fn start() -> Link {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().unwrap().port();
        let state = LinkState { upstream: None, open: Vec::new(), closed: false };
        let link = Link { port, state: Arc::new(Mutex::new(state)) };
        let state = link.state.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let mut state = state.lock().unwrap();
                if state.closed {
                    return;
                }
                let server = state.upstream.and_then(|to| {
                    TcpStream::connect_timeout(&([127, 0, 0, 1], to).into(), Duration::from_secs(2)).ok()
                });
                let Some(server) = server else {
                    let _ = client.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                state.open.retain(|s| s.peer_addr().is_ok());
                state.open.extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                pipe(client.try_clone().unwrap(), server.try_clone().unwrap());
                pipe(server, client);
            }
        });
        link
    }

    fn port(&self) -> u16 {
        self.port
    }

    /// Close every connection and refuse new ones: nothing more reaches the standby.
    fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.upstream = None;
        for stream in state.open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Let connections through again, to `upstream`.
    fn retarget(&self, upstream: u16) {
        self.state.lock().unwrap().upstream = Some(upstream);
    }

    /// Cut, and end the accepting thread (woken by one last connection).
    fn close(&self) {
        self.cut();
        self.state.lock().unwrap().closed = true;
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}
