//! Helpers shared by the end-to-end tests: the real binary, real processes, one
//! temporary directory per test, and a guard that kills whatever a test left behind.
//!
//! Rules these helpers exist to keep:
//! - every test has its own temp dir and its own SQLite store in it; the real user's
//!   state directory is never touched (and as root, the default store is only ever used
//!   with privileges dropped, since root's default store is /var/lib/leaderrun);
//! - no timing assertions: tests wait on events (files, process states) with a
//!   generous deadline, and only ever assert that something happened within it;
//! - every process a test starts carries a marker variable in its environment, and
//!   the sandbox kills every process carrying its marker when it is dropped, even when
//!   the test failed (wrappers, children, grandchildren and watchdogs alike).

#![allow(dead_code)]

pub mod slots;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

/// The binary under test.
/// A `--wait` child that takes a file lock for its whole life (so any overlap of two
/// children's process trees is caught exactly, whatever the clocks say) and records
/// start and stop with its token and CLOCK_BOOTTIME (/proc/uptime) in one file.
pub const TURN_TAKER: &str = r#"
exec 9>>"$D/flock"
flock -n 9 || echo "OVERLAP $LEADERRUN_FENCING_TOKEN" >> "$D/events"
echo "start $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
sleep 0.2
echo "stop $LEADERRUN_FENCING_TOKEN $(cut -d' ' -f1 /proc/uptime)" >> "$D/events"
"#;

/// A cron job that takes about 100 ms and records that it ran, with its fencing token.
pub const CRON_JOB: &str = r#"sleep 0.1; echo "ran $LEADERRUN_FENCING_TOKEN" >> "$D/runs""#;

pub const BIN: &str = env!("CARGO_BIN_EXE_leaderrun");

/// Numbers the output files of `Sandbox::output`.
static RUNS: AtomicUsize = AtomicUsize::new(0);

/// Environment variable that marks every process started from a sandbox.
const MARKER: &str = "E2E_LEADERRUN_SANDBOX";

/// A generous bound for things that normally take milliseconds.
pub const SOON: Duration = Duration::from_secs(10);

/// A generous bound for things that take about one short lease (2-3 s ttls).
pub const WITHIN_A_LEASE: Duration = Duration::from_secs(20);

/// Poll `cond` every 20 ms until it holds; panic naming `what` after `within`.
pub fn wait_for(mut cond: impl FnMut() -> bool, within: Duration, what: &str) {
    let started = Instant::now();
    loop {
        if cond() {
            return;
        }
        if started.elapsed() > within {
            panic!("timed out after {within:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of /proc/PID/stat (R, S, D, T, t, Z, X, ...), if the process exists.
pub fn proc_state(pid: i32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces: the state follows the last ')'.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().next()?.chars().next()
}

/// Whether `pid` is a live process. A zombie counts as dead: it runs nothing any more.
pub fn pid_alive(pid: i32) -> bool {
    if kill(Pid::from_raw(pid), None).is_err() {
        return false;
    }
    !matches!(proc_state(pid), None | Some('Z') | Some('X'))
}

/// Whether the process is stopped (SIGSTOP / SIGTSTP).
pub fn pid_stopped(pid: i32) -> bool {
    matches!(proc_state(pid), Some('T'))
}

/// The exit code of a process that exited normally; panics (with `context`) otherwise.
pub fn code_of(status: ExitStatus, context: &str) -> i32 {
    match status.code() {
        Some(code) => code,
        None => panic!("{context}: expected an exit code, the process was killed by signal {:?}", status.signal()),
    }
}

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
        for (name, value) in cmd.get_envs() {
            match value {
                Some(value) => unprivileged.env(name, value),
                None => unprivileged.env_remove(name),
            };
        }
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

/// The command line of a process, for messages.
pub fn cmdline(pid: i32) -> String {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
        .unwrap_or_default()
}

/// A leaderrun running in the background.
pub struct Wrapper {
    pub child: Child,
    pub name: String,
    out: PathBuf,
    err: PathBuf,
}

impl Wrapper {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, signal: Signal) {
        kill(Pid::from_raw(self.pid()), signal)
            .unwrap_or_else(|e| panic!("cannot send {signal} to {}: {e}", self.name));
    }

    /// Its exit status if it has exited.
    pub fn try_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Wait (at most `within`) for it to exit; return how it exited.
    pub fn wait_status(&mut self, within: Duration) -> ExitStatus {
        let mut status = None;
        let name = self.name.clone();
        wait_for(
            || {
                status = self.child.try_wait().expect("try_wait");
                status.is_some()
            },
            within,
            &format!("{name} to exit"),
        );
        status.expect("checked above")
    }

    /// Wait (at most `within`) for it to exit with a code; return the code.
    pub fn wait_code(&mut self, within: Duration) -> i32 {
        let status = self.wait_status(within);
        let context = format!("{} (stderr: {:?})", self.name, self.stderr());
        code_of(status, &context)
    }

    /// Wait (at most `within`) for it to exit; return its status and everything it printed.
    pub fn finish(mut self, within: Duration) -> Output {
        let status = self.wait_status(within);
        Output {
            status,
            stdout: fs::read(&self.out).unwrap_or_default(),
            stderr: fs::read(&self.err).unwrap_or_default(),
        }
    }

    pub fn stdout(&self) -> String {
        fs::read_to_string(&self.out).unwrap_or_default()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.err).unwrap_or_default()
    }
}

impl Drop for Wrapper {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The stderr of `out` as text.
pub fn stderr_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The stdout of `out` as text.
pub fn stdout_of(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Wait for `waiters` (each running `TURN_TAKER` under `--wait`) to exit 0, then check
/// that every child ran exactly once, alone, in turn, with strictly increasing fencing
/// tokens. Returns the tokens in start order.
pub fn assert_turns_taken(sb: &Sandbox, waiters: Vec<Wrapper>) -> Vec<u64> {
    let count = waiters.len();
    for (i, w) in waiters.into_iter().enumerate() {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "waiter {i}: stderr {:?}", stderr_of(&out));
    }
    let events = sb.lines("events");
    assert!(!events.iter().any(|l| l.starts_with("OVERLAP")), "two children ran at once: {events:#?}");
    // Appends to one file are totally ordered: without overlap they alternate start, stop.
    assert_eq!(events.len(), 2 * count, "every waiter's child must run exactly once: {events:#?}");
    let (mut tokens, mut last_stop) = (Vec::new(), f64::MIN);
    for pair in events.chunks(2) {
        let start: Vec<&str> = pair[0].split(' ').collect();
        let stop: Vec<&str> = pair[1].split(' ').collect();
        assert_eq!((start[0], stop[0], start[1]), ("start", "stop", stop[1]), "runs interleave: {events:#?}");
        let token: u64 = start[1].parse().expect("a numeric fencing token");
        assert!(tokens.last().is_none_or(|&last| token > last), "tokens must strictly increase: {events:#?}");
        let (t_start, t_stop): (f64, f64) = (start[2].parse().unwrap(), stop[2].parse().unwrap());
        assert!(last_stop <= t_start && t_start <= t_stop, "runs overlap in time: {events:#?}");
        tokens.push(token);
        last_stop = t_stop;
    }
    tokens
}

/// Parsed `leaderrun status --store URL --json --lock LOCK`, and its exit code.
pub fn status_json(sb: &Sandbox, url: &str, lock: &str) -> (i32, Value) {
    let mut cmd = sb.bare();
    cmd.args(["status", "--store", url, "--json", "--lock", lock]);
    let out = sb.output(cmd);
    let text = stdout_of(&out);
    let value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("status --json printed no JSON ({e}): {text:?}, stderr {:?}", stderr_of(&out)));
    (code_of(out.status, "status --json"), value)
}

/// Wait for one-shot runs started together: each must exit 0 and print nothing at all
/// (cron would mail any output).
pub fn assert_quiet_runs(runs: Vec<Wrapper>) {
    for (i, w) in runs.into_iter().enumerate() {
        let out = w.finish(Duration::from_secs(60));
        assert_eq!(out.status.code(), Some(0), "run {i}: stderr {:?}", stderr_of(&out));
        assert_eq!((stdout_of(&out), stderr_of(&out)), (String::new(), String::new()), "run {i} must be silent");
    }
}

/// A `--wait` holder (ttl 8 s, renewing every second) rides out a store outage of 1.5 s
/// (`stop` takes the server down, `start` brings it back): its child keeps running, and a
/// renewal after the restart extends the same lease — 8 s minus the outage leaves at most
/// 6.5 s, so 7 s or more left shows a renewal reached the restarted server. SIGTERM then
/// ends it with 143 and frees the lock, which keeps its token. `secret` (a password in the
/// URL) never shows on the holder's stderr.
pub fn assert_holder_rides_out_an_outage(
    sb: &Sandbox,
    url: &str,
    stop: impl FnOnce(),
    start: impl FnOnce(),
    secret: Option<&str>,
) {
    let script = r#"echo $$ > "$D/child.tmp"; mv "$D/child.tmp" "$D/child.pid"; exec sleep 1000"#;
    let args = ["--lock", "worker", "--wait", "--ttl", "8s", "--renew-every", "1s", "--kill-after", "1s"];
    let mut holder = sb.spawn("holder", sb.at(url, &[&args[..], &["--", "sh", "-c", script]].concat()));
    let child = sb.wait_pid("child.pid");
    let (code, before) = status_json(sb, url, "worker");
    assert_eq!(code, 0, "held: {before}");

    stop();
    std::thread::sleep(Duration::from_millis(1500));
    start();

    wait_for(
        || {
            let (code, s) = status_json(sb, url, "worker");
            code == 0
                && s["fencing_token"] == before["fencing_token"]
                && s["expires_in_seconds"].as_f64().is_some_and(|left| left >= 7.0)
        },
        WITHIN_A_LEASE,
        "a renewal after the restart",
    );
    assert!(holder.try_status().is_none(), "the holder must still run; stderr {:?}", holder.stderr());
    assert!(pid_alive(child), "the child must have kept running through the outage");
    if let Some(secret) = secret {
        assert!(!holder.stderr().contains(secret), "{:?}", holder.stderr());
    }

    holder.signal(Signal::SIGTERM);
    assert_eq!(holder.wait_code(SOON), 128 + 15, "stderr {:?}", holder.stderr());
    sb.wait_no_processes_left(SOON);
    let (code, after) = status_json(sb, url, "worker");
    assert_eq!((code, &after["fencing_token"]), (1, &before["fencing_token"]), "free, last token kept: {after}");
}

/// Ten hosts' cron fire `CRON_JOB` at once under `--lock nightly --min-hold 30s` on the store
/// at `url`: all exit 0 without a word, exactly one child runs, and the lock stays held with
/// that child's token; a late firing inside the min-hold runs nothing and says nothing.
/// Returns the token.
pub fn assert_cron_fleet_runs_once(sb: &Sandbox, url: &str) -> u64 {
    let args = ["--lock", "nightly", "--min-hold", "30s", "--", "sh", "-c", CRON_JOB];
    let running: Vec<Wrapper> = (0..10).map(|i| sb.spawn(&format!("cron-{i}"), sb.at(url, &args))).collect();
    assert_quiet_runs(running);
    let runs = sb.lines("runs");
    assert_eq!(runs.len(), 1, "exactly one child must run: {runs:?}");
    let token: u64 = runs[0].strip_prefix("ran ").and_then(|t| t.parse().ok()).expect("ran TOKEN");
    assert!(token > 0);
    let (code, status) = status_json(sb, url, "nightly");
    assert_eq!((code, &status["fencing_token"]), (0, &Value::from(token)), "held for --min-hold: {status}");
    let late = sb.output(sb.at(url, &args));
    assert_eq!((late.status.code(), stderr_of(&late)), (Some(0), String::new()), "a late firing");
    assert_eq!(sb.lines("runs").len(), 1, "a late firing inside --min-hold must run nothing");
    token
}

/// Four `--wait` runs of `TURN_TAKER` on the store at `url` take turns (see
/// `assert_turns_taken`); returns the tokens in the order the turns were taken.
pub fn assert_waiters_take_turns(sb: &Sandbox, url: &str) -> Vec<u64> {
    let args = ["--lock", "deploy", "--wait", "--", "sh", "-c", TURN_TAKER];
    let waiters: Vec<Wrapper> = (0..4).map(|i| sb.spawn(&format!("waiter-{i}"), sb.at(url, &args))).collect();
    assert_turns_taken(sb, waiters)
}

/// A `--wait` child that records its start (as `$NAME`), runs until the file `go` exists and
/// 0.3 s more, and records its stop, on CLOCK_BOOTTIME (which every process shares).
pub const TURN_AFTER_GO: &str = r#"
echo "start $NAME $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
while [ ! -e "$D/go" ]; do sleep 0.05; done
sleep 0.3
echo "stop $NAME $(cut -d' ' -f1 /proc/uptime)" >> "$D/turns"
"#;

/// Check that `count` children of `TURN_AFTER_GO` ran, one after another, each starting
/// less than a second after the one before it stopped: far below the several-second leases
/// the callers use, so a handoff that waited for a lease to lapse fails it.
pub fn assert_quick_handoffs(sb: &Sandbox, count: usize) {
    let mut turns: Vec<(String, f64, f64)> = Vec::new();
    for line in sb.lines("turns") {
        let f: Vec<&str> = line.split(' ').collect();
        let at: f64 = f[2].parse().expect("an uptime");
        match f[0] {
            "start" => turns.push((f[1].to_string(), at, f64::NAN)),
            _ => turns.iter_mut().find(|t| t.0 == f[1]).expect("a stop after its start").2 = at,
        }
    }
    assert_eq!(turns.len(), count, "{turns:?}");
    for pair in turns.windows(2) {
        let gap = pair[1].1 - pair[0].2;
        eprintln!("{} ended, {} started {gap:.3} s later", pair[0].0, pair[1].0);
        assert!(gap >= 0.0, "two children at once: {turns:?}");
        assert!(gap < 1.0, "a handoff took {gap:.3} s: {turns:?}");
    }
}
