//! The command line: every flag is defined here, once, with its documentation.
//!
//! `--help`, the man page (`man/leaderrun.1`) and the shell completions
//! (`completions/`) are all generated from these definitions; the test
//! `tests/generated_docs.rs` fails when the checked-in copies are stale.
//! Parsing only checks the shape of each value: the rules that relate values
//! to one another (the timing rule above all) live in `timing.rs`.

use std::ffi::OsString;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};

use crate::child::signals::parse_signal;
use crate::exit;
use crate::store::registry;

mod texts;

pub use texts::{CHILD_ENVIRONMENT, CHILD_ENVIRONMENT_NOTE, EXAMPLES, EXIT_STATUS, SAFETY_CONTRACT};

const ABOUT: &str = "Run a command only while holding a named leader lease: flock(1) for a fleet";

const LONG_ABOUT: &str = "\
Run a command only while holding a named leader lease in a shared store: flock(1) for a fleet.

leaderrun takes the lease named by --lock, runs COMMAND while it holds it, renews the lease \
in the background, and stops COMMAND (its whole process group) the moment the lease can no \
longer be trusted.

  leaderrun --lock nightly-report -- ./report.sh             # cron on every host: one runs
  leaderrun --lock deploy --wait --timeout 10m -- ./deploy   # CI pipelines take turns
  leaderrun --lock billing --wait -- ./worker                # N replicas, one active

By default the lease lives in an embedded SQLite file in the user's state directory \
($XDG_STATE_HOME/leaderrun, else ~/.local/state/leaderrun; /var/lib/leaderrun for root), \
which serves the processes of one host the way flock(1) does.";

/// The texts of `texts.rs`, laid out for `--help` (wrapped here: clap would not keep the indent).
fn after_long_help() -> String {
    let mut text = String::from("Exit status:\n");
    for (status, meaning) in EXIT_STATUS {
        text.push_str(&hanging(&format!("  {status:<9}"), meaning));
    }
    text.push_str("\nChild environment:\n");
    for (name, meaning) in CHILD_ENVIRONMENT {
        text.push_str(&hanging(&format!("  {name:<25}"), meaning));
    }
    text.push_str(&hanging("  ", CHILD_ENVIRONMENT_NOTE));
    text.push_str("\nSafety contract:\n");
    for paragraph in SAFETY_CONTRACT {
        text.push_str(&hanging("  ", paragraph));
    }
    text.push_str("\nStores:\n");
    for (url, what) in stores() {
        text.push_str(&format!("  {url}\n"));
        text.push_str(&hanging("      ", what));
    }
    text.push_str("\nExamples:\n");
    for (command, what) in EXAMPLES {
        text.push_str(&format!("  {command}\n"));
        text.push_str(&hanging("      ", what));
    }
    text
}

/// The STORES section: each store of this build, as the registry lists it (URL, what it
/// guarantees and what it does not), then the note that follows them.
pub fn stores() -> impl Iterator<Item = (&'static str, &'static str)> {
    registry::STORES.iter().map(|kind| (kind.url, kind.help)).chain([texts::STORES_NOTE])
}

/// `--store`'s help: every store's URL, from the registry.
fn store_help() -> String {
    let urls: Vec<&str> = registry::STORES.iter().map(|kind| kind.usage).collect();
    format!("Store holding the leases, as a URL: {}; see STORES", urls.join(", "))
}

fn store_long_help() -> String {
    format!(
        "{}.\n\nDefault: an embedded SQLite file in the state directory ($XDG_STATE_HOME/leaderrun/leaderrun.db, \
         else ~/.local/state/leaderrun/leaderrun.db; /var/lib/leaderrun/leaderrun.db for root), created on first \
         use, which serves one host only. A password in the URL is never printed.",
        store_help()
    )
}

/// `lead` then `body` wrapped at 90 columns, continuation lines indented to `lead`'s width.
fn hanging(lead: &str, body: &str) -> String {
    const WIDTH: usize = 90;
    let indent = lead.chars().count().max(2);
    let mut out = String::new();
    let mut line = lead.to_string();
    let mut len = line.chars().count();
    let mut fresh = true;
    if len > indent {
        line.push(' ');
        len += 1;
    }
    for word in body.split_whitespace() {
        let w = word.chars().count();
        if !fresh && len + 1 + w > WIDTH {
            out.push_str(line.trim_end());
            out.push('\n');
            line = " ".repeat(indent);
            len = indent;
            fresh = true;
        }
        if !fresh {
            line.push(' ');
            len += 1;
        }
        line.push_str(word);
        len += w;
        fresh = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// `leaderrun [OPTIONS] --lock NAME -- COMMAND [ARGS...]`, or one of the subcommands.
#[derive(Debug, Parser)]
#[command(
    name = "leaderrun",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_long_help = after_long_help(),
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    override_usage = "leaderrun [OPTIONS] --lock <NAME> [--] <COMMAND> [ARGS]...\n       leaderrun <status|list|release|watch|check|init> [OPTIONS]"
)]
pub struct Cli {
    #[command(subcommand)]
    pub subcommand: Option<Command>,

    #[command(flatten)]
    pub run: RunArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show who holds a lock: holder identity, fencing token, held since, expires in.
    ///
    /// Exit status: 0 when the lock is held, 1 when it is free.
    Status {
        #[command(flatten)]
        lock: LockArg,
        #[command(flatten)]
        slots: SlotsArg,
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        output: JsonArg,
    },
    /// List every lock in the store, held or free.
    List {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        output: JsonArg,
    },
    /// Force the holder of a lock to stand down.
    ///
    /// The lease is revoked: the holder's leaderrun notices at its next renewal, stops its
    /// child (and exits 75), then frees the lock for the next holder. Nobody else gets the
    /// lock before that, or before the lease expires if the holder is gone, so two children
    /// never overlap. A lock only kept for --min-hold (its child has exited) is freed at once.
    /// Exit status: 0 when a held lease was revoked, 1 when the lock was not held.
    Release {
        #[command(flatten)]
        lock: LockArg,
        #[command(flatten)]
        slots: SlotsArg,
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        output: JsonArg,
    },
    /// Follow a lock: print its state, then one line at each change, until SIGINT or SIGTERM.
    ///
    /// Changes: acquired, released, revoked (asked to stand down), expired, kept (for
    /// --min-hold), taken (by a new holder without a free moment between). With -v also
    /// renewed, where a renewal shows in the store. On a store that pushes changes (etcd,
    /// NATS, ZooKeeper, Kubernetes, PostgreSQL, Redis, SQLite) it asks nothing while nothing
    /// changes; elsewhere it reads the lock once a second. An unreachable store is said once,
    /// and again when it is back. Exit status: 0 after SIGINT or SIGTERM, or when the reader
    /// of its output goes away; 2 for bad usage.
    Watch {
        #[command(flatten)]
        lock: LockArg,
        /// Follow this slot of a lock run with --slots (0 is the lock itself).
        #[arg(long, value_name = "K", default_value_t = 0, value_parser = parse_slot)]
        slot: usize,
        #[command(flatten)]
        common: CommonArgs,
        /// One JSON object a line: status --json's fields, plus "event" and "at" (RFC 3339).
        #[arg(long, env = "LEADERRUN_JSON")]
        json: bool,
    },
    /// Exit 0 if a lock is held now (by the lease with --token, if given), 1 if not.
    ///
    /// Inside a leaderrun child, with no --lock or the child's own lock, it answers from the
    /// parent's lease: no request, no credentials, about 0.3 ms beyond starting leaderrun. It says no once
    /// the parent's stop time has come (the instant the child gets its stop signal), even if
    /// the parent is frozen and cannot answer: `leaderrun check && publish-report`. This
    /// narrows the window in which a child that lost its lease still acts; it does not close
    /// it (a write already on its way still lands): a fencing token checked by the resource
    /// written to closes it. Anywhere else it reads the store, as linearizably as the store
    /// can; a lease only kept for --min-hold (its child has exited) counts as not held there.
    /// A child asking about another lock or slot names the store with --store: LEADERRUN_STORE
    /// does not reach it. Exit status: 0 held, 1 not held, 2 bad usage, 69 the store cannot tell.
    Check {
        /// The lock to ask about. Default: LEADERRUN_LOCK, the lock of the leaderrun whose child
        /// this is.
        #[arg(long, value_name = "NAME")]
        lock: Option<String>,
        /// Say yes only for this fencing token: the lease that token was given with. Default
        /// inside a leaderrun child, for its own lock: LEADERRUN_FENCING_TOKEN.
        #[arg(long, value_name = "N")]
        token: Option<u64>,
        /// Ask about this slot of a lock run with --slots. Default: LEADERRUN_SLOT inside a
        /// leaderrun child, for its own lock; else 0, the lock itself.
        #[arg(long, value_name = "K", value_parser = parse_slot)]
        slot: Option<usize>,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Create the store's table now, or print the statement that does it.
    ///
    /// leaderrun creates its table on first use when it may; for databases whose DBAs create
    /// tables ahead, `--print-sql` (or `--print`) prints the statement to run (and the grants
    /// leaderrun needs afterwards are SELECT, INSERT and UPDATE on that table).
    Init {
        #[command(flatten)]
        common: CommonArgs,
        /// Print the statement instead of running it; nothing is connected to or written.
        #[arg(long, visible_alias = "print")]
        print_sql: bool,
    },
}

/// The lock name: shared by the run mode, `status` and `release`.
#[derive(Debug, Args)]
pub struct LockArg {
    /// Name of the lease (1-255 characters, no control characters).
    ///
    /// Every leaderrun that names the same lock in the same store competes for one lease.
    /// Not read from the environment: LEADERRUN_LOCK is what the child receives.
    // An Option only so that the subcommands can stand in for it at the top level;
    // clap enforces it wherever it is required.
    #[arg(long, value_name = "NAME", required = true)]
    lock: Option<String>,
}

impl LockArg {
    pub fn name(&self) -> &str {
        self.lock.as_deref().unwrap_or_default()
    }
}

/// Which slots of a semaphore (`--slots`) `status` and `release` act on.
#[derive(Debug, Args)]
pub struct SlotsArg {
    /// Only this slot (0 is the lock itself).
    #[arg(long, value_name = "K", value_parser = parse_slot, conflicts_with = "slots")]
    pub slot: Option<usize>,
    /// Slots 0 to N-1. Default: slot 0 and each further slot up to the first the store has
    /// never seen (runs take the lowest free slot first).
    #[arg(long, value_name = "N", value_parser = parse_slots)]
    pub slots: Option<usize>,
}

/// Flags every mode shares: where the store is, and how much to say.
#[derive(Debug, Args)]
pub struct CommonArgs {
    #[arg(
        long,
        value_name = "URL",
        env = "LEADERRUN_STORE",
        hide_env_values = true,
        help = store_help(),
        long_help = store_long_help()
    )]
    pub store: Option<String>,

    /// Say more: -v logs each step (elected, renewed, released), -vv debug detail.
    #[arg(short, long, action = ArgAction::Count, env = "LEADERRUN_VERBOSE", conflicts_with = "quiet")]
    pub verbose: u8,

    /// Say only errors. By default leaderrun prints nothing unless something went wrong
    /// (a lost conflict is not wrong), so it stays quiet in cron.
    #[arg(short, long, env = "LEADERRUN_QUIET")]
    pub quiet: bool,

    /// Format of leaderrun's own log lines on stderr.
    #[arg(long, value_name = "FORMAT", value_enum, default_value_t = LogFormat::Text, env = "LEADERRUN_LOG_FORMAT")]
    pub log_format: LogFormat,
}

#[derive(Debug, Args)]
pub struct JsonArg {
    /// Print the result as JSON on stdout.
    #[arg(long, env = "LEADERRUN_JSON")]
    pub json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// `leaderrun: level: message key=value`
    Text,
    /// One JSON object per line
    Json,
}

/// Flags of the run mode: `leaderrun --lock NAME -- COMMAND`.
#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub lock: LockArg,

    #[command(flatten)]
    pub common: CommonArgs,

    /// Campaign until elected instead of trying once.
    ///
    /// Without --wait (one-shot, for cron) leaderrun tries once and, if another holder has
    /// the lease, exits at once with --conflict-exit-code without running anything.
    /// With --wait it waits its turn; a release by the holder is noticed within milliseconds.
    #[arg(long, env = "LEADERRUN_WAIT")]
    pub wait: bool,

    /// With --wait: give up after this long, exit with --conflict-exit-code. It bounds the
    /// whole wait, reaching the store included (a store still unreachable then exits 69).
    /// Without --wait it bounds how long a one-shot run watches a lease on a store with no
    /// server-side expiry (Kubernetes, S3) whose holder may have died (at most one ttl, + the
    /// holder's --lock-delay, otherwise), and how long it retries a store that fails for a
    /// moment, such as a cluster
    /// electing a leader (5s otherwise, 15s on a replicated NATS bucket, and at most half of
    /// --min-hold) before it exits 69.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_TIMEOUT")]
    pub timeout: Option<Duration>,

    /// Keep the lease taken until this long after it was acquired, even if the child exits
    /// sooner, so a host whose cron fires a little late does not run the same firing again.
    /// leaderrun does not linger for it: it rewrites the lease's expiry and exits.
    /// Default: 10s in one-shot mode (30s on a replicated NATS bucket), 0 with --wait.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_MIN_HOLD")]
    pub min_hold: Option<Duration>,

    /// Lease duration. A holder that cannot renew for this long loses the lease; a standby
    /// takes over about this long after a holder dies. Default: 15s, or the longest lease the
    /// store keeps if that is shorter (a ZooKeeper server's maxSessionTimeout, a NATS bucket's
    /// max age; -v says so), or 35s on a NATS bucket replicated on several servers, whose
    /// leader election after a server's loss takes up to 15s.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_TTL")]
    pub ttl: Option<Duration>,

    /// How often the holder renews the lease. Default: a third of --ttl.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_RENEW_EVERY")]
    pub renew_every: Option<Duration>,

    /// Grace between the stop signal and SIGKILL, when the child must stop (lease about to
    /// lapse, lease lost, or leaderrun got SIGINT/SIGTERM). Default: a third of --ttl, at
    /// most 5s.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_KILL_AFTER")]
    pub kill_after: Option<Duration>,

    /// Keep the lock closed this much longer after a holder is lost uncleanly (leaderrun
    /// killed, frozen, or cut off from the store): the store is asked to keep each lease for
    /// --ttl + this, while the holder still stops its child as --ttl alone requires. The next
    /// holder then starts at least this long after the lost holder's child was killed, which
    /// leaves room for writes still in flight from it (a process in uninterruptible sleep, an
    /// NFS write). A release frees the lock at once, as does the end of a --min-hold keep: a
    /// clean exit costs nothing. On a store with no server-side expiry (Kubernetes, S3, Cloud
    /// Storage, Datastore) standbys watch a lease for --ttl + this before they take it. The
    /// store's own limit on a lease applies to --ttl + this (without --ttl, a run picks a ttl
    /// that fits). --ttl + this is at most 1 day.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "0s", env = "LEADERRUN_LOCK_DELAY")]
    pub lock_delay: Duration,

    /// How far apart the wall clocks of the store's servers may be, for stores that judge
    /// expiry on them (PostgreSQL, MySQL, Redis, NATS, Azure Blob): after a failover to a
    /// replica whose clock runs ahead, leases end that much early, so the holder stops its
    /// child that much sooner. Keep the servers NTP-synced and set this to the worst offset you allow.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "500ms", env = "LEADERRUN_SERVER_CLOCK_SKEW")]
    pub server_clock_skew: Duration,

    /// Signal that asks the child's process group to stop (name or number: TERM, SIGINT, 15).
    #[arg(long, value_name = "SIG", value_parser = parse_signal_arg, default_value = "TERM", env = "LEADERRUN_SIGNAL")]
    pub signal: nix::sys::signal::Signal,

    /// This run's identity as shown by `leaderrun status`. Default: HOST:PID:RANDOM.
    ///
    /// Safety never rests on it (renewals are matched on the fencing token), but keep it
    /// unique so that status output is useful: with a chosen identity, a lease granted to an
    /// acquire whose answer never came (or came as a timeout or a reset) is left to expire
    /// rather than given back, since another run may share the identity. Not read from the environment: LEADERRUN_IDENTITY
    /// is what the child receives.
    #[arg(long, value_name = "STR")]
    pub identity: Option<String>,

    /// Let up to N children of the lock run at once across the fleet: a semaphore of N slots.
    ///
    /// Each slot is a lease of its own, with its own fencing token; the child learns its slot
    /// from LEADERRUN_SLOT (0 to N-1). A one-shot run takes the lowest free slot, else exits
    /// with --conflict-exit-code; with --wait it waits for every slot at once and takes the
    /// first that frees. Runs that name the same lock with a different --slots share the slots
    /// by number: a run only takes slots below its own N, so no more children run than the
    /// largest --slots in use. Slot 0 is the lock itself: --slots 1 is a plain lock.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = parse_slots, env = "LEADERRUN_SLOTS")]
    pub slots: usize,

    /// Stop the child once it has run this long: --signal, then SIGKILL after --kill-after,
    /// as timeout(1) does, and exit 124. The lease is then released (kept for --min-hold in
    /// one-shot mode), unless its stop time passed while the child wound down (renewals
    /// failing): that is a lost lease, exit 75. The watchdog keeps this limit too, so a frozen
    /// leaderrun cannot extend it.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, env = "LEADERRUN_MAX_RUNTIME")]
    pub max_runtime: Option<Duration>,

    /// Serve /healthz, /readyz and /metrics (Prometheus) on ADDR (HOST:PORT, or :PORT for
    /// every interface), in leaders and standbys alike.
    ///
    /// /healthz is 200 while the run goes on and the store answered within the last ttl;
    /// /readyz is 200 only while this run holds the lease and its child runs (a Kubernetes
    /// readinessProbe then routes a Service to the leader alone). A standby then reads the
    /// lock at least every ttl/2, so that its health means something. Nothing is served without it.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen_addr, env = "LEADERRUN_HTTP")]
    pub http: Option<std::net::SocketAddr>,

    /// While this run leads, keep PATH holding {"lock", "slot", "identity", "token", "since"} as JSON,
    /// replaced whole at each change. It is removed when leadership ends, before leaderrun
    /// exits (by the watchdog if leaderrun itself dies). Its directory must exist.
    #[arg(long, value_name = "PATH", env = "LEADERRUN_LEADER_FILE")]
    pub leader_file: Option<std::path::PathBuf>,

    /// Exit status when the lease is held by another (one-shot) or --timeout runs out.
    #[arg(short = 'E', long, value_name = "N", default_value_t = 0, env = "LEADERRUN_CONFLICT_EXIT_CODE")]
    pub conflict_exit_code: u8,

    /// The command to run while holding the lease, and its arguments. Put `--` before it.
    #[arg(value_name = "COMMAND", trailing_var_arg = true)]
    pub command: Vec<OsString>,
}

/// Parse a humantime duration (`1500ms`, `15s`, `2m`, `1h 30m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("empty duration (write e.g. 15s, 1500ms, 2m)".into());
    }
    if trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{trimmed}' has no unit (write e.g. {trimmed}s or {trimmed}ms)"));
    }
    let duration = humantime::parse_duration(trimmed)
        .map_err(|e| format!("'{trimmed}' is not a duration ({e}; write e.g. 15s, 1500ms, 2m)"))?;
    if duration > LONGEST_DURATION {
        return Err(format!("'{trimmed}' is longer than any duration leaderrun takes (at most 100 years)"));
    }
    Ok(duration)
}

/// Longest duration any flag takes. Each flag has its own, shorter bound where one makes
/// sense (a day for --ttl, a month for --timeout); this one keeps every sum of a few
/// durations and a clock reading far from overflowing, for flags without a bound of their own
/// (--max-runtime) and for sums checked only after them (--ttl + --lock-delay).
pub const LONGEST_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// HOST:PORT, or :PORT for every interface (as Prometheus' exporters take it).
fn parse_listen_addr(text: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let text = text.trim();
    let full = if text.starts_with(':') { format!("0.0.0.0{text}") } else { text.to_string() };
    match full.to_socket_addrs() {
        Ok(mut addrs) => addrs.next().ok_or_else(|| format!("'{text}' names no address")),
        Err(_) => Err(format!("'{text}' is not HOST:PORT or :PORT (write e.g. 127.0.0.1:9090 or :9090)")),
    }
}

/// --slots: a count from 1 to `slots::MAX_SLOTS`.
fn parse_slots(text: &str) -> Result<usize, String> {
    let max = crate::slots::MAX_SLOTS;
    match text.trim().parse::<usize>() {
        Ok(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("'{text}' is not a number of slots from 1 to {max}")),
    }
}

/// --slot: a slot number, from 0 to `slots::MAX_SLOTS` - 1.
fn parse_slot(text: &str) -> Result<usize, String> {
    let max = crate::slots::MAX_SLOTS - 1;
    match text.trim().parse::<usize>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(format!("'{text}' is not a slot number from 0 to {max}")),
    }
}

fn parse_signal_arg(text: &str) -> Result<nix::sys::signal::Signal, String> {
    parse_signal(text)
}

/// The clap command, for the man page, completions and tests.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// What parsing produced: a parsed command line, or what to print and the status to exit with.
pub enum Parsed {
    Cli(Box<Cli>),
    Exit { message: String, to_stdout: bool, code: u8 },
}

/// Parse the command line; turn clap's multi-line errors into one line.
pub fn parse<I, T>(args: I) -> Parsed
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    match Cli::try_parse_from(args) {
        Ok(cli) => Parsed::Cli(Box::new(cli)),
        Err(err) => {
            use clap::error::ErrorKind::*;
            match err.kind() {
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand => Parsed::Exit {
                    message: err.render().to_string(),
                    to_stdout: !matches!(err.kind(), DisplayHelpOnMissingArgumentOrSubcommand),
                    code: if matches!(err.kind(), DisplayHelpOnMissingArgumentOrSubcommand) { exit::USAGE } else { 0 },
                },
                _ => Parsed::Exit { message: one_line(&err.render().to_string()), to_stdout: false, code: exit::USAGE },
            }
        }
    }
}

/// clap renders `error: ...`, context lines, a usage block and a hint; keep the error and
/// its context on one line.
fn one_line(rendered: &str) -> String {
    let mut parts = Vec::new();
    for line in rendered.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if line.is_empty() {
            continue;
        }
        let line = line.strip_prefix("error: ").unwrap_or(line);
        if !line.starts_with("tip:") {
            parts.push(line.to_string());
        }
    }
    let mut text = parts.join(" ");
    text.push_str(" (see leaderrun --help)");
    text
}
