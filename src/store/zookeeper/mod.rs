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
//!
//! The lease is a ZooKeeper session. Each acquisition gets a session of its own whose timeout is
//! the ttl + 25% + the servers' tick (in ms, rounded up; see `session_for` for why); its child
//! lives as long as that session does. ZooKeeper's leader expires a session when it has heard
//! nothing from its client for the session timeout, on its own clock, and rounds that up to the
//! next expiry bucket (a tick); after a leader change or a restart every session gets a fresh full
//! timeout. Expiry is only ever later, never earlier. The protocol does not carry the tick: the
//! store bounds it by half the timeout the servers grant its first session, which asks for 4 s
//! (a server grants at least its `minSessionTimeout`, 2 ticks by default; see `tick_bound`). If
//! the server negotiates a timeout SHORTER than asked (its `maxSessionTimeout`, 20 ticks by
//! default), acquire is refused: the server could expire the lease before the holder's deadline;
//! `longest_ttl` learns that limit by asking for a session longer than any. A longer one (its
//! `minSessionTimeout`) is safe: takeover is slower.
//!
//! - acquire: read first (a held lock needs no write); else create an ephemeral sequential child
//!   and list the children: if ours is the lowest, the lock is ours (the recipe of ZooKeeper's
//!   lock: the lowest existing child wins, so of many contenders exactly one does); if not, ours is
//!   deleted again and the lowest one's record returned.
//! - fencing token = the child's sequence number + 1 (so that 0 stays "never acquired"). Sequence
//!   numbers come from the parent's child counter, which only grows while the parent exists, and a
//!   later winner always has a later child. The winner writes its token into the parent's data
//!   (guarded by the data version, only ever larger). That counter is a signed 32-bit integer
//!   that every child creation and deletion moves on: after about a billion acquisitions of ONE
//!   lock name it would wrap, so such a lock then needs a new name (or path).
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
//! - release: delete our child (waiters watching it wake up). With --min-hold and time left, one
//!   multi-op replaces the ephemeral child with a persistent one at the same path, data
//!   `{..., keep_until_ms}`: it outlives the session, and an acquirer that finds it lowest and
//!   past `keep_until_ms` on ITS wall clock deletes it (guarded by version) and tries again.
//! - revoke: set `revoked` in the holder's child, guarded by version: nothing is freed. A --min-hold
//!   child (persistent: its child has exited, no session holds it) is deleted instead, which frees
//!   the lock at once.
//! - abandon (after an acquire whose answer never came): delete every child of the lock that
//!   carries this run's identity, the holder's or one waiting behind it.
//! - changed: a watch on the lowest child (the holder: the "predecessor" of every contender), for
//!   its deletion or change. It is kept across waits until it fires (closed when the lock is
//!   won), so an idle standby sends nothing while its holder lives.
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
//! Servers before 3.5 are not supported. A run opens two connections (reads and watches; its
//! lease), and a third for a moment to learn the longest session when no --ttl is given;
//! ZooKeeper limits the connections per client address (`maxClientCnxns`, 60 by default).
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
//! session pool, `nodes.rs` reading and taking a lock's nodes, `errors.rs` ZooKeeper's errors in
//! one line; the `Store` calls are here.

mod errors;
mod names;
mod nodes;
mod sessions;
mod target;
mod timeouts;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use zookeeper_client::{CreateMode, Error as ZkError, TlsOptions};

use super::url::Access;
use super::{Acquire, Lease, LockRecord, Renew, Result, Store, StoreError};
use names::decode;
use nodes::{now_ms, Attempt, Lookup, Value, MAX_RACES};
use sessions::{Held, Inner, Zk};
use target::tls_options;
pub use target::{Target, DEFAULT_ROOT};
use timeouts::{ceil_ms, longest_ttl_within, session_for, tick_bound, SPARE_SESSION};

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
    /// The most the servers' tick can be (from the first session's timeout: `tick_bound`).
    tick: Duration,
    /// The longest session the servers grant, once asked (`longest_ttl`).
    longest_session: tokio::sync::OnceCell<Duration>,
    /// The watch a waiting campaign keeps across `changed` calls (`nodes::Watching`).
    watching: tokio::sync::Mutex<Option<nodes::Watching>>,
}

impl ZooKeeperStore {
    /// Parse the URL and connect (with the digest credentials, if a user is given), then read the
    /// root once, so an unreachable ensemble or a wrong password is reported here, before anything
    /// runs. Nothing is created until a lock is acquired (only with `Access::Create`).
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
            longest_session: tokio::sync::OnceCell::new(),
            watching: Default::default(),
        };
        let zk = store.connect(SPARE_SESSION).await?;
        store.tick = tick_bound(zk.granted());
        let root = store.root.clone();
        match store.req("open", &zk, |c| c.get_data(&root)).await {
            Ok(_) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(store.error("open", &e)),
        }
        store.inner.lock().unwrap().spare = Some(zk);
        Ok(store)
    }
}

#[async_trait]
impl Store for ZooKeeperStore {
    async fn acquire(&self, lock: &str, identity: &str, ttl: Duration) -> Result<Acquire> {
        let (ttl, wanted) = (Duration::from_millis(ceil_ms(ttl)), session_for(ttl, self.tick));
        let zk = self.take_session(wanted).await?;
        if zk.granted() < wanted {
            // The server could expire the lease before its holder's deadline. It clamped the
            // timeout asked for to its longest: what it granted is that.
            let message = format!(
                "zookeeper store {}: a --ttl of {} needs sessions of {} ms (ttl + 25% + a tick of at most {} ms), \
                 but the server grants at most {} ms (its maxSessionTimeout, 20 ticks by default): use a --ttl of \
                 at most {}, or raise maxSessionTimeout",
                self.shown,
                humantime::format_duration(ttl),
                wanted.as_millis(),
                self.tick.as_millis(),
                zk.granted().as_millis(),
                humantime::format_duration(longest_ttl_within(zk.granted(), self.tick)),
            );
            self.give_back(zk);
            return Err(StoreError::refused(message));
        }
        let sent = Instant::now();
        match self.acquire_on(&zk, lock, identity).await {
            Ok(Attempt::Won(lease)) => {
                let path = self.lease_path(&lease).expect("a won lease has a token");
                let held = Held { zk, ttl, renewed_at: sent };
                self.inner.lock().unwrap().leases.insert(path.clone(), held);
                self.expire_unrenewed(path);
                self.stop_watching();
                Ok(Acquire::Won(lease))
            }
            Ok(Attempt::Held(record, clean)) => {
                if clean {
                    self.give_back(zk);
                }
                Ok(Acquire::Held(record))
            }
            // The session is dropped: a child an ambiguous create may have left lapses with it.
            Err(e) => Err(e),
        }
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
        let own = self.inner.lock().unwrap().leases.get(&path).map(|held| held.zk.clone()).filter(Zk::live);
        let zk = match &own {
            Some(zk) => zk.clone(),
            None => self.read_session().await?,
        };
        for _ in 0..MAX_RACES {
            let Some((value, stat)) = self.read_child("release", &zk, &path).await? else {
                break;
            };
            if value.holder != lease.identity {
                return Ok(());
            }
            let until_ms = value.acquired_ms.saturating_add(keep.as_millis() as u64);
            let result = if keep.is_zero() || until_ms <= now_ms() {
                self.req("release", &zk, |c| c.delete(&path, Some(stat.version))).await
            } else {
                // --min-hold: a persistent child in place of the ephemeral one, in one step.
                let kept = Value { keep_until_ms: Some(until_ms), ..value };
                let data = serde_json::to_vec(&kept).unwrap();
                let options = CreateMode::Persistent.with_acls(self.acls());
                let mut multi = zk.client.new_multi_writer();
                multi.add_delete(&path, Some(stat.version)).map_err(|e| self.error("release", &e))?;
                multi.add_create(&path, &data, &options).map_err(|e| self.error("release", &e))?;
                self.req("release", &zk, |_| async move { multi.commit().await.map(drop).map_err(ZkError::from) }).await
            };
            match result {
                Ok(()) | Err(ZkError::NoNode) => break,
                Err(ZkError::BadVersion) => continue,
                Err(e) => return Err(self.error("release", &e)),
            }
        }
        self.retire(&path);
        Ok(())
    }

    async fn status(&self, lock: &str) -> Result<LockRecord> {
        let zk = self.read_session().await?;
        match self.req("sync", &zk, |c| c.sync(&self.root)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        let lookup = self.lookup("status", &zk, lock).await?;
        Ok(Self::lookup_record(lock, &lookup))
    }

    async fn list(&self) -> Result<Vec<LockRecord>> {
        let zk = self.read_session().await?;
        match self.req("sync", &zk, |c| c.sync(&self.root)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(self.error("sync", &e)),
        }
        let root = self.root.clone();
        let names = match self.req("list", &zk, |c| c.list_children(&root)).await {
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
                self.req("revoke", &zk, |c| c.delete(&path, Some(stat.version))).await
            } else {
                let data = serde_json::to_vec(&Value { revoked: true, ..value }).unwrap();
                self.req("revoke", &zk, |c| c.set_data(&path, &data, Some(stat.version))).await.map(drop)
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
        match self.req("sync", &zk, |c| c.sync(&parent)).await {
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
                match self.req("abandon", &zk, |c| c.delete(&path, Some(stat.version))).await {
                    Ok(()) | Err(ZkError::NoNode) => break,
                    Err(ZkError::BadVersion) => continue,
                    Err(e) => return Err(self.error("abandon", &e)),
                }
            }
            self.retire(&path);
        }
        Ok(())
    }

    /// The longest ttl whose session the servers grant: their maxSessionTimeout, learned once by
    /// asking for a longer session, less the tick and over 5/4 (`session_for` inverted).
    async fn longest_ttl(&self) -> Result<Option<Duration>> {
        let longest = *self.longest_session.get_or_try_init(|| self.ask_longest_session()).await?;
        Ok(Some(longest_ttl_within(longest, self.tick)))
    }

    fn sees_expiry(&self) -> bool {
        // The lease is an ephemeral node: the server deletes it when the session expires, and the
        // watch sees that (a --min-hold node is waited for until its keep ends).
        true
    }

    async fn changed(&self, lock: &str, max_wait: Duration) {
        super::watch_at_most(self.wait_change(lock), max_wait).await
    }
}
