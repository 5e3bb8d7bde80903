//! The lock's nodes: the lease children's data, reading what holds a lock, and taking it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use zookeeper_client::{Acls, CreateMode, Error as ZkError, Stat};

use super::names::{encode, sequence, LEASE_PREFIX};
use super::sessions::Zk;
use super::ZooKeeperStore;
use crate::store::url::Access;
use crate::store::{Lease, LockRecord, Result, StoreError};

/// Guarded writes retried this often when a node changes under them before giving up.
pub(super) const MAX_RACES: usize = 20;

/// The data of a lease child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Value {
    pub(super) holder: String,
    /// The acquiring host's wall clock (ms since the epoch): display and --min-hold.
    pub(super) acquired_ms: u64,
    #[serde(default)]
    pub(super) revoked: bool,
    /// The owner session's timeout: the most the lease can have left.
    #[serde(default)]
    pub(super) session_timeout_ms: u64,
    /// Set on the persistent child a release with --min-hold leaves (wall clock, ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) keep_until_ms: Option<u64>,
}

/// What the lowest child of a lock says.
pub(super) enum Lookup {
    /// No lease child: the latest token (from the parent's data).
    Free(u64),
    /// The lowest child (which may be a --min-hold child whose time has passed).
    Lowest { seq: i64, value: Value, stat: Stat },
}

/// What `acquire_on` decided.
pub(super) enum Attempt {
    Won(Lease),
    /// Held by another; `clean`: our child (if we made one) is deleted, the session reusable.
    Held(LockRecord, bool),
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl ZooKeeperStore {
    pub(super) fn parent(&self, lock: &str) -> String {
        format!("{}/{}", self.root, encode(lock))
    }

    pub(super) fn child(&self, lock: &str, seq: i64) -> String {
        format!("{}/{LEASE_PREFIX}{seq:010}", self.parent(lock))
    }

    /// The child a lease lives in (`None` for token 0, which no lease has).
    pub(super) fn lease_path(&self, lease: &Lease) -> Option<String> {
        (lease.token > 0 && lease.token <= i64::MAX as u64).then(|| self.child(&lease.lock, lease.token as i64 - 1))
    }

    pub(super) fn acls(&self) -> Acls<'static> {
        if self.user.is_some() {
            Acls::creator_all()
        } else {
            Acls::anyone_all()
        }
    }
    /// The data and stat of a lease child (`None` if it does not exist).
    pub(super) async fn read_child(&self, op: &'static str, zk: &Zk, path: &str) -> Result<Option<(Value, Stat)>> {
        match self.req(op, zk, |c| c.get_data(path)).await {
            Ok((data, stat)) => match serde_json::from_slice::<Value>(&data) {
                Ok(value) => Ok(Some((value, stat))),
                Err(e) => Err(StoreError::refused(format!(
                    "zookeeper store {}: the node {path:?} is not leaderrun's ({e})",
                    self.shown
                ))),
            },
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// The sequence numbers of a lock's lease children, lowest first, and the parent's stat
    /// (`None` if the lock has no node).
    pub(super) async fn children(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<Option<(Vec<i64>, Stat)>> {
        let parent = self.parent(lock);
        match self.req(op, zk, |c| c.get_children(&parent)).await {
            Ok((names, stat)) => {
                let mut seqs: Vec<i64> = names.iter().filter_map(|n| sequence(n)).collect();
                seqs.sort_unstable();
                Ok(Some((seqs, stat)))
            }
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// The latest token, from the parent's data.
    pub(super) async fn last_token(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<u64> {
        let parent = self.parent(lock);
        match self.req(op, zk, |c| c.get_data(&parent)).await {
            Ok((data, _)) => Ok(String::from_utf8_lossy(&data).trim().parse().unwrap_or(0)),
            Err(ZkError::NoNode) => Ok(0),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// What holds a lock: its lowest lease child, read.
    pub(super) async fn lookup(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<Lookup> {
        for _ in 0..MAX_RACES {
            let Some((seqs, _)) = self.children(op, zk, lock).await? else {
                return Ok(Lookup::Free(0));
            };
            let Some(&seq) = seqs.first() else {
                return Ok(Lookup::Free(self.last_token(op, zk, lock).await?));
            };
            // Gone between the two reads: look again.
            if let Some((value, stat)) = self.read_child(op, zk, &self.child(lock, seq)).await? {
                return Ok(Lookup::Lowest { seq, value, stat });
            }
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    /// The record of a lease child. A --min-hold child whose time has passed is a free lock.
    pub(super) fn record(lock: &str, seq: i64, value: &Value, stat: &Stat) -> LockRecord {
        let token = seq as u64 + 1;
        let expires_in = if stat.ephemeral_owner != 0 {
            Duration::from_millis(value.session_timeout_ms)
        } else {
            let left = value.keep_until_ms.unwrap_or(0).saturating_sub(now_ms());
            if left == 0 {
                return LockRecord { token, ..LockRecord::free(lock) };
            }
            Duration::from_millis(left)
        };
        LockRecord {
            lock: lock.to_string(),
            holder: Some(value.holder.clone()),
            token,
            held_since: Some(UNIX_EPOCH + Duration::from_millis(value.acquired_ms)),
            expires_in: Some(expires_in),
            revoked: value.revoked,
            campaigner: None,
        }
    }

    pub(super) fn lookup_record(lock: &str, lookup: &Lookup) -> LockRecord {
        match lookup {
            Lookup::Free(token) => LockRecord { token: *token, ..LockRecord::free(lock) },
            Lookup::Lowest { seq, value, stat } => Self::record(lock, *seq, value, stat),
        }
    }

    /// Create the root and the lock's node (persistent; an existing one is fine).
    pub(super) async fn ensure_parent(&self, zk: &Zk, lock: &str) -> Result<()> {
        if self.access != Access::Create {
            return Err(StoreError::refused(format!("zookeeper store {}: {} does not exist", self.shown, self.root)));
        }
        let parent = self.parent(lock);
        let options = CreateMode::Persistent.with_acls(self.acls());
        match self.req("create-parent", zk, |c| async move { c.mkdir(&parent, &options).await }).await {
            Ok(()) | Err(ZkError::NodeExists) => Ok(()),
            Err(e) => Err(self.error("create-parent", &e)),
        }
    }

    /// Remember `token` as the lock's latest in the parent's data: guarded by the data version,
    /// and only ever larger. Best effort: only `status` of a free lock reads it.
    pub(super) async fn record_token(&self, zk: &Zk, lock: &str, token: u64, mut version: i32) {
        let parent = self.parent(lock);
        let data = token.to_string();
        for _ in 0..MAX_RACES {
            match self.req("set-token", zk, |c| c.set_data(&parent, data.as_bytes(), Some(version))).await {
                Err(ZkError::BadVersion) => {}
                _ => return,
            }
            match self.req("get-token", zk, |c| c.get_data(&parent)).await {
                Ok((stored, stat)) => {
                    if String::from_utf8_lossy(&stored).trim().parse::<u64>().is_ok_and(|t| t >= token) {
                        return;
                    }
                    version = stat.version;
                }
                Err(_) => return,
            }
        }
    }

    /// Delete our (losing) child; whether that surely happened.
    pub(super) async fn delete_ours(&self, zk: &Zk, path: &str) -> bool {
        matches!(self.req("delete", zk, |c| c.delete(path, None)).await, Ok(()) | Err(ZkError::NoNode))
    }

    pub(super) async fn acquire_on(&self, zk: &Zk, lock: &str, identity: &str) -> Result<Attempt> {
        // A read first: a standby re-checking a held lock need not write.
        if let Lookup::Lowest { seq, value, stat } = self.lookup("get", zk, lock).await? {
            let record = Self::record(lock, seq, &value, &stat);
            if record.is_held() {
                return Ok(Attempt::Held(record, true));
            }
        }
        let value = Value {
            holder: identity.to_string(),
            acquired_ms: now_ms(),
            revoked: false,
            session_timeout_ms: zk.granted().as_millis() as u64,
            keep_until_ms: None,
        };
        let data = serde_json::to_vec(&value).unwrap();
        let prefix = format!("{}/{LEASE_PREFIX}", self.parent(lock));
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let mut parent_made = false;
        let ours = loop {
            match self.req("acquire", zk, |c| c.create(&prefix, &data, &options)).await {
                Ok((_, seq)) => break seq.into_i64(),
                Err(ZkError::NoNode) if !parent_made => {
                    self.ensure_parent(zk, lock).await?;
                    parent_made = true;
                }
                Err(e) => return Err(self.error("acquire", &e)),
            }
        };
        let our_path = self.child(lock, ours);
        for _ in 0..MAX_RACES {
            let Some((seqs, parent_stat)) = self.children("list", zk, lock).await? else {
                return Err(self.error("list", &ZkError::NoNode));
            };
            if !seqs.contains(&ours) {
                // Our child is gone: the session expired under us.
                return Err(self.error("acquire", &ZkError::SessionExpired));
            }
            let lowest = seqs[0];
            if lowest == ours {
                let token = ours as u64 + 1;
                self.record_token(zk, lock, token, parent_stat.version).await;
                return Ok(Attempt::Won(Lease { lock: lock.to_string(), identity: identity.to_string(), token }));
            }
            let lowest_path = self.child(lock, lowest);
            let Some((value, stat)) = self.read_child("get", zk, &lowest_path).await? else {
                continue; // freed meanwhile: look again
            };
            let record = Self::record(lock, lowest, &value, &stat);
            if !record.is_held() {
                // A --min-hold child whose time has passed: clear it and look again.
                match self.req("delete-kept", zk, |c| c.delete(&lowest_path, Some(stat.version))).await {
                    Ok(()) | Err(ZkError::NoNode) | Err(ZkError::BadVersion) => continue,
                    Err(e) => return Err(self.error("delete-kept", &e)),
                }
            }
            let clean = self.delete_ours(zk, &our_path).await;
            return Ok(Attempt::Held(record, clean));
        }
        let clean = self.delete_ours(zk, &our_path).await;
        if clean {
            self.give_back(zk.clone());
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    /// Give a lease's session up once `ttl` has passed since its latest successful renewal: it stops
    /// Read a child after a `sync`, so that a lagging server has seen every committed write.
    pub(super) async fn sync_read(
        &self,
        op: &'static str,
        zk: &Zk,
        path: &str,
    ) -> std::result::Result<Option<(Value, Stat)>, ZkError> {
        match self.req("sync", zk, |c| c.sync(path)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        match self.req(op, zk, |c| c.get_data(path)).await {
            Ok((data, stat)) => Ok(serde_json::from_slice::<Value>(&data).ok().map(|v| (v, stat))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Return once the lock's holder node may have changed. ZooKeeper watches fire once: a
    /// watch set on the holder's ephemeral node is waited for by a task of its own and kept in
    /// `watching` until it fires, so a wait that ends at the caller's bound leaves it for the
    /// next one, and an idle standby sends nothing while the holder lives.
    pub(super) async fn wait_change(&self, lock: &str) -> Result<()> {
        let mut slot = self.watching.lock().await;
        if let Some(watching) = slot.as_mut().filter(|w| w.lock == lock) {
            // Err: the task is gone without telling (aborted): the caller re-reads all the same.
            let _ = watching.fired.wait_for(|fired| *fired).await;
            *slot = None;
            return Ok(());
        }
        *slot = None;
        let zk = self.watch_session().await?;
        let Some((seqs, _)) = self.children("list", &zk, lock).await? else {
            return Ok(());
        };
        let Some(&lowest) = seqs.first() else {
            return Ok(());
        };
        let path = self.child(lock, lowest);
        let (stat, watcher) = match self.req("watch", &zk, |c| c.check_and_watch_stat(&path)).await {
            Ok((Some(stat), watcher)) => (stat, watcher),
            Ok((None, _)) => return Ok(()),
            Err(e) => return Err(self.error("watch", &e)),
        };
        if stat.ephemeral_owner != 0 {
            let (tell, fired) = tokio::sync::watch::channel(false);
            let task = tokio::spawn(async move {
                watcher.changed().await;
                let _ = tell.send(true);
            });
            let watching = slot.insert(Watching { lock: lock.to_string(), fired, task });
            let _ = watching.fired.wait_for(|fired| *fired).await;
            *slot = None;
            return Ok(());
        }
        drop(slot);
        // A --min-hold child: it frees the lock when its time passes, or when deleted.
        let Some((value, _)) = self.read_child("get", &zk, &path).await? else {
            return Ok(());
        };
        let left = Duration::from_millis(value.keep_until_ms.unwrap_or(0).saturating_sub(now_ms()));
        tokio::select! {
            _ = watcher.changed() => {}
            _ = tokio::time::sleep(left) => {}
        }
        Ok(())
    }

    /// A waiting campaign is over (this store holds the lock now): drop the watch.
    pub(super) fn stop_watching(&self) {
        if let Ok(mut slot) = self.watching.try_lock() {
            *slot = None;
        }
    }
}

/// A watch on the node holding a lock, kept while this store waits for that lock.
pub(super) struct Watching {
    lock: String,
    /// Becomes true once the watch fired (the node was deleted or changed, or the session ended).
    fired: tokio::sync::watch::Receiver<bool>,
    /// The task waiting for the watch to fire.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.task.abort();
    }
}
