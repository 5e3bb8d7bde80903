//! One temporary directory per test, and every process started from it killed when it goes.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{cmdline, code_of, pid_alive, wait_for, Wrapper, BIN, SOON};

/// Numbers the output files of `Sandbox::output`.
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Environment variable that marks every process started from a sandbox.
const MARKER: &str = "E2E_LEADERRUN_SANDBOX";

/// One temporary directory per test, holding the SQLite store and the children's records.
pub struct Sandbox {
    dir: tempfile::TempDir,
    /// Variables every command of this sandbox gets (a store's emulator, which only an
    /// environment variable can name).
    env: Vec<(String, String)>,
}

impl Default for Sandbox {
    fn default() -> Self {
        Self::new()
    }
}

impl Sandbox {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("leaderrun-e2e-").tempdir().expect("create a temp dir");
        // Readable by an unprivileged user, for the tests that drop root's privileges.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).expect("chmod the temp dir");
        Self { dir, env: Vec::new() }
    }

    /// This sandbox, with `name=value` in every command's environment.
    pub fn with_env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// This sandbox, with each `(name, value)` in every command's environment.
    pub fn with_envs(mut self, vars: impl IntoIterator<Item = (String, String)>) -> Self {
        self.env.extend(vars);
        self
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the sandbox.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The SQLite file every command of this sandbox uses.
    pub fn store_path(&self) -> PathBuf {
        self.file("locks.db")
    }

    /// `sqlite:///<tmp>/locks.db`
    pub fn store_url(&self) -> String {
        format!("sqlite://{}", self.store_path().display())
    }

    /// `leaderrun` with nothing but a clean environment: no LEADERRUN_* variable inherited
    /// from whoever runs the tests, `D` set to the sandbox directory (for the children's
    /// scripts), HOME and XDG_STATE_HOME inside the sandbox, the sandbox's marker, and
    /// stdin from /dev/null. No --store.
    pub fn bare(&self) -> Command {
        let mut cmd = Command::new(BIN);
        for (name, _) in std::env::vars_os() {
            // Nor the caller's libpq or AWS settings: a store URL (and, for S3, the sandbox's
            // ~/.aws) in a test says everything.
            let name_text = name.to_string_lossy();
            if name_text.starts_with("LEADERRUN_")
                || name_text.starts_with("PG")
                || name_text.starts_with("AWS_")
                || name_text.starts_with("GOOGLE_")
                || name_text.ends_with("_EMULATOR_HOST")
            {
                cmd.env_remove(&name);
            }
        }
        cmd.env("D", self.path()).env(MARKER, self.path()).stdin(Stdio::null());
        // Should a test forget --store, a non-root run still stays in the sandbox.
        cmd.env("HOME", self.file("home")).env("XDG_STATE_HOME", self.file("state"));
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Like `bare`, but when the tests run as root, as the unprivileged user 65534: as root
    /// the default store is /var/lib/leaderrun, the real system's, which a test must never
    /// touch. The binary is run from a copy in the sandbox, so that it does not matter
    /// whether that user may enter the directory the build lives in.
    pub fn bare_unprivileged(&self) -> Command {
        if !nix::unistd::geteuid().is_root() {
            return self.bare();
        }
        let copy = self.file("leaderrun-unprivileged");
        if !copy.exists() {
            fs::hard_link(BIN, &copy).or_else(|_| fs::copy(BIN, &copy).map(drop)).expect("copy the binary");
            fs::set_permissions(&copy, fs::Permissions::from_mode(0o755)).expect("chmod the binary");
        }
        let mut cmd = self.bare();
        let mut unprivileged = Command::new(&copy);
        unprivileged.args(cmd.get_args());
        copy_env(&cmd, &mut unprivileged);
        cmd = unprivileged;
        cmd.stdin(Stdio::null()).current_dir(self.path()).uid(65534).gid(65534);
        cmd
    }

    /// `leaderrun --store URL ARGS...`, or `leaderrun SUB --store URL REST...` when ARGS starts
    /// with a subcommand: for the stores with a server, whose URL each test gets from it.
    pub fn at(&self, url: &str, args: &[&str]) -> Command {
        let mut cmd = self.bare();
        match args.split_first() {
            Some((sub, rest)) if ["status", "list", "release", "init", "watch", "check"].contains(sub) => {
                cmd.arg(sub).arg("--store").arg(url).args(rest);
            }
            _ => {
                cmd.arg("--store").arg(url).args(args);
            }
        }
        cmd
    }

    /// `leaderrun --store sqlite:///<tmp>/locks.db ARGS...` (the run mode).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.bare();
        cmd.arg("--store").arg(self.store_url()).args(args);
        cmd
    }

    /// `leaderrun SUB --store sqlite:///<tmp>/locks.db ARGS...` (status, list, release).
    pub fn sub(&self, sub: &str, args: &[&str]) -> Command {
        let mut cmd = self.bare();
        cmd.arg(sub).arg("--store").arg(self.store_url()).args(args);
        cmd
    }

    /// Run to completion, with a generous bound; stdout and stderr are collected through
    /// files, so a process left behind holding them open cannot hang the test.
    pub fn output(&self, cmd: Command) -> Output {
        let n = RUNS.fetch_add(1, Ordering::Relaxed);
        self.spawn(&format!("run-{n}"), cmd).finish(Duration::from_secs(60))
    }

    /// Exit code of `leaderrun status --lock LOCK`.
    pub fn status(&self, lock: &str) -> i32 {
        let out = self.output(self.sub("status", &["--lock", lock]));
        code_of(out.status, "leaderrun status")
    }

    /// Exit code and parsed `leaderrun status --json --lock LOCK`.
    pub fn status_json(&self, lock: &str) -> (i32, Value) {
        let out = self.output(self.sub("status", &["--json", "--lock", lock]));
        let code = code_of(out.status, "leaderrun status --json");
        let text = String::from_utf8_lossy(&out.stdout);
        let value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
            panic!("status --json printed no JSON ({e}): {text:?}, stderr {:?}", String::from_utf8_lossy(&out.stderr))
        });
        (code, value)
    }

    /// Parsed `leaderrun list --json` (which must exit 0).
    pub fn list_json(&self) -> Value {
        let out = self.output(self.sub("list", &["--json"]));
        assert_eq!(out.status.code(), Some(0), "list --json: {:?}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("list --json printed no JSON ({e}): {text:?}"))
    }

    /// Start a long-running leaderrun in the background; its stdout and stderr go to
    /// `<name>.out` and `<name>.err` in the sandbox, and it is killed when dropped.
    pub fn spawn(&self, name: &str, mut cmd: Command) -> Wrapper {
        let out = self.file(&format!("{name}.out"));
        let err = self.file(&format!("{name}.err"));
        cmd.stdout(fs::File::create(&out).expect("create .out")).stderr(fs::File::create(&err).expect("create .err"));
        // A group of its own, so a signal meant for the test runner's group never reaches it.
        cmd.process_group(0);
        let child = cmd.spawn().expect("spawn leaderrun");
        Wrapper { child, name: name.to_string(), out, err }
    }

    /// Contents of a file in the sandbox ("" if it does not exist yet).
    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.file(name)).unwrap_or_default()
    }

    /// Lines of a file in the sandbox (none if it does not exist yet).
    pub fn lines(&self, name: &str) -> Vec<String> {
        self.read(name).lines().map(str::to_string).collect()
    }

    pub fn exists(&self, name: &str) -> bool {
        self.file(name).exists()
    }

    /// Every live process this sandbox started, directly or not (wrappers, watchdogs,
    /// children, grandchildren), with its command line.
    pub fn processes(&self) -> Vec<(i32, String)> {
        marked(self.path()).into_iter().map(|pid| (pid, cmdline(pid))).collect()
    }

    /// Wait until no process this sandbox started is left (a leaked watchdog or
    /// grandchild fails the test).
    pub fn wait_no_processes_left(&self, within: Duration) {
        let started = Instant::now();
        loop {
            let left = self.processes();
            if left.is_empty() {
                return;
            }
            if started.elapsed() > within {
                panic!("processes left behind after {within:?}: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until `name` holds a pid (children write it to a temp file and rename it), and return it.
    pub fn wait_pid(&self, name: &str) -> i32 {
        let mut pid = None;
        wait_for(
            || {
                pid = self.read(name).trim().parse::<i32>().ok();
                pid.is_some()
            },
            SOON,
            &format!("the pid file {name}"),
        );
        pid.expect("checked above")
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        kill_marked(self.path());
    }
}

/// Live processes whose environment carries the marker of the sandbox in `dir`.
fn marked(dir: &Path) -> Vec<i32> {
    let wanted = format!("{MARKER}={}", dir.display()).into_bytes();
    let me = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me || !pid_alive(pid) {
            continue;
        }
        let Ok(environ) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if environ.split(|&b| b == 0).any(|var| var == wanted.as_slice()) {
            found.push(pid);
        }
    }
    found
}

/// SIGKILL every process whose environment carries this sandbox's marker, until none is left.
fn kill_marked(dir: &Path) {
    for _ in 0..100 {
        let found = marked(dir);
        if found.is_empty() {
            return;
        }
        for pid in found {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `cmd`'s changes to the environment (variables set and removed) made on `into` too: for a
/// command rewritten to run as another program, or through one.
pub fn copy_env(cmd: &Command, into: &mut Command) {
    for (name, value) in cmd.get_envs() {
        match value {
            Some(value) => into.env(name, value),
            None => into.env_remove(name),
        };
    }
}
