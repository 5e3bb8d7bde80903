//! Redis store: `--store redis://[user:pass@]host[:port][/db][?prefix=PREFIX]`, or
//! `rediss://` for TLS (rustls; the system's CAs unless `?cacert=FILE`, and a client
//! certificate with `&cert=FILE&key=FILE`, as redis-cli names them).
//!
//! Keys, under a prefix (`?prefix=`, default `leaderrun:`; the lock name follows verbatim,
//! Redis keys are binary-safe):
//!
//! - `{prefix}lock:{name}`: a hash {holder, token, acquired_ms, revoked} whose expiry (PX)
//!   is the lease. The key exists exactly while the lock is taken.
//! - `{prefix}token:{name}`: the counter INCR draws fencing tokens from; never expires,
//!   never deleted, so a token is never handed out twice.
//! - `{prefix}locks`: a set of every lock name ever taken, for `list`.
//!
//! Every call is one Lua script, so each is an atomic compare-and-set on the server (A1),
//! and every timestamp is the server's (`TIME`): no client clock is ever compared with it.
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
//! - Replication is asynchronous: a failover to a replica can lose the latest
//!   acquisition or release, which again could let a second holder in (WAIT would not
//!   fix this). Use a single primary for leases that matter. Redis Cluster is not
//!   supported (each script touches keys in more than one slot).
//!
//! Wake-ups: a release (not an expiry) is announced with `PUBLISH {prefix}released <name>`.
//! A waiter subscribes on a connection of its own (RESP3, so messages arrive as pushes),
//! opened on its first wait and kept. The message is only a hint (the elector re-reads at
//! least every second anyway, which also covers expiry); while the subscription cannot be
//! made the waiter polls.
//!
//! Calls go through one `ConnectionManager` per store, which reconnects by itself after a
//! server restart (the first call after it fails, as unavailable; the elector retries).
//!
//! Commands used: `EVALSHA` and, when the server does not know a script yet,
//! `SCRIPT LOAD`; waiters add `HELLO 3` and `SUBSCRIBE`. Keys touched: `{prefix}*` only
//! (an ACL user needs `~{prefix}*` and `&{prefix}released`).
//!
//! A password never appears in a message: messages are built from `url::redact(url)` and
//! the error's own text, never from the redis crate's connection info.

use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{AsyncConnectionConfig, Client, ProtocolVersion, PushInfo, PushKind, RedisError, Script, Value};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Mutex;

use super::release_feed::{self, Heard, ReleaseFeed};
use super::url::{redact, Access, TlsFiles};
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

/// The key prefix used unless the URL says `?prefix=`.
pub const DEFAULT_PREFIX: &str = "leaderrun:";

/// Bound on connecting and on each answer. The elector bounds every call with its own,
/// usually shorter, timeout; this one only keeps a dead server from holding a connection.
const TIMEOUT: Duration = Duration::from_secs(3);

/// How often a waiter re-reads the lock while it cannot subscribe.
const POLL: Duration = Duration::from_millis(250);

/// Returns a lock's record as a flat array:
/// {name, held (0/1), holder, token, acquired_ms, ms left, revoked (0/1)}.
/// KEYS: lock key, token key. ARGV[1]: the lock name.
const READ: &str = r#"
local function read(lock_key, token_key, name)
  local h = redis.call('HMGET', lock_key, 'holder', 'token', 'acquired_ms', 'revoked')
  if not h[1] then
    return {name, 0, '', tonumber(redis.call('GET', token_key) or '0'), 0, 0, 0}
  end
  local revoked = 0
  if h[4] == '1' then revoked = 1 end
  return {name, 1, h[1], tonumber(h[2]), tonumber(h[3]), redis.call('PTTL', lock_key), revoked}
end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"#;

/// The scripts, each one atomic step on the server.
struct Scripts {
    /// KEYS: lock, token, locks set. ARGV: name, identity, ttl_ms.
    /// Returns {1, token} when won, else {0, record...}.
    acquire: Script,
    /// KEYS: lock, token. ARGV: name, identity, token, ttl_ms. Returns {1} or {0, record...}.
    renew: Script,
    /// KEYS: lock. ARGV: name, identity, token, keep_ms, channel. Returns 0 (not ours),
    /// 1 (kept for --min-hold) or 2 (freed).
    release: Script,
    /// KEYS: lock, token. ARGV: name. Returns the record.
    status: Script,
    /// KEYS: locks set. ARGV: prefix. Returns every record, flattened.
    list: Script,
    /// KEYS: lock, token. ARGV: name. Returns the record before (held = 0: nothing done).
    revoke: Script,
}

impl Scripts {
    fn new() -> Self {
        let script = |body: &str| Script::new(&format!("{READ}\n{body}"));
        Self {
            acquire: script(
                r#"
if redis.call('EXISTS', KEYS[1]) == 1 then
  local r = read(KEYS[1], KEYS[2], ARGV[1])
  table.insert(r, 1, 0)
  return r
end
local token = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'holder', ARGV[2], 'token', string.format('%d', token),
  'acquired_ms', string.format('%d', now_ms()), 'revoked', '0')
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('SADD', KEYS[3], ARGV[1])
return {1, token}
"#,
            ),
            renew: script(
                r#"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'revoked')
if h[1] == ARGV[2] and h[2] == ARGV[3] and h[3] ~= '1' then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return {1}
end
local r = read(KEYS[1], KEYS[2], ARGV[1])
table.insert(r, 1, 0)
return r
"#,
            ),
            // With keep > 0 (--min-hold) the key stays, with its holder, until
            // acquired_ms + keep if that is still ahead; otherwise it goes, and waiters are told.
            release: script(
                r#"
local h = redis.call('HMGET', KEYS[1], 'holder', 'token', 'acquired_ms')
if h[1] ~= ARGV[2] or h[2] ~= ARGV[3] then
  return 0
end
local keep_until = tonumber(h[3]) + tonumber(ARGV[4])
if tonumber(ARGV[4]) > 0 and keep_until > now_ms() then
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', keep_until))
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[5], ARGV[1])
return 2
"#,
            ),
            status: script("return read(KEYS[1], KEYS[2], ARGV[1])"),
            list: script(
                r#"
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  for _, v in ipairs(read(ARGV[1] .. 'lock:' .. name, ARGV[1] .. 'token:' .. name, name)) do
    table.insert(out, v)
  end
end
return out
"#,
            ),
            // The PX expiry stays as it is: the holder frees the lock once its child is
            // stopped, or the lease lapses.
            revoke: script(
                r#"
local r = read(KEYS[1], KEYS[2], ARGV[1])
if r[2] == 1 then
  redis.call('HSET', KEYS[1], 'revoked', '1')
end
return r
"#,
            ),
        }
    }
}

/// The parts of a Redis URL that are leaderrun's, not the redis crate's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Extras {
    prefix: String,
    /// `cacert=`: trust this CA (PEM) instead of the system's; `cert=` and `key=`: a client
    /// certificate and its key (PEM), for servers that ask (as redis-cli names them).
    tls: TlsFiles,
}

/// Split leaderrun's own parameters (`prefix=`, `cacert=`, `cert=`, `key=`) off the URL;
/// the rest goes to the redis crate.
fn split_url(url: &str) -> (String, Extras) {
    let (url, fragment) = match url.split_once('#') {
        Some((url, fragment)) => (url, format!("#{fragment}")),
        None => (url, String::new()),
    };
    let mut extras = Extras { prefix: DEFAULT_PREFIX.to_string(), ..Extras::default() };
    let Some((base, query)) = url.split_once('?') else {
        return (format!("{url}{fragment}"), extras);
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let taken = match pair.split_once('=') {
            Some(("prefix", value)) => {
                extras.prefix = value.to_string();
                true
            }
            Some((key, value)) => extras.tls.take(key, value),
            None => false,
        };
        if !taken {
            kept.push(pair);
        }
    }
    let query = if kept.is_empty() { String::new() } else { format!("?{}", kept.join("&")) };
    (format!("{base}{query}{fragment}"), extras)
}

/// A `redis://` or `rediss://` URL, parsed once while the command line is checked.
#[derive(Clone)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    /// The URL the redis crate is given (leaderrun's own parameters taken out).
    redis_url: String,
    extras: Extras,
}

impl Target {
    /// Split leaderrun's parameters off and check the rest with the redis crate's parser.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        let (redis_url, extras) = split_url(url);
        redis::parse_redis_url(&redis_url).ok_or("not a valid Redis URL (expected redis://[user]:pass@host:6379/0)")?;
        Ok(Self { shown: redact(url), redis_url, extras })
    }
}

/// A client for the URL: with the CA and client certificate of `extras` when given.
fn client(redis_url: &str, extras: &Extras, shown: &str) -> Result<Client> {
    let refused = |why: String| StoreError::refused(format!("Redis store {shown}: {why}"));
    let invalid = |e: RedisError| refused(format!("invalid URL: {}", describe(&e)));
    let files = &extras.tls;
    if *files == TlsFiles::default() {
        return Client::open(redis_url).map_err(invalid);
    }
    files.check(redis_url.to_ascii_lowercase().starts_with("rediss:"), "a rediss:// URL").map_err(refused)?;
    let read = |param: &str, path: &Option<String>| super::read_url_file("Redis", shown, param, path.as_deref());
    let (root_cert, cert, key) = (read("cacert", &files.cacert)?, read("cert", &files.cert)?, read("key", &files.key)?);
    // check() made sure that cert= and key= come together.
    let client_tls = match (cert, key) {
        (Some(client_cert), Some(client_key)) => Some(redis::ClientTlsConfig { client_cert, client_key }),
        _ => None,
    };
    Client::build_with_tls(redis_url, redis::TlsCertificates { client_tls, root_cert }).map_err(invalid)
}

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
    client: Client,
    conn: ConnectionManager,
    /// The subscription to releases, made on the first `changed` and dropped once a lease
    /// is won (a holder reads no messages, and unread ones would pile up).
    pubsub: Mutex<Option<Subscription>>,
    scripts: Scripts,
    prefix: String,
    /// The URL without its password, for messages.
    shown: String,
}

impl RedisStore {
    /// Parse the URL and connect once, so that a bad address or password is reported
    /// here, before anything runs. Redis creates nothing ahead of use, so `access` does
    /// not matter: looking never writes.
    pub async fn open(target: &Target, _access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let client = client(&target.redis_url, &target.extras, &shown)?;
        let prefix = target.extras.prefix.clone();
        // One attempt per reconnection: the elector retries failed calls on its own schedule.
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(0);
        let conn = ConnectionManager::new_with_config(client.clone(), config).await.map_err(|e| error(&shown, e))?;
        Ok(Self { client, conn, pubsub: Mutex::new(None), scripts: Scripts::new(), prefix, shown })
    }

    fn key(&self, kind: &str, lock: &str) -> String {
        format!("{}{kind}:{lock}", self.prefix)
    }

    fn channel(&self) -> String {
        format!("{}released", self.prefix)
    }

    /// Run a script (EVALSHA, loading it on NOSCRIPT) and return its answer.
    async fn run(&self, op: &'static str, invocation: &redis::ScriptInvocation<'_>) -> Result<Value> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        let mut conn = self.conn.clone();
        invocation.invoke_async(&mut conn).await.map_err(|e| error(&self.shown, e))
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
    /// the news that the connection was lost.
    async fn subscribe(&self) -> std::result::Result<Subscription, RedisError> {
        let info = self.client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_protocol(ProtocolVersion::RESP3);
        let client = Client::open(info.set_redis_settings(settings))?;
        let (sender, messages) = tokio::sync::mpsc::unbounded_channel();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_push_sender(sender);
        let mut connection = client.get_multiplexed_async_connection_with_config(&config).await?;
        connection.subscribe(self.channel()).await?;
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
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
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

/// A record from the 7 fields `read` returns.
fn record(fields: &[Value]) -> Option<LockRecord> {
    let [name, held, holder, token, acquired_ms, left_ms, revoked] = fields else {
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
        let mut invocation = self.scripts.acquire.prepare_invoke();
        invocation
            .key(self.key("lock", lock))
            .key(self.key("token", lock))
            .key(format!("{}locks", self.prefix))
            .arg(lock)
            .arg(identity)
            .arg(millis(ttl));
        let value = self.run("acquire", &invocation).await?;
        let fields = items(&value);
        match fields.first().and_then(int) {
            Some(1) => {
                let token = fields.get(1).and_then(int).ok_or_else(|| self.bad_answer("acquire", &value))?;
                // A holder reads no messages: stop listening (see `pubsub`).
                if let Ok(mut pubsub) = self.pubsub.try_lock() {
                    *pubsub = None;
                }
                Ok(Acquire::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token: token as u64 }))
            }
            Some(0) => Ok(Acquire::Held(record(&fields[1..]).ok_or_else(|| self.bad_answer("acquire", &value))?)),
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
            .arg(&lease.lock)
            .arg(&lease.identity)
            .arg(lease.token)
            .arg(keep.as_millis().min(MAX_MS) as u64)
            .arg(self.channel());
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
        let mut records =
            fields.chunks(7).map(record).collect::<Option<Vec<_>>>().ok_or_else(|| self.bad_answer("list", &value))?;
        records.sort_by(|a, b| a.lock.cmp(&b.lock));
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let mut invocation = self.scripts.revoke.prepare_invoke();
        invocation.key(self.key("lock", lock)).key(self.key("token", lock)).arg(lock);
        let value = self.run("revoke", &invocation).await?;
        let before = record(&items(&value)).ok_or_else(|| self.bad_answer("revoke", &value))?;
        Ok(before.is_held().then_some(before))
    }

    /// Wait for a release message naming `lock`. Messages that arrive between two calls
    /// wait in the subscription, so a release just after our last read is not missed; one
    /// that came before it only makes this return early (harmless: the caller re-reads).
    /// A subscription that was just made may have missed a release: read once then.
    async fn changed(&self, lock: &str, max_wait: Duration) {
        let open = || async { self.subscribe().await.map_err(|err| error(&self.shown, err).message) };
        release_feed::wait_for_release(self, &self.pubsub, open, lock, max_wait, TIMEOUT, POLL).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_splitting() {
        let prefix = |p: &str| Extras { prefix: p.into(), ..Extras::default() };
        assert_eq!(split_url("redis://:p@h:6379/2"), ("redis://:p@h:6379/2".into(), prefix(DEFAULT_PREFIX)));
        assert_eq!(split_url("redis://h?prefix=team-b:"), ("redis://h".into(), prefix("team-b:")));
        assert_eq!(
            split_url("rediss://h/1?protocol=resp3&prefix=x#insecure"),
            ("rediss://h/1?protocol=resp3#insecure".into(), prefix("x"))
        );
        let (url, extras) = split_url("rediss://h?cacert=/ca.pem&cert=/c.pem&key=/k.pem");
        assert_eq!(url, "rediss://h");
        assert_eq!(
            (extras.tls.cacert.as_deref(), extras.tls.cert.as_deref(), extras.tls.key.as_deref()),
            (Some("/ca.pem"), Some("/c.pem"), Some("/k.pem"))
        );
    }

    #[test]
    fn records() {
        let s = |t: &str| Value::BulkString(t.as_bytes().to_vec());
        let free = [s("n"), Value::Int(0), s(""), Value::Int(7), Value::Int(0), Value::Int(0), Value::Int(0)];
        assert_eq!(record(&free).unwrap(), LockRecord { token: 7, ..LockRecord::free("n") });
        let held = [s("n"), Value::Int(1), s("a"), Value::Int(3), Value::Int(1000), Value::Int(2500), Value::Int(1)];
        let held = record(&held).unwrap();
        assert_eq!((held.holder.as_deref(), held.token, held.revoked), (Some("a"), 3, true));
        assert_eq!(held.expires_in, Some(Duration::from_millis(2500)));
        assert!(record(&free[..6]).is_none());
    }
}
