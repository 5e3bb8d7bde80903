//! Wiring for the binary: check every input, open the store, run the elector with
//! the child as its payload, and turn the outcome into an exit status.
//!
//! All input is checked before the store is opened, so bad input never writes.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::child::{signals, CommandSpec, Supervisor};
use crate::cli::{Cli, Command, CommonArgs, RunArgs};
use crate::clock::{BootClock, Clock};
use crate::elector::{Election, Elector, Mode, Outcome};
use crate::exit;
use crate::logging;
use crate::observe::{Event, Observer};
use crate::slots;
use crate::store::kind::StoreSpec;
use crate::store::{registry, validate_lock_name, Access, Store};
use crate::timing::{validate_timeout, Requested, Timing};

mod check;
mod opening;
mod records;
mod reporting;
mod watch;

use records::{short, Shown};

/// Print one line naming the problem; return the status to exit with.
fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    tracing::error!("{message}");
    code
}

/// Run what the command line asks. Failures the user can act on are logged here, each as
/// one line, and become the documented exit status; an `Err` is leaderrun's own trouble
/// (no signal handlers, standard output unwritable), for `main` to report.
pub async fn main(cli: Cli) -> anyhow::Result<u8> {
    match cli.subcommand {
        None => run(cli.run).await,
        Some(Command::Status { lock, slots, common, output }) => {
            logging::init(&common);
            records::status(&common, lock.name(), &slots, output.json).await
        }
        Some(Command::List { common, output }) => {
            logging::init(&common);
            records::list(&common, output.json).await
        }
        Some(Command::Release { lock, slots, common, output }) => {
            logging::init(&common);
            records::release(&common, lock.name(), &slots, output.json).await
        }
        Some(Command::Watch { lock, slot, common, json }) => {
            logging::init(&common);
            watch::watch(&common, lock.name(), slot, json).await
        }
        Some(Command::Check { lock, token, slot, common }) => {
            logging::init(&common);
            check::check(&common, lock, token, slot).await
        }
        Some(Command::Init { common, print_sql }) => {
            logging::init(&common);
            init(&common, print_sql).await
        }
    }
}

fn store_spec(common: &CommonArgs) -> Result<Box<dyn StoreSpec>, String> {
    registry::parse(common.store.as_deref(), registry::default_state_dir)
}

/// Open the store for a subcommand, or the status to exit with.
async fn open_for_reading(common: &CommonArgs, lock: Option<&str>) -> Result<Box<dyn Store>, u8> {
    if let Some(lock) = lock {
        validate_lock_name(lock).map_err(|e| fail(exit::USAGE, e))?;
    }
    let spec = store_spec(common).map_err(|e| fail(exit::USAGE, e))?;
    if let Some(lock) = lock {
        spec.check_lock_name(lock).map_err(|e| fail(exit::USAGE, e))?;
    }
    spec.open(Access::Existing).await.map_err(|e| fail(exit::STORE_UNAVAILABLE, e))
}

/// Check everything about a run; nothing touches the store yet.
struct Plan {
    election: Election,
    /// The timing flags as given: a store with a lease limit of its own may cap the ttl.
    requested: Requested,
    command: CommandSpec,
    spec: Box<dyn StoreSpec>,
    conflict_exit_code: u8,
    /// When the run began, on the elector's clock.
    started: Duration,
    /// The windows onto the run that were asked for.
    reporting: reporting::Asked,
}

/// `started`: when the run began, on the elector's clock (--timeout counts from then).
fn plan(args: RunArgs, started: Duration) -> Result<Plan, u8> {
    let usage = |e: String| fail(exit::USAGE, e);
    let lock = args.lock.name().to_string();
    validate_lock_name(&lock).map_err(usage)?;
    slots::validate(&lock, args.slots).map_err(usage)?;
    let reporting = reporting::asked(&args).map_err(usage)?;
    let mut words = args.command.into_iter();
    let Some(program) = words.next() else {
        return Err(usage("missing command: give it after --, as in: leaderrun --lock NAME -- ./job.sh".into()));
    };
    let spec = store_spec(&args.common).map_err(usage)?;
    spec.check_lock_name(&lock).map_err(usage)?;
    // A store's own rules on names hold for every slot's record too.
    spec.check_lock_name(&slots::record_name(&lock, args.slots - 1)).map_err(usage)?;
    let requested = Requested {
        ttl: args.ttl,
        renew_every: args.renew_every,
        kill_after: args.kill_after,
        min_hold: args.min_hold,
        server_skew: if spec.expiry_on_server_wall_clock() { args.server_clock_skew } else { Duration::ZERO },
        waiting: args.wait,
        failover: spec.known_failover(),
        lock_delay: args.lock_delay,
    };
    let timing = requested.timing().map_err(|e| usage(e.to_string()))?;
    check_lease_limits(&*spec, &timing, &requested).map_err(usage)?;
    validate_timeout(args.timeout).map_err(|e| usage(e.to_string()))?;
    if args.max_runtime.is_some_and(|d| d.is_zero()) {
        return Err(usage("--max-runtime must be longer than 0s".into()));
    }
    let (identity, unique_identity) = match args.identity {
        Some(identity) => {
            if identity.trim().is_empty() || identity.chars().any(char::is_control) || identity.chars().count() > 255 {
                return Err(usage("--identity must be 1-255 characters without control characters".into()));
            }
            (identity, false)
        }
        None => (default_identity(), true),
    };
    let command = CommandSpec::resolve(program, words.collect()).map_err(|e| fail(e.status(), e))?;
    let until = args.timeout.map(|t| started + t);
    let mode = if args.wait {
        Mode::Wait { until }
    } else {
        Mode::OneShot { until, retry_until: until.unwrap_or(started + timing.one_shot_retry()) }
    };
    Ok(Plan {
        election: Election {
            lock,
            identity,
            unique_identity,
            timing,
            mode,
            stop: args.signal,
            max_runtime: args.max_runtime,
            heartbeat: None,
            slots: args.slots,
        },
        requested,
        command,
        spec,
        conflict_exit_code: args.conflict_exit_code,
        started,
        reporting,
    })
}

/// Refuse a lease (ttl + --lock-delay) the store cannot keep (`StoreSpec::lease_limits`), in
/// one line naming the flags, the store and its range.
fn check_lease_limits(spec: &dyn StoreSpec, timing: &Timing, requested: &Requested) -> Result<(), String> {
    let Some(limits) = spec.lease_limits() else { return Ok(()) };
    let lease = timing.store_ttl();
    if limits.contains(&lease) {
        return Ok(());
    }
    let show = |d: Duration| humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string();
    let default = if requested.ttl.is_some() { "" } else { " (the default)" };
    let asked = if timing.lock_delay.is_zero() {
        format!("--ttl {}{default} asks for a lease of {}", show(timing.ttl), show(lease))
    } else {
        format!(
            "--ttl {}{default} + --lock-delay {} is a lease of {}",
            show(timing.ttl),
            show(timing.lock_delay),
            show(lease)
        )
    };
    let fix = if lease < *limits.start() { "raise --ttl" } else { "lower --ttl or --lock-delay" };
    Err(format!(
        "{asked}, but the store {} keeps leases of {} to {} only; {fix}",
        spec.shown(),
        show(*limits.start()),
        show(*limits.end())
    ))
}

/// HOST:PID:RANDOM, unique per run (assumption A4 of the safety contract).
fn default_identity() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into());
    let suffix: u32 = rand::random();
    format!("{host}:{}:{:06x}", std::process::id(), suffix & 0xff_ffff)
}

async fn run(args: RunArgs) -> anyhow::Result<u8> {
    logging::init(&args.common);
    let clock: Arc<dyn Clock> = Arc::new(BootClock);
    let mut plan = match plan(args, clock.now()) {
        Ok(plan) => plan,
        Err(code) => return Ok(code),
    };
    // Signals first: one that arrives while the store is being opened ends the wait too.
    let mut signals = relay_signals().context("cannot install signal handlers")?;
    let opened = match opening::open_and_fit(&mut plan, &*clock, &mut signals).await {
        Ok(opened) => opened,
        Err(code) => return Ok(code),
    };
    let timing = plan.election.timing;
    let child = Supervisor::new(plan.command, plan.election.stop, timing.kill_after)
        .with_max_runtime(plan.election.max_runtime);
    let (reporting, mut child) = plan.reporting.open(&timing, child);
    plan.election.heartbeat = reporting.heartbeat;
    let store = reporting.timed(opened.store);
    let slot_stores = opened.slot_stores.into_iter().map(|store| reporting.timed(store)).collect();
    let observers = Arc::new(reporting.observers);
    let (lock, slots) = (plan.election.lock.clone(), plan.election.slots);
    let elector =
        Elector::new(store, clock, plan.election, signals).slot_stores(slot_stores).observed_by(observers.clone());
    let outcome = elector.run(&mut child).await;
    observers.event(&Event::Stopping);
    Ok(match outcome {
        Outcome::Exited(exit) => exit.status(),
        Outcome::Conflict(record) => {
            match record.and_then(|r| r.holder) {
                Some(holder) if slots > 1 => {
                    tracing::info!(%lock, slots, last_holder = %holder, "every slot of the lock is held; not running")
                }
                Some(holder) => {
                    tracing::info!(%lock, %holder, "lock is held by another; not running")
                }
                None => tracing::info!(%lock, "did not get the lock in time; not running"),
            }
            plan.conflict_exit_code
        }
        Outcome::Interrupted(signal) => {
            tracing::info!(%signal, "interrupted while waiting for the lock");
            exit::for_signal(signal as i32)
        }
        Outcome::RanTooLong(exit) => {
            tracing::error!(%lock, child_status = exit.status(), "the child ran for --max-runtime and was stopped");
            exit::TIMED_OUT
        }
        Outcome::LeaseLost { exit, why } => {
            tracing::error!(%lock, child_status = exit.status(), "lease lost while the child ran ({why}); the child was stopped");
            exit::LEASE_LOST
        }
        Outcome::StoreFailed(err) => fail(opening::store_failure(&err), err),
        Outcome::StartFailed(err) => fail(err.status(), err),
    })
}

/// Turn the signals leaderrun relays into a channel for the elector.
fn relay_signals() -> std::io::Result<mpsc::UnboundedReceiver<Signal>> {
    use tokio::signal::unix::{signal, SignalKind};
    let (tx, rx) = mpsc::unbounded_channel();
    for sig in signals::FORWARDED {
        let mut stream = signal(SignalKind::from_raw(sig as i32))?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while stream.recv().await.is_some() {
                if tx.send(sig).is_err() {
                    break;
                }
            }
        });
    }
    Ok(rx)
}

/// Write a command's output in one go. A reader that went away (`leaderrun list | head -1`)
/// ends it quietly: the command's status is still its own. Any other failure is reported.
fn print(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("cannot write to standard output"),
    }
}

async fn init(common: &CommonArgs, print_sql: bool) -> anyhow::Result<u8> {
    let spec = match store_spec(common) {
        Ok(spec) => spec,
        Err(err) => return Ok(fail(exit::USAGE, err)),
    };
    if print_sql {
        return match spec.setup_text() {
            Some(sql) => print(&format!("{sql};\n")).map(|()| 0),
            None => Ok(fail(exit::USAGE, "this store makes nothing ahead of its first use: there is nothing to print")),
        };
    }
    match spec.prepare().await {
        Ok(_) => print(&format!("the store is ready: {}\n", spec.shown())).map(|()| 0),
        Err(err) => Ok(fail(exit::STORE_UNAVAILABLE, err)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store that keeps leases of 15 s to 60 s only.
    struct Limited;

    #[async_trait::async_trait]
    impl StoreSpec for Limited {
        fn shown(&self) -> String {
            "limited://x".into()
        }
        async fn open(&self, _: Access) -> crate::store::Result<Box<dyn Store>> {
            unreachable!("never opened")
        }
        fn expiry_on_server_wall_clock(&self) -> bool {
            false
        }
        fn lease_limits(&self) -> Option<std::ops::RangeInclusive<Duration>> {
            Some(Duration::from_secs(15)..=Duration::from_secs(60))
        }
    }

    fn check(ttl: Option<u64>, delay: u64) -> Result<(), String> {
        let requested = Requested {
            ttl: ttl.map(Duration::from_secs),
            renew_every: None,
            kill_after: None,
            min_hold: None,
            server_skew: Duration::ZERO,
            waiting: true,
            failover: Duration::ZERO,
            lock_delay: Duration::from_secs(delay),
        };
        check_lease_limits(&Limited, &requested.timing().unwrap(), &requested)
    }

    #[test]
    fn a_lease_the_store_cannot_keep_is_refused_naming_the_flags_and_the_range() {
        assert!(check(None, 0).is_ok() && check(Some(60), 0).is_ok() && check(Some(10), 5).is_ok());
        let err = check(Some(10), 0).unwrap_err();
        assert_eq!(
            err,
            "--ttl 10s asks for a lease of 10s, but the store limited://x keeps leases of 15s to 1m only; raise --ttl"
        );
        let err = check(None, 50).unwrap_err();
        assert!(err.starts_with("--ttl 15s (the default) + --lock-delay 50s is a lease of 1m 5s"), "{err}");
        assert!(err.ends_with("lower --ttl or --lock-delay"), "{err}");
    }
}
