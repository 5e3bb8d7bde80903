//! The prose of `--help` and the man page that is not a flag's own: exit statuses, the
//! child's environment, the safety contract, a note after the stores and examples (each store's
//! own text is in its folder, listed by `store::registry`). `cli.rs` lays them
//! out for `--help`; `tests/generated_docs.rs` writes them into the man page.

/// Exit statuses: (status, meaning). Shown by `--help` and as the man page's EXIT STATUS.
pub const EXIT_STATUS: &[(&str, &str)] = &[
    ("c", "The child exited with status c: the child's status is passed through."),
    ("128+n", "The child was killed by signal n (a SIGKILLed child gives 137), or leaderrun itself got signal n while still waiting for the lease."),
    ("0 (-E)", "Another holder has the lease (one-shot), or --wait --timeout ran out. Change it with -E/--conflict-exit-code."),
    ("2", "Bad usage or configuration; one line names the flag or the rule. Nothing was written to the store."),
    ("69", "The store could not be reached, opened or used before the child started (a one-shot run retries a store that fails for a moment for up to 5s, or --timeout, first), or every lease won ran out before the child could start (this host frozen or starved for longer than --ttl)."),
    ("70", "Internal error: the watchdog could not be started (the child was not started either), or leaderrun's own output could not be written."),
    ("75", "The lease was lost while the child ran (taken by another holder, force-released, or not renewed in time); the child was stopped."),
    ("124", "The child ran for --max-runtime and was stopped (--signal, then SIGKILL after --kill-after), as timeout(1) reports it."),
    ("126", "COMMAND was found but could not be executed."),
    ("127", "COMMAND was not found."),
    ("1", "From leaderrun status and leaderrun check: the lock is free (every slot of it, for status), or not held by that token (0: held). From leaderrun release: the lock was not held (0: released)."),
];

/// Variables leaderrun sets for the child: (name, meaning).
pub const CHILD_ENVIRONMENT: &[(&str, &str)] = &[
    ("LEADERRUN_LOCK", "The lock name."),
    ("LEADERRUN_IDENTITY", "This run's identity."),
    ("LEADERRUN_FENCING_TOKEN", "An integer that strictly increases with every acquisition of this lock name (of this slot, with --slots). Pass it to whatever the child writes so that stale writers can be refused."),
    ("LEADERRUN_SLOT", "The slot the child runs in, 0 to --slots minus 1 (0 for a plain lock). Fencing tokens are per slot: a resource that checks them keys them by lock and slot."),
    ("LEADERRUN_LEASE_FILE", "A small file holding the parent's stop time on CLOCK_BOOTTIME and the token, which `leaderrun check` in the child reads instead of the store."),
];

/// Said once, after the child's variables.
pub const CHILD_ENVIRONMENT_NOTE: &str = "These always override inherited variables of the same names, \
and the child gets no other LEADERRUN_* variable. Every option but --lock and --identity can be set \
by the LEADERRUN_* variable named in its description, and that configures this run only: a leaderrun \
the child starts follows its own flags, not its parent's --slots or --wait, and LEADERRUN_STORE, \
which may hold a password, does not reach the child (a leaderrun there names its store with --store, \
except `leaderrun check` on the child's own lock, which needs none). --lock and --identity are never \
read from the environment, so that a nested leaderrun cannot take its parent's lock from \
LEADERRUN_LOCK. Every variable that is not LEADERRUN_* passes through untouched, the store \
clients' own (PGPASSWORD, AWS_*, KUBECONFIG, ...) included.";

/// The safety contract, in paragraphs.
pub const SAFETY_CONTRACT: &[&str] = &[
    "Assuming the store's compare-and-set is linearizable and never rolls back a write it acknowledged (a \
PostgreSQL, MySQL or Redis replica promoted without the last writes is covered: nothing is granted after \
the failover until every lease of the old primary could have ended), \
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
lease is someone else's, --signal goes at once. Each request asks the store for a lease of ttl + \
--lock-delay; the deadline is the ttl's alone.",
    "On a store with no server-side expiry (Kubernetes Leases, S3 and Cloud Storage objects, Datastore entities) a standby takes a held lease only after it \
has itself seen the record unchanged for ttl x 1.02 + 100ms on its own clock (the holder's ttl + \
--lock-delay, as the record states it), or at once when its holder released it. A one-shot run watches a held lease for at \
most that long (or --timeout): a change means its holder is alive, and the run gives up.",
    "With --slots N, each slot is a lease of its own under this contract: at most one child per slot, so at \
most N at once, and fencing tokens strictly increasing within each slot. Runs that give one lock different \
--slots share the slots by number and each takes only slots below its own N: never more children than the \
largest N in use.",
    "An acquire whose answer never came (a timeout, a signal) may still have been granted: leaderrun \
gives such a lease back, found by its own identity (with a chosen --identity, which another run may \
share, it is left to expire). A process in uninterruptible sleep (D state, e.g. on a hung NFS mount) \
can finish a write after SIGKILL: only the fencing token, checked by whatever it writes to, covers that \
for certain. --lock-delay narrows it: a holder lost uncleanly (killed, frozen, cut off) keeps the lock \
closed that much longer after its lease ends, room for writes still in flight from its killed child; a \
release, or the end of a --min-hold keep, opens it at once.",
    "A separate watchdog process enforces the deadline even when leaderrun itself is SIGKILLed, crashes or \
is SIGSTOPped; if the watchdog dies, leaderrun starts another or stops the child. When the child exits, \
what is left of its tree is stopped too before the lease is released; a process that outlives SIGKILL \
(D state) keeps the lease held and renewed until it is gone. Where cgroup v2 is writable (root, \
a delegated systemd unit) the tree is the child's own cgroup, which setsid or a double fork cannot leave; \
elsewhere it is the process group, which they can. A child running as another user (sudo) cannot be \
signalled without a cgroup; leaderrun says so.",
];

/// What follows the stores' own entries (those are in the store registry): the grants a
/// store with a table needs, as (heading, text).
pub const STORES_NOTE: (&str, &str) = (
    "grants",
    "A store that keeps a table (leaderrun init --print-sql prints it) needs SELECT, INSERT and UPDATE on it; \
     CREATE only if leaderrun is to create the table on first use (else run that SQL beforehand). A table made \
     by an earlier leaderrun gets a kept column on first use, which needs the table's owner (or ALTER): \
     leaderrun prints the statement if it may not. Never delete rows or the table by hand: a lock's fencing \
     token would start again at 1, and a holder's lock would be free at once.",
);

/// Typical command lines: (command, what it does).
pub const EXAMPLES: &[(&str, &str)] = &[
    ("leaderrun --lock nightly-report -- ./report.sh", "In cron on every host: one host runs each firing, the others exit 0 without a word."),
    ("leaderrun --lock deploy --wait --timeout 10m -- ./deploy", "CI pipelines take turns; the one whose turn never came exits with -E's status."),
    ("leaderrun --lock billing --wait -- ./worker", "N replicas stand by; one runs; another takes over within about --ttl if it dies, within milliseconds if it exits."),
    ("leaderrun --lock crawl --slots 3 --wait -- ./crawler", "A semaphore: at most three crawlers run across the fleet, each told its slot in LEADERRUN_SLOT; a standby takes the first slot that frees."),
    ("leaderrun --lock ledger --wait --lock-delay 30s -- ./writer", "As above, but after a holder dies or is cut off nobody takes over until 30s after its lease ends: room for writes its killed child still had in flight (an NFS write, a process in uninterruptible sleep)."),
    ("leaderrun status --lock billing", "Who holds it, with which fencing token, since when, for how much longer."),
    ("leaderrun release --lock billing", "Make the holder stand down: its child is stopped at its next renewal."),
];
