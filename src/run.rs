//! Wiring for the binary: check every input, open the store, run the elector with
//! the child as its payload, and turn the outcome into an exit status.
//!
//! All input is checked before the store is opened, so bad input never writes.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
use crate::store::url::{self, Access, StoreSpec};
use crate::store::{validate_lock_name, LockRecord, Store};
use crate::timing::{validate_timeout, Requested};

mod check;
mod opening;
mod reporting;
mod watch;

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
        Some(Command::Status { lock, common, output }) => {
            logging::init(&common);
            status(&common, lock.name(), output.json).await
        }
        Some(Command::List { common, output }) => {
            logging::init(&common);
            list(&common, output.json).await
        }
        Some(Command::Release { lock, common, output }) => {
            logging::init(&common);
            release(&common, lock.name(), output.json).await
        }
        Some(Command::Watch { lock, common, json }) => {
            logging::init(&common);
            watch::watch(&common, lock.name(), json).await
        }
        Some(Command::Check { lock, token, common }) => {
            logging::init(&common);
            check::check(&common, lock, token).await
        }
        Some(Command::Init { common, print_sql }) => {
            logging::init(&common);
            init(&common, print_sql).await
        }
    }
}

fn store_spec(common: &CommonArgs) -> Result<StoreSpec, String> {
    url::parse(common.store.as_deref(), url::default_state_dir)
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
    url::open(&spec, Access::Existing).await.map_err(|e| fail(exit::STORE_UNAVAILABLE, e))
}

/// Check everything about a run; nothing touches the store yet.
struct Plan {
    election: Election,
    /// The timing flags as given: a store with a lease limit of its own may cap the ttl.
    requested: Requested,
    command: CommandSpec,
    spec: StoreSpec,
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
    let reporting = reporting::asked(&args).map_err(usage)?;
    let mut words = args.command.into_iter();
    let Some(program) = words.next() else {
        return Err(usage("missing command: give it after --, as in: leaderrun --lock NAME -- ./job.sh".into()));
    };
    let spec = store_spec(&args.common).map_err(usage)?;
    spec.check_lock_name(&lock).map_err(usage)?;
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
        },
        requested,
        command,
        spec,
        conflict_exit_code: args.conflict_exit_code,
        started,
        reporting,
    })
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
    let store = match opening::open_and_fit(&mut plan, &*clock, &mut signals).await {
        Ok(store) => store,
        Err(code) => return Ok(code),
    };
    let timing = plan.election.timing;
    let child = Supervisor::new(plan.command, plan.election.stop, timing.kill_after)
        .with_max_runtime(plan.election.max_runtime);
    let (reporting, mut child) = plan.reporting.open(&timing, child);
    plan.election.heartbeat = reporting.heartbeat;
    let store = reporting.timed(store);
    let observers = Arc::new(reporting.observers);
    let lock = plan.election.lock.clone();
    let elector = Elector::new(store, clock, plan.election, signals).observed_by(observers.clone());
    let outcome = elector.run(&mut child).await;
    observers.event(&Event::Stopping);
    Ok(match outcome {
        Outcome::Exited(exit) => exit.status(),
        Outcome::Conflict(record) => {
            match record.and_then(|r| r.holder) {
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

async fn status(common: &CommonArgs, lock: &str, json: bool) -> anyhow::Result<u8> {
    let store = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store,
        Err(code) => return Ok(code),
    };
    let record = match store.status(lock).await {
        Ok(record) => record,
        Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
    };
    if json {
        print(&format!("{}\n", serde_json::to_string(&Shown::from(&record))?))?;
    } else {
        print(&show_record(&record))?;
    }
    Ok(if record.is_held() { 0 } else { exit::NOT_HELD })
}

async fn list(common: &CommonArgs, json: bool) -> anyhow::Result<u8> {
    let store = match open_for_reading(common, None).await {
        Ok(store) => store,
        Err(code) => return Ok(code),
    };
    let records = match store.list().await {
        Ok(records) => records,
        Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
    };
    let mut text = String::new();
    if json {
        let shown: Vec<Shown> = records.iter().map(Shown::from).collect();
        text = format!("{}\n", serde_json::to_string(&shown)?);
    } else if !records.is_empty() {
        text.push_str(&format!("{:<30} {:<5} {:>8} {:>11}  HOLDER\n", "LOCK", "STATE", "TOKEN", "EXPIRES IN"));
        for r in &records {
            text.push_str(&format!(
                "{:<30} {:<5} {:>8} {:>11}  {}\n",
                r.lock,
                if r.is_held() { "held" } else { "free" },
                r.token,
                r.expires_in.map(short).unwrap_or_else(|| "-".into()),
                r.holder.as_deref().unwrap_or("-")
            ));
        }
    }
    print(&text)?;
    Ok(0)
}

async fn release(common: &CommonArgs, lock: &str, json: bool) -> anyhow::Result<u8> {
    let store = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store,
        Err(code) => return Ok(code),
    };
    let before = match store.revoke(lock).await {
        Ok(before) => before,
        Err(err) => return Ok(fail(exit::STORE_UNAVAILABLE, err)),
    };
    let text = if json {
        let out = serde_json::json!({
            "lock": lock,
            "release_requested": before.is_some(),
            "holder": before.as_ref().and_then(|r| r.holder.clone()),
            "token": before.as_ref().map(|r| r.token),
        });
        format!("{out}\n")
    } else {
        match &before {
            Some(LockRecord { holder, token, expires_in, campaigner: Some(campaigner), .. }) => format!(
                "asked {} (token {token}) to release {lock:?}: it is another program's campaigner (a Choria leader), \
                 which notices at its next renewal, within {}, and stops; the lock stays taken until its key \
                 expires, in {}\n",
                holder.as_deref().unwrap_or("-"),
                short(campaigner.renews_every),
                expires_in.map(short).unwrap_or_else(|| "-".into()),
            ),
            Some(r) => format!(
                "asked {} (token {}) to release {lock:?}: it stops its child at its next renewal, then frees the lock \
                 (at the latest when its lease expires, in {}); a lock only kept for --min-hold is free now\n",
                r.holder.as_deref().unwrap_or("-"),
                r.token,
                r.expires_in.map(short).unwrap_or_else(|| "-".into()),
            ),
            None => format!("{lock:?} was not held\n"),
        }
    };
    print(&text)?;
    Ok(if before.is_some() { 0 } else { exit::NOT_HELD })
}

async fn init(common: &CommonArgs, print_sql: bool) -> anyhow::Result<u8> {
    let spec = match store_spec(common) {
        Ok(spec) => spec,
        Err(err) => return Ok(fail(exit::USAGE, err)),
    };
    if print_sql {
        return match url::schema_sql(&spec) {
            Ok(sql) => print(&format!("{sql};\n")).map(|()| 0),
            Err(err) => Ok(fail(exit::USAGE, err)),
        };
    }
    match url::prepare(&spec).await {
        Ok(_) => print(&format!("the store is ready: {}\n", url::describe(&spec))).map(|()| 0),
        Err(err) => Ok(fail(exit::STORE_UNAVAILABLE, err)),
    }
}

/// A record as `--json` shows it.
#[derive(serde::Serialize)]
struct Shown<'a> {
    lock: &'a str,
    held: bool,
    holder: Option<&'a str>,
    fencing_token: u64,
    held_since: Option<String>,
    /// For another program's campaigner (a Choria leader): its last renewal, since when it
    /// holds the lock is not known.
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed_at: Option<String>,
    expires_in_seconds: Option<f64>,
    release_requested: bool,
    /// Its child has exited; the lease is only kept for --min-hold.
    kept_for_min_hold: bool,
}

impl<'a> From<&'a LockRecord> for Shown<'a> {
    fn from(r: &'a LockRecord) -> Self {
        Shown {
            lock: &r.lock,
            held: r.is_held(),
            holder: r.holder.as_deref(),
            fencing_token: r.token,
            held_since: r.held_since.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            renewed_at: r.campaigner.map(|c| humantime::format_rfc3339_seconds(c.renewed_at).to_string()),
            expires_in_seconds: r.expires_in.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
            release_requested: r.revoked,
            kept_for_min_hold: r.kept,
        }
    }
}

fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

fn show_record(r: &LockRecord) -> String {
    let mut text = format!("lock:        {}\n", r.lock);
    let state = match (r.is_held(), r.revoked, r.kept) {
        (true, true, _) => "held (asked to release by leaderrun release)",
        (true, false, true) => "held (kept for --min-hold: its child has exited)",
        (true, false, false) => "held",
        _ => "free",
    };
    text.push_str(&format!("state:       {state}\n"));
    if let Some(holder) = &r.holder {
        text.push_str(&format!("holder:      {holder}\n"));
    }
    text.push_str(&format!("token:       {}\n", r.token));
    if let Some(since) = r.held_since {
        let ago = SystemTime::now().duration_since(since).unwrap_or_default();
        text.push_str(&format!(
            "held since:  {} ({} ago)\n",
            humantime::format_rfc3339_seconds(since),
            short(Duration::from_secs(ago.as_secs()))
        ));
    }
    if let Some(campaigner) = &r.campaigner {
        // Its key keeps only its last write: when it was first taken is not known.
        let ago = SystemTime::now().duration_since(campaigner.renewed_at).unwrap_or_default();
        text.push_str(&format!(
            "renewed at:  {} ({} ago; another program's campaigner, renewing every {}: the token is its last \
             renewal's revision)\n",
            humantime::format_rfc3339_seconds(campaigner.renewed_at),
            short(Duration::from_secs(ago.as_secs())),
            short(campaigner.renews_every)
        ));
    }
    if let Some(left) = r.expires_in {
        text.push_str(&format!("expires in:  {}\n", short(left)));
    }
    text
}
