//! A throw-away Datastore: Google's Cloud Datastore emulator (`cloud_datastore_emulator`,
//! part of google-cloud-cli) on 127.0.0.1 on a free port, keeping its data in a temporary
//! directory, stopped when dropped. Clients find it through `DATASTORE_EMULATOR_HOST`
//! (`env`), or `GoogleApi::emulator` in-process (`host`).
//!
//! The binary: `$LEADERRUN_DATASTORE_EMULATOR`, else the one google-cloud-cli installs
//! (`/usr/lib/google-cloud-sdk/platform/cloud-datastore-emulator/cloud_datastore_emulator`).
//! No package registry serves it (it comes from Google's own apt repository as
//! `google-cloud-cli-datastore-emulator`), so a machine without it FAILS these tests, saying
//! so, rather than skipping them. It needs Java 17 or later.
//!
//! What the emulator does that Datastore does not, and how these tests live with it:
//! - It is a bash script that runs java as its child, so it starts in a process group of
//!   its own and every signal goes to the group.
//! - It writes its data to disk (`--store_on_disk`) only when it shuts down on SIGTERM. A
//!   SIGKILL loses every write since it started, so a restart is always SIGTERM, then a
//!   wait for the whole group to be gone.
//! - Its version counter starts again after a restart: entities keep their versions, but
//!   new writes get versions from 1 up again, so a version (and the token floor that comes
//!   from versions) can repeat across a restart. Each restart begins a new epoch
//!   (`epoch`); tokens are compared within one epoch only (the fault run does). leaderrun's
//!   nonce keeps two records at one version apart, so overlaps stay impossible.
//! - It reports no `readTime` and no `Date`: a --min-hold keep is judged on the host's
//!   wall clock.
//! - It is slow to start (a JVM): ready when `GET /` answers `Ok`, allowed 60 s.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::process::start_on_free_ports;
use super::TestServer;

/// Where google-cloud-cli installs the emulator.
const INSTALLED: &str = "/usr/lib/google-cloud-sdk/platform/cloud-datastore-emulator/cloud_datastore_emulator";

/// The project the tests' URLs name (the emulator takes any).
pub const PROJECT: &str = "leaderrun-test";

/// How long a JVM may take to answer on a loaded machine.
const READY_WITHIN: Duration = Duration::from_secs(60);

pub struct DatastoreEmulator {
    dir: tempfile::TempDir,
    port: AtomicU16,
    /// The running emulator's process group (its wrapper script and java).
    running: Mutex<Option<Child>>,
    /// How many times it has started: tokens compare only within one epoch.
    epoch: AtomicU64,
}

/// The emulator's launcher, or a panic saying how to get it.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LEADERRUN_DATASTORE_EMULATOR") {
        return PathBuf::from(path);
    }
    let installed = PathBuf::from(INSTALLED);
    if installed.is_file() {
        return installed;
    }
    panic!(
        "the Cloud Datastore emulator is not installed (looked for {INSTALLED}): install \
         google-cloud-cli-datastore-emulator from Google's apt repository (packages.cloud.google.com), or set \
         LEADERRUN_DATASTORE_EMULATOR to its cloud_datastore_emulator script; it needs Java 17"
    )
}

/// Whether any process of group `pgid` is still alive (a zombie is not).
fn group_alive(pgid: i32) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else { return false };
    entries.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let Some(close) = stat.rfind(')') else { return false };
        let fields: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        fields.len() > 2 && fields[0] != "Z" && fields[2] == pgid.to_string()
    })
}

impl DatastoreEmulator {
    /// Start an emulator; panics if it cannot (or is not installed).
    pub fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-datastore-").tempdir().expect("create a temp dir");
        let emulator = Self { dir, port: AtomicU16::new(0), running: Mutex::default(), epoch: AtomicU64::new(0) };
        start_on_free_ports(
            "cloud_datastore_emulator",
            || emulator.port.store(super::free_port(), Ordering::SeqCst),
            || emulator.try_start(),
        );
        emulator
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// `127.0.0.1:PORT`, as `DATASTORE_EMULATOR_HOST` takes it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port())
    }

    /// `datastore://leaderrun-test` (the server comes from `env`).
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    /// How many times the emulator has started (1 after `start`).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The process group of the running emulator, if it runs.
    pub fn pgid(&self) -> Option<i32> {
        self.lock().as_ref().map(|child| child.id() as i32)
    }

    /// Every live process of the running emulator (to freeze it with SIGSTOP).
    pub fn pids(&self) -> Vec<i32> {
        let Some(pgid) = self.pgid() else { return Vec::new() };
        let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
                let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
                (fields.get(2) == Some(&pgid.to_string().as_str())).then_some(pid)
            })
            .collect()
    }

    /// Stop the emulator with SIGTERM (it writes its data to disk) and wait until every
    /// process of it is gone. Never SIGKILL: that loses every write since it started.
    pub fn stop(&self) {
        let Some(mut child) = self.lock().take() else { return };
        let pgid = child.id() as i32;
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGCONT); // a frozen one must hear the SIGTERM
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
        let _ = child.wait();
        let started = Instant::now();
        while group_alive(pgid) && started.elapsed() < READY_WITHIN {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Start the stopped emulator again, on the same port and data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("cloud_datastore_emulator does not start again: {why}");
        }
    }

    fn try_start(&self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let data = self.dir.path().join("data");
        let mut cmd = Command::new(binary());
        cmd.arg("start")
            .arg("--host=127.0.0.1")
            .arg(format!("--port={}", self.port()))
            .arg("--store_on_disk=true")
            .arg("--consistency=1.0")
            .arg(&data)
            // A JVM sizes its heap by the machine's memory; tests start many.
            .env("JAVA_TOOL_OPTIONS", "-Xmx512m")
            .env_remove("DATASTORE_EMULATOR_HOST")
            .process_group(0)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log);
        let child = cmd.spawn().map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
        *self.lock() = Some(child);
        let started = Instant::now();
        loop {
            let exited = self.lock().as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_some());
            if exited {
                self.lock().take();
                return Err(format!("the emulator exited; log: {}", self.log_tail()));
            }
            if self.get_root().as_deref() == Some("Ok") {
                self.warm_up();
                self.epoch.fetch_add(1, Ordering::SeqCst);
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                self.stop();
                return Err(format!("not ready within {}s; log: {}", READY_WITHIN.as_secs(), self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One commit before any test's: the JVM's first one loads and compiles the whole write path
    /// and can take longer, on a busy machine, than a client gives a request (5 s), so that the
    /// test would measure the emulator's start, not the store. The entity's kind is one no
    /// store reads; whatever the answer, the emulator is then as warm as it gets.
    fn warm_up(&self) {
        let body = r#"{"mode":"NON_TRANSACTIONAL","mutations":[{"upsert":{"key":{"path":[{"kind":"WarmUp","name":"jvm"}]}}}]}"#;
        let request = format!(
            "POST /v1/projects/{PROJECT}:commit HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.host(),
            body.len()
        );
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port())) else { return };
        let _ = stream.set_read_timeout(Some(READY_WITHIN));
        if stream.write_all(request.as_bytes()).is_ok() {
            // The answer's first bytes say the commit is done; the rest does not matter.
            let _ = stream.read(&mut [0u8; 64]);
        }
    }

    /// The body of `GET /` (the health check), if the emulator answers.
    fn get_root(&self) -> Option<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port())).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let request = format!("GET / HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", self.host());
        stream.write_all(request.as_bytes()).ok()?;
        // The emulator may keep the connection open: read until the answer is whole.
        let (mut reply, mut chunk) = (Vec::new(), [0u8; 512]);
        while !String::from_utf8_lossy(&reply).contains("Ok") {
            match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => reply.extend_from_slice(&chunk[..n]),
            }
        }
        let reply = String::from_utf8_lossy(&reply);
        let (head, body) = reply.split_once("\r\n\r\n")?;
        (head.split_whitespace().nth(1) == Some("200")).then(|| body.trim().to_string())
    }

    fn log_tail(&self) -> String {
        super::process::log_tail(&self.dir.path().join("log"))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        // A test that panicked while holding it must not keep the emulator from being stopped.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for DatastoreEmulator {
    /// The test is over and its data with it: no need to wait for the emulator to save.
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().take() {
            let pgid = child.id() as i32;
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
            let _ = child.wait();
        }
    }
}

impl TestServer for DatastoreEmulator {
    /// A JVM's start: seconds when the machine is busy.
    fn outage_ttl(&self) -> Duration {
        Duration::from_secs(30)
    }

    fn start() -> Self {
        DatastoreEmulator::start()
    }

    fn port(&self) -> u16 {
        DatastoreEmulator::port(self)
    }

    fn url_via(&self, _port: u16) -> String {
        format!("datastore://{PROJECT}")
    }

    /// The emulator's address, as Google's client libraries read it.
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        vec![("DATASTORE_EMULATOR_HOST".to_string(), format!("127.0.0.1:{port}"))]
    }

    /// The launcher script and its java.
    fn pids(&self) -> Vec<u32> {
        DatastoreEmulator::pids(self).into_iter().map(|pid| pid as u32).collect()
    }

    fn stop(&self) {
        DatastoreEmulator::stop(self)
    }

    fn start_again(&self) {
        DatastoreEmulator::start_again(self)
    }

    /// Stopped with SIGTERM, not killed: the emulator saves its data only then, so a SIGKILL
    /// would lose every write since it started, which no real Datastore does.
    fn kill(&self) {
        DatastoreEmulator::stop(self)
    }
}
