//! A throw-away single-member etcd 3.4 cluster (Debian's `etcd-server`): data in a
//! temporary directory, client and peer ports free ports on 127.0.0.1, stopped when dropped.
//!
//! `--unsafe-no-fsync`: a killed or stopped server keeps every acknowledged write (the OS
//! still has them); only an OS crash could lose them, which no test causes.

use std::fs::File;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, TlsServer};

pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: AtomicU16,
    peer_port: AtomicU16,
    process: ServerProcess,
    /// With `start_tls`: the certificates, and a second client port that speaks only TLS.
    tls: Option<(super::tls::Certs, AtomicU16)>,
    /// More etcd flags, kept for `start_again`.
    extra_args: Vec<String>,
}

impl Etcd {
    /// Start a new server; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with(None, Vec::new())
    }

    /// Start a server that also listens for TLS clients with a certificate (see `tls_url`).
    pub fn start_tls() -> Self {
        Self::start_with(Some((super::tls::Certs::new(), AtomicU16::new(0))), Vec::new())
    }

    /// Start a server whose authentication tokens lapse after `secs` seconds unused
    /// (etcd's default is 300), to see a client get a new one.
    pub fn start_with_auth_token_ttl(secs: u32) -> Self {
        Self::start_with(None, vec![format!("--auth-token-ttl={secs}")])
    }

    fn start_with(tls: Option<(super::tls::Certs, AtomicU16)>, extra_args: Vec<String>) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-etcd-").tempdir().expect("create a temp dir");
        let (client_port, peer_port, process) = (AtomicU16::new(0), AtomicU16::new(0), ServerProcess::default());
        let etcd = Self { dir, client_port, peer_port, process, tls, extra_args };
        let pick_ports = || {
            etcd.client_port.store(super::free_port(), Ordering::SeqCst);
            etcd.peer_port.store(super::free_port(), Ordering::SeqCst);
            if let Some((_, tls_port)) = &etcd.tls {
                tls_port.store(super::free_port(), Ordering::SeqCst);
            }
        };
        start_on_free_ports("etcd", pick_ports, || etcd.try_start());
        etcd
    }

    /// `etcd://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// `etcds://127.0.0.1:TLS_PORT?cacert=CA&cert=CLIENT&key=CLIENT_KEY` (only with `start_tls`:
    /// the server asks for a client certificate).
    pub fn tls_url(&self) -> String {
        let (certs, port) = self.tls.as_ref().expect("started with start_tls");
        let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
        let port = port.load(Ordering::SeqCst);
        format!("etcds://127.0.0.1:{port}?cacert={}&cert={}&key={}", ca.display(), cert.display(), key.display())
    }

    /// The certificates of a server started with `start_tls`.
    pub fn certs(&self) -> &super::tls::Certs {
        &self.tls.as_ref().expect("started with start_tls").0
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port.load(Ordering::SeqCst)
    }

    /// Stop the server cleanly (SIGTERM) and wait for it; data is kept.
    pub fn stop(&self) {
        self.process.stop()
    }

    /// Start the stopped server again, on the same ports, with the same data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("etcd does not start again: {why}");
        }
    }

    /// Run `etcdctl` against this server; returns its stdout. Panics if it fails.
    pub fn etcdctl(&self, args: &[&str]) -> String {
        let out = self.etcdctl_cmd(args).output().expect("run etcdctl (is etcd-client installed?)");
        assert!(out.status.success(), "etcdctl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Turn authentication on: a root user, and user `user` with `password` that may read
    /// and write keys under `prefix` only.
    pub fn enable_auth(&self, user: &str, password: &str, prefix: &str) {
        self.etcdctl(&["user", "add", "root:rootpw"]);
        self.etcdctl(&["user", "add", &format!("{user}:{password}")]);
        self.etcdctl(&["role", "add", user]);
        self.etcdctl(&["role", "grant-permission", user, "--prefix=true", "readwrite", prefix]);
        self.etcdctl(&["user", "grant-role", user, user]);
        self.etcdctl(&["auth", "enable"]);
    }

    fn etcdctl_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("etcdctl");
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=http://127.0.0.1:{}", self.port()))
            .args(args);
        cmd
    }

    fn try_start(&self) -> Result<(), String> {
        let (client, peer) = (format!("http://127.0.0.1:{}", self.port()), {
            format!("http://127.0.0.1:{}", self.peer_port.load(Ordering::SeqCst))
        });
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let data = self.dir.path().join("data");
        let (mut clients, mut tls_args) = (client.clone(), Vec::new());
        if let Some((certs, tls_port)) = &self.tls {
            clients.push_str(&format!(",https://127.0.0.1:{}", tls_port.load(Ordering::SeqCst)));
            for (flag, path) in [
                ("--cert-file", certs.server_cert()),
                ("--key-file", certs.server_key()),
                ("--trusted-ca-file", certs.ca()),
            ] {
                tls_args.push(format!("{flag}={}", path.display()));
            }
            tls_args.push("--client-cert-auth".to_string());
        }
        let child = Command::new("etcd")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args(["--name", "t", "--data-dir", data.to_str().unwrap()])
            .args(["--listen-client-urls", &clients, "--advertise-client-urls", &clients])
            .args(&tls_args)
            .args(&self.extra_args)
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .arg(format!("--initial-cluster=t={peer}"))
            .arg("--unsafe-no-fsync")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run etcd (is etcd-server installed?): {e}"))?;
        self.process.set(child);
        let started = Instant::now();
        loop {
            if self.process.exited() {
                return Err(format!("etcd exited; log: {}", self.log_tail()));
            }
            let health =
                self.etcdctl_cmd(&["--dial-timeout=1s", "--command-timeout=1s", "endpoint", "health"]).output();
            if health.is_ok_and(|out| out.status.success()) {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                self.stop();
                return Err(format!("etcd not healthy within 30 s; log: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn log_tail(&self) -> String {
        super::process::log_tail(&self.dir.path().join("log"))
    }
}

/// Without authentication: `enable_auth` turns it on for the tests of etcd's passwords.
impl TestServer for Etcd {
    fn start() -> Self {
        Etcd::start()
    }

    fn port(&self) -> u16 {
        Etcd::port(self)
    }

    fn url_via(&self, port: u16) -> String {
        format!("etcd://127.0.0.1:{port}")
    }

    fn pids(&self) -> Vec<u32> {
        self.process.pid().into_iter().collect()
    }

    fn stop(&self) {
        Etcd::stop(self)
    }

    fn start_again(&self) {
        Etcd::start_again(self)
    }
}

impl TlsServer for Etcd {
    fn start_tls() -> Self {
        Etcd::start_tls()
    }

    fn tls_url(&self) -> String {
        Etcd::tls_url(self)
    }
}
