//! Wiring for the binary: check every input, open the store, run the elector with
//! the child as its payload, and turn the outcome into an exit status.
//!
//! All input is checked before the store is opened, so bad input never writes.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;
use tokio::sync::mpsc;

use crate::child::{signals, CommandSpec, Supervisor};
use crate::cli::{Cli, Command, CommonArgs, RunArgs};
use crate::clock::BootClock;
use crate::elector::{Election, Elector, Mode, Outcome};
use crate::exit;
use crate::logging;
use crate::store::url::{self, Access, StoreSpec};
use crate::store::{validate_lock_name, LockRecord, Store};
use crate::timing::{validate_timeout, Timing};

/// Print one line naming the problem; return the status to exit with.
fn fail(code: u8, message: impl std::fmt::Display) -> u8 {
    tracing::error!("{message}");
    code
}

pub async fn main(cli: Cli) -> u8 {
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
    url::open(&spec, Access::Existing).await.map_err(|e| fail(exit::STORE_UNAVAILABLE, e))
}

/// Check everything about a run; nothing touches the store yet.
struct Plan {
    election: Election,
    command: CommandSpec,
    spec: StoreSpec,
    conflict_exit_code: u8,
}

fn plan(args: RunArgs) -> Result<Plan, u8> {
    let usage = |e: String| fail(exit::USAGE, e);
    let lock = args.lock.name().to_string();
    validate_lock_name(&lock).map_err(usage)?;
    let mut words = args.command.into_iter();
    let Some(program) = words.next() else {
        return Err(usage("missing command: give it after --, as in: leaderrun --lock NAME -- ./job.sh".into()));
    };
    let timing = Timing::new(args.ttl, args.renew_every, args.kill_after, args.min_hold, args.wait)
        .map_err(|e| usage(e.to_string()))?;
    validate_timeout(args.timeout).map_err(|e| usage(e.to_string()))?;
    if args.timeout.is_some() && !args.wait {
        return Err(usage("--timeout only applies with --wait (one-shot mode never waits)".into()));
    }
    let identity = match args.identity {
        Some(identity) => {
            if identity.trim().is_empty() || identity.chars().any(char::is_control) || identity.chars().count() > 255 {
                return Err(usage("--identity must be 1-255 characters without control characters".into()));
            }
            identity
        }
        None => default_identity(),
    };
    let spec = store_spec(&args.common).map_err(usage)?;
    let command = CommandSpec::resolve(program, words.collect()).map_err(|e| fail(e.status(), e))?;
    let mode = if args.wait { Mode::Wait { timeout: args.timeout } } else { Mode::OneShot };
    Ok(Plan {
        election: Election { lock, identity, timing, mode, stop: args.signal },
        command,
        spec,
        conflict_exit_code: args.conflict_exit_code,
    })
}

/// HOST:PID:RANDOM, unique per run (assumption A4 of the safety contract).
fn default_identity() -> String {
    let host = nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_else(|| "localhost".into());
    let suffix: u32 = rand::random();
    format!("{host}:{}:{:06x}", std::process::id(), suffix & 0xff_ffff)
}

async fn run(args: RunArgs) -> u8 {
    logging::init(&args.common);
    let plan = match plan(args) {
        Ok(plan) => plan,
        Err(code) => return code,
    };
    // Signals first: one that arrives while the store is being opened ends the wait too.
    let signals = match relay_signals() {
        Ok(signals) => signals,
        Err(err) => return fail(exit::INTERNAL, format!("cannot install signal handlers: {err}")),
    };
    let mut signals = signals;
    let store: Arc<dyn Store> = match open_store(&plan, &mut signals).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let timing = plan.election.timing;
    let mut child = Supervisor::new(plan.command, plan.election.stop, timing.kill_after);
    let lock = plan.election.lock.clone();
    let elector = Elector::new(store, Arc::new(BootClock), plan.election, signals);
    match elector.run(&mut child).await {
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
        Outcome::LeaseLost { exit, why } => {
            tracing::error!(%lock, child_status = exit.status(), "lease lost while the child ran ({why}); the child was stopped");
            exit::LEASE_LOST
        }
        Outcome::StoreFailed(err) => fail(exit::STORE_UNAVAILABLE, err),
        Outcome::StartFailed(err) => fail(err.status(), err),
    }
}

/// Open the store. One-shot runs give up at the first failure; `--wait` runs ride out a
/// store that is not reachable yet (a worker started before its database), until
/// `--timeout` or a signal.
async fn open_store(plan: &Plan, signals: &mut mpsc::UnboundedReceiver<Signal>) -> Result<Arc<dyn Store>, u8> {
    let give_up = match plan.election.mode {
        Mode::Wait { timeout } => timeout.map(|t| tokio::time::Instant::now() + t),
        Mode::OneShot => {
            return url::open(&plan.spec, Access::Create)
                .await
                .map(Arc::from)
                .map_err(|e| fail(exit::STORE_UNAVAILABLE, e))
        }
    };
    for attempt in 0u64.. {
        let err = match url::open(&plan.spec, Access::Create).await {
            Ok(store) => return Ok(Arc::from(store)),
            Err(err) if err.is_transient() => err,
            Err(err) => return Err(fail(exit::STORE_UNAVAILABLE, err)),
        };
        if give_up.is_some_and(|t| tokio::time::Instant::now() >= t) {
            return Err(fail(exit::STORE_UNAVAILABLE, err));
        }
        if attempt == 0 {
            tracing::warn!("cannot reach the store yet, retrying every second: {err}");
        } else {
            tracing::debug!("still cannot reach the store: {err}");
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            Some(signal) = signals.recv() => return Err(exit::for_signal(signal as i32)),
        }
    }
    unreachable!("the attempts never run out")
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

async fn status(common: &CommonArgs, lock: &str, json: bool) -> u8 {
    let store = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let record = match store.status(lock).await {
        Ok(record) => record,
        Err(err) => return fail(exit::STORE_UNAVAILABLE, err),
    };
    if json {
        println!("{}", serde_json::to_string(&Shown::from(&record)).unwrap_or_default());
    } else {
        print_record(&record);
    }
    if record.is_held() {
        0
    } else {
        exit::NOT_HELD
    }
}

async fn list(common: &CommonArgs, json: bool) -> u8 {
    let store = match open_for_reading(common, None).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let records = match store.list().await {
        Ok(records) => records,
        Err(err) => return fail(exit::STORE_UNAVAILABLE, err),
    };
    if json {
        let shown: Vec<Shown> = records.iter().map(Shown::from).collect();
        println!("{}", serde_json::to_string(&shown).unwrap_or_default());
    } else if !records.is_empty() {
        println!("{:<30} {:<5} {:>8} {:>11}  HOLDER", "LOCK", "STATE", "TOKEN", "EXPIRES IN");
        for r in &records {
            println!(
                "{:<30} {:<5} {:>8} {:>11}  {}",
                r.lock,
                if r.is_held() { "held" } else { "free" },
                r.token,
                r.expires_in.map(short).unwrap_or_else(|| "-".into()),
                r.holder.as_deref().unwrap_or("-")
            );
        }
    }
    0
}

async fn release(common: &CommonArgs, lock: &str, json: bool) -> u8 {
    let store = match open_for_reading(common, Some(lock)).await {
        Ok(store) => store,
        Err(code) => return code,
    };
    let before = match store.revoke(lock).await {
        Ok(before) => before,
        Err(err) => return fail(exit::STORE_UNAVAILABLE, err),
    };
    if json {
        let out = serde_json::json!({
            "lock": lock,
            "release_requested": before.is_some(),
            "holder": before.as_ref().and_then(|r| r.holder.clone()),
            "token": before.as_ref().map(|r| r.token),
        });
        println!("{out}");
    } else {
        match &before {
            Some(r) => println!(
                "asked {} (token {}) to release {lock:?}: it stops its child at its next renewal, then frees the lock \
                 (at the latest when its lease expires, in {})",
                r.holder.as_deref().unwrap_or("-"),
                r.token,
                r.expires_in.map(short).unwrap_or_else(|| "-".into()),
            ),
            None => println!("{lock:?} was not held"),
        }
    }
    if before.is_some() {
        0
    } else {
        exit::NOT_HELD
    }
}

async fn init(common: &CommonArgs, print_sql: bool) -> u8 {
    let spec = match store_spec(common) {
        Ok(spec) => spec,
        Err(err) => return fail(exit::USAGE, err),
    };
    if print_sql {
        return match url::schema_sql(&spec) {
            Ok(sql) => {
                println!("{sql};");
                0
            }
            Err(err) => fail(exit::USAGE, err),
        };
    }
    match url::open(&spec, Access::Create).await {
        Ok(_) => {
            println!("the store is ready: {}", url::describe(&spec));
            0
        }
        Err(err) => fail(exit::STORE_UNAVAILABLE, err),
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
    expires_in_seconds: Option<f64>,
    release_requested: bool,
}

impl<'a> From<&'a LockRecord> for Shown<'a> {
    fn from(r: &'a LockRecord) -> Self {
        Shown {
            lock: &r.lock,
            held: r.is_held(),
            holder: r.holder.as_deref(),
            fencing_token: r.token,
            held_since: r.held_since.map(|t| humantime::format_rfc3339_seconds(t).to_string()),
            expires_in_seconds: r.expires_in.map(|d| (d.as_secs_f64() * 1000.0).round() / 1000.0),
            release_requested: r.revoked,
        }
    }
}

fn short(d: Duration) -> String {
    humantime::format_duration(Duration::from_millis(d.as_millis() as u64)).to_string()
}

fn print_record(r: &LockRecord) {
    println!("lock:        {}", r.lock);
    println!(
        "state:       {}",
        match (r.is_held(), r.revoked) {
            (true, true) => "held (asked to release by leaderrun release)",
            (true, false) => "held",
            _ => "free",
        }
    );
    if let Some(holder) = &r.holder {
        println!("holder:      {holder}");
    }
    println!("token:       {}", r.token);
    if let Some(since) = r.held_since {
        let ago = SystemTime::now().duration_since(since).unwrap_or_default();
        println!(
            "held since:  {} ({} ago)",
            humantime::format_rfc3339_seconds(since),
            short(Duration::from_secs(ago.as_secs()))
        );
    }
    if let Some(left) = r.expires_in {
        println!("expires in:  {}", short(left));
    }
}
