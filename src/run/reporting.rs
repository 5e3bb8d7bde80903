//! The windows a run opens onto itself (`observe/`): the child's lease file always; the
//! leader file, systemd's notify protocol and `--http` when asked for. Nothing here talks
//! to the store, and none of them can delay a stop signal (DESIGN.md §9, Observing).

use std::sync::Arc;
use std::time::Duration;

use crate::timing::Timing;

use crate::child::Supervisor;
use crate::cli::RunArgs;
use crate::observe::leader_file::LeaderFile;
use crate::observe::lease_file::{self, LeaseFile};
use crate::observe::systemd::Systemd;
#[cfg(feature = "http")]
use crate::observe::Observer;
use crate::observe::Observers;
#[cfg(feature = "http")]
use crate::observe::{health::Health, http, metrics::Metrics, timed_store::TimedStore};
use crate::store::Store;

/// What was asked for, checked before the store is opened.
pub struct Asked {
    leader_file: Option<LeaderFile>,
    lock: String,
    /// --http's port, bound already: a port in use is a usage error, found before the store
    /// is opened.
    #[cfg(feature = "http")]
    http: Option<std::net::TcpListener>,
}

/// Check the flags (exit 2 on a bad one, before any connection).
pub fn asked(args: &RunArgs) -> Result<Asked, String> {
    let leader_file = args.leader_file.clone().map(LeaderFile::new).transpose()?;
    #[cfg(not(feature = "http"))]
    if args.http.is_some() {
        return Err("--http: this leaderrun was built without the http feature".into());
    }
    Ok(Asked {
        leader_file,
        lock: args.lock.name().to_string(),
        #[cfg(feature = "http")]
        http: args.http.map(http::bind).transpose()?,
    })
}

/// The observers of one run, and what they need of the elector.
pub struct Reporting {
    pub observers: Observers,
    /// Longest a standby may go without asking the store (`Election::heartbeat`).
    pub heartbeat: Option<Duration>,
    /// Who hears of each store request (--http), if anyone: see `timed`.
    #[cfg(feature = "http")]
    store_calls: Option<Arc<dyn Observer>>,
}

impl Reporting {
    /// The store the elector should use: timed for --http's metrics and health, else as is.
    pub fn timed(&self, store: Arc<dyn Store>) -> Arc<dyn Store> {
        #[cfg(feature = "http")]
        if let Some(observer) = &self.store_calls {
            return Arc::new(TimedStore::new(store, observer.clone()));
        }
        store
    }
}

impl Asked {
    /// Open the windows; `child` learns the files that say the run leads.
    pub fn open(self, timing: &Timing, child: Supervisor) -> (Reporting, Supervisor) {
        let ttl = timing.ttl;
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
                // A leader pings at each renewal: one late renewal must not cost a restart.
                if interval < timing.renew_every * 2 {
                    tracing::warn!(
                        "systemd's WatchdogSec ({}) is under twice --renew-every ({}): a single late renewal \
                         will have systemd restart a healthy leader; raise WatchdogSec",
                        humantime::format_duration(interval),
                        humantime::format_duration(timing.renew_every)
                    );
                }
            }
            observers.add(Arc::new(systemd));
        }
        #[cfg(feature = "http")]
        let mut store_calls: Option<Arc<dyn Observer>> = None;
        #[cfg(feature = "http")]
        if let Some(listener) = self.http {
            let health = Arc::new(Health::new(ttl));
            let metrics = Arc::new(Metrics::new(&self.lock));
            if let Err(err) = http::serve(listener, health.clone(), metrics.clone()) {
                tracing::error!("--http: cannot serve: {err}");
            }
            let mut both = Observers::none();
            both.add(health);
            both.add(metrics);
            observers.add(Arc::new(both.clone()));
            store_calls = Some(Arc::new(both));
            // /healthz judges the store's answers: a standby asks at least every ttl/2.
            heartbeat = Some(heartbeat.map_or(ttl / 2, |beat| beat.min(ttl / 2)));
        }
        #[cfg(not(feature = "http"))]
        let _ = (ttl, &self.lock);
        let reporting = Reporting {
            observers,
            heartbeat,
            #[cfg(feature = "http")]
            store_calls,
        };
        (reporting, child)
    }
}
