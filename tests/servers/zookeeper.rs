//! A throw-away standalone ZooKeeper 3.8 server (Debian's `zookeeper` package): data in a
//! temporary directory, client port a free port on 127.0.0.1, stopped when dropped.
//!
//! `tickTime=500` makes the shortest session 1 s (2 ticks), so a test of a short lease does
//! not wait long; `maxSessionTimeout=120000` lets the suite's 30 s ttl through (unless started
//! with `start_with_default_session_limits`: then 20 ticks, 10 s, as ZooKeeper's default);
//! `maxClientCnxns=0` lifts the limit of 60 connections per client address, since the tests
//! play whole fleets from 127.0.0.1 (50 contenders, each with a connection or two). Sessions and
//! nodes are kept in the data directory, so they survive `stop()` and `start_again()`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::process::{start_on_free_ports, ServerProcess};
use super::{TestServer, TlsServer};

/// Where Debian's package puts the server's jar.
const JAR: &str = "/usr/share/java/zookeeper.jar";
/// The server's tick (ms).
pub const TICK_MS: u64 = 500;
/// The longest session the server grants (ms).
pub const MAX_SESSION_TIMEOUT_MS: u64 = 120_000;
/// The longest session a server started with `start_with_default_session_limits` grants (ms):
/// ZooKeeper's default, 20 ticks.
pub const DEFAULT_MAX_SESSION_TIMEOUT_MS: u64 = 20 * TICK_MS;

pub struct ZooKeeper {
    dir: tempfile::TempDir,
    port: AtomicU16,
    process: ServerProcess,
    /// With `start_tls`: the certificates, and the secure client port (TLS only).
    tls: Option<(super::tls::Certs, AtomicU16)>,
    /// `maxSessionTimeout` in zoo.cfg; `None` leaves ZooKeeper's default (20 ticks).
    max_session_timeout_ms: Option<u64>,
}

impl ZooKeeper {
    /// Start a new server; panics with the reason if it cannot.
    pub fn start() -> Self {
        Self::start_with(None, Some(MAX_SESSION_TIMEOUT_MS))
    }

    /// Start a server with ZooKeeper's default session limits (2 to 20 ticks: 1 s to 10 s).
    pub fn start_with_default_session_limits() -> Self {
        Self::start_with(None, None)
    }

    /// Start a server that also has a secure client port (Netty, TLS only, client certificates
    /// required), with certificates of a throw-away CA (see `tls_url`).
    pub fn start_tls() -> Self {
        Self::start_with(Some((super::tls::Certs::new(), AtomicU16::new(0))), Some(MAX_SESSION_TIMEOUT_MS))
    }

    fn start_with(tls: Option<(super::tls::Certs, AtomicU16)>, max_session_timeout_ms: Option<u64>) -> Self {
        if !Path::new(JAR).exists() || Command::new("java").arg("-version").output().is_err() {
            panic!("ZooKeeper or Java is missing: apt-get install -y zookeeper");
        }
        let dir = tempfile::Builder::new().prefix("leaderrun-zk-").tempdir().expect("create a temp dir");
        let zk = Self { dir, port: AtomicU16::new(0), process: ServerProcess::default(), tls, max_session_timeout_ms };
        let pick_ports = || {
            zk.port.store(super::free_port(), Ordering::SeqCst);
            if let Some((_, tls_port)) = &zk.tls {
                tls_port.store(super::free_port(), Ordering::SeqCst);
            }
        };
        start_on_free_ports("ZooKeeper", pick_ports, || zk.try_start());
        zk
    }

    /// `zk://127.0.0.1:SECURE_PORT?tls=1&cacert=CA&cert=CLIENT&key=CLIENT_KEY` (only with
    /// `start_tls`).
    pub fn tls_url(&self) -> String {
        let (certs, port) = self.tls.as_ref().expect("started with start_tls");
        let (ca, cert, key) = (certs.ca(), certs.client_cert(), certs.client_key());
        let port = port.load(Ordering::SeqCst);
        format!("zk://127.0.0.1:{port}?tls=1&cacert={}&cert={}&key={}", ca.display(), cert.display(), key.display())
    }

    /// The certificates of a server started with `start_tls`.
    pub fn certs(&self) -> &super::tls::Certs {
        &self.tls.as_ref().expect("started with start_tls").0
    }

    /// `zk://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// The running server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.process.pid()
    }

    /// Stop the server (SIGTERM) and wait for it; data and sessions are kept.
    pub fn stop(&self) {
        self.process.stop()
    }

    /// Start the stopped server again, on the same port, with the same data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("ZooKeeper does not start again: {why}");
        }
    }

    /// Send a four-letter command (`ruok` or `srvr`) and return the answer.
    pub fn four_letters(&self, command: &str) -> std::io::Result<String> {
        four_letters_at(self.port(), command)
    }

    fn try_start(&self) -> Result<(), String> {
        let dir = self.dir.path();
        let mut config = format!(
            "tickTime={TICK_MS}\ndataDir={}\nclientPort={}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr\nmaxClientCnxns=0\n",
            dir.join("data").display(),
            self.port()
        );
        if let Some(max) = self.max_session_timeout_ms {
            config.push_str(&format!("maxSessionTimeout={max}\n"));
        }
        let mut classpath = CLASSPATH.to_string();
        if let Some((certs, tls_port)) = &self.tls {
            // The key and its certificate in one PEM file: ZooKeeper's PEM key store.
            let key_store = dir.join("server-key-store.pem");
            let pem = [certs.server_key(), certs.server_cert()]
                .iter()
                .map(std::fs::read_to_string)
                .collect::<Result<String, _>>();
            std::fs::write(&key_store, pem.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
            config.push_str(&format!(
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
                 secureClientPort={}\nsecureClientPortAddress=127.0.0.1\n\
                 ssl.keyStore.location={}\nssl.keyStore.type=PEM\n\
                 ssl.trustStore.location={}\nssl.trustStore.type=PEM\n\
                 ssl.clientAuth=need\nssl.hostnameVerification=false\n",
                tls_port.load(Ordering::SeqCst),
                key_store.display(),
                certs.ca().display()
            ));
            // The Netty jars its manifest leaves out (Debian's netty-all is an empty aggregate).
            classpath.push_str(":/usr/share/java/netty-codec.jar:/usr/share/java/netty-resolver.jar");
        }
        std::fs::write(dir.join("zoo.cfg"), config).map_err(|e| format!("cannot write zoo.cfg: {e}"))?;
        let mut child = spawn_java(dir, &classpath)?;
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(format!("ZooKeeper exited with {status}; log: {}", self.log_tail()));
            }
            // `ruok` answers before the server takes sessions; `srvr` says when it does. The
            // secure port opens on its own, sometimes a second after the plain one: wait for a
            // handshake on it too.
            let secure_ready =
                self.tls.as_ref().is_none_or(|(certs, port)| tls_handshake(certs, port.load(Ordering::SeqCst)));
            if secure_ready && self.four_letters("srvr").is_ok_and(|answer| answer.contains("Mode: ")) {
                self.process.set(child);
                return Ok(());
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("not serving within 60 s; log: {}", self.log_tail()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_tail(&self) -> String {
        log_tail_of(self.dir.path())
    }
}

/// Whether a TLS handshake with a client certificate completes on `port` (`openssl s_client`).
/// Besides telling that the secure port serves, it warms it: a fresh JVM's first handshake loads
/// and compiles its whole TLS stack and can take seconds on a busy machine, longer than a
/// client gives a handshake, and a test would then measure the JVM's start, not the server.
fn tls_handshake(certs: &super::tls::Certs, port: u16) -> bool {
    Command::new("openssl")
        .args(["s_client", "-brief", "-connect", &format!("127.0.0.1:{port}")])
        .arg("-CAfile")
        .arg(certs.ca())
        .arg("-cert")
        .arg(certs.client_cert())
        .arg("-key")
        .arg(certs.client_key())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// The last lines of the log in `dir`, without stack traces.
pub fn log_tail_of(dir: &Path) -> String {
    {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        // Not the stack traces, nor the noise of clients that went away.
        let noise =
            |l: &&str| l.starts_with('\t') || l.contains("EndOfStreamException") || l.contains("Unexpected exception");
        let tail: Vec<&str> = log.lines().filter(|l| !noise(l)).rev().take(12).collect();
        format!("{tail:#?}")
    }
}

/// Send a four-letter command (`ruok`, `srvr`, `cons`) to the server on `port` and return the
/// answer.
pub fn four_letters_at(port: u16, command: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(command.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The class path of Debian's package: the jar, and one SLF4J binding (the whole of
/// /usr/share/java has several, and then logs nothing).
pub const CLASSPATH: &str =
    "/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-log4j12.jar:/usr/share/java/log4j-1.2.jar";

/// Start `java` on `dir/zoo.cfg` (written by the caller), logging WARN and above to `dir/log`.
pub fn spawn_java(dir: &Path, classpath: &str) -> Result<std::process::Child, String> {
    let log4j = "log4j.rootLogger=WARN, CONSOLE\nlog4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender\n\
                     log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout\n\
                     log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p %c{1} - %m%n\n";
    std::fs::write(dir.join("log4j.properties"), log4j).map_err(|e| format!("cannot write log4j.properties: {e}"))?;
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("log"))
        .map_err(|e| format!("cannot create the log: {e}"))?;
    Command::new("java")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto"])
        // The jar's manifest names its dependencies; log4j for a readable log.
        .args(["-cp", classpath])
        .arg(format!("-Dzookeeper.log.dir={}", dir.display()))
        .arg(format!("-Dlog4j.configuration=file:{}", dir.join("log4j.properties").display()))
        .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
        .arg(dir.join("zoo.cfg"))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run java (apt-get install -y zookeeper): {e}"))
}

/// Open to anyone: a client's password protects the root it creates, not the server.
impl TestServer for ZooKeeper {
    /// A JVM's start: seconds when the machine is busy.
    fn outage_ttl(&self) -> Duration {
        Duration::from_secs(30)
    }

    fn start() -> Self {
        ZooKeeper::start()
    }

    fn port(&self) -> u16 {
        ZooKeeper::port(self)
    }

    fn url_via(&self, port: u16) -> String {
        format!("zk://127.0.0.1:{port}")
    }

    fn pids(&self) -> Vec<u32> {
        self.process.pid().into_iter().collect()
    }

    fn stop(&self) {
        ZooKeeper::stop(self)
    }

    fn start_again(&self) {
        ZooKeeper::start_again(self)
    }
}

impl TlsServer for ZooKeeper {
    fn start_tls() -> Self {
        ZooKeeper::start_tls()
    }

    fn tls_url(&self) -> String {
        ZooKeeper::tls_url(self)
    }
}

impl Drop for ZooKeeper {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("ZooKeeper's log ends with: {}", self.log_tail());
        }
        // The process itself is killed when `process` is dropped.
    }
}
