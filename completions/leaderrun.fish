# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_leaderrun_global_optspecs
    string join \n lock= store= v/verbose q/quiet log-format= wait timeout= min-hold= ttl= renew-every= kill-after= lock-delay= server-clock-skew= signal= identity= slots= max-runtime= http= leader-file= E/conflict-exit-code= h/help V/version
end

function __fish_leaderrun_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_leaderrun_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_leaderrun_using_subcommand
    set -l cmd (__fish_leaderrun_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lock -d 'Name of the lease (1-255 characters, no control characters)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l timeout -d 'With --wait: give up after this long, exit with --conflict-exit-code. It bounds the whole wait, reaching the store included (a store still unreachable then exits 69). Without --wait it bounds how long a one-shot run watches a lease on a store with no server-side expiry (Kubernetes, S3) whose holder may have died (at most one ttl, + the holder\'s --lock-delay, otherwise), and how long it retries a store that fails for a moment, such as a cluster electing a leader (5s otherwise, 15s on a replicated NATS bucket, and at most half of --min-hold) before it exits 69' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l min-hold -d 'Keep the lease taken until this long after it was acquired, even if the child exits sooner, so a host whose cron fires a little late does not run the same firing again. leaderrun does not linger for it: it rewrites the lease\'s expiry and exits. Default: 10s in one-shot mode (30s on a replicated NATS bucket), 0 with --wait' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l ttl -d 'Lease duration. A holder that cannot renew for this long loses the lease; a standby takes over about this long after a holder dies. Default: 15s, or the longest lease the store keeps if that is shorter (a ZooKeeper server\'s maxSessionTimeout, a NATS bucket\'s max age; -v says so), or 35s on a NATS bucket replicated on several servers, whose leader election after a server\'s loss takes up to 15s' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l renew-every -d 'How often the holder renews the lease. Default: a third of --ttl' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l kill-after -d 'Grace between the stop signal and SIGKILL, when the child must stop (lease about to lapse, lease lost, or leaderrun got SIGINT/SIGTERM). Default: a third of --ttl, at most 5s' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l lock-delay -d 'Keep the lock closed this much longer after a holder is lost uncleanly (leaderrun killed, frozen, or cut off from the store): the store is asked to keep each lease for --ttl + this, while the holder still stops its child as --ttl alone requires. The next holder then starts at least this long after the lost holder\'s child was killed, which leaves room for writes still in flight from it (a process in uninterruptible sleep, an NFS write). A release frees the lock at once, as does the end of a --min-hold keep: a clean exit costs nothing. On a store with no server-side expiry (Kubernetes, S3, Cloud Storage, Datastore) standbys watch a lease for --ttl + this before they take it. The store\'s own limit on a lease applies to --ttl + this (without --ttl, a run picks a ttl that fits). --ttl + this is at most 1 day' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l server-clock-skew -d 'How far apart the wall clocks of the store\'s servers may be, for stores that judge expiry on them (PostgreSQL, MySQL, Redis, NATS, Azure Blob): after a failover to a replica whose clock runs ahead, leases end that much early, so the holder stops its child that much sooner. Keep the servers NTP-synced and set this to the worst offset you allow' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l signal -d 'Signal that asks the child\'s process group to stop (name or number: TERM, SIGINT, 15)' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l identity -d 'This run\'s identity as shown by `leaderrun status`. Default: HOST:PID:RANDOM' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l slots -d 'Let up to N children of the lock run at once across the fleet: a semaphore of N slots' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l max-runtime -d 'Stop the child once it has run this long: --signal, then SIGKILL after --kill-after, as timeout(1) does, and exit 124. The lease is then released (kept for --min-hold in one-shot mode), unless its stop time passed while the child wound down (renewals failing): that is a lost lease, exit 75. The watchdog keeps this limit too, so a frozen leaderrun cannot extend it' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l http -d 'Serve /healthz, /readyz and /metrics (Prometheus) on ADDR (HOST:PORT, or :PORT for every interface), in leaders and standbys alike' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l leader-file -d 'While this run leads, keep PATH holding {"lock", "slot", "identity", "token", "since"} as JSON, replaced whole at each change. It is removed when leadership ends, before leaderrun exits (by the watchdog if leaderrun itself dies). Its directory must exist' -r -F
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s E -l conflict-exit-code -d 'Exit status when the lease is held by another (one-shot) or --timeout runs out' -r
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -l wait -d 'Campaign until elected instead of trying once'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -s V -l version -d 'Print version'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "status" -d 'Show who holds a lock: holder identity, fencing token, held since, expires in'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "list" -d 'List every lock in the store, held or free'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "release" -d 'Force the holder of a lock to stand down'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "watch" -d 'Follow a lock: print its state, then one line at each change, until SIGINT or SIGTERM'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "check" -d 'Exit 0 if a lock is held now (by the lease with --token, if given), 1 if not'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "init" -d 'Create the store\'s table now, or print the statement that does it'
complete -c leaderrun -n "__fish_leaderrun_needs_command" -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l lock -d 'Name of the lease (1-255 characters, no control characters)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l slot -d 'Only this slot (0 is the lock itself)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l slots -d 'Slots 0 to N-1. Default: slot 0 and each further slot up to the first the store has never seen (runs take the lowest free slot first)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -l json -d 'Print the result as JSON on stdout'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand status" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -l json -d 'Print the result as JSON on stdout'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand list" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l lock -d 'Name of the lease (1-255 characters, no control characters)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l slot -d 'Only this slot (0 is the lock itself)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l slots -d 'Slots 0 to N-1. Default: slot 0 and each further slot up to the first the store has never seen (runs take the lowest free slot first)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -l json -d 'Print the result as JSON on stdout'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand release" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l lock -d 'Name of the lease (1-255 characters, no control characters)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l slot -d 'Follow this slot of a lock run with --slots (0 is the lock itself)' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -l json -d 'One JSON object a line: status --json\'s fields, plus "event" and "at" (RFC 3339)'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand watch" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l lock -d 'The lock to ask about. Default: LEADERRUN_LOCK, the lock of the leaderrun whose child this is' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l token -d 'Say yes only for this fencing token: the lease that token was given with. Default inside a leaderrun child, for its own lock: LEADERRUN_FENCING_TOKEN' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l slot -d 'Ask about this slot of a lock run with --slots. Default: LEADERRUN_SLOT inside a leaderrun child, for its own lock; else 0, the lock itself' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -l store -d 'Store holding the leases, as a URL: sqlite:///path/file.db, postgres://user:pass@host:5432/db, mysql://user:pass@host:3306/db (or mariadb://), redis://:pass@host:6379/0, etcd://host:2379, nats://user:pass@host:4222/BUCKET, zk://host:2181, k8s://NAMESPACE, s3://BUCKET/PREFIX, dynamodb://TABLE, gs://BUCKET/PREFIX, datastore://PROJECT/NAMESPACE, azblob://ACCOUNT/CONTAINER/PREFIX; see STORES' -r
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -l log-format -d 'Format of leaderrun\'s own log lines on stderr' -r -f -a "text\t'`leaderrun: level: message key=value`'
json\t'One JSON object per line'"
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s v -l verbose -d 'Say more: -v logs each step (elected, renewed, released), -vv debug detail'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s q -l quiet -d 'Say only errors. By default leaderrun prints nothing unless something went wrong (a lost conflict is not wrong), so it stays quiet in cron'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -l print-sql -l print -d 'Print the statement instead of running it; nothing is connected to or written'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand init" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "status" -d 'Show who holds a lock: holder identity, fencing token, held since, expires in'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "list" -d 'List every lock in the store, held or free'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "release" -d 'Force the holder of a lock to stand down'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "watch" -d 'Follow a lock: print its state, then one line at each change, until SIGINT or SIGTERM'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "check" -d 'Exit 0 if a lock is held now (by the lease with --token, if given), 1 if not'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "init" -d 'Create the store\'s table now, or print the statement that does it'
complete -c leaderrun -n "__fish_leaderrun_using_subcommand help; and not __fish_seen_subcommand_from status list release watch check init help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
