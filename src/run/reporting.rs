//! The windows a run opens onto itself (`observe/`): the child's lease file always; the
//! leader file, systemd's notify protocol and `--http` when asked for. Nothing here talks
//! to the store, and none of them can delay a stop signal (DESIGN.md §9, Observing).

use std::sync::Arc;
use std::time::Duration;

use crate::child::Supervisor;
use crate::cli::RunArgs;
use crate::observe::leader_file::LeaderFile;
use crate::observe::lease_file::{self, LeaseFile};
use crate::observe::systemd::Systemd;
use crate::observe::Observers;

/// What was asked for, checked before the store is opened.
pub struct Asked {
    leader_file: Option<LeaderFile>,
}

/// Check the flags (exit 2 on a bad one, before any connection).
pub fn asked(args: &RunArgs) -> Result<Asked, String> {
    let leader_file = args.leader_file.clone().map(LeaderFile::new).transpose()?;
    Ok(Asked { leader_file })
}

/// The observers of one run, and what they need of the elector.
pub struct Reporting {
    pub observers: Observers,
    /// Longest a standby may go without asking the store (`Election::heartbeat`).
    pub heartbeat: Option<Duration>,
}

impl Asked {
    /// Open the windows; `child` learns the files that say the run leads.
    pub fn open(self, ttl: Duration, child: Supervisor) -> (Reporting, Supervisor) {
        let mut observers = Observers::none();
        let mut child = child;
        let mut heartbeat: Option<Duration> = None;
        let file = LeaseFile::planned();
        child = child
            .with_variable(lease_file::VARIABLE, file.path().display().to_string())
            .removed_on_stop(file.dir().to_path_buf());
        observers.add(Arc::new(file));
        if let Some(file) = self.leader_file {
            child = child.removed_on_stop(file.path().to_path_buf());
            observers.add(Arc::new(file));
        }
        if let Some(systemd) = Systemd::from_env() {
            if let Some(interval) = Systemd::watchdog_interval() {
                heartbeat = Some(interval / 2);
            }
            observers.add(Arc::new(systemd));
        }
        let _ = ttl;
        (Reporting { observers, heartbeat }, child)
    }
}
