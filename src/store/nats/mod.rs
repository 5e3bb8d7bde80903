//! NATS JetStream KV store:
//! `--store nats://[user:pass@|token@]host:4222[,host2:4222...][/BUCKET][?replicas=N&creds=FILE&tls=1&tlsca=FILE&tlscert=FILE&tlskey=FILE]`.
//!
//! One key per lock in a KV bucket (default `leaderrun`; the stream behind it is
//! `KV_<bucket>`, the key's subject `$KV.<bucket>.<key>`). A lock name that is a valid KV
//! key (`[-/_=.a-zA-Z0-9]`, no empty `.` token) and does not start with `=` is the key
//! verbatim; any other name is `=` followed by the unpadded base64url of its UTF-8, which
//! `list` decodes back.
//!
//! The entry's value is the holder's identity, plain bytes, exactly what Choria's leader
//! election writes: with `/CHORIA_LEADER_ELECTION` as the bucket and the lock name as the
//! key, a leaderrun holder is what `choria kv get` / `nats kv get` show as the leader, and a
//! Choria campaigner's create fails while leaderrun holds it (and the other way round).
//! leaderrun's own metadata rides in message headers: `Leaderrun-Token`,
//! `Leaderrun-Acquired-Ms` (the acquiring host's wall clock) and `Leaderrun-Revoked`.
//!
//! Every write is one JetStream publish carrying `Nats-Expected-Last-Subject-Sequence`:
//! the server applies it only if the key's last message is still the one read, a
//! compare-and-set on the stream leader (A1). Reads ask the stream leader too (a "raw"
//! message get, not a direct get, which a lagging replica may answer).
//!
//! - acquire: read the key's last message; if there is none, or it is a delete, purge or
//!   expiry marker, publish the identity expecting exactly that message (Choria's create);
//!   otherwise the lock is held (whoever wrote it: an entry without leaderrun's headers is
//!   held by its value, and its revision stands for its token, which changes at each of a
//!   Choria leader's renewals). A waiter whose turn just came (see changed) already saw the
//!   marker on its watch: its next acquire publishes expecting that marker without reading.
//! - fencing token = the stream sequence (the KV revision) of the acquiring message. Stream
//!   sequences only grow for the life of the stream, across deletes, expiries and server
//!   restarts, so every acquisition gets a larger token than all before it. Later writes of
//!   the same lease carry it in `Leaderrun-Token`, and so does the delete marker a release
//!   leaves, which is how `status` of a released lock still reports its last token. NEVER
//!   delete and recreate the bucket while it is in use: tokens would start again at 1.
//! - renew: republish the entry expecting the message this client last wrote for the lease
//!   (one request); if the server refuses (the record changed: revoked, deleted, taken) or
//!   this client wrote none, read it, check token, identity and `Leaderrun-Revoked`, and
//!   republish expecting the message read. Only an unchanged record is ever renewed.
//! - revoke: republish it with `Leaderrun-Revoked: 1`, the same value and the same TTL;
//!   nothing is freed. (This may extend the expiry by up to one ttl: the safe direction.) An
//!   entry marked `Leaderrun-Kept` (its child has exited) is deleted instead: free at once.
//! - release: a KV delete (`KV-Operation: DEL`) expecting the message this client last wrote
//!   for the lease (one request), or else the message read; a waiter's watch sees it at once. With --min-hold it republishes the entry with a TTL of the time left and
//!   `Leaderrun-Kept: 1`; nobody renews such an entry.
//! - changed: a KV watch on the key, and a core subscription on the key's own subject in the
//!   queue group `leaderrun`, both opened before a read (so a release between them is not
//!   missed) and kept across waits (closed when the lock is won), so an idle standby sends
//!   nothing. Every waiter's watch shows every delete, purge or expiry marker, but the server
//!   delivers a release's delete (a publish on that subject) to ONE member of the group: that
//!   waiter acts at once; every other one waits a random stagger of 100 to 300 ms and acts
//!   only if its watch has shown no new holder's PUT by then (`turn.rs`). A release thus costs
//!   the delete and one acquire whatever the number of waiters (with 100 waiters, about 74
//!   requests a handoff when every waiter acted, 2 now), and that acquire is one publish
//!   expecting the marker the watch showed, no read first (refused, it is a lost race: it
//!   reads and reports who holds the lock). The group also gets the publishes the stream
//!   refuses, so a delete chooses its waiter only for the marker that follows the message it
//!   names (`Nats-Expected-Last-Subject-Sequence`). A chosen waiter that does not act costs
//!   the others one stagger: one frozen (SIGSTOP: its connection is up, the server keeps
//!   choosing it), or on a host that vanished (a member until the server's pings give up on
//!   its connection; a killed process's connection closes at once). An expiry marker is
//!   stored by the server, never published: nobody is chosen, and the first stagger to run
//!   out takes the lock, at most 300 ms after the marker. All of it is a hint;
//!   the guarded publish is still the only way to the lease, and a waiter of an older
//!   leaderrun (in no group) acts at every release as it did, the publish deciding the race.
//!   A user that may not subscribe to `$KV.<bucket>.>` needs nothing more: the server refuses
//!   the queue subscription (asynchronously, delivering nothing to it; leaderrun warns), so
//!   that waiter is never chosen and takes a release after a stagger. In a bucket that leaves expiry markers the
//!   watch also sees a lease expire, and the waiting run re-reads only when `changed` returns.
//!
//! - observe_change (`leaderrun watch`, `observe.rs`): one KV watch on the key, kept across
//!   calls, outside the queue group; it sees every write (renewals too) and, where the bucket
//!   leaves them, expiry markers.
//!
//! Expiry. Where the bucket allows per-message TTL (`allow_msg_ttl`, nats-server 2.11+;
//! buckets leaderrun creates do), every write of a held lease carries `Nats-TTL` = ttl rounded
//! UP to whole seconds (the server's granularity), and the server removes the entry that long
//! after it stored it, leaving a marker that wakes watchers (`subject_delete_marker_ttl`).
//! A max age also caps a per-message TTL (the server removes a message at the earlier of the
//! two), so a --ttl longer than the bucket's max age is refused.
//! Otherwise (a Choria bucket: a bucket-wide max age, no per-message TTL) the entry lasts the
//! bucket's max age from its last write, and leaderrun campaigns as Choria does (`choria.rs`):
//! a win is `Acquire::Confirm`, trusted only after one campaign interval (0.75 × max age) +
//! 200 ms and a successful update, and a --ttl is at most that interval + 200 ms, so that no
//! evicted holder, Choria's or leaderrun's, overlaps a standby of either. A crashed holder's
//! lease still lasts the max age. A --min-hold keep there lasts the max age from the release
//! (more is refused); its `Leaderrun-Kept-Ms` lets leaderrun take it over when it ends.
//! A bucket with neither never expires anything, and is refused. Refusals of a bucket or a
//! ttl are `ErrorKind::Unfit`: configuration errors, found before anything is written.
//!
//! What is NOT guaranteed:
//! - nats-server times TTLs and max ages from each message's timestamp, its WALL clock: a
//!   forward step of the server's clock expires leases early. Slew it, never step it.
//! - Durability: a client cannot ask for it per write. The server must run with
//!   `jetstream { sync_interval: always }`, else an acknowledged acquisition can be lost in a
//!   crash of its host; in a cluster the bucket needs `?replicas=3` (or more) when created.
//! - Deleting the key by hand (`nats kv del`, Choria's evict) frees the lock at once: the
//!   holder stops its child at its next renewal. In a Choria bucket a standby's cool-down
//!   covers that; in leaderrun's own bucket a standby may start before it, unlike with
//!   `leaderrun release`.
//! - The bucket's settings are read once, when a run starts. leaderrun never creates
//!   `CHORIA_LEADER_ELECTION` (Choria refuses a bucket without a max age): Choria does.
//! - `held_since` and --min-hold use the acquiring host's wall clock; `expires_in` is the
//!   entry's server timestamp plus its lifetime minus this host's clock: display only. An
//!   entry a Choria campaigner wrote (no leaderrun headers) keeps only its last write (history
//!   1): it shows as `campaigner` (renewed at, every interval), its token is the revision of
//!   that last write and changes at every tick, and when it was first taken is unknown.
//! - After an expiry, or a delete by another tool, the marker left carries no token: `status`
//!   then shows token 0 (the next acquisition's token is larger all the same).
//!
//! A password or token never appears in a message: they are built from the URL with its
//! secrets replaced by `***`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream;
use async_nats::HeaderMap;
use async_trait::async_trait;
use futures_util::StreamExt;
use tokio::time::timeout;

use super::Access;
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};
use bucket::Bucket;
use cluster::lost_race;
use entry::{mine, Entry};
use errors::{describe, transient};
use headers::{
    delete_headers, lease_headers, ACQUIRED, EXPECTED, KEPT, KEPT_MS, KV_OPERATION, MARKER_REASON, REVOKED, TOKEN, TTL,
};
use keys::{key_of, lock_of};
pub use kind::KIND;
pub use target::Target;
use wait::Watching;
use written::{lease_key, Written};

mod bucket;
mod choria;
mod cluster;
mod connections;
mod entry;
mod errors;
mod headers;
mod keys;
mod kind;
mod observe;
mod record;
mod target;
mod turn;
mod wait;
mod written;

/// The bucket unless the URL has a path.
pub const DEFAULT_BUCKET: &str = "leaderrun";
/// Choria's leader election bucket, which leaderrun uses but never creates.
const CHORIA_BUCKET: &str = "CHORIA_LEADER_ELECTION";
/// Port when a host has none.
const DEFAULT_PORT: u16 = 4222;
/// Bound on every request (the elector bounds its calls too, usually tighter).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Guarded writes retried this often when the key changes under them before giving up.
const MAX_RACES: usize = 20;

/// Before the `race`th try of a guarded write (none before the first): 5 ms, doubling up to
/// 160 ms, 2.5 s over all the tries. A replicated stream refuses a write to a key while
/// another write to it is still being replicated, and a read meanwhile still shows the
/// message before it: tried again at once, a write could lose all its tries within the few
/// hundred milliseconds one write takes on a loaded cluster (two renewals of one lease at
/// once, or a copy sent again, did).
async fn after_race(race: usize) {
    if race > 0 {
        tokio::time::sleep(Duration::from_millis(5 << (race - 1).min(5))).await;
    }
}
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub struct NatsStore {
    /// The connections to the servers; `links.first.js` for what needs one connection only
    /// (the bucket's lookup, a watch, a list).
    links: connections::Links,
    bucket_name: String,
    replicas: usize,
    access: Access,
    /// Found (or created) once; while it does not exist, looked for on every call.
    bucket: tokio::sync::OnceCell<Bucket>,
    /// The last message this client wrote for each lease (lock, identity, token) it holds:
    /// a renewal expects exactly that message, one publish; when the server refuses it (the
    /// record changed: revoked, deleted, taken), the renewal reads and judges.
    written: std::sync::Mutex<HashMap<(String, String, u64), Written>>,
    /// The URL without its secrets, for messages.
    shown: String,
    /// The watch and queue subscription a waiting campaign keeps across `changed` calls.
    watching: tokio::sync::Mutex<Option<Watching>>,
    /// `leaderrun watch`'s watch on a lock's key, kept across `observe_change` calls.
    observed: tokio::sync::Mutex<Option<observe::Observed>>,
    /// The lock and the sequence of its key's last message as the last `status` read them.
    read_seq: std::sync::Mutex<Option<(String, u64)>>,
}

impl NatsStore {
    /// Parse the URL, connect (authenticating as the URL says) and look the bucket up, so an
    /// unreachable server or bad credentials are reported here, before anything runs.
    /// With `Access::Create` a missing bucket is created.
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let links = connections::connect_first(target).await?;
        let store = Self {
            links,
            bucket_name: target.bucket.clone(),
            replicas: target.replicas,
            access,
            bucket: tokio::sync::OnceCell::new(),
            written: Default::default(),
            shown,
            watching: Default::default(),
            observed: Default::default(),
            read_seq: Default::default(),
        };
        if let Err(mut e) = store.bucket().await {
            if e.message.contains("no responders") || e.message.contains("resource does not exist") {
                e.message.push_str(" (is JetStream enabled on the server?)");
            }
            return Err(e);
        }
        if access == Access::Create {
            // A run: its renewals may need another server (see `connections.rs`).
            store.links.open_second(target);
        }
        Ok(store)
    }

    fn js(&self) -> &jetstream::Context {
        &self.links.first.js
    }

    fn error(&self, text: String) -> StoreError {
        let message = format!("nats store {}: {}", self.shown, text.replace('\n', " "));
        if transient(&text) {
            StoreError::unavailable(message)
        } else {
            StoreError::refused(message)
        }
    }

    fn no_answer(&self) -> StoreError {
        StoreError::unavailable(format!("nats store {}: no answer within {}s", self.shown, REQUEST_TIMEOUT.as_secs()))
    }

    /// One request, bounded by REQUEST_TIMEOUT, with its error mapped.
    async fn call<T, E: std::error::Error>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = std::result::Result<T, E>>,
    ) -> Result<T> {
        // One line per request at -vvv: the benchmarks count them.
        tracing::trace!(op, "store request");
        match timeout(REQUEST_TIMEOUT, f).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(self.error(describe(&e))),
            Err(_) => Err(self.no_answer()),
        }
    }

    fn subject(&self, lock: &str) -> String {
        format!("$KV.{}.{}", self.bucket_name, key_of(lock))
    }

    /// The key's last message (from the stream leader); `None` if it has none. Over either
    /// link, sent again while the stream has no leader (see `connections.rs`).
    async fn read(&self, _bucket: &Bucket, lock: &str) -> Result<Option<Entry>> {
        use async_nats::jetstream::stream::LastRawMessageErrorKind as K;
        let (subject, stream) = (self.subject(lock), format!("KV_{}", self.bucket_name));
        let read = self.over_links("get", |js| {
            let (subject, stream) = (subject.clone(), stream.clone());
            async move {
                let stream = js.get_stream_no_info(stream).await.map_err(|e| describe(&e))?;
                match stream.get_last_raw_message_by_subject(&subject).await {
                    Ok(message) => Ok(Ok(Some(Entry::from_message(&message)))),
                    Err(e) if e.kind() == K::NoMessageFound => Ok(Ok(None)),
                    Err(e) if connections::passes(&describe(&e)) => Err(describe(&e)),
                    Err(e) => Ok(Err(describe(&e))),
                }
            }
        });
        match read.await {
            Ok(Ok(entry)) => Ok(entry),
            Ok(Err(why)) | Err(Some(why)) => Err(self.error(why)),
            Err(None) => Err(self.no_answer()),
        }
    }

    /// Publish to the lock's key if its last message is still `expected` (0: none).
    /// `Ok(None)` when it is not; else the new message's sequence.
    async fn publish(
        &self,
        op: &'static str,
        lock: &str,
        expected: u64,
        mut headers: HeaderMap,
        payload: &str,
    ) -> Result<Option<u64>> {
        headers.insert(EXPECTED, expected.to_string());
        let subject = self.subject(lock);
        match self.send(op, subject, headers, payload).await {
            Ok(Ok(ack)) => Ok(Some(ack.sequence)),
            Ok(Err(e)) if lost_race(&e) => Ok(None),
            Ok(Err(e)) => Err(self.error(describe(&e))),
            Err(Some(why)) => Err(self.error(why)),
            Err(None) => Err(self.no_answer()),
        }
    }

    /// Free the lease's entry (or keep it for what is left of `keep`, for --min-hold) if the
    /// key's last message is still `seq`; false if it is not.
    async fn release_at(
        &self,
        bucket: &Bucket,
        lease: &Lease,
        keep: Duration,
        seq: u64,
        acquired_ms: u64,
        revoked: bool,
    ) -> Result<bool> {
        let left = Duration::from_millis(acquired_ms.saturating_add(keep.as_millis() as u64).saturating_sub(now_ms()));
        let done = if !keep.is_zero() && !left.is_zero() {
            // --min-hold: the entry stays, with a TTL of the time left; the holder no
            // longer renews.
            let mut headers = lease_headers(bucket, Some(lease.token), acquired_ms, Some(left));
            headers.insert(KEPT, "1");
            headers.insert(KEPT_MS, (left.as_millis() as u64).to_string());
            if revoked {
                headers.insert(REVOKED, "1");
            }
            self.publish("release", &lease.lock, seq, headers, &lease.identity).await?
        } else {
            self.publish("release", &lease.lock, seq, delete_headers(lease.token), "").await?
        };
        Ok(done.is_some())
    }
}

#[async_trait]
impl Store for NatsStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let bucket = self.bucket_for_write().await?;
        self.check_ttl(bucket, ttl)?;
        // A waiter whose turn came saw the marker that freed the lock: it expects that one,
        // without a read. If someone else wrote since, the publish is refused: a lost race,
        // and the read below says who holds it.
        let mut woke = self.take_wake(lock);
        // The acquired times of the entries sent: one sent again (see `connections.rs`) may
        // find its earlier copy landed, and must know it for its own.
        let mut sent = Vec::new();
        for race in 0..MAX_RACES {
            after_race(race).await;
            let expected = match woke.take() {
                Some(marker) => marker,
                None => match self.read(bucket, lock).await? {
                    None => 0,
                    Some(e) if e.gone || bucket.keep_ended(&e) => e.seq,
                    Some(e) if mine(&e, identity, &sent) => {
                        let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token: e.seq };
                        return Ok(self.won(
                            bucket,
                            lease,
                            Written { seq: e.seq, acquired_ms: e.acquired_ms.unwrap_or(0) },
                        ));
                    }
                    Some(e) => {
                        self.note_held(lock, e.seq);
                        return Ok(Acquire::Held(self.record(bucket, lock, Some(&e))));
                    }
                },
            };
            // The token is this message's own sequence: no token header on the first write.
            let acquired_ms = now_ms();
            let headers = lease_headers(bucket, None, acquired_ms, Some(ttl));
            sent.push(acquired_ms);
            if let Some(token) = self.publish("acquire", lock, expected, headers, identity).await? {
                let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token };
                return Ok(self.won(bucket, lease, Written { seq: token, acquired_ms }));
            }
        }
        Err(StoreError::unavailable(format!("nats store {}: lock {lock:?} kept changing during acquire", self.shown)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let bucket = self.bucket_for_write().await?;
        self.check_ttl(bucket, ttl)?;
        let cached = self.written.lock().unwrap().get(&lease_key(lease)).copied();
        if let Some(last) = cached {
            let headers = lease_headers(bucket, Some(lease.token), last.acquired_ms, Some(ttl));
            if let Some(seq) = self.publish("renew", &lease.lock, last.seq, headers, &lease.identity).await? {
                self.remember(lease, Some(Written { seq, ..last }));
                return Ok(Renew::Renewed);
            }
            // Refused: the record changed. Perhaps by a renewal of this lease sent beside this
            // one (the elector's hedge) or an earlier copy of this one (`connections.rs`): the
            // read below finds the lease's own entry then, and renews it; anything else is
            // judged there, and never renewed.
            self.forget(lease, last.seq);
        }
        for race in 0..MAX_RACES {
            after_race(race).await;
            let Some(entry) = self.read(bucket, &lease.lock).await? else {
                return Ok(Renew::Lost(None));
            };
            if entry.gone {
                return Ok(Renew::Lost(None));
            }
            if entry.token != lease.token || entry.holder != lease.identity || entry.revoked || entry.kept {
                return Ok(Renew::Lost(Some(self.record(bucket, &lease.lock, Some(&entry)))));
            }
            let acquired_ms = entry.acquired_ms.unwrap_or_else(now_ms);
            let headers = lease_headers(bucket, Some(lease.token), acquired_ms, Some(ttl));
            if let Some(seq) = self.publish("renew", &lease.lock, entry.seq, headers, &lease.identity).await? {
                self.remember(lease, Some(Written { seq, acquired_ms }));
                return Ok(Renew::Renewed);
            }
        }
        Err(StoreError::unavailable(format!(
            "nats store {}: lock {:?} kept changing during renew",
            self.shown, lease.lock
        )))
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let bucket = self.bucket_for_write().await?;
        let cached = self.written.lock().unwrap().get(&lease_key(lease)).copied();
        self.remember(lease, None);
        // Expecting the message this client last wrote for the lease: if it is still the key's
        // last, the record is exactly that (this holder's, unrevoked), and one request frees it.
        if let Some(last) = cached {
            if self.release_at(bucket, lease, keep, last.seq, last.acquired_ms, false).await? {
                return Ok(());
            }
        }
        for race in 0..MAX_RACES {
            after_race(race).await;
            let Some(entry) = self.read(bucket, &lease.lock).await? else {
                return Ok(());
            };
            if entry.gone || entry.token != lease.token || entry.holder != lease.identity {
                return Ok(());
            }
            let acquired = entry.acquired_ms.unwrap_or_else(now_ms);
            if self.release_at(bucket, lease, keep, entry.seq, acquired, entry.revoked).await? {
                return Ok(());
            }
        }
        Err(StoreError::unavailable(format!(
            "nats store {}: lock {:?} kept changing during release",
            self.shown, lease.lock
        )))
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(LockRecord::free(lock));
        };
        let entry = self.read(bucket, lock).await?;
        self.note_read(lock, entry.as_ref().map_or(0, |e| e.seq));
        Ok(self.record(bucket, lock, entry.as_ref()))
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(Vec::new());
        };
        let prefix = format!("$KV.{}.", self.bucket_name);
        let subjects: Vec<(String, usize)> = self
            .call("list", async {
                let info = bucket.stream.info_with_subjects(format!("{prefix}>")).await?;
                info.collect::<Vec<_>>().await.into_iter().collect::<std::result::Result<Vec<_>, _>>()
            })
            .await?;
        let mut locks: Vec<String> =
            subjects.iter().filter_map(|(subject, _)| subject.strip_prefix(&prefix)).map(lock_of).collect();
        locks.sort();
        let mut records = Vec::with_capacity(locks.len());
        for lock in locks {
            let entry = self.read(bucket, &lock).await?;
            if entry.is_some() {
                records.push(self.record(bucket, &lock, entry.as_ref()));
            }
        }
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(None);
        };
        for race in 0..MAX_RACES {
            after_race(race).await;
            let Some(entry) = self.read(bucket, lock).await? else {
                return Ok(None);
            };
            if entry.gone {
                return Ok(None);
            }
            let before = self.record(bucket, lock, Some(&entry));
            if entry.kept {
                // A --min-hold keep: its child has exited and no holder is left to free it.
                if self.publish("revoke", lock, entry.seq, delete_headers(entry.token), "").await?.is_some() {
                    return Ok(Some(before));
                }
                continue;
            }
            // Same value, same token and TTL: nothing is freed.
            let ttl = entry.ttl_secs.map(Duration::from_secs);
            let acquired = entry
                .acquired_ms
                .unwrap_or_else(|| entry.written.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64));
            let mut headers = lease_headers(bucket, Some(entry.token), acquired, ttl);
            headers.insert(REVOKED, "1");
            if self.publish("revoke", lock, entry.seq, headers, &entry.holder).await?.is_some() {
                return Ok(Some(before));
            }
        }
        Err(StoreError::unavailable(format!("nats store {}: lock {lock:?} kept changing during revoke", self.shown)))
    }

    /// The longest ttl `check_ttl` lets through: in a Choria bucket one campaign interval +
    /// 200 ms, else the bucket's max age (it caps a per-message TTL too). None without a max
    /// age: per-message TTL sets no limit. A bucket that cannot hold leases is refused here.
    /// A replicated bucket's stream elects a new leader after losing its leader server: up to
    /// `target::STREAM_ELECTION`. One server's bucket has no election to ride out.
    async fn failover(&self) -> Result<Option<Duration>> {
        if self.replicas > 1 {
            // Asked for in the URL: known without a request (which the election may hold up).
            return Ok(Some(target::STREAM_ELECTION));
        }
        let replicated = self.bucket().await?.is_some_and(|bucket| bucket.replicas > 1);
        Ok(replicated.then_some(target::STREAM_ELECTION))
    }

    async fn longest_ttl(&self, _wanted: Duration) -> Result<Option<Duration>> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(None);
        };
        if let Some(Err(why)) = &bucket.choria {
            return Err(StoreError::unfit(format!("nats store {}: bucket {:?} {why}", self.shown, self.bucket_name)));
        }
        Ok(match bucket.choria() {
            Some(choria) => Some(choria.longest_ttl()),
            None => Some(bucket.max_age).filter(|age| !age.is_zero()),
        })
    }

    /// Without per-message TTL, a kept entry lasts the bucket's max age from the release, no
    /// longer: a keep (counted from the acquisition) up to that is kept in full.
    async fn longest_keep(&self) -> Result<Option<Duration>> {
        let Some(bucket) = self.bucket().await? else {
            return Ok(None);
        };
        Ok((!bucket.allow_ttl).then_some(bucket.max_age).filter(|age| !age.is_zero()))
    }

    /// True in a bucket where the server expires entries itself and leaves a marker that the
    /// watch sees (per-message TTL with delete markers, as in buckets leaderrun creates). A
    /// bucket with only a max age (Choria's) removes expired entries silently: false there.
    fn sees_expiry(&self) -> bool {
        self.bucket.get().is_some_and(|bucket| bucket.allow_ttl && bucket.markers)
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_turn(lock), max_wait).await
    }

    /// Every write is a message the watch shows (renewals too: each is a republish). An expiry
    /// is one only where the bucket leaves markers (`sees_expiry`); a Choria bucket's max age
    /// removes the entry silently.
    fn observing(&self) -> super::Observing {
        if self.sees_expiry() {
            super::Observing::Pushes
        } else {
            super::Observing::PushesWrites
        }
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.observe(lock), max_wait).await
    }
}
