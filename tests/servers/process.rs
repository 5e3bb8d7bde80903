//! What every throw-away server shares: its process (stopped cleanly on request, killed
//! when dropped), and starting on free ports.

use std::path::Path;
use std::process::Child;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a server just started may take to serve.
const READY_WITHIN: Duration = Duration::from_secs(60);

/// A server's running process, if any.
#[derive(Default)]
pub struct ServerProcess(Mutex<Option<Child>>);

impl ServerProcess {
    /// Keep `child` as the running server.
    pub fn set(&self, child: Child) {
        *self.lock() = Some(child);
    }

    /// The running server's pid.
    pub fn pid(&self) -> Option<u32> {
        self.lock().as_ref().map(Child::id)
    }

    /// Whether the server has exited (it is then forgotten); false while it runs or if none.
    pub fn exited(&self) -> bool {
        let mut guard = self.lock();
        let gone = guard.as_mut().is_some_and(|child| child.try_wait().ok().flatten().is_some());
        if gone {
            guard.take();
        }
        gone
    }

    /// Stop the server with SIGTERM (it finishes writing its data) and wait for it; or reap
    /// one that was killed.
    pub fn stop(&self) {
        if let Some(mut child) = self.lock().take() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// Wait until `ready` (asked every `every`) says the server `name`, just started, serves.
    /// An error with its log's tail if it exits first or is not ready within 60 s (the
    /// caller then stops it).
    pub fn wait_ready(
        &self,
        name: &str,
        log: &Path,
        every: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let started = Instant::now();
        loop {
            if self.exited() {
                return Err(format!("{name} exited; log: {}", log_tail(log)));
            }
            if ready() {
                return Ok(());
            }
            if started.elapsed() > READY_WITHIN {
                return Err(format!("{name} not ready within {} s; log: {}", READY_WITHIN.as_secs(), log_tail(log)));
            }
            std::thread::sleep(every);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Child>> {
        // A test that panicked while holding it must not keep the server from being stopped.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.lock().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Start a server: `pick_ports` chooses free ports, `try_start` starts on them. A port free
/// when chosen may be taken by another process before the server binds it, so a few
/// attempts are made; panics with the last reason if none works.
pub fn start_on_free_ports(
    what: &str,
    mut pick_ports: impl FnMut(),
    mut try_start: impl FnMut() -> Result<(), String>,
) {
    for attempt in 0.. {
        pick_ports();
        match try_start() {
            Ok(()) => return,
            Err(why) if attempt >= 4 => panic!("{what} does not start: {why}"),
            Err(_) => continue,
        }
    }
}

/// The last ten lines of a server's log file, newest first, for a panic message.
pub fn log_tail(file: &Path) -> String {
    let log = std::fs::read_to_string(file).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(10).collect();
    format!("{tail:#?}")
}
