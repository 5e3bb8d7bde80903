//! Redis store: `--store redis://[user:pass@]host[:port][/db][?prefix=PREFIX]`, or
//! `rediss://` for TLS (rustls; the system's CAs unless `?cacert=FILE`, and a client
//! certificate with `&cert=FILE&key=FILE`, as redis-cli names them); or, for a master that
//! Sentinels choose, `redis+sentinel://[user:pass@]host1[:26379][,host2...]/SERVICE[/db]`
//! (`rediss+sentinel://` for TLS; `sentinel.rs`). `?allow-eviction=1` opens a server that may
//! evict keys (`eviction.rs`); `?protocol=resp3` is the redis crate's; any other parameter is
//! refused (`target.rs`).
//!
//! Keys, under a prefix (`?prefix=`, default `leaderrun:`; the lock name follows verbatim,
//! Redis keys are binary-safe):
//!
//! - `{prefix}lock:{name}`: a hash {holder, token, acquired_ms, revoked, kept} whose expiry
//!   (PX) is the lease. The key exists exactly while the lock is taken. `revoked`: `leaderrun
//!   release` asked the holder to stand down; `kept`: the holder's child has exited and the
//!   lock is only kept for --min-hold, so `leaderrun release` frees it at once.
//! - `{prefix}token:{name}`: the counter INCR draws fencing tokens from; never expires,
//!   never deleted, so a token is never handed out twice.
//! - `{prefix}locks`: a set of every lock name ever taken, for `list`.
//! - `{prefix}epoch`: the epoch mark, a hash with no expiry (`scripts.rs`, `EPOCH`): the
//!   replication id leases were last granted under, so that a failover is noticed.
//!
//! Every call is one Lua script, so each is an atomic compare-and-set on the server, and
//! every timestamp is the server's (`TIME`): no client clock is ever compared with it.
//!
//! What Redis cannot promise, and what to do about it:
//!
//! - Expiry is judged on the server's clock. Redis stores an expiry as an absolute Unix
//!   time, so a step of the server's wall clock shortens or lengthens every lease: slew
//!   it, never step it, while leases are held (NTP/chrony slew by default).
//! - Without the append-only file a restart forgets every lease, and a second holder could start
//!   beside a child that still runs; the token counter would restart too, and fencing
//!   tokens repeat. For leases that matter run Redis with
//!   `--appendonly yes --appendfsync always`: with `everysec` (the default) an
//!   acknowledged acquisition can still be lost in a crash of the host.
//! - Replication is asynchronous: a failover to a replica can lose the latest acquisitions.
//!   The acquire script notices the new primary (its `master_replid`) and grants nothing until
//!   every lease of the old one could have ended, and its tokens jump above the old ones
//!   (`scripts.rs`). Redis Cluster is not supported (each script touches keys in more than one
//!   slot).
//! - Under any `maxmemory-policy` but `noeviction` Redis may evict a held lease or the
//!   token counter: such a server is refused when the store opens (`eviction.rs`).
//!
//! Wake-ups (`wake.rs`): a release (not an expiry) pushes one element onto the list
//! `{prefix}wake:{name}`, and a waiter blocks in `BLPOP` on it, on a connection of its own
//! opened on its first wait and kept: Redis hands the element to the one waiter blocked
//! longest, so a release wakes one waiter, not all of them. A release is also announced with
//! `PUBLISH {prefix}released <name>`, which older leaderrun waiters subscribe to, and so do
//! waiters whose user may not run BLPOP. Either is only a hint: an expiry is never announced,
//! and the elector re-reads when the lease it last saw would expire. `leaderrun watch`
//! subscribes to that channel too, on which a take, a keep and a revoke are also published
//! (`observe.rs`); it never touches a wake list.
//!
//! Calls go through one connection per store (`link.rs`): at one address a
//! `ConnectionManager`, which reconnects by itself after a server restart; behind Sentinels a
//! connection to the master they name, dropped after a failure so that the next call asks
//! them again. Either way the first call after a failure fails, as unavailable; the elector
//! retries.
//!
//! Commands used: `CONFIG GET maxmemory-policy` (or `INFO memory`) when the store opens,
//! `EVALSHA` and, when the server does not know a script yet, `SCRIPT LOAD`; the acquire
//! script runs `INFO replication` (and, after a restart, `INFO persistence`); waiters add
//! `BLPOP` (or, without it, `HELLO 3` and `SUBSCRIBE`); `leaderrun watch` adds `HELLO 3` and
//! `SUBSCRIBE`; behind Sentinels, `ROLE` (or `INFO replication`) on the master, and the
//! Sentinels' `SENTINEL MASTERS` and `ROLE`. Keys touched: `{prefix}*` only (an ACL user needs
//! `~{prefix}*`, `&{prefix}released`, `+blpop`, `+info`, and `+role` behind Sentinels).
//!
//! A password never appears in a message: messages are built from `url::redact(url)` and
//! the error's own text, never from the redis crate's connection info.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushInfo, PushKind, RedisError, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Mutex;

use super::release_feed::{self, Heard, ReleaseFeed};
use super::Access;
use super::{Acquire, Lease, LockRecord, Observing, Renew, Result, Store, StoreError};
pub use kind::KIND;
use link::Link;
use observe::Changes;
use scripts::Scripts;
pub use target::Target;
use wake::{Waker, Woke};

mod eviction;
mod kind;
mod link;
mod observe;
mod scripts;
mod sentinel;
mod target;
mod wake;

/// The key prefix used unless the URL says `?prefix=`.
pub const DEFAULT_PREFIX: &str = "leaderrun:";

/// The epoch mark's key, after the prefix (`scripts.rs`, `EPOCH`): no lock's key is named so.
pub const EPOCH_MARK: &str = "epoch";

/// Bound on connecting and on each answer. The elector bounds every call with its own,
/// usually shorter, timeout; this one only keeps a dead server from holding a connection.
const TIMEOUT: Duration = Duration::from_secs(3);

/// How often a waiter re-reads the lock while it cannot subscribe.
const POLL: Duration = Duration::from_millis(250);

/// After a failed wait, the pause (within the wait's bound) before the caller re-reads, so
/// that a server that is down is not asked in a tight loop.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(250);

/// A connection subscribed to `{prefix}released`, and the messages it received.
struct Subscription {
    /// Kept only to keep the connection open.
    _connection: MultiplexedConnection,
    messages: UnboundedReceiver<PushInfo>,
}

#[async_trait]
impl ReleaseFeed for Subscription {
    async fn next(&mut self) -> Heard {
        match self.messages.recv().await {
            // [channel, payload]: the payload is the released lock's name.
            Some(PushInfo { kind: PushKind::Message, data }) => match data.get(1) {
                Some(Value::BulkString(name)) => Heard::Released(String::from_utf8_lossy(name).into_owned()),
                _ => Heard::Nothing,
            },
            Some(PushInfo { kind: PushKind::Disconnection, .. }) | None => Heard::Lost,
            // Subscription confirmations and the like.
            Some(_) => Heard::Nothing,
        }
    }
}

pub struct RedisStore {
    /// The server, at one address or behind Sentinels (`link.rs`).
    link: Arc<Link>,
    /// The subscription to releases, made on the first `changed` and dropped once a lease
    /// is won (a holder reads no messages, and unread ones would pile up).
    pubsub: Mutex<Option<Subscription>>,
    /// Where waiters block for their turn (`wake.rs`).
    waker: Waker,
    /// A watcher's own subscription (`observe.rs`), made on the first `observe_change`.
    watching: Mutex<Option<Changes>>,
    /// The server refused BLPOP (an ACL without it): wait on the subscription instead.
    no_blpop: AtomicBool,
    scripts: Scripts,
    prefix: String,
    /// The server's scripts cannot run INFO, so they cannot state its epoch (`scripts.rs`):
    /// acquires go on without it, as the store said once.
    epoch_unstated: AtomicBool,
    /// The URL without its password, for messages.
    shown: String,
}

impl RedisStore {
    /// Connect once, so that a bad address or password is reported here, before anything
    /// runs, and refuse a server that may evict keys (unless the URL accepts the risk).
    /// Redis creates nothing ahead of use, so `access` does not matter: looking never
    /// writes. The policy is checked for every command alike, so that `status` and `init`
    /// show the same refusal a run would meet.
    pub async fn open(target: &Target, _access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let link = Arc::new(Link::open(target).await?);
        if !target.allow_eviction {
            let (mut conn, _) = link.connection().await?;
            eviction::refuse_an_evicting_server(&mut conn, &shown).await?;
        }
        let waker = Waker::new(link.clone());
        Ok(Self {
            link,
            pubsub: Mutex::new(None),
            waker,
            watching: Mutex::new(None),
            no_blpop: AtomicBool::new(false),
            scripts: Scripts::new(),
            prefix: target.prefix.clone(),
            epoch_unstated: AtomicBool::new(false),
            shown,
        })
    }

    fn key(&self, kind: &str, lock: &str) -> String {
        format!("{}{kind}:{lock}", self.prefix)
    }

    fn channel(&self) -> String {
        format!("{}released", self.prefix)
    }

    /// Run a script (EVALSHA, loading it on NOSCRIPT) and return its answer.
    async fn run(&self, op: &'static str, invocation: &redis::ScriptInvocation<'_>) -> Result<Value> {
        self.invoke(op, invocation).await?.map_err(|e| error(&self.shown, e))
    }

    /// `run`, with the server's own error kept for the caller to look at: the outer error is
    /// one of reaching the server.
    async fn invoke(
        &self,
        op: &'static str,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<std::result::Result<Value, RedisError>> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        let (mut conn, at) = self.link.connection().await?;
        Ok(invocation.invoke_async(&mut conn).await.inspect_err(|e| self.link.failed(at, e)))
    }

    /// Run the acquire script. A server whose scripts cannot run INFO cannot state its epoch:
    /// the script is run again without it, and the store says so once (as a warning).
    async fn run_acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Value> {
        loop {
            let unstated = self.epoch_unstated.load(Ordering::Relaxed);
            let mut invocation = self.scripts.acquire.prepare_invoke();
            invocation
                .key(self.key("lock", lock))
                .key(self.key("token", lock))
                .key(format!("{}locks", self.prefix))
                .key(format!("{}{EPOCH_MARK}", self.prefix))
                .arg(lock)
                .arg(identity)
                .arg(millis(ttl))
                .arg(self.channel())
                .arg(if unstated { "1" } else { "0" });
            match self.invoke("acquire", &invocation).await? {
                // Another call of this store may have met it first: only one says so.
                Err(err) if err.code() == Some("NOINFO") && !unstated => {
                    if !self.epoch_unstated.swap(true, Ordering::Relaxed) {
                        let why = err.detail().unwrap_or_default().split(" script: ").next().unwrap_or_default();
                        tracing::warn!(
                            "Redis store {}: the server does not let scripts run INFO ({why}), so a failover that \
                             loses leases cannot be noticed; let this user run INFO (+info)",
                            self.shown
                        );
                    }
                }
                answer => return answer.map_err(|e| error(&self.shown, e)),
            }
        }
    }

    /// The record of one lock.
    async fn read(&self, lock: &str) -> Result<LockRecord> {
        let mut invocation = self.scripts.status.prepare_invoke();
        invocation.key(self.key("lock", lock)).key(self.key("token", lock)).arg(lock);
        let value = self.run("status", &invocation).await?;
        record(&items(&value)).ok_or_else(|| self.bad_answer("status", &value))
    }

    fn bad_answer(&self, op: &str, value: &Value) -> StoreError {
        StoreError::refused(format!("Redis store {}: unexpected answer to {op}: {value:?}", self.shown))
    }

    /// Subscribe on a new RESP3 connection: its messages arrive on a channel, and so does
    /// the news that the connection was lost. The message of a failure is one line.
    async fn subscribe(&self) -> std::result::Result<Subscription, String> {
        let (client, at) = self.link.client().await.map_err(|e| e.message)?;
        let failed = |err: RedisError| {
            self.link.failed(at, &err);
            error(&self.shown, err).message
        };
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(settings)).map_err(failed)?;
        let (sender, messages) = tokio::sync::mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_push_sender(sender);
        let mut connection = client.get_multiplexed_async_connection_with_config(&config).await.map_err(failed)?;
        connection.subscribe(self.channel()).await.map_err(failed)?;
        Ok(Subscription { _connection: connection, messages })
    }
}

/// One line, without the password: the URL redacted, then what went wrong.
fn error(shown: &str, err: RedisError) -> StoreError {
    let message = format!("Redis store {shown}: {}", describe(&err));
    if transient(&err) {
        StoreError::unavailable(message)
    } else {
        StoreError::refused(message)
    }
}

/// What went wrong, in one line, from the error itself (never from the connection info).
fn describe(err: &RedisError) -> String {
    let what = match err.kind() {
        _ if tls_refused(err) => format!("TLS: {err}"),
        _ if err.is_io_error() => format!("cannot reach the server: {err}"),
        // The crate keeps only its own summary of the server's WRONGPASS.
        redis::ErrorKind::AuthenticationFailed => {
            "authentication failed: the server refused the user name or password".to_string()
        }
        _ => err.to_string(),
    };
    what.replace(['\n', '\r'], " ")
}

/// Whether the TLS handshake failed for good: a certificate the client does not trust, or
/// one the server refused. rustls reports these as I/O errors, known by their text.
fn tls_refused(err: &RedisError) -> bool {
    err.is_io_error() && super::is_tls_refusal(&err.to_string())
}

/// Whether an error may pass if the call is retried.
fn transient(err: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind};
    match err.kind() {
        _ if tls_refused(err) => false,
        // No Sentinel names a master that is up: a failover under way (a service the Sentinels
        // do not know is refused when the store opens, `sentinel.rs`).
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound | ErrorKind::MasterNameNotFoundBySentinel => true,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly, // a replica, during a failover
        ) => true,
        // BUSY: a script runs too long; MISCONF: snapshots fail, writes are refused until
        // fixed; OOM: maxmemory reached. NOAUTH, WRONGPASS, NOPERM and the rest: refused.
        _ => matches!(err.code(), Some("BUSY" | "MISCONF" | "OOM")) || err.is_timeout(),
    }
}

/// The elements of an array answer.
fn items(value: &Value) -> Vec<Value> {
    match value {
        Value::Array(items) => items.clone(),
        _ => Vec::new(),
    }
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(n) => Some(*n),
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// How many fields `read` returns for a record.
const RECORD_FIELDS: usize = 8;

/// A record from the fields `read` returns.
fn record(fields: &[Value]) -> Option<LockRecord> {
    let [name, held, holder, token, acquired_ms, left_ms, revoked, kept] = fields else {
        return None;
    };
    let name = text(name)?;
    let token = int(token)?.max(0) as u64;
    if int(held)? == 0 {
        return Some(LockRecord { token, ..LockRecord::free(&name) });
    }
    let left_ms = int(left_ms)?;
    Some(LockRecord {
        lock: name,
        holder: Some(text(holder)?),
        token,
        held_since: Some(UNIX_EPOCH + Duration::from_millis(int(acquired_ms)?.max(0) as u64)),
        // -1: no expiry (never set by leaderrun, but possible if someone PERSISTed the key).
        expires_in: (left_ms >= 0).then(|| Duration::from_millis(left_ms as u64)),
        revoked: int(revoked)? == 1,
        campaigner: None,
        kept: int(kept)? == 1,
    })
}

/// Longest duration passed to a script, in ms (about 35,000 years): Lua numbers are
/// doubles, exact only up to 2^53, and `acquired_ms + keep` must stay exact.
const MAX_MS: u128 = 1 << 50;

/// Milliseconds, at least 1 (PEXPIRE 0 would delete the key at once).
fn millis(d: Duration) -> u64 {
    d.as_millis().clamp(1, MAX_MS) as u64
}

#[async_trait]
impl Store for RedisStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let value = self.run_acquire(lock, identity, ttl).await?;
        let fields = items(&value);
        match fields.first().and_then(int) {
            Some(1) => {
                let token = fields.get(1).and_then(int).ok_or_else(|| self.bad_answer("acquire", &value))?;
                // A holder reads no messages: stop listening (see `pubsub`), and waits no more.
                if let Ok(mut pubsub) = self.pubsub.try_lock() {
                    *pubsub = None;
                }
                self.waker.close();
                Ok(Acquire::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token: token as u64 }))
            }
            Some(0) => Ok(Acquire::Held(record(&fields[1..]).ok_or_else(|| self.bad_answer("acquire", &value))?)),
            // A new primary waits out the leases the old one may have granted (`scripts.rs`).
            Some(2) => match (fields.get(1).and_then(int), fields.get(2).and_then(int)) {
                (Some(token), Some(left_ms)) => Ok(Acquire::Held(LockRecord::after_failover(
                    lock,
                    token.max(0) as u64,
                    Duration::from_millis(left_ms.max(0) as u64),
                ))),
                _ => Err(self.bad_answer("acquire", &value)),
            },
            _ => Err(self.bad_answer("acquire", &value)),
        }
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let mut invocation = self.scripts.renew.prepare_invoke();
        invocation
            .key(self.key("lock", &lease.lock))
            .key(self.key("token", &lease.lock))
            .arg(&lease.lock)
            .arg(&lease.identity)
            .arg(lease.token)
            .arg(millis(ttl));
        let value = self.run("renew", &invocation).await?;
        let fields = items(&value);
        match fields.first().and_then(int) {
            Some(1) => Ok(Renew::Renewed),
            Some(0) => Ok(Renew::Lost(record(&fields[1..]))),
            _ => Err(self.bad_answer("renew", &value)),
        }
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let mut invocation = self.scripts.release.prepare_invoke();
        invocation
            .key(self.key("lock", &lease.lock))
            .key(self.key("wake", &lease.lock))
            .arg(&lease.lock)
            .arg(&lease.identity)
            .arg(lease.token)
            .arg(keep.as_millis().min(MAX_MS) as u64)
            .arg(self.channel())
            .arg(wake::WAKE_KEEP_MS);
        self.run("release", &invocation).await.map(drop)
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        self.read(lock).await
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let mut invocation = self.scripts.list.prepare_invoke();
        invocation.key(format!("{}locks", self.prefix)).arg(&self.prefix);
        let value = self.run("list", &invocation).await?;
        let fields = items(&value);
        let mut records = fields
            .chunks(RECORD_FIELDS)
            .map(record)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.bad_answer("list", &value))?;
        records.sort_by(|a, b| a.lock.cmp(&b.lock));
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let mut invocation = self.scripts.revoke.prepare_invoke();
        invocation
            .key(self.key("lock", lock))
            .key(self.key("token", lock))
            .key(self.key("wake", lock))
            .arg(lock)
            .arg(self.channel())
            .arg(wake::WAKE_KEEP_MS);
        let value = self.run("revoke", &invocation).await?;
        let before = record(&items(&value)).ok_or_else(|| self.bad_answer("revoke", &value))?;
        Ok(before.is_held().then_some(before))
    }

    /// Block until a release hands this waiter its turn (`wake.rs`). A release just after our
    /// last read is not missed: its element waits in the list.
    ///
    /// Without BLPOP, wait for a release message naming `lock` instead. Messages that arrive
    /// between two calls wait in the subscription, so a release just after our last read is
    /// not missed; one that came before it only makes this return early (harmless: the caller
    /// re-reads). A subscription that was just made may have missed a release: read once then.
    async fn changed(&self, lock: &str, max_wait: Duration) {
        if !self.no_blpop.load(Ordering::Relaxed) {
            let started = tokio::time::Instant::now();
            match self.waker.wait(&self.key("wake", lock), max_wait).await {
                Ok(Woke::Turn | Woke::Bound) => return,
                // Another task of this process waits on the list: listen beside it.
                Ok(Woke::Busy) => {}
                Err(err) if transient(&err) => {
                    tracing::debug!("waiting for a turn failed: {}", describe(&err));
                    let left = max_wait.saturating_sub(started.elapsed());
                    return tokio::time::sleep(left.min(PAUSE_AFTER_FAILURE)).await;
                }
                Err(err) => {
                    tracing::debug!("cannot wait for a turn, subscribing instead: {}", describe(&err));
                    self.no_blpop.store(true, Ordering::Relaxed);
                }
            }
        }
        let open = || async { self.subscribe().await };
        release_feed::wait_for_release(self, &self.pubsub, open, lock, max_wait, TIMEOUT, POLL).await
    }

    async fn stop_waiting(&self, lock: &str) {
        self.waker.leave(&self.key("wake", lock));
    }

    /// A renewal is not published, and an expiry is silent (`observe.rs`).
    fn observing(&self) -> Observing {
        Observing::PushesWrites
    }

    /// Wait on the watcher's own subscription (`observe.rs`): it pops no wake list.
    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        let open = || async {
            // One line per request at -vvv: the benchmarks count them.
            tracing::trace!(op = "watch", "store request");
            self.subscribe().await.map(Changes)
        };
        release_feed::observe(&self.watching, open, lock, max_wait, TIMEOUT).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records() {
        // name, held, holder, token, acquired ms, left ms, revoked, kept: as the script answers.
        let reply = |holder: &str, [held, token, acquired, left, revoked, kept]: [i64; 6]| {
            let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
            let int = Value::Int;
            vec![s("n"), int(held), s(holder), int(token), int(acquired), int(left), int(revoked), int(kept)]
        };
        let free = reply("", [0, 7, 0, 0, 0, 0]);
        assert_eq!(record(&free).unwrap(), LockRecord { token: 7, ..LockRecord::free("n") });
        let held = record(&reply("a", [1, 3, 1000, 2500, 1, 0])).unwrap();
        assert_eq!((held.holder.as_deref(), held.token, held.revoked, held.kept), (Some("a"), 3, true, false));
        assert_eq!(held.expires_in, Some(Duration::from_millis(2500)));
        assert!(record(&reply("a", [1, 3, 1000, 2500, 0, 1])).unwrap().kept);
        assert!(record(&free[..7]).is_none());
    }
}
