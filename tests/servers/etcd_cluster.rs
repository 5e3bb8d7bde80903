//! A throw-away 3-member etcd 3.4 cluster on 127.0.0.1 (Debian's `etcd-server`), as users run
//! one: each member its own client and peer ports and data directory, etcd's default election
//! settings (heartbeat 100 ms, election timeout 1 s), `--unsafe-no-fsync` (a killed member
//! keeps what it acknowledged: the OS has it). Stopped when dropped.
//!
//! Which member leads is read from each member's `/v3/maintenance/status` (etcd's JSON
//! gateway on the client port): a member that answers and names itself as the leader leads.
//! A dead or frozen member answers nothing, so a leader it still names is not taken for one.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::cluster::Cluster;
use super::process::ServerProcess;

/// How long a member has to answer a status request (a frozen one never does).
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

struct Member {
    client: u16,
    peer: u16,
    process: ServerProcess,
    /// etcd's member id, as the status reports it (a decimal string).
    id: String,
}

pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    token: String,
}

impl EtcdCluster {
    /// Start three members and wait until they have a leader; panics with the reason if the
    /// cluster does not come up (ports are picked again a few times first).
    pub fn start() -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let dir = tempfile::Builder::new().prefix("leaderrun-etcd-cluster-").tempdir().expect("a temp dir");
            let token = format!("leaderrun-{:x}", rand::random::<u64>());
            let members = (0..3)
                .map(|_| Member {
                    client: super::free_port(),
                    peer: super::free_port(),
                    process: ServerProcess::default(),
                    id: String::new(),
                })
                .collect();
            let mut cluster = Self { dir, members, token };
            match cluster.try_start() {
                Ok(()) => return cluster,
                Err(why) => last = why,
            }
        }
        panic!("the etcd cluster does not start: {last}");
    }

    fn try_start(&mut self) -> Result<(), String> {
        for i in 0..self.members.len() {
            self.spawn(i)?;
        }
        let started = Instant::now();
        for i in 0..self.members.len() {
            loop {
                if self.members[i].process.exited() {
                    return Err(format!("member {i} exited; log: {}", self.log_tail(i)));
                }
                if let Some(status) = self.status(i) {
                    self.members[i].id = id_of(&status["header"]["member_id"]);
                    break;
                }
                if started.elapsed() > Duration::from_secs(30) {
                    return Err(format!("member {i} does not answer within 30 s; log: {}", self.log_tail(i)));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.wait_for_leader(Duration::from_secs(30)).map(drop).ok_or_else(|| "no leader within 30 s".to_string())
    }

    fn spawn(&self, i: usize) -> Result<(), String> {
        let member = &self.members[i];
        let (client, peer) =
            (format!("http://127.0.0.1:{}", member.client), format!("http://127.0.0.1:{}", member.peer));
        let initial: Vec<String> =
            self.members.iter().enumerate().map(|(j, m)| format!("e{j}=http://127.0.0.1:{}", m.peer)).collect();
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("log{i}")))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let data = self.dir.path().join(format!("data{i}"));
        let child = Command::new("etcd")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args(["--name", &format!("e{i}"), "--data-dir", data.to_str().unwrap()])
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster={}", initial.join(",")))
            .args(["--initial-cluster-state", "new", "--initial-cluster-token", &self.token])
            .arg("--unsafe-no-fsync")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run etcd (is etcd-server installed?): {e}"))?;
        member.process.set(child);
        Ok(())
    }

    /// Member `i`'s answer to `/v3/maintenance/status`, if it answers within `STATUS_TIMEOUT`.
    pub fn status(&self, i: usize) -> Option<serde_json::Value> {
        let body = http(self.members[i].client, "POST", "/v3/maintenance/status", "{}")?;
        // The gateway may answer in chunks: the JSON object is between the first `{` and the last `}`.
        let (start, end) = (body.find('{')?, body.rfind('}')?);
        serde_json::from_str(&body[start..=end]).ok()
    }

    /// A gauge or counter of member `i`'s `/metrics` (Prometheus' text format), if it answers.
    pub fn metric(&self, i: usize, name: &str) -> Option<f64> {
        let body = http(self.members[i].client, "GET", "/metrics", "")?;
        body.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// The client port of member `i`.
    pub fn port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    fn log_tail(&self, i: usize) -> String {
        super::process::log_tail(&self.dir.path().join(format!("log{i}")))
    }
}

/// A member id as the JSON gateway writes it (a uint64, as a string).
fn id_of(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// One HTTP/1.0 request to 127.0.0.1:`port` (so that the answer is not chunked); the body of a
/// 200 answer.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, STATUS_TIMEOUT).ok()?;
    stream.set_read_timeout(Some(STATUS_TIMEOUT)).ok()?;
    stream.set_write_timeout(Some(STATUS_TIMEOUT)).ok()?;
    let request = format!(
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    if head.split(' ').nth(1) != Some("200") {
        return None;
    }
    Some(body.to_string())
}

impl Cluster for EtcdCluster {
    fn len(&self) -> usize {
        self.members.len()
    }

    fn url_from(&self, first: usize) -> String {
        let order = std::iter::once(first).chain((0..self.len()).filter(|i| *i != first));
        let hosts: Vec<String> = order.map(|i| format!("127.0.0.1:{}", self.members[i].client)).collect();
        format!("etcd://{}", hosts.join(","))
    }

    fn leader(&self) -> Option<usize> {
        (0..self.len()).find(|&i| {
            self.status(i).is_some_and(|status| {
                let leader = id_of(&status["leader"]);
                leader != "0" && leader == self.members[i].id
            })
        })
    }

    fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.pid()
    }

    fn kill(&self, i: usize) {
        if let Some(pid) = self.pid(i) {
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
        // Reaps it (the SIGTERM it also sends finds it dead).
        self.members[i].process.stop();
    }

    fn restart(&self, i: usize) {
        self.spawn(i).unwrap_or_else(|why| panic!("member {i} does not start again: {why}"));
        let started = Instant::now();
        while self.status(i).is_none() {
            assert!(started.elapsed() < Duration::from_secs(30), "member {i} does not answer: {}", self.log_tail(i));
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        // A frozen member is killed all the same; thawing it first lets it die at once.
        for i in 0..self.len() {
            self.thaw(i);
        }
    }
}
