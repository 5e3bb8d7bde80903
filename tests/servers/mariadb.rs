//! A MariaDB server of the tests' own: a fresh data directory in a temp dir, loopback
//! only, a free port, a database and a user `leaderrun` with a password. Stopped (and its
//! directory removed) when dropped. Needs `mariadb-server` installed; a server that does
//! not start fails the test with the tail of its error log, never skips it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{TestServer, WrongSecret};

/// Longest a start or a stop may take.
const PATIENCE: Duration = Duration::from_secs(30);

pub struct Mariadb {
    dir: tempfile::TempDir,
    port: u16,
    password: String,
    /// The running `mariadbd`, if any.
    server: Mutex<Option<Child>>,
}

impl Mariadb {
    /// Create a data directory, start the server, create database and user.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-mariadb-").tempdir().expect("create a temp dir");
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let password = format!("Pw{:x}{:x}", std::process::id(), nanos);
        let db = Self { dir, port: super::free_port(), password, server: Mutex::new(None) };
        std::fs::create_dir(db.file("tmp")).expect("create the server's tmpdir");
        let install = Command::new("mariadb-install-db")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", db.data().display()))
            .arg(format!("--tmpdir={}", db.file("tmp").display()))
            .arg(format!("--user={}", user()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run mariadb-install-db (is mariadb-server installed?): {e}"));
        assert!(
            install.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&install.stdout),
            String::from_utf8_lossy(&install.stderr)
        );
        db.start_again();
        db.root_sql(&format!(
            "CREATE DATABASE leaderrun;
             CREATE USER 'leaderrun'@'127.0.0.1' IDENTIFIED BY '{pw}';
             CREATE USER 'leaderrun'@'%' IDENTIFIED BY '{pw}';
             GRANT ALL ON leaderrun.* TO 'leaderrun'@'127.0.0.1';
             GRANT ALL ON leaderrun.* TO 'leaderrun'@'%';",
            pw = db.password
        ));
        db
    }

    /// `mysql://leaderrun:PASSWORD@127.0.0.1:PORT/leaderrun`
    pub fn url(&self) -> String {
        self.url_via(self.port)
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Start the server on the existing data directory (same port) and wait until it answers.
    pub fn start_again(&self) {
        let mut server = self.server.lock().unwrap();
        assert!(server.is_none(), "the MariaDB server is already running");
        let _ = std::fs::remove_file(self.file("err"));
        let child = mariadbd(self.dir.path(), self.port)
            .arg("--skip-log-bin")
            // Small, and quick on this shared machine: the tests stop it cleanly (SIGTERM),
            // so a commit need not wait for an fsync to survive a restart.
            .args(["--innodb-buffer-pool-size=32M", "--innodb-flush-log-at-trx-commit=2", "--max-connections=1000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run mariadbd (is mariadb-server installed?): {e}"));
        *server = Some(child);
        let started = Instant::now();
        loop {
            if self.ping() {
                return;
            }
            if let Some(status) = server.as_mut().unwrap().try_wait().unwrap() {
                *server = None;
                panic!("mariadbd exited ({status}) before it was ready; its log ends:\n{}", self.log_tail());
            }
            if started.elapsed() > PATIENCE {
                // Gone, so that a caller may try again.
                let mut child = server.take().unwrap();
                let _ = child.kill();
                let _ = child.wait();
                panic!("mariadbd did not answer within {PATIENCE:?}; its log ends:\n{}", self.log_tail());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stop the server (SIGTERM, a clean shutdown) and wait until it has exited.
    pub fn stop(&self) {
        let Some(mut child) = self.server.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let started = Instant::now();
        while child.try_wait().ok().flatten().is_none() {
            if started.elapsed() > PATIENCE {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Run SQL as root over the socket.
    pub fn root_sql(&self, sql: &str) {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.file("sock").display()))
            .args(["-uroot", "-e", sql])
            .output()
            .expect("run the mariadb client");
        assert!(out.status.success(), "mariadb -e {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Run one query as root over the socket; its answer as tab-separated text, no headers.
    pub fn root_query(&self, sql: &str) -> String {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.file("sock").display()))
            .args(["-uroot", "--batch", "--skip-column-names", "-e", sql])
            .output()
            .expect("run the mariadb client");
        assert!(out.status.success(), "mariadb -e {sql:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// How many sessions are blocked in GET_LOCK.
    pub fn blocked_on_user_locks(&self) -> usize {
        self.root_query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE STATE = 'User lock'")
            .parse()
            .unwrap()
    }

    /// How many sessions the `leaderrun` user has open.
    pub fn leaderrun_sessions(&self) -> usize {
        self.root_query("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE USER = 'leaderrun'").parse().unwrap()
    }

    fn ping(&self) -> bool {
        ping(&self.file("sock"))
    }

    fn data(&self) -> PathBuf {
        self.file("data")
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log_tail(&self) -> String {
        tail(&self.file("err"), 30)
    }
}

impl TestServer for Mariadb {
    fn start() -> Self {
        Mariadb::start()
    }

    fn port(&self) -> u16 {
        self.port
    }

    fn url_via(&self, port: u16) -> String {
        format!("mysql://leaderrun:{}@127.0.0.1:{port}/leaderrun", self.password)
    }

    fn secret(&self) -> Option<String> {
        Some(self.password.clone())
    }

    fn wrong_secret(&self) -> Option<WrongSecret> {
        Some(WrongSecret::replacing(self, &self.password, "Access denied"))
    }

    fn pids(&self) -> Vec<u32> {
        self.server.lock().unwrap_or_else(|e| e.into_inner()).iter().map(Child::id).collect()
    }

    fn stop(&self) {
        Mariadb::stop(self)
    }

    fn start_again(&self) {
        Mariadb::start_again(self)
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `mariadbd` on the files of `dir` (data, tmp, sock, pid, err), listening on 127.0.0.1:`port`,
/// with what every test server needs; the caller adds its own options and starts it.
pub fn mariadbd(dir: &Path, port: u16) -> Command {
    let file = |name: &str| dir.join(name).display().to_string();
    let mut command = Command::new("mariadbd");
    command
        .arg("--no-defaults") // must come first
        .arg(format!("--datadir={}", file("data")))
        // A tmpdir of its own: a starting server deletes the `#sql*` files it finds in
        // its tmpdir, which in a shared /tmp are other servers' temporary tables.
        .arg(format!("--tmpdir={}", file("tmp")))
        .arg(format!("--user={}", user()))
        .arg(format!("--port={port}"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--socket={}", file("sock")))
        .arg(format!("--pid-file={}", file("pid")))
        .arg(format!("--log-error={}", file("err")))
        // Accounts match 127.0.0.1 as written, not a name looked up for it.
        .arg("--skip-name-resolve");
    command
}

/// The user mariadbd runs as: this one (root in CI, which needs saying explicitly).
pub fn user() -> String {
    let uid = nix::unistd::geteuid();
    nix::unistd::User::from_uid(uid).ok().flatten().map_or_else(|| uid.to_string(), |u| u.name)
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| format!("(cannot read {}: {e})", path.display()));
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Whether the server on this Unix socket answers `mariadb-admin ping` as root.
pub fn ping(socket: &Path) -> bool {
    Command::new("mariadb-admin")
        .arg("--no-defaults")
        .arg(format!("--socket={}", socket.display()))
        .args(["-uroot", "--connect-timeout=2", "ping"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
