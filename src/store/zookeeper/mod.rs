//! ZooKeeper store: `--store zk://[user:pass@]host:2181[,host2:2181...][/path]` (or `zookeeper://`).
//!
//! Nodes, under the root (`/leaderrun` unless the URL has a path):
//! - `{root}/{lock}`: one persistent node per lock name (the name percent-encoded where ZooKeeper
//!   would refuse it: `%`, `/`, control characters, the ranges ZooKeeper rejects, `.` and `..`).
//!   Never deleted: its child sequence counter is where tokens come from. Its data is the latest
//!   token, in decimal, so the status of a free lock still shows it. **Never delete these nodes by
//!   hand**: the tokens of that lock would start again.
//! - `{root}/{lock}/lease-NNNNNNNNNN`: ephemeral sequential children, data `{holder, acquired_ms,
//!   revoked, session_timeout_ms}` (JSON). The lowest-numbered child holds the lock.
//! - `{root}/{lock}/queue/w-{session}-NNNNNNNNNN`: the lock's queue of waiters, one ephemeral
//!   sequential node per waiting store (`queue.rs`). Only a hint of whose turn it is: who holds
//!   the lock is decided by the lease children alone. Under its own node, so it has a sequence
//!   counter of its own (the lock's tokens do not move on with it) and `list` never sees it.
//!
//! Sessions. A store first connects its reads session (asking 4 s): reads, watches and its place
//! in a queue, never a lease. The lease is a ZooKeeper session: each acquisition gets a session of
//! its own whose timeout is the ttl + 25% + the servers' tick (in ms, rounded up; see
//! `session_for` for why); its child lives as long as that session does. ZooKeeper's leader
//! expires a session when it has heard nothing from its client for the session timeout, on its
//! own clock, and rounds that up to the next expiry bucket (a tick); after a leader change or a
//! restart every session gets a fresh full timeout. Expiry is only ever later, never earlier. The
//! protocol does not carry the tick: the store bounds it by half the timeout the servers grant its
//! reads session (a server grants at least its `minSessionTimeout`, 2 ticks by default; see
//! `tick_bound`). If the server negotiates a lease's session SHORTER than asked (its
//! `maxSessionTimeout`, 20 ticks by default), acquire is refused: the server could expire the
//! lease before the holder's deadline. A longer one (its `minSessionTimeout`) is safe: takeover
//! is slower. Without --ttl, `longest_ttl` connects the session the default ttl's lease needs:
//! granted, the default fits (the servers are asked no more); cut short, what they granted is
//! their maxSessionTimeout, and the longest ttl within it is used. That session then serves the
//! lease, as does the session of a lease released or of an acquire that lost (the spare).
//!
//! - acquire: read first, on the reads session: the lock's children, and the lowest one's data if
//!   there is one (a held lock needs no write, nor a lease session). A free lock is taken on the
//!   lease's session by one multi-op: it creates an ephemeral sequential child and writes into the
//!   lock's node the token that child gets if no other child was created since the read, guarded
//!   by the node's data version as read (so of contenders that read the same free lock, one
//!   creates; the others read again). On a lock name's first acquire, the same multi-op creates
//!   the lock's node (with that token) and then the child. A child's sequence number is the count of children ever
//!   created under the node, which only grows, and the read tells that count (`next_sequence`): if
//!   ours equals it, no child was created between the read, which saw none, and ours, so ours is
//!   the only child, the lowest, and the lock is ours. That holds however stale the read was (a
//!   server behind the leader): the count pins the moment read. Otherwise the children are listed,
//!   as in ZooKeeper's lock recipe: the lowest existing child wins, so of many contenders exactly
//!   one does; if ours is not the lowest it is deleted again and the lowest one's record returned.
//! - fencing token = the child's sequence number + 1 (so that 0 stays "never acquired"). Sequence
//!   numbers come from the parent's count of children created, which only grows while the parent
//!   exists, and a later winner always has a later child. The token written with the create is
//!   only ever larger than the one stored: every child created before the read has a smaller
//!   number, and no token was written since (the version guard). If the count moved, the winner
//!   writes its own token after listing (guarded by the data version, only ever larger). The
//!   count is a signed 32-bit integer: after about a billion acquisitions of ONE lock name it
//!   would wrap, so such a lock then needs a new name (or path).
//! - renew: `sync`, then read our child ON THE SESSION THAT OWNS IT: gone → lost; revoked or
//!   another holder → lost (with the record); else renewed. The request itself tells the server
//!   the session is alive, so the leader cannot expire it before send time + ttl (`session_for`);
//!   `sync` goes through the leader, so a server cut off from it cannot confirm a renewal (but a
//!   `sync` does not tell the leader the session is alive: only the server's pings do).
//!   Between renewals the client library's heartbeats keep the session alive too; so that a lease
//!   its holder stops renewing lapses as in every other store, the store gives a lease's session
//!   up (without closing it: no more heartbeats, the server expires it one session timeout later)
//!   once `ttl` has passed since the latest renewal request that succeeded. A renewal through
//!   another client (any client may renew with the lease) only confirms that the child exists, is
//!   ephemeral and is not revoked: it cannot touch the owner's session.
//! - release: one multi-op deletes our child and our node in the lock's queue, if we have one
//!   (the waiters watching either wake up to a free lock). It is guarded by the child's version
//!   as this store created (or last renewed) it, and needs no read first: the store knows the
//!   child's data; after a revoke, or through another client, the child is read first. A session
//!   that is reconnecting (a process resumed after a freeze) is waited for, up to 2 s, rather than
//!   leaving the lock to lapse with the session. With --min-hold and time left, the same multi-op
//!   replaces the ephemeral child with a persistent one at the same path, data `{...,
//!   keep_until_ms}`: it outlives the session, and an acquirer that finds it lowest and past
//!   `keep_until_ms` on ITS wall clock deletes it (guarded by version) and tries again.
//! - revoke: `sync` (the lease may have been taken through another server), then set `revoked` in
//!   the holder's child, guarded by version: nothing is freed. A --min-hold child (persistent: its
//!   child has exited, no session holds it) is deleted instead, which frees the lock at once.
//! - abandon (after an acquire whose answer never came): delete every child of the lock that
//!   carries this run's identity, the holder's or one waiting behind it.
//! - changed: the first wait joins the lock's queue (a create on the reads session, a list of the
//!   queue; the first in it also lists the lock's children) and connects its next lease's session
//!   (so that its turn does not wait for a connect). Each waiter then watches the node just ahead
//!   of it in the queue, and the first the holder's child, for its deletion or change. The watch
//!   is kept across waits until it fires (closed when the lock is won), so an idle standby sends
//!   nothing while its holder lives. A store that wins keeps its place until it releases: its
//!   release wakes the one behind it alone, which reads the lock and takes it, so a handoff costs
//!   three requests (the release, a read, the acquiring multi-op) however many wait. A waiter
//!   woken to a lock still held (the one ahead gave up or died, or another contender won) watches
//!   anew: it lists the queue, and the lock's children if first, and sets one watch.
//!
//! What the queue costs when a store dies or goes away without a word (SIGKILL, a lost network,
//! a waiter whose --timeout ran out: the store never closes a session): its queue node stays until
//! its reads session times out, 4 s (or the servers' minSessionTimeout if longer) and up to a
//! tick. The one behind it then wakes and finds its place; meanwhile a release that only the
//! vanished one watched wakes nobody, so a handoff can wait that long (at most: the elector also
//! re-reads at least once a minute). A holder that dies loses its queue node after those 4 s, and
//! its lease when the lease's session expires (later, unless the ttl is very short): the next
//! waiter wakes to a lock still held, watches the lease's child and wakes again when it expires.
//!
//! Requests (each connect counted as one: the server creates a session). A one-shot run on a free
//! lock: connect the reads session, list the lock's children, connect the lease's session (with no
//! --ttl, `longest_ttl` connects it), the multi-op that takes it, the multi-op that releases it:
//! five, the first run on a lock name too. A one-shot run that finds the lock held: connect, list,
//! read the holder's child: three (four without --ttl). A waiting store: a read (two requests)
//! when the elector's safety net asks, nothing else while its holder lives.
//!
//! What is guaranteed: ZooKeeper orders all writes through its leader (linearizable writes,
//! acknowledged by a quorum). Reads are served by the server a client is connected to, which may
//! lag: renew and status first `sync` so that they see at least every write committed before. A
//! client library that cannot reach any server for 1.4 session timeouts gives its session up; the
//! store then opens a new one, and the leases of the old one are lost (renew says so).
//!
//! What is NOT guaranteed: --min-hold is judged on wall clocks (`acquired_ms` and `keep_until_ms`
//! from the releasing host, compared on the acquiring one): it is a convenience, not part of the
//! safety contract. ZooKeeper does not tell a client how long another session has left:
//! `expires_in` of a held lock is the holder's session timeout, an upper bound. A process that
//! exits or dies without release leaves its lease until its session times out, like a killed
//! process (the store never closes a session: a dropped store's leases lapse on their own).
//! A minSessionTimeout configured below 2 ticks makes the tick bound too short: not supported.
//! Servers before 3.5 are not supported. A run opens two connections (its reads session; its
//! lease's); ZooKeeper limits the connections per client address (`maxClientCnxns`, 60 by
//! default). A run finds a wrong password at its first request (its acquire), other commands when
//! they open the store.
//!
//! Auth: `user:pass@` is ZooKeeper's `digest` scheme; nodes are then created with a creator-only
//! ACL, so other credentials can neither read nor change them (ZooKeeper keeps no list of users:
//! a wrong password shows as "not authorized" on the nodes the right one created).
//! TLS: `?tls=1` (the Java client's `zookeeper.client.secure=true` is accepted too) connects
//! to the servers' `secureClientPort`, trusting the CA in `&cacert=FILE` (required: ZooKeeper
//! ensembles use private CAs), with a client certificate from `&cert=FILE&key=FILE` for
//! `ssl.clientAuth=need` (all PEM). A password never appears in a message: they are built
//! from `url::redact`.
//!
//! Files: `target.rs` the URL and TLS, `names.rs` lock names as node names, `sessions.rs` the
//! sessions, `failover.rs` how a session leaves a dead or frozen server, `nodes.rs` reading and
//! taking a lock's nodes, `queue.rs` the waiters' queue and their watches, `observe.rs`
//! `leaderrun watch`'s watches (on what `status` reads; no queue node), `errors.rs` ZooKeeper's errors in one line; the `Store` calls are here.

mod errors;
mod failover;
mod kind;
mod names;
mod nodes;
mod observe;
mod queue;
mod release;
mod sessions;
mod target;
mod timeouts;
mod value;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use zookeeper_client::{Error as ZkError, TlsOptions};

use super::Access;
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};
pub use kind::KIND;
use names::decode;
use nodes::{Attempt, Look, Lookup, Seen, MAX_RACES};
use release::Released;
use sessions::{reconnected, request, Held, Inner};
use target::tls_options;
pub use target::{Target, DEFAULT_ROOT};
use timeouts::{ceil_ms, longest_ttl_within, session_for, tick_bound, READS_SESSION};
use value::Value;

pub struct ZooKeeperStore {
    hosts: String,
    user: Option<(String, String)>,
    /// With TLS: the client's settings, read from the URL's files once.
    tls: Option<TlsOptions>,
    root: String,
    access: Access,
    /// The URL without its password, for messages.
    shown: String,
    inner: Arc<Mutex<Inner>>,
    /// The most the servers' tick can be (from the reads session's timeout: `tick_bound`).
    tick: Duration,
    /// The longest lease a run may ask for, once learned (`longest_ttl`).
    longest_ttl: tokio::sync::OnceCell<Duration>,
    /// This store's place in a lock's queue of waiters (`queue.rs`).
    place: Mutex<Option<queue::Place>>,
    /// The watch a waiting campaign keeps across `changed` calls (`queue::Watching`).
    watching: tokio::sync::Mutex<Option<queue::Watching>>,
    /// `leaderrun watch`'s watches, kept across `observe_change` calls (`observe.rs`).
    observed: tokio::sync::Mutex<Option<observe::Observed>>,
    /// What the last `status` read of a lock saw, for the watches to start from.
    read: Mutex<Option<(String, observe::Mark)>>,
}

impl ZooKeeperStore {
    /// Parse the URL and connect the reads session (with the digest credentials, if a user is
    /// given), which bounds the servers' tick: an unreachable ensemble is reported here, before
    /// anything runs. A command that only reads or revokes (`Access::Existing`) also reads the
    /// root, so that a wrong password is reported here too; a run finds it at its first request,
    /// which is its acquire, before anything runs as well. Nothing is created until a lock is
    /// acquired (only with `Access::Create`).
    pub async fn open(target: &Target, access: Access) -> Result<Self> {
        let shown = target.shown.clone();
        let tls = match &target.tls {
            Some(files) => Some(tls_options(files, &shown)?),
            None => None,
        };
        let mut store = Self {
            hosts: target.hosts.clone(),
            user: target.user.clone(),
            tls,
            root: target.root.clone(),
            access,
            shown,
            inner: Arc::new(Mutex::new(Inner::default())),
            tick: Duration::ZERO,
            longest_ttl: tokio::sync::OnceCell::new(),
            place: Mutex::new(None),
            watching: Default::default(),
            observed: Default::default(),
            read: Mutex::new(None),
        };
        let zk = store.connect(READS_SESSION).await?;
        store.tick = tick_bound(zk.granted());
        if access != Access::Create {
            let root = store.root.clone();
            match request("open", &zk, |c| c.get_data(&root)).await {
                Ok(_) | Err(ZkError::NoNode) => {}
                Err(e) => return Err(store.error("open", &e)),
            }
        }
        store.inner.lock().unwrap().reads = Some(zk);
        Ok(store)
    }

    fn session_too_short(&self, ttl: Duration, wanted: Duration, granted: Duration) -> StoreError {
        // The server could expire the lease before its holder's deadline. It clamped the
        // timeout asked for to its longest: what it granted is that. (A run with --lock-delay
        // learnt the longest first and refused a longer lease in words that name both.)
        StoreError::refused(format!(
            "zookeeper store {}: a --ttl of {} needs sessions of {} ms (ttl + 25% + a tick of at most {} ms), \
             but the server grants at most {} ms (its maxSessionTimeout, 20 ticks by default): use a --ttl of \
             at most {}, or raise maxSessionTimeout",
            self.shown,
            humantime::format_duration(ttl),
            wanted.as_millis(),
            self.tick.as_millis(),
            granted.as_millis(),
            humantime::format_duration(longest_ttl_within(granted, self.tick)),
        ))
    }

    /// The longest lease a run may ask for, as far as it needs to know. The store connects the
    /// session that `wanted` (the run's ttl + --lock-delay) needs: if the servers grant it, the
    /// lease fits and they are asked no more (that would take another session); if they cut it
    /// short, what they granted is their maxSessionTimeout, and the longest lease within it is
    /// returned. Either way that session is the spare: the run's lease uses it.
    async fn learn_longest_ttl(&self, wanted: Duration) -> Result<Duration> {
        let session = session_for(wanted, self.tick);
        let zk = self.connect(session).await?;
        let granted = zk.granted();
        self.give_back(zk);
        Ok(if granted >= session { wanted } else { longest_ttl_within(granted, self.tick) })
    }
}

#[async_trait]
impl Store for ZooKeeperStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let (ttl, wanted) = (Duration::from_millis(ceil_ms(ttl)), session_for(ttl, self.tick));
        self.inner.lock().unwrap().wanted = Some(wanted);
        if let Some(granted) = self.spare_cut_short(wanted) {
            return Err(self.session_too_short(ttl, wanted, granted));
        }
        let reads = self.read_session().await?;
        for _ in 0..MAX_RACES {
            // A read first: a held lock needs no write (and no lease session).
            let seen = match self.look(&reads, lock).await? {
                Look::Free(seen) => seen,
                Look::Held(record) => return Ok(Acquire::Held(record)),
                // The first acquire of this lock name: its node is made with the child.
                Look::Missing if self.access == Access::Create => Seen::MISSING,
                Look::Missing => {
                    return Err(StoreError::refused(format!(
                        "zookeeper store {}: {} does not exist",
                        self.shown, self.root
                    )))
                }
                Look::KeepOver { path, stat } => {
                    // A --min-hold child whose time has passed: clear it and look again.
                    match request("delete-kept", &reads, |c| c.delete(&path, Some(stat.version))).await {
                        Ok(()) | Err(ZkError::NoNode) | Err(ZkError::BadVersion) => continue,
                        Err(e) => return Err(self.error("delete-kept", &e)),
                    }
                }
            };
            let zk = self.take_session(wanted).await?;
            if zk.granted() < wanted {
                let granted = zk.granted();
                self.give_back(zk);
                return Err(self.session_too_short(ttl, wanted, granted));
            }
            let sent = Instant::now();
            match self.create_lease(&zk, lock, identity, seen).await {
                Ok(Attempt::Won(lease, value)) => {
                    let path = self.lease_path(&lease).expect("a won lease has a token");
                    let held = Held { zk, ttl, renewed_at: sent, value, version: 0 };
                    self.inner.lock().unwrap().leases.insert(path.clone(), held);
                    self.expire_unrenewed(path);
                    self.stop_watching();
                    return Ok(Acquire::Won(lease));
                }
                Ok(Attempt::Held(record, clean)) => {
                    if clean {
                        self.give_back(zk);
                    }
                    return Ok(Acquire::Held(record));
                }
                Ok(Attempt::Raced) => self.give_back(zk),
                Ok(Attempt::NoRoot) => {
                    self.give_back(zk);
                    self.ensure_node(&reads, &self.root).await?;
                }
                // The session is dropped: a child an ambiguous create may have left lapses with it.
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<Renew> {
        let Some(path) = self.lease_path(lease) else {
            return Ok(Renew::Lost(None));
        };
        let own = {
            let inner = self.inner.lock().unwrap();
            if inner.abandoned.contains(&path) {
                return Ok(Renew::Lost(None));
            }
            inner.leases.get(&path).map(|held| held.zk.clone())
        };
        let Some(zk) = own else {
            // Another client's lease: confirm that it is there, unrevoked and still that holder's.
            let zk = self.read_session().await?;
            return match self.sync_read("renew", &zk, &path).await {
                Ok(None) => Ok(Renew::Lost(None)),
                Ok(Some((value, stat))) => {
                    if value.holder != lease.identity || value.revoked || stat.ephemeral_owner == 0 {
                        Ok(Renew::Lost(Some(Self::record(&lease.lock, lease.token as i64 - 1, &value, &stat))))
                    } else {
                        Ok(Renew::Renewed)
                    }
                }
                Err(e) => Err(self.error("renew", &e)),
            };
        };
        if !zk.live() {
            self.forget(&path);
            return Ok(Renew::Lost(None));
        }
        let (ttl, wanted) = (Duration::from_millis(ceil_ms(ttl)), session_for(ttl, self.tick));
        if zk.granted() < wanted {
            return Err(StoreError::refused(format!(
                "zookeeper store {}: cannot renew for {} ms a lease whose session times out after {} ms",
                self.shown,
                ttl.as_millis(),
                zk.granted().as_millis()
            )));
        }
        let sent = Instant::now();
        let found = match self.sync_read("renew", &zk, &path).await {
            Ok(found) => found,
            Err(ZkError::SessionExpired) | Err(ZkError::ClientClosed) => {
                self.forget(&path);
                return Ok(Renew::Lost(None));
            }
            Err(e) => return Err(self.error("renew", &e)),
        };
        let Some((value, stat)) = found else {
            self.forget(&path);
            return Ok(Renew::Lost(None));
        };
        if value.holder != lease.identity || value.revoked || stat.ephemeral_owner != zk.id() {
            return Ok(Renew::Lost(Some(Self::record(&lease.lock, lease.token as i64 - 1, &value, &stat))));
        }
        let mut inner = self.inner.lock().unwrap();
        match inner.leases.get_mut(&path) {
            Some(held) => {
                held.renewed_at = held.renewed_at.max(sent);
                held.ttl = ttl;
                held.version = stat.version;
                Ok(Renew::Renewed)
            }
            // Given up while the request was out.
            None => Ok(Renew::Lost(None)),
        }
    }

    async fn release(&self, lease: &Lease, keep: Duration) -> Result<()> {
        let Some(path) = self.lease_path(lease) else {
            return Ok(());
        };
        let own = self
            .inner
            .lock()
            .unwrap()
            .leases
            .get(&path)
            .filter(|held| held.zk.live() && held.value.holder == lease.identity)
            .map(|held| (held.zk.clone(), held.value.clone(), held.version));
        let mut place = self.place_path(&lease.lock);
        let mut lost_connection = false;
        if let Some((zk, value, version)) = &own {
            // Our own lease, as this store created it: no read first.
            for _ in 0..3 {
                reconnected(zk).await;
                match self.release_in_one(zk, &path, (value, *version), keep, place.as_deref()).await {
                    Ok(Released::Done) => {
                        self.retire(&path);
                        self.forget_place(&lease.lock);
                        return Ok(());
                    }
                    Ok(Released::PlaceGone) => place = None,
                    Ok(Released::Changed) => break,
                    // Once: the connection was found dead while the request was out. Done or
                    // not, the same guarded request again is safe (the child is gone, or is the
                    // same --min-hold child, or is as it was).
                    Err(ZkError::ConnectionLoss) if !lost_connection => lost_connection = true,
                    Err(e) => return Err(self.error("release", &e)),
                }
            }
        }
        let zk = match own {
            Some((zk, ..)) => zk,
            None => self.read_session().await?,
        };
        reconnected(&zk).await;
        for _ in 0..MAX_RACES {
            let Some((value, stat)) = self.read_child("release", &zk, &path).await? else {
                break;
            };
            if value.holder != lease.identity {
                break;
            }
            match self.release_in_one(&zk, &path, (&value, stat.version), keep, None).await {
                Ok(Released::Done) => break,
                Ok(Released::PlaceGone | Released::Changed) => continue,
                Err(e) => return Err(self.error("release", &e)),
            }
        }
        self.retire(&path);
        if let Some(place) = place {
            // Best effort: the node goes with this store's reads session anyway.
            let _ = request("leave", &zk, |c| c.delete(&place, None)).await;
        }
        self.forget_place(&lease.lock);
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let zk = self.read_session().await?;
        self.sync_root(&zk).await?;
        let (lookup, mark) = self.lookup_marked("status", &zk, lock).await?;
        self.note_read(lock, mark);
        Ok(Self::lookup_record(lock, &lookup))
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let zk = self.read_session().await?;
        self.sync_root(&zk).await?;
        let root = self.root.clone();
        let names = match request("list", &zk, |c| c.list_children(&root)).await {
            Ok(names) => names,
            Err(ZkError::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error("list", &e)),
        };
        let mut locks: Vec<String> = names.iter().filter_map(|n| decode(n)).collect();
        locks.sort();
        let mut records = Vec::with_capacity(locks.len());
        for lock in locks {
            let lookup = self.lookup("status", &zk, &lock).await?;
            records.push(Self::lookup_record(&lock, &lookup));
        }
        Ok(records)
    }

    async fn revoke(&self, lock: &str) -> Result<Option<LockRecord>> {
        let zk = self.read_session().await?;
        // The lease may have been taken through another server: see every write committed before.
        self.sync_root(&zk).await?;
        for _ in 0..MAX_RACES {
            let Lookup::Lowest { seq, value, stat } = self.lookup("get", &zk, lock).await? else {
                return Ok(None);
            };
            let before = Self::record(lock, seq, &value, &stat);
            if !before.is_held() {
                return Ok(None);
            }
            let path = self.child(lock, seq);
            let done = if stat.ephemeral_owner == 0 {
                // A --min-hold keep (a persistent child): its child has exited and no holder is left
                // to free it, so it is deleted now.
                request("revoke", &zk, |c| c.delete(&path, Some(stat.version))).await
            } else {
                let data = serde_json::to_vec(&Value { revoked: true, ..value }).unwrap();
                request("revoke", &zk, |c| c.set_data(&path, &data, Some(stat.version))).await.map(drop)
            };
            match done {
                Ok(()) => return Ok(Some(before)),
                Err(ZkError::BadVersion) | Err(ZkError::NoNode) => continue,
                Err(e) => return Err(self.error("revoke", &e)),
            }
        }
        Err(StoreError::unavailable(format!(
            "zookeeper store {}: lock {lock:?} kept changing during revoke",
            self.shown
        )))
    }

    /// Every child of the lock that carries this identity is deleted, not only the holder's: an
    /// acquire whose answer never came may have left its child behind the holder's, and that
    /// child would hold the lock for nobody once the holder is gone, until its session times out.
    async fn abandon(&self, lock: &str, identity: &str) -> Result<()> {
        let zk = self.read_session().await?;
        let parent = self.parent(lock);
        // The acquire may have gone through another server: see every write committed before.
        match request("sync", &zk, |c| c.sync(&parent)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        let Some((seqs, _)) = self.children("abandon", &zk, lock).await? else {
            return Ok(());
        };
        for seq in seqs {
            let path = self.child(lock, seq);
            for _ in 0..MAX_RACES {
                let Some((value, stat)) = self.read_child("abandon", &zk, &path).await? else {
                    break;
                };
                if value.holder != identity {
                    break;
                }
                match request("abandon", &zk, |c| c.delete(&path, Some(stat.version))).await {
                    Ok(()) | Err(ZkError::NoNode) => break,
                    Err(ZkError::BadVersion) => continue,
                    Err(e) => return Err(self.error("abandon", &e)),
                }
            }
            self.retire(&path);
        }
        Ok(())
    }

    /// The longest lease whose session the servers grant, up to `wanted`: a run needs to know
    /// no more (`learn_longest_ttl`). Learned once, for the first `wanted` (a run asks once).
    async fn longest_ttl(&self, wanted: Duration) -> Result<Option<Duration>> {
        Ok(Some(*self.longest_ttl.get_or_try_init(|| self.learn_longest_ttl(wanted)).await?))
    }

    fn sees_expiry(&self) -> bool {
        // The lease is an ephemeral node: the server deletes it when the session expires, and the
        // watch of the first waiter sees that (a --min-hold node is waited for until its keep
        // ends); a waiter further back wakes when the one ahead of it leaves the queue.
        true
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_change(lock), max_wait).await
    }

    async fn stop_waiting(&self, lock: &str) {
        self.leave_queue(lock).await
    }

    fn observing(&self) -> super::Observing {
        // The holder's child is ephemeral: its session's expiry deletes it, and the watch on the
        // lock's children sees that. A kept lease's end is timed by `observe` itself.
        super::Observing::Pushes
    }

    async fn observe_change(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.observe(lock), max_wait).await
    }
}
