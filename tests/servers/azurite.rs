//! A throw-away Azure Blob server: Azurite's blob service (npm `azurite`, 3.35: the last for
//! Node 20) on 127.0.0.1 on a free port, with one container, stopped when dropped.
//!
//! It keeps its blobs and their leases on disk (`--location DIR`, without
//! `--inMemoryPersistence`), so a restart finds every lease as it was, still running on the
//! server's clock; `start_again` keeps the port. Azurite 3.35 reloads a lease's expiry and
//! break times from disk as text, which it then compares with a date, and every lease held
//! across a restart looks expired (a breaking one broken): the server runs with a small
//! preload (`DATES`) that turns them back into dates before its lease logic reads them. Clients reach it through a connection string
//! with Azurite's well-known development account and key (`env`), as the Azure CLI does.
//!
//! The binary: `$LEADERRUN_AZURITE`, else `azurite-blob` on PATH, else the one .ci/run
//! installs under ~/.cache/leaderrun-test-tools/azurite.

use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, WrongSecret};

pub const ACCOUNT: &str = "devstoreaccount1";
/// Azurite's well-known development key (published in its README).
pub const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
/// Another key of the same length, which the server refuses.
pub const WRONG_KEY: &str = "V3JvbmdTZWNyZXQ0Mldyb25nU2VjcmV0NDJXcm9uZ1NlY3JldDQyV3JvbmdTZWNyZXQ0Mlc=";
pub const CONTAINER: &str = "leaderrun-test";

/// Preloaded into Azurite (`node --require`): its lease times, reloaded from disk as text,
/// made dates again before any lease state is judged. The lease logic sits beside `main.js`.
const DATES: &str = r#"
const path = require("path");
const factory = require(path.join(path.dirname(process.argv[1]), "lease", "LeaseFactory.js")).default;
const create = factory.createLeaseState;
factory.createLeaseState = function (lease, context) {
  for (const key of ["leaseExpireTime", "leaseBreakTime"]) {
    if (typeof lease[key] === "string") lease[key] = new Date(lease[key]);
  }
  return create.call(this, lease, context);
};
"#;

const INSTALLED: &str = ".cache/leaderrun-test-tools/azurite/node_modules/.bin/azurite-blob";

/// The azurite-blob binary, or a panic saying how to install it.
pub fn binary() -> PathBuf {
    if let Some(path) = std::env::var_os("LEADERRUN_AZURITE") {
        return PathBuf::from(path);
    }
    let mut candidates: Vec<PathBuf> =
        std::env::var_os("PATH").iter().flat_map(std::env::split_paths).map(|d| d.join("azurite-blob")).collect();
    candidates.extend(std::env::var_os("HOME").map(|home| PathBuf::from(home).join(INSTALLED)));
    candidates.into_iter().find(|p| p.is_file()).unwrap_or_else(|| {
        panic!(
            "azurite-blob not found: npm install --prefix ~/.cache/leaderrun-test-tools/azurite azurite@3.35.0 \
             (see .ci/run), or set LEADERRUN_AZURITE"
        )
    })
}

/// The connection string of Azurite's development account at `port`, signed with `key`.
pub fn connection_string(port: u16, key: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};\
         BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )
}

pub struct Azurite {
    dir: tempfile::TempDir,
    port: AtomicU16,
    server: ServerProcess,
}

impl Azurite {
    /// Start a server with the container; panics if it cannot.
    pub fn start() -> Self {
        let server = Self::start_empty();
        server.create_container(CONTAINER);
        server
    }

    /// Start a server with no container.
    pub fn start_empty() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-azurite-").tempdir().expect("create a temp dir");
        let azurite = Self { dir, port: AtomicU16::new(0), server: ServerProcess::default() };
        start_on_free_ports(
            "azurite-blob",
            || azurite.port.store(super::free_port(), Ordering::SeqCst),
            || azurite.try_start(),
        );
        azurite
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The connection string of a client of this server.
    pub fn connection_string(&self) -> String {
        connection_string(self.port(), KEY)
    }

    /// `azblob://devstoreaccount1/CONTAINER[/PREFIX]`
    pub fn url_of(container: &str, prefix: &str) -> String {
        format!(
            "azblob://{ACCOUNT}/{container}{}",
            if prefix.is_empty() { String::new() } else { format!("/{prefix}") }
        )
    }

    /// Create `container`, through the store's own client (on a thread of its own, so that it
    /// works from inside a runtime as well as outside).
    pub fn create_container(&self, container: &str) {
        let (url, connection) = (Self::url_of(container, ""), self.connection_string());
        std::thread::spawn(move || {
            use leaderrun::store::azblob::{AzBlobStore, Target};
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let target = Target::parse(&url).unwrap();
            runtime.block_on(async {
                let store = AzBlobStore::open_with(&target, leaderrun::store::Access::Existing, &connection).await;
                store.unwrap().create_container().await.expect("create the container")
            });
        })
        .join()
        .expect("create the container");
    }

    /// The server's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.server.pid()
    }

    fn try_start(&self) -> Result<(), String> {
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("log"))
            .map_err(|e| format!("cannot create the log: {e}"))?;
        let data = self.dir.path().join("data");
        let dates = self.dir.path().join("dates.js");
        std::fs::write(&dates, DATES).map_err(|e| format!("cannot write {}: {e}", dates.display()))?;
        // azurite-blob is a link to its main.js, a node script: run it with the preload.
        let main = std::fs::canonicalize(binary()).map_err(|e| format!("cannot resolve azurite-blob: {e}"))?;
        let child = Command::new("node")
            .arg("--require")
            .arg(&dates)
            .arg(&main)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &self.port().to_string(), "--location"])
            .arg(&data)
            .args(["--disableTelemetry", "--skipApiVersionCheck", "--silent"])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| e.to_string())?)
            .stderr(log)
            .spawn()
            .map_err(|e| format!("cannot run {}: {e}", binary().display()))?;
        self.server.set(child);
        let started = Instant::now();
        loop {
            if self.server.exited() {
                return Err(format!("azurite-blob exited; log: {}", self.log_tail()));
            }
            if self.answers() {
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                self.stop();
                return Err(format!("azurite-blob not ready within 60 s; log: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the server answers HTTP (any status: an unsigned request is refused).
    fn answers(&self) -> bool {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", self.port())) else { return false };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let request = format!("GET /{ACCOUNT}?comp=list HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        let mut reply = [0u8; 12];
        stream.write_all(request.as_bytes()).is_ok()
            && stream.read_exact(&mut reply).is_ok()
            && reply.starts_with(b"HTTP/")
    }

    fn log_tail(&self) -> String {
        super::process::log_tail(&self.dir.path().join("log"))
    }
}

impl TestServer for Azurite {
    /// Azure keeps no lease shorter than 15 s.
    fn short_ttl(&self) -> Duration {
        Duration::from_secs(15)
    }

    fn start() -> Self {
        Azurite::start()
    }

    fn port(&self) -> u16 {
        Azurite::port(self)
    }

    fn url_via(&self, _port: u16) -> String {
        Self::url_of(CONTAINER, "")
    }

    /// The connection string, as the Azure CLI reads it.
    fn env_via(&self, port: u16) -> Vec<(String, String)> {
        vec![("AZURE_STORAGE_CONNECTION_STRING".to_string(), connection_string(port, KEY))]
    }

    fn secret(&self) -> Option<String> {
        Some(KEY.to_string())
    }

    /// A key of the right form that is not the account's: the server refuses its signatures.
    fn wrong_secret(&self) -> Option<WrongSecret> {
        let env = self.env().into_iter().map(|(name, value)| (name, value.replace(KEY, WRONG_KEY))).collect();
        Some(WrongSecret { url: self.url(), env, secret: WRONG_KEY.to_string(), refusal: "HTTP 403" })
    }

    fn pids(&self) -> Vec<u32> {
        self.pid().into_iter().collect()
    }

    fn stop(&self) {
        self.server.stop()
    }

    fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("azurite-blob does not start again: {why}");
        }
    }

    /// Stopped with SIGTERM, not killed: Azurite saves its blobs to disk only now and then and
    /// at a clean stop, so a SIGKILL loses what it acknowledged since (the container itself,
    /// soon after a start), which no real storage account does.
    fn kill(&self) {
        self.stop()
    }
}
