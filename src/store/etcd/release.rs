//! A release that goes through a read: one with a --min-hold keep, or of a lease this store
//! did not take (another process's, `abandon`). A lease this store holds, released without a
//! keep, is one revoke (see the store's `release`).

use std::time::Duration;

use super::value::{now_ms, Value};
use super::wire::{self, KeyValue};
use super::{EtcdStore, MAX_RACES};
use crate::store::{Lease, Result, StoreError};

impl EtcdStore {
    /// Read the key; while it still carries `lease`, delete it (guarded by the mod revision
    /// read) or, with some of the keep left, move it onto a new etcd lease of the time left,
    /// marked `kept` (a re-put keeps the create revision, so the token stays); then revoke
    /// the lease it was on.
    pub(super) async fn release_by_read(&self, lease: &Lease, keep: Duration) -> Result<()> {
        for _ in 0..MAX_RACES {
            let Some(kv) = self.get_lock(&lease.lock).await? else {
                return Ok(());
            };
            let value = self.value(&kv)?;
            if kv.create_revision as u64 != lease.token || value.holder != lease.identity {
                return Ok(());
            }
            let until_ms = value.acquired_ms.saturating_add(keep.as_millis() as u64);
            let left = Duration::from_millis(until_ms.saturating_sub(now_ms()));
            let key = self.lock_key(&lease.lock).into_bytes();
            if !keep.is_zero() && !left.is_zero() {
                let new_id = self.grant(left).await?;
                let kept = self.encode(&Value { lease_id: new_id, kept: true, ..value.clone() })?;
                let answer =
                    self.guarded("release", &lease.lock, kv.mod_revision, vec![wire::put(&key, kept, new_id)]).await?;
                // A copy of this very write (sent again on another member) may have landed
                // first: its compare failed because the key is on the new lease already. That
                // is done; revoking the new lease would delete the keep.
                if answer.succeeded || self.moved_to(answer.range(0).first(), lease, new_id) {
                    self.revoke_lease(value.lease_id).await;
                    return Ok(());
                }
                self.revoke_lease(new_id).await;
            } else if self.guarded("release", &lease.lock, kv.mod_revision, vec![wire::delete(&key)]).await?.succeeded {
                self.revoke_lease(value.lease_id).await;
                return Ok(());
            }
            // Changed under the write (or a copy of the delete landed first): read again.
        }
        Err(StoreError::unavailable(format!(
            "etcd store {}: lock {:?} kept changing during release",
            self.shown, lease.lock
        )))
    }

    /// Whether the key as it stands is `lease`'s, on the etcd lease `lease_id`: only this
    /// store's own write puts it there (a lease id is granted once).
    fn moved_to(&self, kv: Option<&KeyValue>, lease: &Lease, lease_id: i64) -> bool {
        kv.is_some_and(|kv| {
            kv.create_revision as u64 == lease.token && self.value(kv).is_ok_and(|v| v.lease_id == lease_id)
        })
    }
}
