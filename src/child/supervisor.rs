//! Runs the command as the elector's payload: starts the watchdog, then the child in its
//! own process group and cgroup; relays signals to the whole tree; replaces a watchdog
//! that dies; and at the end stands the watchdog down before the lease is released.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;
use tokio::sync::oneshot;

use super::cgroup::{self, Cgroup};
use super::command::CommandSpec;
use super::environment;
use super::group::ProcessGroup;
use super::spawn::{self, Exec, ExecMark, NotStarted};
use super::terminal;
use super::tree::ChildTree;
use super::watchdog::{self, Watchdog};
use crate::payload::{ChildExit, Payload, StartError};
use crate::store::Lease;

/// How many dead watchdogs one run replaces. One that dies again and again (it crashes
/// at start, or the host keeps OOM-killing it) would otherwise be restarted in a loop;
/// after that many the child is stopped instead, as when no new one can be started.
const MAX_REPLACEMENTS: u32 = 3;

/// How long after SIGKILL a tree that is still there is taken to outlive it (a process in
/// state D), and said so. It is waited for all the same: never released while it lives.
const OUTLIVES_SIGKILL: Duration = Duration::from_secs(5);

/// Runs the command as the elector's payload.
pub struct Supervisor {
    command: CommandSpec,
    stop: Signal,
    kill_after: Duration,
    /// Variables the child gets beside the lease's own.
    environment: Vec<(&'static str, String)>,
    /// What the watchdog removes when it stops the child itself.
    remove_on_stop: Vec<PathBuf>,
    /// --max-runtime, which the watchdog keeps too.
    max_runtime: Option<Duration>,
    /// The slot of the lock the lease holds (LEADERRUN_SLOT).
    slot: usize,
    running: Option<Running>,
}

struct Running {
    tree: Tree,
    /// None once a dead watchdog could not be replaced (the child is being stopped).
    watchdog: Option<Watchdog>,
    /// The latest deadline, for a replacement watchdog.
    deadline: Duration,
    /// --max-runtime's end, for a replacement watchdog.
    max_runtime_at: Option<Duration>,
    replacements: u32,
    exit: oneshot::Receiver<ChildExit>,
    ended: Option<ChildExit>,
    /// leaderrun handed its terminal to the child and takes it back at the end.
    terminal: bool,
}

/// The child's tree as the wrapper signals it. A signal the kernel refuses (the child
/// runs as another user: `sudo`, a setuid program) is logged once per run, wherever it
/// was sent from: the elector, the sweep after the child's exit, or a stop without a watchdog.
#[derive(Clone)]
struct Tree {
    members: ChildTree,
    refusal_logged: Arc<AtomicBool>,
}

impl Tree {
    fn signal(&self, signal: Signal) {
        tracing::debug!(%signal, tree = %self.members, "signalling the child's process tree");
        if let Err(refused) = self.members.signal(signal) {
            if !self.refusal_logged.swap(true, Ordering::Relaxed) {
                tracing::error!("{refused}");
            }
        }
    }

    /// Stop signal, then SIGKILL after `kill_after`, then wait until it is gone, however long
    /// that takes. A process in uninterruptible sleep (state D: a hung disk or NFS server, a
    /// frozen file system) dies of SIGKILL only when it wakes; until then it is a live member
    /// of the tree, and the lease stays held (and renewed) for it: said once, as an error.
    async fn stop(&self, stop: Signal, kill_after: Duration) {
        self.signal(stop);
        if self.members.wait_gone(kill_after).await {
            return;
        }
        self.signal(Signal::SIGKILL);
        if self.members.wait_gone(OUTLIVES_SIGKILL).await {
            return;
        }
        tracing::error!(
            tree = %self.members,
            "a process of the child's tree outlives SIGKILL (stuck in uninterruptible sleep?); \
             the lease stays held until it is gone"
        );
        self.members.wait_gone(Duration::MAX).await;
        tracing::info!(tree = %self.members, "the last process of the child's tree is gone");
    }
}

impl Supervisor {
    pub fn new(command: CommandSpec, stop: Signal, kill_after: Duration) -> Self {
        Self {
            command,
            stop,
            kill_after,
            environment: Vec::new(),
            remove_on_stop: Vec::new(),
            max_runtime: None,
            slot: 0,
            running: None,
        }
    }

    /// The watchdog stops the child once it has run `limit`, should leaderrun not (frozen).
    pub fn with_max_runtime(mut self, limit: Option<Duration>) -> Self {
        self.max_runtime = limit;
        self
    }

    /// Give the child `name=value` too (it overrides an inherited variable of that name).
    pub fn with_variable(mut self, name: &'static str, value: String) -> Self {
        self.environment.push((name, value));
        self
    }

    /// Files or directories that say the run leads: if leaderrun dies or freezes, the watchdog
    /// removes them as it stops the child.
    pub fn removed_on_stop(mut self, path: PathBuf) -> Self {
        self.remove_on_stop.push(path);
        self
    }

    /// The child's whole environment: no inherited LEADERRUN_* variable, only these.
    fn environment(&self, lease: &Lease) -> Vec<(OsString, OsString)> {
        let mut set = vec![
            ("LEADERRUN_LOCK", lease.lock.clone()),
            ("LEADERRUN_IDENTITY", lease.identity.clone()),
            ("LEADERRUN_FENCING_TOKEN", lease.token.to_string()),
            ("LEADERRUN_SLOT", self.slot.to_string()),
        ];
        set.extend(self.environment.iter().cloned());
        environment::for_child(&set)
    }

    /// The child started inside `cgroup` by `clone3`. `Err(None)`: this host refuses that
    /// (said once at debug level), use std's spawn; `Err(Some)`: the program cannot run.
    fn clone_into(
        &self,
        cgroup: &Cgroup,
        lease: &Lease,
        announce: Option<RawFd>,
        terminal: bool,
        start_by: Duration,
    ) -> Result<spawn::Started, Option<std::io::Error>> {
        let unsupported = |why: String| {
            tracing::debug!("cannot start the child inside its cgroup ({why}); it moves in itself");
            None
        };
        let dir = cgroup.open_dir().map_err(|e| unsupported(format!("{}: {e}", cgroup.dir().display())))?;
        let exec = Exec::new(&self.command, &self.environment(lease)).map_err(Some)?;
        match spawn::spawn_into(&exec, dir.as_raw_fd(), announce, terminal, start_by) {
            Ok(started) => Ok(started),
            Err(NotStarted::Unsupported(err)) => Err(unsupported(format!("clone3: {err}"))),
            Err(NotStarted::Exec(err) | NotStarted::Other(err)) => Err(Some(err)),
        }
    }

    /// The child started by std's spawn (tokio's), moving itself into the cgroup whose
    /// `cgroup.procs` is open on `procs` before its program runs.
    async fn std_spawn(
        &self,
        lease: &Lease,
        procs: Option<RawFd>,
        announce: Option<RawFd>,
        terminal: bool,
        start_by: Duration,
    ) -> std::io::Result<ChildProcess> {
        let mut command = tokio::process::Command::new(&self.command.path);
        command.arg0(&self.command.program).args(&self.command.args).process_group(0).kill_on_drop(false);
        command.env_clear().envs(self.environment(lease));
        if let Some(procs) = procs {
            // Into its cgroup before its program runs, so nothing it starts is ever outside.
            // SAFETY: runs between fork and exec; move_self_in makes one write(2) and
            // does not allocate.
            unsafe {
                command.pre_exec(move || {
                    cgroup::move_self_in(procs);
                    Ok(())
                });
            }
        }
        // The child tells the watchdog its group itself, before its program starts.
        if let Some(fd) = announce {
            // SAFETY: runs between fork and exec; announce_from_child makes only
            // async-signal-safe system calls and does not allocate.
            unsafe {
                command.pre_exec(move || watchdog::announce_from_child(fd));
            }
        }
        // Last: not at all once the lease's stop time has passed (see spawn::in_time).
        // SAFETY: runs between fork and exec; in_time makes one clock_gettime.
        unsafe {
            command.pre_exec(move || match spawn::in_time(start_by) {
                true => Ok(()),
                false => Err(std::io::Error::from_raw_os_error(libc::ETIMEDOUT)),
            });
        }
        if terminal {
            // SAFETY: runs between fork and exec; take_foreground makes only
            // async-signal-safe system calls.
            unsafe {
                command.pre_exec(|| {
                    let _ = terminal::take_foreground();
                    Ok(())
                });
            }
        }
        // The very last: the mark that tells an exec from a death before it (see spawn.rs).
        let mark = ExecMark::new()?;
        let mark_fd = mark.write_end();
        // SAFETY: runs between fork and exec; ExecMark::mark makes one write(2).
        unsafe {
            command.pre_exec(move || ExecMark::mark(mark_fd));
        }
        let mut child = command.spawn()?;
        if mark.reached_exec()? {
            return Ok(ChildProcess::Std(child));
        }
        let _ = child.wait().await;
        Err(std::io::Error::other(spawn::KilledBeforeExec))
    }
}

/// The child, however it was started.
enum ChildProcess {
    Std(tokio::process::Child),
    Cloned(spawn::Started),
}

impl ChildProcess {
    fn id(&self) -> Option<u32> {
        match self {
            Self::Std(child) => child.id(),
            Self::Cloned(started) => Some(started.pid),
        }
    }

    async fn wait(self) -> std::io::Result<ExitStatus> {
        match self {
            Self::Std(mut child) => child.wait().await,
            Self::Cloned(started) => started.wait().await,
        }
    }
}

/// A cgroup for the child and its `cgroup.procs` open for writing; None where the host
/// gives none, which is normal (no cgroup v2, or not root and no delegated unit).
fn child_cgroup() -> Option<(Cgroup, OwnedFd)> {
    let cgroup = match Cgroup::create() {
        Ok(cgroup) => cgroup,
        Err(why) => {
            tracing::debug!("no cgroup for the child ({why}); its process group alone holds its tree");
            return None;
        }
    };
    match cgroup.open_procs() {
        Ok(procs) => Some((cgroup, procs)),
        Err(err) => {
            tracing::debug!("no cgroup for the child ({}/cgroup.procs: {err})", cgroup.dir().display());
            let _ = cgroup.remove();
            None
        }
    }
}

fn remove_cgroup(cgroup: Option<&Cgroup>) {
    if let Some(cgroup) = cgroup {
        if let Err(err) = cgroup.remove() {
            tracing::warn!("cannot remove the child's cgroup {}: {err}", cgroup.dir().display());
        }
    }
}

#[async_trait]
impl Payload for Supervisor {
    async fn start(&mut self, lease: &Lease, slot: usize, deadline: Duration) -> Result<(), StartError> {
        self.slot = slot;
        let cgroup = child_cgroup();
        let cgroup_dir = cgroup.as_ref().map(|(c, _)| c.dir());
        // The watchdog first, so that no instant passes with a child and no guard.
        let mut watchdog = match Watchdog::spawn(self.stop, self.kill_after, deadline, cgroup_dir) {
            Ok(watchdog) => watchdog,
            Err(err) => {
                remove_cgroup(cgroup.as_ref().map(|(c, _)| c));
                return Err(StartError::Internal(format!("cannot start the watchdog: {err}")));
            }
        };
        for path in &self.remove_on_stop {
            watchdog.remove_on_stop(path);
        }
        // Counted from now, a moment after the elector's own count began: the elector acts first.
        let max_runtime_at = self.max_runtime.map(|limit| crate::clock::boottime().saturating_add(limit));
        if let Some(at) = max_runtime_at {
            watchdog.limit_runtime(at);
        }
        let terminal = terminal::in_foreground();
        let announce = watchdog.pipe_fd();
        // The instant the elector would stop the child (`Timing::stop_at`): checked once more
        // in the new process, just before its program runs.
        let start_by = deadline.saturating_sub(self.kill_after);
        // Straight into its cgroup where the kernel allows (see spawn.rs); else std's spawn,
        // and the child moves itself in before its program runs.
        let cloned = match &cgroup {
            Some((cgroup, _)) => self.clone_into(cgroup, lease, announce, terminal, start_by),
            None => Err(None),
        };
        let spawned = match cloned {
            Ok(started) => Ok(ChildProcess::Cloned(started)),
            Err(Some(err)) => Err(err),
            Err(None) => {
                let procs = cgroup.as_ref().map(|(_, procs)| procs.as_raw_fd());
                self.std_spawn(lease, procs, announce, terminal, start_by).await
            }
        };
        let cgroup = cgroup.map(|(cgroup, _procs)| cgroup);
        let child = match spawned {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish().await;
                remove_cgroup(cgroup.as_ref());
                let shown = self.command.program.to_string_lossy().into_owned();
                return Err(match err.kind() {
                    _ if err.raw_os_error() == Some(libc::ETIMEDOUT) => StartError::TooLate,
                    // The watchdog kills a child that announces itself past the deadline.
                    _ if spawn::killed_before_exec(&err) => match spawn::in_time(start_by) {
                        false => StartError::TooLate,
                        true => StartError::Internal(err.to_string()),
                    },
                    std::io::ErrorKind::NotFound => StartError::NotFound(shown),
                    _ => StartError::NotExecutable(shown, err.to_string()),
                });
            }
        };
        // tokio forgets the pid only once the child is reaped, and nothing waited for it
        // yet; should it be gone all the same, its group is unknown here (the watchdog
        // still has it from the child's own announcement, and the cgroup still holds it).
        let pid = child.id();
        let group = pid.and_then(ProcessGroup::led_by);
        match group {
            Some(group) => watchdog.guard(group),
            None => {
                tracing::warn!("the child's pid is unknown (it was already reaped): its process group cannot be swept")
            }
        }
        if let (Some(cgroup), Some(pid)) = (&cgroup, pid) {
            if !cgroup.holds(pid) {
                tracing::warn!(
                    "the child could not be moved into its cgroup {}: a process that leaves its process group will escape",
                    cgroup.dir().display()
                );
            }
        }
        let tree = Tree { members: ChildTree { group, cgroup }, refusal_logged: Arc::default() };
        let (tx, rx) = oneshot::channel();
        tokio::spawn(reap(child, tree.clone(), self.stop, self.kill_after, tx));
        self.running = Some(Running {
            tree,
            watchdog: Some(watchdog),
            deadline,
            max_runtime_at,
            replacements: 0,
            exit: rx,
            ended: None,
            terminal,
        });
        Ok(())
    }

    fn extend(&mut self, deadline: Duration) {
        if let Some(running) = &mut self.running {
            running.deadline = deadline;
            if let Some(watchdog) = &mut running.watchdog {
                watchdog.extend(deadline);
            }
        }
    }

    fn signal(&mut self, signal: Signal) {
        if let Some(running) = &self.running {
            running.tree.signal(signal);
        }
    }

    fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
    }

    async fn wait(&mut self) -> ChildExit {
        let Some(running) = &mut self.running else {
            return std::future::pending().await;
        };
        loop {
            if let Some(ended) = running.ended {
                return ended;
            }
            let (exit, watchdog) = (&mut running.exit, &mut running.watchdog);
            // Both futures are cancel-safe: the elector polls this next to its timers.
            let watchdog_died = async {
                match watchdog {
                    Some(watchdog) => watchdog.exited().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ended = exit => {
                    running.ended = Some(ended.unwrap_or(ChildExit::Signal(Signal::SIGKILL as i32)));
                }
                died = watchdog_died => running.replace_watchdog(died, self.stop, self.kill_after, &self.remove_on_stop),
            }
        }
    }

    /// The order kept: the goodbye is sent and the watchdog has exited (or been killed and
    /// reaped) before this returns, and only then does the elector release the lease.
    /// Released first, a new holder could start while this run's watchdog still keeps the
    /// old deadline; the group it would signal is gone by then, but a group id is a pid and
    /// pids are reused, so the new holder's child on this host could be the one it hits.
    async fn finish(&mut self) {
        let Some(running) = &mut self.running else { return };
        if let Some(watchdog) = running.watchdog.take() {
            watchdog.finish().await;
        }
        if running.terminal {
            let _ = terminal::take_foreground();
        }
        remove_cgroup(running.tree.members.cgroup.as_ref());
    }
}

impl Running {
    /// The watchdog died while the child runs (OOM-killed, killed by hand): without one, a
    /// later crash of leaderrun would leave the child running past the lease. Start a new
    /// one with the current deadline and tree; failing that, stop the child (the stop
    /// signal, SIGKILL after --kill-after), and the elector sees it exit.
    fn replace_watchdog(
        &mut self,
        died: std::io::Result<ExitStatus>,
        stop: Signal,
        kill_after: Duration,
        remove_on_stop: &[PathBuf],
    ) {
        let old = self.watchdog.take().and_then(|w| w.pid()).map_or_else(String::new, |pid| format!(" {pid}"));
        let how = match died {
            Ok(status) => match (status.code(), status.signal()) {
                (_, Some(signal)) => format!("killed by signal {signal}"),
                (Some(code), _) => format!("exit status {code}"),
                _ => status.to_string(),
            },
            Err(err) => err.to_string(),
        };
        let why = if self.replacements >= MAX_REPLACEMENTS {
            format!("it died {} times", MAX_REPLACEMENTS + 1)
        } else {
            self.replacements += 1;
            let cgroup = self.tree.members.cgroup.as_ref().map(Cgroup::dir);
            match Watchdog::spawn(stop, kill_after, self.deadline, cgroup) {
                Ok(mut watchdog) => {
                    if let Some(group) = self.tree.members.group {
                        watchdog.guard(group);
                    }
                    for path in remove_on_stop {
                        watchdog.remove_on_stop(path);
                    }
                    if let Some(at) = self.max_runtime_at {
                        watchdog.limit_runtime(at);
                    }
                    let new = watchdog.pid().map_or_else(String::new, |pid| format!(" (pid {pid})"));
                    tracing::warn!("the watchdog{old} died ({how}); started a new one{new}");
                    self.watchdog = Some(watchdog);
                    return;
                }
                Err(err) => format!("no new one can be started: {err}"),
            }
        };
        tracing::error!(
            "the watchdog{old} died ({how}) and {why}; stopping the child, which must not run without a watchdog"
        );
        let tree = self.tree.clone();
        tokio::spawn(async move { tree.stop(stop, kill_after).await });
    }
}

/// Wait for the child, then make sure nothing of its tree outlives it: a background job
/// (or one that left the process group, where a cgroup holds it) would otherwise run on
/// after the lease is released.
async fn reap(child: ChildProcess, tree: Tree, stop: Signal, kill_after: Duration, tx: oneshot::Sender<ChildExit>) {
    let ended = match child.wait().await {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ChildExit::Code(code),
            (None, Some(signal)) => ChildExit::Signal(signal),
            _ => ChildExit::Code(1),
        },
        Err(_) => ChildExit::Code(1),
    };
    if tree.members.alive() {
        tracing::info!(tree = %tree.members, "the child exited but its process tree lives on; stopping it");
        tree.stop(stop, kill_after).await;
    }
    let _ = tx.send(ended);
}

#[cfg(test)]
mod tests;
