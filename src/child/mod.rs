//! The child: spawned in a process group of its own, signalled as a group,
//! guarded by the watchdog. Knows nothing of stores.

mod command;
pub mod group;
pub mod signals;
mod terminal;
pub mod watchdog;

pub use command::CommandSpec;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use async_trait::async_trait;
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::sync::oneshot;

use crate::payload::{ChildExit, Payload, StartError};
use crate::store::Lease;
use group::ProcessGroup;
use watchdog::Watchdog;

/// Runs the command as the elector's payload.
pub struct Supervisor {
    command: CommandSpec,
    stop: Signal,
    kill_after: Duration,
    running: Option<Running>,
}

struct Running {
    group: ProcessGroup,
    watchdog: Watchdog,
    exit: oneshot::Receiver<ChildExit>,
    ended: Option<ChildExit>,
    /// leaderrun handed its terminal to the child and takes it back at the end.
    terminal: bool,
}

impl Supervisor {
    pub fn new(command: CommandSpec, stop: Signal, kill_after: Duration) -> Self {
        Self { command, stop, kill_after, running: None }
    }

    fn group(&self) -> Option<ProcessGroup> {
        self.running.as_ref().map(|r| r.group)
    }
}

fn env_overrides(lease: &Lease) -> [(&'static str, String); 3] {
    [
        ("LEADERRUN_LOCK", lease.lock.clone()),
        ("LEADERRUN_IDENTITY", lease.identity.clone()),
        ("LEADERRUN_FENCING_TOKEN", lease.token.to_string()),
    ]
}

#[async_trait]
impl Payload for Supervisor {
    async fn start(&mut self, lease: &Lease, deadline: Duration) -> Result<(), StartError> {
        // The watchdog first, so that no instant passes with a child and no guard.
        let mut watchdog = Watchdog::spawn(self.stop, self.kill_after, deadline)
            .map_err(|e| StartError::Internal(format!("cannot start the watchdog: {e}")))?;
        let mut command = tokio::process::Command::new(&self.command.path);
        command.arg0(&self.command.program).args(&self.command.args).process_group(0).kill_on_drop(false);
        for (name, value) in env_overrides(lease) {
            command.env(name, value);
        }
        // The child tells the watchdog its group itself, before its program starts.
        if let Some(fd) = watchdog.pipe_fd() {
            // SAFETY: runs between fork and exec; announce_from_child makes only
            // async-signal-safe system calls and does not allocate.
            unsafe {
                command.pre_exec(move || watchdog::announce_from_child(fd));
            }
        }
        let terminal = terminal::in_foreground();
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
        let child = match command.spawn() {
            Ok(child) => child,
            Err(err) => {
                watchdog.finish();
                let shown = self.command.program.to_string_lossy().into_owned();
                return Err(match err.kind() {
                    std::io::ErrorKind::NotFound => StartError::NotFound(shown),
                    _ => StartError::NotExecutable(shown, err.to_string()),
                });
            }
        };
        let group = ProcessGroup::new(Pid::from_raw(child.id().map(|id| id as i32).unwrap_or(0)));
        watchdog.guard(group.id());
        let (tx, rx) = oneshot::channel();
        tokio::spawn(reap(child, group, self.stop, self.kill_after, tx));
        self.running = Some(Running { group, watchdog, exit: rx, ended: None, terminal });
        Ok(())
    }

    fn extend(&mut self, deadline: Duration) {
        if let Some(running) = &mut self.running {
            running.watchdog.extend(deadline);
        }
    }

    fn signal(&mut self, signal: Signal) {
        if let Some(group) = self.group() {
            group.signal(signal);
        }
    }

    fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
    }

    async fn wait(&mut self) -> ChildExit {
        let Some(running) = &mut self.running else {
            return std::future::pending().await;
        };
        if let Some(ended) = running.ended {
            return ended;
        }
        let ended = (&mut running.exit).await.unwrap_or(ChildExit::Signal(Signal::SIGKILL as i32));
        running.ended = Some(ended);
        ended
    }

    fn finish(&mut self) {
        if let Some(running) = &mut self.running {
            running.watchdog.finish();
            if running.terminal {
                let _ = terminal::take_foreground();
            }
        }
    }
}

/// Wait for the child, then make sure nothing of its process group outlives it:
/// a background job left behind would otherwise run on after the lease is released.
async fn reap(
    mut child: tokio::process::Child,
    group: ProcessGroup,
    stop: Signal,
    kill_after: Duration,
    tx: oneshot::Sender<ChildExit>,
) {
    let ended = match child.wait().await {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => ChildExit::Code(code),
            (None, Some(signal)) => ChildExit::Signal(signal),
            _ => ChildExit::Code(1),
        },
        Err(_) => ChildExit::Code(1),
    };
    if group.alive() {
        tracing::info!(pgid = group.id().as_raw(), "the child exited but its process group lives on; stopping it");
        group.signal(stop);
        if !group.wait_gone(kill_after).await {
            group.signal(Signal::SIGKILL);
            group.wait_gone(Duration::from_secs(5)).await;
        }
    }
    let _ = tx.send(ended);
}
