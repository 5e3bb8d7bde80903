//! A throw-away Redis server: `redis-server` in a temporary directory, listening on
//! 127.0.0.1 on a free port, stopped (and the directory deleted) when dropped.
//!
//! It runs with `--appendonly yes --appendfsync always`, as the store's documentation asks
//! for leases that matter, so leases survive the restart the conformance suite does, and
//! with a random `--requirepass`, so the tests see password handling as users do.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, TlsServer, WrongSecret};

pub struct Redis {
    dir: tempfile::TempDir,
    port: AtomicU16,
    password: String,
    server: ServerProcess,
    /// With `start_tls`: the certificates, and a second port that speaks only TLS.
    tls: Option<(super::tls::Certs, AtomicU16)>,
    /// With `start_configured`: settings added to the command line.
    settings: Vec<String>,
}

impl Redis {
    /// Start a server; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with(None, &[])
    }

    /// Start a server with more settings, e.g. `["--maxmemory-policy", "allkeys-lru"]`.
    pub fn start_configured(settings: &[&str]) -> Self {
        Self::start_with(None, settings)
    }

    /// Start a server that also listens for TLS (see `tls_url`), with certificates of a
    /// throw-away CA.
    pub fn start_tls() -> Self {
        Self::start_with(Some((super::tls::Certs::new(), AtomicU16::new(0))), &[])
    }

    fn start_with(tls: Option<(super::tls::Certs, AtomicU16)>, settings: &[&str]) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-redis-").tempdir().expect("create a temp dir");
        let password = format!("Sekr1t-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff);
        let settings = settings.iter().map(|s| s.to_string()).collect();
        let redis = Self { dir, port: AtomicU16::new(0), password, server: ServerProcess::default(), tls, settings };
        let pick_ports = || {
            redis.port.store(super::free_port(), Ordering::SeqCst);
            if let Some((_, tls_port)) = &redis.tls {
                tls_port.store(super::free_port(), Ordering::SeqCst);
            }
        };
        start_on_free_ports("Redis", pick_ports, || redis.try_start());
        redis
    }

    /// `redis://:PASSWORD@127.0.0.1:PORT/0`
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// `rediss://:PASSWORD@127.0.0.1:TLS_PORT/0?cacert=CA.crt&cert=CLIENT.crt&key=CLIENT.key`
    /// (only with `start_tls`: the server asks for a client certificate).
    pub fn tls_url(&self) -> String {
        let (certs, port) = self.tls.as_ref().expect("started with start_tls");
        let port = port.load(Ordering::SeqCst);
        let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
        let files = format!("cacert={}&cert={}&key={}", ca.display(), cert.display(), key.display());
        format!("rediss://:{}@127.0.0.1:{port}/0?{files}", self.password)
    }

    /// The certificates of a server started with `start_tls`.
    pub fn certs(&self) -> &super::tls::Certs {
        &self.tls.as_ref().expect("started with start_tls").0
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// Stop the server (SIGTERM: it finishes writing the append-only file and exits).
    pub fn stop(&self) {
        self.server.stop()
    }

    /// Start the stopped server again, on the same port, with the same data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("Redis does not start again: {why}");
        }
    }

    /// Send one command (after AUTH) and return the raw reply, e.g. `+PONG\r\n`.
    pub fn command(&self, args: &[&str]) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port()))?;
        stream.set_read_timeout(Some(Duration::from_secs(5)))?;
        stream.write_all(format!("{}{}", encode(&["AUTH", &self.password]), encode(args)).as_bytes())?;
        let mut reply = String::new();
        let mut buf = [0u8; 4096];
        // The AUTH reply (+OK) and then the command's, which for the commands used here
        // fits one read.
        while reply.matches("\r\n").count() < 2 {
            let n = stream.read(&mut buf)?;
            if n == 0 {
                break;
            }
            reply.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        Ok(reply.strip_prefix("+OK\r\n").unwrap_or(&reply).to_string())
    }

    fn try_start(&self) -> Result<(), String> {
        let log = std::fs::File::create(self.dir.path().join("log")).map_err(|e| e.to_string())?;
        let port = self.port().to_string();
        let mut tls_args: Vec<String> = Vec::new();
        if let Some((certs, tls_port)) = &self.tls {
            tls_args.extend(["--tls-port".into(), tls_port.load(Ordering::SeqCst).to_string()]);
            for (flag, path) in [
                ("--tls-cert-file", certs.server_cert()),
                ("--tls-key-file", certs.server_key()),
                ("--tls-ca-cert-file", certs.ca()),
            ] {
                tls_args.extend([flag.to_string(), path.display().to_string()]);
            }
            // Clients must show a certificate of the CA (mutual TLS).
            tls_args.extend(["--tls-auth-clients".into(), "yes".into()]);
        }
        let mut child = Command::new("redis-server")
            .args(["--port", &port, "--bind", "127.0.0.1", "--save", "", "--daemonize", "no"])
            .args(&tls_args)
            .args(["--appendonly", "yes", "--appendfsync", "always", "--requirepass", &self.password])
            .args(&self.settings)
            .arg("--dir")
            .arg(self.dir.path())
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run redis-server (is it installed?): {e}"))?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
                return Err(format!("redis-server exited with {status}: {log}"));
            }
            if self.command(&["PING"]).is_ok_and(|reply| reply.starts_with("+PONG")) {
                self.server.set(child);
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                let _ = child.wait();
                return Err("no PONG within 30 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl TestServer for Redis {
    fn start() -> Self {
        Redis::start()
    }

    fn port(&self) -> u16 {
        Redis::port(self)
    }

    fn url_via(&self, port: u16) -> String {
        format!("redis://:{}@127.0.0.1:{port}/0", self.password)
    }

    fn secret(&self) -> Option<String> {
        Some(self.password.clone())
    }

    fn wrong_secret(&self) -> Option<WrongSecret> {
        Some(WrongSecret::replacing(self, &self.password, "authentication failed"))
    }

    fn pids(&self) -> Vec<u32> {
        self.server.pid().into_iter().collect()
    }

    fn stop(&self) {
        Redis::stop(self)
    }

    fn start_again(&self) {
        Redis::start_again(self)
    }
}

impl TlsServer for Redis {
    fn start_tls() -> Self {
        Redis::start_tls()
    }

    fn tls_url(&self) -> String {
        Redis::tls_url(self)
    }
}

/// One command in the Redis protocol (RESP): an array of bulk strings.
pub fn encode(args: &[&str]) -> String {
    let mut out = format!("*{}\r\n", args.len());
    for arg in args {
        out.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    out
}
