//! The lock's nodes: reading what holds a lock, and taking it (a lease child's data is `value.rs`).

use std::time::{Duration, UNIX_EPOCH};

use zookeeper_client::{Acls, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, Stat};

use super::failover::read_moving;
use super::names::{encode, sequence, LEASE_PREFIX};
use super::observe::Mark;
use super::sessions::{request, Zk};
use super::value::{now_ms, Value};
use super::ZooKeeperStore;
use crate::store::Access;
use crate::store::{Lease, LockRecord, Result, StoreError};

/// Guarded writes retried this often when a node changes under them before giving up.
pub(super) const MAX_RACES: usize = 20;

/// What the lowest child of a lock says.
pub(super) enum Lookup {
    /// No lease child: the latest token (from the parent's data).
    Free(u64),
    /// The lowest child (which may be a --min-hold child whose time has passed).
    Lowest { seq: i64, value: Value, stat: Stat },
}

/// The lock's node as the read before an acquire saw it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Seen {
    /// The sequence number the next child created under it gets (`next_sequence`).
    pub(super) next: Option<i64>,
    /// Its data version (the latest token's write); `None`: it does not exist yet, and the
    /// acquire creates it in the same step.
    pub(super) version: Option<i32>,
}

impl Seen {
    /// A lock's node that does not exist: its first child will be number 0.
    pub(super) const MISSING: Seen = Seen { next: Some(0), version: None };
}

/// The sequence number the next child created under a node gets, from the node's stat: the
/// number of children ever created under it. The server numbers children by its count of
/// creations, but reports `cversion` as every change to the children, creations and deletions;
/// each child ever created is either still there or was deleted once, so creations = (cversion +
/// children) / 2. Never more than the number the next child gets, whatever a server counts (one
/// that numbered deletions too would number it higher: it would then never match, and
/// `create_lease` would list the children), which is what `create_lease` relies on. After about
/// a billion acquisitions the 32-bit cversion wraps: then this says nothing (`None`).
pub(super) fn next_sequence(stat: &Stat) -> Option<i64> {
    (stat.cversion >= 0).then(|| (i64::from(stat.cversion) + i64::from(stat.num_children)) / 2)
}

/// What the read before an acquire found.
pub(super) enum Look {
    /// No node for the lock yet.
    Missing,
    /// No lease child.
    Free(Seen),
    /// Held: the lowest child's record.
    Held(LockRecord),
    /// The lowest child is a --min-hold child whose time has passed.
    KeepOver { path: String, stat: Stat },
}

/// What `create_lease` decided.
pub(super) enum Attempt {
    /// Ours, with the data our child was created with.
    Won(Lease, Value),
    /// Held by another; `clean`: our child is deleted, the session reusable.
    Held(LockRecord, bool),
    /// The lock's node changed between the read and the create, which was not made: read again.
    Raced,
    /// The root does not exist: nothing was made.
    NoRoot,
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
        match request(op, zk, |c| c.get_data(path)).await {
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
        match request(op, zk, |c| c.get_children(&parent)).await {
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
        match request(op, zk, |c| c.get_data(&parent)).await {
            Ok((data, _)) => Ok(String::from_utf8_lossy(&data).trim().parse().unwrap_or(0)),
            Err(ZkError::NoNode) => Ok(0),
            Err(e) => Err(self.error(op, &e)),
        }
    }

    /// What holds a lock: its lowest lease child, read.
    pub(super) async fn lookup(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<Lookup> {
        Ok(self.lookup_marked(op, zk, lock).await?.0)
    }

    /// `lookup`, and what a watcher compares with to tell whether the lock changed since.
    pub(super) async fn lookup_marked(&self, op: &'static str, zk: &Zk, lock: &str) -> Result<(Lookup, Mark)> {
        for _ in 0..MAX_RACES {
            let Some((seqs, parent)) = self.children(op, zk, lock).await? else {
                return Ok((Lookup::Free(0), Mark { children: 0, lowest: None }));
            };
            let mut mark = Mark { children: parent.pzxid, lowest: None };
            let Some(&seq) = seqs.first() else {
                return Ok((Lookup::Free(self.last_token(op, zk, lock).await?), mark));
            };
            // Gone between the two reads: look again.
            if let Some((value, stat)) = self.read_child(op, zk, &self.child(lock, seq)).await? {
                mark.lowest = Some((seq, stat.mzxid));
                return Ok((Lookup::Lowest { seq, value, stat }, mark));
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
            // A --min-hold keep is the one persistent child: no session holds it.
            kept: stat.ephemeral_owner == 0,
        }
    }

    pub(super) fn lookup_record(lock: &str, lookup: &Lookup) -> LockRecord {
        match lookup {
            Lookup::Free(token) => LockRecord { token: *token, ..LockRecord::free(lock) },
            Lookup::Lowest { seq, value, stat } => Self::record(lock, *seq, value, stat),
        }
    }

    /// Create a persistent node and whatever is missing above it (the root, the lock's node), one
    /// create per node; an existing one is fine.
    pub(super) async fn ensure_node(&self, zk: &Zk, path: &str) -> Result<()> {
        if self.access != Access::Create {
            return Err(StoreError::refused(format!("zookeeper store {}: {} does not exist", self.shown, self.root)));
        }
        let options = CreateMode::Persistent.with_acls(self.acls());
        let mut missing = vec![path.to_string()];
        while let Some(next) = missing.last().cloned() {
            match request("create", zk, |c| c.create(&next, &[], &options)).await {
                Ok(_) | Err(ZkError::NodeExists) => {
                    missing.pop();
                }
                Err(ZkError::NoNode) if missing.len() < 64 => match next.rsplit_once('/') {
                    Some((above, _)) if !above.is_empty() => missing.push(above.to_string()),
                    _ => return Err(self.error("create", &ZkError::NoNode)),
                },
                Err(e) => return Err(self.error("create", &e)),
            }
        }
        Ok(())
    }

    /// Remember `token` as the lock's latest in the parent's data: guarded by the data version,
    /// and only ever larger. Best effort: only `status` of a free lock reads it.
    pub(super) async fn record_token(&self, zk: &Zk, lock: &str, token: u64, mut version: i32) {
        let parent = self.parent(lock);
        let data = token.to_string();
        for _ in 0..MAX_RACES {
            match request("set-token", zk, |c| c.set_data(&parent, data.as_bytes(), Some(version))).await {
                Err(ZkError::BadVersion) => {}
                _ => return,
            }
            match request("get-token", zk, |c| c.get_data(&parent)).await {
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
        matches!(request("delete", zk, |c| c.delete(path, None)).await, Ok(()) | Err(ZkError::NoNode))
    }

    /// The read before an acquire: the lock's children, and the lowest one's data if there is
    /// one (a held lock needs no write).
    pub(super) async fn look(&self, zk: &Zk, lock: &str) -> Result<Look> {
        for _ in 0..MAX_RACES {
            let Some((seqs, parent)) = self.children("list", zk, lock).await? else {
                return Ok(Look::Missing);
            };
            let Some(&lowest) = seqs.first() else {
                return Ok(Look::Free(Seen { next: next_sequence(&parent), version: Some(parent.version) }));
            };
            let path = self.child(lock, lowest);
            // Gone between the two reads: look again.
            if let Some((value, stat)) = self.read_child("get", zk, &path).await? {
                let record = Self::record(lock, lowest, &value, &stat);
                return Ok(if record.is_held() { Look::Held(record) } else { Look::KeepOver { path, stat } });
            }
        }
        Err(StoreError::unavailable(format!("zookeeper store {}: lock {lock:?} kept changing", self.shown)))
    }

    /// Take a lock that `look` found free: create our child and, in the same step, write its
    /// token into the lock's node, guarded by the version read (or create that node with it, if
    /// the read found none). Ours is the lowest child, so the lock is ours, when its sequence
    /// number is the count of children created that the read saw: no child was created since
    /// the read, which saw none. Else the children are listed (the recipe of ZooKeeper's lock:
    /// the lowest existing child wins, so of many contenders exactly one does).
    pub(super) async fn create_lease(&self, zk: &Zk, lock: &str, identity: &str, seen: Seen) -> Result<Attempt> {
        let value = Value {
            holder: identity.to_string(),
            acquired_ms: now_ms(),
            revoked: false,
            session_timeout_ms: zk.granted().as_millis() as u64,
            keep_until_ms: None,
        };
        let data = serde_json::to_vec(&value).unwrap();
        let parent = self.parent(lock);
        let prefix = format!("{parent}/{LEASE_PREFIX}");
        let options = CreateMode::EphemeralSequential.with_acls(self.acls());
        let node_options = CreateMode::Persistent.with_acls(self.acls());
        // The token our child gets if no other child was created since the read.
        let token_data = seen.next.map(|next| (next + 1).to_string());
        let outcome = request("acquire", zk, |c| {
            let mut multi = c.new_multi_writer();
            let added = match (&token_data, seen.version) {
                (Some(token), Some(version)) => multi.add_set_data(&parent, token.as_bytes(), Some(version)),
                (Some(token), None) => multi.add_create(&parent, token.as_bytes(), &node_options),
                (None, _) => Ok(()),
            }
            .and_then(|()| multi.add_create(&prefix, &data, &options));
            async move {
                added?;
                Ok(multi.commit().await)
            }
        })
        .await;
        let created = match outcome {
            Ok(Ok(results)) => results.into_iter().find_map(|result| match result {
                MultiWriteResult::Create { path, .. } => path.rsplit('/').next().and_then(sequence),
                _ => None,
            }),
            Ok(Err(MultiWriteError::OperationFailed { index: 0, source })) if token_data.is_some() => {
                return match (source, seen.version) {
                    // Another contender wrote its token since the read, or made the lock's node:
                    // read again.
                    (ZkError::BadVersion, Some(_)) | (ZkError::NodeExists, None) => Ok(Attempt::Raced),
                    // The lock's node is gone (deleted by hand): read again.
                    (ZkError::NoNode, Some(_)) => Ok(Attempt::Raced),
                    (ZkError::NoNode, None) => Ok(Attempt::NoRoot),
                    (e, _) => Err(self.error("acquire", &e)),
                };
            }
            Ok(Err(e)) => return Err(self.error("acquire", &e.into())),
            Err(e) => return Err(self.error("acquire", &e)),
        };
        let Some(ours) = created else {
            return Err(StoreError::unavailable(format!(
                "zookeeper store {}: acquire: the server did not say which child it created",
                self.shown
            )));
        };
        let lease = Lease { lock: lock.to_string(), identity: identity.to_string(), token: ours as u64 + 1 };
        if seen.next == Some(ours) {
            return Ok(Attempt::Won(lease, value));
        }
        tracing::debug!(ours, expected = seen.next, "children changed since the read; listing them");
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
                // The token written with the create was a guess that came out low: ours is larger.
                self.record_token(zk, lock, lease.token, parent_stat.version).await;
                return Ok(Attempt::Won(lease, value));
            }
            let lowest_path = self.child(lock, lowest);
            let Some((value, stat)) = self.read_child("get", zk, &lowest_path).await? else {
                continue; // freed meanwhile: look again
            };
            let record = Self::record(lock, lowest, &value, &stat);
            if !record.is_held() {
                // A --min-hold child whose time has passed: clear it and look again.
                match request("delete-kept", zk, |c| c.delete(&lowest_path, Some(stat.version))).await {
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

    /// Read a child after a `sync`, so that a lagging server has seen every committed write.
    /// `sync` on the root: the reads after it see every write committed before it, through
    /// whichever server committed it.
    pub(super) async fn sync_root(&self, zk: &Zk) -> Result<()> {
        match request("sync", zk, |c| c.sync(&self.root)).await {
            Ok(()) | Err(ZkError::NoNode) => Ok(()),
            Err(e) => Err(self.error("sync", &e)),
        }
    }

    pub(super) async fn sync_read(
        &self,
        op: &'static str,
        zk: &Zk,
        path: &str,
    ) -> std::result::Result<Option<(Value, Stat)>, ZkError> {
        // Both may be sent again on the session moved to another server (`read_moving`): the
        // read after a move sees no less than the sync, as a server that is behind what the
        // client saw last refuses its session.
        match read_moving("sync", &zk.client, |c| c.sync(path)).await {
            Ok(()) | Err(ZkError::NoNode) => {}
            Err(e) => return Err(e),
        }
        match read_moving(op, &zk.client, |c| c.get_data(path)).await {
            Ok((data, stat)) => Ok(serde_json::from_slice::<Value>(&data).ok().map(|v| (v, stat))),
            Err(ZkError::NoNode) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(cversion: i32, num_children: i32) -> Stat {
        Stat {
            czxid: 0,
            mzxid: 0,
            pzxid: 0,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion,
            aversion: 0,
            ephemeral_owner: 0,
            data_length: 0,
            num_children,
        }
    }

    /// As ZooKeeper 3.8 answers: a child created and deleted reports cversion 2, and the next
    /// child created is number 1.
    #[test]
    fn the_next_sequence_counts_creations() {
        assert_eq!(next_sequence(&stat(0, 0)), Some(0));
        assert_eq!(next_sequence(&stat(1, 1)), Some(1), "one child, still there");
        assert_eq!(next_sequence(&stat(2, 0)), Some(1), "one child, deleted");
        assert_eq!(next_sequence(&stat(5, 1)), Some(3), "three created, two deleted");
        assert_eq!(next_sequence(&stat(-4, 0)), None, "wrapped");
    }
}
