//! The prose of `--help` and the man page that is not a flag's own: exit statuses, the
//! child's environment, the safety contract, the stores and examples. `cli.rs` lays them
//! out for `--help`; `tests/generated_docs.rs` writes them into the man page.

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
        "Also zookeeper://. The lease is a ZooKeeper session whose timeout is the ttl (+ --lock-delay) + 25% + the servers' tick \
         (at most half the timeout they grant a 4 s session): an ephemeral sequential child of the lock's node, \
         the lowest child holding it; the fencing token is its sequence number + 1. Expiry is judged by the \
         ZooKeeper leader; a --ttl whose session the server's maxSessionTimeout does not allow is refused \
         (without --ttl, a run picks one that fits, with its --lock-delay). Renewals sync and read the child on its own session; \
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
    ("leaderrun --lock crawl --slots 3 --wait -- ./crawler", "A semaphore: at most three crawlers run across the fleet, each told its slot in LEADERRUN_SLOT; a standby takes the first slot that frees."),
    ("leaderrun --lock ledger --wait --lock-delay 30s -- ./writer", "As above, but after a holder dies or is cut off nobody takes over until 30s after its lease ends: room for writes its killed child still had in flight (an NFS write, a process in uninterruptible sleep)."),
    ("leaderrun status --lock billing", "Who holds it, with which fencing token, since when, for how much longer."),
    ("leaderrun release --lock billing", "Make the holder stand down: its child is stopped at its next renewal."),
];
