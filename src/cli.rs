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

/// Exit statuses: (status, meaning). Shown by `--help` and as the man page's EXIT STATUS.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("c", "The child exited with status c: the child's status is passed through."),
    ("128+n", "The child was killed by signal n (a SIGKILLed child gives 137), or leaderrun itself got signal n while still waiting for the lease."),
    ("0 (-E)", "Another holder has the lease (one-shot), or --wait --timeout ran out. Change it with -E/--conflict-exit-code."),
    ("2", "Bad usage or configuration; one line names the flag or the rule. Nothing was written to the store."),
    ("69", "The store could not be reached, opened or used before the child started (a one-shot run retries a store that fails for a moment for up to 5s, or --timeout, first)."),
    ("70", "Internal error: the watchdog could not be started (the child was not started either), or leaderrun's own output could not be written."),
    ("75", "The lease was lost while the child ran (taken by another holder, force-released, or not renewed in time); the child was stopped."),
    ("124", "The child ran for --max-runtime and was stopped (--signal, then SIGKILL after --kill-after), as timeout(1) reports it."),
    ("126", "COMMAND was found but could not be executed."),
    ("127", "COMMAND was not found."),
    ("1", "From leaderrun status and leaderrun check: the lock is free, or not held by that token (0: held). From leaderrun release: the lock was not held (0: released)."),
];

/// Variables leaderrun sets for the child: (name, meaning).
pub const CHILD_ENVIRONMENT: &[(&str, &str)] = &[
    ("LEADERRUN_LOCK", "The lock name."),
    ("LEADERRUN_IDENTITY", "This run's identity."),
    ("LEADERRUN_FENCING_TOKEN", "An integer that strictly increases with every acquisition of this lock name. Pass it to whatever the child writes so that stale writers can be refused."),
    ("LEADERRUN_LEASE_FILE", "A small file holding the parent's stop time on CLOCK_BOOTTIME and the token, which `leaderrun check` in the child reads instead of the store."),
];

/// Said once, after the child's variables.
pub const CHILD_ENVIRONMENT_NOTE: &str = "These always override inherited variables of the same names. \
Because of that, --lock and --identity are never read from the environment: a nested leaderrun \
would otherwise silently inherit its parent's lock. Every other option can be set by the \
LEADERRUN_* variable named in its description.";

/// The safety contract, in paragraphs.
pub const SAFETY_CONTRACT: &[&str] = &[
    "Assuming the store's compare-and-set is linearizable and never rolls back a write it acknowledged, \
every machine's elapsed-time clock runs within 1% of real time, leaderrun is not frozen together \
with its child for longer than the margin (a VM pause freezes both: only the fencing token covers \
that), and, for stores that judge expiry on their servers' wall clocks (PostgreSQL, MySQL, Redis, \
NATS), the servers that may replace each other in a failover keep clocks within --server-clock-skew, \
at most one child process tree runs at any moment for one lock name.",
    "leaderrun reads its clock (CLOCK_BOOTTIME) just before it sends an acquire or renew request; only a \
confirmed success moves its deadline, to that instant + ttl x 0.98 - 100ms (- --server-clock-skew on \
those stores). A renewal that times out, fails or is ambiguous never moves it; one unanswered for half \
the time left before the stop signal gets a second request beside it. The child's process \
group gets --signal at deadline - --kill-after and SIGKILL at the deadline; when the store says the \
lease is someone else's, --signal goes at once.",
    "On a store with no server-side expiry (Kubernetes Leases, S3 and Cloud Storage objects, Datastore entities) a standby takes a held lease only after it \
has itself seen the record unchanged for ttl x 1.02 + 100ms on its own clock (the holder's ttl, as the \
record states it), or at once when its holder released it. A one-shot run watches a held lease for at \
most that long (or --timeout): a change means its holder is alive, and the run gives up.",
    "An acquire whose answer never came (a timeout, a signal) may still have been granted: leaderrun \
gives such a lease back, found by its own identity (with a chosen --identity, which another run may \
share, it is left to expire). A process in uninterruptible sleep (D state, e.g. on a hung NFS mount) \
can finish a write after SIGKILL: only the fencing token, checked by whatever it writes to, covers that.",
    "A separate watchdog process enforces the deadline even when leaderrun itself is SIGKILLed, crashes or \
is SIGSTOPped; if the watchdog dies, leaderrun starts another or stops the child. When the child exits, \
what is left of its tree is stopped too before the lease is released. Where cgroup v2 is writable (root, \
a delegated systemd unit) the tree is the child's own cgroup, which setsid or a double fork cannot leave; \
elsewhere it is the process group, which they can. A child running as another user (sudo) cannot be \
signalled without a cgroup; leaderrun says so.",
];

/// The stores: (URL, what it guarantees and what it does not).
pub const STORES: &[(&str, &str)] = &[
    (
        "sqlite:///path/to/file.db",
        "The embedded default: one file, one host, any number of processes. Each step is one SQL statement under \
         SQLite's write lock; expiry is judged on CLOCK_BOOTTIME and a lease from before a reboot is void, which \
         needs the kernel's boot id (/proc/sys/kernel/random/boot_id): without it the store is refused (69). An \
         acquisition is synced to disk before it counts, so a power loss cannot repeat a fencing token. Waiters \
         queue in the kernel on FILE-wake beside it instead of polling. Never put \
         the file on a network filesystem. Deleting the file under a holder frees its lock and restarts tokens.",
    ),
    (
        "postgres://user:pass@host:5432/db?sslmode=verify-full&table=NAME",
        "Also postgresql://; PGHOST, PGPORT, PGUSER, PGPASSWORD, PGDATABASE, PGSSLMODE and ~/.pgpass are honoured. \
         Each step is one statement (INSERT ... ON CONFLICT ... WHERE free or expired); expiry is judged on the \
         server's clock_timestamp(), so the server's clock must be slewed, never stepped. A release wakes the waiter \
         that has waited longest through LISTEN/NOTIFY; if it does not act (frozen, or its host \
         gone), the others try after a stagger of at most 300 ms. A transaction-pooling proxy does not pass LISTEN/NOTIFY: waiters then re-read when the lease \
         they saw would expire. No advisory locks. An asynchronous replica promoted after a failover may have lost the latest \
         acquisition or renewal: use synchronous replication for leases that matter. URL parameters other than \
         table= and libpq's sslmode, sslrootcert, sslcert, sslkey, options, application_name (and the like) are \
         refused.",
    ),
    (
        "mysql://user:pass@host:3306/db?ssl-mode=VERIFY_IDENTITY&table=NAME",
        "Also mariadb://. A conditional UPDATE whose affected-row count decides, on the server's UTC_TIMESTAMP(6); \
         the holder keeps a user-level lock (GET_LOCK) that waiters block on, one connection each, and a second \
         one for the waiter that ends the session of a waiter frozen at its turn (a hint only: a lease is still \
         taken over at its expiry). The same caveats about the server's clock and asynchronous replicas apply. \
         URL parameters other than table=, ssl-mode, ssl-ca, ssl-cert, ssl-key and socket are refused.",
    ),
    (
        "redis://[user]:pass@host:6379/0?prefix=leaderrun: (rediss:// for TLS)",
        "Lua scripts on one server (no Cluster); the lease is the key's PX expiry on the server's clock, the \
         fencing token an INCR counter; a release wakes the waiter blocked longest in BLPOP (one connection each). Redis loses keys on a restart \
         unless it runs with appendonly yes and appendfsync always, and replication is asynchronous: for \
         leases that matter, run it with that persistence and no failover. TLS: rediss:// with the system's CAs \
         or ?cacert=FILE, and a client certificate from &cert=FILE&key=FILE. A server whose maxmemory-policy \
         is not noeviction is refused (exit 69), whatever its maxmemory, as is one that shows its policy \
         through neither CONFIG GET nor INFO: it may evict a held lease (a second holder starts) or the token \
         counter (tokens repeat). ?allow-eviction=1 accepts that risk. The policy is read when a run starts: a \
         change under a running holder is not seen. The database is the path (/2); ?protocol=resp3 is also \
         taken; any other parameter is refused.",
    ),
    (
        "etcd://[user:pass@]host:2379[,host2:2379...][/prefix] (etcds:// for TLS)",
        "A lease plus a transaction on the key's create revision (the fencing token: etcd's global revision, \
         so tokens grow but not by one); renewals are keep-alives; waiters queue, and at a release the first in line tries first. Linearizable \
         through the Raft leader; leases last at least 2 s (etcd's minimum). List every member: a request goes \
         to a member that answers and is not busy with this run, a copy to the next when it hangs, so a \
         member's loss costs no lease at a --ttl of 11s or more. TLS: etcds:// (or ?tls=1) with the \
         system's CAs or ?cacert=FILE, and a client certificate from &cert=FILE&key=FILE.",
    ),
    (
        "nats://[user:pass@|token@]host:4222[,host2:4222...][/BUCKET][?replicas=N&creds=FILE&tls=1&tlsca=FILE]",
        "One key per lock in a JetStream KV bucket (default leaderrun, created with per-message TTL); writes are \
         compare-and-sets on the key's last revision, the fencing token is the acquiring write's revision \
         (tokens grow but not by one), the lease a Nats-TTL rounded up to seconds, waiters watch the key, and a queue group on its subject picks the one that tries first at a release (the others \
         try 100–300 ms later if nobody has). The \
         value is the holder's identity, as Choria writes it: with /CHORIA_LEADER_ELECTION, Choria's tools show \
         the leaderrun holder, and deleting the key (Choria's evict) stops it at its next renewal. In a bucket \
         without per-message TTL (Choria's) leaderrun wins as Choria does: it waits one campaign interval \
         (0.75 x max age) + 200 ms and confirms with an update before the child starts, and its --ttl is at \
         most that interval + 200 ms, so evicted holders never overlap standbys; --min-hold is at most the max \
         age. A --ttl that does not fit is refused (status 2; without --ttl, a run picks one that fits). Needs \
         jetstream { \
         sync_interval: always } to keep acknowledged writes across a crash, and replicas=3 in a cluster; expiry \
         follows the server's wall clock. In a cluster a run keeps two connections, to two servers, and sends \
         a request again over the other when one hangs; the bucket stream's leader election after a crash \
         takes 4-14 s, so the defaults there are --ttl 35s, --min-hold 30s and a 15 s one-shot retry.",
    ),
    (
        "zk://[user:pass@]host:2181[,host2:2181...][/path][?tls=1&cacert=FILE]",
        "Also zookeeper://. The lease is a ZooKeeper session whose timeout is the ttl + 25% + the servers' tick \
         (at most half the timeout they grant a 4 s session): an ephemeral sequential child of the lock's node, \
         the lowest child holding it; the fencing token is its sequence number + 1. Expiry is judged by the \
         ZooKeeper leader; a --ttl whose session the server's maxSessionTimeout does not allow is refused \
         (without --ttl, a run picks one that fits). Renewals sync and read the child on its own session; \
         waiters queue, each watching only the one ahead of it (the first, the holder's child). user:pass is the digest scheme, with creator-only ACLs. --min-hold is \
         judged on wall clocks. Never delete the lock nodes by hand. In an ensemble a session leaves a \
         server that stops answering within a tenth of its timeout. TLS: ?tls=1&cacert=FILE (the \
         secureClientPort), and a client certificate from &cert=FILE&key=FILE.",
    ),
    (
        "k8s://[NAMESPACE][?context=NAME]",
        "Also kubernetes://. One coordination.k8s.io/v1 Lease per lock, written as client-go's LeaseLock writes \
         it (holderIdentity, leaseDurationSeconds, acquireTime, renewTime, leaseTransitions; leaderrun's own \
         fields in leaderrun.dev/ annotations), so kubectl and client-go electors see and respect it. The \
         cluster and credentials are kubectl's: $KUBECONFIG or ~/.kube/config (its current context, or \
         ?context=), else the pod's service account; the namespace is the context's (or the pod's) unless \
         named. Writes carry the Lease's resourceVersion and uid; waiters watch the Lease. The API server \
         expires nothing: a standby takes a held Lease only after seeing it unchanged for ttl*(1+2*drift) + \
         margin on its own clock (after a crash, takeover takes that long from the last renewal it saw; a \
         one-shot run that finds a Lease it has not seen before may watch it that long, bounded by --timeout), \
         and at once when it was released. The fencing token is above every resourceVersion before the \
         acquisition (an etcd revision: tokens grow but not by one). kubectl delete lease frees the lock at \
         once; its holder notices at its next renewal. RBAC: get, list, watch, create and update on leases. A \
         lock name that is not a valid object name becomes leaderrun-sha256-HEX, the name in an annotation.",
    ),
    (
        "s3://BUCKET[/PREFIX][?path-style=1]",
        "One object per lock under PREFIX (default leaderrun/), its key the lock name with %, / and a leading . \
         percent-encoded; its body a small JSON record. Writes are PutObject with If-None-Match: * (create) and \
         If-Match: ETAG (replace), so the server must honour conditional writes (AWS S3 does since 2024; a run \
         checks and refuses a server that ignores them). Credentials, region and endpoint as the AWS CLI finds \
         them (AWS_* variables, AWS_PROFILE and ~/.aws, web identity, ECS, instance metadata); path-style \
         addressing when an endpoint is set. S3 ends no lease: a standby takes a lock whose object it has seen \
         unchanged for ttl x 1.02 + 100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the object \
         frees the lock at once. Fencing tokens follow the server's Date (seconds x 1,000,000), so they outlive a \
         deleted object. A 403 exits 69.",
    ),
    (
        "gs://BUCKET[/PREFIX]",
        "Cloud Storage: one object per lock under PREFIX (default leaderrun/), named as on s3://; the record is the \
         object's custom metadata. Every write is a JSON API multipart upload with ifGenerationMatch=0 (create) or \
         the generation and metageneration read (replace); a run checks that the server honours it and refuses \
         one that does not. Credentials as Google's client libraries find them (GOOGLE_APPLICATION_CREDENTIALS, \
         gcloud auth application-default login, the metadata server); STORAGE_EMULATOR_HOST names an emulator. \
         Cloud Storage ends no lease: a standby takes a lock whose object it has seen unchanged for ttl x 1.02 + \
         100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the object frees the lock at once. \
         Fencing tokens follow the server's Date (seconds x 1,000,000), as on s3://. Google allows about one \
         write per second to one object: keep --renew-every at 1 s or more (--ttl 3s or more). A 401, 403 or \
         missing bucket exits 69.",
    ),
    (
        "datastore://PROJECT[/NAMESPACE][?kind=Lease&database=ID]",
        "Datastore, or Firestore in Datastore mode (the same API; Firestore in Native mode is refused). One \
         entity per lock in the namespace (default: the default namespace), of kind Lease unless ?kind= names \
         another, its key name the lock name (names like __x__ are reserved by Datastore and refused); \
         ?database= names a database other than the default. Credentials are Application Default Credentials \
         (GOOGLE_APPLICATION_CREDENTIALS, gcloud auth application-default login, the metadata server); \
         DATASTORE_EMULATOR_HOST=host:port points at an emulator. A create is an insert; a renewal reads the \
         entity in a transaction and commits it only if it is unchanged (version and a random nonce, with \
         baseVersion as well): a run checks and refuses a server that ignores baseVersion (the Firestore \
         emulator does). Datastore ends no lease: a standby takes a lock whose entity it has seen unchanged for \
         ttl x 1.02 + 100 ms, a waiting standby reads it every 1 to 1.5 s, and deleting the entity frees the lock \
         at once. Fencing tokens follow the entity versions, which only grow, so they outlive a deleted entity. \
         --min-hold is judged on the server's read time (the emulator has none: this host's clock). 401 and 403 \
         exit 69.",
    ),
    (
        "grants",
        "PostgreSQL and MySQL need SELECT, INSERT and UPDATE on the table; CREATE only if leaderrun is to create \
         the table on first use (else run the SQL of leaderrun init --print-sql beforehand). A table made by an \
         earlier leaderrun gets a kept column on first use, which needs the table's owner (or ALTER): leaderrun \
         prints the statement if it may not. Never delete rows or the table by hand: a lock's fencing token would \
         start again at 1, and a holder's lock would be free at once.",
    ),
];

/// Typical command lines: (command, what it does).
pub const EXAMPLES: &[(&str, &str)] = &[
    ("leaderrun --lock nightly-report -- ./report.sh", "In cron on every host: one host runs each firing, the others exit 0 without a word."),
    ("leaderrun --lock deploy --wait --timeout 10m -- ./deploy", "CI pipelines take turns; the one whose turn never came exits with -E's status."),
    ("leaderrun --lock billing --wait -- ./worker", "N replicas stand by; one runs; another takes over within about --ttl if it dies, within milliseconds if it exits."),
    ("leaderrun status --lock billing", "Who holds it, with which fencing token, since when, for how much longer."),
    ("leaderrun release --lock billing", "Make the holder stand down: its child is stopped at its next renewal."),
];

/// The sections above, laid out for `--help` (wrapped here: clap would not keep the indent).
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
    for (url, what) in STORES {
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
    /// Exit status: 0 held, 1 not held, 2 bad usage, 69 the store cannot tell.
    Check {
        /// The lock to ask about. Default: LEADERRUN_LOCK, the lock of the leaderrun whose child
        /// this is.
        #[arg(long, value_name = "NAME")]
        lock: Option<String>,
        /// Say yes only for this fencing token: the lease that token was given with. Default
        /// inside a leaderrun child, for its own lock: LEADERRUN_FENCING_TOKEN.
        #[arg(long, value_name = "N")]
        token: Option<u64>,
        #[command(flatten)]
        common: CommonArgs,
    },
    /// Create the store's table now, or print the SQL that does it.
    ///
    /// leaderrun creates its table on first use when it may; for databases whose DBAs create
    /// tables ahead, `--print-sql` prints the statement to run (and the grants leaderrun
    /// needs afterwards are SELECT, INSERT and UPDATE on that table).
    Init {
        #[command(flatten)]
        common: CommonArgs,
        /// Print the SQL instead of running it; nothing is connected to or written.
        #[arg(long)]
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

/// Flags every mode shares: where the store is, and how much to say.
#[derive(Debug, Args)]
pub struct CommonArgs {
    /// Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db,
    /// mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379,
    /// nats://user:pass@host:4222/BUCKET, zk://host:2181, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,
    /// datastore://PROJECT/NAMESPACE; see STORES.
    ///
    /// Default: an embedded SQLite file in the state directory ($XDG_STATE_HOME/leaderrun/leaderrun.db,
    /// else ~/.local/state/leaderrun/leaderrun.db; /var/lib/leaderrun/leaderrun.db for root),
    /// created on first use, which serves one host only. A password in the URL is never printed.
    #[arg(long, value_name = "URL", env = "LEADERRUN_STORE", hide_env_values = true)]
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
    /// server-side expiry (Kubernetes, S3) whose holder may have died (at most one ttl
    /// otherwise), and how long it retries a store that fails for a moment, such as a cluster
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

    /// How far apart the wall clocks of the store's servers may be, for stores that judge
    /// expiry on them (PostgreSQL, MySQL, Redis, NATS): after a failover to a replica whose
    /// clock runs ahead, leases end that much early, so the holder stops its child that much
    /// sooner. Keep the servers NTP-synced and set this to the worst offset you allow.
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

    /// Stop the child once it has run this long: --signal, then SIGKILL after --kill-after,
    /// as timeout(1) does, and exit 124. The lease is then released (kept for --min-hold in
    /// one-shot mode). The watchdog keeps this limit too, so a frozen leaderrun cannot
    /// extend it.
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

    /// While this run leads, keep PATH holding {"lock", "identity", "token", "since"} as JSON,
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
    humantime::parse_duration(trimmed)
        .map_err(|e| format!("'{trimmed}' is not a duration ({e}; write e.g. 15s, 1500ms, 2m)"))
}

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
