//! etcd store: `--store etcd://[user:pass@]host:2379[,host2:2379...][/prefix]`.
//!
//! Two keys per lock name (the name verbatim: etcd keys are bytes), and the waiters' queue:
//! - `{prefix}lock/{name}`: exists while the lock is taken; value `{holder, lease_id,
//!   acquired_ms, revoked, kept}` (JSON), attached to an etcd lease of the holder's TTL, so
//!   etcd deletes it when the lease lapses.
//! - `{prefix}token/{name}`: empty, never deleted, rewritten in the same transaction that
//!   creates the lock key. It remembers the latest token once the lock key is gone.
//! - `{prefix}queue/{name}/{lease id, 16 hex digits}`: empty, one per waiting store, on an
//!   etcd lease of that waiter's own (2 min, kept alive only when it waits again after the
//!   elector's safety net); its create revision is its place. Only a hint of whose turn it is
//!   after a release (see `queue`): nothing reads it to decide who holds the lock, `list` and
//!   `status` never see it, and an older leaderrun neither writes nor reads it (it waits as
//!   every waiter did before: acting at each release).
//!
//! What etcd guarantees and this store relies on for its one compare-and-set: transactions
//! are linearizable (serialized through Raft; reads here are linearizable too, the default),
//! an acknowledged write is on a quorum, and revisions are global and strictly increase for
//! the life of the cluster (compaction and restarts keep them; `etcdutl snapshot restore`
//! keeps them as of the snapshot, so restoring an OLD snapshot could hand out tokens again,
//! as restoring an old backup would for any store).
//!
//! - acquire: grant a lease of ceil(ttl) seconds, then one transaction:
//!   `create_revision(lock) == 0` (the key does not exist) → put it with the lease and
//!   touch the token key (and, for a waiter, delete its queue entry and those it passed);
//!   otherwise read who holds it (and revoke the unused lease). A free lock costs these two
//!   round trips; a standby re-checking a lock when it was not first in line at a release
//!   reads it first instead. A second copy of the transaction (see `endpoints`) that finds
//!   the key on its own lease judges it as a renewal's read would: revoked between the two
//!   copies, it is answered as a write to confirm, and the confirming renewal finds it lost.
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
//!   the DELETE); the lease of the queue entry the holder had as a waiter (its key is gone
//!   already) goes with its first renewal, or after the release's revoke; a store that did not
//!   take the lease itself reads the key and deletes it in a transaction guarded by the mod
//!   revision read, then revokes the lease. With --min-hold the key is instead re-put on a
//!   new lease of the time left, marked `kept`, which keeps its create revision (the token);
//!   a re-put whose compare failed because its own earlier copy moved the key is done (see
//!   `release`).
//! - revoke: a guarded re-put with `revoked: true` that keeps the lease: nothing is freed
//!   while a child may run. A `kept` lock has no child and no holder left: its lease is
//!   revoked, which frees it at once.
//! - abandon: the trait's status-then-release, which from any client deletes the key and
//!   revokes the etcd lease it names.
//! - changed (`wait`): the first wait joins the queue (a lease and one transaction that puts
//!   the entry and reads the lock key and the queue at one revision) and opens one watch
//!   stream with two watchers, the lock key and the queue, from the next revision, so that
//!   nothing between the read and the watch is missed: 4 requests. The stream asks for a
//!   member with a leader (see `client`): one cut off from the quorum ends it, and the
//!   waiter reads again elsewhere. The watch and the entry
//!   stay across waits (closed when the lock is won): an idle standby sends nothing, bar one
//!   keep-alive of its entry when it waits again after a safety-net re-read.
//!   When the lock key is deleted, the first waiter in line returns at once; the one with `n`
//!   live entries before its own returns after `n` staggers of 50 ms unless the watch shows a
//!   new holder first. So a handoff costs 4 requests however many wait (the release's revoke,
//!   the winner's grant and transaction, and later the revoke of its queue entry's lease),
//!   where each waiter acting at every release cost about 2 per waiter.
//!   Why every waiter watches the lock key rather than only its predecessor's entry, as etcd's
//!   `concurrency.Mutex` does: a waiter killed without cleanup (SIGKILL, OOM, a CI job
//!   cancelled with its pipeline) would stall the one behind it until its entry's lease
//!   lapsed (2 min here); here it costs the waiters behind it one stagger, once, and the
//!   waiter that takes the lock in its place deletes its entry. The price: etcd pushes every
//!   release and every new holder to every waiter (three events per handoff each, no
//!   requests), which with a hundred waiters on one host is CPU that lengthens the handoff.
//!
//! - observe_change (`leaderrun watch`, `observe`): one watcher on the lock key from the
//!   revision after the last `status` read, kept across calls; no queue entry, no lease. An
//!   expiry deletes the key (a DELETE on the watch); a renewal is a keep-alive, which leaves
//!   the key (and the record shown) unchanged.
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
//! A password never appears in a message: they are built from the URL without it.
//!
//! In a cluster, any request may reach etcd twice (sent again on another member, see
//! `endpoints`, which says why each of this store's requests is safe then).
//!
//! The gRPC calls go through `client` (tonic) with the messages of `wire`, written out by
//! hand so that building needs no `protoc`.

mod client;
mod endpoints;
mod kind;
mod observe;
mod queue;
mod release;
mod target;
#[cfg(test)]
mod tests;
mod value;
mod wait;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::AtomicBool;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, UNIX_EPOCH};

use async_trait::async_trait;
use tokio::time::timeout;

pub use kind::KIND;
pub use target::{Target, DEFAULT_PREFIX};

use super::Access;
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};
use client::{store_error, Connection, REQUEST_TIMEOUT};
use value::{lease_secs, now_ms, Value};
use wait::{Place, Waiting};
use wire::{path, KeyValue, RangeRequest, TxnRequest, TxnResponse};

/// Guarded writes retried this often when the key changes under them before giving up.
const MAX_RACES: usize = 20;

fn held_key(lease: &Lease) -> (String, u64, String) {
    (lease.lock.clone(), lease.token, lease.identity.clone())
}

pub struct EtcdStore {
    connection: Connection,
    prefix: String,
    /// The URL without its password, for messages.
    shown: String,
    /// For each lease this store took or renewed, (lock, token, identity) → where it stood then.
    held: Mutex<HashMap<(String, u64, String), Held>>,
    /// What a waiting campaign keeps across `changed` calls (its queue entry and its watch),
    /// so that an idle standby sends nothing once it is set up.
    waiting: tokio::sync::Mutex<Option<Waiting>>,
    /// The queue entry's lease of a waiter that won: it has no key left (the acquire deleted
    /// the entry), and is revoked with the first renewal, or after the release.
    spent: Mutex<Option<Place>>,
    /// The cluster refused the queue keys: this store waits without a queue (see `wait`).
    queue_refused: AtomicBool,
    /// `leaderrun watch`'s watch on a lock key, kept across `observe_change` calls.
    observed: tokio::sync::Mutex<Option<observe::Observed>>,
    /// The lock and revision of the last `status` read: a watch starts after it.
    read: Mutex<Option<(String, i64)>>,
}

/// What a renewal compares against: the etcd lease the key is attached to, and the key's
/// mod revision when this store last saw it unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    lease_id: i64,
    mod_revision: i64,
}

impl EtcdStore {
    /// Set up the connection, authenticating if a user is given (bad credentials are reported
    /// here). Nothing is read: an unreachable cluster is reported by the first call, which a
    /// one-shot run makes at once and a waiting run retries, as it would a failed open; a
    /// probe here would cost every run a round trip. etcd needs nothing created, so `access`
    /// makes no difference.
    pub async fn open(target: &Target, _access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let connection = match timeout(REQUEST_TIMEOUT, Connection::open(target)).await {
            Ok(connection) => connection?,
            Err(_) => return Err(no_answer(&shown)),
        };
        Ok(Self {
            connection,
            prefix: target.prefix.clone(),
            shown,
            held: Default::default(),
            waiting: Default::default(),
            spent: Default::default(),
            queue_refused: Default::default(),
            observed: Default::default(),
            read: Default::default(),
        })
    }

    fn lock_key(&self, lock: &str) -> String {
        format!("{}lock/{lock}", self.prefix)
    }

    fn token_key(&self, lock: &str) -> String {
        format!("{}token/{lock}", self.prefix)
    }

    /// One request, bounded by REQUEST_TIMEOUT (a cluster without a reachable member can
    /// leave a request pending), with its error mapped.
    async fn call<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = std::result::Result<T, tonic::Status>>,
    ) -> Result<T> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        match timeout(REQUEST_TIMEOUT, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(status)) => Err(store_error(&self.shown, &status)),
            Err(_) => Err(no_answer(&self.shown)),
        }
    }

    async fn txn(&self, op: &'static str, txn: TxnRequest) -> Result<TxnResponse> {
        self.call(op, self.connection.unary(path::TXN, txn)).await
    }

    async fn get_lock(&self, lock: &str) -> Result<Option<KeyValue>> {
        let request = RangeRequest { key: self.lock_key(lock).into_bytes(), ..Default::default() };
        let response: wire::RangeResponse = self.call("get", self.connection.unary(path::RANGE, request)).await?;
        Ok(response.kvs.into_iter().next())
    }

    async fn grant(&self, ttl: Duration) -> Result<i64> {
        let request = wire::LeaseGrantRequest { ttl: lease_secs(ttl), id: 0 };
        let granted: wire::LeaseGrantResponse =
            self.call("lease-grant", self.connection.unary(path::LEASE_GRANT, request)).await?;
        Ok(granted.id)
    }

    fn value(&self, kv: &KeyValue) -> Result<Value> {
        serde_json::from_slice(&kv.value).map_err(|e| {
            StoreError::refused(format!(
                "etcd store {}: the record of lock {:?} is not leaderrun's ({e})",
                self.shown,
                String::from_utf8_lossy(&kv.key)
            ))
        })
    }

    fn encode(&self, value: &Value) -> Result<Vec<u8>> {
        serde_json::to_vec(value)
            .map_err(|e| StoreError::refused(format!("etcd store {}: cannot encode a record: {e}", self.shown)))
    }

    /// The record of a lock whose key exists.
    async fn record(&self, lock: &str, kv: &KeyValue) -> Result<LockRecord> {
        let value = self.value(kv)?;
        let token = kv.create_revision as u64;
        match self.call("lease-ttl", self.connection.lease_left(value.lease_id)).await? {
            Some(left) => Ok(LockRecord {
                lock: lock.to_string(),
                holder: Some(value.holder),
                token,
                held_since: Some(UNIX_EPOCH + Duration::from_millis(value.acquired_ms)),
                expires_in: Some(left),
                revoked: value.revoked,
                campaigner: None,
                kept: value.kept,
            }),
            // Lapsed, and etcd is about to delete the key.
            None => Ok(LockRecord { token, ..LockRecord::free(lock) }),
        }
    }

    /// The record of a free lock: the latest token is the token key's mod revision (0 if
    /// this lock was never taken).
    fn free_record(lock: &str, token_kv: Option<&KeyValue>) -> LockRecord {
        LockRecord { token: token_kv.map_or(0, |kv| kv.mod_revision as u64), ..LockRecord::free(lock) }
    }

    async fn revoke_lease(&self, lease_id: i64) {
        // Best effort: an unrevoked lease lapses by itself at its TTL.
        let _ = self.call("lease-revoke", self.connection.lease_revoke(lease_id)).await;
    }

    /// The map of leases this store has seen; a panic elsewhere while it was locked leaves
    /// it as it was, still usable.
    fn held(&self) -> MutexGuard<'_, HashMap<(String, u64, String), Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remembered(&self, lease: &Lease) -> Option<Held> {
        self.held().get(&held_key(lease)).copied()
    }

    fn remember(&self, lease: &Lease, held: Held) {
        self.held().insert(held_key(lease), held);
    }

    fn forget(&self, lease: &Lease) {
        self.held().remove(&held_key(lease));
    }

    /// Whether the key as read still carries this lease, unrevoked: `Ok` with what a renewal
    /// compares against (remembered), or `Err` with the loss to report (forgotten).
    async fn judge(&self, lease: &Lease, kv: Option<&KeyValue>) -> Result<std::result::Result<Held, Renew>> {
        let Some(kv) = kv else {
            self.forget(lease);
            return Ok(Err(Renew::Lost(None)));
        };
        let value = self.value(kv)?;
        if kv.create_revision as u64 != lease.token || value.holder != lease.identity || value.revoked {
            self.forget(lease);
            return Ok(Err(Renew::Lost(Some(self.record(&lease.lock, kv).await?))));
        }
        let held = Held { lease_id: value.lease_id, mod_revision: kv.mod_revision };
        self.remember(lease, held);
        Ok(Ok(held))
    }

    /// One LeaseKeepAlive: whether the lease still exists (a lapsed one is gone, not a passing
    /// failure).
    async fn keep_alive(&self, lease_id: i64) -> Result<bool> {
        self.call("keep-alive", self.connection.keep_alive(lease_id)).await
    }

    /// A transaction with one compare on the key's mod revision; when the compare fails, the
    /// answer's first range is the key as it stands then.
    async fn guarded(
        &self,
        op: &'static str,
        lock: &str,
        mod_revision: i64,
        then: Vec<wire::RequestOp>,
    ) -> Result<TxnResponse> {
        let key = self.lock_key(lock).into_bytes();
        let txn = TxnRequest {
            compare: vec![wire::mod_revision_is(&key, mod_revision)],
            success: then,
            failure: vec![wire::get(&key)],
        };
        self.txn(op, txn).await
    }
}

fn no_answer(shown: &str) -> StoreError {
    StoreError::unavailable(format!("etcd store {shown}: no answer within {}s", REQUEST_TIMEOUT.as_secs()))
}

#[async_trait]
impl Store for EtcdStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        // No read first where the lock is expected free (a one-shot run, a standby whose watch
        // saw it deleted): grant and write at once, two round trips. A standby re-checking on
        // its own schedule (no DELETE seen) reads first: it need not grant (and revoke) a lease.
        if self.quietly_watching(lock) {
            let request = RangeRequest { key: self.lock_key(lock).into_bytes(), ..Default::default() };
            let read: wire::RangeResponse = self.call("get", self.connection.unary(path::RANGE, request)).await?;
            if let Some(kv) = read.kvs.first() {
                let record = self.record(lock, kv).await?;
                if record.is_held() {
                    self.note_held(lock, read.header.map(|h| h.revision));
                    return Ok(Acquire::Held(record));
                }
            }
        }
        // A waiter that wins leaves the queue in the same transaction, with the entries it
        // passed: the others see the new holder and the queue's change at one revision.
        let leaving = self.leaving(lock);
        let lease_id = self.grant(ttl).await?;
        let value =
            Value { holder: identity.to_string(), lease_id, acquired_ms: now_ms(), revoked: false, kept: false };
        let key = self.lock_key(lock).into_bytes();
        let txn = TxnRequest {
            compare: vec![wire::create_revision_is(&key, 0)],
            // Answers: 0 the put, 1 the token key's put, 2 the key as written, then the queue's.
            success: [
                wire::put(&key, self.encode(&value)?, lease_id),
                wire::put(self.token_key(lock).as_bytes(), Vec::new(), 0),
                wire::get(&key),
            ]
            .into_iter()
            .chain(leaving.iter().map(|entry| wire::delete(entry)))
            .collect(),
            failure: vec![wire::get(&key)],
        };
        let resp = match self.txn("acquire", txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // Taken or not, an unrenewed lease frees the key at its TTL.
                self.revoke_lease(lease_id).await;
                return Err(e);
            }
        };
        // The transaction may have reached etcd twice (sent again on another member when the
        // first was slow to answer): then the second finds the key written by the first, on
        // this very lease, as it stands now. It is judged as a renewal's read would judge it:
        // `leaderrun release` may have marked it revoked between the two copies.
        let written = if resp.succeeded {
            resp.range(2).first()
        } else {
            resp.range(0).first().filter(|kv| self.value(kv).is_ok_and(|v| v.lease_id == lease_id))
        };
        if let Some(kv) = written {
            let lease =
                Lease { lock: lock.to_string(), identity: identity.to_string(), token: kv.create_revision as u64 };
            // A holder waits for nothing: its watch would only pile up events.
            self.stop_watching();
            return Ok(match self.judge(&lease, Some(kv)).await? {
                Ok(_) => Acquire::Won(lease),
                // Won, and asked to stand down before it was told: not to be used. The
                // confirming renewal finds it revoked, and the run ends as a holder revoked
                // before its child started (giving the lease back).
                Err(_) => Acquire::Confirm { lease, after: Duration::ZERO },
            });
        }
        self.note_held(lock, resp.header.as_ref().map(|h| h.revision));
        // The unused lease is revoked while the holder's time left is read: one round trip.
        let record = async {
            match resp.range(0).first() {
                Some(kv) => self.record(lock, kv).await,
                None => Ok(LockRecord::free(lock)),
            }
        };
        let ((), record) = tokio::join!(self.revoke_lease(lease_id), record);
        Ok(Acquire::Held(record?))
    }

    async fn renew(&self, lease: &Lease, _ttl: Duration) -> Result<Renew> {
        let held = match self.remembered(lease) {
            Some(held) => held,
            None => match self.judge(lease, self.get_lock(&lease.lock).await?.as_ref()).await? {
                Ok(held) => held,
                Err(lost) => return Ok(lost),
            },
        };
        // The compare and the keep-alive travel together: one round trip.
        let key = self.lock_key(&lease.lock).into_bytes();
        let txn = TxnRequest {
            compare: vec![
                wire::create_revision_is(&key, lease.token as i64),
                wire::mod_revision_is(&key, held.mod_revision),
            ],
            success: vec![],
            failure: vec![wire::get(&key)],
        };
        // A waiter that won still has its queue entry's lease (the entry itself is gone): it
        // goes with the first renewal, in the same round trip, not on the handoff's path.
        let (checked, alive, ()) =
            tokio::join!(self.txn("renew-check", txn), self.keep_alive(held.lease_id), self.leave(self.spent()));
        let checked = checked?;
        let alive = if checked.succeeded {
            alive?
        } else {
            // Changed since this store last looked: judge what is there now.
            match self.judge(lease, checked.range(0).first()).await? {
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
            // untouched, and a lease that has lapsed is gone already. A queue entry's lease
            // still left from this store's wait (a hold shorter than a renewal) goes after it:
            // sent together, the two Raft writes could delay the DELETE that wakes the next.
            self.call("lease-revoke", self.connection.lease_revoke(held.lease_id)).await?;
            self.forget(lease);
            self.leave(self.spent()).await;
            return Ok(());
        }
        self.forget(lease);
        self.leave(self.spent()).await;
        self.release_by_read(lease, keep).await
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        // Both keys at one revision.
        let txn = TxnRequest {
            success: vec![wire::get(self.lock_key(lock).as_bytes()), wire::get(self.token_key(lock).as_bytes())],
            ..Default::default()
        };
        let resp = self.txn("status", txn).await?;
        self.note_read(lock, resp.header.as_ref().map(|h| h.revision));
        match (resp.range(0).first(), resp.range(1).first()) {
            (Some(kv), _) => self.record(lock, kv).await,
            (None, token) => Ok(Self::free_record(lock, token)),
        }
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let (locks, tokens) = (self.lock_key(""), self.token_key(""));
        let txn = TxnRequest {
            success: vec![wire::get_prefix(locks.as_bytes()), wire::get_prefix(tokens.as_bytes())],
            ..Default::default()
        };
        let resp = self.txn("list", txn).await?;
        let name = |kv: &KeyValue, prefix: &str| String::from_utf8_lossy(&kv.key[prefix.len()..]).into_owned();
        let mut records = BTreeMap::new();
        for kv in resp.range(1) {
            let lock = name(kv, &tokens);
            records.insert(lock.clone(), Self::free_record(&lock, Some(kv)));
        }
        for kv in resp.range(0) {
            let lock = name(kv, &locks);
            records.insert(lock.clone(), self.record(&lock, kv).await?);
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
            let value = self.value(&kv)?;
            if value.kept {
                // Only kept for --min-hold: no child runs under it and nobody is left to free
                // it. Revoking the keep's lease deletes the key if it is still attached to it
                // (a lock taken since is on another lease, untouched).
                self.call("lease-revoke", self.connection.lease_revoke(value.lease_id)).await?;
                return Ok(Some(before));
            }
            // Keep the lease: the lock stays taken until the holder frees it or it lapses.
            let revoked = self.encode(&Value { revoked: true, ..value })?;
            let put = wire::put_keeping_lease(self.lock_key(lock).as_bytes(), revoked);
            if self.guarded("revoke", lock, kv.mod_revision, vec![put]).await?.succeeded {
                return Ok(Some(before));
            }
        }
        Err(StoreError::unavailable(format!("etcd store {}: lock {lock:?} kept changing during revoke", self.shown)))
    }

    fn sees_expiry(&self) -> bool {
        // The key lives on its etcd lease: the server deletes it at expiry, and the watch sees that.
        true
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_turn(lock), max_wait).await
    }

    async fn stop_waiting(&self, lock: &str) {
        self.leave_queue(lock).await
    }

    fn observing(&self) -> super::Observing {
        // Every change to the record is a write to the lock key, expiry included (etcd deletes
        // the key with its lease); a renewal changes nothing there.
        super::Observing::Pushes
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.observe(lock), max_wait).await
    }
}
