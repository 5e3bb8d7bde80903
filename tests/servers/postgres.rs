//! A throw-away PostgreSQL 15 server: `initdb` in a temporary directory, listening on
//! 127.0.0.1 on a free port, stopped and deleted when dropped.
//!
//! Clients connect over TCP as the role `leaderrun` with a real password (SCRAM), so the
//! tests see password handling as users do; the superuser `postgres` is reachable
//! without a password over the Unix socket in the directory, for `psql`.
//!
//! `initdb` and the server refuse to run as root: as root (CI) they run as the system
//! user `postgres`, which then owns the directory.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU16, Ordering};

use super::{TestServer, WrongSecret};

/// Where Debian puts PostgreSQL 15's programs.
pub const BIN: &str = "/usr/lib/postgresql/15/bin";
/// The role and database the tests use.
pub const USER: &str = "leaderrun";
pub const DATABASE: &str = "leaderrun";

pub struct Postgres {
    dir: tempfile::TempDir,
    port: AtomicU16,
    password: String,
    /// (uid, gid) to run the server as, when the tests run as root.
    owner: Option<(u32, u32)>,
}

impl Postgres {
    /// Create, start and set up a server; panics with the reason if it cannot.
    pub fn start() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-pg-").tempdir().expect("create a temp dir");
        let (owner, password) = owner_and_password(dir.path());
        let pg = Self { dir, port: AtomicU16::new(0), password, owner };
        let data = pg.data();
        pg.tool(
            "initdb",
            &[
                "-D",
                data.to_str().unwrap(),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "--encoding=UTF8",
                "--locale=C",
            ],
        );
        // The port is free when chosen, but another process may take it before the
        // server binds it: try a few.
        for attempt in 0.. {
            pg.port.store(super::free_port(), Ordering::SeqCst);
            match pg.try_start() {
                Ok(()) => break,
                Err(why) if attempt >= 4 => panic!("PostgreSQL does not start: {why}"),
                Err(_) => continue,
            }
        }
        pg.psql(&format!("CREATE ROLE {USER} LOGIN PASSWORD '{}'", pg.password));
        pg.psql(&format!("CREATE DATABASE {DATABASE} OWNER {USER}"));
        pg
    }

    /// `postgres://leaderrun:PASSWORD@127.0.0.1:PORT/leaderrun`
    pub fn url(&self) -> String {
        self.url_via(self.port())
    }

    pub fn password(&self) -> &str {
        &self.password
    }

    pub fn port(&self) -> u16 {
        self.port.load(Ordering::SeqCst)
    }

    /// Stop the server (fast shutdown: clients are disconnected, data is kept).
    pub fn stop(&self) {
        let out = self.tool_output("pg_ctl", &["-D", self.data().to_str().unwrap(), "-m", "fast", "-w", "stop"]);
        assert!(out.status.success(), "pg_ctl stop failed: {}", text(&out));
    }

    /// Start the stopped server again, on the same port, with the same data.
    pub fn start_again(&self) {
        if let Err(why) = self.try_start() {
            panic!("PostgreSQL does not start again: {why}");
        }
    }

    /// Run SQL as the superuser over the Unix socket; returns what psql printed
    /// (unaligned, tuples only). Panics if psql fails.
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in("postgres", sql)
    }

    /// Like `psql`, in the given database.
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let (dir, port) = (self.dir.path().to_str().unwrap(), self.port().to_string());
        let mut args: Vec<&str> = "-X -q -A -t -v ON_ERROR_STOP=1 -U postgres".split(' ').collect();
        args.extend(["-h", dir, "-p", &port, "-d", database, "-c", sql]);
        let out = self.tool_output("psql", &args);
        assert!(out.status.success(), "psql {sql:?} failed: {}", text(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn try_start(&self) -> Result<(), String> {
        // fsync=off survives a SIGKILLed server (the OS keeps the writes), not an OS crash.
        // synchronous_commit stays on: an acknowledged commit must survive a killed server
        // (the fault run kills it), or a lease could be granted twice (A1).
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off \
             -c full_page_writes=off -c max_connections=300",
            self.port(),
            self.dir.path().display()
        );
        let (data, log) = (self.data(), self.dir.path().join("log"));
        let (data, log) = (data.to_str().unwrap(), log.to_str().unwrap());
        let out = self.tool_output("pg_ctl", &["-D", data, "-l", log, "-w", "-t", "60", "-o", &options, "start"]);
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(10).collect();
        Err(format!("{}; server log (last lines, newest first): {tail:#?}", text(&out)))
    }

    /// Run one of PostgreSQL's programs (as `postgres` when we are root); panic on failure.
    fn tool(&self, program: &str, args: &[&str]) {
        let out = self.tool_output(program, args);
        assert!(out.status.success(), "{program} failed: {}", text(&out));
    }

    fn tool_output(&self, program: &str, args: &[&str]) -> Output {
        run_tool(self.dir.path(), self.owner, program, args)
    }
}

impl TestServer for Postgres {
    fn start() -> Self {
        Postgres::start()
    }

    fn port(&self) -> u16 {
        Postgres::port(self)
    }

    fn url_via(&self, port: u16) -> String {
        format!("postgres://{USER}:{}@127.0.0.1:{port}/{DATABASE}", self.password)
    }

    fn secret(&self) -> Option<String> {
        Some(self.password.clone())
    }

    fn wrong_secret(&self) -> Option<WrongSecret> {
        Some(WrongSecret::replacing(self, &self.password, "password authentication failed"))
    }

    /// The postmaster (its pid file's first line) and its backends.
    fn pids(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.data().join("postmaster.pid")).unwrap_or_default();
        let postmaster = text.lines().next().and_then(|line| line.trim().parse::<u32>().ok());
        postmaster
            .filter(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists())
            .map_or_else(Vec::new, super::server::with_children)
    }

    fn stop(&self) {
        Postgres::stop(self)
    }

    fn start_again(&self) {
        Postgres::start_again(self)
    }

    /// The postmaster is pg_ctl's, not ours to reap; its pid file stays, and `start_again`
    /// may need a moment before the killed server's is given up.
    fn kill(&self) {
        for pid in self.pids() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::SIGKILL);
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Quietly: the server may be stopped already. The directory goes with `dir`.
        let _ = self.tool_output("pg_ctl", &["-D", self.data().to_str().unwrap(), "-m", "immediate", "-w", "stop"]);
    }
}

/// A program's outcome, for a panic message.
pub fn text(out: &Output) -> String {
    format!(
        "status {:?}, stdout {:?}, stderr {:?}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// Run one of PostgreSQL's programs in `dir`, as `owner` (uid, gid) if given (initdb refuses
/// root), in a clean environment: no PGHOST, PGPORT, ... of whoever runs the tests.
pub fn run_tool(dir: &Path, owner: Option<(u32, u32)>, program: &str, args: &[&str]) -> Output {
    let path = Path::new(BIN).join(program);
    let mut cmd = Command::new(&path);
    cmd.args(args).env_clear().env("PATH", "/usr/bin:/bin").env("LC_ALL", "C").env("HOME", dir);
    cmd.current_dir(dir);
    if let Some((uid, gid)) = owner {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    cmd.output().unwrap_or_else(|e| panic!("cannot run {} (is PostgreSQL 15 installed?): {e}", path.display()))
}

/// Who runs PostgreSQL in `dir` (as root: the user `postgres`, which then owns `dir`; initdb
/// refuses root), and a fresh password for the tests' role.
pub fn owner_and_password(dir: &Path) -> (Option<(u32, u32)>, String) {
    let owner = nix::unistd::geteuid().is_root().then(|| {
        let user = nix::unistd::User::from_name("postgres")
            .ok()
            .flatten()
            .expect("the tests run as root, so PostgreSQL must run as the user `postgres`, which does not exist");
        nix::unistd::chown(dir, Some(user.uid), Some(user.gid)).expect("chown the temp dir to postgres");
        (user.uid.as_raw(), user.gid.as_raw())
    });
    (owner, format!("Sekr1t-{:012x}", rand::random::<u64>() & 0xffff_ffff_ffff))
}
