//! MariaDB replicated as its users run it: a primary (binary log, GTIDs) and a replica that
//! applies its log, asynchronously or semi-synchronously, behind an `Endpoint` (a VIP or a
//! proxy) that moves at failover. Every server has a `server_id` of its own (1, 2, then 3, 4 …
//! for each replica added), which is the epoch leaderrun's MySQL store reads.
//!
//! The servers start from one data directory made once per set-up with `mariadb-install-db`
//! and copied (a copy takes a fraction of a second, an install several), each with the users
//! made locally without logging them (`sql_log_bin = 0`): the database `leaderrun` with a user
//! `leaderrun`, and a user `repl` the replica connects as. A replica added later is seeded from
//! the primary with `mariadb-dump --single-transaction --gtid --master-data` and replicates from
//! the GTID position the dump names. Dropping the set-up kills every server and removes every
//! directory.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::mariadb::{mariadbd, user};
use super::replicated::{Endpoint, Replicated};

/// Longest a server start, a catch-up or a promotion may take (generous: the machine is shared).
const PATIENCE: Duration = Duration::from_secs(60);

/// How long a semi-synchronous primary waits for the replica's acknowledgement before it falls
/// back to asynchronous replication (MariaDB's default is 10 s): longer than any test, so that a
/// held-back write waits instead of being acknowledged without the replica.
const SEMI_SYNC_TIMEOUT_MS: u64 = 3_600_000;

pub struct MariadbReplicated {
    /// First, so that dropping kills the servers before their directories go.
    servers: Mutex<Servers>,
    password: String,
    repl_password: String,
    semi_sync: bool,
    endpoint: Endpoint,
    next_id: AtomicU32,
    root: tempfile::TempDir,
}

struct Servers {
    primary: Server,
    /// The one the next `fail_over` promotes (none between a failover and `add_replica`).
    replica: Option<Server>,
    /// The primary a failover killed, until the next `add_replica` removes it.
    dead: Option<Server>,
}

impl MariadbReplicated {
    /// A primary and an asynchronous replica.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// A primary and a semi-synchronous replica: the primary acknowledges a commit only once
    /// the replica has it in its relay log (`rpl_semi_sync_master_enabled`, built into MariaDB).
    pub fn start_semi_sync() -> Self {
        Self::start_with(true)
    }

    fn start_with(semi_sync: bool) -> Self {
        let root = tempfile::Builder::new().prefix("leaderrun-mariadb-repl-").tempdir().expect("create a temp dir");
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos();
        let password = format!("Pw{:x}{:x}", std::process::id(), nanos);
        let repl_password = format!("Rp{:x}{:x}", std::process::id(), nanos);
        install(root.path());
        let (primary, replica) = std::thread::scope(|s| {
            let primary = s.spawn(|| Server::start(root.path(), 1, semi_sync, false));
            let replica = Server::start(root.path(), 2, semi_sync, true);
            (primary.join().expect("start the primary"), replica)
        });
        let setup = Self {
            endpoint: Endpoint::start(primary.port),
            root,
            password,
            repl_password,
            semi_sync,
            next_id: AtomicU32::new(3),
            servers: Mutex::new(Servers { primary, replica: None, dead: None }),
        };
        for server in [&setup.servers.lock().unwrap().primary, &replica] {
            setup.make_users(server);
            server.sql("SET SESSION sql_log_bin = 0; CREATE DATABASE leaderrun;");
        }
        setup.replicate(&setup.servers.lock().unwrap().primary, &replica);
        setup.servers.lock().unwrap().replica = Some(replica);
        setup
    }

    /// The users every server has (made on each, not replicated: a replica promoted must have
    /// them, and a replica added is seeded with the `leaderrun` database only).
    fn make_users(&self, server: &Server) {
        let (pw, rpw) = (&self.password, &self.repl_password);
        server.sql_secret(
            &format!(
                "SET SESSION sql_log_bin = 0;
                 CREATE USER 'leaderrun'@'127.0.0.1' IDENTIFIED BY '{pw}';
                 CREATE USER 'leaderrun'@'%' IDENTIFIED BY '{pw}';
                 GRANT ALL ON leaderrun.* TO 'leaderrun'@'127.0.0.1';
                 GRANT ALL ON leaderrun.* TO 'leaderrun'@'%';
                 CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY '{rpw}';
                 GRANT REPLICATION SLAVE ON *.* TO 'repl'@'127.0.0.1';"
            ),
            &[pw, rpw],
        );
    }

    /// Point `replica` at `primary` from the GTID position it has (`gtid_slave_pos`), start it
    /// and wait until it is connected (and, semi-synchronous, acknowledging).
    fn replicate(&self, primary: &Server, replica: &Server) {
        let rpw = &self.repl_password;
        replica.sql_secret(
            &format!(
                "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', MASTER_PORT = {}, MASTER_USER = 'repl',
                    MASTER_PASSWORD = '{rpw}', MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1;
                 START SLAVE;",
                primary.port
            ),
            &[rpw],
        );
        wait_for("the replica to connect", || replica.slave_status("Slave_IO_Running").as_deref() == Some("Yes"));
        if self.semi_sync {
            // A primary promoted from a replica turns it on again now that it has a replica.
            primary.sql("SET GLOBAL rpl_semi_sync_master_enabled = ON");
            wait_for("the replica to acknowledge semi-synchronously", || {
                primary.query(
                    "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
                               WHERE VARIABLE_NAME = 'Rpl_semi_sync_master_clients'",
                ) != "0"
            });
        }
    }

    fn description(&self) -> &'static str {
        if self.semi_sync {
            "MariaDB 10.11, a primary and a semi-synchronous replica (GTID, binlog MIXED) behind a moving endpoint"
        } else {
            "MariaDB 10.11, a primary and an asynchronous replica (GTID, binlog MIXED) behind a moving endpoint"
        }
    }
}

impl Replicated for MariadbReplicated {
    fn url(&self) -> String {
        format!("mysql://leaderrun:{}@127.0.0.1:{}/leaderrun", self.password, self.endpoint.port())
    }

    /// The replica caught up, then its replication stopped (both threads): nothing written
    /// from now on reaches it. (Semi-synchronous, the primary's commits then wait instead.)
    fn hold_back(&self) {
        self.catch_up();
        let servers = self.servers.lock().unwrap();
        let replica = servers.replica.as_ref().expect("a replica to hold back (add_replica after fail_over)");
        replica.sql("STOP SLAVE");
    }

    fn catch_up(&self) {
        let servers = self.servers.lock().unwrap();
        let replica = servers.replica.as_ref().expect("a replica to catch up (add_replica after fail_over)");
        // Running again if it was held back (a note, not an error, if it runs).
        replica.sql("START SLAVE");
        let position = servers.primary.query("SELECT @@gtid_binlog_pos");
        if position.is_empty() {
            return;
        }
        let waited = replica.query(&format!("SELECT MASTER_GTID_WAIT('{position}', {})", PATIENCE.as_secs()));
        assert_eq!(waited, "0", "the replica did not reach the primary's {position} within {PATIENCE:?}");
    }

    /// SIGKILL the primary; on the replica, apply what it has received, stop replicating,
    /// forget its primary and take writes; move the endpoint to it.
    fn fail_over(&self) {
        let mut servers = self.servers.lock().unwrap();
        let replica = servers.replica.take().expect("a replica to promote (add_replica after fail_over)");
        servers.primary.kill();
        // What the replica received is applied before it is promoted, as a failover tool does:
        // RESET SLAVE ALL drops the relay log.
        replica.sql("STOP SLAVE IO_THREAD");
        wait_for("the replica to apply its relay log", || replica.relay_log_applied());
        replica.sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0;");
        if self.semi_sync {
            // Alone, a semi-synchronous primary would wait for a replica at every commit.
            replica.sql("SET GLOBAL rpl_semi_sync_master_enabled = OFF");
        }
        self.endpoint.move_to(replica.port);
        let dead = std::mem::replace(&mut servers.primary, replica);
        servers.dead = Some(dead);
        let new = servers.primary.id.to_string();
        wait_for("the new primary to take writes through the endpoint", || {
            self.via_endpoint("SELECT @@server_id, @@read_only").as_deref() == Some(&format!("{new}\t0"))
        });
    }

    fn add_replica(&self) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let replica = Server::start(self.root.path(), id, self.semi_sync, true);
        self.make_users(&replica);
        let mut servers = self.servers.lock().unwrap();
        let dump = servers.primary.dump();
        replica.load(&dump);
        self.replicate(&servers.primary, &replica);
        servers.replica = Some(replica);
        servers.dead = None; // its directory goes with it
        drop(servers);
        self.catch_up();
    }

    fn synchronous(&self) -> bool {
        self.semi_sync
    }

    fn describe(&self) -> String {
        self.description().to_string()
    }
}

impl MariadbReplicated {
    /// One query as `leaderrun` through the endpoint (the password in the environment, not on
    /// the command line); `None` if it failed.
    fn via_endpoint(&self, sql: &str) -> Option<String> {
        let out = Command::new("mariadb")
            .arg("--no-defaults")
            .args(["-h", "127.0.0.1", "-P", &self.endpoint.port().to_string(), "-u", "leaderrun"])
            .args(["--connect-timeout=2", "--batch", "--skip-column-names", "-e", sql, "leaderrun"])
            .env("MYSQL_PWD", &self.password)
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// One `mariadbd` of the set-up, in `ROOT/sN`, on a port of its own.
struct Server {
    id: u32,
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl Server {
    /// Copy the installed data directory and start a server on it: binary log and GTIDs on
    /// every server (a replica may be promoted and then needs them), replicas read-only.
    fn start(root: &Path, id: u32, semi_sync: bool, replica: bool) -> Server {
        let dir = root.join(format!("s{id}"));
        std::fs::create_dir(&dir).expect("create a server's directory");
        std::fs::create_dir(dir.join("tmp")).expect("create the server's tmpdir");
        let copied = Command::new("cp").arg("-a").arg(root.join("template")).arg(dir.join("data")).status();
        assert!(copied.is_ok_and(|s| s.success()), "cannot copy the installed data directory");
        let mut server = Server { id, dir, port: super::free_port(), child: None };
        let mut command = mariadbd(&server.dir, server.port);
        command
            .arg(format!("--server-id={id}"))
            .arg(format!("--log-bin={}", server.file("binlog").display()))
            .arg(format!("--relay-log={}", server.file("relay").display()))
            .args(["--log-slave-updates", "--skip-slave-start"])
            .args(INNODB)
            .arg("--max-connections=1000");
        if replica {
            command.arg("--read-only");
        }
        if semi_sync {
            command
                .arg(format!("--rpl-semi-sync-master-enabled={}", if replica { "OFF" } else { "ON" }))
                .arg("--rpl-semi-sync-slave-enabled=ON")
                .arg(format!("--rpl-semi-sync-master-timeout={SEMI_SYNC_TIMEOUT_MS}"));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run mariadbd (is mariadb-server installed?): {e}"));
        server.child = Some(child);
        let started = Instant::now();
        while !server.ping() {
            if let Some(status) = server.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("mariadbd {id} exited ({status}) before it was ready; its log ends:\n{}", server.log_tail());
            }
            assert!(
                started.elapsed() < PATIENCE,
                "mariadbd {id} did not answer within {PATIENCE:?}; its log ends:\n{}",
                server.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn client(&self) -> Command {
        let mut command = Command::new("mariadb");
        command.arg("--no-defaults").arg(format!("--socket={}", self.file("sock").display())).arg("-uroot");
        command
    }

    fn sql(&self, sql: &str) {
        self.sql_secret(sql, &[]);
    }

    /// Run SQL as root over the socket; a failure's message shows it with `secrets` hidden.
    fn sql_secret(&self, sql: &str, secrets: &[&str]) {
        let out = self.client().args(["-e", sql]).output().expect("run the mariadb client");
        if !out.status.success() {
            let hide = |text: &str| secrets.iter().fold(text.to_string(), |t, s| t.replace(s, "***"));
            panic!(
                "server {}: mariadb -e {:?} failed: {}",
                self.id,
                hide(sql),
                hide(&String::from_utf8_lossy(&out.stderr))
            );
        }
    }

    /// One query as root; its answer as tab-separated text, no headers.
    fn query(&self, sql: &str) -> String {
        let out = self.client().args(["--batch", "--skip-column-names", "-e", sql]).output().expect("run mariadb");
        assert!(out.status.success(), "server {}: {sql:?} failed: {}", self.id, String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// One field of `SHOW SLAVE STATUS` (none if it replicates from nobody).
    fn slave_status(&self, field: &str) -> Option<String> {
        let out = self.client().args(["--vertical", "-e", "SHOW SLAVE STATUS"]).output().expect("run mariadb");
        let text = String::from_utf8_lossy(&out.stdout);
        text.lines().find_map(|line| {
            let (name, value) = line.trim().split_once(": ")?;
            (name == field).then(|| value.to_string())
        })
    }

    /// Whether the SQL thread has applied everything the IO thread received (or is stopped).
    fn relay_log_applied(&self) -> bool {
        let field = |name| self.slave_status(name).unwrap_or_default();
        field("Slave_SQL_Running") != "Yes"
            || (field("Master_Log_File") == field("Relay_Master_Log_File")
                && field("Read_Master_Log_Pos") == field("Exec_Master_Log_Pos"))
    }

    /// The `leaderrun` database as of one consistent snapshot, with the GTID position it
    /// corresponds to (`SET GLOBAL gtid_slave_pos`).
    fn dump(&self) -> Vec<u8> {
        let out = Command::new("mariadb-dump")
            .arg("--no-defaults")
            .arg(format!("--socket={}", self.file("sock").display()))
            .args(["-uroot", "--single-transaction", "--gtid", "--master-data=1", "--hex-blob"])
            .args(["--databases", "leaderrun"])
            .output()
            .expect("run mariadb-dump");
        assert!(out.status.success(), "mariadb-dump failed: {}", String::from_utf8_lossy(&out.stderr));
        out.stdout
    }

    /// Load a dump without logging it (the rows come with the primary's GTID position).
    fn load(&self, dump: &[u8]) {
        let mut child = self.client().stdin(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("run mariadb");
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"SET SESSION sql_log_bin = 0;\n").and_then(|()| stdin.write_all(dump)).expect("send the dump");
        drop(stdin);
        let out = child.wait_with_output().expect("load the dump");
        assert!(out.status.success(), "loading the dump failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn ping(&self) -> bool {
        super::mariadb::ping(&self.file("sock"))
    }

    /// SIGKILL, as a crash: the server neither flushes nor says goodbye.
    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.file("err")).unwrap_or_else(|e| format!("(cannot read the log: {e})"));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Small and quick on a shared machine (the same on install and start, else InnoDB resizes
/// its redo log at every start). A SIGKILLed primary is never started again, so nothing here
/// needs to survive a crash.
const INNODB: [&str; 3] =
    ["--innodb-buffer-pool-size=32M", "--innodb-log-file-size=4M", "--innodb-flush-log-at-trx-commit=2"];

/// The data directory every server of the set-up starts from (`ROOT/template`).
fn install(root: &Path) {
    let template = root.join("template");
    let tmp = root.join("install-tmp");
    std::fs::create_dir(&tmp).expect("create a tmpdir");
    let install = Command::new("mariadb-install-db")
        .arg("--no-defaults")
        .arg(format!("--datadir={}", template.display()))
        .arg(format!("--tmpdir={}", tmp.display()))
        .arg(format!("--user={}", user()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
        .args(INNODB)
        .output()
        .unwrap_or_else(|e| panic!("cannot run mariadb-install-db (is mariadb-server installed?): {e}"));
    assert!(
        install.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
}

/// Poll `done` until it holds, for at most `PATIENCE`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
