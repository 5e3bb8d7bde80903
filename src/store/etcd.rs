//! etcd store: `--store etcd://[user:pass@]host:2379[,host2:2379...][/prefix]`.
//!
//! Two keys per lock name (the name verbatim: etcd keys are bytes):
//! - `{prefix}lock/{name}`: exists while the lock is taken; value `{holder, lease_id,
//!   acquired_ms, revoked}` (JSON), attached to an etcd lease of the holder's TTL, so etcd
//!   deletes it when the lease lapses.
//! - `{prefix}token/{name}`: empty, never deleted, rewritten in the same transaction that
//!   creates the lock key. It remembers the latest token once the lock key is gone.
//!
//! What etcd guarantees and this store relies on (A1): transactions are linearizable
//! (serialized through Raft; reads here are linearizable too, the default), an
//! acknowledged write is on a quorum, and revisions are global and strictly increase for
//! the life of the cluster (compaction and restarts keep them; `etcdutl snapshot restore`
//! keeps them as of the snapshot, so restoring an OLD snapshot could hand out tokens again,
//! as restoring an old backup would for any store).
//!
//! - acquire: grant a lease of ceil(ttl) seconds, then one transaction:
//!   `create_revision(lock) == 0` (the key does not exist) → put it with the lease and
//!   touch the token key; otherwise read who holds it (and revoke the unused lease).
//! - fencing token = the lock key's create revision. A key is only ever created anew by an
//!   acquisition (a re-put keeps it), so every acquisition gets a larger revision than all
//!   before it, across releases and expiries; the token key's mod revision is that same
//!   revision (one transaction, one revision), which is how `status` of a released lock
//!   still reports its last token.
//! - renew: one round trip. The store remembers, for each lease it took or renewed, the etcd
//!   lease id and the key's mod revision; a renewal sends, at the same time, a transaction
//!   `create_revision == token && mod_revision == remembered` (else: read the key) and one
//!   LeaseKeepAlive. Only a matching compare counts as renewed: a revoke (a re-put) or a
//!   new holder changes the mod revision. A revoke that lands just after the compare is seen
//!   at the next renewal, as if it had come after this one; the keep-alive it may have
//!   extended only keeps a revoked (still taken) lock taken longer, the safe direction.
//!   A store that has not seen the lease (another process renewing with it) reads the key
//!   first. etcd renews a lease to its GRANTED TTL (the acquire's ceil(ttl), or etcd's
//!   minimum, see below); the elector renews with the ttl it acquired with.
//! - release: revoking the lease, which deletes the key attached to it (waiters' watches see
//!   the DELETE); a store that did not take the lease itself reads the key and deletes it in
//!   a transaction guarded by the mod revision read, then revokes the lease. With --min-hold
//!   the key is instead re-put on a new lease of the time left, which keeps its create
//!   revision (the token).
//! - revoke: a guarded re-put with `revoked: true` that keeps the lease: nothing is freed.
//! - changed: a watch on the lock key from the revision of a read, so a delete between
//!   the read and the watch is not missed.
//!
//! Expiry is judged by the etcd leader's lessor on its own monotonic clock; after a leader
//! change the new leader extends every lease by a full TTL (leases only ever last longer,
//! the safe direction). etcd enforces a minimum TTL (1.5 election timeouts, 2 s with the
//! default settings): shorter requests get the minimum, again only longer. Lease TTLs are
//! whole seconds, so ttls are rounded up.
//!
//! What is NOT guaranteed: --min-hold is timed from `acquired_ms`, the acquiring host's
//! wall clock (etcd has no server-time API); the holder releases on the same host, so only a
//! wall-clock step during the hold moves it, and --min-hold is a convenience, not part of
//! the safety contract. `held_since` is that wall-clock time too, for display. etcd's own
//! client times keepalive deadlines from the response; leaderrun's elector times them from
//! its request, this store only answers renew.
//!
//! TLS: `etcds://` (or `?tls=1`) speaks https to every endpoint, trusting the system's CAs or
//! `?cacert=FILE`, with a client certificate from `&cert=FILE&key=FILE` (etcdctl's names).
//! A password never appears in a message: they are built from `url::redact(url)`.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity, KeyValue, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
};
use serde::{Deserialize, Serialize};
use tokio::time::timeout;

use super::url::{parse_cluster_url, redact, Access, TlsFiles};
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};

/// The key prefix unless the URL has a path.
pub const DEFAULT_PREFIX: &str = "/leaderrun/";
/// Port when a host has none.
const DEFAULT_PORT: u16 = 2379;
/// Time to open a TCP connection to one endpoint.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Bound on every request (the elector bounds its calls too, usually tighter).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Guarded writes retried this often when the key changes under them before giving up.
const MAX_RACES: usize = 20;

/// The lock key's value.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Value {
    holder: String,
    lease_id: i64,
    /// The acquiring host's wall clock (ms since the epoch): display and --min-hold.
    acquired_ms: u64,
    revoked: bool,
}

/// The parts of an `etcd://` URL, parsed once while the command line is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The URL without its password, for messages.
    pub shown: String,
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    prefix: String,
    /// `etcds://` or `?tls=1`, with the files etcdctl names --cacert, --cert and --key.
    tls: Option<TlsFiles>,
}

impl Target {
    /// Parse an `etcd://` or `etcds://` URL; the error is a bare reason, naming the part.
    pub fn parse(url: &str) -> std::result::Result<Self, String> {
        parse_url(url)
    }
}

fn parse_url(url: &str) -> std::result::Result<Target, String> {
    let shown = redact(url);
    let bad = |why: &str| why.to_string();
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("expected etcd://host:2379[,host2:2379][/prefix]"))?;
    let mut tls = scheme.eq_ignore_ascii_case("etcds");
    if !tls && !scheme.eq_ignore_ascii_case("etcd") {
        return Err(bad("expected etcd:// or etcds://"));
    }
    let url = parse_cluster_url(rest, DEFAULT_PORT)
        .map_err(|why| bad(&format!("{why} (expected etcd://host:2379[,host2:2379])")))?;
    let mut files = TlsFiles::default();
    for (key, value) in &url.params {
        if key == "tls" {
            tls = !matches!(value.as_str(), "0" | "false");
        } else if !files.take(key, value) {
            return Err(format!("unknown parameter ?{key}= (known: tls, cacert, cert, key)"));
        }
    }
    files.check(tls, "etcds:// or ?tls=1").map_err(|why| bad(&why))?;
    let http = if tls { "https" } else { "http" };
    let endpoints = url.hosts.iter().map(|host| format!("{http}://{host}")).collect();
    let user = url.userinfo.map(|(user, pass)| (user, pass.unwrap_or_default()));
    let prefix = if url.path.is_empty() { DEFAULT_PREFIX.to_string() } else { format!("/{}/", url.path) };
    Ok(Target { shown, endpoints, user, prefix, tls: tls.then_some(files) })
}

/// The client's TLS settings: the CA file or else the system's CAs, and a client certificate.
fn tls_options(files: &TlsFiles, shown: &str) -> Result<TlsOptions> {
    let read = |param: &str, path: &Option<String>| super::read_url_file("etcd", shown, param, path.as_deref());
    let mut options = match read("cacert", &files.cacert)? {
        Some(pem) => TlsOptions::new().ca_certificate(Certificate::from_pem(pem)),
        None => TlsOptions::new().with_native_roots(),
    };
    if let (Some(cert), Some(key)) = (read("cert", &files.cert)?, read("key", &files.key)?) {
        options = options.identity(Identity::from_pem(cert, key));
    }
    Ok(options)
}

/// Whether an etcd error may pass on retry: unreachable, timed out, no leader, overloaded.
/// Bad credentials, missing permissions and invalid requests will not.
fn transient(err: &etcd_client::Error) -> bool {
    if super::is_tls_refusal(&describe(err)) {
        return false;
    }
    match err {
        etcd_client::Error::GRpcStatus(status) => {
            // gRPC codes: 3 InvalidArgument (etcd's "invalid user ID or password"),
            // 7 PermissionDenied, 9 FailedPrecondition, 12 Unimplemented, 16 Unauthenticated.
            !matches!(status.code() as i32, 3 | 7 | 9 | 12 | 16)
        }
        etcd_client::Error::InvalidArgs(_)
        | etcd_client::Error::InvalidUri(_)
        | etcd_client::Error::InvalidMetadataValue(_)
        | etcd_client::Error::Utf8Error(_) => false,
        _ => true,
    }
}

/// One line describing an etcd error (never the connect options).
fn describe(err: &etcd_client::Error) -> String {
    let what = match err {
        etcd_client::Error::GRpcStatus(status) => format!("{} ({:?})", status.message(), status.code()),
        etcd_client::Error::TransportError(e) => {
            use std::error::Error as _;
            let mut text = format!("cannot reach the server: {e}");
            let mut source = e.source();
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
        other => other.to_string(),
    };
    what.replace('\n', " ")
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// Whole seconds, rounded up, at least 1: etcd leases have 1 s granularity.
fn lease_secs(d: Duration) -> i64 {
    (d.as_nanos().div_ceil(1_000_000_000) as i64).max(1)
}

fn held_key(lease: &Lease) -> (String, u64, String) {
    (lease.lock.clone(), lease.token, lease.identity.clone())
}

/// The first (only) key a get returned.
fn first_kv(resp: &TxnOpResponse) -> Option<KeyValue> {
    match resp {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    }
}

pub struct EtcdStore {
    client: Client,
    prefix: String,
    /// The URL without its password, for messages.
    shown: String,
    /// For each lease this store took or renewed, (lock, token, identity) → where it stood then.
    held: std::sync::Mutex<HashMap<(String, u64, String), Held>>,
}

/// What a renewal compares against: the etcd lease the key is attached to, and the key's
/// mod revision when this store last saw it unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    lease_id: i64,
    mod_revision: i64,
}

impl EtcdStore {
    /// Parse the URL and connect (authenticating, if a user is given), then read once, so an
    /// unreachable cluster or bad credentials are reported here, before anything runs.
    /// etcd needs nothing created, so `access` makes no difference.
    pub async fn open(target: &Target, _access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let mut options = ConnectOptions::new().with_connect_timeout(CONNECT_TIMEOUT).with_timeout(REQUEST_TIMEOUT);
        if let Some((user, password)) = &target.user {
            options = options.with_user(user.clone(), password.clone()).with_auto_token_refresh(true);
        }
        if let Some(files) = &target.tls {
            options = options.with_tls(tls_options(files, &shown)?);
        }
        let error = |e: &etcd_client::Error| {
            let message = format!("etcd store {shown}: {}", describe(e));
            if transient(e) {
                StoreError::unavailable(message)
            } else {
                StoreError::refused(message)
            }
        };
        let client = match timeout(REQUEST_TIMEOUT, Client::connect(&target.endpoints, Some(options))).await {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => return Err(error(&e)),
            Err(_) => {
                return Err(StoreError::unavailable(format!(
                    "etcd store {shown}: no answer within {}s",
                    REQUEST_TIMEOUT.as_secs()
                )))
            }
        };
        let store = Self { client, prefix: target.prefix.clone(), shown, held: Default::default() };
        let key = store.lock_key("");
        store.call("open", |mut c| async move { c.get(key, Some(GetOptions::new().with_count_only())).await }).await?;
        Ok(store)
    }

    fn lock_key(&self, lock: &str) -> String {
        format!("{}lock/{lock}", self.prefix)
    }

    fn token_key(&self, lock: &str) -> String {
        format!("{}token/{lock}", self.prefix)
    }

    fn error(&self, err: &etcd_client::Error) -> StoreError {
        let message = format!("etcd store {}: {}", self.shown, describe(err));
        if transient(err) {
            StoreError::unavailable(message)
        } else {
            StoreError::refused(message)
        }
    }

    /// One request, bounded by REQUEST_TIMEOUT (a cluster without a reachable member can
    /// leave a request pending), with its error mapped.
    async fn call<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        match timeout(REQUEST_TIMEOUT, f(self.client.clone())).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.error(&e)),
            Err(_) => Err(StoreError::unavailable(format!(
                "etcd store {}: no answer within {}s",
                self.shown,
                REQUEST_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn get_lock(&self, lock: &str) -> Result<Option<KeyValue>> {
        let key = self.lock_key(lock);
        let resp = self.call("get", |mut c| async move { c.get(key, None).await }).await?;
        Ok(resp.kvs().first().cloned())
    }

    fn value(&self, kv: &KeyValue) -> Result<Value> {
        serde_json::from_slice(kv.value()).map_err(|e| {
            StoreError::refused(format!(
                "etcd store {}: the record of lock {:?} is not leaderrun's ({e})",
                self.shown,
                String::from_utf8_lossy(kv.key())
            ))
        })
    }

    /// Seconds left on a lease, on the etcd leader's clock; `None` if it has lapsed.
    async fn lease_left(&self, lease_id: i64) -> Result<Option<Duration>> {
        let resp = self.call("lease-ttl", |mut c| async move { c.lease_time_to_live(lease_id, None).await }).await;
        match resp {
            Ok(resp) if resp.ttl() >= 0 => Ok(Some(Duration::from_secs(resp.ttl() as u64))),
            Ok(_) => Ok(None),
            Err(e) if e.message.contains("lease not found") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The record of a lock whose key exists.
    async fn record(&self, lock: &str, kv: &KeyValue) -> Result<LockRecord> {
        let value = self.value(kv)?;
        let token = kv.create_revision() as u64;
        match self.lease_left(value.lease_id).await? {
            Some(left) => Ok(LockRecord {
                lock: lock.to_string(),
                holder: Some(value.holder),
                token,
                held_since: Some(UNIX_EPOCH + Duration::from_millis(value.acquired_ms)),
                expires_in: Some(left),
                revoked: value.revoked,
            }),
            // Lapsed, and etcd is about to delete the key.
            None => Ok(LockRecord { token, ..LockRecord::free(lock) }),
        }
    }

    /// The record of a free lock: the latest token is the token key's mod revision (0 if
    /// this lock was never taken).
    fn free_record(lock: &str, token_kv: Option<&KeyValue>) -> LockRecord {
        LockRecord { token: token_kv.map_or(0, |kv| kv.mod_revision() as u64), ..LockRecord::free(lock) }
    }

    async fn revoke_lease(&self, lease_id: i64) {
        // Best effort: an unrevoked lease lapses by itself at its TTL.
        let _ = self.call("lease-revoke", |mut c| async move { c.lease_revoke(lease_id).await }).await;
    }

    fn remembered(&self, lease: &Lease) -> Option<Held> {
        self.held.lock().unwrap().get(&held_key(lease)).copied()
    }

    fn remember(&self, lease: &Lease, held: Held) {
        self.held.lock().unwrap().insert(held_key(lease), held);
    }

    fn forget(&self, lease: &Lease) {
        self.held.lock().unwrap().remove(&held_key(lease));
    }

    /// Whether the key as read still carries this lease, unrevoked: `Ok` with what a renewal
    /// compares against (remembered), or `Err` with the loss to report (forgotten).
    async fn judge(&self, lease: &Lease, kv: Option<KeyValue>) -> Result<std::result::Result<Held, Renew>> {
        let Some(kv) = kv else {
            self.forget(lease);
            return Ok(Err(Renew::Lost(None)));
        };
        let value = self.value(&kv)?;
        if kv.create_revision() as u64 != lease.token || value.holder != lease.identity || value.revoked {
            self.forget(lease);
            return Ok(Err(Renew::Lost(Some(self.record(&lease.lock, &kv).await?))));
        }
        let held = Held { lease_id: value.lease_id, mod_revision: kv.mod_revision() };
        self.remember(lease, held);
        Ok(Ok(held))
    }

    /// One LeaseKeepAlive: whether the lease still exists. etcd-client reads the answer and
    /// reports a lapsed lease (TTL 0) as `LeaseKeepAliveError("lease not found")`: the lease is
    /// gone, not a passing failure.
    async fn keep_alive(&self, lease_id: i64) -> Result<bool> {
        self.call("keep-alive", |mut c| async move {
            match c.lease_keep_alive(lease_id).await {
                Ok(_) => Ok(true),
                Err(etcd_client::Error::LeaseKeepAliveError(why)) if why.contains("not found") => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// A transaction with one compare on the key's mod revision.
    async fn guarded(&self, op: &'static str, lock: &str, mod_revision: i64, then: Vec<TxnOp>) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::mod_revision(self.lock_key(lock), CompareOp::Equal, mod_revision)])
            .and_then(then);
        Ok(self.call(op, |mut c| async move { c.txn(txn).await }).await?.succeeded())
    }

    /// Return once the lock key is gone: read it, then watch for its DELETE from the next
    /// revision on, so a release between the read and the watch is not missed.
    async fn wait_deleted(&self, lock: &str) -> Result<()> {
        let key = self.lock_key(lock);
        let resp = self.call("get", |mut c| async move { c.get(key, None).await }).await?;
        if resp.kvs().is_empty() {
            return Ok(());
        }
        let from = resp.header().map_or(0, |h| h.revision()) + 1;
        let key = self.lock_key(lock);
        let options = WatchOptions::new().with_start_revision(from).with_filters([WatchFilterType::NoPut]);
        // Opening the stream is bounded like any call; waiting on it is bounded by the caller.
        let mut stream = self.call("watch", |mut c| async move { c.watch(key, Some(options)).await }).await?;
        loop {
            match stream.message().await {
                Ok(Some(resp)) if resp.canceled() => return Ok(()),
                Ok(Some(resp)) if resp.events().iter().any(|e| e.event_type() == EventType::Delete) => return Ok(()),
                Ok(Some(_)) => continue,
                Ok(None) => return Ok(()),
                Err(e) => return Err(self.error(&e)),
            }
        }
    }
}

#[async_trait]
impl Store for EtcdStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        // A read first: a standby re-checking a held lock need not grant (and revoke) a lease.
        if let Some(kv) = self.get_lock(lock).await? {
            let record = self.record(lock, &kv).await?;
            if record.is_held() {
                return Ok(Acquire::Held(record));
            }
        }
        let secs = lease_secs(ttl);
        let granted = self.call("lease-grant", |mut c| async move { c.lease_grant(secs, None).await }).await?;
        let lease_id = granted.id();
        let value = Value { holder: identity.to_string(), lease_id, acquired_ms: now_ms(), revoked: false };
        let key = self.lock_key(lock);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key.clone(),
                    serde_json::to_vec(&value).unwrap(),
                    Some(PutOptions::new().with_lease(lease_id)),
                ),
                TxnOp::put(self.token_key(lock), "", None),
                TxnOp::get(key.clone(), None),
            ])
            .or_else([TxnOp::get(key, None)]);
        let resp = match self.call("acquire", |mut c| async move { c.txn(txn).await }).await {
            Ok(resp) => resp,
            Err(e) => {
                // Taken or not, an unrenewed lease frees the key at its TTL.
                self.revoke_lease(lease_id).await;
                return Err(e);
            }
        };
        let kv = resp.op_responses().last().and_then(first_kv);
        if resp.succeeded() {
            let (token, mod_revision) = kv.map_or((0, 0), |kv| (kv.create_revision(), kv.mod_revision()));
            let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token: token as u64 };
            self.remember(&lease, Held { lease_id, mod_revision });
            return Ok(Acquire::Won(lease));
        }
        self.revoke_lease(lease_id).await;
        match kv {
            Some(kv) => Ok(Acquire::Held(self.record(lock, &kv).await?)),
            None => Ok(Acquire::Held(LockRecord::free(lock))),
        }
    }

    async fn renew(&self, lease: &Lease, _ttl: Duration) -> Result<Renew> {
        let held = match self.remembered(lease) {
            Some(held) => held,
            None => match self.judge(lease, self.get_lock(&lease.lock).await?).await? {
                Ok(held) => held,
                Err(lost) => return Ok(lost),
            },
        };
        // The compare and the keep-alive travel together: one round trip.
        let key = self.lock_key(&lease.lock);
        let txn = Txn::new()
            .when([
                Compare::create_revision(key.clone(), CompareOp::Equal, lease.token as i64),
                Compare::mod_revision(key.clone(), CompareOp::Equal, held.mod_revision),
            ])
            .or_else([TxnOp::get(key, None)]);
        let (checked, alive) = tokio::join!(
            self.call("renew-check", |mut c| async move { c.txn(txn).await }),
            self.keep_alive(held.lease_id)
        );
        let checked = checked?;
        let alive = if checked.succeeded() {
            alive?
        } else {
            // Changed since this store last looked: judge what is there now.
            match self.judge(lease, checked.op_responses().first().and_then(first_kv)).await? {
                Err(lost) => return Ok(lost),
                Ok(now) if now.lease_id == held.lease_id => alive?,
                Ok(now) => self.keep_alive(now.lease_id).await?,
            }
        };
        if !alive {
            self.forget(lease);
            return Ok(Renew::Lost(None));
        }
        Ok(Renew::Renewed)
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        if let (Some(held), true) = (self.remembered(lease), keep.is_zero()) {
            // One request: revoking the etcd lease deletes the key attached to it (waiters'
            // watches see the DELETE) and nothing else. A key some other lease holds is
            // untouched, and a lease that has lapsed is gone already.
            let lease_id = held.lease_id;
            let revoked = self.call("lease-revoke", |mut c| async move { c.lease_revoke(lease_id).await }).await;
            match revoked {
                Ok(_) => {}
                Err(e) if e.message.contains("lease not found") => {}
                Err(e) => return Err(e),
            }
            self.forget(lease);
            return Ok(());
        }
        self.forget(lease);
        for _ in 0..MAX_RACES {
            let Some(kv) = self.get_lock(&lease.lock).await? else {
                return Ok(());
            };
            let value = self.value(&kv)?;
            if kv.create_revision() as u64 != lease.token || value.holder != lease.identity {
                return Ok(());
            }
            let until_ms = value.acquired_ms.saturating_add(keep.as_millis() as u64);
            let left = Duration::from_millis(until_ms.saturating_sub(now_ms()));
            if !keep.is_zero() && !left.is_zero() {
                // --min-hold: the key moves to a new lease of the time left. A re-put keeps
                // the create revision, so the token stays; the holder no longer renews.
                let secs = lease_secs(left);
                let new_id =
                    self.call("lease-grant", |mut c| async move { c.lease_grant(secs, None).await }).await?.id();
                let kept = Value { lease_id: new_id, ..value.clone() };
                let put = TxnOp::put(
                    self.lock_key(&lease.lock),
                    serde_json::to_vec(&kept).unwrap(),
                    Some(PutOptions::new().with_lease(new_id)),
                );
                if self.guarded("release", &lease.lock, kv.mod_revision(), vec![put]).await? {
                    self.revoke_lease(value.lease_id).await;
                    return Ok(());
                }
                self.revoke_lease(new_id).await;
            } else {
                let delete = TxnOp::delete(self.lock_key(&lease.lock), None);
                if self.guarded("release", &lease.lock, kv.mod_revision(), vec![delete]).await? {
                    self.revoke_lease(value.lease_id).await;
                    return Ok(());
                }
            }
        }
        Err(StoreError::unavailable(format!(
            "etcd store {}: lock {:?} kept changing during release",
            self.shown, lease.lock
        )))
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        // Both keys at one revision.
        let txn = Txn::new().and_then([TxnOp::get(self.lock_key(lock), None), TxnOp::get(self.token_key(lock), None)]);
        let resp = self.call("status", |mut c| async move { c.txn(txn).await }).await?;
        let kvs: Vec<Option<KeyValue>> = resp.op_responses().iter().map(first_kv).collect();
        match (kvs.first().cloned().flatten(), kvs.get(1).cloned().flatten()) {
            (Some(kv), _) => self.record(lock, &kv).await,
            (None, token) => Ok(Self::free_record(lock, token.as_ref())),
        }
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let (locks, tokens) = (self.lock_key(""), self.token_key(""));
        let txn = Txn::new().and_then([
            TxnOp::get(locks.clone(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(tokens.clone(), Some(GetOptions::new().with_prefix())),
        ]);
        let resp = self.call("list", |mut c| async move { c.txn(txn).await }).await?;
        let all = |i: usize| match resp.op_responses().get(i) {
            Some(TxnOpResponse::Get(get)) => get.kvs().to_vec(),
            _ => Vec::new(),
        };
        let name = |kv: &KeyValue, prefix: &str| String::from_utf8_lossy(&kv.key()[prefix.len()..]).into_owned();
        let held: std::collections::BTreeMap<String, KeyValue> =
            all(0).into_iter().map(|kv| (name(&kv, &locks), kv)).collect();
        let mut records = std::collections::BTreeMap::new();
        for kv in all(1) {
            let lock = name(&kv, &tokens);
            records.insert(lock.clone(), Self::free_record(&lock, Some(&kv)));
        }
        for (lock, kv) in &held {
            records.insert(lock.clone(), self.record(lock, kv).await?);
        }
        Ok(records.into_values().collect())
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        for _ in 0..MAX_RACES {
            let Some(kv) = self.get_lock(lock).await? else {
                return Ok(None);
            };
            let before = self.record(lock, &kv).await?;
            if !before.is_held() {
                return Ok(None);
            }
            let value = Value { revoked: true, ..self.value(&kv)? };
            // Keep the lease: the lock stays taken until the holder frees it or it lapses.
            let put = TxnOp::put(
                self.lock_key(lock),
                serde_json::to_vec(&value).unwrap(),
                Some(PutOptions::new().with_ignore_lease()),
            );
            if self.guarded("revoke", lock, kv.mod_revision(), vec![put]).await? {
                return Ok(Some(before));
            }
        }
        Err(StoreError::unavailable(format!("etcd store {}: lock {lock:?} kept changing during revoke", self.shown)))
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_deleted(lock), max_wait).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let t = |u: &str| Target::parse(u).unwrap();
        let one = t("etcd://h:1234");
        assert_eq!(
            (one.endpoints, one.user, one.prefix),
            (vec!["http://h:1234".to_string()], None, DEFAULT_PREFIX.into())
        );
        let two = t("etcd://u:p%40ss@a,b:2/team/x/");
        assert_eq!(two.endpoints, vec!["http://a:2379", "http://b:2"]);
        assert_eq!(two.user, Some(("u".into(), "p@ss".into())));
        assert_eq!(two.prefix, "/team/x/");
        let tls = t("etcds://h?cacert=/ca%20dir/ca.pem&cert=/c.pem&key=/k.pem");
        assert_eq!(tls.endpoints, vec!["https://h:2379"]);
        assert_eq!(
            tls.tls,
            Some(TlsFiles {
                cacert: Some("/ca dir/ca.pem".into()),
                cert: Some("/c.pem".into()),
                key: Some("/k.pem".into())
            })
        );
        assert_eq!(t("etcd://h?tls=1").tls, Some(TlsFiles::default()));
        assert!(Target::parse("etcd://h?cacert=/ca.pem").unwrap_err().contains("need TLS"));
        assert!(Target::parse("etcds://h?cert=/c.pem").unwrap_err().contains("go together"));
        assert!(Target::parse("http://h").unwrap_err().contains("etcds://"));
        assert!(Target::parse("etcd://a,,b").is_err());
        assert!(Target::parse("etcd://h?cacrt=/ca.pem").unwrap_err().contains("unknown parameter ?cacrt="));
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_secs(Duration::from_millis(300)), 1);
        assert_eq!(lease_secs(Duration::from_secs(30)), 30);
        assert_eq!(lease_secs(Duration::from_millis(30_001)), 31);
    }
}
