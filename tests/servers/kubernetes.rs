//! A throw-away Kubernetes API server for Leases: `kube_apiserver.py` beside this file
//! (Python 3 standard library only; no real API server can be had on the test machines),
//! over TLS with a certificate from a throw-away CA, on a free port of 127.0.0.1, its
//! state in a temporary directory that outlives restarts, and a kubeconfig file that points
//! kubectl, kube-rs and the Python client at it.
//!
//! Two bearer tokens: `token()` may do anything with Leases; `denied_token()` is
//! authenticated but RBAC denies it every verb on Leases (403). Any other token is 401.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::process::{start_on_free_ports, ServerProcess};
use super::tls::Certs;
use super::{TestServer, WrongSecret};

/// The namespace the kubeconfig's context names.
pub const NAMESPACE: &str = "leaderrun-test";

/// The token of `wrong_kubeconfig`, which the server does not know.
pub const WRONG_TOKEN: &str = "wrong-token-5ecr3t";

/// The Python with PyPI's `kubernetes` client (37 or later: its LeaseLock). A venv of its
/// own: the client needs python-dateutil 3, which moto's botocore (in the shared test-tools
/// venv) refuses.
pub fn elector_python() -> PathBuf {
    if let Some(path) = std::env::var_os("LEADERRUN_KUBE_PYTHON") {
        return PathBuf::from(path);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_default();
    let python = home.join(".cache/leaderrun-test-tools/kube-venv/bin/python");
    assert!(
        python.is_file(),
        "{} not found: python3 -m venv ~/.cache/leaderrun-test-tools/kube-venv && \
         ~/.cache/leaderrun-test-tools/kube-venv/bin/pip install kubernetes (or run .ci/run)",
        python.display()
    );
    python
}

pub struct KubeApiServer {
    dir: tempfile::TempDir,
    certs: Certs,
    port: AtomicU16,
    token: String,
    denied_token: String,
    /// Events kept for watches; older resourceVersions get 410 Gone.
    history: usize,
    process: ServerProcess,
}

impl KubeApiServer {
    /// Start a server; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with_history(1000)
    }

    /// Start a server that keeps only the last `history` events for watches.
    pub fn start_with_history(history: usize) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-kube-").tempdir().expect("create a temp dir");
        std::fs::create_dir(dir.path().join("state")).expect("create the state directory");
        let secret = || format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let server = Self {
            dir,
            certs: Certs::new(),
            port: AtomicU16::new(0),
            token: format!("tok-{}", secret()),
            denied_token: format!("denied-{}", secret()),
            history,
            process: ServerProcess::default(),
        };
        std::fs::write(server.dir.path().join("tokens"), format!("{}\n{}\n", server.token, server.denied_token))
            .expect("write the token file");
        let pick_port = || server.port.store(super::free_port(), Ordering::SeqCst);
        start_on_free_ports("the test Kubernetes API server", pick_port, || server.try_start());
        for (file, token) in [
            ("kubeconfig", server.token.as_str()),
            ("denied.kubeconfig", &server.denied_token),
            ("wrong.kubeconfig", WRONG_TOKEN),
        ] {
            std::fs::write(server.dir.path().join(file), server.kubeconfig_text(token)).expect("write a kubeconfig");
        }
        server
    }

    /// `https://127.0.0.1:PORT`, where the kubeconfig points clients.
    pub fn endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.port())
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// A kubeconfig with the CA, the server, the allowed token, and a current context whose
    /// namespace is `NAMESPACE`.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    /// The same with the token RBAC denies (403 on every Lease request).
    pub fn denied_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("denied.kubeconfig")
    }

    /// The same with a token the server does not know (401).
    pub fn wrong_kubeconfig(&self) -> PathBuf {
        self.dir.path().join("wrong.kubeconfig")
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn denied_token(&self) -> &str {
        &self.denied_token
    }

    /// The CA certificate that signed the server's.
    pub fn ca(&self) -> PathBuf {
        self.certs.ca()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// API requests served so far with this verb (get, list, watch, create, update, patch,
    /// delete), across restarts.
    pub fn requests(&self, verb: &str) -> u64 {
        let text = std::fs::read_to_string(self.dir.path().join("state/requests.json")).unwrap_or_default();
        let counts: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        counts[verb].as_u64().unwrap_or(0)
    }

    /// Run the real kubectl against this server with the allowed token.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.dir.path())
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args)
            .output()
            .expect("run kubectl (apt-get install -y kubernetes-client)")
    }

    /// `kubectl`, panicking unless it succeeds; its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kube_elector.py` (the Python `kubernetes` client's leader elector) against this
    /// server with the allowed token, in the context's namespace; `args` as it takes them.
    pub fn python_elector(&self, args: &[&str]) -> Command {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/kube_elector.py");
        let mut cmd = Command::new(elector_python());
        cmd.arg(script).arg("--kubeconfig").arg(self.kubeconfig()).args(["--namespace", NAMESPACE]).args(args);
        cmd
    }

    /// The running server process.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Stop the server (SIGTERM) and wait for it; its state (written on every change) is kept.
    pub fn stop(&self) {
        // A frozen server would never act on the SIGTERM.
        self.thaw();
        self.process.stop()
    }

    /// Start the stopped server again, on the same port, with the same state.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("the test Kubernetes API server does not start again: {why}");
        }
    }

    /// SIGSTOP the server: connections stay open and requests hang, as with a stalled server.
    pub fn freeze(&self) {
        self.signal(Signal::SIGSTOP)
    }

    /// SIGCONT a frozen server.
    pub fn thaw(&self) {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    fn kubeconfig_text(&self, token: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    \
             certificate-authority: {ca}\nusers:\n- name: test\n  user:\n    token: {token}\ncontexts:\n\
             - name: test\n  context:\n    cluster: test\n    user: test\n    namespace: {NAMESPACE}\n\
             current-context: test\n",
            url = self.endpoint(),
            ca = self.certs.ca().display(),
        )
    }

    fn try_start(&self) -> Result<(), String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/kube_apiserver.py");
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let listening = format!("listening on 127.0.0.1:{}", self.port());
        let starts_before = self.log().matches(&listening).count();
        let child = Command::new("python3")
            .arg(&script)
            .arg(format!("--port={}", self.port()))
            .arg("--state-dir")
            .arg(self.dir.path().join("state"))
            .arg("--cert")
            .arg(self.certs.server_cert())
            .arg("--key")
            .arg(self.certs.server_key())
            .arg("--token-file")
            .arg(self.dir.path().join("tokens"))
            .arg(format!("--history={}", self.history))
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        self.process.set(child);
        let started = Instant::now();
        loop {
            if self.process.exited() {
                return Err(format!("it exited; log: {}", self.log_tail()));
            }
            // Its own line in the log: another process may hold the port.
            if self.log().matches(&listening).count() > starts_before {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(30) {
                self.stop();
                return Err(format!("not listening within 30 s; log: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn log_tail(&self) -> String {
        let log = self.log();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        format!("{tail:#?}")
    }
}

/// Clients find the server, and sign in with the allowed token, through a kubeconfig named by
/// `KUBECONFIG`; the store URL names the namespace.
impl TestServer for KubeApiServer {
    fn start() -> Self {
        KubeApiServer::start()
    }

    fn port(&self) -> u16 {
        KubeApiServer::port(self)
    }

    fn url_via(&self, _port: u16) -> String {
        format!("k8s://{NAMESPACE}")
    }

    /// Through another port, a kubeconfig of its own that names it (the server's certificate
    /// names 127.0.0.1, whatever the port).
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        let file = if port == self.port() {
            self.kubeconfig()
        } else {
            let file = self.dir.path().join(format!("via-{port}.kubeconfig"));
            let text =
                self.kubeconfig_text(&self.token).replace(&self.endpoint(), &format!("https://127.0.0.1:{port}"));
            std::fs::write(&file, text).expect("write a kubeconfig");
            file
        };
        vec![("KUBECONFIG".to_string(), file.display().to_string())]
    }

    fn secret(&self) -> Option<String> {
        Some(self.token.clone())
    }

    fn wrong_secret(&self) -> Option<WrongSecret> {
        Some(WrongSecret {
            url: self.url(),
            env: vec![("KUBECONFIG".to_string(), self.wrong_kubeconfig().display().to_string())],
            secret: WRONG_TOKEN.to_string(),
            refusal: "401",
        })
    }

    fn pids(&self) -> Vec<u32> {
        self.pid().into_iter().collect()
    }

    fn stop(&self) {
        KubeApiServer::stop(self)
    }

    fn start_again(&self) {
        KubeApiServer::start_again(self)
    }
}
